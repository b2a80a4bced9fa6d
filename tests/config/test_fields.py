"""No silently ignored field: every backbone (and task) refuses, by name, each field it does not
read, from Python (``validate``, ``build_model``'s check) and from the command line (the field is
not in its config file, whose locked config refuses an override of it)."""

import re
from pathlib import Path

import ml_collections
import pytest

from titans_lm.config import validate
from titans_lm.config.fields import (BACKBONES, FIELDS, UNUSED_ALLOWED, check_model_fields,
                                     field_problems, flatten)
from titans_lm.config.reference import reference_configs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def configs():
    return reference_configs(REPO / "configs")


def _set(cfg: ml_collections.ConfigDict, name: str, value) -> None:
    *parents, leaf = name.split(".")
    node = cfg
    for p in parents:
        if p not in node:
            node[p] = ml_collections.ConfigDict()
        node = node[p]
    node[leaf] = value


def _value_of(configs, name):
    """A valid value of ``name`` from the first config that has it."""
    for cfg in configs.values():
        node = cfg
        for p in name.split("."):
            node = node[p] if p in node else None
            if node is None:
                break
        else:
            return node
    raise AssertionError(f"no config has {name}")


def test_every_backbone_refuses_every_field_it_does_not_read(configs):
    checked = 0
    for label, cfg in configs.items():
        validate(cfg)  # every config as shipped is valid
        have = flatten(cfg.to_dict())
        for name, field in FIELDS.items():
            user = cfg.model.name if name.startswith("model.") else cfg.data.task
            if not field.used_by or user in field.used_by:
                continue
            if name in UNUSED_ALLOWED:  # set by the shared shell: refused once changed
                assert have[name] == UNUSED_ALLOWED[name]
                value = UNUSED_ALLOWED[name] * 2
            else:  # from the command line: not in the locked config, so refused as unknown
                assert name not in have, (label, name)
                value = _value_of(configs, name)
            bad = ml_collections.ConfigDict(cfg.to_dict())
            _set(bad, name, value)
            what = f"the {user} backbone" if name.startswith("model.") else (
                f"the {user} task" if user else "a run without data.task")
            with pytest.raises(ValueError, match=f"config field {name}: {what} does not use it"):
                validate(bad)
            if name.startswith("model."):
                with pytest.raises(ValueError, match=f"config field {name}: "):
                    check_model_fields(bad.model)  # what build_model runs first
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("name,value,message", [
    ("model.memory.memory_depth", 7, "must be in 1..4, got 7"),
    ("optim.b2", 1.0, r"must be in \[0, 1\), got 1.0"),
    ("mesh.fsdp", 0, r"must be -1 \(the rest\) or >= 1, got 0"),
    ("model.remat", "everything", "must be 'none' | 'full'"),
    ("train.stpes", 5, "not a field of the config"),
    ("model.memory.chunk_sise", 5, "not a field of the lmm backbone"),
    ("model.memory.bias_p", 1.0, "must be > 1, got 1.0"),
    ("model.memory.feature_degree", 0, "must be an integer >= 1, got 0"),
])
def test_out_of_range_and_unknown_fields_are_named(configs, name, value, message):
    cfg = ml_collections.ConfigDict(configs["lmm"].to_dict())
    _set(cfg, name, value)
    problems = field_problems(cfg)
    assert len(problems) == 1 and problems[0].startswith(f"config field {name}: ")
    assert re.search(message, problems[0]), problems[0]


def test_shape_errors_name_the_fields(configs):
    cfg = ml_collections.ConfigDict(configs["transformer"].to_dict())
    cfg.model.d_model = 100  # 4 heads of 25: odd, RoPE cannot rotate pairs
    with pytest.raises(ValueError, match="model.d_model=100 and model.n_heads=4"):
        validate(cfg)
    cfg = ml_collections.ConfigDict(configs["mag"].to_dict())
    cfg.model.memory_layers = "0,7"
    with pytest.raises(ValueError, match="config field model.memory_layers"):
        validate(cfg)
    cfg = ml_collections.ConfigDict(configs["ttt_linear"].to_dict())
    cfg.model.memory.memory_depth = 2  # TTT-MLP's inner model under the TTT-Linear name
    with pytest.raises(ValueError, match="model.memory.memory_depth: ttt_linear needs 1"):
        validate(cfg)
    assert set(BACKBONES) == {c.model.name for c in configs.values()}
