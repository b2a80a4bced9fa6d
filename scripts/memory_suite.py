"""Does each backbone's memory help? Books (reset and carried), the memory ablation, S-NIAH and
MQAR for a list of backbones and seeds at one budget, with the shipped configs; one table.

    python scripts/memory_suite.py                                   # 8 backbones x seeds 0,1, all parts
    python scripts/memory_suite.py --backbones=lmm,mag --seeds=0 --parts=books,ablation
    python scripts/memory_suite.py --parts=niah --backbones=swa,lmm --seeds=0,1
    python scripts/memory_suite.py --dry_run                         # the commands, nothing run

Units (one per part x backbone x seed, each in its own processes, its log and result in
``<out>/<part>/<backbone>-s<seed>/``):

- ``books``: ``scripts/compare_backbones.py`` for the backbone (``configs/<backbone>.py:tiny``,
  ``--book_steps`` steps x 8 windows of 256 tokens of the books, lr ``--book_lr``; it scores the
  held-out book from reset windows), then ``titans-lm eval --context=carry`` (the whole book
  streamed with the state carried);
- ``ablation`` (memory backbones; after their books unit): ``titans-lm eval --ablate_at``: every
  memory reset at ``--ablate_at`` in the first ``--ablate_tokens`` tokens of the book, carried; the
  loss increase over the next window and over every later token (``titans_lm.eval.ablation``);
- ``niah`` / ``mqar``: ``scripts/long_context.py`` (its shapes: d_model 64, 2 layers), every
  attention limited to ``--reach`` tokens (the sliding window of swa, mag and mal, MAC's segment;
  Transformer++ keeps full attention), so what lies further back reaches the query only through
  a memory. S-NIAH: ``--niah_steps`` x 16 rows of ``--niah_seq_len`` tokens at lr ``--niah_lr``
  (the budget at which the raised-bound LMM and MAG learnt the task, docs/results/s-niah.md),
  exact match carried at 1K / 4K / 16K (mean over needle depths). MQAR at a vocabulary of 640
  (docs/results/mqar.md#short-rows-first, where the LMM learnt it): ``--mqar_short_steps`` x 32
  rows of 64 tokens with 4-16 pairs (lr 3e-3), then ``--mqar_steps`` x 32 rows of 256 tokens
  with 4-64 pairs (lr 1e-3) warm-started from them; accuracy at 256 / 64 pairs, 512 / 128 and
  1024 / 256, reset and carried.

A unit with a ``result.json`` is not run again; an unfinished one resumes from its checkpoints
(both scripts resume), so a killed suite continues where it stopped, and each part can be run on
its own (``--parts``, ``--backbones``, ``--seeds``). Progress and an ETA go to stderr.

Writes ``<out>/suite.md`` (a row per backbone: each metric's mean ± half the range over the
seeds run so far, into the same ``--out`` by this command or an earlier one, then the suite's
targets: met or missed, with the numbers), ``<out>/suite.json`` (every unit's record and the
aggregate) and ``<out>/suite.png`` (the S-NIAH and MQAR accuracies as a heat map).
Wall time on the project's 2-core CPU, one core per run, the other busy (measured): books 16-20
min (a reused training run: 4-6), ablation 1, niah 13-15 (LMM, MAG; the SWA control 4.5), mqar
27-44 (the LMM's two stages; docs/results/memory-suite.md#mqar-with-the-shipped-lmm-two-seeds) per
backbone and seed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from titans_lm.bench import suite, sweep  # noqa: E402  (no jax here: every run is its own process)
from titans_lm.bench.output import write_json  # noqa: E402
from titans_lm.eval.results import read_results  # noqa: E402  (no jax either)
from titans_lm.progress import Progress  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbones", default=",".join(suite.BACKBONES), help="comma-separated configs")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    p.add_argument("--parts", default=",".join(suite.PARTS),
                   help=f"comma-separated, of {', '.join(suite.PARTS)}")
    p.add_argument("--book_steps", type=int, default=300, help="books: optimiser steps (x 8 x 256)")
    p.add_argument("--book_lr", type=float, default=2e-3, help="books: peak learning rate")
    p.add_argument("--reach", type=int, default=32,
                   help="S-NIAH, MQAR: attention window of swa/mag/mal and MAC's segment length")
    p.add_argument("--niah_steps", type=int, default=3000, help="S-NIAH: optimiser steps (x 16 rows)")
    p.add_argument("--niah_seq_len", type=int, default=128, help="S-NIAH: training row length")
    p.add_argument("--niah_lr", type=float, default=3e-3, help="S-NIAH: peak learning rate")
    p.add_argument("--mqar_short_steps", type=int, default=1500,
                   help="MQAR: steps (x 32 rows) on 64-token rows with 4-16 pairs first (0: none)")
    p.add_argument("--mqar_steps", type=int, default=1500,
                   help="MQAR: steps (x 32 rows) on the 256-token rows with 4-64 pairs")
    p.add_argument("--ablate_at", type=int, default=8192, help="ablation: the reset position")
    p.add_argument("--ablate_tokens", type=int, default=65536, help="ablation: tokens scored")
    p.add_argument("--eval_max_docs", type=int, default=0,
                   help="books: score only the first N documents (0: all; smoke runs)")
    p.add_argument("--task_eval_examples", type=int, default=None,
                   help="S-NIAH, MQAR: rows scored per setting (default: the task config's)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   type=sweep.field_value,
                   help="a config override for every training run (e.g. a memory preset to try)")
    p.add_argument("--out", default="runs/suite", help="folder of the units and the table")
    p.add_argument("--dry_run", action="store_true", help="print each unit's commands only")
    args = p.parse_args(argv)
    args.backbones, args.seeds = sweep.backbones_and_seeds(p, args.backbones, args.seeds,
                                                           REPO / "configs")
    args.parts = [x for x in args.parts.split(",") if x]
    try:
        args.units = suite.units(args.parts, args.backbones, args.seeds)
    except ValueError as e:
        p.error(str(e))
    sizes = ("book_steps", "niah_steps", "niah_seq_len", "mqar_steps", "reach", "ablate_at",
             "ablate_tokens")
    if min(getattr(args, k) for k in sizes) < 1:
        p.error(", ".join(f"--{k}" for k in sizes) + " must be positive")
    if args.mqar_short_steps < 0:
        p.error("--mqar_short_steps must be >= 0 (0: no short rows first)")
    return args


def commands(unit: suite.Unit, args, folder: Path) -> list[list[str]]:
    """The processes one unit runs, in order."""
    py, b, s = sys.executable, unit.backbone, unit.seed
    sets = [f"--set={k}={v}" for k, v in args.set]
    run = Path(args.out).resolve() / "books" / f"{b}-s{s}" / b   # the books run's workdir
    docs = [f"--config.eval.max_docs={args.eval_max_docs}"] if args.eval_max_docs else []
    if unit.part == "books":
        return [[py, str(REPO / "scripts" / "compare_backbones.py"), f"--backbones={b}",
                 f"--seed={s}", f"--steps={args.book_steps}", "--batch_size=8", "--seq_len=256",
                 f"--lr={args.book_lr}", f"--out={folder}",
                 f"--eval_max_docs={args.eval_max_docs}", *sets],
                [py, "-m", "titans_lm.cli", "eval", f"--workdir={run}", "--context=carry",
                 "--nowikitext", *docs]]
    if unit.part == "ablation":
        return [[py, "-m", "titans_lm.cli", "eval", f"--workdir={run}",
                 f"--ablate_at={args.ablate_at}", f"--max_tokens={args.ablate_tokens}",
                 "--noby_position", *docs]]
    def task(out: Path) -> list[str]:
        cmd = [py, str(REPO / "scripts" / "long_context.py"), f"--tasks={unit.part}",
               f"--backbones={b}", f"--seed={s}", f"--window={args.reach}",
               f"--segment_len={args.reach}", f"--out={out}", *sets]
        return cmd + ([f"--eval_examples={args.task_eval_examples}"]
                      if args.task_eval_examples else [])

    if unit.part == "niah":
        lengths = ",".join(str(n) for n in suite.NIAH_LENGTHS)
        return [task(folder) + [f"--steps={args.niah_steps}", f"--lr={args.niah_lr}",
                                f"--set=data.seq_len={args.niah_seq_len}", "--context=carry",
                                f"--set=task.eval_lengths=({lengths})"]]
    # MQAR (docs/results/mqar.md#short-rows-first): 64-token rows with 4-16 pairs first, then the
    # 256-token rows with 4-64 pairs warm-started from them (new optimiser, step 0)
    mqar = ["--batch_size=32", f"--vocab_size={suite.MQAR_VOCAB}"]
    full = task(folder) + mqar + [f"--steps={args.mqar_steps}", "--context=reset,carry",
                                  "--set=task.train_pairs=(4,8,16,32,64)"]
    if not args.mqar_short_steps:
        return [full + ["--lr=3e-3"]]
    short = folder / "short_rows"
    return [task(short) + mqar + [f"--steps={args.mqar_short_steps}", "--lr=3e-3",
                                  "--set=data.seq_len=64", "--set=task.train_pairs=(4,8,16)",
                                  "--set=task.eval_lengths=(64,)", "--set=task.eval_pairs=(16,)",
                                  "--context=reset"],
            full + ["--lr=1e-3", f"--set=train.init_from={short / f'mqar-{b}'}"]]


def unit_record(unit: suite.Unit, args, folder: Path) -> dict:
    """The unit's record from its run folders (after its commands succeeded)."""
    rec: dict = {"part": unit.part, "backbone": unit.backbone, "seed": unit.seed, "status": "ok"}
    run = Path(args.out).resolve() / "books" / f"{unit.backbone}-s{unit.seed}" / unit.backbone
    if unit.part == "books":
        rec.update(suite.books_record(read_results(run), max_docs=args.eval_max_docs))
        if rec["reset_ppl"] is None or rec["carried_ppl"] is None:
            rec["status"] = "no reset or carried book result (see the logs)"
    elif unit.part == "ablation":
        files = sorted(run.glob("ablation_*_at*.json"), key=os.path.getmtime)
        if not files:
            return {**rec, "status": "no ablation result (see the log)"}
        rec.update(suite.ablation_record(json.loads(files[-1].read_text())))
    else:
        rows = json.loads((folder / "results.json").read_text())
        row = rows[0] if rows else {}
        if row.get("status") != "ok":
            return {**rec, "status": row.get("status", "no result")}
        rec["accuracy"] = suite.task_record(row.get("records", []), unit.part)
        rec["final_train_loss"] = row.get("final_train_loss")
    return rec


def run_unit(unit: suite.Unit, args, out: Path) -> dict:
    folder = out / unit.folder
    done = folder / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(folder / "suite.log", "a") as log:
        for cmd in commands(unit, args, folder):
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "JAX_PLATFORMS": os.environ.get(
                                      "JAX_PLATFORMS", "cpu")})
            if proc.returncode != 0:
                return {"part": unit.part, "backbone": unit.backbone, "seed": unit.seed,
                        "status": f"exit {proc.returncode}: {cmd[1] if cmd[1] != '-m' else cmd[3]} "
                                  f"(log {folder / 'suite.log'})"}
    rec = unit_record(unit, args, folder)
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    if rec["status"] == "ok":
        write_json(done, rec)
    return rec


def write_results(out: Path, records: list[dict], backbones: list[str]) -> str:
    """Writes suite.md, suite.json and suite.png from ``records`` and every unit finished under
    ``out`` before; returns the markdown."""
    seen = {(r["part"], r["backbone"], r["seed"]) for r in records}
    records = records + [r for r in suite.saved_records(out)
                         if (r["part"], r["backbone"], r["seed"]) not in seen]
    agg = suite.aggregate(records)
    md = "\n".join([suite.format_table(agg, backbones), "", "Targets:", "",
                    *suite.targets(agg), ""])
    failed = [r for r in records if r.get("status") != "ok"]
    if failed:
        md += "\nFailed units: " + "; ".join(
            f"{r['part']} {r['backbone']} s{r['seed']}: {r['status']}" for r in failed) + "\n"
    (out / "suite.md").write_text(md)
    write_json(out / "suite.json", {"aggregate": agg, "records": records})
    plot(out / "suite.png", agg, backbones)
    return md


def plot(path: Path, agg: dict, backbones: list[str]) -> None:
    import numpy as np
    from titans_lm.train.plot import heat_map
    keys = [(k, h) for k, h, _ in suite.METRICS if k.startswith(("niah", "mqar"))]
    rows = [b for b in backbones if b in agg] + [b for b in agg if b not in backbones]
    if not rows:
        return
    grid = np.array([[agg[b].get(k, {}).get("mean", np.nan) for k, _ in keys] for b in rows])
    heat_map(path, grid, rows, [h for _, h in keys], "accuracy (%), mean over seeds")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    if args.dry_run:
        for u in args.units:
            for cmd in commands(u, args, out / u.folder):
                print(" ".join(cmd))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    print(f"memory suite: {len(args.units)} units in {out}", file=sys.stderr, flush=True)
    records = []
    bar = Progress(len(args.units), "suite units", unit="unit")
    for u in args.units:
        print(f"[{u.folder}] ...", file=sys.stderr, flush=True)
        rec = run_unit(u, args, out)
        records.append(rec)
        print(f"[{u.folder}] {rec['status']}" + (f" in {rec['wall_s']:.0f}s" if "wall_s" in rec
                                                  else ""), file=sys.stderr, flush=True)
        write_results(out, records, args.backbones)
        bar.update(1)
    bar.close()
    print(write_results(out, records, args.backbones))
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
