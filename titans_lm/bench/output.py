"""The benchmarks' and experiments' output: JSON lines (stdout and an appended file), JSON files
and PNG heat maps (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np


def emit(obj: dict, out: IO[str] | None = None) -> None:
    """Print ``obj`` as one JSON line (flushed) and append it to ``out`` when given."""
    line = json.dumps(obj)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def write_json(path: str | Path, obj, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON to ``path`` (parent folders created); NaN becomes null."""
    path = Path(path)
    os.makedirs(path.parent, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(obj), indent=indent) + "\n")
    return path


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib  # deliberate: matplotlib loads only to draw
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deliberate: matplotlib loads only to draw
    return plt


def heat_map(path: str | Path, grid, row_labels: Sequence[str], col_labels: Sequence[str],
             title: str, *, vmin: float = 0, vmax: float = 100) -> Path:
    """A heat map of ``grid`` [rows, cols] (NaN: an empty cell) with each value written in its
    cell, saved as a PNG."""
    plt = pyplot()
    grid = np.asarray(grid, float)
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(col_labels), 1.0 + 0.45 * len(row_labels)))
    im = ax.imshow(grid, vmin=vmin, vmax=vmax, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(col_labels)), col_labels, fontsize=7, rotation=30)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    for i in range(len(row_labels)):
        for j in range(len(col_labels)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}" if grid[i, j] >= 10 else f"{grid[i, j]:.1f}",
                        ha="center", va="center", fontsize=7,
                        color="white" if grid[i, j] < 0.6 * vmax else "black")
    fig.colorbar(im, ax=ax)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
