"""grain pipeline of shuffled training windows drawn from a token store.

A window is ``seq_len + 1`` consecutive store tokens starting at a multiple of ``doc_align``
(the candidate starts are every such position whose window fits in the store). Because the store
pads every document to a multiple of ``doc_align``, every document start inside a window then
sits at a window position that is a multiple of ``doc_align``.

Order: the candidate starts are shuffled by grain with a fresh permutation every epoch
(``MapDataset.shuffle`` followed by ``repeat(None)``: grain seeds epoch ``e`` with ``seed + e``;
the user seed is first spread by ``numpy.random.SeedSequence`` so that runs with seeds ``s`` and
``s + 1`` do not share permutations one epoch apart), repeated forever and batched into *global*
batches of ``batch_size`` starts. With several processes every process computes the same global
batches of starts and reads only its own contiguous block of rows (process ``i`` of ``n`` reads
rows ``[i B/n, (i + 1) B/n)``, the rows its devices hold), so the global batch, and with it the
loss, does not depend on the number of processes. Everything is deterministic given the seed,
and the iterator's state (grain's ``get_state``: a small JSON-serialisable dict counting
batches) restores the exact continuation.
"""

from __future__ import annotations

import grain
import jax
import numpy as np

from titans_lm.data.store import TokenStore


def window_starts(num_tokens: int, seq_len: int, doc_align: int) -> np.ndarray:
    """int64[W]: every multiple of ``doc_align`` whose window of ``seq_len + 1`` tokens fits.

    Raises:
      ValueError: non-positive sizes, or fewer than ``seq_len + 1`` tokens.
    """
    if seq_len < 1 or doc_align < 1:
        raise ValueError(f"seq_len and doc_align must be positive, got {seq_len}, {doc_align}")
    if num_tokens < seq_len + 1:
        raise ValueError(f"the token store holds {num_tokens} tokens, fewer than one window of "
                         f"seq_len + 1 = {seq_len + 1}")
    return np.arange(0, num_tokens - seq_len, doc_align, dtype=np.int64)


class ReadWindow(grain.transforms.Map):
    """Map a window start to ``{"tokens": int32[T+1], "segment_ids": int32[T+1]}``."""

    def __init__(self, store: TokenStore, seq_len: int):
        self._store = store
        self._length = seq_len + 1

    def map(self, start):
        start = int(start)
        return {"tokens": self._store.window(start, self._length),
                "segment_ids": self._store.segment_ids(start, self._length)}


class ReadRows(grain.transforms.Map):
    """Map a global batch of window starts ``int64[B]`` to this process's rows
    ``{"tokens", "segment_ids"}: int32[B / n, T + 1]`` (rows ``[i B/n, (i + 1) B/n)``)."""

    def __init__(self, store: TokenStore, seq_len: int, shard_index: int, shard_count: int):
        self._window = ReadWindow(store, seq_len)
        self._index, self._count = shard_index, shard_count

    def map(self, starts):
        rows = len(starts) // self._count
        mine = [self._window.map(s) for s in starts[self._index * rows:(self._index + 1) * rows]]
        return {k: np.stack([m[k] for m in mine]) for k in ("tokens", "segment_ids")}


def _grain_seed(seed: int) -> int:
    return int(np.random.SeedSequence(seed).generate_state(1, dtype=np.uint32)[0])


def make_train_dataset(store: TokenStore, *, seq_len: int, batch_size: int, seed: int, doc_align: int,
                       shard_index: int | None = None, shard_count: int | None = None) -> grain.MapDataset:
    """The infinite grain ``MapDataset`` of this process's training batches (see the module doc).

    Args:
      store: the training split's token store.
      seq_len: T; each row holds T + 1 tokens (inputs and targets overlap by T).
      batch_size: global batch size; this process gets ``batch_size // shard_count`` rows.
      seed: shuffle seed (non-negative).
      doc_align: window starts are multiples of this; must equal the store's ``doc_align`` (or be
        a multiple of it) so document starts stay aligned inside windows.
      shard_index, shard_count: this process and the number of processes; default
        ``jax.process_index()`` and ``jax.process_count()``.

    Raises:
      ValueError: inconsistent sizes (naming the values), or fewer windows than processes.
    """
    if shard_index is None or shard_count is None:
        shard_index = jax.process_index() if shard_index is None else shard_index
        shard_count = jax.process_count() if shard_count is None else shard_count
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} must lie in [0, shard_count={shard_count})")
    if batch_size < 1 or batch_size % shard_count:
        raise ValueError(f"batch_size={batch_size} must be a positive multiple of the number of "
                         f"processes shard_count={shard_count}")
    if doc_align < 1 or doc_align % store.doc_align:
        raise ValueError(f"doc_align={doc_align} must be a positive multiple of the store's "
                         f"doc_align={store.doc_align} ({store.path})")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    starts = window_starts(store.num_tokens, seq_len, doc_align)
    return (grain.MapDataset.source(starts)
            .shuffle(seed=_grain_seed(seed))
            .repeat(None)
            .batch(batch_size, drop_remainder=True)
            .map(ReadRows(store, seq_len, shard_index, shard_count)))


def make_train_iterator(store: TokenStore, *, seq_len: int, batch_size: int, seed: int, doc_align: int,
                        shard_index: int | None = None, shard_count: int | None = None,
                        num_threads: int = 2,
                        prefetch_batches: int = 4) -> grain.DatasetIterator:
    """A fresh grain iterator over :func:`make_train_dataset`, yielding numpy batches
    ``{"tokens": int32[B, T+1], "segment_ids": int32[B, T+1]}`` with ``B = batch_size // shard_count``.

    Single-process (no multiprocessing workers): ``num_threads`` threads assemble batches ahead
    of use, at most ``prefetch_batches`` of them (0 threads: batches are read on demand).
    ``it.get_state()`` / ``it.set_state(state)`` save and restore the position (a
    JSON-serialisable dict); ``grain.checkpoint.CheckpointSave(it)`` / ``CheckpointRestore(it)``
    put it in an orbax checkpoint.
    """
    ds = make_train_dataset(store, seq_len=seq_len, batch_size=batch_size, seed=seed, doc_align=doc_align,
                            shard_index=shard_index, shard_count=shard_count)
    read = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch_batches)
    return iter(ds.to_iter_dataset(read_options=read))
