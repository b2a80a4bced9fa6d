"""Benchmark the backbones' train step and forward: tokens/s, FLOPs, MFU, compile time, memory.

    python scripts/benchmark.py                                   # quick: tiny transformer + lmm, T 256 1K
    python scripts/benchmark.py --backbones all --T 256 1024 4096 16384 --png runs/bench.png
    python scripts/benchmark.py --backbones lmm --chunks 16 64 256 1024 --T 4096
    python scripts/benchmark.py --backbones lmm ttt_mlp --sizes 125m --T 4096 --abstract  # memory only
    python scripts/benchmark.py --backbones lmm --variants base: guard:memory.surprise_max_norm=1.0 \
        --vary memory.memory_depth=1,2,3,4          # the memory guard's cost at depths 1..4
    python scripts/benchmark.py engine ...     # the memory engine alone (titans_lm.bench.engine)
    python scripts/benchmark.py pallas ...     # pallas vs chunked (titans_lm.bench.pallas)
    python scripts/benchmark.py streaming ...  # carried-state streaming and decoding
                                               # (titans_lm.bench.streaming)

The first argument names the target; without one (or with ``model``) the backbones are
benchmarked as below. ``python scripts/benchmark.py TARGET --help`` lists a target's flags.

Grid: backbone (``configs/<name>.py``) x size x memory impl x chunk size x T, at batch ``--batch``
(one document per row, random tokens). Every configuration is compiled first (lower and compile
timed apart); then the timing runs in ``--repeats`` round-robin rounds, each round calling every
configuration once (train step, then forward) and large float32 matmuls (``--peak_n``; the
machine's measured peak is the best rate any of them reached), so that load drift on a shared
machine hits every configuration alike.
Reported per configuration (one JSON object per line, on stdout and in ``--out``):

- ``flops_per_token``: the analytic forward count (``titans_lm.models.flops``: ``fwd_model`` the
  architecture's matmuls with causal attention, ``fwd_executed`` what this implementation computes,
  the parts, and ``train_*`` = 3x forward), and ``xla_flops_per_token`` (XLA's ``cost_analysis``
  of the compiled train step and forward, for comparison: it counts elementwise work and remat's
  recomputation, and a loop body (the memory's chunk scan, MAC's segments) once);
- ``train`` / ``fwd``: ``lower_s``, ``compile_s``, ``step_s`` (median) and ``step_s_min``,
  ``tokens_per_s`` (median) and ``tokens_per_s_max`` (from the minimum), ``mfu`` (model FLOPs / s
  of the median over the peak), ``mfu_best`` (of the minimum), ``mfu_executed`` (executed FLOPs
  of the median), and ``memory``: XLA's compiled
  memory analysis (argument, output, temp, alias, generated-code bytes; ``peak_estimate_bytes`` =
  argument + output + temp - alias, the device memory the program needs);
- ``max_rss_bytes``: the process's peak resident memory after the configuration's compile and
  warm-up (getrusage; it only grows, so it bounds every configuration compiled before it).

With more than one ``--variants`` (model-field changes, timed in the same rounds), a line
``"summary": "variants"`` per variant and configuration compares it with the first variant of the
same configuration (and the same ``--vary`` point): ``x_median`` and ``x_min`` = the variant's
step time over the first's, of the medians and of the minima (1.05: 5% slower). ``--vary
FIELD=V1,V2,...`` (repeatable) crosses every variant with those values of a model field.
The last line (``"summary": "peak"``) gives the peak and each matmul's median and max GFLOP/s.
``--png`` draws tokens/s against T (log-log, one panel per mode, one line per backbone and chunk
size) and MFU against T.

``--abstract``: compile the train step against abstract inputs only (no state is allocated, nothing
runs) and report its memory analysis: how the paper sizes fit an accelerator (``--fit_gib``).
The train step is compiled as training compiles it (with the options under which ``model.remat``
holds on the CPU, :func:`titans_lm.models.remat.compiler_options`), so the estimate shows the
policy.

Sizes: ``tiny`` or a config size; ``125m`` means the Transformer++ 125m and, for the memory
backbones (whose smallest paper size is 170m), their ``170m``. ``--chunks`` overrides
``model.memory.chunk_size`` (MAC's ``segment_len`` is raised to the chunk size when smaller).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import math
import os
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from titans_lm.bench.output import emit  # noqa: E402
from titans_lm.bench.timing import (Job, lower_and_compile, matmul_rates, max_rss_bytes,  # noqa: E402
                                    peak_job, ratios, rounds, xla_flops)
from titans_lm.config import load  # noqa: E402
from titans_lm.train.plot import pyplot  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BACKBONES = ("transformer", "swa", "ttt_linear", "ttt_mlp", "lmm", "mac", "mag", "mal",
             "linear_attention", "deltanet", "gated_deltanet", "lact")
MEMORY_BACKBONES = BACKBONES[2:]
TARGETS = {"engine": "titans_lm.bench.engine", "pallas": "titans_lm.bench.pallas",
           "streaming": "titans_lm.bench.streaming"}


def load_config(backbone: str, size: str):
    """``get_config(size)`` of ``configs/<backbone>.py`` (``125m`` -> ``170m`` for memory backbones)."""
    if size == "125m" and backbone in MEMORY_BACKBONES:
        size = "170m"
    return load(ROOT / "configs" / f"{backbone}.py", size)  # FileNotFoundError naming a missing file


def parse_variant(spec: str) -> tuple[str, dict]:
    """``"NAME:field=value,field=value"`` (model fields, dotted below ``model``, e.g.
    ``guard:memory.surprise_max_norm=1.0``) -> ``(NAME, {field: value})``; values are Python
    literals (a bare word is a string). ``""`` is the configuration as it is.

    Raises:
      ValueError: a malformed spec.
    """
    if not spec:
        return "", {}
    name, _, body = spec.partition(":")
    changes = {}
    for item in filter(None, body.split(",")):
        field, eq, value = item.partition("=")
        if not eq or not field:
            raise ValueError(f"--variants {spec!r}: expected NAME:field=value[,field=value]")
        try:
            changes[field] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            changes[field] = value
    return name, changes


def apply_changes(model_cfg, changes: dict) -> None:
    """Set each dotted model field of ``changes`` (from :func:`parse_variant`).

    Raises:
      ValueError: a field the model config does not have.
    """
    for field, value in changes.items():
        *path, last = field.split(".")
        node = model_cfg
        for part in path:
            node = node[part] if part in node else None
            if node is None:
                break
        if node is None or last not in node:
            raise ValueError(f"model config has no field {field!r}")
        node[last] = value


def setup(backbone: str, size: str, T: int, B: int, *, impl: str | None, chunk: int | None,
          remat: str | None, dtype: str | None, modes: list[str], abstract: bool,
          variant: tuple[str, dict] = ("", {})):
    """Build and compile one configuration. Returns (row, jobs)."""
    from titans_lm.models.flops import count_flops
    from titans_lm.train import sharding as shd
    from titans_lm.train.optimizer import make_optimizer
    from titans_lm.train.state import (abstract_state, count_params, init_state, model_fns,
                                       state_shardings)
    from titans_lm.train.step import jit_train_step

    cfg = load_config(backbone, size)
    m = cfg.model
    if backbone in MEMORY_BACKBONES:
        if impl:
            m.memory.impl = impl
        if chunk:
            m.memory.chunk_size = chunk
            if backbone == "mac" and m.segment_len % chunk:
                m.segment_len = max(chunk, math.ceil(m.segment_len / chunk) * chunk)
    apply_changes(m, variant[1])
    if remat:
        m.remat = remat
    if dtype:
        cfg.train.compute_dtype = m.dtype = dtype
    cfg.train.batch_size, cfg.data.seq_len, cfg.train.grad_accum = B, T, 1
    row = {"backbone": backbone, "size": m.get("size", size), "T": T, "batch": B,
           "impl": m.memory.impl if "memory" in m else None,
           "chunk": int(m.memory.chunk_size) if "memory" in m else None,
           "segment_len": int(m.segment_len) if "segment_len" in m else None,
           "remat": m.get("remat", "none"), "dtype": cfg.train.compute_dtype,
           "platform": jax.devices()[0].platform, "variant": variant[0]}
    fc = count_flops(m, T).per_token()
    row["flops_per_token"] = {k: (round(v) if not isinstance(v, dict) else
                                  {p: round(x) for p, x in v.items()}) for k, v in fc.items()}
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    fns = model_fns(m)
    row["n_params"] = count_params(fns)
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    spec = {k: jax.ShapeDtypeStruct((B, T + 1), np.int32, sharding=shd.batch_sharding(mesh))
            for k in ("tokens", "segment_ids")}
    rng = np.random.default_rng(0)
    batch = shd.put_batch({"tokens": rng.integers(4, m.vocab_size, (B, T + 1), dtype=np.int32),
                           "segment_ids": np.ones((B, T + 1), np.int32)}, mesh) if not abstract else None
    jobs = {}
    xla = {}
    if "train" in modes:
        step_fn = jit_train_step(fns, tx, schedule, state_shardings(fns, tx, mesh), mesh,
                                 compute_dtype=cfg.train.compute_dtype, remat=m.get("remat", "none"))
        row["train"], compiled = lower_and_compile(step_fn, abstract_state(fns, tx, mesh), spec)
        xla["train"] = xla_flops(compiled)
        if not abstract:
            state = init_state(m, fns, tx, mesh, seed=0)
            jobs["train"] = Job(compiled, (state, batch), carry_state=True)
    if "fwd" in modes:
        from titans_lm.train.step import cast_floats  # the train step's own cast
        cdt = jnp.dtype(cfg.train.compute_dtype)

        def forward(params, tokens, seg):
            p = cast_floats(params, cdt)
            return fns.apply(p, tokens, seg, fns.init_state(p, tokens.shape[0]))[0]

        tok_spec = jax.ShapeDtypeStruct((B, T), np.int32)
        row["fwd"], compiled = lower_and_compile(jax.jit(forward), fns.abstract_params(),
                                                 tok_spec, tok_spec)
        xla["fwd"] = xla_flops(compiled)
        if not abstract:
            params = (jax.tree.map(jnp.copy, jobs["train"].args[0].params) if "train" in jobs
                      else init_state(m, fns, tx, mesh, seed=0).params)  # the step donates its own
            jobs["fwd"] = Job(compiled, (params, batch["tokens"][:, :-1], batch["segment_ids"][:, :-1]),
                              carry_state=False)
    row["xla_flops_per_token"] = {k: (round(v / (B * T)) if v else None) for k, v in xla.items()}
    for job in jobs.values():
        job.warm_up()
    row["max_rss_bytes"] = max_rss_bytes()
    return row, jobs


def finish(row: dict, jobs: dict, peak_flops: float) -> None:
    tokens = row["batch"] * row["T"]
    fpt = row["flops_per_token"]
    for mode, job in jobs.items():
        med, lo = statistics.median(job.times), min(job.times)
        kind = "train" if mode == "train" else "fwd"
        r = row[mode]
        r.update({"step_s": round(med, 5), "step_s_min": round(lo, 5),
                  "tokens_per_s": round(tokens / med, 1), "tokens_per_s_max": round(tokens / lo, 1),
                  "mfu": round(fpt[f"{kind}_model"] * tokens / med / peak_flops, 4),
                  "mfu_best": round(fpt[f"{kind}_model"] * tokens / lo / peak_flops, 4),
                  "mfu_executed": round(fpt[f"{kind}_executed"] * tokens / med / peak_flops, 4)})


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    modes = [m for m in ("train", "fwd") if any("tokens_per_s" in r.get(m, {}) for r in rows)]
    fig, axes = plt.subplots(1, len(modes) + 1, figsize=(6 * (len(modes) + 1), 4.5))
    axes = np.atleast_1d(axes)
    series = {}
    for r in rows:
        key = (r["backbone"], r["size"], r["chunk"], r["impl"])
        series.setdefault(key, []).append(r)
    for key, rs in sorted(series.items(), key=lambda kv: str(kv[0])):
        rs = sorted(rs, key=lambda r: r["T"])
        label = f"{key[0]}:{key[1]}" + (f" c{key[2]}" if key[2] else "") + \
                (f" {key[3]}" if key[3] and key[3] != "chunked" else "")
        for ax, mode in zip(axes, modes):
            pts = [(r["T"], r[mode]["tokens_per_s"]) for r in rs if "tokens_per_s" in r.get(mode, {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        pts = [(r["T"], 100 * r["train"]["mfu"]) for r in rs if "mfu" in r.get("train", {})]
        if pts:
            axes[-1].plot(*zip(*pts), marker="o", label=label)
    for ax, mode in zip(axes, modes):
        ax.set(xscale="log", yscale="log", xlabel="T (tokens)", ylabel="tokens/s",
               title=f"{mode} ({'fwd+bwd+AdamW' if mode == 'train' else 'forward'})")
        ax.grid(True, which="both", alpha=0.3)
    axes[-1].set(xscale="log", xlabel="T (tokens)", ylabel="MFU (% of measured matmul peak)",
                 title="train-step MFU (model FLOPs)")
    axes[-1].grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"titans_lm on {rows[0]['platform']} (batch {rows[0]['batch']})")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", nargs="+", default=["transformer", "lmm"],
                   help=f"names from {BACKBONES} or 'all'")
    p.add_argument("--sizes", nargs="+", default=["tiny"], help="tiny, 125m or any config size")
    p.add_argument("--T", nargs="+", type=int, default=[256, 1024])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--impls", nargs="+", default=[None], help="memory impl(s) (default: the config's)")
    p.add_argument("--chunks", nargs="+", type=int, default=[None], help="memory chunk size(s)")
    p.add_argument("--remat", default=None, help="model.remat policy (titans_lm.models.remat)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--variants", nargs="+", default=[""],
                   help="model-field variants timed side by side, NAME:field=value[,...], e.g. "
                        "base: guard:memory.surprise_max_norm=1.0 ('' or NAME: = as configured)")
    p.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="cross every variant with these values of a model field, e.g. "
                        "memory.memory_depth=1,2,3,4 (repeatable)")
    p.add_argument("--modes", nargs="+", default=["train", "fwd"], choices=["train", "fwd"])
    p.add_argument("--repeats", type=int, default=3, help="round-robin timing rounds")
    p.add_argument("--peak_n", nargs="+", type=int, default=[1024, 2048],
                   help="sides of the peak-measuring float32 matmuls (peak: the best rate seen)")
    p.add_argument("--abstract", action="store_true", help="compile only; report memory")
    p.add_argument("--fit_gib", type=float, default=80.0, help="--abstract: device memory to fit")
    p.add_argument("--out", default=None, help="JSON lines file (appended)")
    p.add_argument("--png", default=None, help="plot file")
    a = p.parse_args(argv)
    if a.backbones == ["all"]:
        a.backbones = list(BACKBONES)
    bad = sorted(set(a.backbones) - set(BACKBONES))
    if bad:
        p.error(f"unknown backbone(s) {bad}; valid: {list(BACKBONES)} or 'all'")
    try:
        a.variant_specs = variant_grid(a.variants, a.vary)
    except ValueError as e:
        p.error(str(e))
    return a


def variant_grid(variants: list[str], vary: list[str]) -> list[tuple[str, dict, dict]]:
    """Every ``--variants`` spec crossed with the ``--vary`` values: ``(name, changes, point)``,
    ``point`` the ``--vary`` values ({field: value}) that ``changes`` includes.

    Raises:
      ValueError: a malformed spec.
    """
    axes = []
    for item in vary:
        field, eq, values = item.partition("=")
        if not eq or not field or not values:
            raise ValueError(f"--vary {item!r}: expected FIELD=V1,V2,...")
        axes.append([(field, parse_variant(f"x:{field}={v}")[1][field])
                     for v in values.split(",") if v])
    out = []
    for spec in variants:
        name, changes = parse_variant(spec)
        for point in itertools.product(*axes):
            out.append((name, {**changes, **dict(point)}, dict(point)))
    return out


def variant_summaries(rows: list[dict], all_jobs: list[dict], first: str) -> list[dict]:
    """Each variant's step times against the first variant's (same configuration, same --vary
    point): ``x_median``, ``x_min`` per mode (see the module docstring)."""
    def key(r):
        return (r["backbone"], r["size"], r["impl"], r["chunk"], r["T"], repr(r["vary"]))

    base = {key(r): jobs for r, jobs in zip(rows, all_jobs) if r["variant"] == first}
    out = []
    for r, jobs in zip(rows, all_jobs):
        ref = base.get(key(r))
        if r["variant"] == first or ref is None:
            continue
        line = {"summary": "variants", "variant": r["variant"], "against": first,
                **{k: r[k] for k in ("backbone", "size", "impl", "chunk", "T", "vary")}}
        for mode, job in jobs.items():
            if mode in ref:
                line[mode] = ratios(job.times, ref[mode].times)
        out.append(line)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TARGETS:
        return importlib.import_module(TARGETS[argv[0]]).main(argv[1:]) or 0
    if argv and argv[0] == "model":
        argv = argv[1:]
    a = parse(argv)
    out = open(a.out, "a") if a.out else None
    rows, all_jobs = [], []
    for backbone in a.backbones:
        is_mem = backbone in MEMORY_BACKBONES
        for size in a.sizes:
            for impl in (a.impls if is_mem else [None]):
                for chunk in (a.chunks if is_mem else [None]):
                    for T, (name, changes, point) in itertools.product(a.T, a.variant_specs):
                        try:
                            row, jobs = setup(backbone, size, T, a.batch, impl=impl, chunk=chunk,
                                              remat=a.remat, dtype=a.dtype, modes=a.modes,
                                              abstract=a.abstract, variant=(name, changes))
                        except (ValueError, MemoryError, jax.errors.JaxRuntimeError) as e:
                            # a configuration that does not fit (XLA's RESOURCE_EXHAUSTED at the
                            # warm-up call) is reported, and the others still run
                            emit({"backbone": backbone, "size": size, "T": T, "chunk": chunk,
                                  "impl": impl, "variant": name, "vary": point,
                                  "error": f"{type(e).__name__}: {e}"}, out)
                            continue
                        row["vary"] = point
                        if a.abstract:
                            mem = row["train"]["memory"]
                            row["fits_gib"] = a.fit_gib
                            row["fits"] = mem["peak_estimate_bytes"] <= a.fit_gib * 2 ** 30
                            row["peak_estimate_gib"] = round(mem["peak_estimate_bytes"] / 2 ** 30, 2)
                            emit(row, out)
                        rows.append(row)
                        all_jobs.append(jobs)
                        print(f"# compiled {backbone}:{row['size']} T={T} chunk={row['chunk']} "
                              f"{row['variant']} {point or ''}", file=sys.stderr, flush=True)
    if a.abstract:
        return 0
    peaks = {n: peak_job(n) for n in a.peak_n}
    rounds([job for jobs in all_jobs for job in jobs.values()], a.repeats, around=peaks.values())
    rates = matmul_rates(peaks)
    peak_flops = max(max(r) for r in rates.values())
    for row, jobs in zip(rows, all_jobs):
        finish(row, jobs, peak_flops)
        emit(row, out)
    if len(a.variants) > 1:
        for line in variant_summaries(rows, all_jobs, a.variant_specs[0][0]):
            emit(line, out)
    emit({"summary": "peak", "dtype": "float32", "peak_gflops": round(peak_flops / 1e9, 2),
          "matmul_gflops": {str(n): {"median": round(statistics.median(r) / 1e9, 2),
                                     "max": round(max(r) / 1e9, 2)} for n, r in rates.items()},
          "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count()}, out)
    if a.png and rows:
        plot(rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
