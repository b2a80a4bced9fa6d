"""Train each tiny backbone on each synthetic long-context task at one budget; one results table.

    python scripts/long_context.py                                   # every backbone, MQAR, 300 steps
    python scripts/long_context.py --backbones=transformer,lmm --tasks=mqar --steps=200
    python scripts/long_context.py --tasks=niah --context=reset,carry --window=32 --segment_len=32

For each task x backbone, ``titans-lm train --config=configs/tasks/<task>.py:<backbone>`` runs in
its own process with the same shape overrides (``--d_model``, ``--n_layers``; ``n_heads`` = d_model
// 32 where the backbone has attention heads), seed, batch, learning-rate schedule and number of
steps, so every model sees exactly the same rows. Then the task accuracy of every run is measured
over the task config's evaluation grid (``titans_lm.eval.tasks.evaluate_task``; MQAR: accuracy per
query at each (length, pairs); S-NIAH: exact match at each (length, depth)) in each context of
``--context`` (comma-separated; one table each):

- ``reset`` (default): windows of the training length scored independently; rows longer than the
  window lose everything before their last window (the no-memory floor);
- ``whole``: one parallel call over the whole row (the training path at a longer length);
- ``carry``: the window-by-window stateful path (needs the stateful model API).

``--window`` sets the sliding attention window (``model.window``) of the SWA control, MAG and MAL:
each token sees the ``W`` tokens before it. ``--segment_len`` sets MAC's segment length
(``model.segment_len``): a token sees only the earlier tokens of its own segment (0 to N - 1 of
them), so MAC's attention never reaches further back than the sliding window's when N = W, and
half as far on average. Each is asked to recall beyond its attention within the training length
through its memory; Transformer++ keeps full attention.

``--ablate`` (comma-separated values of ``model.memory_ablation``: MAC's retrieval, gated_read,
both; MAG's gated_read; MAL's read) scores every MAC, MAG and MAL run again with each of those its
backbone takes, that read of its memory zeroed (an eval-time override; the memory is still
written and carried): the same settings and contexts, plus the mean NLL of the
answer tokens at the training length (``titans_lm.eval.tasks.answer_loss``) with and without the
ablation. One more table: exact match and answer loss per ablation.

``--max_length`` skips longer settings (e.g. ``--max_length=256`` keeps only lengths within the
training window, where all three contexts agree). Rerunning with the same ``--out`` resumes
unfinished runs from their checkpoints and reuses finished ones.

Writes ``<out>/results.md`` (one table per task: a row per backbone, a column per setting, plus
the final training loss and parameters), ``<out>/results.json`` (every record) and
``<out>/<task>_<context>.png`` (heat map: backbone x setting, per context); prints the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from titans_lm.config.fields import ALL_MEMORY_ABLATIONS, MEMORY_ABLATIONS  # noqa: E402
from titans_lm.bench import sweep  # noqa: E402
from titans_lm.bench.output import write_json  # noqa: E402
from titans_lm.train.plot import heat_map  # noqa: E402
from titans_lm.eval.tasks import CONTEXTS  # noqa: E402  (numpy only; jax loads on first use)

BACKBONES = ("transformer", "swa", "ttt_linear", "lmm", "mac", "mag", "mal")
TASKS = ("mqar", "niah")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written; each flag's default after its help, unless the help states it
    (or the default is None or empty)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, [], argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The script's command line (``--help`` shows every default)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--backbones", default=",".join(BACKBONES), help="comma-separated config names")
    p.add_argument("--tasks", default="mqar", help="comma-separated: mqar, niah")
    p.add_argument("--steps", type=int, default=300, help="training steps per backbone and task")
    p.add_argument("--batch_size", type=int, default=16, help="training rows per step")
    p.add_argument("--d_model", type=int, default=64, help="model width of every backbone")
    p.add_argument("--n_layers", type=int, default=2, help="blocks of every backbone")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: config's)")
    p.add_argument("--vocab_size", type=int, default=None,
                   help="task vocabulary (default: the task config's; MQAR 8192, S-NIAH 1024)")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument("--context", default="reset", type=contexts,
                   help="comma-separated evaluation contexts: reset, whole, carry (one table each)")
    p.add_argument("--window", type=int, default=None,
                   help="sliding attention window (model.window) of swa, mag and mal; "
                        "Transformer++ keeps full attention (default: each config's)")
    p.add_argument("--segment_len", type=int, default=None,
                   help="MAC's segment length (model.segment_len), a multiple of its memory's "
                        "chunk size (default: the config's)")
    p.add_argument("--ablate", default="", type=ablations,
                   help="comma-separated memory ablations to score each MAC, MAG and MAL run "
                        "with, those its backbone takes (MAC: retrieval, gated_read, both; MAG: "
                        "gated_read; MAL: read; default: none)")
    p.add_argument("--max_length", type=int, default=None,
                   help="skip longer eval settings (default: none skipped)")
    p.add_argument("--eval_examples", type=int, default=None,
                   help="rows per eval setting (default: the task config's)")
    p.add_argument("--out", default="runs/long_context", help="folder of the runs and tables")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   type=sweep.field_value,
                   help="extra override for every run, e.g. --set=task.train_pairs=(8,16)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def contexts(text: str) -> tuple[str, ...]:
    """Parses ``--context``: comma-separated names of ``titans_lm.eval.tasks`` contexts.

    Raises:
      argparse.ArgumentTypeError: an empty list or an unknown name.
    """
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in CONTEXTS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a comma-separated list of {', '.join(CONTEXTS)}")
    return names


ABLATIONS = tuple(a for a in ALL_MEMORY_ABLATIONS if a != "none")


def ablations(text: str) -> tuple[str, ...]:
    """Parses ``--ablate``: comma-separated values of ``model.memory_ablation`` (not "none",
    which every run is scored with anyway).

    Raises:
      argparse.ArgumentTypeError: an unknown name.
    """
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in ABLATIONS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a comma-separated list of {', '.join(ABLATIONS)}")
    return names


def overrides(args, backbone: str, task: str) -> dict[str, object]:
    from titans_lm.config.tasks import load_backbone_config
    model = load_backbone_config(backbone, REPO / "configs").model
    o: dict[str, object] = {"model.d_model": args.d_model, "model.n_layers": args.n_layers,
                            "model.d_ff": -(-8 * args.d_model // 3 // 8) * 8,
                            "train.steps": args.steps, "train.batch_size": args.batch_size,
                            "train.seed": args.seed, "data.shuffle_seed": args.seed,
                            "train.log_every": 10, "train.eval_every": max(args.steps // 2, 1),
                            "train.eval_batches": 2, "train.ckpt_every": max(args.steps // 2, 1),
                            "optim.warmup_steps": max(1, min(100, args.steps // 10)),
                            "mesh.data": 1}
    if "n_heads" in model:
        o["model.n_heads"] = max(1, args.d_model // 32)
    if args.window is not None and model.get("window", 0) > 0:
        o["model.window"] = args.window
    if args.segment_len is not None and "segment_len" in model:
        o["model.segment_len"] = args.segment_len
    if args.lr is not None:
        o["optim.lr"] = args.lr
    if args.vocab_size is not None:
        o["data.vocab_size"] = args.vocab_size
    if args.eval_examples is not None:
        o["task.eval_examples"] = args.eval_examples
    o.update(args.set)
    return o


def train_run(args, backbone: str, task: str, workdir: Path) -> sweep.TrainRun:
    """Train one task x backbone (log: ``<out>/<task>-<backbone>.log``)."""
    return sweep.run_training(f"{REPO / 'configs' / 'tasks' / f'{task}.py'}:{backbone}", workdir,
                              overrides(args, backbone, task), flags=["--noeval_after"],
                              log_path=workdir.parent / f"{workdir.name}.log", cwd=REPO)


def setting_label(r: dict) -> str:
    return f"{r['length']}/{r['pairs']}p" if "pairs" in r else f"{r['length']}@{r['depth']:g}%"


def write_results(out: Path, results: list[dict], contexts: tuple[str, ...]) -> str:
    """Writes ``results.md`` (a table per task and context), ``results.json`` and the heat maps.

    Returns the markdown.
    """
    md = []
    for task in dict.fromkeys(r["task"] for r in results):
        metric = "token_acc" if task == "mqar" else "exact_match"
        for context in contexts:
            rows = [{**r, "records": [x for x in r.get("records", []) if x["context"] == context]}
                    for r in results if r["task"] == task]
            labels = list(dict.fromkeys(setting_label(x) for r in rows for x in r["records"]))
            md += [f"### {task}: {metric} (%), context {context}", "",
                   "| backbone | params | final train loss | " + " | ".join(labels) + " |",
                   "|---|---:|---:|" + "---:|" * len(labels)]
            for r in rows:
                cell = {setting_label(x): f"{100 * x[metric]:.1f}" for x in r["records"]}
                loss = "-" if r.get("final_train_loss") is None else f"{r['final_train_loss']:.3f}"
                status = "" if r["status"] == "ok" else f" ({r['status']})"
                md.append(f"| {r['backbone']}{status} | {r.get('params', '-')} | {loss} | "
                          + " | ".join(cell.get(lab, "-") for lab in labels) + " |")
            md.append("")
            plot_comparison(out / f"{task}_{context}.png", rows, labels, metric,
                            f"{task} {metric} (%), context {context}")
        md += ablation_table([r for r in results if r["task"] == task and r.get("ablations")],
                             metric)
    text = "\n".join(md)
    (out / "results.md").write_text(text)
    write_json(out / "results.json", results)
    return text


def ablation_table(rows: list[dict], metric: str) -> list[str]:
    """Markdown lines: per run and ablation ("none" first), ``metric`` (%) per context and setting
    and the answer loss at the training length with its change against "none"."""
    md = []
    for r in rows:
        abl = r["ablations"]
        labels = list(dict.fromkeys(f"{x['context']} {setting_label(x)}"
                                    for a in abl.values() for x in a["records"]))
        md += [f"### {r['task']} {r['backbone']}: memory ablations, {metric} (%) and answer loss",
               "", "| ablation | answer loss | change | " + " | ".join(labels) + " |",
               "|---|---:|---:|" + "---:|" * len(labels)]
        base = abl.get("none", {}).get("answer_loss")
        for name, a in abl.items():
            cell = {f"{x['context']} {setting_label(x)}": f"{100 * x[metric]:.1f}"
                    for x in a["records"]}
            loss = a.get("answer_loss")
            change = "-" if loss is None or base is None else f"{loss - base:+.4f}"
            md.append(f"| {name} | {'-' if loss is None else f'{loss:.4f}'} | {change} | "
                      + " | ".join(cell.get(lab, "-") for lab in labels) + " |")
        md.append("")
    return md


def plot_comparison(path: Path, rows: list[dict], labels: list[str], metric: str, title: str):
    import numpy as np
    grid = np.full((len(rows), len(labels)), np.nan)
    for i, r in enumerate(rows):
        for x in r.get("records", []):
            grid[i, labels.index(setting_label(x))] = 100 * x[metric]
    heat_map(path, grid, [r["backbone"] for r in rows], labels, title)


def main(argv=None) -> int:
    args = parse_args(argv)
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's read-only checkpoint notices
    from titans_lm.eval.tasks import answer_loss, evaluate_task
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks.split(",")
    for task in tasks:
        if task not in TASKS:
            print(f"unknown task {task!r}; valid: {', '.join(TASKS)}", file=sys.stderr)
            return 2

    def run_one(point) -> dict:
        task, backbone = point
        workdir = out / f"{task}-{backbone}"
        run = train_run(args, backbone, task, workdir)
        row = {"task": task, "backbone": backbone, "workdir": str(workdir),
               "status": "ok" if run.ok else f"train failed: {run.last_line}",
               "final_train_loss": sweep.final_train_loss(workdir, 3)}
        if run.ok:
            try:
                row["records"] = evaluate_task(
                    workdir, context=args.context, max_length=args.max_length,
                    log=lambda m: print(m, file=sys.stderr, flush=True))
                row["params"] = count_params(workdir)
                takes = [a for a in args.ablate if a in MEMORY_ABLATIONS.get(backbone, ())]
                if takes:
                    row["ablations"] = score_ablations(workdir, takes, args, evaluate_task,
                                                       answer_loss, row["records"])
            except ValueError as e:
                row["status"] = f"eval failed: {e}"
        return row

    points = [(t, b) for t in tasks for b in args.backbones.split(",")]
    results = sweep.run_grid(points, run_one, describe=lambda p: f"{p[1]} on {p[0]}",
                             write=lambda rows: write_results(out, rows, args.context))
    print(json.dumps(results, indent=1))
    print(write_results(out, results, args.context), file=sys.stderr)
    return 0


def score_ablations(workdir: Path, takes: list[str], args, evaluate_task, answer_loss,
                    records: list[dict]) -> dict[str, dict]:
    """{"none" and each of ``takes``: {"records", "answer_loss"}} of one MAC, MAG or MAL run."""
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    out = {"none": {"records": records, "answer_loss": answer_loss(workdir)["answer_loss"]}}
    for a in takes:
        o = {"model.memory_ablation": a}
        out[a] = {"records": evaluate_task(workdir, context=args.context,
                                           max_length=args.max_length, log=log, overrides=o),
                  "answer_loss": answer_loss(workdir, overrides=o)["answer_loss"]}
    return out


def count_params(workdir: Path) -> int:
    from titans_lm.train.checkpoint import Checkpointer
    from titans_lm.train.state import count_params as n_params, model_fns
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        cfg = ckpt.read_config(ckpt.resolve_step(None))
    finally:
        ckpt.close()
    return n_params(model_fns(cfg.model))


if __name__ == "__main__":
    sys.exit(main())
