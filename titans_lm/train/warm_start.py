"""Warm start: a new run's parameters read from another run's checkpoint (``train.init_from``).

A run with ``train.init_from=<workdir>`` starts (step 0, its own data order, a fresh optimiser
state and schedule, the carried model state built from these parameters) from the parameters of
``<workdir>``'s newest checkpoint instead of from the seed: curriculum training (a short context
first, then a longer one), fine-tuning on another corpus or task, or a bound changed after
pretraining, as ``load_parameters_path`` in MaxText and ``initialize_from`` in levanter. Only
the parameters are read; a run that already has a checkpoint of its own resumes from it and
ignores ``init_from``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import ml_collections

from titans_lm.config.compat import config_differences
from titans_lm.config.serialize import config_to_json_dict
from titans_lm.train.checkpoint import Checkpointer, CheckpointError


def _model_differences(saved: ml_collections.ConfigDict, cfg: ml_collections.ConfigDict
                       ) -> list[str]:
    """``"field: saved -> requested"`` for each ``model.*`` field that differs (as on resume)."""
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in
            config_differences(config_to_json_dict(saved), cfg) if k.startswith("model.")]


def warm_start_params(init_from: str | Path, abstract_params: Any, cfg: ml_collections.ConfigDict,
                      log: Callable[[str], None]) -> Any:
    """The parameters of the newest checkpoint in ``init_from``, placed like ``abstract_params``.

    Args:
      init_from: the workdir of an earlier run (the directory that holds ``checkpoints/``).
      abstract_params: this run's parameter tree of ``jax.ShapeDtypeStruct`` with shardings.
      cfg: this run's config (its ``model`` section is compared with the saved one for the
        error message and the log).
      log: one line saying where the parameters come from and which model fields differ.

    Returns:
      The parameter tree, every leaf a ``jax.Array`` in its target sharding.

    Raises:
      CheckpointError: ``init_from`` holds no checkpoint, the checkpoint cannot be read, or its
        parameters do not fit this model (naming the model fields that differ).
    """
    src = Path(init_from).expanduser().resolve()
    try:
        ckpt = Checkpointer(src, read_only=True)
    except CheckpointError as e:
        raise CheckpointError(f"config field train.init_from: {e}; give the workdir of a run "
                              f"that has saved a checkpoint") from None
    try:
        step = ckpt.latest_step()
        if step is None:
            raise CheckpointError(f"config field train.init_from: no checkpoint in {src}; give "
                                  f"the workdir of a run that has saved a checkpoint")
        diffs = _model_differences(ckpt.read_config(step), cfg)
        try:
            params, _ = ckpt.restore_params(abstract_params, step)
        except CheckpointError as e:
            fields = ("; model fields that differ (checkpoint -> config): " + ", ".join(diffs)
                      if diffs else "")
            raise CheckpointError(
                f"config field train.init_from: the parameters of {src} (step {step}) do not fit "
                f"this model{fields}. Use a model whose parameter shapes match that run's "
                f"({getattr(e, 'detail', e)})") from None
    finally:
        ckpt.close()
    log(f"parameters from {src} (step {step})"
        + (f"; model fields changed: {', '.join(diffs)}" if diffs else ""))
    return params
