"""sentencepiece BPE tokenizer with byte fallback: any UTF-8 string round-trips exactly.

Ids: PAD 0, UNK 1, BOS 2, EOS 3 (``titans_lm.config``), then the 256 byte pieces ``<0x00>`` ..
``<0xFF>``, then the learned merges. The trainer settings below make ``decode(encode(s)) == s`` for
every string ``s``:

* ``normalization_rule_name="identity"``, ``remove_extra_whitespaces=False``,
  ``add_dummy_prefix=False``: the text is not normalised, trimmed or prefixed with a space;
* ``byte_fallback=True``: a character outside the vocabulary (CJK, emoji, control characters, tabs,
  newlines) becomes its UTF-8 bytes, so UNK never occurs;
* the one character sentencepiece cannot pass through, its whitespace marker U+2581 ("▁", which it
  decodes as a space), is encoded by :class:`Tokenizer` as its three byte pieces, which decode back
  to "▁".

Training input is the documents' lines (split at "\\n"; blank lines dropped), at most
``max_sentences`` of them sampled without replacement by a fixed seed. Since no learned piece can
contain "\\n", a text is encoded line by line (in parallel) with the same result as encoding it
whole.

The trained model is cached in ``cache_dir`` under a sha256 of the training texts, the vocabulary
size, every trainer setting and the sentencepiece version, and written atomically, with the
model's own sha256 beside it (``<name>.model.sha256``): a cached model changed after it was
written is detected and trained again.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from titans_lm.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from titans_lm.data.corpora import Document

NUM_THREADS = 2
SAMPLE_SEED = 0

# Every setting that shapes the trained model (all of them enter the cache key).
TRAINER_SETTINGS: dict[str, object] = {
    "model_type": "bpe",
    "byte_fallback": True,
    "pad_id": PAD_ID,
    "unk_id": UNK_ID,
    "bos_id": BOS_ID,
    "eos_id": EOS_ID,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "allow_whitespace_only_pieces": True,
    "split_digits": True,
    "character_coverage": 0.9995,
    "max_sentence_length": 1 << 16,  # bytes; longer lines would be skipped silently
    "input_sentence_size": 0,  # sampling is done here, deterministically
    "shuffle_input_sentence": False,
    "hard_vocab_limit": True,
    "num_threads": NUM_THREADS,
}
_CACHE_FORMAT = 1
_SPACE_MARK = "\u2581"
_MARK_SPLIT = re.compile("(\u2581)")  # keeps each U+2581 as its own piece


class Tokenizer:
    """A trained sentencepiece BPE model (see the module docstring for the guarantees).

    Attributes:
      model_proto: the serialised sentencepiece model.
      fingerprint: sha256 hex digest of ``model_proto``; identifies the tokenizer exactly
        (token stores are keyed by it).
      vocab_size: number of ids, including PAD/UNK/BOS/EOS and the 256 byte pieces.
    """

    def __init__(self, model_proto: bytes):
        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        if (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()) != (
                PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError("sentencepiece model has special ids "
                             f"pad/unk/bos/eos={self._sp.pad_id()}/{self._sp.unk_id()}/"
                             f"{self._sp.bos_id()}/{self._sp.eos_id()}, expected "
                             f"{PAD_ID}/{UNK_ID}/{BOS_ID}/{EOS_ID}")
        self.fingerprint = hashlib.sha256(self.model_proto).hexdigest()
        self.vocab_size = int(self._sp.get_piece_size())
        self._space_mark_ids = [self._sp.piece_to_id(f"<0x{b:02X}>") for b in _SPACE_MARK.encode()]
        if any(self._sp.is_unknown(i) for i in self._space_mark_ids):
            raise ValueError("sentencepiece model lacks byte pieces (it was trained without byte_fallback)")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a ``.model`` file.

        Raises:
          FileNotFoundError: no such file.
          ValueError: the file is not a sentencepiece model with the expected special ids.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer model file there")
        try:
            return cls(path.read_bytes())
        except RuntimeError as e:
            raise ValueError(f"{path}: not a valid sentencepiece model ({e})") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model to ``path`` atomically (temporary file + ``os.replace``)."""
        _atomic_write(Path(path), self.model_proto)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS first when ``add_bos``); never UNK, never EOS."""
        return self.encode_array(text, add_bos).tolist()

    def encode_array(self, text: str, add_bos: bool = True) -> np.ndarray:
        """As :meth:`encode`, returned as an int32 array of shape [n]."""
        lines = text.split("\n")
        segs = [line + "\n" for line in lines[:-1]]
        if lines[-1]:
            segs.append(lines[-1])
        if _SPACE_MARK in text:
            segs = [p for seg in segs for p in _MARK_SPLIT.split(seg) if p]
        plain = [s for s in segs if s != _SPACE_MARK]
        encoded = iter(self._sp.encode(plain, num_threads=NUM_THREADS)) if plain else iter(())
        parts: list[list[int]] = [[BOS_ID]] if add_bos else []
        for s in segs:
            parts.append(self._space_mark_ids if s == _SPACE_MARK else next(encoded))
        total = sum(len(p) for p in parts)
        return np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int32, count=total)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids``; PAD, BOS and EOS are dropped.

        Raises:
          ValueError: an id outside ``[0, vocab_size)``.
        """
        ids = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        return self._sp.decode(ids)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def training_lines(docs: Sequence[Document], max_sentences: int, seed: int = SAMPLE_SEED) -> list[str]:
    """The trainer's input: the documents' non-blank lines, at most ``max_sentences`` of them.

    When there are more lines than ``max_sentences`` a uniform sample without replacement is
    drawn with ``numpy.random.default_rng(seed)`` and kept in document order.

    Raises:
      ValueError: ``max_sentences < 1``, or the documents have no non-blank line.
    """
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    lines = [line for d in docs for line in d.text.split("\n") if line.strip()]
    if not lines:
        raise ValueError("cannot train a tokenizer: the training documents contain no text")
    if len(lines) > max_sentences:
        keep = np.sort(np.random.default_rng(seed).choice(len(lines), max_sentences, replace=False))
        lines = [lines[i] for i in keep]
    return lines


def tokenizer_key(docs: Sequence[Document], vocab_size: int, max_sentences: int,
                  seed: int = SAMPLE_SEED) -> str:
    """sha256 hex digest of everything that determines the trained model."""
    h = hashlib.sha256()
    settings = {"format": _CACHE_FORMAT, "sentencepiece": spm.__version__, "vocab_size": vocab_size,
                "max_sentences": max_sentences, "sample_seed": seed, "trainer": TRAINER_SETTINGS}
    h.update(json.dumps(settings, sort_keys=True).encode())
    for d in docs:
        b = d.text.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def train_tokenizer(lines: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a BPE model on ``lines`` (one sentence each) with :data:`TRAINER_SETTINGS`.

    Raises:
      ValueError: ``vocab_size`` does not fit the text (too small for the 260 special and byte
        pieces plus the characters kept, or larger than the text supports).
    """
    out = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                       vocab_size=vocab_size, minloglevel=2, **TRAINER_SETTINGS)
    except RuntimeError as e:
        raise ValueError(f"cannot train a {vocab_size}-piece tokenizer on this text: {e}") from None
    return Tokenizer(out.getvalue())


def train_or_load_tokenizer(docs: Sequence[Document], vocab_size: int, cache_dir: str | os.PathLike[str],
                            max_sentences: int, seed: int = SAMPLE_SEED,
                            log=None) -> Tokenizer:
    """The tokenizer for ``docs``: loaded from ``cache_dir`` when cached, else trained and cached.

    Args:
      docs: training documents (their lines are the trainer's sentences).
      vocab_size: total number of ids (>= 260 with byte fallback).
      cache_dir: directory of ``tokenizer-<vocab>-<key>.model`` files (created if needed).
      max_sentences: at most this many lines are sampled for training (seeded by ``seed``).
      log: optional ``callable(str)`` for one progress line.

    Raises:
      ValueError: see :func:`training_lines` and :func:`train_tokenizer`.
    """
    key = tokenizer_key(docs, vocab_size, max_sentences, seed)
    path = Path(cache_dir) / f"tokenizer-{vocab_size}-{key[:16]}.model"
    digest = path.with_name(path.name + ".sha256")  # the model's sha256, written beside it
    if path.is_file():
        try:
            tok = Tokenizer.load(path)
        except ValueError:
            tok = None
        recorded = digest.read_text().strip() if digest.is_file() else None
        if tok is not None and recorded in (None, tok.fingerprint):
            if log:
                log(f"tokenizer: reusing {path}")
            return tok
        if log:
            log(f"tokenizer: {path} was changed after it was written (its sha256 no longer "
                f"matches {digest.name}); training it again")
    lines = training_lines(docs, max_sentences, seed)
    tok = train_tokenizer(lines, vocab_size)
    tok.save(path)
    _atomic_write(digest, (tok.fingerprint + "\n").encode())
    if log:
        log(f"tokenizer: trained vocab {vocab_size} on {len(lines)} lines -> {path}")
    return tok
