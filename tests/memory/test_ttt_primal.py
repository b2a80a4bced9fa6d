"""TTT-Linear and TTT-MLP in the engine against TTT's primal algorithm, token by token (float64).

The oracle here is written from the paper (Sun et al. 2024, arXiv:2407.04620, sec. 2.4-2.7 and
ttt-lm-jax's conventions), independently of the engine's dual form: for each mini-batch of b tokens
starting at W_start, token i = 1..b of the mini-batch takes its gradient at W_start of

    l_s(W) = 0.5 || LN(g(k_s; W)) - (v_s - k_s) ||^2         (LN scale and shift: outer-loop)

and the running mean of the learning-rate-weighted gradients so far,

    Gbar_i = Gbar_{i-1} + (eta_i g_i - Gbar_{i-1}) / i,   W_i = W_start - Gbar_i,
    z_i = q_i + LN(g(q_i; W_i)),                        eta_i = base_lr * sigmoid(a_i) / head_dim

and the next mini-batch starts at W_b. The engine gets the same problem in its own convention:
loss ||f(k) - v||^2 with f(x) = x + LN(g(x)), theta = ttt_engine_lr(base_lr, b) * sigmoid(a) /
head_dim, eta = alpha = 0, reads with ``running_mean=True``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.config.backbones import ttt_engine_lr
from titans_lm.memory import memory_scan
from titans_lm.memory.gates import ttt_theta
from titans_lm.memory.inner_models import LinearMemory, MLPMemory, ResidualLN

B_MINI = 16
N_MINI = 3
D = 8


def _ln(z, scale, shift):
    mu = z.mean(-1, keepdims=True)
    var = ((z - mu) ** 2).mean(-1, keepdims=True)
    return (z - mu) / jnp.sqrt(var + 1e-6) * scale + shift


def _g_linear(x, fast):
    W, b = fast
    return x @ W + b


def _g_mlp(x, fast):
    W1, b1, W2, b2 = fast
    return jax.nn.gelu(x @ W1 + b1, approximate=True) @ W2 + b2


def ttt_primal(g, fast0, ln, k, v, q, eta):
    """TTT's mini-batch GD token by token. Returns (reads [T, d], fast weights after each mini-batch)."""
    def loss(fast, k_s, v_s):
        return 0.5 * jnp.sum((_ln(g(k_s, fast), *ln) - (v_s - k_s)) ** 2)

    grad = jax.grad(loss)
    fast, reads, states = fast0, [], []
    for n in range(k.shape[0] // B_MINI):
        start = fast
        gbar = tuple(jnp.zeros_like(w) for w in start)
        for i in range(1, B_MINI + 1):
            t = n * B_MINI + i - 1
            g_t = grad(start, k[t], v[t])
            gbar = tuple(m + (eta[t] * gt - m) / i for m, gt in zip(gbar, g_t))
            W_i = tuple(w - m for w, m in zip(start, gbar))
            reads.append(q[t] + _ln(g(q[t], W_i), *ln))
        fast = W_i
        states.append(fast)
    return jnp.stack(reads), states


CASES = {
    "ttt_linear": (ResidualLN(LinearMemory(bias=True), fast_ln=False), _g_linear, 1.0),
    "ttt_mlp": (ResidualLN(MLPMemory(depth=2, expansion=4.0, activation="gelu_tanh", bias=True),
                           fast_ln=False), _g_mlp, 0.1),
}


def _problem(model, seed):
    rng = np.random.default_rng(seed)
    T = N_MINI * B_MINI
    params = model.init(jax.random.key(seed), D, D, jnp.float64)
    # non-trivial biases and LN scale/shift, so every parameter takes part
    params = tuple(p + 0.3 * jnp.asarray(rng.normal(size=p.shape)) for p in params)
    k, v, q = (jnp.asarray(rng.normal(size=(T, D))) for _ in range(3))
    pre = jnp.asarray(rng.normal(size=T))       # the learnable-lr pre-activation x w + b
    return params, k, v, q, pre


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reads_and_minibatch_states_match_ttt_primal(name, impl):
    model, g, base_lr = CASES[name]
    with jax.enable_x64(True):
        params, k, v, q, pre = _problem(model, seed=3)
        fast0, ln = params[:-2], params[-2:]
        eta = base_lr * jax.nn.sigmoid(pre) / D
        want_reads, want_states = ttt_primal(g, fast0, ln, k, v, q, eta)

        theta = ttt_theta(pre, ttt_engine_lr(base_lr, B_MINI), D)
        zeros = jnp.zeros_like(theta)
        momentum0 = tuple(jnp.zeros_like(p) for p in params)

        def run(T):
            return memory_scan(params, momentum0, k[:T], v[:T], q[:T], theta[:T], zeros[:T],
                               zeros[:T], model=model, chunk_size=B_MINI, impl=impl,
                               running_mean=True)

        reads, _ = run(N_MINI * B_MINI)
        read_err = float(jnp.max(jnp.abs(reads - want_reads)))
        state_err = 0.0
        for n in range(N_MINI):
            _, (P, S) = run((n + 1) * B_MINI)
            state_err = max(state_err, *(float(jnp.max(jnp.abs(a - b)))
                                         for a, b in zip(P[:-2], want_states[n])))
            for a, b in zip(P[-2:], ln):      # LN scale and shift: outer-loop, never written
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        print(f"\n{name} {impl}: max |read - TTT| = {read_err:.2e}, "
              f"max |state after each mini-batch - TTT| = {state_err:.2e}")
        assert read_err < 1e-12 and state_err < 1e-12
        # The reads differ measurably from the 1/b convention (the test can fail).
        reads_b, _ = memory_scan(params, momentum0, k, v, q, theta, zeros, zeros, model=model,
                                 chunk_size=B_MINI, impl=impl)
        assert float(jnp.max(jnp.abs(reads_b - want_reads))) > 1e-4


def test_outer_ln_parameters_get_gradients_only_from_the_outer_loss():
    model, _, base_lr = CASES["ttt_linear"]
    with jax.enable_x64(True):
        params, k, v, q, pre = _problem(model, seed=5)
        theta = ttt_theta(pre, ttt_engine_lr(base_lr, B_MINI), D)
        zeros = jnp.zeros_like(theta)
        momentum0 = tuple(jnp.zeros_like(p) for p in params)

        def outer(params, impl):
            reads, _ = memory_scan(params, momentum0, k, v, q, theta, zeros, zeros, model=model,
                                   chunk_size=B_MINI, impl=impl, running_mean=True)
            return jnp.sum(jnp.sin(reads))

        g_ref = jax.grad(outer)(params, "reference")
        g_chk = jax.grad(outer)(params, "chunked")
        for a, b in zip(g_ref, g_chk):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        assert all(float(jnp.max(jnp.abs(x))) > 0 for x in g_ref[-2:])
