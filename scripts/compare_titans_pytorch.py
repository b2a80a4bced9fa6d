"""NeuralMemory forward + backward: titans_lm (JAX) against titans-pytorch (torch, CPU).

    pip install -e '.[compare]'       # torch (CPU) and titans-pytorch, in a separate environment
    python scripts/compare_titans_pytorch.py --torch_python .venv-compare/bin/python
    python scripts/compare_titans_pytorch.py --chunks 16 --T 1024 4096 --repeats 3

The same layer shape on both sides: d_model 256, 4 heads x 64, an MLP memory of depth 2 and
expansion 4, batch 1; one call = the layer's forward on random inputs, a scalar loss (mean square
of the output) and its backward (gradients of every parameter and of the input).

What each computes (per chunk of b tokens, ``--chunks``):

- ``titans_lm``: ``titans_lm.memory.NeuralMemory`` with the layer's defaults (causal conv,
  l2-normalised q and k, output gate) and the ``chunked`` engine: Titans' mini-batch gradient
  descent with momentum and decay per token (every token's gradient taken at the chunk-start
  weights; momentum and decay applied token by token, the read of token i after its own write:
  the dual form); the weights are refreshed at every chunk, sequentially over the sequence.
- ``titans_pytorch``: ``titans_pytorch.NeuralMemory(dim=256, chunk_size=b, heads=4,
  dim_head=64)`` with its default MemoryMLP (depth 2, expansion 4). By default (``batch_size``
  None) one gradient (surprise) per chunk, all of them taken at the initial weights in one
  batched pass, then momentum and decay as an associative scan over chunks: the weights are never
  refreshed within the call. With ``batch_size=b`` (``titans_pytorch_bs``) the sequence is
  processed in batches of b tokens and the weights are refreshed after each (closer to the
  paper's sequential update, still one gradient per chunk).

Protocol: one worker process per configuration (framework x variant x chunk x T), started and
warmed up, then ``--repeats`` rounds in which every live worker runs one timed call in turn (so
load drift hits all alike). Workers of one T live together (``--together T``), or titans_lm
beside one titans-pytorch variant at a time (``--together pair``: at T = 16K a titans-pytorch
worker holds about 11 GB, and six workers at once exceed a 24 GiB machine); the groups run one
after another. Each prints its median and minimum seconds per call and its peak RSS; the summary gives
tokens/s and the ratio titans_lm / titans_pytorch (> 1: titans_lm faster). A worker that fails
(time out, out of memory) is reported with its error and the others go on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
D_MODEL, HEADS, HEAD_DIM, DEPTH, EXPANSION = 256, 4, 64, 2, 4.0


# ----------------------------------------------------------------------------- workers
def jax_worker(chunk: int, T: int):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from titans_lm.memory import MemoryConfig, NeuralMemory
    from titans_lm.nn.stream import fresh_stream_state, make_stream

    cfg = MemoryConfig(d_model=D_MODEL, n_heads=HEADS, head_dim=HEAD_DIM, memory_depth=DEPTH,
                       memory_expansion=EXPANSION, chunk_size=chunk)
    with nnx.use_eager_sharding(False):          # logical axis names stay metadata
        layer = NeuralMemory(cfg, rngs=nnx.Rngs(0))
    gdef, params = nnx.split(layer)
    x = jax.random.normal(jax.random.key(1), (1, T, D_MODEL), jnp.float32)
    # One document from a fresh state: the training path (no carried state, no buffer).
    stream = make_stream(jnp.ones((1, T), jnp.int32), fresh_stream_state(1), fresh=True)[0]
    state0 = layer.init_state(1)

    def loss(p, x):
        y, _ = nnx.merge(gdef, p)(x, stream, state0)
        return jnp.mean(y ** 2)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    compiled = step.lower(params, x).compile()

    def call():
        jax.block_until_ready(compiled(params, x))
    return call


def torch_worker(chunk: int, T: int, batch_size: int | None):
    import torch
    from titans_pytorch import NeuralMemory

    torch.manual_seed(0)
    mem = NeuralMemory(dim=D_MODEL, chunk_size=chunk, heads=HEADS, dim_head=HEAD_DIM,
                       batch_size=batch_size,
                       default_model_kwargs=dict(depth=DEPTH, expansion_factor=EXPANSION))
    x = torch.randn(1, T, D_MODEL, requires_grad=True)

    def call():
        mem.zero_grad(set_to_none=True)
        x.grad = None
        retrieved, _ = mem(x)
        retrieved.pow(2).mean().backward()
    return call


def worker_main(a) -> int:
    t0 = time.perf_counter()
    if a.framework == "titans_lm":
        call = jax_worker(a.chunk, a.T)
    else:
        call = torch_worker(a.chunk, a.T, a.chunk if a.framework == "titans_pytorch_bs" else None)
    call()                                           # warm-up (and compile)
    print(json.dumps({"ready": True, "setup_s": round(time.perf_counter() - t0, 2)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t = time.perf_counter()
        call()
        print(json.dumps({"s": time.perf_counter() - t}), flush=True)
    print(json.dumps({"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}),
          flush=True)
    return 0


# ----------------------------------------------------------------------------- driver
class Worker:
    def __init__(self, spec: dict, python: str, timeout: float):
        self.spec, self.timeout, self.times, self.error, self.info = spec, timeout, [], None, {}
        cmd = [python, __file__, "--worker", "--framework", spec["framework"],
               "--chunk", str(spec["chunk"]), "--T", str(spec["T"])]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)

    def read(self) -> dict | None:
        line = self.proc.stdout.readline()
        if not line:
            self._record_exit()
            return None
        return json.loads(line)

    def wait_ready(self):
        msg = self.read()
        if msg:
            self.info.update(msg)

    def _send(self, line: str) -> bool:
        """Write one command; a worker that died (e.g. killed for memory) records why."""
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            self._record_exit()
            return False

    def _record_exit(self):
        """The error of a worker that exited: its code and the end of its stderr."""
        err = self.proc.stderr.read()[-400:].strip()
        code = self.proc.wait()
        why = " (SIGKILL: out of memory?)" if code == -9 else ""
        self.error = f"exited {code}{why}: {err}"

    def run_once(self):
        if self.error or not self._send("run"):
            return
        msg = self.read()
        if msg:
            self.times.append(msg["s"])

    def close(self):
        if self.error or not self._send("quit"):
            return
        msg = self.read()
        if msg:
            self.info.update(msg)
        self.proc.wait()

    def result(self) -> dict:
        out = dict(self.spec)
        if self.times:
            med = statistics.median(self.times)
            out.update({"s_median": round(med, 4), "s_min": round(min(self.times), 4),
                        "tokens_per_s": round(self.spec["T"] / med, 1),
                        "tokens_per_s_max": round(self.spec["T"] / min(self.times), 1),
                        "calls": len(self.times)})
        out.update(self.info)
        if self.error:
            out["error"] = self.error
        return out


def groups(a):
    """(T, specs) per group of workers that live and alternate together: ``--together T`` all
    configurations of one T; ``pair`` titans_lm beside one titans-pytorch variant at one chunk
    size (two processes at a time, for long T; titans_lm is then timed once per pair)."""
    torch_fw = [f for f in a.frameworks if f != "titans_lm"]
    for T in a.T:
        specs = [{"framework": f, "chunk": c, "T": T} for c in a.chunks for f in a.frameworks
                 if f == "titans_lm" or T <= a.torch_max_T]
        if a.together == "T" or not torch_fw or T > a.torch_max_T:
            yield T, specs
            continue
        for c in a.chunks:
            for f in torch_fw:
                g = f"{f}@{c}"
                pair = [{"framework": "titans_lm", "chunk": c, "T": T, "group": g},
                        {"framework": f, "chunk": c, "T": T, "group": g}]
                yield T, [s for s in pair if s["framework"] in a.frameworks]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--framework", default="titans_lm")
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    p.add_argument("--T", nargs="+", type=int, default=[1024, 4096, 16384])
    p.add_argument("--frameworks", nargs="+",
                   default=["titans_lm", "titans_pytorch", "titans_pytorch_bs"],
                   choices=["titans_lm", "titans_pytorch", "titans_pytorch_bs"])
    p.add_argument("--torch_max_T", type=int, default=16384,
                   help="skip titans-pytorch above this T")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jax_python", default=sys.executable)
    p.add_argument("--torch_python", default=sys.executable,
                   help="python of an environment with torch and titans-pytorch")
    p.add_argument("--together", choices=["T", "pair"], default="T",
                   help="which workers live and alternate together: every configuration of one T, "
                        "or titans_lm beside one titans-pytorch variant (less memory: at T = 16K a "
                        "titans-pytorch worker holds about 11 GB)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=None, help="JSON lines file (appended)")
    a = p.parse_args(argv)
    if a.worker:
        a.T = a.T[0]
        return worker_main(a)
    out = open(a.out, "a") if a.out else None

    def emit(obj):
        print(json.dumps(obj), flush=True)
        if out:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    results = []
    for T, specs in groups(a):
        workers = [Worker(s, a.jax_python if s["framework"] == "titans_lm" else a.torch_python,
                          a.timeout) for s in specs]
        for w in workers:
            w.wait_ready()
        for _ in range(a.repeats):
            for w in workers:
                w.run_once()
        for w in workers:
            w.close()
            results.append(w.result())
            emit(results[-1])
    for r in results:
        if r["framework"] != "titans_lm" or "tokens_per_s" not in r:
            continue
        for o in results:
            if (o["framework"] != "titans_lm" and o["chunk"] == r["chunk"] and o["T"] == r["T"]
                    and o.get("group") == r.get("group")):
                emit({"ratio": f"titans_lm / {o['framework']}", "chunk": r["chunk"], "T": r["T"],
                      "x_median": (round(o["s_median"] / r["s_median"], 2) if "s_median" in o
                                   else None),
                      "x_min": round(o["s_min"] / r["s_min"], 2) if "s_min" in o else None,
                      "error": o.get("error")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
