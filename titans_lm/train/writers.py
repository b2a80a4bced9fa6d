"""Where training metrics go: ``<workdir>/metrics.jsonl`` and TensorBoard events in ``<workdir>/tb``.

Each JSONL line is one record ``{"step": int, <name>: float, ..., "time": str, "wall_s": float}``:
train records carry ``loss``, ``grad_norm``, ``lr``, ``tokens`` (the scored target tokens of that
step), ``tokens_seen`` (the input tokens of all steps so far, ``step * batch_size * seq_len``,
padding included), ``tokens_per_sec`` and ``mfu`` (model FLOPs utilisation,
``titans_lm.train.mfu``; absent for a backbone the FLOP model does not count); validation records
``val_loss``, ``val_ppl`` and ``val_tokens_per_sec``. A run that resumes writes one event record
``{"step": S, "event": "resume", ...}`` at the step it resumes from (``plot`` marks it). ``time`` is when the record was written (UTC, ISO 8601) and
``wall_s`` the seconds the run has been training (from the first step loop, summed over resumed
segments: a resume continues from the last kept record's ``wall_s``; data preparation and
compilation before the step loop are not counted). On resume from step S, records with ``step > S`` (written after the checkpoint the run
resumes from) are dropped first, so the file never holds two values for one step.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

from tensorboardX import SummaryWriter


def read_metrics(workdir: str | Path) -> list[dict]:
    """All records of ``<workdir>/metrics.jsonl`` (empty when the file does not exist)."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricWriter:
    """Append metric records to the JSONL file and TensorBoard.

    Args:
      workdir: the run directory.
      resume_step: the step the run starts from; later records already on disk are dropped.
      enabled: False on non-primary hosts (writes nothing).
    """

    def __init__(self, workdir: str | Path, resume_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        kept = [r for r in read_metrics(workdir) if r.get("step", 0) <= resume_step and
                not (r.get("event") and r.get("step") == resume_step)]
        self._wall0 = max([float(r.get("wall_s", 0.0)) for r in kept] or [0.0])
        self._t0 = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._file = self.path.open("a")
        self._tb = SummaryWriter(str(Path(workdir) / "tb"), purge_step=resume_step + 1)
        if resume_step > 0:
            self._record(resume_step, {"event": "resume"})
            self._tb.add_text("events", f"resumed from the checkpoint at step {resume_step}",
                              resume_step)

    def _record(self, step: int, fields: Mapping) -> None:
        rec = {"step": int(step), **fields}
        rec["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        rec["wall_s"] = round(self._wall0 + time.perf_counter() - self._t0, 3)
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()

    def write(self, step: int, values: Mapping[str, float], tb_prefix: str) -> None:
        """One record at ``step``; TensorBoard tags are ``<tb_prefix>/<name>``."""
        if not self.enabled:
            return
        self._record(step, {k: (float(v) if math.isfinite(float(v)) else str(float(v)))
                            for k, v in values.items()})
        for k, v in values.items():
            self._tb.add_scalar(f"{tb_prefix}/{k}", float(v), int(step))

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()
