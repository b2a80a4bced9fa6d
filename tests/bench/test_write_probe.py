"""The at-init memory write probe (``scripts/probe.py write``) on a tiny layer."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.bench import write_probe as probe_script
from titans_lm.memory.config import MemoryConfig

B, T, D, CHUNK = 2, 32, 16, 4
POSITIONS = (4, 8, 32)


def _layer(**changes):
    cfg = MemoryConfig(d_model=D, n_heads=2, head_dim=8, memory_depth=2, memory_expansion=2.0,
                       chunk_size=CHUNK, v_l2_norm=True, **changes)
    return probe_script.build_layer(cfg, seed=0), probe_script.random_inputs(B, T, D, seed=1)


def test_no_writes_no_decay_leaves_the_reads_exactly_at_w0():
    layer, x = _layer(use_decay=False)
    rec = probe_script.probe(layer, x, probe_script.Setting(theta_max=0.0, eta_max=0.9), POSITIONS)
    for t in map(str, POSITIONS):
        assert rec["read_change"][t] == 0.0 and rec["write_change"][t] == 0.0
        assert rec["direction_change"][t] == 0.0
        assert rec["state_norm"][t] == 1.0 and rec["retention"][t] == 1.0
    assert rec["write_gain"] == 0.0


def test_writes_move_the_reads_and_more_with_a_larger_theta():
    layer, x = _layer(use_decay=False)
    small = probe_script.probe(layer, x, probe_script.Setting(5e-4, 0.9), POSITIONS)
    large = probe_script.probe(layer, x, probe_script.Setting(5e-2, 0.9), POSITIONS)
    for t in map(str, POSITIONS):
        assert 0 < small["write_change"][t] < large["write_change"][t]
        assert small["read_change"][t] == pytest.approx(small["write_change"][t])   # no decay
    # more tokens, more writes
    assert small["write_change"]["4"] < small["write_change"]["32"]
    assert small["write_gain"] == pytest.approx(MemoryConfig(d_model=D, chunk_size=CHUNK,
                                                             theta_max=5e-4).write_gain())


@pytest.mark.parametrize("eta_max", [0.9, 0.0])
def test_retention_is_the_product_of_constant_forget_gates(eta_max):
    layer, x = _layer()
    layer.alpha_w[...] = jnp.zeros_like(layer.alpha_w[...])   # alpha = sigmoid(bias) at every token
    bias_before = np.asarray(layer.alpha_b[...])
    bias = -3.0   # keep 0.953 per token: an off-by-one token shows
    for theta_max in (0.0, 5e-4):
        rec = probe_script.probe(layer, x, probe_script.Setting(theta_max, eta_max, bias),
                                 POSITIONS)
        keep = 1 / (1 + np.exp(-(-bias)))   # 1 - sigmoid(bias) = sigmoid(-bias)
        for t in POSITIONS:
            assert rec["retention"][str(t)] == pytest.approx(keep ** t, rel=1e-5)
            if theta_max == 0:   # the engine's decay alone scales W0 by the same product
                assert rec["state_norm"][str(t)] == pytest.approx(keep ** t, rel=1e-4)
                assert rec["write_change"][str(t)] < 1e-5
            else:
                assert rec["write_change"][str(t)] > 1e-4
        assert rec["alpha_init"] == pytest.approx(1 - keep, rel=1e-5)
        assert rec["use_momentum"] is (eta_max > 0) and rec["eta_init"] == (0.0 if eta_max == 0
                                                                           else rec["eta_init"])
    # the probe puts the layer back as it found it
    np.testing.assert_array_equal(np.asarray(layer.alpha_b[...]), bias_before)
    assert layer.cfg.use_momentum and layer.cfg.theta_max == MemoryConfig.theta_max


def test_theta_bias_sets_theta_at_init_and_is_put_back():
    layer, x = _layer()
    layer.theta_w[...] = jnp.zeros_like(layer.theta_w[...])
    rec = probe_script.probe(layer, x, probe_script.Setting(1e-3, 0.9, theta_bias=3.0), POSITIONS)
    assert rec["theta_init"] == pytest.approx(1e-3 / (1 + np.exp(-3.0)), rel=1e-5)
    assert rec["theta_bias_init"] == 3.0
    np.testing.assert_array_equal(np.asarray(layer.theta_b[...]), MemoryConfig.theta_bias_init)


def test_periodic_inputs_repeat():
    x = probe_script.random_inputs(1, 40, 8, seed=0, period=16)
    np.testing.assert_array_equal(np.asarray(x[:, :16]), np.asarray(x[:, 16:32]))
    np.testing.assert_array_equal(np.asarray(x[:, :8]), np.asarray(x[:, 32:]))
    assert not np.allclose(np.asarray(x[:, :8]), np.asarray(x[:, 8:16]))


def test_cli_prints_one_json_line_per_setting(capsys):
    probe_script.main(["--theta-max", "5e-4,5e-3", "--alpha-bias", "preset", "--eta-max", "0.9,0",
                       "--tokens", "64", "--positions", "16,64", "--batch", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    recs = [json.loads(line) for line in lines]
    assert len(recs) == 4
    assert {(r["theta_max"], r["eta_max"]) for r in recs} == {(5e-4, 0.9), (5e-3, 0.9),
                                                             (5e-4, 0.0), (5e-3, 0.0)}
    assert all(set(r["read_change"]) == {"16", "64"} for r in recs)
    assert all(r["alpha_bias_init"] == MemoryConfig.alpha_bias_init for r in recs)
    assert all((r["head_dim"], r["n_heads"]) == (64, 4) for r in recs)   # configs/lmm.py:tiny
    with pytest.raises(ValueError, match="multiples of the chunk size"):
        probe_script.main(["--tokens", "64", "--positions", "10", "--theta-max", "5e-4",
                           "--alpha-bias", "preset", "--eta-max", "0.9"])


def test_an_underflowed_read_gives_null_not_nan():
    zeros = jnp.zeros((1, 1, 2, 4))
    assert probe_script._rel(zeros + 1, zeros) is None
    assert probe_script._rel(zeros + 2, zeros + 1) == pytest.approx(1.0)
    json.dumps({"x": probe_script._rel(zeros, zeros)}, allow_nan=False)


def test_head_dim_sets_the_layers_heads():
    cfg = probe_script.lmm_memory_config(head_dim=16)
    assert (cfg.head_dim, cfg.n_heads, cfg.d_model) == (16, 16, 256)
    assert probe_script.lmm_memory_config().head_dim == 64
