"""Closed-form chunk coefficients against the unrolled scalar recurrence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory.coefficients import chunk_coefficients, segment_products


def _unrolled(P0, S0, G, theta, eta, alpha):
    """Scalar recurrence S_i = eta_i S_{i-1} - theta_i G_i, P_i = (1 - alpha_i) P_{i-1} + S_i."""
    P, S, Ps, Ss = P0, S0, [], []
    for g, th, et, al in zip(G, theta, eta, alpha):
        S = et * S - th * g
        P = (1 - al) * P + S
        Ps.append(P)
        Ss.append(S)
    return np.array(Ps), np.array(Ss)


def test_segment_products_match_brute_force():
    with jax.enable_x64(True):
        g = np.random.default_rng(0).uniform(0, 1, 7)
        got = np.asarray(segment_products(jnp.asarray(g)))
        for i in range(7):
            for k in range(7):
                want = np.prod(g[k + 1:i + 1]) if i >= k else 0.0
                assert got[i, k] == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("b", [1, 4, 9])
def test_coefficients_reproduce_recurrence(b):
    rng = np.random.default_rng(b)
    with jax.enable_x64(True):
        theta, eta, alpha = rng.uniform(0, 0.5, b), rng.uniform(0, 1, b), rng.uniform(0, 0.5, b)
        G, P0, S0 = rng.normal(size=b), 1.3, -0.4
        c = chunk_coefficients(*(jnp.asarray(x) for x in (theta, eta, alpha)))
        P = np.asarray(c.B * P0 + c.A * S0 - c.C @ G)
        S = np.asarray(c.E0 * S0 - c.M @ G)
        P_want, S_want = _unrolled(P0, S0, G, theta, eta, alpha)
        np.testing.assert_allclose(P, P_want, rtol=0, atol=1e-14)
        np.testing.assert_allclose(S, S_want, rtol=0, atol=1e-14)
        assert np.all(np.triu(np.asarray(c.C), 1) == 0) and np.all(np.triu(np.asarray(c.M), 1) == 0)


def test_design_scalar_example():
    # docs/design.md#a-scalar-check: P0=2, S0=0.2, G=-0.4, eta=0.5, theta=0.1, alpha=0.1.
    with jax.enable_x64(True):
        c = chunk_coefficients(jnp.array([0.1]), jnp.array([0.5]), jnp.array([0.1]))
        S1 = c.E0[0] * 0.2 - c.M[0, 0] * -0.4
        P1 = c.B[0] * 2.0 + c.A[0] * 0.2 - c.C[0, 0] * -0.4
        assert float(S1) == pytest.approx(0.14, abs=1e-15)
        assert float(P1) == pytest.approx(1.94, abs=1e-15)


@pytest.mark.parametrize("eta1", [0.0, 0.6])
def test_exact_zero_and_one_gates_and_their_derivatives(eta1):
    """eta = 0 (momentum off) and alpha = 1 give exact zeros, and exact derivatives, including
    with respect to the gate that is exactly 0 or 1."""
    with jax.enable_x64(True):
        theta = jnp.array([0.3, 0.2, 0.1, 0.4])
        eta = jnp.array([0.5, eta1, 0.7, 0.0])
        alpha = jnp.array([0.1, 0.2, 1.0, 0.3])
        c = chunk_coefficients(theta, eta, alpha)
        assert float(c.E0[3]) == 0.0 and float(c.M[3, 2]) == 0.0   # products through eta_3 = 0
        assert float(c.B[2]) == 0.0 and float(c.B[3]) == 0.0       # products through 1 - alpha_2 = 0
        if eta1 == 0.0:
            assert float(c.M[2, 0]) == 0.0 and float(c.E0[1]) == 0.0
        G = jnp.array([0.5, -1.0, 2.0, 0.3])

        def final(theta, eta, alpha):
            c = chunk_coefficients(theta, eta, alpha)
            return c.B[3] * 1.5 + c.A[3] * 0.4 - c.C[3] @ G + c.E0[2] * 0.4 - c.M[2] @ G

        def final_unrolled(theta, eta, alpha):
            P, S, out = 1.5, 0.4, 0.0
            for i in range(4):
                S = eta[i] * S - theta[i] * G[i]
                P = (1 - alpha[i]) * P + S
                out = out + (S if i == 2 else 0.0)
            return P + out

        assert float(final(theta, eta, alpha)) == pytest.approx(float(final_unrolled(theta, eta, alpha)),
                                                               abs=1e-14)
        got = jax.grad(final, argnums=(0, 1, 2))(theta, eta, alpha)
        want = jax.grad(final_unrolled, argnums=(0, 1, 2))(theta, eta, alpha)
        for a, b in zip(got, want):
            assert np.all(np.isfinite(np.asarray(a)))
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-13)
        assert abs(float(got[1][3])) > 0.01   # d/d eta_3 at eta_3 = 0 is not lost


def test_segment_products_jacobian_is_exact_at_zeros():
    with jax.enable_x64(True):
        g = np.random.default_rng(2).uniform(0.2, 1.0, 6)
        for zeros in ([], [2], [1, 4]):
            gz = g.copy()
            gz[zeros] = 0.0
            want = np.zeros((6, 6, 6))  # d P[i, k] / d g_j = prod of the other factors in (k, i]
            for i in range(6):
                for k in range(i + 1):
                    for j in range(k + 1, i + 1):
                        want[i, k, j] = np.prod(np.delete(gz[k + 1:i + 1], j - k - 1))
            x = jnp.asarray(gz)
            np.testing.assert_allclose(jax.jacrev(segment_products)(x), want, atol=1e-15)
            np.testing.assert_allclose(jax.jacfwd(segment_products)(x), want, atol=1e-15)


@pytest.mark.parametrize("form", ["log_keep", "alpha"])
@pytest.mark.parametrize("to_target", [False, True])
def test_none_gates_are_exact_zero_gates(form, to_target):
    """eta = None (no momentum) and alpha = log_keep = None (no decay), formed without the gate
    products, equal zero gates exactly, with document starts inside the chunk and without."""
    b = 7
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        theta, eta, keep = (jnp.asarray(rng.uniform(lo, hi, b)) for lo, hi in
                            ((0, .5), (0, 1), (.3, 1)))
        zeros = jnp.zeros(b)
        decay = {"log_keep": {"log_keep": jnp.log(keep)}, "alpha": {"alpha": 1 - keep}}[form]
        no_decay = {"log_keep": {"log_keep": zeros}, "alpha": {"alpha": zeros}}[form]
        for reset in (None, jnp.asarray([0, 0, 1, 0, 0, 1, 0], bool),
                      jnp.asarray([1, 0, 0, 0, 1, 0, 0], bool)):
            for et_new, et_old, dec_new, dec_old in ((None, zeros, decay, decay),
                                                     (eta, eta, {}, no_decay),
                                                     (None, zeros, {}, no_decay)):
                args = dict(reset=reset, decay_to_target=to_target)
                new = chunk_coefficients(theta, et_new, dec_new.get("alpha"),
                                         log_keep=dec_new.get("log_keep"), **args)
                old = chunk_coefficients(theta, et_old, dec_old.get("alpha"),
                                         log_keep=dec_old.get("log_keep"), **args)
                for name, a, w in zip(new._fields, new, old):
                    assert (a is None) == (w is None), name
                    if a is not None:
                        np.testing.assert_allclose(a, w, rtol=0, atol=1e-15, err_msg=name)
