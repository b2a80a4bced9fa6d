"""Config builder of the synthetic-task configs ``configs/tasks/<task>.py:<backbone>[-<size>]``.

A task config is a backbone's own config (``configs/<backbone>.py``, at ``size``, default tiny)
with the data replaced by the task: ``data.task`` set, ``data.vocab_size`` the task's vocabulary
(``model.vocab_size`` follows it: one field reference) and a ``task`` section with the task's
generation and evaluation fields (``titans_lm.data.tasks``).

The backbone's file is looked up in ``config_dir``, which the task config passes: the directory
above its own (``configs/tasks/mqar.py`` -> ``configs/``), so task configs work wherever the
``configs/`` folder is, whatever the installed package's location.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections

from titans_lm.config.loader import load


def load_backbone_config(spec: str, config_dir: str | Path) -> ml_collections.ConfigDict:
    """``config_dir/<backbone>.py``'s ``get_config(size)`` for ``spec = "<backbone>[-<size>]"``.

    Raises:
      ValueError: an unknown backbone (listing those in ``config_dir``) or size.
    """
    name, _, size = spec.partition("-")
    path = Path(config_dir) / f"{name}.py"
    if not path.is_file():
        known = sorted(p.stem for p in Path(config_dir).glob("*.py"))
        raise ValueError(f"unknown backbone {name!r} in the task config argument {spec!r}; "
                         f"valid: {', '.join(known)} (e.g. configs/tasks/mqar.py:lmm or :lmm-tiny)")
    return load(path, size or "tiny")


def task_config(task: str, spec: str, *, config_dir: str | Path, vocab_size: int, seq_len: int,
                fields: dict) -> ml_collections.ConfigDict:
    """The run config of ``task`` on the backbone ``spec`` (see the module doc).

    Args:
      config_dir: the directory of the backbone configs (``configs/``).
    """
    c = load_backbone_config(spec, config_dir)
    c.data.task = task
    c.data.seq_len = seq_len
    c.data.vocab_size = vocab_size
    c.model.vocab_size = c.data.get_ref("vocab_size")
    c.task = ml_collections.ConfigDict(fields)
    return c
