"""What ``scripts/mad.py`` runs and writes: the sweep's points and their config overrides under
MAD's full protocol or the CPU reduction, the results table (with the Atlas paper's published
rows) and the bar chart. The protocol's facts are ``titans_lm.config.mad``; the score
``titans_lm.eval.mad``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from titans_lm.config.mad import BASELINES, PROTOCOL
from titans_lm.data.tasks.mad_settings import mad_settings

# Atlas paper (Behrouz et al. 2025, arXiv:2505.23735), its MAD table: models of width 128 and
# 4 layers; the average over compression, (noisy) in-context recall, fuzzy recall, selective
# copying and memorization. Only the averages are recorded here.
PUBLISHED = {
    "Transformers (Atlas paper)": 75.46,
    "Gated DeltaNet (Atlas paper)": 71.04,
    "Titans (Atlas paper)": 76.44,
    "Atlas (Atlas paper)": 79.50,
}
PUBLISHED_SOURCE = "Behrouz et al. 2025, Atlas, arXiv:2505.23735, MAD table (width 128, 4 layers)"

# The reduction's one grid point: the largest lr of MAD's grid (short runs), no weight decay.
REDUCED_LR, REDUCED_WD = 1e-3, 0.0
SHORT = {"in_context_recall": "ICR", "noisy_in_context_recall": "noisy ICR",
         "fuzzy_in_context_recall": "fuzzy ICR", "selective_copying": "sel. copy",
         "compression": "compress", "memorization": "memorize"}


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of the sweep: ``backbone`` names its config (``configs/<backbone>.py``),
    ``name`` (default: the backbone) its table row and run folder, e.g. a variant trained with
    config overrides."""
    backbone: str
    task: str
    setting: str  # "baseline" or "field=value"
    lr: float
    weight_decay: float
    seed: int
    name: str = ""

    @property
    def model(self) -> str:
        """The table row: ``name``, else the backbone."""
        return self.name or self.backbone

    @property
    def workdir(self) -> str:
        """``<model>/<task>/<setting>/lr<lr>_wd<wd>_seed<seed>`` (relative to the output)."""
        return (f"{self.model}/{self.task}/{self.setting}/"
                f"lr{self.lr:g}_wd{self.weight_decay:g}_seed{self.seed}")


OVERRIDES_FILE = "sweep_overrides.json"


def check_overrides(workdir: str | Path, overrides: Mapping[str, str]) -> None:
    """Records a point's user overrides (``--set``) in ``<workdir>/sweep_overrides.json`` on its
    first start; on a later start (a resume, or a finished point read back) they must be the same,
    so a run is never continued or counted under another model's settings.

    Raises:
      ValueError: the folder was started with other overrides (the message names both and the
        fix: another ``--out`` or ``--name``).
    """
    path = Path(workdir) / OVERRIDES_FILE
    want = {str(k): str(v) for k, v in overrides.items()}
    if path.is_file():
        had = json.loads(path.read_text())
    elif path.parent.is_dir() and any(path.parent.iterdir()):
        had = {}   # a run started before overrides were recorded: it had none
    else:
        had = want
    if had != want:
        def show(o):
            return " ".join(f"--set={k}={v}" for k, v in o.items()) or "without --set"
        raise ValueError(f"{workdir} was run {'with ' * bool(had)}{show(had)}, this command asks "
                         f"for {show(want) if want else 'no --set'}; give the variant its own "
                         "--name or --out")
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(want, indent=1) + "\n")


def points(backbones: Sequence[str], tasks: Sequence[str], seeds: Sequence[int],
           protocol: str, name: str = "") -> list[Point]:
    """The sweep in run order: backbone, seed, task, setting, lr, weight decay; ``name``: the
    row and folder of every point (one backbone only).

    Raises:
      ValueError: an unknown task or protocol, or a ``name`` with several backbones.
    """
    if name and len(backbones) != 1:
        raise ValueError(f"a name ({name!r}) labels one backbone's runs; got {len(backbones)} "
                         "backbones")
    if protocol not in ("full", "reduced"):
        raise ValueError(f"unknown protocol {protocol!r}; valid: full, reduced")
    grid = ([(lr, wd) for lr in PROTOCOL["lrs"] for wd in PROTOCOL["weight_decays"]]
            if protocol == "full" else [(REDUCED_LR, REDUCED_WD)])
    out = []
    for b in backbones:
        for seed in seeds:
            for task in tasks:
                for s in mad_settings(task, only_baseline=protocol == "reduced"):
                    out += [Point(b, task, s.label, lr, wd, seed, name) for lr, wd in grid]
    return out


def point_overrides(point: Point, protocol: str, *, steps: int = 50, batch_size: int = 16,
                    test_examples: int = 128) -> dict[str, object]:
    """The ``--config.*`` overrides of one point (on ``configs/tasks/mad.py``'s MAD run)."""
    setting = next(s for s in mad_settings(point.task) if s.label == point.setting)
    o: dict[str, object] = {"task.setting": setting.label,
                            "train.seed": point.seed, "data.shuffle_seed": point.seed,
                            "optim.lr": point.lr, "optim.weight_decay": point.weight_decay,
                            "optim.end_lr_ratio": min(1.0, PROTOCOL["min_lr"] / point.lr),
                            "train.log_every": 10, "train.eval_batches": 1, "mesh.data": 1}
    base = BASELINES[point.task]
    for field in ("vocab_size", "seq_len", "num_train_examples", "frac_noise",
                  "num_tokens_to_copy"):
        if getattr(setting, field) != base.get(field, getattr(setting, field)):
            o[f"task.{field}"] = getattr(setting, field)
    if protocol == "full":
        n = setting.num_train_examples
        bsz = PROTOCOL["batch_size"]
        o.update({"train.steps": PROTOCOL["epochs"] * -(-n // bsz), "train.batch_size": bsz})
    else:
        n = min(setting.num_train_examples, steps * batch_size)
        o.update({"train.steps": steps, "train.batch_size": batch_size,
                  "task.num_train_examples": n, "task.eval_examples": test_examples,
                  "task.eval_batch_size": min(test_examples, 64), "eval.batch_size": batch_size})
    o["train.eval_every"] = o["train.steps"]
    o["train.ckpt_every"] = max(1, min(int(o["train.steps"]), 500))
    return o


def format_table(scores: Mapping[str, Mapping], tasks: Sequence[str], protocol: str) -> str:
    """Markdown: a row per backbone (score per task and the MAD score, %), then the published
    rows (their averages)."""
    head = ("| model | seeds | " + " | ".join(SHORT.get(t, t) for t in tasks) + " | MAD score |\n"
            + "|---|---:|" + "---:|" * (len(tasks) + 1) + "\n")
    rows = []
    for model, s in scores.items():
        cells = [f"{s['tasks'][t]:.1f}" if t in s["tasks"] else "-" for t in tasks]
        mad = "-" if s["mad"] is None else f"{s['mad']:.2f}"
        rows.append(f"| {model} | {s['seeds']} | " + " | ".join(cells) + f" | {mad} |")
    for model, avg in PUBLISHED.items():
        rows.append(f"| {model} | - | " + " | ".join("-" for _ in tasks) + f" | {avg:.2f} |")
    return (f"MAD ({protocol} protocol): accuracy (%), MAD's macro average on the scored "
            f"targets; a task's score is the mean over its settings of the best run of the "
            f"sweep. Published rows: {PUBLISHED_SOURCE}.\n\n" + head + "\n".join(rows) + "\n")


def plot_scores(path: str | Path, scores: Mapping[str, Mapping], tasks: Sequence[str]) -> Path:
    """Bars: for each task and the average, one bar per backbone; the published averages as
    bars of their own at the average."""
    import matplotlib  # deliberate: plotting only when results are written
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deliberate: see above
    labels = [SHORT.get(t, t) for t in tasks] + ["average"]
    models = list(scores)
    fig, ax = plt.subplots(figsize=(1.4 * len(labels) + 3, 4))
    width = 0.8 / max(len(models) + len(PUBLISHED), 1)
    for i, m in enumerate(models):
        vals = [scores[m]["tasks"].get(t, 0.0) for t in tasks] + [scores[m]["mad"] or 0.0]
        ax.bar([x + i * width for x in range(len(labels))], vals, width, label=m)
    for j, (m, avg) in enumerate(PUBLISHED.items()):
        ax.bar([len(tasks) + (len(models) + j) * width], [avg], width, label=m, alpha=0.5)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
