"""Checkpoint integrity: a manifest of every file of a finished checkpoint, and its verification.

Orbax makes a save atomic (it writes ``<step>.orbax-checkpoint-tmp-*`` and renames it when
complete), but nothing notices a file damaged later: truncated by a full disk or a copy cut
short, overwritten, or removed. After a save is complete on disk, process 0 writes
``<step>/integrity.json``:

    {"version": 1, "step": 6, "files": {"state/params.embed.embedding/0.0": [size, crc32], ...}}

covering every file of the checkpoint directory (CRC-32 via :func:`zlib.crc32`, ~1 GB/s).
:func:`verify` compares the directory with it and returns one :class:`Damage` per bad file
(missing, truncated, grown, checksum mismatch). A checkpoint without a manifest (written before
manifests existed, or a process killed between the rename and the manifest) is "unverified": its
files can only be checked by reading them.

The state item is written one directory per array (``state/params.<path>/``,
``state/opt_state.<path>/``; see :mod:`titans_lm.train.checkpoint`), so a damaged file names the
array it holds and :func:`part_of` tells whether it holds parameters (evaluation needs them)
or only optimiser state (only resuming training needs it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from pathlib import Path

MANIFEST = "integrity.json"
_CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True)
class Damage:
    """One damaged file of a checkpoint.

    Attributes:
      step: the checkpoint's step.
      file: path relative to the checkpoint directory (e.g. ``state/params.embed/0.0``).
      problem: what is wrong, e.g. "truncated (120 of 1053 bytes)".
    """
    step: int
    file: str
    problem: str

    @property
    def part(self) -> str:
        """"parameters", "optimizer state", "training state", "data-iterator state",
        "config" or "metadata" (:func:`part_of`)."""
        return part_of(self.file)

    def describe(self) -> str:
        return f"{self.file} ({self.part}) is {self.problem}"


def part_of(relpath: str) -> str:
    """Which part of a checkpoint a file (relative to the step directory) belongs to.

    ``state/params.*`` -> "parameters"; ``state/opt_state.*`` -> "optimizer state";
    ``state/step``, ``state/rng`` -> "training state"; ``data/*`` -> "data-iterator state";
    ``config/*`` -> "config"; anything else (``state/_METADATA``, ``_CHECKPOINT_METADATA``, ...)
    -> "metadata" (needed to read any item).
    """
    parts = relpath.split("/")
    if parts[0] == "state" and len(parts) > 2:
        name = parts[1]
        if name.startswith("params."):
            return "parameters"
        if name.startswith("opt_state."):
            return "optimizer state"
        if name in ("step", "rng"):
            return "training state"
    if parts[0] == "data":
        return "data-iterator state"
    if parts[0] == "config":
        return "config"
    return "metadata"


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(step_dir: Path) -> list[str]:
    out = []
    for root, _, names in os.walk(step_dir):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), step_dir).replace(os.sep, "/")
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def write_manifest(step_dir: str | Path, step: int) -> Path:
    """Write ``<step_dir>/integrity.json`` (atomically: a temporary file renamed).

    Call only once the checkpoint is complete on disk (after orbax's rename)."""
    step_dir = Path(step_dir)
    files = {rel: [(step_dir / rel).stat().st_size, _crc32(step_dir / rel)]
             for rel in _files(step_dir)}
    tmp = step_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "step": step, "files": files}))
    os.replace(tmp, step_dir / MANIFEST)
    return step_dir / MANIFEST


def has_manifest(step_dir: str | Path) -> bool:
    return (Path(step_dir) / MANIFEST).is_file()


def verify(step_dir: str | Path, step: int) -> list[Damage] | None:
    """The damaged files of a checkpoint, ``[]`` when all match, ``None`` without a manifest.

    A manifest that cannot be parsed is itself reported as damage (file ``integrity.json``).
    """
    step_dir = Path(step_dir)
    path = step_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError) as e:
        return [Damage(step, MANIFEST, f"unreadable ({type(e).__name__})")]
    out = []
    for rel, (size, crc) in sorted(files.items()):
        f = step_dir / rel
        if not f.is_file():
            out.append(Damage(step, rel, "missing"))
            continue
        have = f.stat().st_size
        if have < size:
            out.append(Damage(step, rel, f"truncated ({have} of {size} bytes)"))
        elif have > size:
            out.append(Damage(step, rel, f"longer than written ({have} instead of {size} bytes)"))
        elif _crc32(f) != crc:
            out.append(Damage(step, rel, "corrupted (its CRC-32 differs from the one written)"))
    return out


__all__ = ["Damage", "MANIFEST", "has_manifest", "part_of", "verify", "write_manifest"]
