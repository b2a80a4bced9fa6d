"""``scripts/probe.py gates``: the statistics, the capture of every memory layer, the table."""

import numpy as np
import pytest

from titans_lm.bench import gate_probe


def test_layer_stats_by_hand():
    # B=1, H=1, T=2
    theta, eta, alpha = np.array([[[0.1, 0.3]]]), np.array([[[0.5, 0.7]]]), np.array([[[0.0, 1.0]]])
    reads0 = np.array([[[[3.0, 4.0], [1.0, 0.0]]]])             # norms 5, 1
    reads = reads0 + np.array([[[[0.0, 0.5], [0.0, 2.0]]]])      # moved 0.5, 2
    s = gate_probe.layer_stats(theta, eta, alpha, reads, reads0)
    assert s["tokens"] == 2 and s["theta"] == pytest.approx(0.2) and s["eta"] == pytest.approx(0.6)
    assert s["alpha"] == pytest.approx(0.5) and s["alpha_p90"] == pytest.approx(0.9)
    assert s["write_share"] == pytest.approx((0.1 + 2.0) / 2)      # median of 0.5/5 and 2/1
    assert s["read_norm"] == pytest.approx((np.hypot(3, 4.5) + np.hypot(1, 2)) / 2)


def test_one_record_per_engine_call_and_no_write_means_zero_share():
    import jax.numpy as jnp

    from _backbones import build, small_model_cfg
    from titans_lm.memory.layer import NeuralMemory

    before = NeuralMemory.scan
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 32)), jnp.int32)

    def stats(**overrides):
        model = build(small_model_cfg("lmm", "float32", n_layers=2, n_persistent=0,
                                      memory__chunk_size=8, **overrides))
        sink: list = []
        with gate_probe.captured_layer_stats(sink):
            out = model(tokens, jnp.ones_like(tokens))
            out = out[0] if isinstance(out, tuple) else out
            out.block_until_ready()
        return sink

    written = stats()
    assert [s["tokens"] for s in written] == [32, 32]     # one call per layer
    assert all(0 < s["write_share"] < 10 for s in written)
    assert all(0 < s["theta"] and 0 < s["eta"] < 1 and 0 <= s["alpha"] <= 1 for s in written)
    # theta_max -> 0 writes (almost) nothing, so the reads stay those of W0 up to the decay
    frozen = stats(memory__theta_max=1e-9, memory__use_decay=False)
    assert all(s["write_share"] < 1e-5 for s in frozen)
    assert NeuralMemory.scan is before


def test_options_table_and_a_missing_run(tmp_path, capsys):
    a = gate_probe.parse_args(["r1", "--no-init", "--pairs=8"])
    assert a.runs == ["r1"] and not a.init and a.pairs == 8 and a.length == 64
    rec = {"run": "/x/mqar-lmm", "state": "trained", "call": 0, "tokens": 64, "theta": 0.05, "eta": 0.8,
           "alpha": 0.2, "alpha_p90": 0.83, "write_share": 0.011, "read_norm": 0.8}
    assert ("| x/mqar-lmm | trained | 0 | 64 | 0.050 | 0.80 | 0.2000 / 0.8300 | 0.011 | 0.80 |"
            in gate_probe.format_table([rec]))
    assert gate_probe.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate_probe: ") and "Traceback" not in err
