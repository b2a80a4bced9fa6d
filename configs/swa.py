"""Sliding-window-only Transformer++ (the control of the long-context comparisons):
``--config=configs/swa.py:<size>``, size as in ``configs/transformer.py``.

The Transformer++ of ``configs/transformer.py`` with every layer's attention limited to a sliding
window (``model.window``) equal to the hybrids' window (``configs/mag.py``, ``configs/mal.py``):
64 tokens at tiny, 1024 at the paper sizes. It sees exactly as far back as the hybrids' attention,
so whatever a memory model recalls beyond the window is the memory's doing.
"""

from __future__ import annotations

from pathlib import Path

from titans_lm.config import load_module

_transformer = load_module(Path(__file__).resolve().with_name("transformer.py"))
SIZES = _transformer.SIZES


def get_config(size: str = "tiny"):
    """Full run config for a sliding-window Transformer++ of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    c = _transformer.get_config(size)
    c.model.window = 64 if c.model.size == "tiny" else 1024
    return c
