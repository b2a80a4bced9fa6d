"""The inner-loop guard ``surprise_max_norm`` (each token's gradient clipped at the chunk start):
chunked against the token-by-token reference in float64, forward and gradients; it is a no-op
when the bound is not reached; memory-state statistics and the non-finite-loss diagnosis."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory import MLPMemory, memory_scan
from titans_lm.memory import stats as memory_stats
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from titans_lm.train.diagnose import likely_cause
from _memory_call import call_fresh


def _inputs(T, d, seed):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    k, q = (jnp.asarray(unit(rng.normal(size=(T, d)))) for _ in range(2))
    v = jnp.asarray(3.0 * rng.normal(size=(T, d)))
    gates = [jnp.asarray(rng.uniform(lo, hi, T)) for lo, hi in ((0, .3), (0, .9), (0, .1))]
    return [k, v, q] + gates


@pytest.mark.parametrize("depth", [1, 3])
def test_clipped_chunked_matches_the_reference_forward_and_gradients(depth):
    model = MLPMemory(depth=depth, expansion=2.0) if depth > 1 else "linear"
    with jax.enable_x64(True):
        from titans_lm.memory.inner_models import resolve_model
        P0 = resolve_model(model).init(jax.random.key(0), 4, 4, jnp.float64)
        S0 = tuple(jnp.zeros_like(p) for p in P0)
        xs = _inputs(19, 4, 1)
        reset = jnp.zeros(19, bool).at[8].set(True)

        def run(impl, clip, *xs):
            reads, (P, S) = memory_scan(P0, S0, *xs, model=model, chunk_size=4, impl=impl,
                                        reset=reset, surprise_max_norm=clip)
            return jnp.sum(reads ** 2) + sum(jnp.sum(p ** 2) for p in P + S)
        for clip in (0.5, 2.0):
            ref = run("reference", clip, *xs)
            got = run("chunked", clip, *xs)
            np.testing.assert_allclose(got, ref, rtol=1e-11)
            g_ref = jax.jit(jax.grad(functools.partial(run, "reference", clip),
                                     argnums=(0, 1, 3, 4)))(*xs)
            g_got = jax.jit(jax.grad(functools.partial(run, "chunked", clip),
                                     argnums=(0, 1, 3, 4)))(*xs)
            for a, b in zip(g_got, g_ref):
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        unclipped = run("chunked", 0.0, *xs)
        assert abs(float(run("chunked", 0.5, *xs)) - float(unclipped)) > 1e-3  # it does clip
        np.testing.assert_allclose(run("chunked", 1e6, *xs), unclipped, rtol=1e-13)  # never binds


def test_guard_config_is_validated():
    with pytest.raises(ValueError, match="MemoryConfig.surprise_max_norm: must be >= 0"):
        MemoryConfig(d_model=32, surprise_max_norm=-1.0)
    MemoryConfig(d_model=32, surprise_max_norm=1.0, impl="pallas")   # runs chunked for the clip


def test_memory_norms_come_from_the_state_a_call_returns():
    """One norm per memory layer from the returned state (||P|| / ||W0|| of its chunk-start
    memory, max over rows and heads), also where the call runs inside another transformation
    (lax.scan, jax.checkpoint), which the trace-time records of before could not leave."""
    from titans_lm.nn.stream import fresh_stream_state, make_stream
    cfg = MemoryConfig(d_model=16, n_heads=2, head_dim=8, memory_depth=2, chunk_size=4)
    with nnx.use_eager_sharding(False):
        layers = [NeuralMemory(cfg, rngs=nnx.Rngs(i)) for i in range(2)]
    x = jax.random.normal(jax.random.key(0), (2, 8, 16))
    stream, _ = make_stream(jnp.ones((2, 8), jnp.int32), fresh_stream_state(2), fresh=True)

    def f(x):
        norms = []
        for layer in layers:
            x, state = layer(x, stream, layer.init_state(2))
            norms += layer.memory_norms(state)
        return x, memory_stats.as_metrics(norms)
    y, m = jax.jit(f)(x)
    assert sorted(m) == ["memory_norm_0", "memory_norm_1"]
    assert all(0.1 < float(v) < 10 and float(v) != 1.0 for v in m.values())
    np.testing.assert_allclose(y, call_fresh(layers[1], call_fresh(layers[0], x)), atol=1e-6)
    # by hand: the state after 8 tokens (2 chunks) against W0
    _, state = layers[0](x, stream, layers[0].init_state(2))
    w0 = [np.asarray(w, np.float64) for w in layers[0].initial_params()]
    sq = sum(np.sum(np.asarray(p, np.float64) ** 2, axis=tuple(range(2, p.ndim)))
             for p in state.params)
    sq0 = sum(np.sum(w ** 2, axis=tuple(range(1, w.ndim))) for w in w0)
    np.testing.assert_allclose(float(m["memory_norm_0"]), np.max(np.sqrt(sq / sq0[None])),
                               rtol=1e-5)

    def in_scan(x):
        def body(c, xi):
            _, st = layers[0](xi[None], jax.tree.map(lambda a: a[:1] if a.ndim else a, stream),
                              layers[0].init_state(1))
            return c, layers[0].memory_norms(st)[0]
        return jax.lax.scan(body, 0.0, x)[1]
    per_row = jax.jit(in_scan)(x)
    assert per_row.shape == (2,) and np.isfinite(per_row).all()
    np.testing.assert_allclose(float(per_row.max()), float(m["memory_norm_0"]), rtol=1e-5)
    remat = jax.jit(jax.checkpoint(lambda x: layers[0].memory_norms(
        layers[0](x, stream, layers[0].init_state(2))[1])[0]))
    np.testing.assert_allclose(float(remat(x)), float(m["memory_norm_0"]), rtol=1e-6)


def test_likely_cause_names_the_inner_loop_or_the_optimiser():
    inner = likely_cause({"loss": math.nan, "memory_norm_0": 0.8, "memory_norm_3": math.nan},
                         {0: 0.9, 3: 0.9})
    assert inner.startswith("likely cause: the memory's inner loop diverged (memory-state norm / "
                            "W0 norm layer 3: nan)")
    assert "model.memory.surprise_max_norm" in inner
    outer = likely_cause({"loss": math.inf, "memory_norm_0": 0.8}, {0: 0.7})
    assert outer.startswith("likely cause: the outer model or optimiser, not the memory")
    assert likely_cause({"loss": math.nan}) == "lower optim.lr or raise optim.warmup_steps"
