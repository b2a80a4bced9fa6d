"""What the memories of trained MQAR runs write: each memory layer's gates and write share.

    python scripts/probe.py gates RUN [RUN ...] [--length=64] [--pairs=16] [--rows=32]

For each run (a workdir of an MQAR run, as for ``probe.py recall``) the held-out rows its
evaluation uses at ``--length`` with ``--pairs`` pairs are scored in one stateless call (every
row from the initial state), once with the run's trained parameters and, with ``--init`` (default
on), once with the parameters it started from. Every call of a NeuralMemory's engine, in the
order the model makes them (a model with persistent tokens first passes them through every
layer, one call per layer; then one call per layer for the row, or per layer and segment for
MAC), reports its number of tokens and, over the rows (full length: every token counts), heads
and tokens:

  theta, eta, alpha  the mean inner learning rate, momentum gate and forget gate (Titans eq. 13-14:
                     theta_t, eta_t, alpha_t); ``alpha_p90`` the forget gate's 90th percentile.
  write_share        median over queries of ||f(q_t; P_t) - f(q_t; P_0)|| / ||f(q_t; P_0)||:
                     how far the engine's read of query t has moved from the read of the state the
                     call started from (W0, or what the persistent tokens left): 0 means the layer
                     reads that state alone, a fixed map of the query that no context reaches.
  read_norm          median ||f(q_t; P_t)||.

Decaying toward the initial state (``decay_target="initial"``), a forget gate near 1 returns the
state to the one the row started from and the write share falls toward 0; decaying toward zero,
it erases that state as well, so the reads that remain are the writes.

Prints one JSON line per run, state and call, then a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.bench.recall_probe import main_over_runs, mqar_run
from titans_lm.memory.layer import NeuralMemory


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="probe.py gates", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="workdirs of MQAR runs")
    p.add_argument("--length", type=int, default=64, help="row length (the training length)")
    p.add_argument("--pairs", type=int, default=16)
    p.add_argument("--rows", type=int, default=32, help="held-out rows")
    p.add_argument("--init", action=argparse.BooleanOptionalAction, default=True,
                   help="also probe the run's initial parameters")
    return p.parse_args(argv)


def layer_stats(theta, eta, alpha, reads, reads0) -> dict:
    """The statistics of one call of a memory's engine (module docstring).

    Args:
      theta, eta, alpha: float [B, H, T] gates.
      reads, reads0: float [B, H, T, Dh] the engine's reads and the reads of the start state.
    Returns:
      dict: tokens (T) and the floats theta, eta, alpha, alpha_p90, write_share, read_norm.
    """
    pick = lambda g: np.asarray(g, np.float64).reshape(-1)  # noqa: E731
    moved = np.linalg.norm(np.asarray(reads, np.float64) - np.asarray(reads0, np.float64), axis=-1)
    base = np.linalg.norm(np.asarray(reads0, np.float64), axis=-1)
    norm = np.linalg.norm(np.asarray(reads, np.float64), axis=-1)
    a = pick(alpha)
    return {"tokens": int(np.shape(theta)[-1]), "theta": float(pick(theta).mean()), "eta": float(pick(eta).mean()),
            "alpha": float(a.mean()), "alpha_p90": float(np.quantile(a, 0.9)),
            "write_share": float(np.median(pick(moved) / np.maximum(pick(base), 1e-12))),
            "read_norm": float(np.median(pick(norm)))}


@contextlib.contextmanager
def captured_layer_stats(sink: list):
    """While active, every NeuralMemory scan traced from here on also appends its
    :func:`layer_stats` to ``sink`` when it runs (a ``jax.debug.callback``; outputs unchanged)."""

    original = NeuralMemory.scan

    def scan(self, state, q, k, v, theta, eta, alpha, *args, **kwargs):
        reads, new_state = original(self, state, q, k, v, theta, eta, alpha, *args, **kwargs)
        reads0 = self.read(state, q)
        jax.debug.callback(lambda *a: sink.append(layer_stats(*a)), theta, eta, alpha,
                           reads, reads0)
        return reads, new_state

    NeuralMemory.scan = scan
    try:
        yield sink
    finally:
        NeuralMemory.scan = original


def probe_run(workdir: str | Path, *, length: int, pairs: int, rows: int,
              init: bool) -> list[dict]:
    """One record per state ("trained", and "init" with ``init``) and memory layer.

    Raises:
      ValueError: a run not trained on MQAR.
      titans_lm.train.checkpoint.CheckpointError: no usable checkpoint.
    """
    run, batch, states = mqar_run(workdir, length=length, pairs=pairs, rows=rows, init=init)
    tokens = jnp.asarray(batch["tokens"][:, :-1])
    out = []
    for name, params, step in states:
        sink: list = []
        with captured_layer_stats(sink):
            logits = run.fns.apply(params, tokens, jnp.ones_like(tokens),
                                   run.fns.init_state(params, tokens.shape[0]))[0]
            jax.block_until_ready(logits)
            jax.effects_barrier()
        for call, s in enumerate(sink):
            out.append({"run": str(workdir), "model": run.cfg.model.name, "state": name, "step": step,
                        "call": call, **s})
    return out


def format_table(records: list[dict]) -> str:
    lines = ["| run | state | call | tokens | theta | eta | alpha (mean / p90) | write share | read norm |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        run = Path(r["run"])
        lines.append(f"| {run.parent.name}/{run.name} | {r['state']} | {r['call']} | {r['tokens']} | "
                     f"{r['theta']:.3f} | {r['eta']:.2f} | {r['alpha']:.4f} / {r['alpha_p90']:.4f} | "
                     f"{r['write_share']:.3f} | {r['read_norm']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    return main_over_runs(
        "gate_probe", args.runs,
        lambda wd: probe_run(wd, length=args.length, pairs=args.pairs, rows=args.rows,
                             init=args.init), format_table)


if __name__ == "__main__":
    sys.exit(main())
