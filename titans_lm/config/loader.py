"""Loading config files: ``configs/<name>.py[:<arg>]`` -> the ConfigDict its ``get_config`` returns.

A config file is a Python file (``configs/transformer.py``, ``configs/tasks/mqar.py``) with a
``get_config(arg)``; the part of a spec after the first ``:`` is passed to it (a size such as
``tiny``, or a task config's ``<backbone>[-<size>]``), and without a ``:`` it is called with no
argument, as ``ml_collections.config_flags`` does.

Where files are found:

- a spec's path is taken as written: relative to the current directory (as on the command line)
  or absolute. Nothing is looked up relative to the installed package, so a non-editable install
  (``pip install .``) loads ``configs/`` of the repository it is run from;
- a config file that builds on another one finds it next to itself:
  ``load_module(Path(__file__).with_name("transformer.py"))`` (``configs/swa.py``), or
  ``Path(__file__).resolve().parents[1]`` for the backbones of ``configs/tasks/*.py``
  (:func:`titans_lm.config.tasks.task_config`).

The command line loads ``--config`` through the same function (``titans_lm.cli``), so a script,
a test and ``titans-lm`` read a config file the same way.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path
from types import ModuleType

import ml_collections

_COUNTER = itertools.count()


def split_spec(spec: str | os.PathLike) -> tuple[Path, str | None]:
    """``"configs/lmm.py:tiny"`` -> ``(Path("configs/lmm.py"), "tiny")``; no ``:`` -> ``(path,
    None)``. A ``Path`` is taken whole (never split)."""
    if isinstance(spec, os.PathLike):
        return Path(spec), None
    path, colon, arg = str(spec).partition(":")
    return Path(path), (arg if colon else None)


def load_module(path: str | os.PathLike) -> ModuleType:
    """The Python file ``path`` executed as a module of its own, entered in ``sys.modules`` under
    a name used once (so that a dataclass in it finds its module, and two files of the same
    name, or two loads of one file, never meet).

    Raises:
      FileNotFoundError: ``path`` is not a file (naming it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found")
    name = f"_titans_lm_config_{path.stem}_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load(spec: str | os.PathLike, arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of ``spec`` (``"path/to/config.py[:arg]"``, or a path with ``arg`` given apart).

    ``load("configs/lmm.py:tiny")`` == ``load(Path("configs/lmm.py"), "tiny")``: the file's
    ``get_config("tiny")``. Without an argument (``load("configs/lmm.py")``) ``get_config()``
    is called with none (its default size).

    Raises:
      FileNotFoundError: no such file.
      ValueError: what the config file raises (e.g. an unknown size, naming the valid ones).
      AttributeError: the file has no ``get_config``.
    """
    path, spec_arg = split_spec(spec)
    if arg is not None and spec_arg is not None:
        raise ValueError(f"config spec {str(spec)!r} already names its argument; got also {arg!r}")
    arg = spec_arg if arg is None else arg
    module = load_module(path)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"config file {str(path)!r} has no get_config()")
    return module.get_config() if arg is None else module.get_config(arg)
