"""The benchmarks' and experiments' output: JSON lines (stdout and an appended file) and JSON
files. Figures use the package's drawing helpers (``titans_lm.train.plot``: ``pyplot``,
``heat_map``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO


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
