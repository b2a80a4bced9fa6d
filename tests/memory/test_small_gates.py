"""Gate derivatives at the edges: small and zero gates (finite differences), and the forget gate in
log form near alpha -> 0 and alpha -> 1 (float32 against float64).

The memory's outputs are affine in any single gate (a linear memory, a linear functional of reads
and state), so a forward difference is exact up to rounding for any step: it is the oracle for the
derivative at a gate of 1e-3, 1e-8, 1e-20 or exactly 0, where a derivative formed as
P * sum(dg / g) loses everything to cancellation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import LinearMemory, memory_scan
from titans_lm.memory.coefficients import chunk_coefficients

GATES = (1e-3, 1e-8, 1e-20, 0.0)
IMPLS = ("reference", "chunked", "pallas")
T, D, CHUNK, AT = 32, 16, 16, 5     # the probed gate: token AT (inside the first chunk)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    W0 = jnp.asarray(rng.normal(size=(D, D)) / np.sqrt(D))
    S0 = jnp.asarray(0.1 * rng.normal(size=(D, D)))
    k, q = (jnp.asarray(unit(rng.normal(size=(T, D)))) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, D)))
    theta = jnp.asarray(rng.uniform(0.0, 0.2, T))
    eta = jnp.asarray(rng.uniform(0.3, 0.9, T))
    alpha = jnp.asarray(rng.uniform(0.0, 0.1, T))
    w_r, w_p, w_s = (jnp.asarray(rng.normal(size=s)) for s in ((T, D), (D, D), (D, D)))
    return (W0,), (S0,), k, v, q, theta, eta, alpha, (w_r, w_p, w_s)


def _objective(impl, which, gate, args):
    params0, momentum0, k, v, q, theta, eta, alpha, (w_r, w_p, w_s) = args
    gates = {"theta": theta, "eta": eta, "keep": 1 - alpha}
    gates[which] = gates[which].at[AT].set(gate)
    reads, (P, S) = memory_scan(params0, momentum0, k, v, q, gates["theta"], gates["eta"],
                                1 - gates["keep"], model=LinearMemory(), chunk_size=CHUNK,
                                impl=impl)
    return jnp.sum(reads * w_r) + jnp.sum(P[0] * w_p) + jnp.sum(S[0] * w_s)


def derivative_table():
    """{(impl, gate value): relative error of d/d eta_AT against a forward difference}."""
    args = _problem()
    table = {}
    for impl in IMPLS:
        f = jax.jit(lambda g, impl=impl: _objective(impl, "eta", g, args))
        df = jax.jit(jax.grad(lambda g, impl=impl: _objective(impl, "eta", g, args)))
        for g0 in GATES:
            h = 1e-4
            fd = (float(f(g0 + h)) - float(f(g0))) / h
            ad = float(df(g0))
            table[impl, g0] = abs(ad - fd) / abs(fd)
    return table


def test_small_gate_derivatives_match_finite_differences():
    with jax.enable_x64(True):
        table = derivative_table()
    print("\nd/d eta at a small eta, relative error against a forward difference (float64):")
    print("| impl | " + " | ".join(f"eta = {g:g}" for g in GATES) + " |")
    for impl in IMPLS:
        print(f"| {impl} | " + " | ".join(f"{table[impl, g]:.1e}" for g in GATES) + " |")
    for (impl, g0), err in table.items():
        assert err < 1e-8, (impl, g0, err)


@pytest.mark.parametrize("which", ["eta", "keep"])
def test_coefficient_derivatives_at_small_gates(which):
    """The same at the coefficient level, for the momentum gate and for 1 - alpha (the decay),
    every coefficient and every entry (forward difference of an affine function)."""
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        theta, eta, keep = (jnp.asarray(rng.uniform(0.2, 0.9, 8)) for _ in range(3))
        for g0 in GATES:
            def coef(g):
                gates = {"eta": eta, "keep": keep}
                gates[which] = gates[which].at[3].set(g)
                return jnp.concatenate([x.ravel() for x in
                                        chunk_coefficients(theta, gates["eta"], 1 - gates["keep"]) if x is not None])
            h = 1e-3
            fd = (coef(g0 + h) - coef(g0)) / h
            ad = jax.jacfwd(coef)(jnp.asarray(g0))
            ad_rev = jax.jacrev(coef)(jnp.asarray(g0))
            scale = float(jnp.max(jnp.abs(fd)))
            assert float(jnp.max(jnp.abs(ad - fd))) < 1e-10 * scale, (which, g0)
            assert float(jnp.max(jnp.abs(ad_rev - fd))) < 1e-10 * scale, (which, g0)


@pytest.mark.parametrize("impl,pre", [("reference", 16.0), ("chunked", 16.0), ("pallas", 16.0),
                                      ("chunked", -16.0)])
def test_log_form_forget_gate_keeps_float32_precision(impl, pre):
    """alpha = sigmoid(pre) at pre = +-16: the gradient with respect to the pre-activation in
    float32 through log_keep = log_sigmoid(-pre) matches float64 (through 1 - alpha it does not
    at +16, where 1 - alpha = 1.1e-7 rounds in float32)."""
    def grad_pre(dtype, log_form):
        args = _problem(seed=2)
        params0, momentum0, k, v, q, theta, eta, _, (w_r, w_p, w_s) = jax.tree.map(
            lambda x: x.astype(dtype), args)
        a = jnp.full((T,), pre, dtype)

        def f(a):
            alpha = jax.nn.sigmoid(a)
            kw = {"log_keep": jax.nn.log_sigmoid(-a)} if log_form else {}
            reads, (P, S) = memory_scan(params0, momentum0, k, v, q, theta, eta,
                                        None if log_form else alpha, model=LinearMemory(),
                                        chunk_size=CHUNK, impl=impl, **kw)
            return jnp.sum(reads * w_r) + jnp.sum(P[0] * w_p) + jnp.sum(S[0] * w_s)
        return np.asarray(jax.grad(f)(a), np.float64)

    with jax.enable_x64(True):
        want = grad_pre(jnp.float64, True)
        np.testing.assert_allclose(grad_pre(jnp.float64, False), want, rtol=1e-8)
        got = grad_pre(jnp.float32, True)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        old = np.max(np.abs(grad_pre(jnp.float32, False) - want)) / np.max(np.abs(want))
    print(f"\npre = {pre:+g} {impl}: float32 gradient relative error: log form {err:.1e}, "
          f"1 - alpha form {old:.1e}")
    assert err < 1e-3
    if pre > 0:
        assert old > 10 * err   # the log form is what keeps the precision
