"""The layer profile (``scripts/profile_memory_layer.py``): its summary arithmetic, and one real
profiled call at a tiny length."""

import json
import sys

from _backbones import REPO

sys.path.insert(0, str(REPO / "scripts"))

from profile_memory_layer import main, summarise  # noqa: E402


def test_summary_splits_loop_from_outside_and_matmuls_from_the_rest():
    ms = 1_000_000
    total = {"ynn_fusion.1": 40 * ms, "dot.3": 10 * ms, "add_fusion.2": 5 * ms,
             "ynn_fusion.7": 7 * ms, "copy.1": 3 * ms}
    count = {"ynn_fusion.1": 8, "dot.3": 16, "add_fusion.2": 8, "ynn_fusion.7": 1, "copy.1": 2}
    out = summarise(total, count, n_chunks=8, loop_flops=5e9)
    assert out["loop_ms"] == 55.0 and out["loop_matmul_ms"] == 50.0
    assert out["loop_other_ms"] == 5.0 and out["outside_ms"] == 10.0
    assert out["loop_matmul_gflops"] == 100.0            # 5 GFLOP in 50 ms
    assert out["by_kind_ms"]["loop"] == {"ynn_fusion": 40.0, "dot": 10.0, "add_fusion": 5.0}
    assert out["by_kind_ms"]["outside"] == {"ynn_fusion": 7.0, "copy": 3.0}


def test_profiles_one_call_of_the_layer(capsys):
    main(["--chunk", "16", "--T", "64", "--warmup", "1", "--repeats", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["n_chunks"] == 4 and out["loop_model_gflop"] > 0
    assert out["loop_ms"] > 0 and out["outside_ms"] > 0
    assert out["loop_matmul_ms"] <= out["loop_ms"]
