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

Weights & Biases (optional, ``pip install 'titans-lm[wandb]'``): with ``TITANS_LM_WANDB=<project>``
the same scalars also go to a W&B run of that project (:class:`WandbWriter`), named after the
workdir; its id is kept in ``<workdir>/wandb_run_id`` so a resumed training continues the same
W&B run, and its files are under ``<workdir>/wandb``. W&B's own settings apply (``WANDB_MODE=offline``
logs without a network; ``wandb sync`` uploads later).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from tensorboardX import SummaryWriter

WANDB_ENV = "TITANS_LM_WANDB"


def read_metrics(workdir: str | Path) -> list[dict]:
    """All records of ``<workdir>/metrics.jsonl`` (empty when the file does not exist)."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class WandbWriter:
    """The metric records mirrored to a Weights & Biases run (module docstring).

    Args:
      workdir: the run directory (the W&B run's name, id file and files).
      project: the W&B project.
      config: the run config as a dict (the W&B run's config).

    Raises:
      ValueError: wandb is not installed (naming the install command).
    """

    def __init__(self, workdir: str | Path, project: str, config: Mapping | None = None):
        try:
            import wandb  # deliberate: optional (titans-lm[wandb]), loaded only when asked for
        except ImportError:
            raise ValueError(f"{WANDB_ENV}={project}: Weights & Biases is not installed; "
                             f"pip install 'titans-lm[wandb]' (or unset {WANDB_ENV})") from None
        workdir = Path(workdir)
        id_file = workdir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=project, name=workdir.resolve().name, id=run_id,
                              resume="allow", dir=str(workdir), config=dict(config or {}))

    def write(self, step: int, values: Mapping[str, float], prefix: str) -> None:
        self.run.log({f"{prefix}/{k}": float(v) for k, v in values.items()}, step=int(step))

    def close(self) -> None:
        self.run.finish()


class MetricWriter:
    """Append metric records to the JSONL file and TensorBoard (and W&B when asked for).

    Args:
      workdir: the run directory.
      resume_step: the step the run starts from; later records already on disk are dropped.
      enabled: False on non-primary hosts (writes nothing).
      config: the run config as a dict, for a W&B run (``TITANS_LM_WANDB``).

    Raises:
      ValueError: ``TITANS_LM_WANDB`` is set but wandb is not installed.
    """

    def __init__(self, workdir: str | Path, resume_step: int = 0, enabled: bool = True,
                 config: Mapping | None = None):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        project = os.environ.get(WANDB_ENV, "").strip()
        if project:
            Path(workdir).mkdir(parents=True, exist_ok=True)
            self._wandb = WandbWriter(workdir, project, config)
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
        if self._wandb is not None:
            self._wandb.write(step, values, tb_prefix)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()
            if self._wandb is not None:
                self._wandb.close()
