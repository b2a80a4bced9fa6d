"""Float64 agreement of the memory engine's implementations: max |difference| per quantity.

Compares ``--impl`` (default chunked) against ``reference`` on random inputs (unit-norm keys and
queries, random gates) for the linear memory and the 2- and 3-layer MLP memories: the reads, the
final parameters and momentum, and the gradients of a random linear functional of (reads, final
params, final momentum) with respect to k, v, q, theta, eta, alpha, params0 and momentum0.
Prints a markdown table (and, with --json, one JSON object per inner model).

    python scripts/engine_agreement.py [--T 100] [--chunk 16] [--d 8] [--impl chunked]
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory import LinearMemory, MLPMemory, memory_scan

QUANTITIES = ("reads", "params_T", "momentum_T", "d_k", "d_v", "d_q", "d_theta", "d_eta", "d_alpha",
              "d_params0", "d_momentum0")


def random_problem(model, T, d, seed):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    params0 = model.init(jax.random.key(seed), d, d, jnp.float64)
    momentum0 = tuple(0.05 * jnp.asarray(rng.normal(size=p.shape)) for p in params0)
    k, q = (jnp.asarray(unit(rng.normal(size=(T, d)))) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, d)))
    theta = jnp.asarray(rng.uniform(0.0, 0.1, T))
    eta = jnp.asarray(rng.uniform(0.0, 1.0, T))
    alpha = jnp.asarray(rng.uniform(0.0, 0.05, T))
    return params0, momentum0, k, v, q, theta, eta, alpha


def outputs_and_grads(impl, model, chunk, args, weights):
    def objective(params0, momentum0, k, v, q, theta, eta, alpha):
        reads, (P, S) = memory_scan(params0, momentum0, k, v, q, theta, eta, alpha, model=model,
                                    chunk_size=chunk, impl=impl)
        w_r, w_p, w_s = weights
        value = (jnp.sum(reads * w_r) + sum(jnp.sum(p * w) for p, w in zip(P, w_p))
                 + sum(jnp.sum(s * w) for s, w in zip(S, w_s)))
        return value, (reads, P, S)

    grad_fn = jax.jit(jax.grad(objective, argnums=tuple(range(8)), has_aux=True))
    grads, (reads, P, S) = grad_fn(*args)
    g_p0, g_m0, g_k, g_v, g_q, g_th, g_et, g_al = grads
    return {"reads": reads, "params_T": P, "momentum_T": S, "d_k": g_k, "d_v": g_v, "d_q": g_q,
            "d_theta": g_th, "d_eta": g_et, "d_alpha": g_al, "d_params0": g_p0, "d_momentum0": g_m0}


def max_abs_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def max_abs(a):
    return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=100)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--impl", default="chunked")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()

    models = {"linear": LinearMemory(), "mlp depth 2": MLPMemory(depth=2, expansion=2.0),
              "mlp depth 3": MLPMemory(depth=3, expansion=2.0)}
    rows = {}
    with jax.enable_x64(True):
        for name, model in models.items():
            args = random_problem(model, a.T, a.d, a.seed)
            rng = np.random.default_rng(a.seed + 1)
            weights = (jnp.asarray(rng.normal(size=(a.T, a.d))),
                       tuple(jnp.asarray(rng.normal(size=p.shape)) for p in args[0]),
                       tuple(jnp.asarray(rng.normal(size=p.shape)) for p in args[0]))
            ref = outputs_and_grads("reference", model, a.chunk, args, weights)
            got = outputs_and_grads(a.impl, model, a.chunk, args, weights)
            rows[name] = {qn: (max_abs_diff(ref[qn], got[qn]), max_abs(ref[qn])) for qn in QUANTITIES}

    print(f"{a.impl} vs reference, float64, T={a.T}, chunk={a.chunk}, d_k=d_v={a.d}: "
          "max |difference| (max |reference value|)")
    print("| quantity | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for qn in QUANTITIES:
        print(f"| {qn} | " + " | ".join(f"{rows[m][qn][0]:.1e} ({rows[m][qn][1]:.1e})" for m in rows) + " |")
    if a.json:
        for m, r in rows.items():
            print(json.dumps({"model": m, "T": a.T, "chunk": a.chunk, "d": a.d, "impl": a.impl,
                              **{qn: r[qn][0] for qn in QUANTITIES}}))
    worst = max(v[0] for r in rows.values() for v in r.values())
    print(f"worst max |difference|: {worst:.2e}")


if __name__ == "__main__":
    main()
