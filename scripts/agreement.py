"""Agreement of the memory engine's implementations: max |difference| per quantity.

Two targets, one measure: the reads, the final parameters and momentum, and the gradients of a
random linear functional of (reads, final params, final momentum) with respect to every input,
compared quantity by quantity on random inputs (unit-norm keys and queries, random gates).

``engine``: ``--impl`` (default chunked) against ``reference``, in float64, for the linear memory
and the 2- and 3-layer MLP memories (gradients w.r.t. k, v, q, theta, eta, alpha, params0 and
momentum0). Prints a markdown table, then (``--json``) one JSON object per inner model, then the
worst difference.

    python scripts/agreement.py engine [--T 100] [--chunk 16] [--d 8] [--impl chunked] [--json]
        [--rule plain|omega|newton_schulz|atlas|lact]

``--rule`` picks the write (``RULES``): the plain rule (default), Atlas' Omega rule (a window of 20
tokens, more than a chunk, with random gates), Newton-Schulz momentum (5 steps), both (Atlas'
write), or LaCT's (SwiGLU fast weights only: the dot bias, chunk-start reads, the weight
normalisation).

``pallas``: ``impl="pallas"`` against ``impl="chunked"`` for the linear and the 2-layer MLP memory,
chunk sizes 16 (T = 40) and 64 (T = 150, so both end in a partial chunk), and both kernels (the
Triton kernel in Pallas' interpreter, ``interpret=True``, and the TPU kernel in the TPU
interpreter, ``pltpu.InterpretParams()``), with gradients also w.r.t. the reset target. A document
reset sits at the start of the last chunk; the backward pass saves the state every ``--group``
chunks (default 1: every saved state but the first comes from the kernel). Prints a markdown
table (``--json``: one JSON object per row); ``scale`` is the largest |value| among chunked's
outputs and gradients, for reading the errors relatively. On a machine with a GPU or TPU,
``--compiled`` runs the local lowering compiled instead of interpreted (matmuls at HIGHEST
precision on both sides).

    python scripts/agreement.py pallas [--d 16] [--group 1] [--x64] [--backends triton tpu]
        [--compiled] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory import LinearMemory, MLPMemory, SwiGLUMemory, memory_scan

QUANTITIES = ("reads", "params_T", "momentum_T", "d_k", "d_v", "d_q", "d_theta", "d_eta", "d_alpha",
              "d_params0", "d_momentum0", "d_reset_to")
ENGINE_QUANTITIES = QUANTITIES[:-1]
CONFIGS = ((16, 40), (64, 150))  # pallas: (chunk_size, T)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def engine_problem(model, T, d, seed):
    """float64 ``memory_scan`` arguments (params0, momentum0, k, v, q, theta, eta, alpha)."""
    rng = np.random.default_rng(seed)
    params0 = model.init(jax.random.key(seed), d, d, jnp.float64)
    momentum0 = tuple(0.05 * jnp.asarray(rng.normal(size=p.shape)) for p in params0)
    k, q = (jnp.asarray(_unit(rng.normal(size=(T, d)))) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, d)))
    theta = jnp.asarray(rng.uniform(0.0, 0.1, T))
    eta = jnp.asarray(rng.uniform(0.0, 1.0, T))
    alpha = jnp.asarray(rng.uniform(0.0, 0.05, T))
    return params0, momentum0, k, v, q, theta, eta, alpha


def pallas_problem(model, T, d, chunk, seed, dtype):
    """(arguments with the reset target last, reset mask): a reset at the last chunk's start."""
    rng = np.random.default_rng(seed)
    params0 = model.init(jax.random.key(seed), d, d, dtype)
    momentum0 = tuple(jnp.asarray(0.05 * rng.normal(size=p.shape), dtype) for p in params0)
    reset_to = model.init(jax.random.key(seed + 7), d, d, dtype)
    k, q = (jnp.asarray(_unit(rng.normal(size=(T, d))), dtype) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, d)), dtype)
    theta = jnp.asarray(rng.uniform(0.0, 0.2, T), dtype)
    eta = jnp.asarray(rng.uniform(0.0, 1.0, T), dtype)
    alpha = jnp.asarray(rng.uniform(0.0, 0.2, T), dtype)
    reset = np.zeros(T, bool)
    reset[((T - 1) // chunk) * chunk] = True      # the last chunk's first token
    return (params0, momentum0, k, v, q, theta, eta, alpha, reset_to), jnp.asarray(reset)


def outputs_and_grads(impl, model, chunk, args, weights, *, reset=None, options=None):
    """Outputs and gradients of ``sum(w * (reads, params_T, momentum_T))`` by quantity name.

    ``args``: the 8 ``memory_scan`` arguments, or 9 with the reset target (then ``reset`` is the
    mask and ``d_reset_to`` is included).
    """
    options = options or {}
    with_reset = len(args) == 9

    def objective(*a):
        extra = {"reset": reset, "reset_to": a[8]} if with_reset else {}
        reads, (P, S) = memory_scan(*a[:8], model=model, chunk_size=chunk, impl=impl, **extra,
                                    **options)
        w_r, w_p, w_s = weights
        value = (jnp.sum(reads * w_r) + sum(jnp.sum(p * w) for p, w in zip(P, w_p))
                 + sum(jnp.sum(s * w) for s, w in zip(S, w_s)))
        return value, (reads, P, S)

    grad_fn = jax.jit(jax.grad(objective, argnums=tuple(range(len(args))), has_aux=True))
    grads, (reads, P, S) = grad_fn(*args)
    names = ("d_params0", "d_momentum0", "d_k", "d_v", "d_q", "d_theta", "d_eta", "d_alpha",
             "d_reset_to")
    return {"reads": reads, "params_T": P, "momentum_T": S, **dict(zip(names, grads))}


def max_abs_diff(a, b):
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in pairs)


def max_abs(a):
    return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))


OMEGA = 20   # the window of the omega rules: longer than the default chunk
RULES = {   # name -> memory_scan options (gamma added per problem where "omega_window" is set)
    "plain": {},
    "omega": dict(omega_window=OMEGA),
    "newton_schulz": dict(ns_steps=5),
    "atlas": dict(omega_window=OMEGA, ns_steps=5),
    "lact": dict(attentional_bias="dot", read="chunk_start", fast_weight_norm=True),
}


def engine_rows(T=100, chunk=16, d=8, impl="chunked", seed=0, rule="plain"):
    """{model name: {quantity: (max |impl - reference|, max |reference|)}}, in float64."""
    models = {"linear": LinearMemory(), "mlp depth 2": MLPMemory(depth=2, expansion=2.0),
              "mlp depth 3": MLPMemory(depth=3, expansion=2.0)}
    if rule == "lact":
        models = {"swiglu": SwiGLUMemory(expansion=2.0)}
    rows = {}
    with jax.enable_x64(True):
        for name, model in models.items():
            args = engine_problem(model, T, d, seed)
            options = dict(RULES[rule])
            if "omega_window" in options:   # a window sums up to c gradients: theta / c keeps it stable
                options["gamma"] = jnp.asarray(np.random.default_rng(seed + 2).uniform(0, 1, T))
                args = args[:5] + (args[5] / OMEGA,) + args[6:]
            rng = np.random.default_rng(seed + 1)
            weights = (jnp.asarray(rng.normal(size=(T, d))),
                       tuple(jnp.asarray(rng.normal(size=p.shape)) for p in args[0]),
                       tuple(jnp.asarray(rng.normal(size=p.shape)) for p in args[0]))
            ref = outputs_and_grads("reference", model, chunk, args, weights, options=options)
            got = outputs_and_grads(impl, model, chunk, args, weights, options=options)
            rows[name] = {qn: (max_abs_diff(ref[qn], got[qn]), max_abs(ref[qn]))
                          for qn in ENGINE_QUANTITIES}
    return rows


def agreement_rows(d=16, group=1, x64=False, backends=("triton", "tpu"), compiled=False, seed=0):
    """One dict per (model, chunk, backend): max |pallas - chunked| per quantity, plus scale."""
    models = {"linear": LinearMemory(),
              "mlp (depth 2, x4, silu)": MLPMemory(depth=2, expansion=4.0)}
    rows = []
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        for name, model in models.items():
            for chunk, T in CONFIGS:
                args, reset = pallas_problem(model, T, d, chunk, seed, dtype)
                rng = np.random.default_rng(seed + 1)

                def like(xs):
                    return tuple(jnp.asarray(rng.normal(size=x.shape), dtype) for x in xs)
                weights = (jnp.asarray(rng.normal(size=(T, d)), dtype), like(args[0]),
                           like(args[0]))
                want = outputs_and_grads("chunked", model, chunk, args, weights, reset=reset,
                                         options={"chunks_per_checkpoint": group})
                for backend in backends:
                    options = {"backend": backend, "chunks_per_checkpoint": group,
                               "interpret": not compiled}
                    got = outputs_and_grads("pallas", model, chunk, args, weights, reset=reset,
                                            options=options)
                    row = {"model": name, "chunk": chunk, "T": T,
                           "kernel": f"{backend} ({'compiled' if compiled else 'interpret'})",
                           "dtype": jnp.dtype(dtype).name}
                    row.update({q: max_abs_diff(got[q], want[q]) for q in QUANTITIES})
                    row["scale"] = max(max_abs(want[q]) for q in QUANTITIES)
                    rows.append(row)
    return rows


def engine_main(argv) -> int:
    p = argparse.ArgumentParser(prog="agreement.py engine",
                                description="--impl against reference, float64")
    p.add_argument("--T", type=int, default=100)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--d", type=int, default=8)
    p.add_argument("--impl", default="chunked")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rule", choices=sorted(RULES), default="plain", help="the write (RULES)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = engine_rows(a.T, a.chunk, a.d, a.impl, a.seed, a.rule)
    print(f"{a.impl} vs reference, rule {a.rule}, float64, T={a.T}, chunk={a.chunk}, d_k=d_v={a.d}: "
          "max |difference| (max |reference value|)")
    print("| quantity | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for qn in ENGINE_QUANTITIES:
        print(f"| {qn} | " + " | ".join(f"{rows[m][qn][0]:.1e} ({rows[m][qn][1]:.1e})"
                                        for m in rows) + " |")
    if a.json:
        for m, r in rows.items():
            print(json.dumps({"model": m, "rule": a.rule, "T": a.T, "chunk": a.chunk, "d": a.d,
                              "impl": a.impl,
                              **{qn: r[qn][0] for qn in ENGINE_QUANTITIES}}))
    worst = max(v[0] for r in rows.values() for v in r.values())
    print(f"worst max |difference|: {worst:.2e}")
    return 0


def pallas_main(argv) -> int:
    p = argparse.ArgumentParser(prog="agreement.py pallas", description="pallas against chunked")
    p.add_argument("--d", type=int, default=16, help="head dim d_k = d_v")
    p.add_argument("--group", type=int, default=1, help="chunks_per_checkpoint")
    p.add_argument("--x64", action="store_true", help="float64 (Triton interpreter only)")
    p.add_argument("--backends", nargs="+", default=["triton", "tpu"])
    p.add_argument("--compiled", action="store_true", help="compile for the local accelerator")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    backends = [b for b in a.backends if not (a.x64 and b == "tpu")]
    rows = agreement_rows(a.d, a.group, a.x64, backends, a.compiled, a.seed)
    if a.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    head = ["model", "chunk", "T", "kernel"] + list(QUANTITIES) + ["scale"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [str(row[h]) if h in ("model", "chunk", "T", "kernel") else f"{row[h]:.1e}"
                 for h in head]
        print("| " + " | ".join(cells) + " |")
    return 0


TARGETS = {"engine": engine_main, "pallas": pallas_main}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in TARGETS:
        print(__doc__.strip() + f"\n\nusage: agreement.py {{{','.join(TARGETS)}}} [flags]",
              file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return TARGETS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
