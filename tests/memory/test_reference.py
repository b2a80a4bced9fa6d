"""The engine's semantics: worked examples from the seeds, special cases, shared test vectors.

Every check runs on both the token-by-token ``reference`` and the ``chunked`` dual form.
Conventions here (Titans eq. 12): loss ||f(k) - v||^2 without 1/2, row vectors, f(k) = k @ W.
The seeds' examples use the half loss (rate r -> theta = r / 2) or column vectors (W -> W^T).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import MLPMemory, memory_scan

IMPLS = ["reference", "chunked"]
# The independent engine vectors: the shared copy beside the clone when there is one, else the
# copy shipped in tests/memory/cases (identical; see tests/memory/cases/README.md), so every clone runs them.
_SHARED_VECTORS = Path(__file__).resolve().parents[2] / ".." / "shared" / "cases" / "engine_vectors.json"
VECTORS = (_SHARED_VECTORS if _SHARED_VECTORS.exists()
           else Path(__file__).resolve().parent / "cases" / "engine_vectors.json")


def run(impl, W0, k, v, q, theta, eta, alpha, chunk, model="linear", S0=None):
    params0 = tuple(jnp.asarray(w, jnp.float64) for w in W0)
    momentum0 = tuple(jnp.zeros_like(p) for p in params0) if S0 is None else \
        tuple(jnp.asarray(s, jnp.float64) for s in S0)
    arrays = [jnp.asarray(x, jnp.float64) for x in (k, v, q, theta, eta, alpha)]
    reads, (P, S) = memory_scan(params0, momentum0, *arrays, model=model, chunk_size=chunk, impl=impl)
    return np.asarray(reads), [np.asarray(p) for p in P], [np.asarray(s) for s in S]


@pytest.mark.parametrize("impl", IMPLS)
def test_seed004_delta_rule_overwrites_the_value_of_a_repeated_key(impl):
    # Seed 004 sec. 1.1: W0 = 0, eta_seed = 0.5 (so 2 eta = 1): the second write with the same key
    # replaces the value. Row-vector W is the transpose of the seed's column-vector W.
    with jax.enable_x64(True):
        k = [[1, 0], [1, 0]]
        v = [[0, 1], [1, 0]]
        reads, (W,), _ = run(impl, [np.zeros((2, 2))], k, v, k, [0.5, 0.5], [0, 0], [0, 0], chunk=1)
        np.testing.assert_allclose(reads, [[0, 1], [1, 0]], atol=1e-15)
        np.testing.assert_allclose(W, [[1, 0], [0, 0]], atol=1e-15)


@pytest.mark.parametrize("impl", IMPLS)
def test_seed004_chunk_of_two_adds_like_linear_attention(impl):
    with jax.enable_x64(True):
        k = [[1, 0], [1, 0]]
        v = [[0, 1], [1, 0]]
        reads, (W,), _ = run(impl, [np.zeros((2, 2))], k, v, k, [0.5, 0.5], [0, 0], [0, 0], chunk=2)
        np.testing.assert_allclose(W, [[1, 1], [0, 0]], atol=1e-15)      # v1 k1^T + v2 k2^T
        np.testing.assert_allclose(reads, [[0, 1], [1, 1]], atol=1e-15)  # read 1 sees write 1 only


@pytest.mark.parametrize("impl", IMPLS)
def test_seed004_interference_of_overlapping_keys(impl):
    with jax.enable_x64(True):
        k = [[1, 0], [0.8, 0.6]]
        v = [[1, 0], [0, 1]]
        q = [[1, 0], [1, 0]]
        reads, _, _ = run(impl, [np.zeros((2, 2))], k, v, q, [0.5, 0.5], [0, 0], [0, 0], chunk=1)
        np.testing.assert_allclose(reads[1], [0.36, 0.8], atol=1e-15)


@pytest.mark.parametrize("impl", IMPLS)
def test_seed000_online_versus_shared_chunk_start(impl):
    # Seed 000 sec. 4.7: w0 = 0, keys 1, targets 1 and 3, rate 0.5 on the half loss = theta 0.25.
    with jax.enable_x64(True):
        args = ([[1.0], [1.0]], [[1.0], [3.0]], [[1.0], [1.0]], [0.25, 0.25], [0, 0], [0, 0])
        online, (w_online,), _ = run(impl, [np.zeros((1, 1))], *args, chunk=1)
        chunked, (w_chunk,), _ = run(impl, [np.zeros((1, 1))], *args, chunk=2)
        assert w_online[0, 0] == pytest.approx(1.75, abs=1e-15)
        assert w_chunk[0, 0] == pytest.approx(2.0, abs=1e-15)
        assert online[0, 0] == pytest.approx(0.5, abs=1e-15)
        assert chunked[0, 0] == pytest.approx(0.5, abs=1e-15)  # not the chunk-final 2: causal


@pytest.mark.parametrize("impl", IMPLS)
def test_momentum_and_decay_scalar_example(impl):
    # docs/design.md#a-scalar-check: P0 = 2, S0 = 0.2, G = -0.4 -> S1 = 0.14, P1 = 1.94.
    # G = 2 k (k P0 - v) = -0.4 with k = 1 needs v = 2.2.
    with jax.enable_x64(True):
        _, (P,), (S,) = run(impl, [[[2.0]]], [[1.0]], [[2.2]], [[1.0]], [0.1], [0.5], [0.1],
                            chunk=1, S0=[[[0.2]]])
        assert S[0, 0] == pytest.approx(0.14, abs=1e-14)
        assert P[0, 0] == pytest.approx(1.94, abs=1e-14)


@pytest.mark.parametrize("impl", IMPLS)
def test_seed004_outer_gradient_keeps_the_second_order_path(impl):
    # Seed 004 sec. 1.2: w0 = 1, key a = 2, v = 3, rate 0.1 on the half loss (theta 0.05);
    # outer loss 0.5 (w1 q - y)^2 with q = 1, y = 2 gives d/da = 0.08 (w1 = 1.2).
    with jax.enable_x64(True):
        def outer(a):
            reads, _ = memory_scan((jnp.ones((1, 1)),), (jnp.zeros((1, 1)),), a.reshape(1, 1),
                                   jnp.full((1, 1), 3.0), jnp.ones((1, 1)), jnp.full((1,), 0.05),
                                   jnp.zeros(1), jnp.zeros(1), model="linear", chunk_size=1, impl=impl)
            return 0.5 * (reads[0, 0] - 2.0) ** 2, reads[0, 0]

        grad, w1 = jax.grad(outer, has_aux=True)(jnp.array(2.0))
        assert float(w1) == pytest.approx(1.2, abs=1e-14)
        assert float(grad) == pytest.approx(0.08, abs=1e-14)


def _random_inputs(T, d, seed, theta_max=0.3):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return (unit(rng.normal(size=(T, d))), rng.normal(size=(T, d)), unit(rng.normal(size=(T, d))),
            rng.uniform(0, theta_max, T), rng.uniform(0, 1, T), rng.uniform(0, 0.1, T))


@pytest.mark.parametrize("impl", IMPLS)
def test_chunk_one_is_online_gradient_descent_with_momentum_and_decay(impl):
    with jax.enable_x64(True):
        model = MLPMemory(depth=2, expansion=1.5)
        P0 = model.init(jax.random.key(0), 3, 3, jnp.float64)
        k, v, q, theta, eta, alpha = _random_inputs(9, 3, 1)
        reads, P, S = run(impl, P0, k, v, q, theta, eta, alpha, chunk=1, model=model)
        Pw, Sw = P0, tuple(jnp.zeros_like(p) for p in P0)
        for t in range(9):
            G = jax.grad(model.loss)(Pw, jnp.asarray(k[t:t + 1]), jnp.asarray(v[t:t + 1]))
            Sw = tuple(eta[t] * s - theta[t] * g for s, g in zip(Sw, G))
            Pw = tuple((1 - alpha[t]) * p + s for p, s in zip(Pw, Sw))
            np.testing.assert_allclose(reads[t], model.apply(Pw, jnp.asarray(q[t])), atol=1e-13)
        for a, b in zip(P + S, Pw + Sw):
            np.testing.assert_allclose(a, b, atol=1e-13)


@pytest.mark.parametrize("impl", IMPLS)
def test_no_momentum_no_decay_is_ttt_minibatch_gradient_descent(impl):
    with jax.enable_x64(True):
        model = MLPMemory(depth=2, expansion=1.5)
        P0 = model.init(jax.random.key(0), 3, 3, jnp.float64)
        k, v, q, theta, _, _ = _random_inputs(10, 3, 2)
        zeros = np.zeros(10)
        reads, P, _ = run(impl, P0, k, v, q, theta, zeros, zeros, chunk=4, model=model)
        W = P0
        for start in range(0, 10, 4):
            W_start = W
            for t in range(start, min(start + 4, 10)):  # W_t = W_{t'} - sum_{t'<=s<=t} theta_s G_s(W_{t'})
                G = jax.grad(model.loss)(W_start, jnp.asarray(k[t:t + 1]), jnp.asarray(v[t:t + 1]))
                W = tuple(w - theta[t] * g for w, g in zip(W, G))
                np.testing.assert_allclose(reads[t], model.apply(W, jnp.asarray(q[t])), atol=1e-13)
        for a, b in zip(P, W):
            np.testing.assert_allclose(a, b, atol=1e-13)


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_chunk_one_without_momentum_and_decay_is_the_delta_rule(impl):
    with jax.enable_x64(True):
        k, v, q, theta, _, _ = _random_inputs(12, 4, 3)
        W0 = np.random.default_rng(4).normal(size=(4, 4)) * 0.3
        zeros = np.zeros(12)
        reads, (W,), _ = run(impl, [W0], k, v, q, theta, zeros, zeros, chunk=1)
        Wd = W0.copy()
        for t in range(12):  # W_t = W_{t-1} + beta_t k_t^T (v_t - k_t W_{t-1}), beta_t = 2 theta_t
            Wd = Wd + 2 * theta[t] * np.outer(k[t], v[t] - k[t] @ Wd)
            np.testing.assert_allclose(reads[t], q[t] @ Wd, atol=1e-13)
        np.testing.assert_allclose(W, Wd, atol=1e-13)


def _vector_cases():
    if not VECTORS.exists():
        return []
    return json.loads(VECTORS.read_text())["cases"]


@pytest.mark.skipif(not VECTORS.exists(),
                    reason=f"engine test vectors not found at {VECTORS}")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", range(len(_vector_cases()) or 1))
def test_shared_engine_vectors(impl, case):
    c = _vector_cases()[case]
    with jax.enable_x64(True):
        reads, P, S = run(impl, c["params0"], c["k"], c["v"], c["q"], c["theta"], c["eta"], c["alpha"],
                          chunk=c["chunk_size"], model=c["model"], S0=c["momentum0"])
        np.testing.assert_allclose(reads, np.array(c["expected_reads"]), atol=1e-12)
        for got, want in zip(P, c["expected_params"]):
            np.testing.assert_allclose(got, np.array(want), atol=1e-12)
        for got, want in zip(S, c["expected_momentum"]):
            np.testing.assert_allclose(got, np.array(want), atol=1e-12)


def test_shipped_engine_vectors_match_the_shared_copy():
    shipped = Path(__file__).resolve().parent / "cases" / "engine_vectors.json"
    assert shipped.exists(), "tests/memory/cases/engine_vectors.json is missing"
    if not _SHARED_VECTORS.exists():
        pytest.skip("no shared copy beside this clone to compare with")
    assert shipped.read_bytes() == _SHARED_VECTORS.read_bytes()
