"""Throughput and memory of the memory engine's implementations (forward, forward + backward).

For each configuration (implementation x inner model x d x chunk size x T) prints one JSON object:
tokens/s and seconds per call (median and minimum over round-robin timing rounds, and the median
process CPU time) for the forward pass (reads and final state) and for forward + backward
(gradient of a scalar of the reads and final state with respect to every input), the compile
times, and the compiled program's memory from XLA's static buffer assignment
(``jax.jit(f).lower(...).compile().memory_analysis()``: temp = scratch buffers the program
allocates, i.e. its peak working memory beyond inputs and outputs). When the device reports
``memory_stats()`` (GPU, TPU), its ``peak_bytes_in_use`` after the run is added; CPU reports none.

Inputs are float32, one head (``--batch`` > 1 vmaps over independent sequences, as batch x heads),
unit-norm keys and queries, random gates. The MLP memory has depth 2, SiLU and hidden width
``--expansion`` x d. The reference runs once per (model, d, T): its cost does not depend on the
chunk size. The last lines summarise the chunked/reference speed-ups and the chunked cost per
token relative to the smallest T.

    python scripts/benchmark.py engine                          # a quick subset (about a minute)
    python scripts/benchmark.py engine --impls chunked --models mlp --d 64 --chunks 16 \
        --T 1024 4096 16384
    python scripts/benchmark.py engine --full                   # the whole grid (slow on CPU;
                                                                # reference only up to T=4096)
    python scripts/benchmark.py engine --impls chunked --starts none grid inside   # resets

``--starts`` adds document starts (the same in every row): on the chunk grid, or inside chunks
(docs/design.md#resets-inside-a-chunk); the summary gives each one's time relative to none.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from titans_lm.bench.inputs import STARTS, build_fns, document_starts, make_inputs
from titans_lm.bench.timing import Job, rounds, timing_fields
from titans_lm.memory import LinearMemory, MLPMemory


def compile_one(fn, args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    out = {"compile_s": round(time.perf_counter() - t0, 3)}
    mem = compiled.memory_analysis()
    if mem is not None:
        out["temp_bytes"] = int(mem.temp_size_in_bytes)
        out["argument_bytes"] = int(mem.argument_size_in_bytes)
        out["output_bytes"] = int(mem.output_size_in_bytes)
    job = Job(compiled, args)
    job.warm_up()
    return job, out


def main(argv=None):
    p = argparse.ArgumentParser(prog="benchmark.py engine", description=__doc__.splitlines()[0])
    p.add_argument("--impls", nargs="+", default=["reference", "chunked"])
    p.add_argument("--models", nargs="+", default=["linear", "mlp"], choices=["linear", "mlp"])
    p.add_argument("--d", nargs="+", type=int, default=[64])
    p.add_argument("--chunks", nargs="+", type=int, default=[16])
    p.add_argument("--T", nargs="+", type=int, default=[1024])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"], choices=["fwd", "fwd_bwd"])
    p.add_argument("--batch", type=int, default=1, help="independent sequences vmapped (batch x heads)")
    p.add_argument("--expansion", type=float, default=4.0, help="MLP hidden width / d")
    p.add_argument("--chunks-per-checkpoint", type=int, default=1,
                   help="chunked engine: chunks per remat group; 0 keeps every chunk's internals")
    p.add_argument("--starts", nargs="+", default=["none"], choices=STARTS,
                   help="document starts: none (one document), grid (every 4 chunks, at chunk "
                        "starts), inside (every 37 tokens, nearly all inside a chunk)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up call)")
    p.add_argument("--reference-max-T", type=int, default=4096,
                   help="skip the reference above this T: its backward stores the weights of every "
                        "token (MLP d=64: ~0.7 MB per token)")
    p.add_argument("--full", action="store_true",
                   help="the whole grid: d 64 128, chunks 16 64, T 1024 4096 16384, both impls")
    p.add_argument("--isolate", type=int, default=0, metavar="ROUNDS",
                   help="run each implementation in its own process, ROUNDS times, alternating "
                        "(each process times --repeats calls); the speed-ups then compare "
                        "processes that never shared an allocator (the reference's backward "
                        "allocates ~11 GB at MLP d=64, T=4096, and slows whatever runs after it in "
                        "the same process)")
    a = p.parse_args(argv)
    if a.full:
        a.d, a.chunks, a.T = [64, 128], [16, 64], [1024, 4096, 16384]
    if a.isolate:
        return isolated(a, argv if argv is not None else sys.argv[1:])

    # Compile everything first, then time in round-robin rounds: on a shared machine the load
    # drifts, and interleaving keeps the configurations comparable. Reported: the median and the
    # minimum over rounds of the wall time, and the median process CPU time.
    rows, jobs = [], []
    for impl in a.impls:
        for model_name in a.models:
            model = LinearMemory() if model_name == "linear" else MLPMemory(depth=2, expansion=a.expansion)
            for d in a.d:
                for chunk in a.chunks:
                    if impl == "reference" and chunk != a.chunks[0]:
                        continue  # the reference's cost does not depend on the chunk size
                    for T, starts in ((T, s) for T in a.T for s in a.starts):
                        if impl == "reference" and T > a.reference_max_T:
                            continue
                        args = make_inputs(model, a.batch, T, d)
                        options = {"chunks_per_checkpoint": a.chunks_per_checkpoint} if impl == "chunked" else {}
                        forward, fwd_bwd = build_fns(impl, model, chunk, options,
                                                     document_starts(starts, T, chunk))
                        row = {"impl": impl, "model": model_name, "d": d, "chunk": chunk, "T": T,
                               "batch": a.batch, "backend": jax.default_backend()}
                        if starts != "none":
                            row["starts"] = starts
                        if model_name == "mlp":
                            row["hidden"] = MLPMemory(expansion=a.expansion).hidden_width(d)
                        if impl == "chunked":
                            row["chunks_per_checkpoint"] = a.chunks_per_checkpoint
                        rows.append(row)
                        for mode in a.modes:
                            job, info = compile_one(forward if mode == "fwd" else fwd_bwd, args)
                            row[mode] = info
                            jobs.append((row, mode, job))
    rounds([job for _, _, job in jobs], a.repeats)
    for row, mode, job in jobs:
        row[mode].update(timing_fields(job.times, row["batch"] * row["T"]))
        row[mode]["cpu_seconds"] = round(float(np.median(job.cpu_times)), 5)
    stats = jax.devices()[0].memory_stats()
    for row in rows:
        if stats and "peak_bytes_in_use" in stats:
            row["device_peak_bytes"] = int(stats["peak_bytes_in_use"])
        print(json.dumps(row), flush=True)
    summarize(rows)


def _without_flag(argv, flag):
    """argv without ``flag`` (``--flag v ...`` or ``--flag=v``) and the values that follow it."""
    out, skipping = [], False
    for x in argv:
        if x == flag:
            skipping = True
            continue
        if skipping and not x.startswith("--"):
            continue
        skipping = False
        if not x.startswith(flag + "="):
            out.append(x)
    return out


def _child_env() -> dict:
    """This environment with the directory that holds this ``titans_lm`` first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


def isolated(a, argv):
    """``--isolate ROUNDS``: each round starts one process per implementation in turn (same grid,
    ``--impls`` that one); the rows merge every process's timed calls (median and minimum over all
    of them) and keep the first process's compile and memory figures."""
    base = _without_flag(_without_flag(argv, "--isolate"), "--impls")
    merged = {}
    for _ in range(a.isolate):
        for impl in a.impls:
            cmd = [sys.executable, "-m", __name__ if __name__ != "__main__" else "titans_lm.bench.engine",
                   *base, "--impls", impl]
            res = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
            if res.returncode != 0:
                print(json.dumps({"impl": impl, "error": res.stderr.strip()[-400:]}), flush=True)
                continue
            for line in res.stdout.splitlines():
                row = json.loads(line)
                if "impl" not in row:
                    continue
                key = tuple(row.get(k) for k in ("impl", "model", "d", "chunk", "T"))
                if key not in merged:
                    merged[key] = row
                    continue
                for mode in ("fwd", "fwd_bwd"):
                    if mode in row:
                        merged[key][mode]["seconds_all"] += row[mode]["seconds_all"]
    rows = list(merged.values())
    for row in rows:
        row["processes"] = a.isolate
        for mode in ("fwd", "fwd_bwd"):
            if mode in row:
                row[mode].update(timing_fields(row[mode]["seconds_all"], row["batch"] * row["T"]))
                row[mode].pop("cpu_seconds", None)       # per process; not merged
        print(json.dumps(row), flush=True)
    summarize(rows)
    return 0


def summarize(rows):
    """Speed-ups of chunked over reference and the chunked cost per token vs T (fwd_bwd)."""
    def find(**kw):
        return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]

    out = []
    for r in find(impl="chunked"):
        for ref in find(impl="reference", model=r["model"], d=r["d"], T=r["T"], starts=r.get("starts")):
            for mode in ("fwd", "fwd_bwd"):
                if mode in r and mode in ref:
                    out.append({"speedup": f"chunked/reference {mode}", "model": r["model"], "d": r["d"],
                                "chunk": r["chunk"], "T": r["T"],
                                "x_median": round(ref[mode]["seconds"] / r[mode]["seconds"], 2),
                                "x_min": round(ref[mode]["seconds_min"] / r[mode]["seconds_min"], 2)})
    for r in find(impl="chunked"):
        base = find(impl="chunked", model=r["model"], d=r["d"], chunk=r["chunk"],
                    T=min(x["T"] for x in rows), starts=r.get("starts"))
        if base and r["T"] != base[0]["T"]:
            for mode in ("fwd", "fwd_bwd"):
                if mode in r:
                    out.append({"scaling": f"chunked {mode} us/token T={r['T']} / T={base[0]['T']}",
                                "model": r["model"], "d": r["d"], "chunk": r["chunk"],
                                "ratio_median": round(r[mode]["us_per_token"] / base[0][mode]["us_per_token"], 3),
                                "ratio_min": round(r[mode]["us_per_token_min"] / base[0][mode]["us_per_token_min"], 3)})
    for r in rows:
        if r.get("starts"):
            for base in find(impl=r["impl"], model=r["model"], d=r["d"], chunk=r["chunk"], T=r["T"],
                             starts=None):
                for mode in ("fwd", "fwd_bwd"):
                    if mode in r and mode in base:
                        out.append({"starts": f"{r['impl']} {mode} seconds with {r['starts']} / none",
                                    "model": r["model"], "d": r["d"], "chunk": r["chunk"], "T": r["T"],
                                    "ratio_median": round(r[mode]["seconds"] / base[mode]["seconds"], 3),
                                    "ratio_min": round(r[mode]["seconds_min"] / base[mode]["seconds_min"], 3)})
    for o in out:
        print(json.dumps(o), flush=True)


if __name__ == "__main__":
    main()
