"""Loss by position: mean token loss in log-spaced buckets of the within-document position.

The question (the TTT paper's Fig. 2, Sun et al. 2024): does a model's loss keep falling as it
reads further into a document, or flatten once its context is used up? Per-token losses (nats)
are binned by the position of the predicted token inside its document, in buckets
``[0, 1), [1, 2), [2, 4), [4, 8), ..., [2^(k-1), 2^k)``, and each bucket keeps the *sum* of its
losses and its token count, so results over several batches or files add exactly
(:func:`merge_by_position`) and the buckets' sums add up to the total loss.

Result (JSON-serialisable dict): ``edges`` (k + 1 ints), ``loss_sum``, ``count`` and
``mean_loss`` (None for an empty bucket) per bucket, ``total_loss``, ``total_count``, and any
extra keys the caller adds (``name``, ``model_name``, ``context``...).

Files: ``<workdir>/by_position*.json`` (:func:`write_by_position`), drawn one curve per run by
:func:`plot_by_position` and ``titans-lm plot --by_position W1 W2 ...`` (:func:`plot_runs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from titans_lm.train.plot import pyplot, save_figure


def bucket_edges(max_position: int) -> np.ndarray:
    """int64[k+1]: ``0, 1, 2, 4, ..., 2^(k-1), 2^k`` with ``2^k > max_position`` (so every
    position in ``[0, max_position]`` falls in a bucket)."""
    if max_position < 0:
        raise ValueError(f"max_position must be >= 0, got {max_position}")
    k = int(max_position).bit_length()
    return np.array([0] + [2 ** i for i in range(k + 1)], np.int64)


def loss_by_position(per_token_losses: np.ndarray, positions: np.ndarray,
                     weights: np.ndarray | None = None, edges: Sequence[int] | None = None
                     ) -> dict[str, Any]:
    """Bucket per-token losses by within-document position.

    Args:
      per_token_losses: float[...] losses in nats (any shape).
      positions: int[...] of the same shape: the within-document position of each predicted token.
      weights: optional [...] mask (0: not scored, e.g. padding); default all ones.
      edges: bucket edges (default :func:`bucket_edges` of the largest scored position).

    Returns:
      the result dict of the module doc.

    Raises:
      ValueError: mismatched shapes, negative positions, or positions beyond the last edge.
    """
    loss = np.asarray(per_token_losses, np.float64)
    pos = np.asarray(positions, np.int64)
    w = np.ones_like(loss) if weights is None else np.asarray(weights, np.float64)
    if loss.shape != pos.shape or w.shape != loss.shape:
        raise ValueError(f"per_token_losses {loss.shape}, positions {pos.shape} and weights "
                         f"{w.shape} must have the same shape")
    keep = w != 0
    loss, pos, w = loss[keep], pos[keep], w[keep]
    if pos.size and pos.min() < 0:
        raise ValueError(f"positions must be >= 0, got {pos.min()}")
    e = bucket_edges(int(pos.max()) if pos.size else 0) if edges is None else np.asarray(edges)
    if pos.size and pos.max() >= e[-1]:
        raise ValueError(f"position {pos.max()} lies beyond the last bucket edge {e[-1]}")
    idx = np.searchsorted(e, pos, side="right") - 1
    k = len(e) - 1
    sums = np.bincount(idx, weights=loss * w, minlength=k)[:k]
    counts = np.bincount(idx, weights=w, minlength=k)[:k]
    return _result(e, sums, counts)


def _result(edges, sums, counts) -> dict[str, Any]:
    return {"edges": [int(x) for x in edges], "loss_sum": [float(x) for x in sums],
            "count": [float(x) for x in counts],
            "mean_loss": [float(s / c) if c else None for s, c in zip(sums, counts)],
            "total_loss": float(np.sum(sums)), "total_count": float(np.sum(counts))}


def merge_by_position(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The result over the tokens of both ``a`` and ``b`` (edges may differ in length: the
    longer list must extend the shorter). Extra keys of ``a`` are kept."""
    ea, eb = list(a["edges"]), list(b["edges"])
    long_e = ea if len(ea) >= len(eb) else eb
    if long_e[:min(len(ea), len(eb))] != (eb if long_e is ea else ea):
        raise ValueError(f"bucket edges {ea} and {eb} do not extend one another")
    k = len(long_e) - 1
    sums, counts = np.zeros(k), np.zeros(k)
    for r in (a, b):
        n = len(r["loss_sum"])
        sums[:n] += r["loss_sum"]
        counts[:n] += r["count"]
    extra = {key: v for key, v in a.items() if key not in _result([0, 1], [0], [0])}
    return {**extra, **_result(long_e, sums, counts)}


def write_by_position(path: str | Path, result: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.write_text(json.dumps(dict(result), indent=1) + "\n")
    return path


def load_by_position(path: str | Path, pattern: str = "by_position*.json") -> list[dict]:
    """The results in a file, or in every file matching ``pattern`` in a directory (sorted).

    Raises:
      FileNotFoundError: nothing matches (naming where it looked).
    """
    path = Path(path)
    files = sorted(path.glob(pattern)) if path.is_dir() else [path]
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(f"no {pattern} in {path} (write it with titans-lm eval "
                                f"--by_position, or titans_lm.eval.by_position.write_by_position)")
    out = []
    for f in files:
        r = json.loads(f.read_text())
        r.setdefault("name", f"{path.name if path.is_dir() else path.parent.name}")
        out.append(r)
    return out


def plot_by_position(runs: Mapping[str, Mapping[str, Any]], path: str | Path,
                     title: str = "loss by position") -> Path:
    """One curve per run: mean loss (nats) of each non-empty bucket against the bucket's
    geometric middle position, log-scaled x. Writes a PNG at ``path``."""
    fig, ax = pyplot().subplots(figsize=(6.4, 4.0))
    for label, r in runs.items():
        e = np.asarray(r["edges"], np.float64)
        mid = np.sqrt(np.maximum(e[:-1], 0.5) * np.maximum(e[1:] - 1, 0.5))
        y = np.array([np.nan if m is None else m for m in r["mean_loss"]], np.float64)
        ok = ~np.isnan(y)
        ax.plot(mid[ok], y[ok], marker="o", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("position in document (tokens)")
    ax.set_ylabel("mean token loss (nats)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_runs(paths: Sequence[str | Path], out: str | Path,
              title: str = "loss by position in document",
              pattern: str = "by_position*.json") -> dict[str, Any]:
    """Draw the loss-by-position results of several runs on one figure (the TTT paper's Fig. 2
    style): ``titans-lm plot --by_position W1 W2 ... [--out=F.png]``.

    Each path is a workdir holding ``pattern`` files or one such file; every result found becomes
    one curve, labelled ``<workdir name>`` (plus the result's ``name`` when a workdir holds
    several, and its ``step`` when two of them share a name). Returns the JSON summary: the PNG written and, per curve, the buckets' edges and
    mean losses.

    Raises:
      FileNotFoundError: a path with no result (:func:`load_by_position`).
    """
    runs = {}
    for w in paths:
        found = load_by_position(w, pattern)
        base = Path(w).name if Path(w).is_dir() else Path(w).parent.name
        for r in found:
            label = base if len(found) == 1 else f"{base} {r.get('name', '')}".strip()
            if label in runs:  # the same mode of another checkpoint step
                label = f"{label} step {r.get('step')}"
            runs[label] = r
    plot_by_position(runs, out, title)
    return {"out": str(out), "curves": {k: {"edges": r["edges"], "mean_loss": r["mean_loss"]}
                                        for k, r in runs.items()}}
