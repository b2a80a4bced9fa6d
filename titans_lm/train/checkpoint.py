"""Checkpoints of a run: one orbax ``CheckpointManager`` in ``<workdir>/checkpoints``.

Each checkpoint (a directory named by the step) holds three items:

- ``state``: the :class:`~titans_lm.train.state.TrainState` (float32 parameters, optimiser
  state, step, rng), written by every host for its own shards;
- ``data``: the data iterator's state (JSON), so a resumed run draws exactly the batches an
  uninterrupted run would have drawn;
- ``config``: the full run configuration (JSON), read back by ``titans-lm eval`` and checked on
  resume.

Saves are asynchronous (the step loop continues while the arrays are written) and atomic: orbax
writes into ``<step>.orbax-checkpoint-tmp-*`` and renames it when complete, and a directory
still carrying the tmp suffix (a save cut short) is never listed as a checkpoint. The manager
keeps the newest ``keep`` checkpoints.

The state is written one directory per array (orbax's ``use_ocdbt=False`` layout:
``state/params.<path>/``, ``state/opt_state.<path>/``), and once a save is complete process 0
adds ``integrity.json``, the size and CRC-32 of every file (:mod:`titans_lm.train.integrity`).
:meth:`Checkpointer.newest_usable` checks it before a checkpoint is used: a damaged one is named
(step, file, what is wrong) and skipped for the previous complete one, or refused. A save that
fails (a full disk) raises :class:`CheckpointSaveError`; the earlier checkpoints stay intact.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from titans_lm.config.compat import config_differences, format_differences
from titans_lm.config.serialize import config_to_json_dict
from titans_lm.train import integrity

class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (unreadable, or written by a different configuration)."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose files are damaged or cannot be read.

    Attributes:
      step: its step. detail: what is wrong, one line (file, part, problem).
      parts: the checkpoint parts hit (``titans_lm.train.integrity.part_of``), or None when only
        reading it showed the problem.
    """

    def __init__(self, msg: str, step: int, detail: str, parts: frozenset | None = None):
        super().__init__(msg)
        self.step, self.detail, self.parts = step, detail, parts


class CheckpointSaveError(CheckpointError):
    """Writing a checkpoint failed (e.g. the disk is full); earlier checkpoints are intact."""


BAD_CHECKPOINT_POLICIES = ("fallback", "refuse")


def checkpoint_dir(workdir: str | Path) -> Path:
    """``<workdir>/checkpoints``."""
    return Path(workdir).resolve() / "checkpoints"


def _is_empty(x: Any) -> bool:
    return hasattr(x, "shape") and 0 in tuple(x.shape)


def _without_empty(tree: Any) -> Any:
    """``tree`` with its zero-size arrays (which orbax cannot write: e.g. a carried model state's
    persistent-token slots of a model without persistent tokens) replaced by None."""
    return jax.tree.map(lambda x: None if _is_empty(x) else x, tree)


def _with_empty(restored: Any, abstract: Any) -> Any:
    """The restored tree with the zero-size arrays of ``abstract`` (ShapeDtypeStructs with
    shardings) put back, as :func:`_without_empty` removed them."""
    def fill(a, r):
        if _is_empty(a):
            return jax.device_put(np.zeros(a.shape, a.dtype), a.sharding)
        return r
    flat_a, treedef = jax.tree.flatten(abstract)
    return treedef.unflatten([fill(a, r) for a, r in zip(flat_a, treedef.flatten_up_to(restored))])


def _first_line(err: Exception, limit: int = 300) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[:limit] + "..."


def _jsonable(x: Any) -> Any:
    """numpy scalars/arrays and bytes inside an iterator state -> JSON types."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, bytes):
        return {"__bytes__": x.decode("latin-1")}
    return x


def _from_jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        if set(x) == {"__bytes__"}:
            return x["__bytes__"].encode("latin-1")
        return {k: _from_jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_jsonable(v) for v in x]
    return x


class Checkpointer:
    """Saves and restores the checkpoints of one workdir.

    Args:
      workdir: the run directory; checkpoints go to ``<workdir>/checkpoints``.
      keep: how many of the newest checkpoints to keep (``train.keep_checkpoints``).
      read_only: open without creating, saving or deleting anything (evaluation).

    Raises:
      CheckpointError: ``read_only`` and there is no checkpoint directory.
    """

    def __init__(self, workdir: str | Path, *, keep: int = 2, read_only: bool = False):
        self.workdir = Path(workdir).resolve()
        self.directory = checkpoint_dir(workdir)
        if read_only and not self.directory.is_dir():
            raise CheckpointError(f"no checkpoints in {self.workdir} (expected {self.directory})")
        self.read_only = read_only
        self._unsealed: list[int] = []  # saved by this instance, manifest not yet written
        self._in_flight: int | None = None
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=not read_only, create=not read_only,
                read_only=read_only),
            # One directory per array, so a damaged file names the array it holds.
            item_handlers={"state": ocp.StandardCheckpointHandler(use_ocdbt=False),
                           "data": ocp.JsonCheckpointHandler(),
                           "config": ocp.JsonCheckpointHandler()})

    # ----------------------------------------------------------------------------------- queries
    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending (half-written saves are not listed)."""
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def resolve_step(self, step: int | None) -> int:
        """``step`` if a checkpoint exists for it, else (None) the newest step.

        Raises:
          CheckpointError: no checkpoints, or none for ``step`` (listing the available ones).
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoints in {self.directory}")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; "
                                  f"available: {steps}")
        return step

    def _unreadable(self, step: int, err: Exception) -> CheckpointError:
        detail = f"could not be read ({type(err).__name__}: {_first_line(err)})"
        return DamagedCheckpointError(
            f"checkpoint {self.directory / str(step)} {detail}. Nothing was "
            f"deleted; remove that directory to fall back to an earlier checkpoint, or use a new "
            f"--workdir", step, detail)

    def cut_short(self) -> list[str]:
        """Names of the directories of saves that never completed (``*.orbax-checkpoint-tmp*``);
        they are never used."""
        if not self.directory.is_dir():
            return []
        return sorted(p.name for p in self.directory.iterdir()
                      if ".orbax-checkpoint-tmp" in p.name)

    def damage(self, step: int) -> list[integrity.Damage] | None:
        """The damaged files of checkpoint ``step`` by its manifest (``[]``: intact; None: the
        checkpoint has no manifest, so only reading it can tell)."""
        return integrity.verify(self.directory / str(step), step)

    def _damage_error(self, step: int, found: list[integrity.Damage]) -> DamagedCheckpointError:
        more = f" and {len(found) - 1} more file(s)" if len(found) > 1 else ""
        detail = f"{found[0].describe()}{more}"
        return DamagedCheckpointError(f"checkpoint step {step} in {self.directory} is damaged: "
                                      f"{detail}", step, detail, frozenset(d.part for d in found))

    def check_intact(self, step: int, needed: Iterable[str] | None = None) -> list[integrity.Damage]:
        """Raise if checkpoint ``step``'s manifest shows damage in a ``needed`` part (default:
        any part); return the damage found in the parts not needed.

        Raises:
          DamagedCheckpointError: naming the first damaged file, its part and the problem.
        """
        found = self.damage(step) or []
        needed = None if needed is None else set(needed) | {"metadata"}
        hit = [d for d in found if needed is None or d.part in needed]
        if hit:
            raise self._damage_error(step, hit)
        return found

    def newest_usable(self, use: Callable[[int], Any], *, policy: str = "fallback",
                      log: Callable[[str], None] = print, needed: Iterable[str] | None = None,
                      quarantine: bool = False, steps: list[int] | None = None) -> tuple[Any, int]:
        """Try the checkpoints newest first: ``(use(step), step)`` for the first that is intact
        (by its manifest, in the ``needed`` parts) and that ``use`` reads without a
        :class:`DamagedCheckpointError`.

        Each damaged checkpoint is named in one line (step, file, part, what is wrong, and what
        happens next) through ``log``. With ``quarantine`` (training) it is moved to
        ``<workdir>/damaged_checkpoints/<step>`` so that the run can write that step again;
        nothing is deleted.

        Args:
          use: reads a checkpoint (e.g. restores the state); may raise CheckpointError.
          policy: "fallback" (use the previous complete checkpoint) or "refuse" (raise).
          needed: the parts ``use`` reads (None: all); damage elsewhere is reported, not fatal.
          steps: the candidates (default: every complete checkpoint).

        Raises:
          DamagedCheckpointError: with policy "refuse", or when no checkpoint is usable.
          CheckpointError: other problems raised by ``use`` (e.g. a config mismatch).
          ValueError: an unknown policy.
        """
        if policy not in BAD_CHECKPOINT_POLICIES:
            raise ValueError(f"unknown bad-checkpoint policy {policy!r}; use one of "
                             f"{BAD_CHECKPOINT_POLICIES}")
        candidates = list(reversed(self.steps() if steps is None else steps))
        if not candidates:
            raise CheckpointError(f"no checkpoints in {self.directory}")
        for i, step in enumerate(candidates):
            try:
                spared = self.check_intact(step, needed)
                out = use(step)
            except DamagedCheckpointError as e:
                older = candidates[i + 1] if i + 1 < len(candidates) else None
                where = f"checkpoint step {step} in {self.directory} is damaged: {e.detail}"
                if policy == "refuse":
                    alt = (f"move {self.directory / str(step)} away to fall back to step {older}"
                           if older is not None else "no earlier checkpoint exists")
                    raise DamagedCheckpointError(
                        f"{where}; refusing to use it (--bad_checkpoint=refuse): {alt}, or rerun "
                        f"with --bad_checkpoint=fallback", step, e.detail, e.parts) from None
                if older is None:
                    raise DamagedCheckpointError(
                        f"{where}; no earlier complete checkpoint to fall back to: use a new "
                        f"--workdir", step, e.detail, e.parts) from None
                moved = ""
                if quarantine and jax.process_index() == 0:
                    dest = self.workdir / "damaged_checkpoints" / str(step)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if dest.exists():
                        shutil.rmtree(dest)
                    shutil.move(str(self.directory / str(step)), dest)
                    self.manager.reload()
                    moved = f" (moved to {dest})"
                log(f"{where}; falling back to the previous complete checkpoint, step "
                    f"{older}{moved}")
                continue
            for d in spared:
                log(f"checkpoint step {step}: {d.describe()}; not needed here, so step {step} is "
                    f"used (training could not resume from it)")
            return out, step
        raise AssertionError("unreachable")

    def read_config(self, step: int | None = None) -> ml_collections.ConfigDict:
        """The configuration saved with a checkpoint (default: the newest).

        Raises:
          CheckpointError: no such checkpoint, or it cannot be read.
        """
        step = self.resolve_step(step)
        try:
            saved = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
            return ml_collections.ConfigDict(dict(saved.config))
        except Exception as e:  # orbax raises many types for damaged files
            raise self._unreadable(step, e) from e

    def check_config(self, cfg: ml_collections.ConfigDict, step: int | None = None) -> None:
        """Refuse to resume from a checkpoint written with a different model or data setup.

        Raises:
          CheckpointError: naming every differing field with both values.
        """
        step = self.resolve_step(step)
        saved = config_to_json_dict(self.read_config(step))
        diffs = config_differences(saved, cfg)
        if diffs:
            raise CheckpointError(format_differences(self.workdir, step, diffs))

    # ------------------------------------------------------------------------------ save/restore
    def save(self, step: int, state: Any, data_state: Mapping[str, Any] | None,
             cfg: ml_collections.ConfigDict) -> bool:
        """Start an asynchronous save of ``state`` at ``step`` (returns once the copy to host is
        queued). Returns False when a checkpoint for ``step`` exists already."""
        if step in self.steps():
            return False
        self.wait()  # the previous save: finished, sealed, or its failure raised
        self._in_flight = step
        try:
            saved = self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(_without_empty(state)),
                data=ocp.args.JsonSave(_jsonable({"iterator": data_state})),
                config=ocp.args.JsonSave(config_to_json_dict(cfg))), force=True)
        except Exception as e:  # the synchronous part (directory creation, metadata) failed
            raise self._save_failed(step, e) from e
        if saved:
            self._unsealed.append(step)
        return saved

    def _save_failed(self, step: int, err: Exception) -> CheckpointSaveError:
        self._in_flight = None
        self._unsealed = [s for s in self._unsealed if s != step]
        # The partial save stays (writer threads may still be finishing); it is never listed as
        # a checkpoint, and the next save of this step replaces it.
        partial = [n for n in self.cut_short() if n.split(".")[0] == str(step)]
        root = err
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__
        full = any(getattr(x, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
                   for x in (err, root))
        why = "the disk is full" if full else f"{type(root).__name__}: {_first_line(root)}"
        kept = [s for s in self.steps() if s != step]
        intact = (f"the earlier checkpoints are intact (newest: step {kept[-1]})" if kept
                  else "no earlier checkpoint exists")
        left = (f"the partial save {partial[0]} is ignored (delete it to free its space) and "
                if partial else "")
        return CheckpointSaveError(
            f"saving the checkpoint of step {step} in {self.directory} failed ({why}); {left}"
            f"{intact}. Free some space and run the same command again to resume")

    def _seal(self) -> None:
        """Write the manifest of each save of this instance that is complete on disk."""
        for step in self._unsealed:
            step_dir = self.directory / str(step)
            if jax.process_index() == 0 and step_dir.is_dir() and not integrity.has_manifest(step_dir):
                integrity.write_manifest(step_dir, step)
        self._unsealed = []

    def wait(self) -> None:
        """Block until every pending save is on disk (and sealed with its manifest).

        Raises:
          CheckpointSaveError: the pending save failed (naming the step and the cause).
        """
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            if self._in_flight is None:
                raise
            raise self._save_failed(self._in_flight, e) from e
        self._in_flight = None
        try:
            self._seal()
        except OSError as e:
            step = self._unsealed[0] if self._unsealed else -1
            raise self._save_failed(step, e) from e

    def restore(self, abstract_state: Any, step: int | None = None
                ) -> tuple[Any, Mapping[str, Any] | None, int]:
        """``(state, data_iterator_state, step)`` from a checkpoint (default: the newest).

        Args:
          abstract_state: the state's tree of ``jax.ShapeDtypeStruct`` with target shardings
            (:func:`titans_lm.train.state.abstract_state`); arrays are placed in those shardings,
            whatever mesh they were saved from.

        Raises:
          CheckpointError: no such checkpoint, or it cannot be read (nothing is deleted).
        """
        step = self.resolve_step(step)
        try:
            r = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_without_empty(abstract_state)),
                data=ocp.args.JsonRestore()))
            state = _with_empty(r.state, abstract_state)
        except Exception as e:
            raise self._unreadable(step, e) from e
        return state, _from_jsonable(r.data).get("iterator"), step

    def restore_params(self, abstract_params: Any, step: int | None = None) -> tuple[Any, int]:
        """Only the parameters (for evaluation): ``(params, step)``.

        Raises:
          CheckpointError: as :meth:`restore`.
        """
        step = self.resolve_step(step)
        try:
            target = {"params": abstract_params}
            # The "state" item is a standard PyTree checkpoint; read only its "params" subtree.
            with ocp.PyTreeCheckpointer() as reader:
                r = reader.restore(self.directory / str(step) / "state", args=ocp.args.PyTreeRestore(
                    item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                    partial_restore=True))
        except Exception as e:
            raise self._unreadable(step, e) from e
        return r["params"], step

    def close(self) -> None:
        """Wait for pending saves and release the manager (a failed save raises
        :class:`CheckpointSaveError` after the manager is released)."""
        try:
            self.wait()
        finally:
            self.manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
