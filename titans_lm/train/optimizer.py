"""The optimiser: AdamW with masked weight decay, linear warmup + cosine decay, global-norm clipping.

Built from ``cfg.optim`` (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization";
the warmup + cosine schedule of Loshchilov & Hutter 2017). Gradient accumulation is not an optax
wrapper here: the train step (``titans_lm.train.step``) sums the gradients of the micro-batches in
a ``lax.scan`` and applies one update, so one train step is always one optimiser update and the
result equals one large batch exactly (up to float summation order).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax

# Weight decay applies to matrices only. A parameter is *not* decayed when it has fewer than two
# dimensions (norm scales, biases, per-channel or scalar gates), or when a key on its path, split
# at "_", contains one of these words: token embeddings ("embed", "embedding"), persistent-memory
# tokens (learned input embeddings, "persistent"), norms, biases, and the data-dependent gates of
# the neural memory ("gates", "theta": step size, "eta": momentum decay, "alpha": forgetting).
# SwiGLU's ``w_gate`` is an ordinary projection and is decayed ("gate" is not in the list).
NO_DECAY_WORDS = frozenset({"embed", "embedding", "persistent", "norm", "bias", "gates", "theta",
                            "eta", "alpha"})


def _path_keys(path) -> list[str]:
    out = []
    for k in path:
        key = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
        out.append(str(key).lower())
    return out


def decays(path, x) -> bool:
    """Whether the parameter at ``path`` (a jax key path) with value ``x`` gets weight decay."""
    if getattr(x, "ndim", 0) < 2:
        return False
    return not any(word in NO_DECAY_WORDS for key in _path_keys(path) for word in key.split("_"))


def weight_decay_mask(params: Any) -> Any:
    """Tree of bools (True: decayed) matching ``params``; see :data:`NO_DECAY_WORDS`."""
    return jax.tree_util.tree_map_with_path(decays, params)


def make_schedule(optim_cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Learning rate as a function of the number of updates already applied (0-based step).

    Linear warmup over ``warmup_steps`` from 0 to ``lr``, then cosine decay to
    ``lr * end_lr_ratio`` at ``total_steps``. The schedule is read at ``step + 1`` (the count
    including the current update), so the first update already has a non-zero rate
    (``lr / warmup_steps``) and the last one uses exactly ``lr * end_lr_ratio``.
    """
    warmup = int(optim_cfg.warmup_steps)
    sched = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=float(optim_cfg.lr), warmup_steps=warmup,
        decay_steps=max(int(total_steps), warmup + 1),
        end_value=float(optim_cfg.lr) * float(optim_cfg.end_lr_ratio))
    return lambda step: sched(step + 1)


def schedule_warnings(optim_cfg: ml_collections.ConfigDict, total_steps: int) -> list[str]:
    """Warnings about a schedule that cannot do what it says (the schedule is not changed).

    A warm-up at least as long as the run never reaches the peak ``optim.lr``: the whole run
    trains at a fraction of it (with 80 warm-up steps and 30 steps, at most 3/8 of it).
    """
    warmup, steps = int(optim_cfg.warmup_steps), int(total_steps)
    if warmup < steps:
        return []
    peak = min(steps, warmup) / max(warmup, 1)
    suggest = max(1, steps // 10)
    return [f"optim.warmup_steps={warmup} is not shorter than train.steps={steps}: the learning "
            f"rate never reaches optim.lr={float(optim_cfg.lr):g} (it peaks at {peak:.0%} of it "
            f"on the last step) and the run trains poorly; set --config.optim.warmup_steps="
            f"{suggest} (10% of the run) or train longer"]


def make_optimizer(optim_cfg: ml_collections.ConfigDict, total_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(tx, schedule)``: clip_by_global_norm(clip_norm) then AdamW with the masked decay.

    ``clip_norm <= 0`` disables clipping. The moments are kept in the parameters' dtype (float32).
    """
    schedule = make_schedule(optim_cfg, total_steps)
    adamw = optax.adamw(schedule, b1=float(optim_cfg.b1), b2=float(optim_cfg.b2),
                        eps=float(optim_cfg.eps), weight_decay=float(optim_cfg.weight_decay),
                        mask=weight_decay_mask)
    parts = [optax.clip_by_global_norm(float(optim_cfg.clip_norm))] if optim_cfg.clip_norm > 0 else []
    return optax.chain(*parts, adamw), schedule
