"""Newton-Schulz steps on the memory's momentum (Atlas' Muon rule, titans_lm/memory/newton_schulz.py),
in float64:

- the map is Muon's quintic iteration (a plain numpy loop), and 5 steps bring a random matrix's
  singular values near 1; a zero matrix maps to zero with finite derivatives;
- the reference token loop is the rule S_t = eta_t S_{t-1} - G_t, P_t = keep_t P_{t-1}
  + theta_t NS_5(S_t) (theta_t S_t for a bias), gradients at the chunk start (a plain loop);
- "chunked" (materialised per-token states) equals "reference" for memory depth 1 (with a bias)
  and 2, chunk sizes 1, 4, 16, documents starting inside chunks, both decay targets, the surprise
  clip and the state inside a chunk (state_length): reads, state and the gradients of every
  input, each chunk size with both backward modes;
- the straight-through backward changes the gradients, not the forward; ns_steps 0 is the
  engine without the rule whatever ns_gradient says; "pallas" runs "chunked" for it;
- bad combinations get one clear message.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import LinearMemory, memory_scan
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.newton_schulz import NS_COEFFICIENTS, newton_schulz, orthogonalise
from _scan_problems import assert_chunked_equals_reference, documents_problem, small_memory

T, D = 21, 4
STARTS = (6, 13, 14)   # document starts inside chunks of 4 and 16
MODELS = {1: LinearMemory(bias=True), 2: small_memory(2)}


def numpy_ns(x, steps):
    a, b, c = NS_COEFFICIENTS
    X = x / (np.linalg.norm(x) + 1e-7)
    tall = X.shape[0] > X.shape[1]
    X = X.T if tall else X
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def test_the_map_is_muons_quintic_iteration():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        batch = rng.normal(size=(3, 5, 8))          # wide
        tall = rng.normal(size=(8, 5)) * 100.0      # transposed inside; scale invariant
        got = newton_schulz(jnp.asarray(batch), 5)
        for g, x in zip(got, batch):
            np.testing.assert_allclose(g, numpy_ns(x, 5), rtol=0, atol=1e-12)
        np.testing.assert_allclose(newton_schulz(jnp.asarray(tall), 3), numpy_ns(tall, 3),
                                   rtol=0, atol=1e-12)
        sv = np.linalg.svd(np.asarray(newton_schulz(jnp.asarray(rng.normal(size=(32, 64))), 5)),
                           compute_uv=False)
        assert 0.6 < sv.min() and sv.max() < 1.25, sv   # near 1, not at 1 (Muon's coefficients)
        zero = jnp.zeros((4, 6))
        assert float(jnp.max(jnp.abs(newton_schulz(zero, 5)))) == 0
        g = jax.grad(lambda x: jnp.sum(jnp.sin(orthogonalise(x, 5))))(zero)
        assert np.all(np.isfinite(np.asarray(g)))


def test_the_reference_is_the_rule():
    """Chunk 4 (gradients at the chunk start) on a linear memory with a bias, by hand."""
    with jax.enable_x64(True):
        (k, v, q, theta, eta, log_keep), reset = documents_problem(T, D, STARTS, seed=1)
        rng = np.random.default_rng(2)
        W0, b0 = rng.normal(size=(D, D)) / 2, rng.normal(size=D)
        S0 = (0.1 * rng.normal(size=(D, D)), 0.1 * rng.normal(size=D))
        keep = np.exp(np.asarray(log_keep))
        k, v, q, theta, eta = map(np.asarray, (k, v, q, theta, eta))
        W, b, SW, Sb, want = W0, b0, *S0, []
        for t in range(T):
            if reset[t]:
                W, b, SW, Sb = W0, b0, np.zeros((D, D)), np.zeros(D)
            if t % 4 == 0 or reset[t]:
                W_start, b_start = W, b
            err = 2 * (k[t] @ W_start + b_start - v[t])     # d/dy of ||y - v||^2
            SW, Sb = eta[t] * SW - np.outer(k[t], err), eta[t] * Sb - err
            W = keep[t] * W + theta[t] * numpy_ns(SW, 5)
            b = keep[t] * b + theta[t] * Sb
            want.append(q[t] @ W + b)
        reads, (P, S) = memory_scan((W0, b0), S0, k, v, q, theta, eta, None, log_keep=log_keep,
                                    model=LinearMemory(bias=True), chunk_size=4, impl="reference",
                                    reset=reset, ns_steps=5)
        np.testing.assert_allclose(reads, np.stack(want), rtol=0, atol=1e-12)
        for got, w in zip(P + S, (W, b, SW, Sb)):
            np.testing.assert_allclose(got, w, rtol=0, atol=1e-12)


def _params(model, seed):
    return model.init(jax.random.key(seed), D, D, jnp.float64)


def run(impl, model, case, params, momentum, target, args, reset):
    chunk, state_length, decay_target, clip, ns_gradient = case
    k, v, q, theta, eta, log_keep = args
    clip = {"surprise_max_norm": clip} if clip else {}
    reads, (P, S) = memory_scan(params, momentum, k, v, q, theta, eta, None, log_keep=log_keep,
                                model=model, chunk_size=chunk, impl=impl, reset=reset,
                                reset_to=target, state_length=state_length,
                                decay_target=decay_target, ns_steps=5, ns_gradient=ns_gradient,
                                **clip)
    return reads, P + S


# (chunk size, state_length, decay_target, surprise_max_norm, ns_gradient): across the two
# depths every chunk size runs with both backward modes
CASES = ((1, None, "zero", 0.0, "exact"), (4, None, "initial", 0.0, "straight_through"),
         (16, None, "zero", 0.5, "exact"), (4, 10, "initial", 0.5, "straight_through"))
FLIPPED = {"exact": "straight_through", "straight_through": "exact"}


@pytest.mark.parametrize("depth", [1, 2])
def test_chunked_equals_the_token_loop(depth):
    """Depth 1 is a linear memory with a bias (a vector parameter: the plain write)."""
    with jax.enable_x64(True):
        model = MODELS[depth]
        args, reset = documents_problem(T, D, STARTS, seed=0, decay=0.3)
        params, target = _params(model, 1), _params(model, 2)
        momentum = tuple(0.1 * p for p in _params(model, 3))
        cases = CASES if depth == 1 else tuple(c[:4] + (FLIPPED[c[4]],) for c in CASES)
        assert_chunked_equals_reference(
            lambda impl, case: lambda params, momentum, target, *args: run(
                impl, model, case, params, momentum, target, args, reset),
            (params, momentum, target, *args), cases,
            ("W0", "S0", "target", "k", "v", "q", "theta", "eta", "log_keep"), seed=3)


def test_straight_through_changes_the_gradients_not_the_forward():
    with jax.enable_x64(True):
        model = MODELS[2]
        args, reset = documents_problem(T, D, STARTS, seed=4)
        params = _params(model, 1)
        momentum = tuple(map(jnp.zeros_like, params))

        def value(mode):
            def f(params, theta):
                reads, _ = run("chunked", model, (4, None, "zero", 0.0, mode), params, momentum,
                               params, (*args[:3], theta, *args[4:]), reset)
                return jnp.sum(jnp.sin(reads)), reads
            return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, args[3])

        (_, exact_reads), exact_g = value("exact")
        (_, st_reads), st_g = value("straight_through")
        np.testing.assert_array_equal(exact_reads, st_reads)
        for a, b in zip(jax.tree.leaves(exact_g), jax.tree.leaves(st_g)):
            assert float(jnp.max(jnp.abs(a - b))) > 1e-3 * float(jnp.max(jnp.abs(a)))


def test_zero_steps_is_the_engine_without_the_rule():
    with jax.enable_x64(True):
        model = MODELS[2]
        args, reset = documents_problem(T, D, STARTS, seed=5)
        k, v, q, theta, eta, log_keep = args
        params = _params(model, 1)
        momentum = tuple(0.1 * p for p in _params(model, 2))
        call = lambda impl, **kw: memory_scan(params, momentum, k, v, q, theta, eta, None,  # noqa: E731
                                              log_keep=log_keep, model=model, chunk_size=4,
                                              impl=impl, reset=reset, **kw)
        for impl in ("chunked", "reference"):
            want = call(impl)
            for mode in ("exact", "straight_through"):
                got = call(impl, ns_steps=0, ns_gradient=mode)
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                    np.testing.assert_array_equal(a, b)
            on = call(impl, ns_steps=5)
            assert float(jnp.max(jnp.abs(on[0] - want[0]))) > 1e-3   # the rule changes the reads


def test_pallas_runs_chunked_for_it():
    with jax.enable_x64(True):
        model = MODELS[1]
        args, reset = documents_problem(T, D, STARTS, seed=6)
        params = _params(model, 1)
        momentum = tuple(map(jnp.zeros_like, params))
        case = (4, None, "zero", 0.0, "exact")
        got = run("pallas", model, case, params, momentum, params, args, reset)
        want = run("chunked", model, case, params, momentum, params, args, reset)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)


def test_bad_combinations_get_one_clear_message():
    for fields, match in (
            (dict(ns_steps=-1), "ns_steps: must be an int >= 0"),
            (dict(ns_steps=True), "ns_steps: must be an int >= 0"),
            (dict(ns_gradient="ste"), "ns_gradient: must be one of"),
            (dict(ns_steps=5, read_running_mean=True), "ns_steps: > 0 .* read_running_mean False"),
            (dict(ns_steps=5, gradient_at="previous_token", memory_depth=1, use_momentum=False),
             "ns_steps: > 0 .* gradient_at 'chunk_start'")):
        with pytest.raises(ValueError, match=match):
            MemoryConfig(d_model=8, **fields)
    with jax.enable_x64(True):
        (k, v, q, theta, _, _), _ = documents_problem(T, D, STARTS)
        W = (jnp.zeros((D, D)),)
        zeros = jnp.zeros(T)
        call = lambda **kw: memory_scan(W, W, k, v, q, theta, zeros, zeros,  # noqa: E731
                                        model="linear", chunk_size=4, **kw)
        for kw, match in ((dict(ns_steps=2.5), "ns_steps must be an int >= 0"),
                          (dict(ns_steps=5, ns_gradient="identity"), "ns_gradient must be one of"),
                          (dict(ns_steps=5, gradient_at="previous_token"),
                           "needs gradient_at='chunk_start'"),
                          (dict(ns_steps=5, running_mean=True), "does not take running_mean")):
            with pytest.raises(ValueError, match=match):
                call(**kw)
