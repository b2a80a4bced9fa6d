"""Where the NeuralMemory layer's forward + backward spends its time: one profiled call.

    python scripts/profile_memory_layer.py --chunk 64 --T 4096
    taskset -c 0 python scripts/profile_memory_layer.py --chunk 64 --T 4096   # one core

The layer and call are those of ``scripts/compare_titans_pytorch.py``'s titans_lm worker (d_model
256, 4 heads x 64, MLP memory of depth 2 x4, batch 1, forward + backward of a scalar loss). After
``--warmup`` calls and ``--repeats`` timed ones, one call runs under ``jax.profiler.trace`` and
XLA's per-operation events on its CPU threads are summed:

- ``loop``: operations that ran at least once per chunk (the ``lax.scan`` over chunks, forward
  and backward: an op inside the loop runs n_chunks times per loop), ``outside``: the rest
  (projections, convolutions, gate coefficients, the loss). Ops are grouped by kind (the name
  without its numeric suffix: ``ynn_fusion`` = a YNNPACK fusion, matrix products with what XLA
  fused into them; ``dot``/``dot_general`` = matrix products; the rest elementwise fusions and
  copies).
- ``loop_matmul_gflops``: the dual form's analytic matmul FLOPs (``titans_lm.models.flops``:
  :func:`memory_chunk_flops` x heads x chunks, x4 for the train call: forward, the remat
  recompute and a backward of twice the forward) over the loop's matrix-product time.
  The count includes the gate coefficients' products, which run outside the loop (batched over
  chunks; about 4% of it at chunk 64).

Prints one JSON object. Times move with the machine's load: compare variants in one run.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

_MATMUL_KINDS = ("ynn_fusion", "dot", "dot_general")


def op_times(trace_dir: str) -> tuple[dict, dict]:
    """({op name: total ns}, {op name: count}) of the XLA operations on the CPU threads of the one
    trace under ``trace_dir`` (loops' own ``while`` events and runtime scopes, names with ``::``,
    left out)."""
    from jax.profiler import ProfileData

    files = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    if len(files) != 1:
        raise SystemExit(f"expected one profile under {trace_dir}, found {len(files)}")
    data = ProfileData.from_file(files[0])
    total, count = collections.Counter(), collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLAEigen"):
                continue
            for ev in line.events:
                name = ev.name
                if name.startswith(("end:", "while")) or "::" in name:
                    continue
                total[name] += ev.duration_ns
                count[name] += 1
    return dict(total), dict(count)


def summarise(total: dict, count: dict, n_chunks: int, loop_flops: float) -> dict:
    """The JSON summary of :func:`op_times`'s sums (see the module docstring)."""
    parts = {"loop": collections.Counter(), "outside": collections.Counter()}
    for name, ns in total.items():
        where = "loop" if count[name] >= n_chunks else "outside"
        parts[where][re.sub(r"\.\d+$", "", name)] += ns
    ms = {w: {k: round(v / 1e6, 1) for k, v in c.most_common()} for w, c in parts.items()}
    loop_ms = sum(ms["loop"].values())
    matmul_ms = sum(v for k, v in ms["loop"].items() if k in _MATMUL_KINDS)
    return {"loop_ms": round(loop_ms, 1), "loop_matmul_ms": round(matmul_ms, 1),
            "loop_other_ms": round(loop_ms - matmul_ms, 1),
            "outside_ms": round(sum(ms["outside"].values()), 1),
            "loop_matmul_gflops": round(loop_flops / (matmul_ms / 1e3) / 1e9, 1) if matmul_ms else None,
            "by_kind_ms": ms}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)

    import jax

    import compare_titans_pytorch as C
    from titans_lm.memory import MemoryConfig
    from titans_lm.models.flops import memory_chunk_flops

    mcfg = MemoryConfig(d_model=C.D_MODEL, n_heads=C.HEADS, head_dim=C.HEAD_DIM,
                        memory_depth=C.DEPTH, memory_expansion=C.EXPANSION, chunk_size=a.chunk)
    n_chunks = -(-a.T // a.chunk)
    loop_flops = 4 * memory_chunk_flops(mcfg) * mcfg.n_heads * n_chunks
    call = C.jax_worker(a.chunk, a.T)
    for _ in range(a.warmup):
        call()
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            t = time.perf_counter()
            call()
            traced_s = time.perf_counter() - t
        total, count = op_times(d)
    out = {"chunk": a.chunk, "T": a.T, "n_chunks": n_chunks,
           "call_s": {"median": round(statistics.median(times), 4), "min": round(min(times), 4)},
           "traced_call_s": round(traced_s, 4),
           "loop_model_gflop": round(loop_flops / 1e9, 2)}
    out.update(summarise(total, count, n_chunks, loop_flops))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
