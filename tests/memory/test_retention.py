"""The forget gate's target (``decay_target``, titans_lm/memory/coefficients.py R = 1 - B), in
float64:

- the reference token loop equals a plain Python loop written from the equation
  P_t = (1 - alpha_t) P_{t-1} + alpha_t P_init + S_t (linear memory, resets inside chunks);
- the chunked engine equals the reference for memory depth 1 and 2, chunk sizes 1, 4, 16, with
  documents starting inside chunks and the gate in log form: reads, final state, the state at a
  point inside a chunk (state_length), and the gradients of every input, the target included;
- a memory that writes nothing stays at its target for any length (decaying to zero, it fades),
  and a zero target is the zero decay;
- "pallas" runs "chunked" for it (the kernel decays toward zero);
- bad combinations get one clear message.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import memory_scan
from titans_lm.memory.config import MemoryConfig
from _scan_problems import assert_chunked_equals_reference, documents_problem, small_memory

T, D = 21, 4
STARTS = (6, 13, 14)   # document starts inside chunks of 4 and 16


def inputs(seed=0):
    return documents_problem(T, D, STARTS, seed, decay=0.3)


def _params(depth, seed):
    if depth == 1:
        return (jnp.asarray(np.random.default_rng(seed).normal(size=(D, D)) / 2),)
    return small_memory(2).init(jax.random.key(seed), D, D, jnp.float64)


def test_the_reference_is_the_equation():
    """Online GD (chunk 1) on a linear memory, by hand: decay toward the target, resets to it."""
    with jax.enable_x64(True):
        (k, v, q, theta, eta, log_keep), reset = inputs()
        W0, target = _params(1, 1)[0], _params(1, 2)[0]
        keep = np.exp(np.asarray(log_keep))
        W, S, want = np.asarray(W0), np.zeros((D, D)), []
        for t in range(T):
            if reset[t]:
                W, S = np.asarray(target), np.zeros((D, D))
            kt, vt = np.asarray(k[t]), np.asarray(v[t])
            G = 2 * np.outer(kt, kt @ W - vt)          # grad of ||k W - v||^2
            S = float(eta[t]) * S - float(theta[t]) * G
            W = keep[t] * W + (1 - keep[t]) * np.asarray(target) + S
            want.append(np.asarray(q[t]) @ W)
        reads, (P, _) = memory_scan((W0,), (jnp.zeros((D, D)),), k, v, q, theta, eta, None,
                                    log_keep=log_keep, model="linear", chunk_size=1,
                                    impl="reference", reset=reset, reset_to=(target,),
                                    decay_target="initial")
        np.testing.assert_allclose(reads, np.stack(want), rtol=0, atol=1e-12)
        np.testing.assert_allclose(P[0], W, rtol=0, atol=1e-12)


def run(impl, chunk, depth, params, target, args, reset, state_length=None):
    k, v, q, theta, eta, log_keep = args
    reads, (P, _) = memory_scan(params, tuple(map(jnp.zeros_like, params)), k, v, q, theta, eta,
                                None, log_keep=log_keep, model=small_memory(depth), chunk_size=chunk,
                                impl=impl, reset=reset, reset_to=target, state_length=state_length,
                                decay_target="initial")
    return reads, P


@pytest.mark.parametrize("depth", [1, 2])
def test_chunked_equals_the_token_loop(depth):
    with jax.enable_x64(True):
        args, reset = inputs()
        params, target = _params(depth, 1), _params(depth, 2)
        assert_chunked_equals_reference(
            lambda impl, case: lambda params, target, *args: run(impl, case[0], depth, params,
                                                                 target, args, reset, case[1]),
            (params, target, *args), ((1, None), (4, None), (16, None), (4, 10)),
            ("W0", "target", "k", "v", "q", "theta", "eta", "log_keep"), seed=3)


def test_a_silent_memory_stays_at_its_target():
    """theta = 0 over 4,096 tokens with alpha = 0.01: decaying toward the target the state is
    the target (reads unchanged); decaying toward zero it is 0.99^4096 ~ 1e-18 of W0. A zero
    target is the zero decay."""
    with jax.enable_x64(True):
        n = 4096
        rng = np.random.default_rng(4)
        k, q = (jnp.asarray(rng.normal(size=(n, D))) for _ in range(2))
        W0 = _params(1, 1)
        zeros, alpha = jnp.zeros(n), jnp.full(n, 0.01)
        kw = dict(model="linear", chunk_size=16)

        def scan(target, params0=W0, theta=zeros):
            return memory_scan(params0, (jnp.zeros((D, D)),), k, k, q, theta, zeros, alpha,
                               decay_target=target, **kw)

        reads, (P, _) = scan("initial")
        np.testing.assert_allclose(P[0], W0[0], rtol=1e-12)
        np.testing.assert_allclose(reads, q @ W0[0], rtol=1e-12)
        _, (P_zero, _) = scan("zero")
        assert float(jnp.max(jnp.abs(P_zero[0]))) < 1e-15
        theta = jnp.asarray(0.02 * rng.random(n))
        zero_w = (jnp.zeros((D, D)),)
        a, (Pa, _) = scan("initial", zero_w, theta)
        b, (Pb, _) = scan("zero", zero_w, theta)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)
        np.testing.assert_allclose(Pa[0], Pb[0], rtol=0, atol=1e-13)


def test_bad_combinations_get_one_clear_message():
    for fields, match in ((dict(decay_target="w0"), "decay_target: must be one of"),
                          (dict(decay_target="initial", gradient_at="previous_token",
                                memory_depth=1, use_momentum=False),
                           "'initial' needs gradient_at 'chunk_start'")):
        with pytest.raises(ValueError, match=match):
            MemoryConfig(d_model=8, **fields)
    with jax.enable_x64(True):
        (k, v, q, theta, _, _), _ = inputs()
        W = (jnp.zeros((D, D)),)
        zeros = jnp.zeros(T)
        with pytest.raises(ValueError, match="not implemented for gradient_at='previous_token'"):
            memory_scan(W, W, k, v, q, theta, zeros, zeros, model="linear", chunk_size=4,
                        gradient_at="previous_token", decay_target="initial")


def test_pallas_runs_chunked_for_it():
    with jax.enable_x64(True):
        args, reset = inputs()
        params, target = _params(1, 1), _params(1, 2)
        got = run("pallas", 4, 1, params, target, args, reset)
        want = run("chunked", 4, 1, params, target, args, reset)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)
