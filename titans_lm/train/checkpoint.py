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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
import orbax.checkpoint as ocp

# Fields whose change makes a checkpoint unusable for the requested run: every model field, and
# the data fields that decide which token ids and which batches the run sees. Paths (data_dir,
# cache_dir) and the trainer's schedule (steps, eval and checkpoint intervals) may change.
DATA_FIELDS_CHECKED = ("corpus", "vocab_size", "tokenizer_sentences", "seq_len", "doc_align",
                       "shuffle_seed")
TRAIN_FIELDS_CHECKED = ("batch_size",)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (unreadable, or written by a different configuration)."""


def checkpoint_dir(workdir: str | Path) -> Path:
    """``<workdir>/checkpoints``."""
    return Path(workdir).resolve() / "checkpoints"


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_to_json_dict(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The config as plain JSON types (tuples become lists)."""
    return json.loads(cfg.to_json_best_effort())


def config_differences(saved: Mapping[str, Any], requested: ml_collections.ConfigDict
                       ) -> list[tuple[str, Any, Any]]:
    """``(field, saved value, requested value)`` for each checked field that differs.

    Checked: every ``model.*`` field and :data:`DATA_FIELDS_CHECKED`, :data:`TRAIN_FIELDS_CHECKED`.
    A field present on one side only counts as different (shown as ``<absent>``).
    """
    want = _flatten(config_to_json_dict(requested))
    have = _flatten(saved)
    keys = {k for k in set(want) | set(have) if k.startswith("model.")}
    keys |= {f"data.{f}" for f in DATA_FIELDS_CHECKED} | {f"train.{f}" for f in TRAIN_FIELDS_CHECKED}
    diffs = []
    for k in sorted(keys):
        a, b = have.get(k, "<absent>"), want.get(k, "<absent>")
        if a != b:
            diffs.append((k, a, b))
    return diffs


def format_differences(workdir: Path, step: int, diffs: list[tuple[str, Any, Any]]) -> str:
    """The refusal to resume: ``model.name`` first when it differs, then one line per field
    present on both sides with different values, then the fields only one side has (by name)."""
    by_key = {k: (a, b) for k, a, b in diffs}
    head = f"cannot resume {workdir}: its checkpoint (step {step}) was written"
    if "model.name" in by_key:
        a, b = by_key.pop("model.name")
        head += f" for model.name={a!r}, but the config asks for model.name={b!r}"
    else:
        head += " with a different configuration"
    both = [(k, a, b) for k, (a, b) in by_key.items() if "<absent>" not in (a, b)]
    only_saved = [k for k, (a, b) in by_key.items() if b == "<absent>"]
    only_new = [k for k, (a, b) in by_key.items() if a == "<absent>"]
    def names(keys: list[str]) -> str:  # a section with more than 3 such fields: "sec.* (n)"
        groups: dict[str, list[str]] = {}
        for k in keys:
            groups.setdefault(k.rsplit(".", 1)[0], []).append(k)
        parts = []
        for parent, ks in groups.items():
            parts += [f"{parent}.* ({len(ks)} fields)"] if len(ks) > 3 else ks
        return ", ".join(parts)

    lines = [head + "."]
    if both:
        lines.append("fields that differ (checkpoint -> config):")
        lines += [f"  {k}: {a!r} -> {b!r}" for k, a, b in both]
    if only_saved:
        lines.append(f"only in the checkpoint's config: {names(only_saved)}")
    if only_new:
        lines.append(f"only in the requested config: {names(only_new)}")
    lines.append("Use a new --workdir for this config, or resume with the config the checkpoint "
                 f"was written with ({Path(workdir) / 'config.json'}).")
    return "\n".join(lines)


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
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=not read_only, create=not read_only,
                read_only=read_only))

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
        return CheckpointError(
            f"checkpoint {self.directory / str(step)} could not be read "
            f"({type(err).__name__}: {_first_line(err)}). Nothing was "
            f"deleted; remove that directory to fall back to an earlier checkpoint, or use a new "
            f"--workdir")

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
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(_jsonable({"iterator": data_state})),
            config=ocp.args.JsonSave(config_to_json_dict(cfg))), force=True)

    def wait(self) -> None:
        """Block until every pending save is on disk."""
        self.manager.wait_until_finished()

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
                state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        except Exception as e:
            raise self._unreadable(step, e) from e
        return r.state, _from_jsonable(r.data).get("iterator"), step

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
        """Wait for pending saves and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
