"""The benchmark harness's configuration variants (``scripts/benchmark.py --variants --vary``)
and its side-by-side ratios."""


import pytest

from _backbones import REPO, load_config
from titans_lm.bench.timing import ratios
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


def test_vary_crosses_every_variant_with_the_field_values():
    grid = benchmark.variant_grid(["base:", "guard:memory.surprise_max_norm=1.0"],
                                  ["memory.memory_depth=1,2"])
    assert grid == [
        ("base", {"memory.memory_depth": 1}, {"memory.memory_depth": 1}),
        ("base", {"memory.memory_depth": 2}, {"memory.memory_depth": 2}),
        ("guard", {"memory.surprise_max_norm": 1.0, "memory.memory_depth": 1},
         {"memory.memory_depth": 1}),
        ("guard", {"memory.surprise_max_norm": 1.0, "memory.memory_depth": 2},
         {"memory.memory_depth": 2})]
    assert benchmark.variant_grid([""], []) == [("", {}, {})]
    with pytest.raises(ValueError, match="FIELD=V1,V2"):
        benchmark.variant_grid([""], ["memory.memory_depth"])


def test_variant_summaries_compare_each_variant_with_the_first_at_the_same_point():
    class Job:
        def __init__(self, times):
            self.times = times

    def row(variant, depth):
        return {"backbone": "lmm", "size": "tiny", "impl": "chunked", "chunk": 16, "T": 64,
                "variant": variant, "vary": {"memory.memory_depth": depth}}

    rows = [row("base", 1), row("base", 2), row("guard", 1), row("guard", 2)]
    jobs = [{"train": Job([2.0, 1.0, 3.0])}, {"train": Job([4.0, 4.0, 4.0])},
            {"train": Job([2.2, 1.5, 3.0])}, {"train": Job([4.0, 2.0, 5.0])}]
    out = benchmark.variant_summaries(rows, jobs, "base")
    assert [(s["variant"], s["vary"]["memory.memory_depth"]) for s in out] == [("guard", 1),
                                                                             ("guard", 2)]
    assert out[0]["train"] == {"x_median": 1.1, "x_min": 1.5} == ratios([2.2, 1.5, 3.0],
                                                                       [2.0, 1.0, 3.0])
    assert out[1]["train"] == {"x_median": 1.0, "x_min": 0.5}
    assert out[0]["against"] == "base" and out[0]["summary"] == "variants"
