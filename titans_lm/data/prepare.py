"""Prepare a corpus: train (or load) the tokenizer, tokenize each split into a cached token store.

Cache layout under ``cache_dir`` (``c.data.cache_dir``; "" means ``<data_dir>/../.cache``)::

  tokenizer-<vocab>-<key>.model           keyed by training texts, vocab size, trainer settings,
                                           sentencepiece version (titans_lm.data.tokenizer)
  stores/<corpus>-<split>-<key>/           keyed by the tokenizer's fingerprint, corpus, split,
                                           doc_align and the split's texts (titans_lm.data.store)

Everything is built once; later calls reuse it and say so. A store holds the split's documents
in the order :func:`titans_lm.data.corpora.load_documents` returns them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_collections
import numpy as np

from titans_lm.data.corpora import Document
from titans_lm.data.store import FORMAT_VERSION, TokenStore, build_token_store
from titans_lm.data.tokenizer import Tokenizer, train_or_load_tokenizer
from titans_lm.data.user_corpus import corpus_label, heldout_lines, load_splits, splits_of
from titans_lm.progress import Progress

Log = Callable[[str], None]


def log_to_stderr(msg: str) -> None:
    """The default progress sink: one ``prepare: ...`` line on stderr."""
    print(f"prepare: {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A prepared corpus.

    Attributes:
      corpus: the corpus name.
      tokenizer: the tokenizer every store was encoded with.
      stores: split name -> its token store.
      cache_dir: where the tokenizer and stores live.
    """

    corpus: str
    tokenizer: Tokenizer
    stores: dict[str, TokenStore]
    cache_dir: Path


def resolve_cache_dir(data_cfg: ml_collections.ConfigDict) -> Path:
    """``data_cfg.cache_dir``, or ``<data_dir>/../.cache`` when it is empty."""
    if data_cfg.cache_dir:
        return Path(data_cfg.cache_dir)
    return Path(data_cfg.data_dir).resolve().parent / ".cache"


def tokenize_documents(tokenizer: Tokenizer, docs: Sequence[Document],
                       progress: Progress | None = None) -> list[np.ndarray]:
    """int32 token arrays, one per document, each beginning with BOS (``progress`` counts the
    documents)."""
    out = []
    for d in docs:
        out.append(tokenizer.encode_array(d.text, add_bos=True))
        if progress is not None:
            progress.update(1)
    return out


def _texts_digest(docs: Sequence[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        b = d.text.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def store_key(tokenizer: Tokenizer, corpus: str, split: str, doc_align: int,
              docs: Sequence[Document]) -> str:
    """sha256 hex digest naming the token store of one split."""
    key = {"format": FORMAT_VERSION, "tokenizer": tokenizer.fingerprint, "corpus": corpus,
           "split": split, "doc_align": int(doc_align), "texts": _texts_digest(docs)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def prepare_store(tokenizer: Tokenizer, docs: Sequence[Document], *, corpus: str, split: str,
                  doc_align: int, cache_dir: str | Path, log: Log | None = log_to_stderr) -> TokenStore:
    """Open the cached token store of ``docs`` or tokenize them and build it.

    Raises:
      ValueError: a corrupt cached store (naming it), or bad input to the store builder.
    """
    path = Path(cache_dir) / "stores" / f"{corpus}-{split}-{store_key(tokenizer, corpus, split, doc_align, docs)[:16]}"
    if path.exists():
        store = TokenStore.open(path)
        if log:
            log(f"{corpus}/{split}: reusing {path} ({store.num_docs} docs, {store.num_real_tokens:,} tokens)")
        return store
    t0 = time.perf_counter()
    with Progress(len(docs), f"{corpus}/{split}: tokenizing", "document", enabled=log is not None,
                  log=log) as bar:
        tokens = tokenize_documents(tokenizer, docs, bar)
    try:
        store = build_token_store(path, tokens, doc_align, vocab_size=tokenizer.vocab_size)
    except FileExistsError:  # built concurrently by another process
        store = TokenStore.open(path)
    if log:
        log(f"{corpus}/{split}: tokenized {len(docs)} docs into {store.num_real_tokens:,} tokens "
            f"({store.num_tokens:,} with padding) in {time.perf_counter() - t0:.1f}s -> {path}")
    return store


def prepare(data_cfg: ml_collections.ConfigDict, *, tokenizer: Tokenizer | None = None,
            splits: Sequence[str] | None = None, log: Log | None = log_to_stderr,
            check_windows: bool = True) -> Prepared:
    """Tokenizer and token stores for ``data_cfg.corpus`` (built on first use, then reused).

    Args:
      data_cfg: the config's ``data`` section (corpus, data_dir, cache_dir, vocab_size,
        tokenizer_sentences, doc_align).
      tokenizer: use this tokenizer instead of training one on the corpus's train split (to
        evaluate a trained model on another corpus, e.g. wikitext-2 which has no train split).
      splits: which splits to build; default every split of the corpus.
      log: progress sink (``None``: silent).
      check_windows: require the train split to hold one training window (``seq_len + 1``).

    Raises:
      ValueError: unknown corpus/split, no train split to train a tokenizer on, a tokenizer
        whose vocabulary size differs from ``data_cfg.vocab_size``, or (``check_windows``) a
        train split shorter than one window.
      FileNotFoundError: a missing data file.
    """
    corpus = corpus_label(data_cfg)
    available = splits_of(data_cfg)
    splits = tuple(available if splits is None else splits)
    cache_dir = resolve_cache_dir(data_cfg)
    need_train = tokenizer is None and "train" in available and "train" not in splits
    user = corpus != data_cfg.corpus
    # A user corpus says which documents it holds out, both splits whichever are built now.
    named = tuple(s for s in ("validation", "test") if user and log and s not in splits)
    docs = load_splits(data_cfg, splits + (("train",) if need_train else ()) + named)
    if log and user:
        for line in heldout_lines(corpus, docs):
            log(line)
    if tokenizer is None:
        if "train" not in available:
            raise ValueError(f"corpus {corpus!r} has no train split to train a tokenizer on "
                             f"(splits: {', '.join(available)}); pass the trained model's tokenizer")
        train_docs = docs["train"]
        t0 = time.perf_counter()
        tokenizer = train_or_load_tokenizer(train_docs, data_cfg.vocab_size, cache_dir,
                                            data_cfg.tokenizer_sentences, log=log)
        if log:
            log(f"tokenizer ready in {time.perf_counter() - t0:.1f}s")
    if tokenizer.vocab_size != data_cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but data.vocab_size="
                         f"{data_cfg.vocab_size}")
    stores = {s: prepare_store(tokenizer, docs[s], corpus=corpus, split=s, doc_align=data_cfg.doc_align,
                               cache_dir=cache_dir, log=log) for s in splits}
    train_store = stores.get("train")
    if check_windows and train_store is not None and train_store.num_tokens < int(data_cfg.seq_len) + 1:
        raise ValueError(
            f"corpus {data_cfg.corpus}: the train split holds {train_store.num_real_tokens:,} tokens, "
            f"fewer than one training window of data.seq_len + 1 = {int(data_cfg.seq_len) + 1}; "
            f"add text or lower data.seq_len")
    return Prepared(corpus=corpus, tokenizer=tokenizer, stores=stores, cache_dir=cache_dir)
