"""The memory ablation probe: how much loss a memory's content saves.

``titans-lm eval --ablate_at=P`` (:func:`ablate_memory`; run by
``titans_lm.eval.by_position_eval``): the carry run again, but at the first window boundary at or
after ``P`` inside each document (``P`` rounded up to a multiple of the window ``T``:
``P' = ceil(P / T) * T``), every neural memory of the model is reset in that document's row. LMM, TTT and the
memories of MAG and MAL (``titans_lm.memory.carried.MemoryState``) go to the state a document start
restores: weights to ``reset_to`` (W0, or the state the persistent tokens leave), momentum to zero,
and the tokens buffered for the current chunk are dropped (marked padding, so they are never
written). MAC's memory (``titans_lm.models.mac.MACState.memory``, the state at the current
segment's start) goes to the layer's W0 from the current parameters with zero momentum; its segment
buffer is kept, so the current segment's tokens before ``P'`` (fewer than ``segment_len``; none
when ``segment_len`` divides ``T``) are retrieved from W0 and written into the reset memory again
when the next window runs (their outputs were scored before the reset and are not used): the reset
removes what the segments completed before the one holding ``P'`` wrote (nothing where ``P'`` falls
inside a document's first segment). Nothing else changes: attention caches, segment buffers, the
memories' convolution tails and the stream positions stay, and no document boundary is signalled.
Positions ``< P'`` are therefore scored exactly as in the unablated run, and the mean loss over
positions ``>= P'`` against the unablated run's is the loss the memory's content saves
(``<workdir>/ablation_<dataset>_step<N>[_docs<M>][_tokens<K>]_at<P'>.json``, with the count of
non-finite losses of each run).
A model without a neural memory (Transformer++) is refused.

Each mixer resets its own memory (``mixer.reset_memory``, the mixer protocol of
``titans_lm.models.mixer``); this module only asks the model to (``ModelFns.reset_memory``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np


def check_has_memory(fns: Any, params: Any) -> None:
    """Raise ValueError unless the model of ``fns`` holds a neural memory (abstractly: no
    computation)."""
    norms = jax.eval_shape(lambda p: fns.memory_norms(p, fns.init_state(p, 1)), params)
    if not norms:
        raise ValueError("--ablate_at needs a model with a neural memory (LMM, TTT, MAG, MAL, "
                         "MAC); this model's state holds none")


def ablate_memory(fns: Any, params: Any, state: Any, rows_B: jax.Array) -> Any:
    """``state`` with every neural memory reset in the rows ``rows_B`` (bool [B]), by each
    mixer's ``reset_memory`` with ``params`` (``ModelFns.reset_memory``; what each backbone
    resets: the module docstring). Every other leaf (attention caches, stream positions, segment
    buffers, conv tails) is returned as is. Pure and jit-compatible.

    Raises:
      ValueError: the state holds no neural memory.
    """
    if not fns.memory_norms(params, state):   # no memory; the norms are dropped by jit
        raise ValueError("--ablate_at needs a model with a neural memory (LMM, TTT, MAG, MAL, "
                         "MAC); this model's state holds none")
    return fns.reset_memory(params, state, jax.numpy.asarray(rows_B, bool))


def ablation_window(ablate_at: int, seq_len: int) -> int:
    """The window index ``ceil(P / T)`` at whose start the memory is reset (``P >= 1``).

    Raises:
      ValueError: ``ablate_at < 1``.
    """
    if int(ablate_at) < 1:
        raise ValueError(f"--ablate_at must be a position >= 1, got {ablate_at}")
    return -(-int(ablate_at) // int(seq_len))


def ablation_summary(base: tuple[np.ndarray, np.ndarray], ablated: tuple[np.ndarray, np.ndarray],
                     ablate_at: int, seq_len: int) -> dict[str, Any]:
    """Mean losses before and after the ablation point of the unablated and ablated carry runs.

    Returns a dict: ``ablate_at`` (as asked), ``ablate_position`` (``P'``, where the reset
    happens), token counts and mean losses (nats) before / after ``P'`` of both runs,
    ``loss_increase`` (ablated - unablated mean after ``P'``), ``loss_increase_first_window``
    (the same over ``[P', P' + T)``, the window right after the reset) and
    ``max_abs_diff_before`` (0 when the positions before ``P'`` are untouched, as they must be;
    NaN where a loss before ``P'`` is not finite), ``n_nonfinite`` / ``n_nonfinite_ablated``
    (losses that are NaN or inf in each run: a memory whose inner loop diverged, whose means are
    then not finite either).

    Raises:
      ValueError: the two runs scored different tokens, or ``ablate_at < 1``.
    """
    p = ablation_window(ablate_at, seq_len) * int(seq_len)
    (lb, pb), (la, pa) = base, ablated
    if not np.array_equal(pb, pa):
        raise ValueError("the ablated run scored other tokens than the unablated one")
    after = pb >= p

    def mean(x):
        return float(x.mean()) if x.size else None

    out = {"ablate_at": int(ablate_at), "ablate_position": p, "seq_len": int(seq_len),
           "n_tokens_before": int((~after).sum()), "n_tokens_after": int(after.sum()),
           "loss_before": mean(lb[~after]), "loss_before_ablated": mean(la[~after]),
           "loss_after": mean(lb[after]), "loss_after_ablated": mean(la[after]),
           "max_abs_diff_before": float(np.max(np.abs(lb[~after] - la[~after])))
           if (~after).any() else 0.0}
    out["n_nonfinite"] = int((~np.isfinite(lb)).sum())
    out["n_nonfinite_ablated"] = int((~np.isfinite(la)).sum())
    out["loss_increase"] = (out["loss_after_ablated"] - out["loss_after"]
                            if after.any() else None)
    first = after & (pb < p + int(seq_len))  # the window right after the reset
    out["n_tokens_first_window"] = int(first.sum())
    out["loss_increase_first_window"] = (float(la[first].mean() - lb[first].mean())
                                         if first.any() else None)
    return out


def format_ablation(s: dict[str, Any]) -> str:
    def f(x):
        return "-" if x is None or not math.isfinite(x) else f"{x:.4f}"
    return (f"memory ablation at position {s['ablate_position']} (asked {s['ablate_at']}): "
            f"loss after {f(s['loss_after'])} -> {f(s['loss_after_ablated'])} nats "
            f"(increase {f(s['loss_increase'])}) over {s['n_tokens_after']:,} tokens, "
            f"{f(s.get('loss_increase_first_window'))} in the window after it; before: "
            f"{f(s['loss_before'])} vs {f(s['loss_before_ablated'])} "
            f"(max difference {s['max_abs_diff_before']:.2e})"
            + (f"; non-finite losses: {s['n_nonfinite']:,} unablated, "
               f"{s['n_nonfinite_ablated']:,} ablated (the memory diverged?)"
               if s.get("n_nonfinite") or s.get("n_nonfinite_ablated") else ""))


__all__ = ["ablate_memory", "ablation_summary", "ablation_window", "check_has_memory",
           "format_ablation"]
