"""Token store: the tokens of one split, written once to a flat memory-mapped array.

Layout of a store directory::

  tokens.npy       uint16[N] (int32 when vocab_size > 65535): every document as BOS + its tokens,
                   padded with PAD to a multiple of doc_align, documents back to back
  doc_offsets.npy  int64[D + 1]: document d occupies tokens[doc_offsets[d]:doc_offsets[d+1]]
                   (multiples of doc_align; doc_offsets[D] == N)
  doc_lengths.npy  int64[D]: real (unpadded) length of each document, BOS included
  meta.json        format, doc_align, vocab_size, dtype, num_tokens, num_docs

A store is built into a temporary directory next to its destination and renamed into place, so
a reader sees either no store or a complete one. Arrays are opened with ``np.load(mmap_mode="r")``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from titans_lm.config import BOS_ID, PAD_ID

FORMAT_VERSION = 1
_FILES = ("tokens.npy", "doc_offsets.npy", "doc_lengths.npy", "meta.json")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (``vocab_size <= 65535``), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.int32)


def build_token_store(path: str | os.PathLike[str], token_lists: Iterable[Sequence[int] | np.ndarray],
                      doc_align: int, vocab_size: int | None = None) -> TokenStore:
    """Write a token store at ``path`` (atomically) and open it.

    Args:
      path: the store directory to create; it must not exist yet.
      token_lists: one id sequence per document, each beginning with BOS
        (``Tokenizer.encode(text, add_bos=True)``).
      doc_align: documents are padded with PAD to a multiple of this many tokens.
      vocab_size: the tokenizer's vocabulary size (chooses the dtype and bounds the ids);
        ``None`` uses ``max id + 1``.

    Raises:
      ValueError: no documents, a document not starting with BOS, an id outside
        ``[0, vocab_size)``, or ``doc_align < 1``.
      FileExistsError: ``path`` already exists (a store is written once).
    """
    if doc_align < 1:
        raise ValueError(f"doc_align must be >= 1, got {doc_align}")
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path}: a token store (or other file) already exists there")
    docs = [np.asarray(t, dtype=np.int64).reshape(-1) for t in token_lists]
    if not docs:
        raise ValueError("cannot build a token store from zero documents")
    for d, toks in enumerate(docs):
        if toks.size == 0 or toks[0] != BOS_ID:
            raise ValueError(f"document {d} does not begin with BOS={BOS_ID} "
                             f"(got {toks[:1].tolist()}); encode with add_bos=True")
    max_id = max(int(t.max()) for t in docs)
    min_id = min(int(t.min()) for t in docs)
    if vocab_size is None:
        vocab_size = max_id + 1
    if min_id < 0 or max_id >= vocab_size:
        raise ValueError(f"token ids span [{min_id}, {max_id}], outside the vocabulary [0, {vocab_size})")
    dtype = token_dtype(vocab_size)

    lengths = np.array([t.size for t in docs], dtype=np.int64)
    padded = -(-lengths // doc_align) * doc_align
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(padded, out=offsets[1:])
    tokens = np.full(int(offsets[-1]), PAD_ID, dtype=dtype)
    for d, toks in enumerate(docs):
        tokens[offsets[d]:offsets[d] + lengths[d]] = toks
    meta = {"format": FORMAT_VERSION, "doc_align": int(doc_align), "vocab_size": int(vocab_size),
            "dtype": dtype.name, "num_tokens": int(offsets[-1]), "num_docs": len(docs)}

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        np.save(tmp / "tokens.npy", tokens)
        np.save(tmp / "doc_offsets.npy", offsets)
        np.save(tmp / "doc_lengths.npy", lengths)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, path)
        except OSError:
            if path.exists():
                raise FileExistsError(f"{path}: a token store appeared there while building") from None
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return TokenStore.open(path)


class TokenStore:
    """A read-only, memory-mapped token store (see the module docstring for the layout).

    Attributes:
      path: the store directory.
      tokens: uint16 or int32 memory-mapped array [num_tokens].
      doc_offsets: int64[num_docs + 1], padded document starts (multiples of doc_align).
      doc_lengths: int64[num_docs], real document lengths (BOS included, padding excluded).
      doc_align, vocab_size: as built.
    """

    def __init__(self, path: Path, tokens: np.ndarray, doc_offsets: np.ndarray,
                 doc_lengths: np.ndarray, doc_align: int, vocab_size: int):
        self.path = path
        self.tokens = tokens
        self.doc_offsets = doc_offsets
        self.doc_lengths = doc_lengths
        self.doc_align = doc_align
        self.vocab_size = vocab_size

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TokenStore:
        """Open a store built by :func:`build_token_store`.

        Raises:
          FileNotFoundError: no store at ``path`` (naming the missing file).
          ValueError: the store is corrupt or of another format (naming what is wrong).
        """
        path = Path(path)
        for name in _FILES:
            if not (path / name).is_file():
                raise FileNotFoundError(f"{path}: not a token store, {name} is missing "
                                        "(build it with `titans-lm prepare`)")

        def bad(msg: str) -> ValueError:
            return ValueError(f"{path}: corrupt token store ({msg}); delete it and run `titans-lm prepare`")

        try:
            meta = json.loads((path / "meta.json").read_text())
            fmt, doc_align, vocab_size = meta["format"], int(meta["doc_align"]), int(meta["vocab_size"])
            num_tokens, num_docs, dtype = int(meta["num_tokens"]), int(meta["num_docs"]), meta["dtype"]
        except (ValueError, KeyError, TypeError) as e:
            raise bad(f"unreadable meta.json: {e!r}") from None
        if fmt != FORMAT_VERSION:
            raise bad(f"format {fmt}, expected {FORMAT_VERSION}")
        try:
            tokens = np.load(path / "tokens.npy", mmap_mode="r")
            offsets = np.load(path / "doc_offsets.npy")
            lengths = np.load(path / "doc_lengths.npy")
        except (ValueError, OSError, EOFError) as e:
            raise bad(f"unreadable array: {e}") from None
        if tokens.ndim != 1 or tokens.shape[0] != num_tokens or tokens.dtype.name != dtype:
            raise bad(f"tokens.npy has shape {tokens.shape} dtype {tokens.dtype}, meta says "
                      f"({num_tokens},) {dtype}")
        if offsets.shape != (num_docs + 1,) or lengths.shape != (num_docs,):
            raise bad(f"{num_docs} documents but offsets {offsets.shape}, lengths {lengths.shape}")
        if num_docs < 1 or offsets[0] != 0 or offsets[-1] != num_tokens:
            raise bad("document offsets do not span the tokens")
        padded = np.diff(offsets)
        if np.any(offsets % doc_align) or np.any(lengths < 1) or np.any(lengths > padded) or \
                np.any(padded - lengths >= doc_align):
            raise bad(f"document offsets/lengths inconsistent with doc_align={doc_align}")
        return cls(path, tokens, offsets, lengths, doc_align, vocab_size)

    @property
    def num_tokens(self) -> int:
        """Length of the flat token array, padding included."""
        return int(self.tokens.shape[0])

    @property
    def num_docs(self) -> int:
        return int(self.doc_lengths.shape[0])

    @property
    def num_real_tokens(self) -> int:
        """Tokens excluding padding (BOS included)."""
        return int(self.doc_lengths.sum())

    def doc_tokens(self, d: int) -> np.ndarray:
        """int32[doc_lengths[d]]: document ``d``'s tokens, BOS first, without padding."""
        if not 0 <= d < self.num_docs:
            raise IndexError(f"document {d} outside [0, {self.num_docs})")
        start = int(self.doc_offsets[d])
        return np.asarray(self.tokens[start:start + int(self.doc_lengths[d])], dtype=np.int32)

    def window(self, start: int, length: int) -> np.ndarray:
        """int32[length]: ``tokens[start:start+length]``."""
        self._check_range(start, length)
        return np.asarray(self.tokens[start:start + length], dtype=np.int32)

    def segment_ids(self, start: int, length: int) -> np.ndarray:
        """int32[length]: document index + 1 on real tokens, 0 on padding, for positions
        ``start .. start+length-1``."""
        self._check_range(start, length)
        pos = np.arange(start, start + length, dtype=np.int64)
        doc = np.searchsorted(self.doc_offsets, pos, side="right") - 1
        real = pos - self.doc_offsets[doc] < self.doc_lengths[doc]
        return np.where(real, doc + 1, 0).astype(np.int32)

    def _check_range(self, start: int, length: int) -> None:
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise IndexError(f"range [{start}, {start + length}) outside the store's "
                             f"{self.num_tokens} tokens")
