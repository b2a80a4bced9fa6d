"""``reference``: the memory recurrence token by token with materialised weights (the oracle).

A lax.scan over tokens carries (P, S, P_start), where P_start is the state at the start of the
current mini-batch. At token t (Titans eqs. 12-14, mini-batch size b = chunk_size):

    if reset[t]:                   (P, S) <- (reset_to, 0)   # a document starts, at any position
    if t % b == 0 or reset[t]:     P_start <- P              # a mini-batch starts
    G   = jax.grad(l(f(k_t; .), v_t))(P_start)              # gradient at the mini-batch start
          (gradient_at="previous_token": at (1 - alpha_t) P instead, Gated DeltaNet's order;
           l: the attentional bias, titans_lm.memory.biases, default ||f(k_t; .) - v_t||^2)
    G  *= min(1, surprise_max_norm / ||G||)    (only with surprise_max_norm > 0: the guard)
    S   = eta_t S - theta_t G
    P   = (1 - alpha_t) P + S                               (or exp(log_keep_t) P + S)
          (ns_steps = k > 0, Atlas' Muon rule: S = eta_t S - G, P = (1 - alpha_t) P
           + theta_t NS_k(S) per weight matrix, theta_t S per vector; titans_lm.memory.newton_schulz)
          (decay_target="initial": (1 - alpha_t) P + alpha_t reset_to + S)
    y_t = f(q_t; P)      (read="after_write")   or   f(q_t; P_start)   (read="chunk_start")
    if fast_weight_norm and t ends a mini-batch:             # LaCT's weight normalisation
        P <- normalize_fast_weights(P, reset_to)            # after the read of token t
          (t ends a mini-batch: t % b == b - 1, reset[t + 1], or t = T - 1)

A document start inside a chunk thus cuts that chunk in two mini-batches; the chunk grid (t % b)
stays where it is (docs/design.md#resets-inside-a-chunk).

With ``omega_window`` c > 1 (Atlas' Omega rule, docs/design.md#the-omega-rule) the scan also carries
the last c - 1 tokens (k, v, gamma, in-document flag; a document start clears the flags) and G is
the gradient of sum_j gamma_j l(f(k_j; .), v_j) over the window j = t - c + 1..t of t's
document, at P_start (each g_j clipped first where surprise_max_norm > 0); with
``omega_normalize`` divided by that window's sum_j gamma_j.

(see :func:`reference_scan` for outer-loop parameters and TTT's running-mean reads). With
``state_length`` L the scan also carries the state after token L - 1 (the initial state for
L = 0), which it returns instead of the final one (with ``fast_weight_norm`` normalised, as if
a mini-batch ended at L - 1; for L = 0 the initial state as given); the reads are those of all
T tokens.

The backward pass of this scan stores the carried weights at every token; it exists to be
obviously correct, not fast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titans_lm.memory.biases import DEFAULT_BIAS
from titans_lm.memory.inner_models import InnerModel
from titans_lm.memory.newton_schulz import write_direction
from titans_lm.memory.weight_norm import normalize_fast_weights
from titans_lm.memory.omega import tail_or_empty


def reference_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, *, model: InnerModel,
                   chunk_size: int, read: str, reset_to, running_mean: bool = False,
                   log_keep=None, state_length=None, surprise_max_norm: float = 0.0,
                   attentional_bias=DEFAULT_BIAS, gradient_at: str = "chunk_start",
                   decay_target: str = "zero", ns_steps: int = 0, ns_gradient: str = "exact",
                   fast_weight_norm: bool = False, omega_window: int = 1, gamma=None,
                   omega_tail=None, omega_normalize: bool = False):
    """The ``reference`` implementation of :func:`titans_lm.memory.memory_scan` (validated inputs).

    Outer-loop parameters of the model (``model.outer_params()``) are never updated. With
    ``log_keep`` the decay factor is exp(log_keep_t) instead of 1 - alpha_t. With ``running_mean``
    the scan also carries the gradient part (Pg, Sg) of the state since the chunk start (the same
    recurrence from (0, 0); the state is linear in it) and reads token t (position j in its chunk)
    through P + (b / (j + 1) - 1) Pg: the gradients so far weighted by 1 / (j + 1) instead of the
    1 / b in theta (TTT's running mean; j counts from the mini-batch start, a document start
    included). ``attentional_bias`` is the inner loss (:mod:`titans_lm.memory.biases`; a name
    or an ``AttentionalBias``).
    ``gradient_at="previous_token"`` takes token t's gradient at the decayed previous state
    (1 - alpha_t) P_{t-1} (after a reset: (1 - alpha_t) reset_to) instead of at P_start: online
    gradient descent in Gated DeltaNet's order. ``state_length`` is None or an int32 scalar in 0..T,
    possibly traced. ``surprise_max_norm > 0`` clips each token's gradient to that norm.
    ``decay_target="initial"`` decays the state toward ``reset_to`` instead of toward zero.
    ``ns_steps`` k > 0 keeps theta out of the momentum and writes theta_t NS_k(S) (a matrix) or
    theta_t S (a vector), NS_k differentiated as ``ns_gradient`` says
    (:mod:`titans_lm.memory.newton_schulz`).
    ``fast_weight_norm`` rescales the weight matrices to ``reset_to``'s column norms at every
    mini-batch end, after that token's read (:mod:`titans_lm.memory.weight_norm`).
    ``omega_window`` c > 1 takes ``gamma`` [T] and ``omega_tail`` (k [c - 1, d_k], v [c - 1, d_v],
    gamma [c - 1], valid bool [c - 1] of the tokens before token 0, or None: a fresh stream);
    ``omega_normalize`` divides each window's sum by its gates' sum.
    """
    zeros = tuple(jnp.zeros_like(m) for m in momentum0)
    grad_fn = jax.grad(lambda p, k_, v_: model.loss(p, k_, v_, attentional_bias))
    outer = model.outer_params()
    keep_all = 1 - alpha if log_keep is None else jnp.exp(log_keep)
    to_target = decay_target == "initial"
    T = k.shape[0]
    keep_until = T if state_length is None else state_length
    omega = omega_window > 1

    def clip(G):
        if surprise_max_norm <= 0:
            return G
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in G))
        return tuple(g * jnp.minimum(1.0, surprise_max_norm / jnp.maximum(norm, 1e-30)) for g in G)

    def window_gradient(base, ring, k_t, v_t, gamma_t, reset_t):
        """sum_j gamma_j g_j over the window (ring: the c - 1 previous tokens), and the ring
        after token t."""
        rk, rv, rg, rvalid = ring
        rvalid = rvalid & ~reset_t                    # a document start: earlier tokens leave
        wk = jnp.concatenate([rk, k_t[None]])
        wv = jnp.concatenate([rv, v_t[None]])
        w = jnp.concatenate([jnp.where(rvalid, rg, 0), gamma_t[None]])
        if omega_normalize:   # the gates-weighted mean of the window's gradients
            w = w / jnp.where(jnp.sum(w) > 0, jnp.sum(w), 1)
        per_token = jax.vmap(lambda k_, v_: clip(grad_fn(base, k_[None], v_[None])))(wk, wv)
        G = tuple(jnp.tensordot(w, g, axes=1) for g in per_token)
        ring = (wk[1:], wv[1:], jnp.concatenate([rg, gamma_t[None]])[1:],
                jnp.concatenate([rvalid, jnp.ones((1,), bool)])[1:])
        return G, ring

    def step(carry, x):
        (P, S, P_start, Pg, Sg, start, ring), (P_keep, S_keep) = carry
        t, k_t, v_t, q_t, theta_t, eta_t, keep_t, reset_t, ends_t, gamma_t = x
        at_start = (t % chunk_size == 0) | reset_t
        start = jnp.where(at_start, t, start).astype(start.dtype)
        P = tuple(jnp.where(reset_t, r, p) for r, p in zip(reset_to, P))
        S = tuple(jnp.where(reset_t, z, s) for z, s in zip(zeros, S))
        P_start = tuple(jnp.where(at_start, p, p_s) for p, p_s in zip(P, P_start))
        if gradient_at == "previous_token":
            base = tuple(p if i in outer else keep_t * p for i, p in enumerate(P))
        else:
            base = P_start
        if omega:
            G, ring = window_gradient(base, ring, k_t, v_t, gamma_t, reset_t)
        else:
            G = clip(grad_fn(base, k_t[None], v_t[None]))
        lr = 1 if ns_steps else theta_t        # Atlas: theta outside NS_k, on the write
        S = tuple(s if i in outer else eta_t * s - lr * g for i, (s, g) in enumerate(zip(S, G)))
        W = tuple(theta_t * write_direction(s, ns_steps, ns_gradient) for s in S) if ns_steps else S
        P = tuple(p if i in outer else keep_t * p + w + ((1 - keep_t) * r if to_target else 0)
                  for i, (p, w, r) in enumerate(zip(P, W, reset_to)))
        if running_mean:
            Pg = tuple(jnp.where(at_start, 0, p) for p in Pg)
            Sg = tuple(jnp.where(at_start, 0, s) for s in Sg)
            Sg = tuple(s if i in outer else eta_t * s - theta_t * g
                       for i, (s, g) in enumerate(zip(Sg, G)))
            Pg = tuple(p if i in outer else keep_t * p + s for i, (p, s) in enumerate(zip(Pg, Sg)))
            scale = chunk_size / (t - start + 1).astype(theta_t.dtype)
            P_read = tuple(p + (scale - 1) * g for p, g in zip(P, Pg))
        else:
            P_read = P
        y = model.apply(P_read if read == "after_write" else P_start, q_t)
        kept = t < keep_until
        if fast_weight_norm:
            P_normed = normalize_fast_weights(P, reset_to, outer)
            P_keep = tuple(jnp.where(kept, p, p_k) for p, p_k in zip(P_normed, P_keep))
            P = tuple(jnp.where(ends_t, n, p) for n, p in zip(P_normed, P))
        else:
            P_keep = tuple(jnp.where(kept, p, p_k) for p, p_k in zip(P, P_keep))
        S_keep = tuple(jnp.where(kept, s, s_k) for s, s_k in zip(S, S_keep))
        return ((P, S, P_start, Pg, Sg, start, ring), (P_keep, S_keep)), y

    P0, S0 = tuple(params0), tuple(momentum0)
    # the mini-batch ends: the chunk grid's, before a document start, and the sequence's end
    ends = ((jnp.arange(T) % chunk_size == chunk_size - 1)
            | jnp.concatenate([reset[1:], jnp.ones((1,), bool)]))
    xs = (jnp.arange(T), k, v, q, theta, eta, keep_all, reset, ends, gamma)
    ring = tail_or_empty(omega_tail, omega_window, k.shape[1], v.shape[1], k.dtype) if omega else ()
    carry0 = ((P0, S0, P0, zeros, zeros, jnp.zeros((), jnp.int32), ring), (P0, S0))
    ((P, S, _, _, _, _, _), kept), reads = jax.lax.scan(step, carry0, xs)
    return reads, ((P, S) if state_length is None else kept)
