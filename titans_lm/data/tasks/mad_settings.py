"""MAD's task settings (the baselines and difficulty changes of ``titans_lm.config.mad``) and the
seeded rows of one setting.

A :class:`MadSetting` is one MAD task instance (vocabulary, sequence length, data set sizes,
noise, motifs, tokens to copy). :func:`mad_settings` lists a task's settings as MAD's benchmark
does: the baseline, then each change applied to the baseline alone, one value at a time (MAD's
``make_benchmark_mad_configs``). The model sees :attr:`MadSetting.input_length` inputs per row and
a vocabulary of :attr:`MadSetting.model_vocab_size` ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from titans_lm.config.mad import BASELINES, CHANGES, MAD_TASKS, NUM_TEST_EXAMPLES
from titans_lm.data.tasks import mad
from titans_lm.data.tasks.mqar import N_RESERVED


def check_task(task: str) -> str:
    """``task`` if it is a MAD task.

    Raises:
      ValueError: naming the valid ones.
    """
    if task not in MAD_TASKS:
        raise ValueError(f"unknown MAD task {task!r}; valid: {', '.join(MAD_TASKS)}")
    return task


@dataclasses.dataclass(frozen=True)
class MadSetting:
    """One MAD task instance (field names and defaults: MAD's ``MADConfig``)."""
    task: str
    vocab_size: int = 16
    seq_len: int = 128
    num_train_examples: int = 12800
    num_test_examples: int = NUM_TEST_EXAMPLES
    frac_noise: float = 0.0
    noise_vocab_size: int = 0
    num_tokens_to_copy: int = 0
    k_motif_size: int = 1
    v_motif_size: int = 1
    label: str = "baseline"

    @property
    def input_length(self) -> int:
        """Model inputs per row: recall ``S - 1`` (MAD's multi-query rows), compression ``2S``
        (sequence + position queries), memorization ``2 (S // 2)``, else ``S``."""
        if self.task in ("in_context_recall", "noisy_in_context_recall"):
            return self.seq_len - 1
        if self.task == "compression":
            return 2 * self.seq_len
        if self.task == "memorization":
            return 2 * (self.seq_len // 2)
        return self.seq_len

    @property
    def model_vocab_size(self) -> int:
        """The model's vocabulary: MAD's ``V`` (+ ``S`` position queries for compression) + the
        4 reserved ids."""
        extra = self.seq_len if self.task == "compression" else 0
        return self.vocab_size + extra + N_RESERVED

    def check(self) -> "MadSetting":
        """Draws one example of each split, so that a bad setting fails before training.

        Raises:
          ValueError: the generator's message, naming the setting.
        """
        check_task(self.task)
        if self.num_train_examples < 1 or self.num_test_examples < 1:
            raise ValueError(f"{self.task}: num_train_examples and num_test_examples must be "
                             f">= 1, got {self.num_train_examples}, {self.num_test_examples}")
        try:
            for train in (True, False):
                mad_example(self, np.random.default_rng(0), train=train,
                            kv_map=memorization_map_of(self, 0))
        except ValueError as e:
            raise ValueError(f"MAD {self.task} ({self.label}): {e}") from None
        return self


def mad_settings(task: str, *, only_baseline: bool = False,
                 num_test_examples: int = NUM_TEST_EXAMPLES) -> list[MadSetting]:
    """MAD's settings of ``task``: the baseline, then each change alone (label ``field=value``).

    Raises:
      ValueError: an unknown task.
    """
    base = BASELINES[check_task(task)]
    out = [MadSetting(task=task, num_test_examples=num_test_examples, **base)]
    if only_baseline:
        return out
    for field, values in CHANGES[task].items():
        for v in values:
            out.append(MadSetting(task=task, num_test_examples=num_test_examples,
                                  **{**base, field: v}, label=f"{field}={v}"))
    return out


def memorization_map_of(setting: MadSetting, seed: int) -> dict[int, int] | None:
    """The key-value map of a memorization setting (None for other tasks)."""
    if setting.task != "memorization":
        return None
    return mad.memorization_map(setting.vocab_size, seed)


def mad_example(setting: MadSetting, rng: np.random.Generator, *, train: bool,
                kv_map: dict[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One example of ``setting`` in MAD's ids and form (``(inputs, targets)``, see
    :mod:`titans_lm.data.tasks.mad`); ``train`` picks MAD's training targets (recall tasks:
    every next token) over its test targets."""
    s, t = setting, setting.task
    if t in ("in_context_recall", "noisy_in_context_recall"):
        return mad.in_context_recall(rng, s.vocab_size, s.seq_len, train=train,
                                     noise_vocab_size=s.noise_vocab_size, frac_noise=s.frac_noise)
    if t == "fuzzy_in_context_recall":
        return mad.fuzzy_in_context_recall(rng, s.vocab_size, s.seq_len, train=train,
                                           k_motif_size=s.k_motif_size,
                                           v_motif_size=s.v_motif_size,
                                           noise_vocab_size=s.noise_vocab_size,
                                           frac_noise=s.frac_noise)
    if t == "selective_copying":
        return mad.selective_copying(rng, s.vocab_size, s.seq_len,
                                     num_tokens_to_copy=s.num_tokens_to_copy)
    if t == "compression":
        return mad.compression(rng, s.vocab_size, s.seq_len)
    if t == "memorization":
        return mad.memorization(rng, s.vocab_size, s.seq_len, kv_map)
    raise ValueError(check_task(t))


def mad_rows(setting: MadSetting, example_rng, split: str, seed: int,
             example_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Rows of the examples ``example_ids`` of ``split`` (example ``i`` drawn from
    ``example_rng(seed, split, i)``; training targets for "train", test targets otherwise).

    Returns:
      ``{"tokens", "targets", "loss_mask", "segment_ids"}`` int32[len(example_ids), L + 1] with
      ``L = setting.input_length``, and ``"depth"`` (nan; the shared row dict's field).
    """
    L = setting.input_length
    n = len(example_ids)
    toks = np.zeros((n, L + 1), np.int32)
    tgts, mask = np.zeros_like(toks), np.zeros_like(toks)
    kv_map = memorization_map_of(setting, seed)
    for r, i in enumerate(example_ids):
        x, y = mad_example(setting, example_rng(seed, split, int(i)), train=split == "train",
                           kv_map=kv_map)
        toks[r], tgts[r], mask[r] = mad.mad_row(x, y)
    return {"tokens": toks, "targets": tgts, "loss_mask": mask, "segment_ids": np.ones_like(toks),
            "depth": np.full(n, np.nan)}


def epoch_order(seed: int, num_examples: int, batch: int, batch_size: int) -> np.ndarray:
    """The example ids of training batch ``batch``: the examples shuffled anew each epoch (epoch
    ``e``'s order from ``SeedSequence([seed, 7, e])``) and read as one stream, ``batch_size`` at a
    time (with ``batch_size`` dividing ``num_examples``, exactly MAD's shuffled epochs).
    Returns int64[batch_size]."""
    start = batch * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), num_examples)
        order = np.random.default_rng(np.random.SeedSequence([int(seed), 7, epoch])).permutation(
            num_examples)
        out.extend(order[offset:offset + batch_size - len(out)])
    return np.array(out, np.int64)
