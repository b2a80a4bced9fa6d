"""The config reference: every field with its type, default, valid values and what it does.

Generated from the configs themselves (types and defaults: the values the config files give) and
from :data:`titans_lm.config.fields.FIELDS` (valid values, descriptions, which backbones read a
field). ``titans-lm config --explain`` prints it; ``docs/config.md`` is
``titans-lm config --explain --format=md`` run at the repository root, and
tests/config/test_reference.py checks that the file is current.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from titans_lm.config.fields import FIELDS, flatten
from titans_lm.config.loader import load

SECTIONS = {
    "data": "the corpus, its tokenizer and the batches",
    "train": "the trainer",
    "optim": "AdamW with linear warmup and cosine decay",
    "mesh": "the device mesh",
    "eval": "held-out evaluation",
    "model": "the LM shell and the backbone",
    "model.memory": "the neural memory layer (titans_lm.memory.config.MemoryConfig)",
    "task": "synthetic tasks (configs/tasks/*.py, titans_lm.data.tasks)",
}
# The configs the full reference is generated from: ``configs/<name>.py:tiny`` and the task
# configs on the Transformer++ (``configs/tasks/<task>.py:transformer``).
BACKBONE_FILES = ("transformer", "swa", "lmm", "mac", "mag", "mal", "ttt_linear", "ttt_mlp",
                  "linear_attention", "deltanet", "gated_deltanet", "lact", "atlas")
TASK_FILES = ("mqar", "niah", "mad")
TASK_ARGS = {"mad": "in_context_recall-transformer"}  # the argument of each, default "transformer"
COMMAND = "titans-lm config --explain --format=md > docs/config.md"


class _Shown(str):
    """A default shown in words (a machine-dependent value)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One field of the reference: ``default`` is ``[(config labels, value), ...]``."""
    name: str
    type: str
    default: tuple[tuple[tuple[str, ...], Any], ...]
    valid: str
    doc: str
    used_by: tuple[str, ...]


def reference_configs(config_dir: str | Path) -> dict[str, ml_collections.ConfigDict]:
    """``{label: config}`` of :data:`BACKBONE_FILES` (tiny) and :data:`TASK_FILES` in
    ``config_dir`` (the repository's ``configs/``).

    Raises:
      FileNotFoundError: a config file is missing (naming it).
    """
    config_dir = Path(config_dir)
    out = {name: load(config_dir / f"{name}.py", "tiny") for name in BACKBONE_FILES}
    for task in TASK_FILES:
        out[f"tasks/{task}"] = load(config_dir / "tasks" / f"{task}.py",
                                    TASK_ARGS.get(task, "transformer"))
    return out


def _type_name(value: Any) -> str:
    return "list" if isinstance(value, (tuple, list)) else type(value).__name__


def rows(configs: Mapping[str, ml_collections.ConfigDict]) -> list[Row]:
    """The reference's rows, in the order of :data:`FIELDS`, for the fields ``configs`` have.

    ``model.*`` values come from every config, other fields from the backbone configs when there
    are several (``task.*``: from the task configs), so each default is listed once.

    Raises:
      ValueError: a field of ``configs`` that :data:`FIELDS` does not describe.
    """
    flat = {label: flatten(cfg.to_dict()) for label, cfg in configs.items()}
    undescribed = sorted({n for f in flat.values() for n in f} - set(FIELDS))
    if undescribed:
        raise ValueError(f"config fields without a description in titans_lm.config.fields: "
                         f"{', '.join(undescribed)}")
    tasks = [label for label in flat if label.startswith("tasks/")]
    plain = [label for label in flat if label not in tasks] or tasks
    out = []
    for name, field in FIELDS.items():
        pool = (tasks or plain) if name.startswith("task.") else plain
        labels = [label for label in pool if name in flat[label]]
        if not labels:
            continue
        groups: dict[str, tuple[list[str], Any]] = {}
        for label in labels:
            value = flat[label][name]
            groups.setdefault(repr(value), ([], value))[0].append(label.removeprefix("tasks/"))
        default = tuple((tuple(ls), v) for ls, v in groups.values())
        if field.shown_default:
            default = ((tuple(labels), _Shown(field.shown_default)),)
        out.append(Row(name, _type_name(flat[labels[0]][name]), default, field.valid, field.doc,
                       field.used_by))
    return out


def _value(value: Any) -> str:
    if isinstance(value, _Shown):
        return str(value)
    if isinstance(value, tuple):
        value = list(value)
    return repr(value) if isinstance(value, str) else str(value)


def _default_text(row: Row, code: bool) -> str:
    def show(v):
        return f"`{_value(v)}`" if code else _value(v)
    if len(row.default) == 1:
        return show(row.default[0][1])
    return "; ".join(f"{', '.join(labels)}: {show(v)}" for labels, v in row.default)


def _section(name: str) -> str:
    return "model.memory" if name.startswith("model.memory.") else name.split(".")[0]


def format_text(table: list[Row]) -> str:
    """The reference as plain text (``titans-lm config --explain``)."""
    lines, section = [], None
    for row in table:
        if _section(row.name) != section:
            section = _section(row.name)
            lines += ["" if lines else None, f"[{section}] {SECTIONS[section]}"]
        head = f"  {row.name} ({row.type}) = {_default_text(row, code=False)}"
        lines.append(head)
        lines.append(f"      {row.doc}")
        if row.valid:
            lines.append(f"      valid: {row.valid}")
        if row.used_by:
            lines.append(f"      used by: {', '.join(row.used_by)}")
    return "\n".join(line for line in lines if line is not None) + "\n"


def format_markdown(table: list[Row], title: str = "Config reference") -> str:
    """The reference as Markdown (``docs/config.md``)."""
    out = [f"# {title}", "",
           f"Generated by `{COMMAND}` (tests/config/test_reference.py checks that it is current); "
           "the descriptions live in `titans_lm/config/fields.py`.", "",
           "Override any field with `--config.<field>=VALUE` (e.g. `--config.train.steps=100`). "
           "Defaults are those of `configs/<backbone>.py:tiny` (the task fields: "
           "`configs/tasks/<task>.py`); the paper sizes change the run fields "
           "(`titans_lm.config.presets.set_paper_run`). `titans_lm.config.validate` refuses a "
           "value outside its valid range, a field the run does not read (a backbone's field on "
           "another backbone, e.g. `model.memory_layers` on the LMM) and an unknown field, naming "
           "it, before any data is prepared or JAX imported."]
    section, has_users = None, False
    for row in table:
        if _section(row.name) != section:
            section = _section(row.name)
            users = {r.used_by for r in table if _section(r.name) == section}
            shared = next(iter(users)) if len(users) == 1 else ()
            has_users = len(users) > 1
            by = f" (used by {', '.join(shared)})" if shared else ""
            column = " | used by" if has_users else ""
            out += ["", f"## {section}: {SECTIONS[section]}{by}", "",
                    f"| field | type | default | valid{column} | what it does |",
                    f"| --- | --- | --- | ---{' | ---' if has_users else ''} | --- |"]
        cells = [f"`{row.name}`", row.type, _default_text(row, code=True), row.valid or "any"]
        if has_users:
            cells.append(", ".join(row.used_by) or "all")
        cells.append(row.doc)
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


def explain(configs: Mapping[str, ml_collections.ConfigDict], fmt: str = "text",
            title: str = "Config reference") -> str:
    """:func:`format_text` or :func:`format_markdown` (``fmt``: "text" | "md") of ``configs``."""
    table = rows(configs)
    return format_markdown(table, title) if fmt == "md" else format_text(table)
