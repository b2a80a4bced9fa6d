"""MAC's segments against the memory's chunk grid.

Documents may start anywhere: the memory resets exactly at any position, a start inside a chunk
cutting that chunk (docs/design.md#resets-inside-a-chunk), so ``data.doc_align`` (the padding of
documents to multiples of it) is a choice, not a requirement. One length still has to sit on the
chunk grid: MAC runs its memory segment by segment (``titans_lm.models.mac``), restarting the chunk
grid at every segment, so ``model.segment_len`` must be a multiple of ``model.memory.chunk_size``
for the mini-batches to be those of one pass over the sequence. ``titans_lm.config.validate`` runs
:func:`check_config_alignment`; the check is the config's own and needs nothing of the engine.
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
      multiples: {config field name: value} of every length that must tile into chunks
        (e.g. {"model.segment_len": 128}).
      chunk_field: how the chunk size is named in the message.
    Raises:
      ValueError: one message naming the chunk-size field and every offending field.
    """
    bad = alignment_problems(chunk_size, multiples)
    if bad:
        raise ValueError(
            f"{chunk_field}={chunk_size} must divide {' and '.join(bad)}: MAC runs its memory "
            f"segment by segment, and its chunks must tile a segment. Choose a chunk size that "
            f"divides it, or make it a multiple of the chunk size.")


def check_config_alignment(cfg) -> None:
    """:func:`check_reset_alignment` for a run config (an ml_collections ConfigDict): checks
    ``model.segment_len`` against ``model.memory.chunk_size`` where the model has both."""
    model = cfg.model
    if "memory" not in model or "chunk_size" not in model.memory or "segment_len" not in model:
        return
    check_reset_alignment(int(model.memory.chunk_size), {"model.segment_len": int(model.segment_len)})
