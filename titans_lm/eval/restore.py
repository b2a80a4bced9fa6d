"""Run restore: a checkpoint's parameters with the model its saved config describes.

:func:`load_run` reads ``<workdir>/checkpoints`` (or an exported model folder,
:mod:`titans_lm.eval.exported`): the saved config (with the eval-time overrides
of ``titans_lm.config.overrides.apply_eval_overrides`` applied and validated, and ``model.max_context``
set by :func:`titans_lm.train.max_context.with_max_context`), the model description, a mesh for
this machine (:func:`eval_mesh`) and the parameters placed in their shardings. Evaluation
(``titans_lm.eval.evaluate``, ``titans_lm.eval.tasks``, ``titans_lm.eval.by_position_eval``) and
generation (``titans_lm.generate.run``) start from it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import ml_collections

from titans_lm.config.overrides import apply_eval_overrides
from titans_lm.config import validate
from titans_lm.eval import exported
from titans_lm.train import sharding as shd
from titans_lm.train.checkpoint import CheckpointError, Checkpointer
from titans_lm.train.max_context import with_max_context
from titans_lm.train.state import ModelFns, model_fns

Log = Callable[[str], None]


def eval_mesh(cfg: ml_collections.ConfigDict):
    """The mesh of ``cfg.mesh``, or plain data parallelism over every device when this machine's
    device count does not fit it."""
    try:
        return shd.make_mesh(cfg.mesh)
    except ValueError:  # trained on another device count: plain data parallelism here
        return shd.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """A checkpoint's parameters and what rebuilds its model.

    Attributes: cfg (the saved config with the eval-time overrides applied and
    ``model.max_context`` set by :func:`with_max_context`), fns (:class:`ModelFns`), params (pure
    dict, placed in ``params_sh``), params_sh, mesh, step, saved_cfg (the config as saved),
    tokenizer_file (an exported folder's ``tokenizer.model``; None for a run folder, whose
    tokenizer is rebuilt from its training text).
    """
    cfg: ml_collections.ConfigDict
    fns: ModelFns
    params: Any
    params_sh: Any
    mesh: Any
    step: int
    saved_cfg: ml_collections.ConfigDict
    tokenizer_file: Path | None = None


def require_run_dir(workdir: str | Path) -> Path:
    """``workdir`` as a path, when it is a folder.

    Raises:
      FileNotFoundError: there is no such folder (the message says so, and what it should be).
    """
    path = Path(workdir)
    if not path.is_dir():
        what = "a file, not a folder" if path.exists() else "no such folder"
        raise FileNotFoundError(f"--workdir={workdir}: {what}; it names the folder of a trained "
                                f"run (or of an exported model: titans-lm export)")
    return path


def _model_for(saved: ml_collections.ConfigDict, overrides: dict[str, str] | None,
               max_context: int | None):
    """``(cfg, fns, mesh, params_sh, abstract)`` of the model ``saved`` describes."""
    cfg = apply_eval_overrides(saved, overrides or {})
    validate(cfg, training=False)  # a trained run is scored as it trained
    cfg = with_max_context(cfg, max_context)
    fns = model_fns(cfg.model)
    mesh = eval_mesh(cfg)
    params_sh = shd.param_shardings(fns.abstract_params(), fns.logical_axes, mesh)
    abstract = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                            fns.abstract_params(), params_sh)
    return cfg, fns, mesh, params_sh, abstract


def _load_export(path: Path, step: int | None, max_context: int | None,
                 overrides: dict[str, str] | None) -> LoadedRun:
    meta = exported.read_meta(path)
    if step is not None and int(step) != int(meta["step"]):
        raise CheckpointError(f"{path} is an export of checkpoint step {meta['step']}; it has no "
                              f"step {step} (leave out --step)")
    saved = exported.read_config(path)
    cfg, fns, mesh, params_sh, abstract = _model_for(saved, overrides, max_context)
    host = exported.read_params(path, abstract)
    params = jax.tree.map(  # each process places its own shards (multi-process evaluation)
        lambda x, sh: jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx]), host, params_sh)
    return LoadedRun(cfg, fns, params, params_sh, mesh, int(meta["step"]), saved,
                     tokenizer_file=path / exported.TOKENIZER_FILE)


def load_run(workdir: str | Path, step: int | None = None, *, max_context: int | None = None,
             overrides: dict[str, str] | None = None, bad_checkpoint: str = "fallback",
             log: Log | None = None) -> LoadedRun:
    """Restore the parameters of ``workdir``'s checkpoint ``step`` (default: the newest) with
    the model its saved config describes (with ``overrides``, eval-time config changes:
    :func:`titans_lm.config.overrides.apply_eval_overrides`).

    ``bad_checkpoint``: "fallback" (a checkpoint whose parameters or config are damaged is named
    and the previous complete one used; not with an explicit ``step``) or "refuse". Damage to
    the optimiser state only is named through ``log`` (default: stderr) and does not matter here.

    ``workdir`` may also be an exported model folder (:mod:`titans_lm.eval.exported`; ``step``,
    when given, must be the step it holds).

    Raises:
      FileNotFoundError: ``workdir`` is not a folder.
      titans_lm.train.checkpoint.CheckpointError: no (or an unreadable) checkpoint, or a
        ``step`` an export folder does not hold.
      titans_lm.eval.exported.ExportError (a ValueError): an export folder that cannot be read.
      ValueError: a bad ``max_context`` or an override that evaluation cannot apply.
    """
    require_run_dir(workdir)
    if exported.is_export(workdir):
        return _load_export(Path(workdir).resolve(), step, max_context, overrides)
    primary = jax.process_index() == 0
    if log is None:
        log = lambda m: print(m, file=sys.stderr) if primary else None  # noqa: E731
    ckpt = Checkpointer(Path(workdir).resolve(), read_only=True)
    try:
        def load(s: int):
            saved = ckpt.read_config(s)
            cfg, fns, mesh, params_sh, abstract = _model_for(saved, overrides, max_context)
            return cfg, fns, mesh, params_sh, ckpt.restore_params(abstract, s)[0], saved
        # Evaluation reads the parameters and the config: damage elsewhere (the optimiser state)
        # is reported and does not stop it.
        explicit = None if step is None else [ckpt.resolve_step(step)]
        (cfg, fns, mesh, params_sh, params, saved), step = ckpt.newest_usable(
            load, policy=bad_checkpoint, needed=("parameters", "config"), log=log, steps=explicit)
    finally:
        ckpt.close()
    return LoadedRun(cfg, fns, params, params_sh, mesh, step, saved)


__all__ = ["LoadedRun", "eval_mesh", "load_run", "require_run_dir"]
