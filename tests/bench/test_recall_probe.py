"""``scripts/probe.py recall``: its options and its table (the probe itself:
test_eval_recall.py)."""

import pytest

from titans_lm.bench import recall_probe


def test_options_and_table():
    a = recall_probe.parse_args(["r1", "r2", "--no-init", "--min_distance=65", "--length=128"])
    assert a.runs == ["r1", "r2"] and not a.init and a.min_distance == 65 and a.length == 128
    assert recall_probe.parse_args(["r"]).init
    rec = {"run": "/x/mqar-lmm", "model": "lmm", "state": "trained", "n_queries": 7,
           "own_median": 5e-4, "other_median": 2.5e-4, "selectivity": 2.0}
    table = recall_probe.format_table([rec])
    assert "| x/mqar-lmm | lmm | trained | 7 | 5.00e-04 | 2.50e-04 | 2.00 |" in table


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert recall_probe.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("recall_probe: ") and "Traceback" not in err


def test_write_key_cosine_sees_the_keys_the_memory_writes():
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from _backbones import build, small_model_cfg
    from titans_lm.eval.recall import chunk_key_cosine
    from titans_lm.nn.stream import fresh_stream_state, make_stream

    from titans_lm.memory.layer import NeuralMemory
    before = NeuralMemory.scan
    model = build(small_model_cfg("lmm", "float32", n_layers=1, memory__chunk_size=8))
    graphdef, params = nnx.split(model)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 32)), jnp.int32)
    apply = lambda p, x: nnx.merge(graphdef, p)(x, jnp.ones_like(x))  # noqa: E731
    got = recall_probe.write_key_cosine(apply, params, tokens, 8)
    # The one memory layer's keys, projected directly from its input
    stream, _ = make_stream(jnp.ones_like(tokens), fresh_stream_state(2), fresh=True,
                            no_persistent=True)
    block = model.blocks[0]
    inputs, _ = block.mixer.memory.project(block.mixer_norm(model.embed(tokens)), stream)
    want = chunk_key_cosine(np.asarray(inputs.k), 8)
    assert got == pytest.approx(want, rel=1e-5) and 0.02 < abs(want) < 1
    # The patch is undone; a model without a memory has no keys
    assert NeuralMemory.scan is before
    tf = build(small_model_cfg("transformer", "float32", n_layers=1))
    g2, p2 = nnx.split(tf)
    assert recall_probe.write_key_cosine(lambda p, x: nnx.merge(g2, p)(x, jnp.ones_like(x)), p2,
                                         tokens, 8) is None
