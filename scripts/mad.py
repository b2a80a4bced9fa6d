"""Run the MAD suite (Poli et al. 2024) on backbones and seeds; one table and a bar chart.

    python scripts/mad.py                                         # Transformer++ and LMM, reduced
    python scripts/mad.py --backbones=mag,mal --seeds=0,1
    python scripts/mad.py --backbones=lmm --tasks=selective_copying --seeds=2
    python scripts/mad.py --protocol=full --backbones=transformer  # MAD's whole sweep (GPU days)
    python scripts/mad.py --backbones=mag --set=model.combine=gate --name=mag-gate   # a variant

Each point (backbone x task x setting x lr x weight decay x seed) trains ``titans-lm train
--config=configs/tasks/mad.py:<task>-<backbone>`` in its own process (MAD's architecture and run,
``titans_lm.config.mad``) in ``<out>/<backbone>/<task>/<setting>/lr<lr>_wd<wd>_seed<s>``, then is
evaluated in this process on the setting's test set (MAD's macro-averaged accuracy on the scored
targets, ``titans_lm.eval.mad``) and its record is saved as ``result.json`` there. A rerun skips
every point with a ``result.json`` and resumes an unfinished one from its checkpoint, so a killed
sweep continues where it stopped.

A variant: ``--set FIELD=VALUE`` (repeatable) overrides the backbone's config in every run;
it needs ``--name`` (one backbone), the row and run folder ``<out>/<name>/...``, so the variant's
runs sit beside the shipped backbone's in one table. A folder started with other overrides is
refused (``sweep_overrides.json`` records them), never resumed or counted under the wrong row.

Protocols (docs/mad.md):

- ``full``: MAD's: every difficulty setting, the lr x weight-decay grid {1e-4, 5e-4, 1e-3} x
  {0, 0.1} (the best run per setting counts), batch 128, 200 epochs, 1,280 test examples.
- ``reduced`` (default; sized for a 2-core CPU, about 8 minutes per backbone): the baseline
  setting of each task, one grid point (lr 1e-3, weight decay 0), ``--steps`` steps (default 50)
  of batch ``--batch_size`` (default 16), the training set cut to ``steps x batch`` examples
  when MAD's is larger (one epoch), 128 test examples.

Writes ``<out>/results.md`` (every point finished in ``<out>``, by this command or an earlier
one: a row per backbone with the score of each task and the MAD score, the mean over the tasks,
next to the Atlas paper's published rows), ``<out>/results.json`` (every point's record and the
scores) and ``<out>/mad.png`` (bars per task and the average).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from titans_lm.bench import sweep  # noqa: E402
from titans_lm.bench.mad import (PUBLISHED, REDUCED_LR, REDUCED_WD, Point,  # noqa: E402
                                 check_overrides, format_table, plot_scores, point_overrides,
                                 points)
from titans_lm.config.mad import PROTOCOL  # noqa: E402
from titans_lm.bench.output import write_json  # noqa: E402
from titans_lm.config.mad import MAD_TASKS  # noqa: E402
from titans_lm.eval.mad import mad_scores  # noqa: E402
from titans_lm.progress import Progress  # noqa: E402

BACKBONES = ("transformer", "lmm")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbones", default=",".join(BACKBONES),
                   help="comma-separated backbone configs (configs/<name>.py)")
    p.add_argument("--tasks", default=",".join(MAD_TASKS), help="comma-separated MAD tasks")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (data and initialisation)")
    p.add_argument("--protocol", choices=("reduced", "full"), default="reduced",
                   help="MAD's full sweep or the CPU reduction (docs/mad.md)")
    p.add_argument("--steps", type=int, default=50, help="reduced: optimiser steps per run")
    p.add_argument("--batch_size", type=int, default=16, help="reduced: rows per step")
    p.add_argument("--test_examples", type=int, default=128, help="reduced: test rows")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   type=sweep.field_value,
                   help="config override for every run (needs --name), e.g. --set=model.combine=gate")
    p.add_argument("--name", default="", help="the table row and run folder of a variant "
                   "(one backbone; default: the backbone's name)")
    p.add_argument("--out", default="runs/mad", help="folder of the runs and the table")
    args = p.parse_args(argv)
    args.backbones, args.seeds = sweep.backbones_and_seeds(p, args.backbones, args.seeds,
                                                           REPO / "configs")
    args.tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in args.tasks if t not in MAD_TASKS]
    if bad:
        p.error(f"--tasks: unknown {', '.join(bad)}; valid: {', '.join(MAD_TASKS)}")
    if not args.seeds or not args.backbones or not args.tasks:
        p.error("--backbones, --tasks and --seeds need at least one entry each")
    if args.set and not args.name:
        p.error("--set changes the model: give its runs a row and folder of their own with "
                "--name (e.g. --name=mag-gate)")
    if args.name and len(args.backbones) != 1:
        p.error(f"--name labels one backbone's runs; got --backbones={','.join(args.backbones)}")
    if args.name and ("/" in args.name or args.name in (".", "..")):
        p.error(f"--name={args.name!r}: must be a plain folder name")
    args.set = dict(args.set)
    if min(args.steps, args.batch_size, args.test_examples) < 1:
        p.error("--steps, --batch_size and --test_examples must be positive")
    return args


def run_point(point: Point, args, out: Path) -> dict:
    """Train and evaluate one point, or read its saved record."""
    workdir = out / point.workdir
    check_overrides(workdir, args.set)
    done = workdir / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    from titans_lm.eval.tasks import evaluate_task  # deliberate: jax loads only when a run is due
    t0 = time.perf_counter()
    config = f"{REPO / 'configs' / 'tasks' / 'mad.py'}:{point.task}-{point.backbone}"
    overrides = point_overrides(point, args.protocol, steps=args.steps,
                                batch_size=args.batch_size, test_examples=args.test_examples)
    overrides.update(args.set)
    run = sweep.run_training(config, workdir, overrides, flags=["--noeval_after"],
                             log_path=workdir / "train.log", cwd=REPO)
    rec = {**dataclasses.asdict(point), "model": point.model, "overrides": args.set,
           "status": "ok"}
    if not run.ok:
        return {**rec, "status": f"train failed: {run.last_line}", "mad_acc": 0.0}
    try:
        r = evaluate_task(workdir, log=lambda m: None)[0]
    except ValueError as e:
        return {**rec, "status": f"eval failed: {e}", "mad_acc": 0.0}
    rec.update(mad_acc=r["mad_acc"], token_acc=r["token_acc"], n_answers=r["n_answers"],
               step=r["step"], wall_s=round(time.perf_counter() - t0, 1),
               final_train_loss=sweep.final_train_loss(workdir, 3))
    done.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def saved_records(out: Path, protocol: str) -> list[dict]:
    """The records of every finished point of ``protocol`` under ``out`` (earlier commands'
    backbones, tasks and seeds too), so the table covers everything run into the same folder."""
    grid = {f"lr{lr:g}_wd{wd:g}" for lr, wd in
            ([(REDUCED_LR, REDUCED_WD)] if protocol == "reduced" else
             [(lr, wd) for lr in PROTOCOL["lrs"] for wd in PROTOCOL["weight_decays"]])}
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/*/*/*/result.json"))
            if p.parent.name.rsplit("_seed", 1)[0] in grid]


def write_results(out: Path, records: list[dict], tasks: list[str], protocol: str) -> str:
    """Writes the table, the JSON and the chart of ``records`` and the finished points saved
    under ``out``. Returns the markdown."""
    def key(r):
        return r["model"], r["task"], r["setting"], r["lr"], r["weight_decay"], r["seed"]
    seen = {key(r) for r in records}
    records = records + [r for r in saved_records(out, protocol) if key(r) not in seen]
    scores = mad_scores([r for r in records if r["status"] == "ok"], tasks=tasks)
    md = format_table(scores, tasks, protocol)
    (out / "results.md").write_text(md)
    write_json(out / "results.json", {"protocol": protocol, "tasks": tasks, "scores": scores,
                                      "published": PUBLISHED, "records": records})
    plot_scores(out / "mad.png", scores, tasks)
    return md


def main(argv=None) -> int:
    args = parse_args(argv)
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    todo = points(args.backbones, args.tasks, args.seeds, args.protocol, args.name)
    print(f"MAD ({args.protocol}): {len(todo)} runs in {out}", file=sys.stderr, flush=True)
    records = []
    bar = Progress(len(todo), "MAD runs", unit="runs")
    for point in todo:
        print(f"[{point.workdir}] ...", file=sys.stderr, flush=True)
        try:
            rec = run_point(point, args, out)
        except ValueError as e:   # a folder started with other --set overrides
            print(f"mad.py: error: {e}", file=sys.stderr)
            return 2
        records.append(rec)
        print(f"[{point.workdir}] {rec['status']}: MAD accuracy {100 * rec['mad_acc']:.1f}%"
              + (f" in {rec['wall_s']:.0f}s" if "wall_s" in rec else ""), file=sys.stderr,
              flush=True)
        write_results(out, records, args.tasks, args.protocol)
        bar.update(1)
    bar.close()
    print(write_results(out, records, args.tasks, args.protocol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
