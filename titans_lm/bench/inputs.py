"""Inputs and functions shared by the memory-engine benchmarks (``scripts/benchmark.py engine``
and ``scripts/benchmark.py pallas``: :mod:`titans_lm.bench.engine`, :mod:`titans_lm.bench.pallas`):
random unit keys/queries, normal values and gates for ``memory_scan``, and the batched forward /
forward+backward functions that the benchmarks compile and time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory import memory_scan


def make_inputs(model, batch: int, T: int, d: int, *, seed: int = 0, theta_max: float = 0.1,
                eta_range: tuple = (0.5, 1.0), alpha_max: float = 0.01) -> tuple:
    """float32 ``memory_scan`` arguments for ``batch`` independent sequences of T tokens.

    Returns:
      (params0, momentum0, k, v, q, theta, eta, alpha): params0 the inner model's init broadcast
      to [batch, ...], momentum0 zeros, k and q [batch, T, d] unit rows, v [batch, T, d] normal,
      gates [batch, T] uniform in (0, theta_max), eta_range, (0, alpha_max).
    """
    rng = np.random.default_rng(seed)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    params0 = model.init(jax.random.key(seed), d, d, jnp.float32)
    params0 = tuple(jnp.broadcast_to(p, (batch,) + p.shape) for p in params0)
    momentum0 = tuple(jnp.zeros_like(p) for p in params0)
    k = jnp.asarray(unit(rng.normal(size=(batch, T, d))), jnp.float32)
    q = jnp.asarray(unit(rng.normal(size=(batch, T, d))), jnp.float32)
    v = jnp.asarray(rng.normal(size=(batch, T, d)), jnp.float32)
    theta = jnp.asarray(rng.uniform(0.0, theta_max, (batch, T)), jnp.float32)
    eta = jnp.asarray(rng.uniform(*eta_range, (batch, T)), jnp.float32)
    alpha = jnp.asarray(rng.uniform(0.0, alpha_max, (batch, T)), jnp.float32)
    return params0, momentum0, k, v, q, theta, eta, alpha


STARTS = ("none", "grid", "inside")


def document_starts(kind: str, T: int, chunk: int) -> np.ndarray | None:
    """bool [T] document starts for the benchmarks: "none" (None: one document), "grid" (every
    4 chunks, at chunk starts: documents padded to the grid) or "inside" (every 37 tokens: nearly
    all inside a chunk, documents packed back to back)."""
    if kind == "none":
        return None
    every = 4 * chunk if kind == "grid" else 37
    reset = np.zeros(T, bool)
    reset[every::every] = True
    return reset


def build_fns(impl: str, model, chunk: int, options: dict | None = None, reset=None):
    """(forward, forward_backward), not jitted, over a batch of :func:`make_inputs` arguments.

    forward returns ``(reads, (params_T, momentum_T))``; forward_backward returns the value and
    the gradients (w.r.t. all 8 arguments) of a scalar that uses the reads and the final state.
    ``reset``: optional bool [T] document starts, the same for every row.
    """
    options = dict(options or {})
    if reset is not None:
        options["reset"] = jnp.asarray(reset)

    def one(params0, momentum0, k, v, q, theta, eta, alpha):
        return memory_scan(params0, momentum0, k, v, q, theta, eta, alpha, model=model,
                           chunk_size=chunk, impl=impl, **options)

    batched = jax.vmap(one)

    def loss(*args):
        reads, (P, S) = batched(*args)
        return jnp.mean(reads ** 2) + sum(jnp.mean(p ** 2) for p in P) + sum(jnp.mean(s) for s in S)

    return batched, jax.value_and_grad(loss, argnums=tuple(range(8)))
