"""What a run folder records besides checkpoints and metrics: ``config.json`` and ``data.json``.

``config.json`` is the resolved config of the run (:func:`titans_lm.config.serialize.config_json`;
``titans-lm config`` prints the same text without training), written when a run starts or
resumes, after the checkpoint's config was found compatible, so it always describes the
checkpoints beside it.

``data.json`` records which tokenizer and which text the run was trained on.

The token stores are cached under content hashes (``titans_lm.data.prepare``): change a corpus
file or the cached tokenizer and the next ``prepare`` builds new stores rather than reusing the
old ones. A run, though, is tied to the text it started on: its parameters expect one tokenizer,
its checkpointed data position indexes one train store. So ``train`` records, when a run starts::

  {"corpus": ..., "tokenizer_sha256": ..., "stores": {"train": "<store dir name>", ...}}

(a store's directory name carries the sha256 key of its tokenizer and texts), and resuming or
evaluating the run checks that the data prepared now has the same tokenizer and the same train
split. A difference is refused with a message naming what changed; it is never mixed silently.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_collections

from titans_lm.config.serialize import config_json

RUN_DATA_FILE = "data.json"
CONFIG_FILE = "config.json"


def write_run_config(workdir: str | Path, cfg: ml_collections.ConfigDict) -> Path:
    """Write ``<workdir>/config.json`` atomically (replaced on every start or resume)."""
    path = Path(workdir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(config_json(cfg))
    tmp.replace(path)
    return path


def run_data_record(prepared, corpus: str) -> dict:
    """The record of a :class:`titans_lm.data.prepare.Prepared` (tokenizer hash, store keys)."""
    return {"corpus": corpus, "tokenizer_sha256": prepared.tokenizer.fingerprint,
            "vocab_size": prepared.tokenizer.vocab_size,
            "stores": {s: st.path.name for s, st in sorted(prepared.stores.items())}}


def write_run_data(workdir: str | Path, prepared, corpus: str) -> Path:
    """Write ``<workdir>/data.json`` (keeping the keys of splits not prepared now)."""
    path = Path(workdir) / RUN_DATA_FILE
    rec = run_data_record(prepared, corpus)
    old = read_run_data(workdir)
    if old and old.get("tokenizer_sha256") == rec["tokenizer_sha256"]:
        rec["stores"] = {**old.get("stores", {}), **rec["stores"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def read_run_data(workdir: str | Path) -> dict | None:
    """The recorded data of a run, or None (a run from before the record existed)."""
    path = Path(workdir) / RUN_DATA_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def check_run_data(workdir: str | Path, prepared, corpus: str, *, action: str,
                   splits: tuple[str, ...] = ("train",)) -> None:
    """Refuse data that differs from what the run in ``workdir`` was trained on.

    Args:
      prepared: the data prepared now. corpus: ``data.corpus``.
      action: "resume" or "evaluate" (for the message).
      splits: the splits whose store keys must match (the tokenizer always must).

    Raises:
      ValueError: the tokenizer or a split's text differs (naming which, and what to do).
    """
    old = read_run_data(workdir)
    if old is None:
        return
    where = Path(workdir) / RUN_DATA_FILE
    fix = ("restore the corpus files the run was trained on, or train a new run in a new "
           "--workdir")
    if old.get("tokenizer_sha256") != prepared.tokenizer.fingerprint:
        raise ValueError(
            f"cannot {action} {workdir}: the tokenizer built now from data.corpus={corpus} "
            f"(sha256 {prepared.tokenizer.fingerprint[:12]}) differs from the one the run was "
            f"trained with ({str(old.get('tokenizer_sha256'))[:12]}, recorded in {where}): the "
            f"training text changed since the run began; {fix}")
    for s in splits:
        was, now = old.get("stores", {}).get(s), prepared.stores[s].path.name if s in prepared.stores else None
        if was is not None and now is not None and was != now:
            raise ValueError(
                f"cannot {action} {workdir}: the {s} split of data.corpus={corpus} changed since "
                f"the run began (token store {now}, recorded {was} in {where}); {fix}")
