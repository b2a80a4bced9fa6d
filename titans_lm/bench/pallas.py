"""Throughput of the memory scan: ``impl="pallas"`` (fused kernel) against ``impl="chunked"`` (XLA).

For each configuration (inner model x T x d x chunk size) and implementation: tokens/s of the
forward pass (reads and final state) and of forward + backward (gradient of a scalar of the reads
and final state with respect to k, v, q, theta, eta, alpha and the initial state), the compile
times, and the max |difference| between the two implementations' reads. ``--batch`` independent
sequences (batch x heads) run under ``jax.vmap``; inputs are float32, unit-norm keys and queries,
random gates (theta < 0.01, eta in (0.5, 0.9), alpha < 0.001); the MLP memory has depth 2, SiLU
and hidden width 4 d.

Timing: every implementation of a configuration is compiled and called once (warm-up) first, then
``--reps`` rounds call each of them once in turn (so load drift hits them alike), each call
synchronised with ``block_until_ready``; rows give the median (``fwd_s``, ``fwd_tok_s``...) and
the minimum (``fwd_s_min``, ``fwd_tok_s_max``...), speed-ups the ratio of the medians and of the
minima (``fwd_speedup``, ``fwd_speedup_min``...). Configurations run in order of priority (T = 16384 first, the MLP
before the linear memory, chunk 16 before 64) until ``--budget-s`` seconds have passed; the rest
are listed as skipped. A pallas row says whether the kernel ran (``kernel``) or the problem fell back to chunked
(``fallback``: the reason). ``--extra-precisions`` adds pallas rows with other data-matmul
precisions at T = 16384 ("default": TF32 on NVIDIA GPUs, what XLA uses for chunked's float32
matmuls by default; "tf32x3"). Prints one JSON object per measurement and writes them all, with
the environment and a speed-up summary, to ``--out`` (default: $OUT/benchmark_pallas.json when
OUT is set).

    python scripts/benchmark.py pallas                       # the device check's grid, 200 s budget
    python scripts/benchmark.py pallas --models linear --T 4096 --d 64 --chunks 16 --budget-s 60
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp

from titans_lm.bench.inputs import build_fns, make_inputs
from titans_lm.bench.timing import Job, median_min, rounds
from titans_lm.memory import LinearMemory, MLPMemory
from titans_lm.memory.pallas.plan import make_plan, resolve_backend

MODELS = {"mlp": MLPMemory(depth=2, expansion=4.0, activation="silu"), "linear": LinearMemory()}
T_PRIORITY = (16384, 4096, 65536)


def compile_job(fn, args) -> tuple[Job, float, object]:
    """(job, compile seconds, the warm-up call's output) of ``fn`` jitted on ``args``."""
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    job = Job(compiled, args)
    return job, compile_s, job.warm_up()


def configurations(models, Ts, ds, chunks):
    order = {t: i for i, t in enumerate(T_PRIORITY)}
    grid = [(m, T, d, c) for m in models for T in Ts for d in ds for c in chunks]
    # T = 16384 for every model first, then the rest; the MLP before the linear memory; chunk 16
    # (quick kernel compiles) before chunk 64; the larger head dim first.
    return sorted(grid, key=lambda x: (order.get(x[1], len(order)) > 0, models.index(x[0]),
                                       order.get(x[1], len(order)), x[3], -x[2]))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="benchmark.py pallas", description=__doc__.splitlines()[0])
    parser.add_argument("--impls", nargs="+", default=["chunked", "pallas"])
    parser.add_argument("--models", nargs="+", default=["mlp", "linear"], choices=sorted(MODELS))
    parser.add_argument("--T", nargs="+", type=int, default=list(T_PRIORITY))
    parser.add_argument("--d", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--batch", type=int, default=8,
                        help="independent sequences (batch x heads)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--precision", default="highest", help="pallas data-matmul precision")
    parser.add_argument("--extra-precisions", nargs="*", default=["default"],
                        help="more pallas precisions, measured at T = 16384")
    parser.add_argument("--chunks-per-checkpoint", type=int, default=1)
    parser.add_argument("--out", default=None)
    a = parser.parse_args(argv)
    out_path = a.out or (os.path.join(os.environ["OUT"], "benchmark_pallas.json")
                         if os.environ.get("OUT") else None)

    device = jax.devices()[0]
    env = {"jax": jax.__version__, "backend": jax.default_backend(), "device": device.device_kind,
           "batch": a.batch, "reps": a.reps, "pallas_precision": a.precision}
    print(json.dumps({"environment": env}), flush=True)
    start = time.perf_counter()
    results, skipped = [], []
    for name, T, d, chunk in configurations(a.models, a.T, a.d, a.chunks):
        if time.perf_counter() - start > a.budget_s:
            skipped.append({"model": name, "T": T, "d": d, "chunk": chunk})
            continue
        model = MODELS[name]
        # Gates in a range where the inner loop stays bounded over 65536 tokens.
        args = make_inputs(model, a.batch, T, d, theta_max=0.01, eta_range=(0.5, 0.9), alpha_max=0.001)
        reads = {}
        runs = [(impl, a.precision) for impl in a.impls]
        if "pallas" in a.impls and T == 16384:
            runs += [("pallas", p) for p in a.extra_precisions if p != a.precision]
        measured = []                      # (row, fwd job, fwd_bwd job) of every run that compiled
        for impl, precision in runs:
            options = {"chunks_per_checkpoint": a.chunks_per_checkpoint}
            label = impl
            row = {"impl": impl, "model": name, "T": T, "d": d, "chunk": chunk, "batch": a.batch}
            if impl == "pallas":
                options["precision"] = precision
                label = impl if precision == a.precision else f"pallas[{precision}]"
                backend, interpret = resolve_backend(None, None, jax.default_backend())
                plan = make_plan(model, tuple(p[0] for p in args[0]), jnp.float32, seq_len=T,
                                 chunk_size=chunk, read="after_write",
                                 chunks_per_checkpoint=a.chunks_per_checkpoint, backend=backend,
                                 interpret=interpret, precision=precision)
                row.update(impl=label, precision=precision, kernel=not isinstance(plan, str),
                           backend=backend, interpret=interpret)
                if isinstance(plan, str):
                    row["fallback"] = plan
            try:
                forward, forward_backward = (jax.jit(f) for f in build_fns(impl, model, chunk, options))
                fwd, c_fwd, out = compile_job(forward, args)
                reads[label] = out[0]
                fb, c_fb, _ = compile_job(forward_backward, args)
                row.update(compile_fwd_s=c_fwd, compile_fwd_bwd_s=c_fb)
                measured.append((row, fwd, fb))
            except Exception as e:  # noqa: BLE001  (report and go on with the next configuration)
                row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            results.append(row)
        try:
            rounds([job for _, fwd, fb in measured for job in (fwd, fb)], a.reps)
        except Exception as e:  # noqa: BLE001
            for row, _, _ in measured:
                row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            measured = []
        tokens = a.batch * T
        for row, fwd, fb in measured:
            (t_fwd, t_fwd_min), (t_fb, t_fb_min) = median_min(fwd.times), median_min(fb.times)
            row.update(fwd_tok_s=tokens / t_fwd, fwd_bwd_tok_s=tokens / t_fb, fwd_s=t_fwd,
                       fwd_bwd_s=t_fb, fwd_s_min=t_fwd_min, fwd_bwd_s_min=t_fb_min,
                       fwd_tok_s_max=tokens / t_fwd_min, fwd_bwd_tok_s_max=tokens / t_fb_min)
        for row in results[len(results) - len(runs):]:
            print(json.dumps(row), flush=True)
        if "chunked" in reads and "pallas" in reads:
            a_, b_ = reads["pallas"], reads["chunked"]
            diff = {"model": name, "T": T, "d": d, "chunk": chunk,
                    "max_abs_diff_reads": float(jnp.max(jnp.abs(a_ - b_))),
                    "max_abs_reads": float(jnp.max(jnp.abs(b_))),
                    "all_finite": bool(jnp.all(jnp.isfinite(a_)) & jnp.all(jnp.isfinite(b_)))}
            results.append(diff)
            print(json.dumps(diff), flush=True)

    speedups = []
    by_key = {(r["model"], r["T"], r["d"], r["chunk"], r["impl"]): r for r in results
              if "impl" in r and "error" not in r}
    for (name, T, d, chunk, impl), r in by_key.items():
        base = by_key.get((name, T, d, chunk, "chunked"))
        if impl.startswith("pallas") and base:
            speedups.append({"impl": impl, "model": name, "T": T, "d": d, "chunk": chunk,
                             "kernel": r.get("kernel"),
                             "fwd_speedup": r["fwd_tok_s"] / base["fwd_tok_s"],
                             "fwd_bwd_speedup": r["fwd_bwd_tok_s"] / base["fwd_bwd_tok_s"],
                             "fwd_speedup_min": base["fwd_s_min"] / r["fwd_s_min"],
                             "fwd_bwd_speedup_min": base["fwd_bwd_s_min"] / r["fwd_bwd_s_min"]})
    summary = {"environment": env, "results": results, "speedups": speedups, "skipped": skipped,
               "wall_s": time.perf_counter() - start}
    print(json.dumps({"speedups": speedups, "skipped": skipped}), flush=True)
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
