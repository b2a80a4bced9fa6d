"""``reference``: the memory recurrence token by token with materialised weights (the oracle).

A lax.scan over tokens carries (P, S, P_start), where P_start is the state at the start of the
current chunk. At token t (Titans eqs. 12-14, mini-batch size b = chunk_size):

    if t % b == 0:  (P, S) <- (reset_to, 0) when reset[t];  P_start <- P
    G   = jax.grad(||f(k_t; .) - v_t||^2)(P_start)          # gradient at the chunk start
    G  *= min(1, surprise_max_norm / ||G||)    (only with surprise_max_norm > 0: the guard)
    S   = eta_t S - theta_t G
    P   = (1 - alpha_t) P + S
    y_t = f(q_t; P)      (read="after_write")   or   f(q_t; P_start)   (read="chunk_start")

The backward pass of this scan stores the carried weights at every token; it exists to be
obviously correct, not fast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titans_lm.memory.inner_models import InnerModel


def reference_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, *, model: InnerModel,
                   chunk_size: int, read: str, reset_to, surprise_max_norm: float = 0.0):
    """The ``reference`` implementation of :func:`titans_lm.memory.memory_scan` (validated inputs)."""
    zeros = tuple(jnp.zeros_like(m) for m in momentum0)
    grad_fn = jax.grad(model.loss)

    def step(carry, x):
        P, S, P_start = carry
        t, k_t, v_t, q_t, theta_t, eta_t, alpha_t, reset_t = x
        at_start = t % chunk_size == 0
        restart = at_start & reset_t
        P = tuple(jnp.where(restart, r, p) for r, p in zip(reset_to, P))
        S = tuple(jnp.where(restart, z, s) for z, s in zip(zeros, S))
        P_start = tuple(jnp.where(at_start, p, p_s) for p, p_s in zip(P, P_start))
        G = grad_fn(P_start, k_t[None], v_t[None])
        if surprise_max_norm > 0:
            norm = jnp.sqrt(sum(jnp.sum(g * g) for g in G))
            G = tuple(g * jnp.minimum(1.0, surprise_max_norm / jnp.maximum(norm, 1e-30)) for g in G)
        S = tuple(eta_t * s - theta_t * g for s, g in zip(S, G))
        P = tuple((1 - alpha_t) * p + s for p, s in zip(P, S))
        y = model.apply(P if read == "after_write" else P_start, q_t)
        return (P, S, P_start), y

    P0, S0 = tuple(params0), tuple(momentum0)
    xs = (jnp.arange(k.shape[0]), k, v, q, theta, eta, alpha, reset)
    (P, S, _), reads = jax.lax.scan(step, (P0, S0, P0), xs)
    return reads, (P, S)
