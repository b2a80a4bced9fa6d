"""The delta rule, Gated DeltaNet and the Hebbian (dot-bias) write on the one engine, in float64,
against token loops written from the papers' equations here (not the engine's reference):

- Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, eq. 10): W_t = a_t (I - beta_t k_t^T k_t)
  W_{t-1} + beta_t k_t^T v_t, o_t = q_t W_t; a_t = 1 gives DeltaNet (Schlag et al. 2021). The
  engine gets beta = 2 theta and log_keep = log a with gradient_at="previous_token".
- Linear attention (Katharopoulos et al. 2020): S_t = S_{t-1} + k_t^T v_t: the dot bias with
  theta = 1/2.

Outputs, final state and gradients (W0, k, v, q, theta and the decay) for impl "chunked" (WY form)
and "reference" (token loop) at chunk sizes 1, 4, 16, with documents starting inside chunks and a
carried state's ``state_length``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import LinearMemory, MLPMemory, memory_scan
from titans_lm.memory.config import MemoryConfig

T, D = 21, 4
STARTS = (6, 13, 14)   # document starts inside chunks of 4 and 16 (13, 14: two in a row)
ATOL = 1e-10


def delta_paper(W0, R0, k, v, q, beta, a, reset):
    """Gated DeltaNet token by token (jnp, differentiable): outputs [T, D] and the final W."""
    W, outs = W0, []
    for t in range(k.shape[0]):
        W = jnp.where(reset[t], R0, W)
        W = a[t] * (jnp.eye(D) - beta[t] * jnp.outer(k[t], k[t])) @ W + beta[t] * jnp.outer(k[t], v[t])
        outs.append(q[t] @ W)
    return jnp.stack(outs), W


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    k = rng.normal(size=(T, D))
    k /= np.linalg.norm(k, axis=1, keepdims=True)      # DeltaNet's l2-normalised keys
    q, v = rng.normal(size=(T, D)), rng.normal(size=(T, D))
    beta = 1 / (1 + np.exp(-rng.normal(size=T)))
    log_a = -0.3 * rng.random(T)
    W0, R0 = rng.normal(size=(D, D)), rng.normal(size=(D, D))
    reset = np.zeros(T, bool)
    reset[list(STARTS)] = True
    return [jnp.asarray(x) for x in (W0, R0, k, v, q, beta, log_a)] + [jnp.asarray(reset)]


def engine(impl, chunk, W0, R0, k, v, q, beta, log_a, reset, state_length=None):
    reads, ((W,), _) = memory_scan((W0,), (jnp.zeros_like(W0),), k, v, q, beta / 2,
                                   jnp.zeros(T), None, log_keep=log_a, model="linear",
                                   chunk_size=chunk, impl=impl, reset=reset, reset_to=(R0,),
                                   gradient_at="previous_token", state_length=state_length)
    return reads, W


def objective(fn, weights):
    def value(W0, R0, k, v, q, beta, log_a, reset):
        reads, W = fn(W0, R0, k, v, q, beta, log_a, reset)
        return jnp.sum(reads * weights[0]) + jnp.sum(W * weights[1])
    return jax.jit(jax.grad(value, argnums=tuple(range(7))))


@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated_deltanet"])
def test_delta_rule_equals_the_papers_recurrence(gated):
    with jax.enable_x64(True):
        args = inputs()
        if not gated:
            args[6] = jnp.zeros(T)
        rng = np.random.default_rng(1)
        weights = (jnp.asarray(rng.normal(size=(T, D))), jnp.asarray(rng.normal(size=(D, D))))
        want_o, want_W = delta_paper(*args[:5], args[5], jnp.exp(args[6]), args[7])
        want_g = objective(lambda *a: delta_paper(*a[:5], a[5], jnp.exp(a[6]), a[7]), weights)(*args)
        for impl in ("reference", "chunked"):
            for chunk in (1, 4, 16):
                o, W = engine(impl, chunk, *args)
                assert float(jnp.max(jnp.abs(o - want_o))) < ATOL, (impl, chunk)
                assert float(jnp.max(jnp.abs(W - want_W))) < ATOL, (impl, chunk)
                got_g = objective(lambda *a: engine(impl, chunk, *a), weights)(*args)
                names = ("W0", "R0", "k", "v", "q", "beta", "log_a")
                for name, g, w in zip(names, got_g, want_g):
                    if name == "log_a" and not gated:
                        continue
                    assert float(jnp.max(jnp.abs(g - w))) < ATOL * max(1, float(jnp.max(jnp.abs(w)))), \
                        (impl, chunk, name)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_state_length_returns_the_state_after_that_many_tokens(impl):
    with jax.enable_x64(True):
        args = inputs(2)
        a = jnp.exp(args[6])
        for L in (0, 3, 13, 16, T):
            _, W = engine(impl, 4, *args, state_length=L)
            cut = [x[:L] for x in (*args[2:6], a, args[7])]
            want = args[0] if L == 0 else delta_paper(args[0], args[1], *cut)[1]
            assert float(jnp.max(jnp.abs(W - want))) < ATOL, L


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_dot_bias_with_theta_half_is_the_hebbian_write(impl, chunk):
    """S_t = S_{t-1} + k_t^T v_t (Katharopoulos et al. 2020, no normaliser at the engine level),
    reads q_t S_t; a document start returns S to zero. Hand-computed with numpy."""
    with jax.enable_x64(True):
        _, _, k, v, q, _, _, reset = inputs(3)
        k, v, q, reset = (np.asarray(x) for x in (k, v, q, reset))
        S, want = np.zeros((D, D)), []
        for t in range(T):
            S = np.zeros((D, D)) if reset[t] else S
            S = S + np.outer(k[t], v[t])
            want.append(q[t] @ S)
        zero = jnp.zeros((D, D))
        reads, ((P,), _) = memory_scan((zero,), (zero,), k, v, q, jnp.full(T, 0.5), jnp.zeros(T),
                                       jnp.zeros(T), model="linear", chunk_size=chunk, impl=impl,
                                       reset=reset, attentional_bias="dot")
        np.testing.assert_allclose(reads, np.stack(want), rtol=0, atol=ATOL)
        np.testing.assert_allclose(P, S, rtol=0, atol=ATOL)


def test_dot_bias_chunked_equals_reference_for_a_deep_memory_with_gradients():
    """The bias module serves both engines: an MLP memory under the dot bias, gradients included."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(4)
        k, v, q = (jnp.asarray(rng.normal(size=(T, D))) for _ in range(3))
        model = MLPMemory(depth=2, expansion=1.5)
        P0 = model.init(jax.random.key(0), D, D, jnp.float64)
        theta = jnp.asarray(0.01 * rng.random(T))

        def run(impl, k, v, q, theta):
            reads, (P, _) = memory_scan(P0, tuple(map(jnp.zeros_like, P0)), k, v, q, theta,
                                        jnp.full(T, 0.5), jnp.full(T, 0.01), model=model,
                                        chunk_size=4, impl=impl, reset=jnp.asarray(inputs()[7]),
                                        attentional_bias="dot")
            return jnp.sum(reads ** 2) + sum(jnp.sum(p ** 3) for p in P)
        def grads(impl):
            return jax.jit(jax.grad(lambda *a: run(impl, *a), argnums=(0, 1, 2, 3)))(k, v, q, theta)
        ref, got = grads("reference"), grads("chunked")
        for a, b in zip(ref, got):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-9 * max(1, float(jnp.max(jnp.abs(a)))))


def test_bad_combinations_get_one_clear_message():
    with jax.enable_x64(True):
        W0, R0, k, v, q, beta, log_a, reset = inputs()
        zeros = (jnp.zeros((D, D)),)
        base = dict(model="linear", chunk_size=4, impl="chunked")
        with pytest.raises(ValueError, match="previous_token.*l2 bias"):
            memory_scan((W0,), zeros, k, v, q, beta, jnp.zeros(T), jnp.zeros(T),
                        gradient_at="previous_token", attentional_bias="dot", **base)
        with pytest.raises(ValueError, match="momentum"):
            memory_scan((W0,), zeros, k, v, q, beta, jnp.full(T, 0.5), jnp.zeros(T),
                        gradient_at="previous_token", **base)
        with pytest.raises(ValueError, match="linear memory without bias"):
            with_bias = (W0, jnp.zeros(D))
            memory_scan(with_bias, with_bias, k, v, q, beta, jnp.zeros(T), jnp.zeros(T),
                        gradient_at="previous_token", **{**base, "model": LinearMemory(bias=True)})
        with pytest.raises(ValueError, match="'chunked' and 'reference' only, not 'pallas'"):
            memory_scan((W0,), zeros, k, v, q, beta, jnp.zeros(T), jnp.zeros(T),
                        attentional_bias="dot", **{**base, "impl": "pallas"})
        with pytest.raises(ValueError, match="unknown attentional_bias"):
            memory_scan((W0,), zeros, k, v, q, beta, jnp.zeros(T), jnp.zeros(T),
                        attentional_bias="l3", **base)
    for fields, match in (
            (dict(gradient_at="previous_token"), "memory_depth 1.*use_momentum False"),
            (dict(gradient_at="previous_token", memory_depth=1, use_momentum=False,
                  impl="pallas"), "gradient_at: other than 'chunk_start'"),
            (dict(read_normalizer=True, memory_depth=1), "attentional_bias 'dot'.*elu1.*learned_w0"),
            (dict(attentional_bias="dot", impl="auto"), "chunked' and 'reference' only")):
        with pytest.raises(ValueError, match=match):
            MemoryConfig(d_model=8, **fields)
