"""Plot the training curves of one or several runs: ``titans-lm plot W1 [W2 ...] [--out F.png]``.

Reads each run's ``<workdir>/metrics.jsonl`` (``titans_lm.train.writers``) and draws, with
matplotlib (the non-interactive Agg backend: no display needed), two panels over the step:
train loss (solid line) and validation loss (dots joined by a dashed line) in nats per token,
and train throughput in tokens per second. Each run is one colour, labelled by its workdir name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from titans_lm.train.writers import read_metrics


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


def plot_runs(workdirs: Sequence[str | Path], out: str | Path) -> Path:
    """Draw the runs' curves into the PNG ``out`` (parent folders created); returns its path.

    Raises:
      FileNotFoundError, ValueError: as :func:`run_curves`, naming the run.
    """
    import matplotlib  # deliberate: a heavy import, loaded only to draw
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deliberate: as above

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
    ax_loss.set(xlabel="step", ylabel="loss (nats / token)", title="loss")
    ax_tps.set(xlabel="step", ylabel="tokens / s", title="train throughput")
    for ax in (ax_loss, ax_tps):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
