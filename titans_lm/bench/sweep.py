"""The experiment scripts' runner: one training per point of a grid, each in its own workdir.

Every point trains with ``titans-lm train`` in its own process (:func:`run_training`: the same
command a user would type, so rerunning with the same workdir resumes an unfinished run from its
checkpoint and reuses a finished one), or in this process (``scripts/memory_stability.py``, which
needs the loop's exception); its ``metrics.jsonl`` is then read back (:func:`train_records`,
:func:`final_train_loss`, :func:`median_tokens_per_sec`). :func:`run_grid` runs the points in
order, reports each on stderr and hands the rows so far to a writer after every point, so the
results files are current while the sweep runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

P = TypeVar("P")

PACKAGE_ROOT = Path(__file__).resolve().parents[2]   # the directory that holds ``titans_lm``


def field_value(text: str) -> tuple[str, str]:
    """Parses one ``--set FIELD=VALUE`` (an argparse ``type``): ``("FIELD", "VALUE")``, the value
    left as text for ``titans-lm train --config.FIELD=VALUE`` to parse.

    Raises:
      argparse.ArgumentTypeError: no ``=`` or an empty field.
    """
    import argparse  # deliberate: only the scripts' parsers need it
    field, sep, value = text.partition("=")
    if not sep or not field.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE (e.g. model.combine=sum), got {text!r}")
    return field.strip(), value


def backbones_and_seeds(parser, backbones: str, seeds: str, config_dir: str | Path
                        ) -> tuple[list[str], list[int]]:
    """The comma-separated ``--backbones`` and ``--seeds`` of a sweep script, parsed: each
    backbone must have ``<config_dir>/<name>.py``; ``parser.error`` (exit 2, one message) names
    a missing config or a seed that is not an integer."""
    names = [b for b in backbones.split(",") if b]
    try:
        ints = [int(s) for s in seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {seeds!r}")
    for b in names:
        if not (Path(config_dir) / f"{b}.py").is_file():
            parser.error(f"--backbones: no config file configs/{b}.py")
    return names, ints


def train_command(config: str, workdir: str | Path, overrides: Mapping[str, object],
                  flags: Sequence[str] = ()) -> list[str]:
    """``python -m titans_lm.cli train --config=CONFIG --workdir=W [flags] --config.K=V ...``."""
    return ([sys.executable, "-m", "titans_lm.cli", "train", f"--config={config}",
             f"--workdir={workdir}", *flags]
            + [f"--config.{k}={v}" for k, v in overrides.items()])


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """The outcome of :func:`run_training`: exit status, wall seconds and the log's last line."""

    returncode: int
    wall_s: float
    last_line: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_training(config: str, workdir: str | Path, overrides: Mapping[str, object], *,
                 flags: Sequence[str] = (), log_path: str | Path | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> TrainRun:
    """Train in a child process, its stdout and stderr appended to ``log_path`` (default
    ``<workdir>/train.log``); the child finds this ``titans_lm`` first on PYTHONPATH.

    ``env``: variables set for the child on top of this process's environment.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_path) if log_path is not None else workdir / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), child_env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    with open(log_path, "a") as log:
        proc = subprocess.run(train_command(config, workdir, overrides, flags), stdout=log,
                              stderr=subprocess.STDOUT, env=child_env,
                              cwd=str(cwd or PACKAGE_ROOT))
    wall = time.perf_counter() - t0
    lines = [x for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
    last = lines[-1] if lines else ""
    if proc.returncode != 0 and not last:
        last = f"exit status {proc.returncode}"
    return TrainRun(proc.returncode, wall, last)


def metric_records(workdir: str | Path) -> list[dict]:
    """Every record of ``<workdir>/metrics.jsonl`` in order ([] when there is none)."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def train_records(workdir: str | Path) -> dict[int, dict]:
    """{step: record} of the training records (those with a ``loss``; a resumed run may log a
    step again: the latest wins), in step order."""
    out = {}
    for r in metric_records(workdir):
        if "loss" in r and r.get("split", "train") == "train":
            out[int(r["step"])] = r
    return dict(sorted(out.items()))


def final_train_loss(workdir: str | Path, last: int) -> float | None:
    """Mean training loss of the last ``last`` logged steps (None: no training record)."""
    losses = [float(r["loss"]) for r in train_records(workdir).values()][-last:]
    return statistics.fmean(losses) if losses else None


def median_tokens_per_sec(workdir: str | Path) -> float | None:
    """Median training throughput over the logged steps after the first (its compile)."""
    rates = [float(r["tokens_per_sec"]) for r in list(train_records(workdir).values())[1:]
             if "tokens_per_sec" in r]
    return statistics.median(rates) if rates else None


def run_grid(points: Iterable[P], run_one: Callable[[P], dict], *,
             describe: Callable[[P], str] = str,
             write: Callable[[list[dict]], Any] | None = None) -> list[dict]:
    """``run_one(point)`` for each point in order; each point is announced on stderr, and
    ``write(rows so far)`` runs after every point. Returns the rows."""
    rows: list[dict] = []
    for point in points:
        print(f"[{describe(point)}] starting", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        row = run_one(point)
        rows.append(row)
        print(f"[{describe(point)}] done in {time.perf_counter() - t0:.0f}s: {json.dumps(row)}",
              file=sys.stderr, flush=True)
        if write is not None:
            write(rows)
    return rows
