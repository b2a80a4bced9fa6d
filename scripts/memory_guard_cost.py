"""Cost of the memory's in-graph guard (``MemoryConfig.surprise_max_norm``), side by side.

Times the jitted forward + backward of one NeuralMemory layer (chunked engine) with the guard off
(0) and on, for memory depths 1..4, on the same inputs, and prints one JSON object:

    {"settings": {...}, "results": [{"memory_depth": 4, "surprise_max_norm": 0.0,
      "ms_per_step": ..., "compile_s": ...}, ...], "overhead": {"1": 0.02, ...}}

``overhead`` is ms_with_guard / ms_without - 1 per depth. Usage:

    python scripts/memory_guard_cost.py [--batch 4] [--seq_len 256] [--d_model 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory


def time_layer(cfg: MemoryConfig, x, repeats: int) -> tuple[float, float]:
    """(compile seconds, median ms per forward + backward)."""
    with nnx.use_eager_sharding(False):
        layer = NeuralMemory(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)

    @jax.jit
    def step(params, x):
        def loss(params):
            return jnp.mean(nnx.merge(graphdef, params)(x) ** 2)
        return jax.value_and_grad(loss)(params)

    t0 = time.perf_counter()
    jax.block_until_ready(step(params, x))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, x))
        times.append(time.perf_counter() - t0)
    return compile_s, 1000 * sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--d_model", type=int, default=256)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--guard", type=float, default=1.0)
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    x = jax.random.normal(jax.random.key(0), (a.batch, a.seq_len, a.d_model), jnp.float32)
    results, overhead = [], {}
    for depth in (int(d) for d in a.depths.split(",")):
        ms = {}
        for clip in (0.0, a.guard):
            cfg = MemoryConfig(d_model=a.d_model, n_heads=a.d_model // a.head_dim,
                               head_dim=a.head_dim, memory_depth=depth, memory_expansion=2.0,
                               theta_max=0.0005, eta_max=0.9, surprise_max_norm=clip)
            compile_s, ms[clip] = time_layer(cfg, x, a.repeats)
            results.append({"memory_depth": depth, "surprise_max_norm": clip,
                            "ms_per_step": round(ms[clip], 2), "compile_s": round(compile_s, 2)})
        overhead[str(depth)] = round(ms[a.guard] / ms[0.0] - 1, 3)
    print(json.dumps({"settings": vars(a), "device": jax.devices()[0].platform,
                      "results": results, "overhead": overhead}, indent=1))


if __name__ == "__main__":
    main()
