"""The likely cause of a non-finite training loss, from the step's own metrics.

The train step reports, besides the loss, the global gradient norm and, per memory layer,
``memory_norm_i`` = max over batch and heads of ||P_T||_F / ||W0||_F, the memory state at the end
of the window relative to its learned start (``titans_lm.memory.stats``). The loss of step s is
computed with the parameters of state s - 1, which are finite (the previous step was checked), so:

- a memory state norm that is non-finite, or far above its earlier values, in the failing step
  means the memory's inner loop diverged in the forward pass (the writes grew without bound:
  theta / (1 - eta) too large for the memory's curvature, which grows with memory_depth);
- finite, ordinary memory norms (or no memory layers) point at the outer model or optimiser
  (a loss spike from too large a learning rate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# A memory state this many times larger than W0 at the end of a window is diverging.
DIVERGED_RATIO = 1e3


def memory_norms(metrics: Mapping[str, float]) -> dict[int, float]:
    """layer index -> memory_norm_i of a metrics record."""
    return {int(k.rsplit("_", 1)[1]): float(v) for k, v in metrics.items()
            if k.startswith("memory_norm_")}


def likely_cause(metrics: Mapping[str, float], previous: Mapping[int, float] | None = None) -> str:
    """One sentence naming the likely cause of a non-finite loss and what to change.

    Args:
      metrics: the failing step's metrics (floats; NaN/inf allowed).
      previous: the largest finite memory_norm_i of each layer seen earlier in the run.
    """
    norms = memory_norms(metrics)
    previous = previous or {}
    bad = {i: v for i, v in norms.items()
           if not math.isfinite(v) or v > max(DIVERGED_RATIO, 100 * previous.get(i, 1.0))}
    if bad:
        shown = ", ".join(f"layer {i}: {v:.3g}" for i, v in sorted(bad.items()))
        return (f"likely cause: the memory's inner loop diverged (memory-state norm / W0 norm "
                f"{shown}); lower model.memory.theta_max or model.memory.eta_max, or turn on the "
                f"guard model.memory.surprise_max_norm (e.g. 1.0)")
    if norms:
        shown = ", ".join(f"{v:.3g}" for _, v in sorted(norms.items()))
        return (f"likely cause: the outer model or optimiser, not the memory (memory-state norms "
                f"/ W0 stayed finite: {shown}); lower optim.lr or raise optim.warmup_steps")
    return "lower optim.lr or raise optim.warmup_steps"


__all__ = ["DIVERGED_RATIO", "likely_cause", "memory_norms"]
