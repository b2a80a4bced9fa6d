"""MAD's metric and score (athms/mad-lab ``mad/metrics.py``, ``mad/analysis.py``).

- The metric: accuracy on the scored targets (MAD ignores the rest with its ignore index),
  macro-averaged over classes as torchmetrics' ``MulticlassAccuracy`` computes it by default
  (MAD's ``Accuracy``): the recall of each class, averaged over the classes that occur as a
  target or a prediction (a class only ever predicted counts 0). :func:`class_counts` counts
  one batch, :func:`macro_accuracy` reduces the sums over the test set.
- The score: for each task and difficulty setting the best test accuracy over the sweep (MAD's
  lr x weight-decay grid), averaged over the task's settings (the task's score); the MAD score
  is the mean of the task scores (:func:`mad_scores`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

import numpy as np


def class_counts(predictions: np.ndarray, targets: np.ndarray, scored: np.ndarray,
                 num_classes: int) -> np.ndarray:
    """``int64[3, num_classes]``: true positives, targets (tp + fn) and predictions (tp + fp) per
    class over the scored positions (any shape; ``scored`` bool of the same shape)."""
    p, t = np.asarray(predictions)[scored], np.asarray(targets)[scored]
    return np.stack([np.bincount(t[p == t], minlength=num_classes)[:num_classes],
                     np.bincount(t, minlength=num_classes)[:num_classes],
                     np.bincount(p, minlength=num_classes)[:num_classes]]).astype(np.int64)


def macro_accuracy(counts: np.ndarray) -> float:
    """The macro-averaged accuracy of :func:`class_counts` sums (0.0 with nothing scored)."""
    tp, support, predicted = (np.asarray(c, np.float64) for c in counts)
    present = (support + predicted) > 0
    if not present.any():
        return 0.0
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    return float(recall[present].mean())


def best_over_sweep(records: Iterable[Mapping], metric: str = "mad_acc") -> dict[tuple, dict]:
    """``{(model, task, setting, seed): best record}``: the sweep point (lr, weight decay) with
    the highest ``metric`` for each model, task, setting and seed."""
    best: dict[tuple, dict] = {}
    for r in records:
        key = (r["model"], r["task"], r["setting"], r.get("seed", 0))
        if key not in best or r[metric] > best[key][metric]:
            best[key] = dict(r)
    return best


def mad_scores(records: Iterable[Mapping], metric: str = "mad_acc",
               tasks: Iterable[str] | None = None) -> dict[str, dict]:
    """``{model: {"tasks": {task: score}, "mad": mean over tasks, "seeds": n}}`` in percent.

    A task's score is the mean over its settings of the best ``metric`` over the sweep, averaged
    over seeds; the MAD score the mean over ``tasks`` (default: the tasks of each model's
    records). A model without a record of some task in ``tasks`` gets ``"mad": None``.
    """
    per: dict[str, dict[str, dict[int, list[float]]]] = {}
    for (model, task, _setting, seed), r in best_over_sweep(records, metric).items():
        per.setdefault(model, {}).setdefault(task, {}).setdefault(seed, []).append(100 * r[metric])
    out = {}
    for model, by_task in per.items():
        scores = {t: statistics.fmean(statistics.fmean(v) for v in seeds.values())
                  for t, seeds in by_task.items()}
        want = list(tasks) if tasks is not None else list(scores)
        mad = (statistics.fmean(scores[t] for t in want) if all(t in scores for t in want)
               else None)
        n_seeds = max(len(seeds) for seeds in by_task.values())
        out[model] = {"tasks": scores, "mad": mad, "seeds": n_seeds}
    return out
