"""A run config as JSON: what ``<workdir>/config.json``, ``titans-lm config`` and a checkpoint's
``config`` item hold."""

from __future__ import annotations

import json
from typing import Any

import ml_collections


def config_to_json_dict(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The config as plain JSON types (tuples become lists)."""
    return json.loads(cfg.to_json_best_effort())


def config_json(cfg: ml_collections.ConfigDict) -> str:
    """The config as indented JSON with sorted keys (the content of ``config.json``)."""
    return json.dumps(config_to_json_dict(cfg), indent=1, sort_keys=True) + "\n"
