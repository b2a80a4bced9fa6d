"""Compile and time jitted programs side by side.

Everything is compiled first (lowering and compilation timed apart, with XLA's memory analysis of
the compiled program); then :func:`rounds` calls every program once per round, round after round,
so that load drift on a shared machine hits every configuration alike. A configuration is
reported by the median and the minimum of its calls (:func:`timing_fields`), and two are compared
by the ratio of their medians and of their minima (:func:`ratios`).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def memory_fields(mem) -> dict:
    """XLA's compiled memory analysis as bytes: argument, output, temp, alias and generated-code
    sizes, and ``peak_estimate_bytes`` = argument + output + temp - alias (the device memory the
    program needs)."""
    if mem is None:
        return {}
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
              "alias_size_in_bytes", "generated_code_size_in_bytes")
    out = {f.removesuffix("_in_bytes") + "_bytes": int(getattr(mem, f, 0) or 0) for f in fields}
    out["peak_estimate_bytes"] = (out["argument_size_bytes"] + out["output_size_bytes"]
                                  + out["temp_size_bytes"] - out["alias_size_bytes"])
    return out


def xla_flops(compiled) -> float | None:
    """The FLOPs of XLA's ``cost_analysis`` of a compiled program (None without a cost model)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001  (backends without a cost model)
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def lower_and_compile(jitted, *args) -> tuple[dict, Any]:
    """``({"lower_s", "compile_s", "memory"}, compiled)`` of a jitted function on ``args``."""
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return ({"lower_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3),
             "memory": memory_fields(compiled.memory_analysis())}, compiled)


def max_rss_bytes() -> int:
    """The process's peak resident memory so far (getrusage; it only grows)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Job:
    """One compiled program with its arguments; :meth:`call` runs it once, synchronised, and
    records its wall time (``times``) and the process CPU time (``cpu_times``).

    ``carry_state``: the program donates its first argument and returns the new one first (a
    train step): each call passes the previous call's.
    """

    def __init__(self, compiled: Callable, args: Sequence, *, carry_state: bool = False):
        self.compiled, self.args, self.carry_state = compiled, list(args), carry_state
        self.times: list[float] = []
        self.cpu_times: list[float] = []

    def call(self):
        t0, c0 = time.perf_counter(), time.process_time()
        out = self.compiled(*self.args)
        jax.block_until_ready(out)
        self.times.append(time.perf_counter() - t0)
        self.cpu_times.append(time.process_time() - c0)
        if self.carry_state:            # the train step donates its state: keep the new one
            self.args[0] = out[0]
        return out

    def warm_up(self):
        """One untimed call (the first call of a compiled program pays for its set-up)."""
        out = self.call()
        self.times.clear()
        self.cpu_times.clear()
        return out


def rounds(jobs: Iterable[Job], repeats: int, *, around: Iterable[Job] = ()) -> None:
    """``repeats`` rounds, each calling every job of ``jobs`` once in order; the jobs of
    ``around`` (e.g. :func:`peak_job`'s) are called at the start and at the end of each round."""
    jobs, around = list(jobs), list(around)
    for _ in range(repeats):
        for job in around:
            job.call()
        for job in jobs:
            job.call()
        for job in around:
            job.call()


def peak_job(n: int) -> Job:
    """A float32 [n, n] @ [n, n] matmul, compiled and warmed up: its best rate over the rounds is
    the machine's measured peak (:func:`peak_flops`)."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    f = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    job = Job(f, (a, a))
    job.warm_up()
    return job


def matmul_rates(peaks: dict[int, Job]) -> dict[int, list[float]]:
    """FLOP/s of every timed call of each :func:`peak_job` (2 n^3 FLOPs a call)."""
    return {n: [2 * n ** 3 / t for t in job.times] for n, job in peaks.items()}


def timing_fields(walls: Sequence[float], tokens: int) -> dict:
    """Median and minimum seconds per call over ``walls``, every call, and the rates they give."""
    wall = float(np.median(walls))
    return {"seconds": round(wall, 5), "seconds_min": round(min(walls), 5),
            "seconds_all": [round(w, 5) for w in walls],
            "tokens_per_s": round(tokens / wall, 1),
            "us_per_token": round(1e6 * wall / tokens, 3),
            "us_per_token_min": round(1e6 * min(walls) / tokens, 3)}


def median_min(times: Sequence[float]) -> tuple[float, float]:
    return statistics.median(times), min(times)


def ratios(times_a: Sequence[float], times_b: Sequence[float]) -> dict:
    """``{"x_median", "x_min"}``: a's time over b's, of the medians and of the minima (> 1: b is
    faster)."""
    (ma, la), (mb, lb) = median_min(times_a), median_min(times_b)
    return {"x_median": round(ma / mb, 3), "x_min": round(la / lb, 3)}
