"""Where documents may start: the memory resets only at chunk starts, so configs must align them.

The engine returns the memory to its initial state only before a chunk (t % chunk_size == 0;
``titans_lm.memory.scan.memory_scan``); a document that started inside a chunk would continue the
previous document's memory. Instead of resetting mid-chunk, every configuration in which a
document start could fall inside a chunk is rejected up front:

* the data pipeline pads documents to, and starts windows at, multiples of ``data.doc_align``, so
  ``model.memory.chunk_size`` must divide ``data.doc_align``;
* MAC runs the memory segment by segment, restarting the chunk grid at every segment, so
  ``model.segment_len`` must be a multiple of ``model.memory.chunk_size``.

Outside jit the engine also rejects a reset flag off a chunk start (``check_resets``). These are
checks of the config (``titans_lm.config.validate`` runs :func:`check_config_alignment`), so they
live with it and need nothing of the engine.
"""

from __future__ import annotations

from typing import Mapping


def alignment_problems(chunk_size: int, multiples: Mapping[str, int]) -> list[str]:
    """The fields of ``multiples`` ({field name: value}) that are not multiples of chunk_size."""
    return [f"{name}={value}" for name, value in multiples.items()
            if int(value) < 1 or int(value) % chunk_size]


def check_reset_alignment(chunk_size: int, multiples: Mapping[str, int],
                          chunk_field: str = "model.memory.chunk_size") -> None:
    """Raise ValueError unless every value in ``multiples`` is a positive multiple of chunk_size.

    Args:
      chunk_size: the memory's chunk (mini-batch) size b.
      multiples: {config field name: value} of every length at which a document may start
        (e.g. {"data.doc_align": 64, "model.segment_len": 128}).
      chunk_field: how the chunk size is named in the message.
    Raises:
      ValueError: one message naming the chunk-size field and every offending field.
    """
    bad = alignment_problems(chunk_size, multiples)
    if bad:
        raise ValueError(
            f"{chunk_field}={chunk_size} must divide {' and '.join(bad)}: documents start at "
            f"multiples of these, and the memory resets only at chunk starts, so a document would "
            f"continue the previous one's memory. Choose a chunk size that divides them, or make "
            f"them multiples of the chunk size (for a large chunk raise data.doc_align, e.g. "
            f"--config.data.doc_align={chunk_size}: documents are then padded to multiples of it).")


def check_config_alignment(cfg) -> None:
    """:func:`check_reset_alignment` for a run config (an ml_collections ConfigDict).

    Checks ``data.doc_align`` and, where the model has one, ``model.segment_len`` against
    ``model.memory.chunk_size``; configs without a memory section pass.
    """
    model = cfg.model
    if "memory" not in model or "chunk_size" not in model.memory:
        return
    multiples = {"data.doc_align": int(cfg.data.doc_align)}
    if "segment_len" in model:
        multiples["model.segment_len"] = int(model.segment_len)
    check_reset_alignment(int(model.memory.chunk_size), multiples)
