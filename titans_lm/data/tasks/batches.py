"""Seeded task rows and batches: training iterator, validation batches, the trainer's data side."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from titans_lm.data.corpora import load_documents
from titans_lm.data.tasks.mad_settings import epoch_order, mad_rows
from titans_lm.data.tasks.mqar import mqar_example
from titans_lm.data.tasks.niah import NiahVocab, niah_example, text_to_tokens
from titans_lm.data.tasks.spec import TaskSpec, task_spec

_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


def example_rng(seed: int, split: str, *index: int) -> np.random.Generator:
    """The generator of one example: ``SeedSequence([seed, split code, *index])``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), _SPLIT_CODE[split],
                                                         *map(int, index)]))


_TEXT_CACHE: dict[tuple, np.ndarray] = {}


def book_text(spec: TaskSpec, split: str) -> np.ndarray:
    """The split's book text in the S-NIAH word scheme (cached per process)."""
    key = (spec.corpus, spec.data_dir, split, spec.vocab_size)
    if key not in _TEXT_CACHE:
        vocab = NiahVocab(spec.vocab_size)
        docs = load_documents(spec.corpus, split, spec.data_dir)
        _TEXT_CACHE[key] = np.concatenate([text_to_tokens(d.text, vocab) for d in docs])
    return _TEXT_CACHE[key]


def task_rows(spec: TaskSpec, split: str, seed: int, index: Sequence[int], n_rows: int,
              seq_len: int, *, num_pairs: int | None = None, depth: float | None = None
              ) -> dict[str, np.ndarray]:
    """``n_rows`` examples, row ``r`` drawn from ``example_rng(seed, split, *index, r)``.

    Training rows (``num_pairs`` / ``depth`` None) draw MQAR's pairs from ``spec.train_pairs``
    and S-NIAH's depth uniformly from ``spec.train_depths``; evaluation sets pass them.

    A MAD task (``spec.mad``) draws its examples ``0 .. n_rows - 1`` of ``split`` instead
    (:func:`titans_lm.data.tasks.mad_settings.mad_rows`; ``index`` unused), with a ``"targets"``
    row as well.

    Returns:
      ``{"tokens", "segment_ids", "loss_mask"}`` int32[n_rows, seq_len + 1] (segment id 1
      everywhere), plus ``"depth"`` float64[n_rows] (S-NIAH: realised depth; MQAR: nan).
    """
    if spec.mad is not None:
        return mad_rows(spec.mad, example_rng, split, seed, range(n_rows))
    toks = np.zeros((n_rows, seq_len + 1), np.int32)
    mask = np.zeros_like(toks)
    depths = np.full(n_rows, np.nan)
    vocab = NiahVocab(spec.vocab_size) if spec.name == "niah" else None
    text = (book_text(spec, "train" if split == "train" else "test")
            if spec.name == "niah" and spec.variant != "niah_single_1" else None)
    for r in range(n_rows):
        rng = example_rng(seed, split, *index, r)
        if spec.name == "mqar":
            n = num_pairs if num_pairs is not None else int(rng.choice(spec.train_pairs))
            toks[r], mask[r] = mqar_example(rng, seq_len, n, spec.vocab_size, spec.power_a)
        else:
            lo, hi = spec.train_depths
            d = depth if depth is not None else float(rng.uniform(lo, hi))
            toks[r], mask[r], depths[r] = niah_example(rng, seq_len, d, spec.variant, vocab, text)
    return {"tokens": toks, "segment_ids": np.ones_like(toks), "loss_mask": mask, "depth": depths}


class TaskIterator:
    """The infinite training batches of a task: batch ``i`` is :func:`task_rows` with index
    ``(i,)`` (global rows; this process keeps its contiguous share), so the state is the batch
    counter and resuming is exact. A MAD task reads its fixed training set of
    ``num_train_examples`` examples in a new shuffled order each epoch
    (:func:`titans_lm.data.tasks.mad_settings.epoch_order`).

    ``next(it)`` -> ``{"tokens", "segment_ids", "loss_mask"[, "targets"]}`` int32[B_local, T + 1];
    ``get_state()`` -> ``{"batch": i}``; ``set_state(state)`` restores it.
    """

    def __init__(self, spec: TaskSpec, *, seq_len: int, batch_size: int, seed: int,
                 shard_index: int = 0, shard_count: int = 1):
        if batch_size % shard_count:
            raise ValueError(f"batch_size={batch_size} must be a multiple of the number of "
                             f"processes shard_count={shard_count}")
        self.spec, self.seq_len, self.batch_size, self.seed = spec, seq_len, batch_size, seed
        self._rows = slice(shard_index * batch_size // shard_count,
                           (shard_index + 1) * batch_size // shard_count)
        self._batch = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.spec.mad is not None:
            ids = epoch_order(self.seed, self.spec.mad.num_train_examples, self._batch,
                              self.batch_size)[self._rows]
            self._batch += 1
            return row_fields(mad_rows(self.spec.mad, example_rng, "train", self.seed, ids))
        b = task_rows(self.spec, "train", self.seed, (self._batch,), self.batch_size, self.seq_len)
        self._batch += 1
        return {k: b[k][self._rows] for k in ("tokens", "segment_ids", "loss_mask")}

    def get_state(self) -> dict[str, int]:
        return {"batch": self._batch}

    def set_state(self, state: dict) -> None:
        self._batch = int(state["batch"])


def task_validation_batches(spec: TaskSpec, *, seq_len: int, batch_size: int, n_batches: int,
                            seed: int, multiple: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed validation batches (split "validation", training distribution), ``batch_size``
    rounded up to a multiple of ``multiple`` (the batch shards)."""
    bsz = -(-batch_size // multiple) * multiple
    out = []
    for i in range(n_batches):
        if spec.mad is not None:
            out.append(row_fields(mad_rows(spec.mad, example_rng, "validation", seed,
                                           range(i * bsz, (i + 1) * bsz))))
            continue
        b = task_rows(spec, "validation", seed, (i,), bsz, seq_len)
        out.append({k: b[k] for k in ("tokens", "segment_ids", "loss_mask")})
    return out


def row_fields(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The batch fields of task rows: ``tokens``, ``segment_ids``, ``loss_mask`` and, where the
    targets are not the next tokens (MAD), ``targets``."""
    return {k: rows[k] for k in ("tokens", "segment_ids", "loss_mask", "targets") if k in rows}


@dataclasses.dataclass(frozen=True)
class TaskData:
    """The data side of a task run for the trainer (in place of ``titans_lm.data.prepare``)."""
    spec: TaskSpec

    @classmethod
    def from_config(cls, cfg) -> "TaskData":
        return cls(task_spec(cfg))

    def train_iterator(self, *, seq_len: int, batch_size: int, seed: int, shard_index: int = 0,
                       shard_count: int = 1) -> TaskIterator:
        return TaskIterator(self.spec, seq_len=seq_len, batch_size=batch_size, seed=seed,
                            shard_index=shard_index, shard_count=shard_count)

    def validation_batches(self, **kw) -> list[dict[str, np.ndarray]]:
        return task_validation_batches(self.spec, **kw)
