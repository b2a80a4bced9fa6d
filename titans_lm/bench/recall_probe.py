"""MQAR pair sensitivity of trained runs and of the same models at initialisation.

    python scripts/probe.py recall RUN [RUN ...] [--length=64] [--pairs=8] [--min_distance=33]

For each MQAR run (a workdir of ``titans-lm train --config=configs/tasks/mqar.py:<backbone>`` or
of ``scripts/long_context.py``), the held-out rows its evaluation uses at ``--length`` with
``--pairs`` pairs are scored in one parallel call, and each query whose pair's value lies at
least ``--min_distance`` tokens back is probed (``titans_lm.eval.recall.pair_sensitivity``): how
much the query's logits move when its own pair's value is replaced (``own``) and when a
neighbouring pair's value is (``other``), relative to the logits' spread. Choose
``--min_distance`` beyond every attention window and convolution of the runs compared (default
33: past a 32-token window and a 4-token convolution), so that what remains passes through a
memory. ``--init`` (default on) also probes the parameters the run started from (its config and
``train.seed``): whether the memory's writes reach the output at all before training.

``key cosine``: the mean cosine between the keys of two tokens of one chunk, as every memory
layer writes them on the probe's unperturbed rows (``titans_lm.eval.recall.chunk_key_cosine``;
none for a model without a memory). Keys that are all alike store a blur, which no query can
read one pair from.

Prints one JSON line per run and state, then a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.eval.recall import chunk_key_cosine, pair_sensitivity
from titans_lm.eval.restore import load_run
from titans_lm.eval.tasks import eval_batches_for
from titans_lm.memory.layer import NeuralMemory
from titans_lm.train.checkpoint import CheckpointError
from titans_lm.train.state import init_params



def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="probe.py recall", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="workdirs of MQAR runs")
    p.add_argument("--length", type=int, default=64, help="row length (the training length)")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--rows", type=int, default=64, help="held-out rows")
    p.add_argument("--min_distance", type=int, default=33)
    p.add_argument("--init", action=argparse.BooleanOptionalAction, default=True,
                   help="also probe the run's initial parameters")
    return p.parse_args(argv)


@contextlib.contextmanager
def captured_write_keys(sink: list):
    """While active, every NeuralMemory write traced from here on also appends its keys
    float[B, H, T, Dh] to ``sink`` when it runs (a ``jax.debug.callback``; outputs unchanged)."""

    original = NeuralMemory.scan

    def scan(self, state, q, k, *args, **kwargs):
        jax.debug.callback(lambda keys: sink.append(np.asarray(keys)), k)
        return original(self, state, q, k, *args, **kwargs)

    NeuralMemory.scan = scan
    try:
        yield sink
    finally:
        NeuralMemory.scan = original


def write_key_cosine(apply, params, tokens, chunk_size: int) -> float | None:
    """Mean :func:`titans_lm.eval.recall.chunk_key_cosine` over the memory writes of one call
    ``apply(params, tokens)`` (None: the model has no memory; writes shorter than a chunk, such
    as the persistent prefix, do not count)."""

    sink: list = []
    with captured_write_keys(sink):
        jax.block_until_ready(jax.jit(apply)(params, tokens))
        jax.effects_barrier()
    values = [c for c in (chunk_key_cosine(k, chunk_size) for k in sink) if np.isfinite(c)]
    return float(np.mean(values)) if values else None


def mqar_run(workdir: str | Path, *, length: int, pairs: int, rows: int, init: bool):
    """An MQAR run, one batch of its held-out rows at ``length`` with ``pairs`` pairs, and the
    parameter states to probe: ``[(name, params, step)]``, the checkpoint ("trained") and, with
    ``init``, the parameters the run started from ("init").

    Raises:
      ValueError: a run not trained on MQAR.
      titans_lm.train.checkpoint.CheckpointError: no usable checkpoint.
    """
    run = load_run(workdir, log=lambda m: print(m, file=sys.stderr))
    cfg = run.cfg
    if cfg.data.get("task", "") != "mqar":
        raise ValueError(f"{workdir}: not an MQAR run (data.task is {cfg.data.get('task', '')!r})")
    batch = eval_batches_for(cfg, {"length": length, "pairs": pairs}, n_examples=rows,
                             batch_size=rows)[0]
    states = [("trained", run.params, run.step)]
    if init:
        states.append(("init", init_params(cfg.model, int(cfg.train.seed)), 0))
    return run, batch, states


def main_over_runs(prog: str, runs, probe, table) -> int:
    """Each run's records from ``probe(workdir)`` as JSON lines, then ``table(records)``; a bad
    run is one line ``prog: message`` on stderr and exit status 2."""
    records = []
    for wd in runs:
        try:
            recs = probe(wd)
        except (ValueError, OSError, CheckpointError) as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        for r in recs:
            print(json.dumps(r), flush=True)
        records += recs
    print(table(records))
    return 0


def probe_run(workdir: str | Path, *, length: int, pairs: int, rows: int, min_distance: int,
              init: bool) -> list[dict]:
    """Records for the run's checkpoint (``state`` "trained") and, with ``init``, its initial
    parameters (``state`` "init").

    Raises:
      ValueError: a run not trained on MQAR.
      titans_lm.train.checkpoint.CheckpointError: no usable checkpoint.
    """
    run, batch, states = mqar_run(workdir, length=length, pairs=pairs, rows=rows, init=init)
    cfg = run.cfg
    tokens, mask = batch["tokens"], batch["loss_mask"]
    def logits(p, x):  # the stateless call: from the initial state, the state dropped
        return run.fns.apply(p, x, jnp.ones_like(x), run.fns.init_state(p, x.shape[0]))[0]
    apply = jax.jit(logits)  # compiled once
    chunk = int(cfg.model.memory.chunk_size) if "memory" in cfg.model else 0
    out = []
    for name, params, step in states:
        r = pair_sensitivity(lambda x, p=params: apply(p, x), tokens, mask, pairs,
                             int(cfg.data.vocab_size),
                             min_distance=min_distance, batch_size=32)
        cos = (write_key_cosine(logits, params,
                                jnp.asarray(tokens[:, :-1]), chunk) if chunk >= 2 else None)
        out.append({"run": str(workdir), "model": cfg.model.name, "state": name, "step": step,
                    "length": length, "pairs": pairs, "min_distance": min_distance, **r,
                    "key_cosine": cos})
    return out


def format_table(records: list[dict]) -> str:
    lines = ["| run | model | state | queries | own (median) | other (median) | own / other | "
             "key cosine |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in records:
        run = Path(r["run"])
        cos = r.get("key_cosine")
        lines.append(f"| {run.parent.name}/{run.name} | {r['model']} | {r['state']} | {r['n_queries']} | "
                     f"{r['own_median']:.2e} | {r['other_median']:.2e} | {r['selectivity']:.2f} | "
                     f"{'-' if cos is None else f'{cos:.2f}'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    return main_over_runs(
        "recall_probe", args.runs,
        lambda wd: probe_run(wd, length=args.length, pairs=args.pairs, rows=args.rows,
                             min_distance=args.min_distance, init=args.init), format_table)


if __name__ == "__main__":
    sys.exit(main())
