"""Train every backbone's tiny config on the same data for the same token budget, evaluate, compare.

    python scripts/compare_backbones.py                # all backbones, 300 x 8 x 256 tokens each
    python scripts/compare_backbones.py --steps=800 --out=runs/compare_800
    python scripts/compare_backbones.py --backbones=transformer,lmm --steps=5 --eval_max_docs=1

For each backbone, ``titans-lm train --config=configs/<name>.py:tiny`` runs in its own process with
the same corpus (``--corpus``, default the books), seed, batch, window length, learning-rate
schedule and number of steps, so every model sees exactly the same batches; the run then evaluates
itself (``--eval_after``): token perplexity on the corpus's held-out test split and word
perplexity on WikiText-2 test. Rerunning with the same ``--out`` resumes unfinished runs from their
checkpoints and reuses finished ones.

Reported per backbone (markdown table on stdout and in ``<out>/results.md``, JSON in
``<out>/results.json``):

- ``params``: parameter count;
- ``final train loss``: mean training loss (nats/token) of the last ``--final_window`` steps;
- ``<corpus> test token ppl``: held-out token perplexity (``titans_lm.eval``);
- ``wiki2 word ppl``: WikiText-2 test word perplexity (the Titans paper's "Wiki. ppl" metric);
- ``train tok/s``: median training throughput over the logged steps after the first (evaluation
  and checkpointing excluded), and the wall time of the whole run.
A backbone whose training fails (e.g. a non-finite loss) gets a row saying so.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from titans_lm.bench import sweep  # noqa: E402  (no jax: the runs train in their own processes)
from titans_lm.bench.output import write_json  # noqa: E402
from titans_lm.eval.results import latest_result  # noqa: E402  (no jax either)

BACKBONES = ("transformer", "ttt_linear", "ttt_mlp", "lmm", "mac", "mag", "mal")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbones", default=",".join(BACKBONES),
                   help="comma-separated config names (configs/<name>.py, size tiny)")
    p.add_argument("--steps", type=int, default=300, help="optimiser steps per backbone")
    p.add_argument("--batch_size", type=int, default=8, help="windows per step")
    p.add_argument("--seq_len", type=int, default=256, help="tokens per window")
    p.add_argument("--corpus", default="books", help="training corpus (books | tinyshakespeare)")
    p.add_argument("--seed", type=int, default=0, help="init and data-order seed, the same for all")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: config's)")
    p.add_argument("--warmup_steps", type=int, default=None,
                   help="warmup steps (default: steps // 10, between 1 and 100)")
    p.add_argument("--eval_max_docs", type=int, default=0,
                   help="score only the first N documents of each eval set (0: all)")
    p.add_argument("--final_window", type=int, default=10,
                   help="steps averaged for the final train loss")
    p.add_argument("--out", default="runs/compare", help="directory of the runs and results")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   type=sweep.field_value,
                   help="extra config override for every run, e.g. --set=train.eval_batches=4")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.seq_len < 1:
        p.error("--steps, --batch_size and --seq_len must be positive")
    for name in args.backbones.split(","):
        if not (REPO / "configs" / f"{name}.py").is_file():
            p.error(f"--backbones: no config file configs/{name}.py")
    return args


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The config overrides shared by every run."""
    o: dict[str, object] = {
        "data.corpus": args.corpus, "data.seq_len": args.seq_len, "data.shuffle_seed": args.seed,
        "train.seed": args.seed, "train.steps": args.steps, "train.batch_size": args.batch_size,
        "train.log_every": 1, "train.eval_every": args.steps, "train.ckpt_every": max(args.steps // 4, 1),
        "mesh.data": 1,
    }
    if args.lr is not None:
        o["optim.lr"] = args.lr
    o["optim.warmup_steps"] = (args.warmup_steps if args.warmup_steps is not None
                               else max(1, min(100, args.steps // 10)))
    if args.eval_max_docs:
        o["eval.max_docs"] = args.eval_max_docs
    o.update(args.set)
    return o


def summarize(name: str, workdir: Path, args: argparse.Namespace, status: str, wall_s: float,
              message: str = "") -> dict:
    """One result row from the run directory (metrics.jsonl and eval_*.json)."""
    steps = list(sweep.train_records(workdir))
    row = {"backbone": name, "status": status, "workdir": str(workdir), "steps": steps[-1] if steps else 0,
           "tokens_trained": (steps[-1] if steps else 0) * args.batch_size * args.seq_len,
           "wall_s": round(wall_s, 1), "message": message}
    row["final_train_loss"] = sweep.final_train_loss(workdir, args.final_window)
    row["train_tokens_per_sec"] = sweep.median_tokens_per_sec(workdir)
    for key, dataset, metric in (("heldout_token_ppl", f"{args.corpus}-test", "token_ppl"),
                                 ("wiki2_word_ppl", "wikitext2-test", "word_ppl")):
        res = latest_result(workdir, dataset)  # the newest step's, every document if scored so
        row[key] = None
        if res is not None:
            row[key] = res["model"].get(metric)
            row["params"] = res["n_params"]
    return row


def run_backbone(name: str, args: argparse.Namespace) -> dict:
    workdir = Path(args.out).resolve() / name
    print(f"[{name}] training {args.steps} steps x {args.batch_size} x {args.seq_len} tokens on "
          f"{args.corpus} (log: {workdir / 'train.log'})", file=sys.stderr, flush=True)
    run = sweep.run_training(f"{REPO / 'configs' / f'{name}.py'}:tiny", workdir, overrides(args),
                             env={"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
                             cwd=REPO)
    if not run.ok:
        print(f"[{name}] failed: {run.last_line}", file=sys.stderr, flush=True)
        return summarize(name, workdir, args, "failed", run.wall_s, run.last_line)
    return summarize(name, workdir, args, "ok", run.wall_s)


def _fmt(x, spec: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def markdown_table(rows: list[dict], args: argparse.Namespace) -> str:
    corpus = args.corpus
    head = (f"| backbone | params | final train loss | {corpus} test token ppl | wiki2 word ppl | "
            f"train tok/s | wall |\n|---|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        name = r["backbone"] if r["status"] == "ok" else f"{r['backbone']} ({r['status']})"
        lines.append(f"| {name} | {_fmt(r.get('params'), ',')} | {_fmt(r['final_train_loss'], '.3f')} | "
                     f"{_fmt(r['heldout_token_ppl'], '.1f')} | {_fmt(r['wiki2_word_ppl'], '.1f')} | "
                     f"{_fmt(r['train_tokens_per_sec'], ',.0f')} | {_fmt(r['wall_s'], '.0f')}s |")
    budget = args.steps * args.batch_size * args.seq_len
    lines.append(f"\nEach run: {args.steps} steps x {args.batch_size} x {args.seq_len} = {budget:,} "
                 f"training tokens of {corpus}, seed {args.seed}; final train loss = mean of the last "
                 f"{args.final_window} steps.")
    lines.append(verdict(rows))
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    """Which backbone has the lowest held-out perplexity, and by how much over the runner-up."""
    ok = [r for r in rows if r["status"] == "ok" and r["heldout_token_ppl"] is not None]
    if len(ok) < 2:
        return ""
    out = []
    for key, label in (("heldout_token_ppl", "held-out token ppl"), ("wiki2_word_ppl", "WikiText-2 word ppl")):
        ranked = sorted((r for r in ok if r[key] is not None), key=lambda r: r[key])
        if len(ranked) >= 2:
            best, second = ranked[0], ranked[1]
            out.append(f"Lowest {label}: {best['backbone']} ({best[key]:.1f}), "
                       f"{100 * (1 - best[key] / second[key]):.1f}% below {second['backbone']} "
                       f"({second[key]:.1f}).")
    return " ".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write(rows):
        write_json(out / "results.json", {"args": vars(args), "rows": rows})
        (out / "results.md").write_text(markdown_table(rows, args) + "\n")

    rows = sweep.run_grid(args.backbones.split(","), lambda name: run_backbone(name, args),
                          write=write)
    print(markdown_table(rows, args))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
