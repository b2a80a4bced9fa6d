"""memory_scan's contract: implementations agree (values and gradients), meta-gradients match
finite differences, vmap, resets, read modes, dispatch and input validation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _scan_problems import FAST_COMPILE, functional, problem
from titans_lm.memory import (IMPLEMENTATIONS, LinearMemory, MLPMemory, ResidualLN,
                              get_implementation, memory_read, memory_scan, register_implementation)

MODELS = {
    "linear": LinearMemory(),
    "mlp2": MLPMemory(depth=2, expansion=2.0),
    "mlp3": MLPMemory(depth=3, expansion=2.0),
}


def objective(weights, impl, model, chunk, *args, **kw):
    reads, (P, S) = memory_scan(*args, model=model, chunk_size=chunk, impl=impl, **kw)
    w_r, w_p, w_s = weights
    value = (jnp.sum(reads * w_r) + sum(jnp.sum(p * w) for p, w in zip(P, w_p))
             + sum(jnp.sum(s * w) for s, w in zip(S, w_s)))
    return value, (reads, P, S)


# one token, whole chunks of 16, and a ragged last chunk
@pytest.mark.parametrize("T", [1, 64, 100])
@pytest.mark.parametrize("name", list(MODELS))
def test_chunked_matches_reference_values_and_gradients(name, T):
    model = MODELS[name]
    with jax.enable_x64(True):
        args = problem(model, T)
        weights = functional(1, T, args[0])
        results = {}
        for impl in ("reference", "chunked"):
            fn = functools.partial(objective, weights, impl, model, 16)
            grad_fn = jax.jit(jax.grad(fn, argnums=tuple(range(8)), has_aux=True),
                              compiler_options=FAST_COMPILE)
            grads, outs = grad_fn(*args)
            results[impl] = (outs, grads)
        names = ["reads", "params_T", "momentum_T", "d_params0", "d_momentum0", "d_k", "d_v", "d_q",
                 "d_theta", "d_eta", "d_alpha"]
        flat = {impl: list(outs) + list(grads) for impl, (outs, grads) in results.items()}
        for label, ref, got in zip(names, flat["reference"], flat["chunked"]):
            for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
                scale = max(1.0, float(jnp.max(jnp.abs(a))))
                err = float(jnp.max(jnp.abs(a - b)))
                assert err <= 1e-10 * scale, f"{name} T={T} {label}: max abs error {err:.2e}"


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("model", [MLPMemory(depth=2, expansion=1.5, activation="gelu", bias=True),
                                   ResidualLN(LinearMemory())], ids=["mlp_bias_gelu", "residual_ln"])
def test_meta_gradients_match_central_finite_differences(impl, model):
    """Directional derivatives of the whole inner loop w.r.t. every input, against central FD:
    no stop_gradient may hide on the path that trains W_K, W_V, W_Q, the gates and W0."""
    with jax.enable_x64(True):
        T, chunk = 7, 3
        args = problem(model, T, d=3, seed=3, theta_max=0.4)
        weights = functional(4, T, args[0])
        value = lambda *a: objective(weights, impl, model, chunk, *a)[0]  # noqa: E731
        f = jax.jit(value, compiler_options=FAST_COMPILE)
        grads = jax.jit(jax.grad(value, argnums=tuple(range(8))), compiler_options=FAST_COMPILE)(*args)
        rng = np.random.default_rng(5)
        for i in range(8):
            direction = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape)), args[i])
            analytic = sum(float(jnp.sum(g * u)) for g, u in
                           zip(jax.tree.leaves(grads[i]), jax.tree.leaves(direction)))
            h = 1e-5
            shifted = lambda s: [jax.tree.map(lambda x, u: x + s * u, a, direction) if j == i else a  # noqa: E731
                                 for j, a in enumerate(args)]
            numeric = (float(f(*shifted(h))) - float(f(*shifted(-h)))) / (2 * h)
            assert abs(analytic) > 1e-6, f"input {i}: vanishing derivative, test would be vacuous"
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8), f"input {i}"


def test_vmap_over_batch_and_heads_equals_a_loop():
    model = MODELS["mlp2"]
    with jax.enable_x64(True):
        per = [[problem(model, 21, seed=10 * b + h) for h in range(3)] for b in range(2)]
        stacked = jax.tree.map(lambda *x: jnp.stack(x), *[jax.tree.map(lambda *y: jnp.stack(y), *row)
                                                           for row in per])
        fn = jax.jit(functools.partial(memory_scan, model=model, chunk_size=8))
        reads, (P, S) = jax.jit(jax.vmap(jax.vmap(fn)))(*stacked)
        for b in range(2):
            for h in range(3):
                r1, (P1, S1) = fn(*per[b][h])
                np.testing.assert_allclose(reads[b, h], r1, atol=1e-13)
                for x, y in zip(P + S, P1 + S1):
                    np.testing.assert_allclose(x[b, h], y, atol=1e-13)


def _null_outside(args, s, e):
    """The inputs with every token outside [s, e) a null token (theta = eta = alpha = 0: the state
    stays where it is and the momentum is 0): the document [s, e) alone at the same positions."""
    inside = (jnp.arange(args[2].shape[0]) >= s) & (jnp.arange(args[2].shape[0]) < e)
    gates = [jnp.where(inside, g, 0.0) for g in args[5:8]]
    return list(args[:5]) + gates


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_documents_starting_anywhere_equal_each_alone(impl):
    """Documents packed back to back, the second starting at every offset inside a chunk and a
    third of one token ending the row: each document's reads (and the last one's final state)
    equal the document alone at the same positions, built without any reset (null tokens around
    it, started from the reset target), to 1e-13; and no gradient reaches a document from another
    one's inputs."""
    model, b, T = MODELS["mlp2"], 8, 29
    with jax.enable_x64(True):
        args = problem(model, T, seed=1)
        w0 = model.init(jax.random.key(9), 4, 4, jnp.float64)   # the reset target (learned W0)
        zeros = tuple(jnp.zeros_like(p) for p in w0)
        scan = functools.partial(memory_scan, model=model, chunk_size=b, impl=impl)
        fn = jax.jit(scan, compiler_options=FAST_COMPILE)
        weights = jnp.asarray(np.random.default_rng(3).normal(size=(T, 4)))

        def later_docs(k, start, reset):   # a functional of the reads from `start` on
            reads = scan(args[0], args[1], k, *args[3:], reset=reset, reset_to=w0)[0]
            return jnp.sum(jnp.where(jnp.arange(T)[:, None] >= start, reads * weights, 0))
        grad_k = jax.jit(jax.grad(later_docs), compiler_options=FAST_COMPILE)
        for o in range(b):
            s = b + o
            docs = [(0, s), (s, T - 1), (T - 1, T)]
            reset = jnp.zeros(T, bool).at[s].set(True).at[T - 1].set(True)
            reads, (P, S) = fn(*args, reset=reset, reset_to=w0)
            for n, (s0, e0) in enumerate(docs):
                start = (args[0], args[1]) if n == 0 else (w0, zeros)
                alone, (Pa, Sa) = fn(*start, *_null_outside(args, s0, e0)[2:],
                                     reset=jnp.zeros(T, bool), reset_to=w0)
                np.testing.assert_allclose(reads[s0:e0], alone[s0:e0], atol=1e-13,
                                           err_msg=f"offset {o}, document {n}")
            for x, y in zip(P + S, Pa + Sa):
                np.testing.assert_allclose(x, y, atol=1e-13)
            g = grad_k(args[2], s, reset)
            assert float(jnp.max(jnp.abs(g[:s]))) == 0.0, f"offset {o}: gradient crosses a start"
            assert float(jnp.max(jnp.abs(g[s:]))) > 0


@pytest.mark.parametrize("options", [{}, {"running_mean": True}, {"read": "chunk_start"},
                                     {"log_keep": True, "surprise_max_norm": 0.5, "state_length": 19}],
                         ids=["plain", "running_mean", "chunk_start", "log_keep_clip_length"])
@pytest.mark.parametrize("name", ["linear", "mlp2"])
def test_starts_inside_chunks_chunked_matches_reference_values_and_gradients(name, options):
    """Document starts at several positions inside chunks (two in one chunk, one at a chunk's last
    token, one ending the row): chunked equals the token loop, reads, state and every gradient
    (reset target included), to 1e-10."""
    model, T = MODELS[name], 37
    options = dict(options)
    with jax.enable_x64(True):
        args = problem(model, T, seed=4)
        reset_to = model.init(jax.random.key(7), 4, 4, jnp.float64)
        reset = jnp.zeros(T, bool).at[jnp.array([3, 5, 15, 16, 22, 36])].set(True)
        if options.pop("log_keep", False):
            options["log_keep"] = jnp.log1p(-args[7])
        weights = functional(2, T, args[0])
        results = {}
        for impl in ("reference", "chunked"):
            def value(*a):
                return objective(weights, impl, model, 8, *a[:8], reset=reset, reset_to=a[8],
                                 **options)
            grad_fn = jax.jit(jax.grad(value, argnums=tuple(range(9)), has_aux=True),
                              compiler_options=FAST_COMPILE)
            results[impl] = grad_fn(*args, reset_to)
        for a, b in zip(jax.tree.leaves(results["reference"]), jax.tree.leaves(results["chunked"])):
            scale = max(1.0, float(jnp.max(jnp.abs(a))))
            assert float(jnp.max(jnp.abs(a - b))) <= 1e-10 * scale


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_chunk_start_read_uses_the_state_before_the_chunk(impl):
    model = MODELS["mlp2"]
    with jax.enable_x64(True):
        args = problem(model, 20, seed=6)
        reads, _ = memory_scan(*args, model=model, chunk_size=8, impl=impl, read="chunk_start")
        after, _ = memory_scan(*args, model=model, chunk_size=8, impl="reference")
        reference = jax.jit(functools.partial(memory_scan, model=model, chunk_size=8, impl="reference"))
        for start in (0, 8, 16):
            # The parameters after token start - 1: the reference with theta = eta = alpha = 0
            # after the prefix (the first such token clears the momentum, then nothing changes).
            cut = jnp.arange(20) < start
            _, (state, _) = reference(*args[:5], *(jnp.where(cut, g, 0) for g in args[5:]))
            if start == 0:
                state = args[0]
            want = memory_read(state, args[4][start:start + 8], model)
            np.testing.assert_allclose(reads[start:start + 8], want, atol=1e-13)
        assert float(jnp.max(jnp.abs(reads - after))) > 1e-3   # the two read modes differ


def test_float32_and_float64_dtypes():
    model = MODELS["linear"]
    with jax.enable_x64(True):
        args64 = problem(model, 10)
        args32 = jax.tree.map(lambda x: x.astype(jnp.float32), args64)
        r64, (P64, _) = memory_scan(*args64, model=model, chunk_size=4)
        r32, (P32, _) = memory_scan(*args32, model=model, chunk_size=4)
        assert r64.dtype == jnp.float64 and P64[0].dtype == jnp.float64
        assert r32.dtype == jnp.float32 and P32[0].dtype == jnp.float32
        np.testing.assert_allclose(r32, r64, atol=1e-5)


def test_registry_dispatch():
    calls = []
    reference = get_implementation("reference")

    def spy(*args, **kw):
        calls.append(kw["chunk_size"])
        return reference(*args, **kw)

    register_implementation("spy", spy)
    try:
        args = problem(MODELS["linear"], 3)  # float32 (x64 off)
        got = memory_scan(*args, model="linear", chunk_size=2, impl="spy")
        want = memory_scan(*args, model="linear", chunk_size=2, impl="reference")
        assert calls == [2]
        np.testing.assert_array_equal(got[0], want[0])
    finally:
        IMPLEMENTATIONS.pop("spy")


def test_bad_inputs_raise_clear_errors():
    args = problem(MODELS["linear"], 5)
    p0, m0, k, v, q, th, et, al = args
    call = functools.partial(memory_scan, model="linear", chunk_size=2)
    with pytest.raises(ValueError, match="unknown memory implementation 'cuda'"):
        call(*args, impl="cuda")
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        memory_scan(*args, model="linear", chunk_size=0)
    with pytest.raises(ValueError, match="read must be one of"):
        call(*args, read="before")
    with pytest.raises(ValueError, match=r"theta must be \[T\] = \[5\]"):
        call(p0, m0, k, v, q, th[:4], et, al)
    with pytest.raises(ValueError, match=r"v must be \[T, d_v\]"):
        call(p0, m0, k, v[:, :3], q, th, et, al)
    with pytest.raises(ValueError, match="k, v, q must be"):
        call(p0, m0, k[None], v, q, th, et, al)
    with pytest.raises(ValueError, match="momentum0 must have the structure"):
        call(p0, (m0[0][:3],), k, v, q, th, et, al)
    with pytest.raises(ValueError, match="params0 must be a tuple"):
        call(p0[0], m0, k, v, q, th, et, al)
    with pytest.raises(ValueError, match=r"reset must be \[T\]"):
        call(*args, reset=jnp.zeros(4, bool))
    with pytest.raises(ValueError, match="expected 2 parameter arrays"):
        memory_scan(p0, m0, k, v, q, th, et, al, model="mlp", chunk_size=2)
    with pytest.raises(ValueError, match="chunks_per_checkpoint"):
        call(*args, chunks_per_checkpoint=-1)


@pytest.mark.parametrize("impl", ["reference", "chunked", "pallas"])
def test_gates_out_of_range_raise_outside_jit(impl):
    model = MODELS["linear"]
    params0, momentum0, k, v, q, theta, eta, alpha = problem(model, 6)
    call = functools.partial(memory_scan, params0, momentum0, k, v, q, model=model, chunk_size=4,
                             impl=impl)
    for args, match in [((theta.at[2].set(-0.1), eta, alpha), r"theta must be >= 0 .*theta\[2\]"),
                        ((theta, eta.at[0].set(1.5), alpha), r"eta must be in \[0, 1\]"),
                        ((theta, eta, alpha.at[5].set(-1e-3)), r"alpha must be in \[0, 1\]"),
                        ((theta, eta, alpha.at[1].set(jnp.nan)), r"alpha must be in \[0, 1\]")]:
        with pytest.raises(ValueError, match=match):
            call(*args)
    with pytest.raises(ValueError, match=r"log_keep must be <= 0"):
        call(theta, eta, None, log_keep=jnp.full(6, 0.1))
    with pytest.raises(ValueError, match=r"theta must be >= 0"):   # with constant gates too
        call(theta.at[2].set(-0.1), None, None)
    # Edges are in range: theta = 0, eta and alpha exactly 0 and 1, log_keep = -inf.
    edge = call(theta.at[0].set(0.0), eta.at[1].set(1.0).at[2].set(0.0),
                alpha.at[3].set(1.0).at[4].set(0.0))[0]
    assert np.isfinite(np.asarray(edge)).all()
    # Under jit the values are not checked (documented: the layer's gates are in range by
    # construction).
    jax.jit(lambda th: call(th, eta, alpha)[0])(theta.at[2].set(-0.1))


def test_calls_outside_jit_compile_once_per_configuration(monkeypatch):
    """memory_scan outside jit runs one compiled program per (implementation, model, chunk size,
    read mode, static options, shapes): new values reuse it, a new chunk size compiles again."""
    from titans_lm.memory import scan as scan_module
    compiled = []
    real = scan_module._compiled.__wrapped__

    def counting(fn, static_names):
        jitted = real(fn, static_names)
        compiled.append(jitted)
        return jitted
    monkeypatch.setattr(scan_module, "_compiled", functools.lru_cache(maxsize=None)(counting))
    rng = np.random.default_rng(0)
    T, d = 24, 4
    for seed, chunk in ((0, 8), (1, 8), (2, 8), (3, 4)):
        rng = np.random.default_rng(seed)
        k, v, q = (jnp.asarray(rng.normal(size=(T, d)), jnp.float32) for _ in range(3))
        g = jnp.asarray(rng.uniform(0, 0.1, T), jnp.float32)
        memory_scan((jnp.eye(d),), (jnp.zeros((d, d)),), k, v, q, g, g, g, model="linear",
                    chunk_size=chunk, reset=jnp.zeros(T, bool).at[seed + 3].set(True),
                    state_length=seed + 5)
    assert len(compiled) == 1
    assert compiled[0]._cache_size() == 2     # chunk 8 once (three calls), chunk 4 once
