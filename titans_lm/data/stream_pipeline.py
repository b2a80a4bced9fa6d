"""Training batches for stateful training: each batch row reads its documents as consecutive windows.

In the shuffled-window pipeline (``titans_lm.data.pipeline``) every row of every step is an
independent window. For training with the model state carried from step to step (truncated
backprop through time, as in Transformer-XL and the recurrent-memory literature), row ``r`` of
step ``s + 1`` must instead continue exactly where row ``r`` of step ``s`` stopped:

- Each row reads an endless stream of whole documents, back to back, ``T`` tokens per step: the
  window of step ``s`` holds the row-stream tokens ``[sT, sT + T]`` (``T + 1`` tokens: inputs and
  targets overlap by one, so its last token is the next window's first input).
- With ``doc_align = A > 1`` each document is followed by padding (token ``PAD_ID``, segment id 0)
  up to the next multiple of A of the row stream, so every document starts at a multiple of A
  (and, since T is a multiple of A, at a multiple of A inside its window); with A = 1 documents
  follow each other directly (a memory resets exactly inside a chunk too). Padding is never scored
  and writes nothing into a memory.
- Segment ids number the documents of a row (1, 2, 3, ...): a document that does not end inside
  a window continues in the next step's window of the same row *with the same segment id at its
  first token*, so the stateful model does not reset there (``StreamState.last_segment_id``);
  a new document starts with a new id, which resets it. No padding is ever inserted (packing),
  and a target is scored when it continues its input's document (the usual weight
  ``(seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)``), so no prediction crosses documents.
- Document order: an endless sequence ``S`` of document indices, epoch ``e`` being a permutation of
  all ``D`` documents drawn from ``SeedSequence([seed, e])`` (every document once per epoch).
  Global row ``g`` of ``B`` reads ``S[g], S[g + B], S[g + 2B], ...`` (dealt like cards), so the
  rows read different documents, any number of documents ``D >= 1`` works, and the rows of one
  process are the contiguous share ``[p B / n, (p + 1) B / n)`` of the global batch.

The iterator state is, per row, ``(j, offset)``: the row is ``offset`` tokens into its ``j``-th
(padded) document ``S[g + jB]`` (its segment id is ``j + 1``): a small JSON dict restoring the exact
continuation (``get_state`` / ``set_state``, as grain's iterators, so ``Checkpointer`` saves it).
"""

from __future__ import annotations

import numpy as np

from titans_lm.config import PAD_ID
from titans_lm.data.store import TokenStore


class StreamIterator:
    """Consecutive windows of whole documents per batch row (see the module doc).

    ``next(it)`` -> ``{"tokens": int32[b, T+1], "segment_ids": int32[b, T+1]}`` with
    ``b = batch_size // shard_count`` rows of this process.

    Args:
      store: the split's token store (documents are read without their alignment padding).
      seq_len: T, tokens each row advances per step.
      batch_size: global rows B.
      seed: document-order seed (non-negative).
      doc_align: documents start at multiples of this in the row stream (1: packed back to back).
      shard_index, shard_count: this process and the number of processes.

    Raises:
      ValueError: inconsistent sizes or a negative seed (naming the values); a store without a
        document holding at least two tokens.
    """

    def __init__(self, store: TokenStore, *, seq_len: int, batch_size: int, seed: int,
                 doc_align: int = 1, shard_index: int = 0, shard_count: int = 1):
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if doc_align < 1 or seq_len % doc_align:
            raise ValueError(f"doc_align={doc_align} must be positive and divide seq_len={seq_len}")
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise ValueError(f"shard_index={shard_index} must lie in [0, shard_count={shard_count})")
        if batch_size < 1 or batch_size % shard_count:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of the number "
                             f"of processes shard_count={shard_count}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if store.num_docs < 1 or int(np.max(store.doc_lengths)) < 2:
            raise ValueError(f"the token store {store.path} holds no document of 2 or more tokens")
        self.store, self.seq_len, self.batch_size, self.seed = store, seq_len, batch_size, seed
        self.doc_align = doc_align
        b = batch_size // shard_count
        self.rows = list(range(shard_index * b, (shard_index + 1) * b))
        self._cursor = [(0, 0) for _ in self.rows]  # (j, offset) per local row
        self._perms: dict[int, np.ndarray] = {}

    # --- document order
    def document(self, row: int, j: int) -> int:
        """The store index of global row ``row``'s ``j``-th document, ``S[row + j B]``."""
        k = row + j * self.batch_size
        epoch, i = divmod(k, self.store.num_docs)
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng(np.random.SeedSequence([self.seed, epoch])).permutation(
                self.store.num_docs)
            if len(self._perms) >= 8:  # rows stay within a few epochs of one another
                self._perms.pop(min(self._perms))
            self._perms[epoch] = perm
        return int(perm[i])

    def _read(self, row: int, j: int, off: int, n: int):
        """n tokens of the row stream from (j, off): (tokens, segment ids, (j', off'))."""
        toks, segs = [], []
        A = self.doc_align
        while n > 0:
            d = self.document(row, j)
            length = int(self.store.doc_lengths[d])
            take = min(n, length - off)
            if take > 0:
                start = int(self.store.doc_offsets[d]) + off
                toks.append(np.asarray(self.store.tokens[start:start + take], np.int32))
                segs.append(np.full(take, j + 1, np.int32))
                n -= take
                off += take
            pad = min(n, -(-length // A) * A - off)  # alignment padding after the document
            if off >= length and pad > 0:
                toks.append(np.full(pad, PAD_ID, np.int32))
                segs.append(np.zeros(pad, np.int32))
                n -= pad
                off += pad
            if off >= -(-length // A) * A:
                j, off = j + 1, 0
        return toks, segs, (j, off)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        T = self.seq_len
        tokens = np.zeros((len(self.rows), T + 1), np.int32)
        segs = np.zeros_like(tokens)
        for i, row in enumerate(self.rows):
            j, off = self._cursor[i]
            t1, s1, nxt = self._read(row, j, off, T)
            t2, s2, _ = self._read(row, *nxt, 1)
            tokens[i] = np.concatenate(t1 + t2)
            segs[i] = np.concatenate(s1 + s2)
            self._cursor[i] = nxt
        return {"tokens": tokens, "segment_ids": segs}

    # --- checkpointable state
    def get_state(self) -> dict:
        return {"kind": "stream", "seed": self.seed, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "doc_align": self.doc_align, "rows": [[int(j), int(o)] for j, o in self._cursor]}

    def set_state(self, state: dict) -> None:
        """Restore a state from :meth:`get_state`.

        Raises:
          ValueError: a state of another kind, seed, batch or window length, or row count.
        """
        mine = self.get_state()
        for k in ("kind", "seed", "batch_size", "seq_len", "doc_align"):
            if state.get(k) != mine[k]:
                raise ValueError(f"the saved data-iterator state has {k}={state.get(k)!r}, this run "
                                 f"{mine[k]!r}: resume with the config the checkpoint was written with")
        if len(state["rows"]) != len(self.rows):
            raise ValueError(f"the saved state holds {len(state['rows'])} rows, this process "
                             f"reads {len(self.rows)}")
        self._cursor = [(int(j), int(o)) for j, o in state["rows"]]
