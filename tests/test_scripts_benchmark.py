"""The benchmark harness's configuration variants (``scripts/benchmark.py --variants``)."""


import pytest

from _backbones import REPO, load_config
from titans_lm.config import load_module

benchmark = load_module(REPO / "scripts" / "benchmark.py")


def test_variant_specs_parse_and_set_nested_model_fields():
    assert benchmark.parse_variant("") == ("", {})
    name, changes = benchmark.parse_variant("guard:memory.surprise_max_norm=1.0,remat=dots")
    assert name == "guard" and changes == {"memory.surprise_max_norm": 1.0, "remat": "dots"}
    m = load_config("lmm").model
    benchmark.apply_changes(m, changes)
    assert m.memory.surprise_max_norm == 1.0 and m.remat == "dots"
    with pytest.raises(ValueError, match="no field 'memory.nope'"):
        benchmark.apply_changes(m, {"memory.nope": 1})
    with pytest.raises(ValueError, match="expected NAME:field=value"):
        benchmark.parse_variant("x:novalue")
