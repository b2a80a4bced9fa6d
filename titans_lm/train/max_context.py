"""The attention context a run's model keeps: ``model.max_context`` of a full-attention model.

:func:`with_max_context` sets the bound of a full-attention KV cache (Transformer++) for stateful
use: training with ``train.carry_state`` (``titans_lm.train.loop``), ``titans-lm eval
--context=carry`` and generation (``titans_lm.eval.restore``). The field changes no parameter.
"""

from __future__ import annotations

import ml_collections


def with_max_context(cfg: ml_collections.ConfigDict, max_context: int | None
                     ) -> ml_collections.ConfigDict:
    """``cfg`` with ``model.max_context`` (the bound of a full-attention KV cache) set.

    Only for models with full attention (Transformer++, whose config has the field; checkpoints
    written before it existed included): ``max_context`` None keeps a non-zero value the config
    has and otherwise uses ``data.seq_len`` (the training length: carry mode's sliding-context
    baseline). The field changes no parameter. Other models' configs are returned unchanged.
    """
    cfg = ml_collections.ConfigDict(cfg.to_dict())
    if "max_context" not in cfg.model and cfg.model.get("name") != "transformer":
        return cfg
    if max_context is None:
        max_context = int(cfg.model.get("max_context", 0) or cfg.data.seq_len)
    if int(max_context) < 1:
        raise ValueError(f"max_context must be >= 1, got {max_context}")
    cfg.model.max_context = int(max_context)
    return cfg


__all__ = ["with_max_context"]
