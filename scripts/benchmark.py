"""Benchmark the train step: throughput, compile time and memory, one JSON object per config.

    python scripts/benchmark.py                              # tiny (its own B x T) and 125m at 1 x 1024
    python scripts/benchmark.py --sizes=tiny --batch_size=8 --seq_len=512 --steps=5
    python scripts/benchmark.py --config=configs/transformer.py --sizes=125m --compute_dtype=float32

For each size: build the model of ``<config>:<size>`` with its vocabulary, initialise the train
state on a one-device mesh (or ``--mesh_data`` devices), lower and compile the jitted train step
(timed separately: ``lower_s``, ``compile_s``), run ``--warmup`` steps, then time ``--steps`` steps
on random tokens (one document per row). Reported:

- ``tokens_per_sec``: B * T * steps / wall time of the timed steps (forward + backward + AdamW);
- ``step_s``: mean seconds per timed step;
- ``memory``: XLA's compiled memory analysis (argument, output, temp and generated-code bytes;
  ``peak_estimate_bytes`` = argument + output + temp - aliased, the device memory the step needs)
  and ``max_rss_bytes``, the process's peak resident memory so far (getrusage);
- the config actually run (B, T, parameter count, dtypes, remat).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import sys
import time
from pathlib import Path

import jax
import numpy as np

from titans_lm.train import sharding as shd
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import count_params, init_state, model_fns, state_shardings
from titans_lm.train.step import jit_train_step

DEFAULT_SHAPES = {"tiny": (None, None), "125m": (1, 1024)}  # size -> (B, T); None: the config's


def load_config(path: str, size: str):
    """``get_config(size)`` of a config file."""
    spec = importlib.util.spec_from_file_location("bench_config", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"config file {path!r} not found")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(size)


def bench(cfg, *, batch_size: int, seq_len: int, steps: int, warmup: int, mesh_data: int) -> dict:
    """Measure one config; see the module docstring for the fields."""
    cfg.train.batch_size, cfg.data.seq_len, cfg.train.grad_accum = batch_size, seq_len, 1
    mesh = shd.make_mesh({"data": mesh_data, "fsdp": 1, "tensor": 1})
    fns = model_fns(cfg.model)
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    state = init_state(cfg.model, fns, tx, mesh, seed=0)
    step_fn = jit_train_step(fns, tx, schedule, state_shardings(fns, tx, mesh), mesh,
                             compute_dtype=cfg.train.compute_dtype)
    spec = {k: jax.ShapeDtypeStruct((batch_size, seq_len + 1), np.int32,
                                    sharding=shd.batch_sharding(mesh))
            for k in ("tokens", "segment_ids")}
    t0 = time.perf_counter()
    lowered = step_fn.lower(state, spec)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    rng = np.random.default_rng(0)
    V = cfg.model.vocab_size

    def batch():
        return shd.put_batch({"tokens": rng.integers(4, V, (batch_size, seq_len + 1), dtype=np.int32),
                              "segment_ids": np.ones((batch_size, seq_len + 1), np.int32)}, mesh)

    for _ in range(warmup):
        state, m = compiled(state, batch())
    jax.block_until_ready(m)
    batches = [batch() for _ in range(steps)]
    t3 = time.perf_counter()
    for b in batches:
        state, m = compiled(state, b)
    loss = float(jax.block_until_ready(m)["loss"])
    elapsed = time.perf_counter() - t3
    out = {
        "config": f"{cfg.model.name}:{cfg.model.get('size', '?')}",
        "n_params": count_params(fns), "batch_size": batch_size, "seq_len": seq_len,
        "model_dtype": cfg.model.get("dtype", "float32"), "compute_dtype": cfg.train.compute_dtype,
        "remat": cfg.model.get("remat", "none"), "devices": mesh.size,
        "platform": jax.devices()[0].platform,
        "lower_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3),
        "timed_steps": steps, "step_s": round(elapsed / steps, 4),
        "tokens_per_sec": round(batch_size * seq_len * steps / elapsed, 1),
        "last_loss": round(loss, 4),
    }
    if mem is not None:
        fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                  "alias_size_in_bytes", "generated_code_size_in_bytes")
        m_out = {f.removesuffix("_in_bytes") + "_bytes": int(getattr(mem, f, 0)) for f in fields}
        m_out["peak_estimate_bytes"] = (m_out["argument_size_bytes"] + m_out["output_size_bytes"]
                                        + m_out["temp_size_bytes"] - m_out["alias_size_bytes"])
        out["memory"] = m_out
    out.setdefault("memory", {})["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "configs/transformer.py"))
    p.add_argument("--sizes", default="tiny,125m", help="comma-separated sizes of --config")
    p.add_argument("--batch_size", type=int, default=None, help="B (default: per size)")
    p.add_argument("--seq_len", type=int, default=None, help="T (default: per size)")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps after compiling")
    p.add_argument("--compute_dtype", choices=("float32", "bfloat16"), default=None,
                   help="override train.compute_dtype and model.dtype")
    p.add_argument("--mesh_data", type=int, default=1, help="data-parallel devices")
    args = p.parse_args(argv)
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        cfg = load_config(args.config, size)
        b0, t0 = DEFAULT_SHAPES.get(size, (1, 1024))
        B = args.batch_size or b0 or cfg.train.batch_size
        T = args.seq_len or t0 or cfg.data.seq_len
        if args.compute_dtype:
            cfg.train.compute_dtype = cfg.model.dtype = args.compute_dtype
        res = bench(cfg, batch_size=B, seq_len=T, steps=args.steps, warmup=args.warmup,
                    mesh_data=args.mesh_data)
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
