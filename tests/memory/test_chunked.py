"""The chunked dual form's pieces: gradient factors, partial chunks, checkpoint groups, memory."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import MLPMemory, ResidualLN, SwiGLUMemory, chunk_step, memory_scan
from titans_lm.memory.chunked import gradient_factors


def _inputs(T, d, seed, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    k, q = (jnp.asarray(unit(rng.normal(size=(T, d))), dtype) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, d)), dtype)
    gates = [jnp.asarray(rng.uniform(lo, hi, T), dtype) for lo, hi in ((0, .3), (0, 1), (0, .1))]
    return [k, v, q] + gates


@pytest.mark.parametrize("model", [MLPMemory(depth=3, expansion=1.5, bias=True, activation="gelu"),
                                   ResidualLN(MLPMemory(depth=2))], ids=["mlp3_bias", "residual_ln"])
def test_gradient_factors_are_the_per_token_gradients(model):
    with jax.enable_x64(True):
        params = model.init(jax.random.key(0), 3, 3, jnp.float64)
        k, v = _inputs(5, 3, 1)[:2]
        f = jax.jit(gradient_factors, static_argnums=0)(model, params, k, v)
        per_token = jax.jit(jax.vmap(jax.grad(model.loss), in_axes=(None, 0, 0)))
        grads = per_token(params, k[:, None], v[:, None])
        for s in range(5):
            want = [g[s] for g in grads]
            for i, (p, w) in enumerate(zip(params, want)):
                got = jnp.outer(f.inputs[i][s], f.signals[i][s]) if p.ndim == 2 else f.signals[i][s]
                np.testing.assert_allclose(got, w, atol=1e-14)


def test_chunk_step_state_after_the_last_valid_token():
    model = MLPMemory(depth=2, expansion=2.0)
    with jax.enable_x64(True):
        P0 = model.init(jax.random.key(0), 4, 4, jnp.float64)
        S0 = tuple(0.1 * jnp.ones_like(p) for p in P0)
        k, v, q, th, et, al = _inputs(8, 4, 2)
        step = jax.jit(functools.partial(chunk_step, model))
        for n in (0, 3, 8):
            _, P, S = step(P0, S0, k, v, q, th, et, al, jnp.int32(n))
            if n == 0:
                P_want, S_want = P0, S0
            else:
                _, (P_want, S_want) = memory_scan(P0, S0, k[:n], v[:n], q[:n], th[:n], et[:n], al[:n],
                                                  model=model, chunk_size=8, impl="reference")
            for a, b in zip(P + S, P_want + S_want):
                np.testing.assert_allclose(a, b, atol=1e-14)


def test_checkpoint_groups_change_nothing():
    """Groups of 1 and 3 chunks, and no rematerialisation (0): the same values and gradients."""
    model = MLPMemory(depth=2, expansion=2.0)
    with jax.enable_x64(True):
        P0 = model.init(jax.random.key(0), 4, 4, jnp.float64)
        S0 = tuple(jnp.zeros_like(p) for p in P0)
        args = _inputs(50, 4, 3)        # 7 chunks of 8: groups of 3 leave two empty chunk slots
        reset = jnp.zeros(50, bool).at[24].set(True)

        def loss(group, P0, *a):
            reads, (P, S) = memory_scan(P0, S0, *a, model=model, chunk_size=8, reset=reset,
                                        chunks_per_checkpoint=group)
            return jnp.sum(reads ** 2) + sum(jnp.sum(p ** 3) for p in P) + sum(jnp.sum(s) for s in S)

        out = [jax.jit(jax.value_and_grad(functools.partial(loss, g), argnums=tuple(range(7))))(P0, *args)
               for g in (1, 3, 0)]
        for other in out[1:]:
            for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(other)):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def _backward_temp_bytes(impl, T, **options):
    model = MLPMemory(depth=2, expansion=2.0)
    d = 16
    P0 = model.init(jax.random.key(0), d, d)
    S0 = tuple(jnp.zeros_like(p) for p in P0)
    args = _inputs(T, d, 0, jnp.float32)

    def loss(P0, S0, *a):
        reads, (P, S) = memory_scan(P0, S0, *a, model=model, chunk_size=16, impl=impl, **options)
        return jnp.sum(reads ** 2) + sum(jnp.sum(p) for p in P)

    compiled = jax.jit(jax.grad(loss, argnums=tuple(range(8)))).lower(P0, S0, *args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_backward_keeps_only_chunk_boundary_states():
    """At T = 4096 the reference's backward stores the weights of every token; the chunked one
    stores one state per chunk (XLA's static buffer assignment of the compiled programs)."""
    reference = _backward_temp_bytes("reference", 4096)
    chunked = _backward_temp_bytes("chunked", 4096)
    params_bytes = 2 * 16 * 32 * 4
    assert reference > 4096 * 2 * params_bytes           # >= (P, S) per token
    assert chunked < reference / 10, (chunked, reference)
    # Without rematerialisation the backward keeps each chunk's internals: more than the states.
    kept = _backward_temp_bytes("chunked", 4096, chunks_per_checkpoint=0)
    assert kept > 2 * chunked, (kept, chunked)


_CONSTANT_GATE_CASES = {
    # LaCT: SwiGLU, dot bias, weight norm, chunk-start reads; no momentum, no decay
    "lact": dict(none=("eta", "alpha"), read="chunk_start", attentional_bias="dot",
                 fast_weight_norm=True, state_length=9),
    # TTT: running-mean reads after each write
    "ttt": dict(none=("eta", "alpha"), running_mean=True, state_length=6),
    "no_momentum": dict(none=("eta",), log_keep=True),
    "no_decay": dict(none=("alpha",), decay_target="initial"),
    "newton_schulz": dict(none=("alpha",), ns_steps=2),
    "omega": dict(none=("eta", "alpha"), omega_window=2),
}


@pytest.mark.parametrize("case", list(_CONSTANT_GATE_CASES))
def test_none_gates_equal_zero_gates_and_the_reference(case):
    """eta = None / alpha = None (no momentum / no decay: coefficients without the gate products)
    give the reads, final state and gradients of zero gates, and the token-by-token reference,
    with documents starting inside chunks."""
    opts = dict(_CONSTANT_GATE_CASES[case])
    none = opts.pop("none")
    model = SwiGLUMemory(expansion=1.0) if case == "lact" else MLPMemory(depth=2, expansion=1.0)
    T, d = 13, 3
    with jax.enable_x64(True):
        P0 = model.init(jax.random.key(1), d, d, jnp.float64)
        S0 = tuple(jnp.zeros_like(p) for p in P0)
        k, v, q, th, et, al = _inputs(T, d, 5)
        reset = jnp.zeros(T, bool).at[jnp.array([2, 6, 9])].set(True)
        log_keep = opts.pop("log_keep", False)
        if opts.get("omega_window", 1) > 1:
            opts["gamma"] = jnp.linspace(0.2, 1.0, T)
        weights = jax.random.normal(jax.random.key(2), (T, d), jnp.float64)

        def loss(impl, new, th, k, v, q, P0):
            eta = (None if new else jnp.zeros(T)) if "eta" in none else et
            alpha = (None if new else jnp.zeros(T)) if "alpha" in none else al
            kw = dict(opts)
            if log_keep and "alpha" not in none:
                kw["log_keep"], alpha = jnp.log1p(-al), None
            reads, (P, S) = memory_scan(P0, S0, k, v, q, th, eta, alpha, model=model,
                                        chunk_size=4, impl=impl, reset=reset, **kw)
            return jnp.sum(reads * weights) + sum(jnp.sum(x ** 2) for x in P + S), (reads, P, S)

        grad = lambda impl, new: jax.jit(  # noqa: E731
            jax.grad(loss, argnums=(2, 3, 4, 5, 6), has_aux=True), static_argnums=(0, 1))(
            impl, new, th, k, v, q, P0)
        new_g, new_out = grad("chunked", True)
        for impl, atol in (("chunked", 1e-12), ("reference", 1e-10)):
            g, out = grad(impl, impl == "reference")
            for a, w in zip(jax.tree.leaves((new_out, new_g)), jax.tree.leaves((out, g))):
                np.testing.assert_allclose(a, w, rtol=0, atol=atol, err_msg=impl)
