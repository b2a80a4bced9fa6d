"""Agreement of ``impl="pallas"`` with ``impl="chunked"``: max |difference| per quantity.

For the linear and the 2-layer MLP memory, chunk sizes 16 (T = 40) and 64 (T = 150, so both end in
a partial chunk), and both kernels (the Triton kernel in Pallas' interpreter, ``interpret=True``,
and the TPU kernel in the TPU interpreter, ``pltpu.InterpretParams()``): the reads, the final
parameters and momentum, and the gradients of a random linear functional of (reads, final params,
final momentum) with respect to k, v, q, theta, eta, alpha, params0, momentum0 and the reset target.
A document reset sits at the start of the last chunk; the backward pass saves the state every
``--group`` chunks (default 1: every saved state but the first comes from the kernel). Prints a
markdown table (``--json``: one JSON object per row); ``scale`` is the largest |value| among
chunked's outputs and gradients, for reading the errors relatively.

    python scripts/pallas_agreement.py [--d 16] [--group 1] [--x64] [--backends triton tpu]

On a machine with a GPU or TPU, ``--compiled`` runs the local lowering compiled instead of
interpreted (matmuls at HIGHEST precision on both sides).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory import LinearMemory, MLPMemory, memory_scan

QUANTITIES = ("reads", "params_T", "momentum_T", "d_k", "d_v", "d_q", "d_theta", "d_eta", "d_alpha",
              "d_params0", "d_momentum0", "d_reset_to")
CONFIGS = ((16, 40), (64, 150))  # (chunk_size, T)


def random_problem(model, T, d, chunk, seed, dtype):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    params0 = model.init(jax.random.key(seed), d, d, dtype)
    momentum0 = tuple(jnp.asarray(0.05 * rng.normal(size=p.shape), dtype) for p in params0)
    reset_to = model.init(jax.random.key(seed + 7), d, d, dtype)
    k, q = (jnp.asarray(unit(rng.normal(size=(T, d))), dtype) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, d)), dtype)
    theta = jnp.asarray(rng.uniform(0.0, 0.2, T), dtype)
    eta = jnp.asarray(rng.uniform(0.0, 1.0, T), dtype)
    alpha = jnp.asarray(rng.uniform(0.0, 0.2, T), dtype)
    reset = np.zeros(T, bool)
    reset[((T - 1) // chunk) * chunk] = True      # the last chunk's first token
    return (params0, momentum0, k, v, q, theta, eta, alpha, reset_to), jnp.asarray(reset)


def outputs_and_grads(impl, model, chunk, args, reset, weights, options):
    def objective(params0, momentum0, k, v, q, theta, eta, alpha, reset_to):
        reads, (P, S) = memory_scan(params0, momentum0, k, v, q, theta, eta, alpha, model=model,
                                    chunk_size=chunk, impl=impl, reset=reset, reset_to=reset_to,
                                    **options)
        w_r, w_p, w_s = weights
        value = (jnp.sum(reads * w_r) + sum(jnp.sum(p * w) for p, w in zip(P, w_p))
                 + sum(jnp.sum(s * w) for s, w in zip(S, w_s)))
        return value, (reads, P, S)

    grad_fn = jax.jit(jax.grad(objective, argnums=tuple(range(9)), has_aux=True))
    grads, (reads, P, S) = grad_fn(*args)
    g_p0, g_m0, g_k, g_v, g_q, g_th, g_et, g_al, g_r = grads
    return {"reads": reads, "params_T": P, "momentum_T": S, "d_k": g_k, "d_v": g_v, "d_q": g_q,
            "d_theta": g_th, "d_eta": g_et, "d_alpha": g_al, "d_params0": g_p0,
            "d_momentum0": g_m0, "d_reset_to": g_r}


def max_abs_diff(a, b):
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in pairs)


def max_abs(a):
    return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))


def agreement_rows(d=16, group=1, x64=False, backends=("triton", "tpu"), compiled=False, seed=0):
    """One dict per (model, chunk, backend): max |pallas - chunked| per quantity, plus scale."""
    models = {"linear": LinearMemory(),
              "mlp (depth 2, x4, silu)": MLPMemory(depth=2, expansion=4.0)}
    rows = []
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        for name, model in models.items():
            for chunk, T in CONFIGS:
                args, reset = random_problem(model, T, d, chunk, seed, dtype)
                rng = np.random.default_rng(seed + 1)
                def like(xs):
                    return tuple(jnp.asarray(rng.normal(size=x.shape), dtype) for x in xs)
                weights = (jnp.asarray(rng.normal(size=(T, d)), dtype), like(args[0]),
                           like(args[0]))
                want = outputs_and_grads("chunked", model, chunk, args, reset, weights,
                                         {"chunks_per_checkpoint": group})
                for backend in backends:
                    options = {"backend": backend, "chunks_per_checkpoint": group,
                               "interpret": not compiled}
                    got = outputs_and_grads("pallas", model, chunk, args, reset, weights, options)
                    row = {"model": name, "chunk": chunk, "T": T,
                           "kernel": f"{backend} ({'compiled' if compiled else 'interpret'})",
                           "dtype": jnp.dtype(dtype).name}
                    row.update({q: max_abs_diff(got[q], want[q]) for q in QUANTITIES})
                    row["scale"] = max(max_abs(want[q]) for q in QUANTITIES)
                    rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=16, help="head dim d_k = d_v")
    parser.add_argument("--group", type=int, default=1, help="chunks_per_checkpoint")
    parser.add_argument("--x64", action="store_true", help="float64 (Triton interpreter only)")
    parser.add_argument("--backends", nargs="+", default=["triton", "tpu"])
    parser.add_argument("--compiled", action="store_true", help="compile for the local accelerator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    backends = [b for b in a.backends if not (a.x64 and b == "tpu")]
    rows = agreement_rows(a.d, a.group, a.x64, backends, a.compiled, a.seed)
    if a.json:
        for row in rows:
            print(json.dumps(row))
        return
    head = ["model", "chunk", "T", "kernel"] + list(QUANTITIES) + ["scale"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [str(row[h]) if h in ("model", "chunk", "T", "kernel") else f"{row[h]:.1e}"
                 for h in head]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
