"""Eval-time overrides of a checkpoint's config, and the names of the results they produce.

- :func:`split_overrides` / :func:`apply_eval_overrides`: ``titans-lm eval`` rebuilds the model
  from the checkpoint's saved config; of the ``--config.<field>=VALUE`` overrides it honours those
  that make sense at evaluation time (:data:`EVAL_OVERRIDABLE`: the evaluation window length,
  the compute dtype, the memory engine's implementation, batch sizes, paths) and refuses the rest
  with a message naming them (they would change the model the checkpoint holds, or the training).
- :func:`result_suffix`: the part of an eval result's file name that tells such overrides apart.

(The config JSON of ``config.json`` and ``titans-lm config``: :mod:`titans_lm.config.serialize`.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from titans_lm.config.compat import ABSENT_MEANS
from titans_lm.config.fields import FIELDS

# Fields ``eval`` may change, and why they are safe: none changes a parameter's shape or value.
EVAL_OVERRIDABLE = (
    "data.seq_len",  # score in longer (or shorter) windows than training: long-context evaluation
    "data.data_dir", "data.cache_dir",  # where the corpora and the cache are on this machine
    "model.dtype",  # compute dtype (parameters stay as saved)
    "model.remat",
    "model.memory.impl",  # engine implementation: chunked | reference | pallas (same math)
    "model.memory.chunks_per_checkpoint",
    "model.memory_ablation",  # MAC, MAG, MAL: zero a read of the memory (an ablation probe)
    "eval.batch_size", "eval.max_docs",
    "mesh.data", "mesh.fsdp", "mesh.tensor",
)


def split_overrides(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``(argv without the --config.<field>=VALUE arguments, {field: VALUE})``.

    Raises:
      ValueError: an override without ``=VALUE``.
    """
    rest, overrides = [], {}
    for a in argv:
        if a.startswith("--config."):
            field, eq, value = a[len("--config."):].partition("=")
            if not eq:
                raise ValueError(f"{a}: write overrides as --config.<field>=VALUE")
            overrides[field] = value
        else:
            rest.append(a)
    return rest, overrides


def _parse(field: str, text: str, current: Any) -> Any:
    if isinstance(current, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError(f"--config.{field}={text}: expected true or false")
    for kind in (int, float):
        if isinstance(current, kind):
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"--config.{field}={text}: expected {kind.__name__}") from None
    return text


def _get(cfg: Mapping[str, Any], field: str) -> Any:
    node: Any = cfg
    for part in field.split("."):
        if not hasattr(node, "keys") or part not in node.keys():
            raise KeyError(field)
        node = node[part]
    return node


def _absent_value(cfg: ml_collections.ConfigDict, field: str) -> Any:
    """What ``field`` meant in a checkpoint written before the field existed
    (:data:`titans_lm.config.compat.ABSENT_MEANS`), when the checkpoint's backbone reads it.

    Raises:
      ValueError: the field is not one of those (the checkpoint's config has no such field).
    """
    name = cfg.model.get("name")
    used_by = FIELDS[field].used_by if field in FIELDS else ()
    if field in ABSENT_MEANS and (not used_by or name in used_by):
        return ABSENT_MEANS[field]
    raise ValueError(f"--config.{field}: the checkpoint's config has no such field (model {name})")


def apply_eval_overrides(cfg: ml_collections.ConfigDict, overrides: Mapping[str, str]
                         ) -> ml_collections.ConfigDict:
    """The checkpoint's config with the eval-time overrides applied (a copy).

    Raises:
      ValueError: an override of a field ``eval`` cannot change (naming every such field and
        listing those it can), of a field the checkpoint's config does not have (a field added
        after the checkpoint was written and read by its backbone takes its
        :data:`~titans_lm.config.compat.ABSENT_MEANS` value first), or a value of the wrong type.
    """
    refused = [f for f in overrides if f not in EVAL_OVERRIDABLE]
    if refused:
        raise ValueError(
            f"eval cannot override {', '.join('--config.' + f for f in refused)}: the checkpoint "
            f"fixes the model and its training (retrain to change them). At evaluation time you "
            f"can set: {', '.join(EVAL_OVERRIDABLE)}")
    out = ml_collections.ConfigDict(cfg.to_dict())
    for field, text in overrides.items():
        try:
            current = _get(out, field)
        except KeyError:
            current = _absent_value(out, field)
        *parents, leaf = field.split(".")
        node = out
        for p in parents:
            node = node[p]
        node[leaf] = _parse(field, text, current)
    return out


def result_suffix(overrides: Mapping[str, str], saved: ml_collections.ConfigDict) -> str:
    """The part of an eval result's name that tells the overrides that change the scores apart:
    ``""`` when none differs from the checkpoint's ``saved`` config, else e.g. ``"_seq_len1024"``
    or ``"_seq_len1024_dtype-bfloat16"`` (``"_memory_ablation-retrieval"`` for a memory ablation)."""
    parts = []
    for field in ("data.seq_len", "model.dtype", "model.memory.impl", "model.memory_ablation"):
        if field not in overrides:
            continue
        try:
            same = _parse(field, overrides[field], _get(saved, field)) == _get(saved, field)
        except (KeyError, ValueError):
            same = False
        if not same:
            leaf = field.rsplit(".", 1)[1]
            parts.append(f"{leaf}{overrides[field]}" if leaf == "seq_len"
                         else f"{leaf}-{overrides[field]}")
    return "".join("_" + p for p in parts)
