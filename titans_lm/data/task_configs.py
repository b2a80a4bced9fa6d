"""Config builder of the synthetic-task configs ``configs/tasks/<task>.py:<backbone>[-<size>]``.

A task config is a backbone's own config (``configs/<backbone>.py``, at ``size``, default tiny)
with the data replaced by the task: ``data.task`` set, ``data.vocab_size`` the task's vocabulary
(``model.vocab_size`` follows it: one field reference) and a ``task`` section with the task's
generation and evaluation fields (``titans_lm.data.tasks``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections

CONFIG_DIR = Path(__file__).resolve().parent.parent.parent / "configs"


def load_backbone_config(spec: str, config_dir: str | Path = CONFIG_DIR):
    """``configs/<backbone>.py``'s ``get_config(size)`` for ``spec = "<backbone>[-<size>]"``.

    Raises:
      ValueError: an unknown backbone (listing those in ``config_dir``) or size.
    """
    name, _, size = spec.partition("-")
    path = Path(config_dir) / f"{name}.py"
    if not path.is_file():
        known = sorted(p.stem for p in Path(config_dir).glob("*.py"))
        raise ValueError(f"unknown backbone {name!r} in the task config argument {spec!r}; "
                         f"valid: {', '.join(known)} (e.g. configs/tasks/mqar.py:lmm or :lmm-tiny)")
    mod_spec = importlib.util.spec_from_file_location(f"{name}_config", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.get_config(size or "tiny")


def task_config(task: str, spec: str, *, vocab_size: int, seq_len: int,
                fields: dict) -> ml_collections.ConfigDict:
    """The run config of ``task`` on the backbone ``spec`` (see the module doc)."""
    c = load_backbone_config(spec)
    c.data.task = task
    c.data.seq_len = seq_len
    c.data.vocab_size = vocab_size
    c.model.vocab_size = c.data.get_ref("vocab_size")
    c.task = ml_collections.ConfigDict(fields)
    return c
