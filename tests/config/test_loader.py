"""The config loader: ``"configs/<name>.py[:<arg>]"`` -> the file's ``get_config(arg)``, paths
relative to the current directory, siblings found next to the config file (never next to the
installed package), and the command line's ``--config`` flag reading files through it."""

import shutil
from pathlib import Path

import pytest
from absl import flags

from titans_lm.config import load, load_module, split_spec
from titans_lm.config.flag import define_config_flag

REPO = Path(__file__).resolve().parents[2]


def test_split_spec():
    assert split_spec("configs/lmm.py:tiny") == (Path("configs/lmm.py"), "tiny")
    assert split_spec("configs/tasks/mqar.py:lmm-tiny") == (Path("configs/tasks/mqar.py"), "lmm-tiny")
    assert split_spec("configs/lmm.py") == (Path("configs/lmm.py"), None)
    assert split_spec("configs/lmm.py:") == (Path("configs/lmm.py"), "")
    assert split_spec(Path("a:b.py")) == (Path("a:b.py"), None)  # a Path is never split


def test_spec_is_relative_to_the_current_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    c = load("configs/lmm.py:tiny")
    assert (c.model.name, c.model.size) == ("lmm", "tiny")
    assert load("configs/transformer.py").model.size == "tiny"  # no argument: get_config()
    assert load(Path("configs/mag.py"), "340m").model.window == 1024
    assert load(REPO / "configs" / "mag.py", "tiny").to_dict() == load("configs/mag.py:tiny").to_dict()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="config file 'configs/lmm.py' not found"):
        load("configs/lmm.py:tiny")
    with pytest.raises(ValueError, match="already names its argument"):
        load(str(REPO / "configs" / "lmm.py") + ":tiny", "tiny")


def test_errors_of_the_config_file_pass_through(tmp_path):
    with pytest.raises(ValueError, match="unknown transformer size 'huge'"):
        load(REPO / "configs" / "transformer.py", "huge")
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(AttributeError, match="has no get_config"):
        load(tmp_path / "empty.py")


def test_each_load_is_a_fresh_module(tmp_path):
    a, b = (load_module(REPO / "configs" / "transformer.py") for _ in range(2))
    assert a is not b and a.__name__ != b.__name__ and a.SIZES == b.SIZES
    (tmp_path / "with_dataclass.py").write_text(
        "from __future__ import annotations\nimport dataclasses\n\n"
        "@dataclasses.dataclass\nclass Run:\n    steps: int = 2\n\n"
        "def get_config(arg=None):\n    return Run()\n")
    assert load(tmp_path / "with_dataclass.py").steps == 2  # a dataclass finds its module


def test_configs_find_their_siblings_next_to_themselves(monkeypatch, tmp_path):
    """A copy of configs/ elsewhere, loaded from a third directory: swa.py finds its
    transformer.py, and a task config its backbones, beside the copy (edit the copy's
    transformer.py and both see the change)."""
    copy = tmp_path / "elsewhere" / "configs"
    shutil.copytree(REPO / "configs", copy, ignore=shutil.ignore_patterns("__pycache__"))
    text = (copy / "transformer.py").read_text().replace("m.max_context = 0", "m.max_context = 77")
    (copy / "transformer.py").write_text(text)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert load(f"{copy}/swa.py:tiny").model.max_context == 77
    c = load(f"{copy}/tasks/mqar.py:swa")
    assert c.model.max_context == 77 and c.model.window == 64 and c.data.task == "mqar"
    assert load("../elsewhere/configs/tasks/niah.py:transformer").model.max_context == 77
    with pytest.raises(ValueError, match="unknown backbone 'lstm'.*transformer"):
        load(f"{copy}/tasks/mqar.py:lstm")


def _parse(argv):
    fv = flags.FlagValues()
    holder = define_config_flag("config", "config file", flag_values=fv, sys_argv=argv)
    fv(argv)
    return holder.value


def test_the_config_flag_loads_through_the_loader_with_overrides(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = _parse(["prog", "--config=configs/tasks/mqar.py:swa", "--config.train.steps=7",
                  "--config.model.window=32"])
    assert (cfg.train.steps, cfg.model.window, cfg.data.task) == (7, 32, "mqar")
    with pytest.raises(AttributeError):  # locked: no new fields
        cfg.train.stpes = 3
    with pytest.raises(flags.IllegalFlagValueError, match="unknown transformer size 'huge'"):
        _parse(["prog", "--config=configs/transformer.py:huge"])
    with pytest.raises(flags.IllegalFlagValueError, match="invalid literal for int"):
        _parse(["prog", "--config=configs/transformer.py:tiny", "--config.train.steps=abc"])
    with pytest.raises((AttributeError, KeyError)):  # the CLI words it "unknown config field"
        _parse(["prog", "--config=configs/transformer.py:tiny", "--config.train.stpes=3"])
    with pytest.raises(flags.IllegalFlagValueError, match="cannot load the config file"):
        _parse(["prog", "--config=configs/none.py:tiny"])
