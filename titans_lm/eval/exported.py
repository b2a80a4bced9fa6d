"""An exported model: one folder with the parameters, the config and the tokenizer.

``titans-lm export --workdir=W --out=DIR`` (:func:`titans_lm.pretrained.export`) writes::

  DIR/model.safetensors   the parameters, one tensor per parameter, named by its path in the
                          parameter tree ("blocks/0/attn/wq/kernel"), in the dtype trained
  DIR/config.json         the run's resolved config (as in the run folder and the checkpoint)
  DIR/tokenizer.model     the SentencePiece model the run was trained with
  DIR/data.json           the run's data record (tokenizer and train text hashes), when it has one
  DIR/export.json         what the folder is: format version, checkpoint step, source run,
                          parameter count, the tokenizer's sha256

Such a folder is read wherever a run folder is (``--workdir=DIR`` for ``eval`` and
``generate``, :func:`titans_lm.eval.restore.load_run`, :func:`titans_lm.pretrained.load`); it
needs neither the checkpoints nor the training corpus to generate. The parameters are read by
the paths of the model's own parameter tree, each checked for its shape and dtype, so a folder
that does not fit the model its config describes is refused with the parameter named.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from safetensors.numpy import load_file, save_file

from titans_lm.config.serialize import config_json

FORMAT = "titans_lm-export-1"
EXPORT_FILE = "export.json"
PARAMS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"
DATA_FILE = "data.json"


class ExportError(ValueError):
    """An export folder that cannot be written or read (the message names the file and the fix)."""


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is an exported model folder (it holds ``export.json``)."""
    return (Path(path) / EXPORT_FILE).is_file()


def param_name(key_path: tuple) -> str:
    """The tensor name of a parameter: its path in the tree joined by "/" ("blocks/0/mlp/w1")."""
    return jax.tree_util.keystr(key_path, simple=True, separator="/")


def flat_params(params: Any) -> dict[str, np.ndarray]:
    """``{name: host array}`` of a parameter tree (:func:`param_name` names).

    Raises:
      ExportError: a parameter that is not fully on this process (a multi-process run).
    """
    out = {}
    for key_path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            raise ExportError(f"parameter {param_name(key_path)} is spread over several "
                              f"processes; export from one process")
        out[param_name(key_path)] = np.asarray(jax.device_get(x))
    return out


def write_export(out: str | Path, *, params: Any, cfg: ml_collections.ConfigDict,
                 tokenizer_model: bytes, step: int, source: str | Path,
                 data_record: Mapping[str, Any] | None = None) -> Path:
    """Write an export folder (module docstring) and return its path.

    Args:
      out: the folder; created, or replaced when it is an export folder already.
      params: the parameter tree (pure dict of arrays). cfg: the run's saved config.
      tokenizer_model: the SentencePiece model's bytes. step: the checkpoint step.
      source: the run folder exported. data_record: the run's ``data.json`` content.

    Raises:
      ExportError: ``out`` is a file, a run folder, or a non-empty folder that is no export.
    """
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"--out={out} is a file; name a new folder")
        if (out / "checkpoints").exists():
            raise ExportError(f"--out={out} is a run folder (it holds checkpoints/); name a new "
                              f"folder")
        if any(out.iterdir()) and not is_export(out):
            raise ExportError(f"--out={out} is a folder with other files in it; name a new or "
                              f"empty folder (an earlier export there is replaced)")
    tensors = flat_params(params)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / PARAMS_FILE), metadata={"format": FORMAT, "step": str(step)})
    _as_created(tmp / PARAMS_FILE)   # safetensors writes 0600; the other files follow the umask
    (tmp / CONFIG_FILE).write_text(config_json(cfg))
    (tmp / TOKENIZER_FILE).write_bytes(bytes(tokenizer_model))
    if data_record is not None:
        (tmp / DATA_FILE).write_text(json.dumps(dict(data_record), indent=1) + "\n")
    meta = {"format": FORMAT, "step": int(step), "source": str(Path(source).resolve()),
            "model": str(cfg.model.get("name", "")),
            "n_params": int(sum(x.size for x in tensors.values())),
            "tokenizer_sha256": hashlib.sha256(bytes(tokenizer_model)).hexdigest(),
            "files": sorted(p.name for p in tmp.iterdir())}
    (tmp / EXPORT_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def read_meta(path: str | Path) -> dict[str, Any]:
    """``export.json`` of an export folder.

    Raises:
      ExportError: it is missing, unreadable, or of an unknown format.
    """
    f = Path(path) / EXPORT_FILE
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{f}: not a readable export record ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ExportError(f"{f}: unknown export format {found!r} (this version reads {FORMAT})")
    return meta


def read_config(path: str | Path) -> ml_collections.ConfigDict:
    """The config of an export folder.

    Raises:
      ExportError: ``config.json`` is missing or not JSON.
    """
    f = Path(path) / CONFIG_FILE
    try:
        return ml_collections.ConfigDict(json.loads(f.read_text()))
    except (OSError, ValueError) as e:
        raise ExportError(f"{f}: cannot read the exported config ({e}); export the run again") from None


def read_params(path: str | Path, abstract: Any) -> Any:
    """The parameters of an export folder, as host arrays in the tree of ``abstract``.

    Args:
      abstract: the model's parameter tree of ``jax.ShapeDtypeStruct`` (names, shapes, dtypes).

    Returns:
      The same tree with numpy arrays read from ``model.safetensors``.

    Raises:
      ExportError: the file is missing or unreadable, a parameter is missing, has another shape
        or dtype, or the file holds a tensor the model has no parameter for.
    """
    f = Path(path) / PARAMS_FILE
    try:
        tensors = load_file(str(f))
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise ExportError(f"{f}: cannot read the parameters ({str(e).splitlines()[0]}); export "
                          f"the run again") from None
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    out = []
    for key_path, a in leaves:
        name = param_name(key_path)
        if name not in tensors:
            raise ExportError(f"{f}: no tensor {name!r}, which the model of {path}/{CONFIG_FILE} "
                              f"has; the folder does not match its config")
        x = tensors.pop(name)
        if tuple(x.shape) != tuple(a.shape) or x.dtype != a.dtype:
            raise ExportError(f"{f}: tensor {name!r} is {x.dtype}{list(x.shape)}, the model "
                              f"expects {a.dtype}{list(a.shape)}; the folder does not match its "
                              f"config")
        out.append(x)
    if tensors:
        raise ExportError(f"{f}: tensors the model has no parameter for: "
                          f"{', '.join(sorted(tensors)[:5])}; the folder does not match its config")
    return jax.tree_util.tree_unflatten(treedef, out)


__all__ = ["CONFIG_FILE", "DATA_FILE", "EXPORT_FILE", "ExportError", "FORMAT", "PARAMS_FILE",
           "TOKENIZER_FILE", "flat_params", "is_export", "param_name", "read_config", "read_meta",
           "read_params", "write_export"]


def _as_created(path: Path) -> None:
    """Give ``path`` the permissions a newly created file gets (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
