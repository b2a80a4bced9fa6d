"""Plot the training curves of one or several runs: ``titans-lm plot W1 [W2 ...] [--out F.png]``.

Reads each run's ``<workdir>/metrics.jsonl`` (``titans_lm.train.writers``) and draws, with
matplotlib (the non-interactive Agg backend: no display needed), two panels over the step:
train loss (solid line) and validation loss (dots joined by a dashed line) in nats per token,
and train throughput in tokens per second. Each run is one colour, labelled by its workdir name;
a dotted vertical line of its colour marks each step it resumed from (its ``resume`` records).

The drawing helpers every figure of the package uses live here too (:func:`pyplot`,
:func:`save_figure`, :func:`heat_map`): the evaluation's plots and the benchmarks' heat maps
call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from titans_lm.train.writers import read_metrics


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib  # deliberate: a heavy import, loaded only to draw
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deliberate: as above
    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Lay out ``fig``, save it as a PNG at ``path`` (parent folders created), close it and
    return the path."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def heat_map(path: str | Path, grid, row_labels: Sequence[str], col_labels: Sequence[str],
             title: str, *, vmin: float = 0, vmax: float = 100, xlabel: str = "",
             colorbar_label: str = "") -> Path:
    """A heat map of ``grid`` [rows, cols] (NaN: an empty cell) with each value written in its
    cell, saved as a PNG at ``path``."""
    plt = pyplot()
    grid = np.asarray(grid, float)
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(col_labels), 1.0 + 0.45 * len(row_labels)))
    im = ax.imshow(grid, vmin=vmin, vmax=vmax, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(col_labels)), col_labels, fontsize=7, rotation=30)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    if xlabel:
        ax.set_xlabel(xlabel)
    for i in range(len(row_labels)):
        for j in range(len(col_labels)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}" if grid[i, j] >= 10 else f"{grid[i, j]:.1f}",
                        ha="center", va="center", fontsize=7,
                        color="white" if grid[i, j] < 0.6 * vmax else "black")
    fig.colorbar(im, ax=ax, label=colorbar_label or None)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def run_curves(workdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value)], "val_loss": [...], "tokens_per_sec": [...]}`` of one run
    (the latest record for a step wins).

    Raises:
      FileNotFoundError: ``workdir`` has no ``metrics.jsonl``.
      ValueError: the file holds no train or validation record.
    """
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {workdir} a run directory of "
                                f"titans-lm train?)")
    curves: dict[str, dict[int, float]] = {"loss": {}, "val_loss": {}, "tokens_per_sec": {}}
    for rec in read_metrics(workdir):
        for key, points in curves.items():
            value = rec.get(key)
            if isinstance(value, (int, float)):
                points[int(rec["step"])] = float(value)
    if not curves["loss"] and not curves["val_loss"]:
        raise ValueError(f"{path}: no train or validation records yet")
    return {k: sorted(v.items()) for k, v in curves.items()}


def resume_steps(workdir: str | Path) -> list[int]:
    """The steps a run resumed from (its ``{"event": "resume"}`` records), in order."""
    return sorted({int(r["step"]) for r in read_metrics(workdir) if r.get("event") == "resume"})


def plot_runs(workdirs: Sequence[str | Path], out: str | Path) -> Path:
    """Draw the runs' curves into the PNG ``out`` (parent folders created); returns its path.

    Raises:
      FileNotFoundError, ValueError: as :func:`run_curves`, naming the run.
    """
    plt = pyplot()
    runs = [(Path(w), run_curves(w)) for w in workdirs]
    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (w, c) in enumerate(runs):
        color = f"C{i % 10}"
        label = w.resolve().name
        if c["loss"]:
            ax_loss.plot(*zip(*c["loss"]), color=color, lw=1.2, label=f"{label} train")
        if c["val_loss"]:
            ax_loss.plot(*zip(*c["val_loss"]), "o--", color=color, ms=4, lw=1,
                         label=f"{label} validation")
        if c["tokens_per_sec"]:
            ax_tps.plot(*zip(*c["tokens_per_sec"]), color=color, lw=1, label=label)
        for j, s in enumerate(resume_steps(w)):
            for ax in (ax_loss, ax_tps):
                ax.axvline(s, color=color, ls=":", lw=1,
                           label=f"{label} resumed" if j == 0 and ax is ax_loss else None)
    ax_loss.set(xlabel="step", ylabel="loss (nats / token)", title="loss")
    ax_tps.set(xlabel="step", ylabel="tokens / s", title="train throughput")
    for ax in (ax_loss, ax_tps):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)
