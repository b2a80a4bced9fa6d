"""The memory's chunk grid against the lengths it must fit: MAC's segments, and the training
window where reads come from the chunk-start state.

Documents may start anywhere: the memory resets exactly at any position, a start inside a chunk
cutting that chunk (docs/design.md#resets-inside-a-chunk), so ``data.doc_align`` (the padding of
documents to multiples of it) is a choice, not a requirement. One length still has to sit on the
chunk grid: MAC runs its memory segment by segment (``titans_lm.models.mac``), restarting the chunk
grid at every segment, so ``model.segment_len`` must be a multiple of ``model.memory.chunk_size``
for the mini-batches to be those of one pass over the sequence. And a memory that reads the
chunk-start state (``model.memory.read = "chunk_start"``, LaCT's "apply, then update") must have
more than one chunk in a training window: token t reads the state after the chunks before its own,
so with ``chunk_size >= data.seq_len`` every token of a window reads W0, no write is ever read,
and the memory trains as a fixed map; carried past the window at evaluation it then meets written
states it has never seen (``configs/lact.py``'s chunk of 512 on the memory suite's 256-token
windows: 180.4 ppl reset, 1,091.8 carried; docs/results/titans-family-rules.md). Training with the
state carried across windows (``train.carry_state``) reads the writes of earlier windows, so it
is allowed. ``titans_lm.config.validate`` runs :func:`check_config_alignment`; the checks are the
config's own and need nothing of the engine.
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


def reads_chunk_start(memory) -> bool:
    """Whether a memory config section reads the chunk-start state (``read="chunk_start"``)."""
    return memory.get("read", "after_write") == "chunk_start"


def check_chunk_start_reads(chunk_size: int, seq_len: int, carry_state: bool) -> None:
    """Raise ValueError where a chunk-start-reading memory would never read a write in training.

    Args:
      chunk_size: the memory's chunk (mini-batch) size b.
      seq_len: the training window (``data.seq_len``).
      carry_state: whether training carries the state from window to window
        (``train.carry_state``); then later windows read earlier windows' writes.
    Raises:
      ValueError: ``chunk_size >= seq_len`` without ``carry_state``, naming both fields and the
        three ways out.
    """
    if carry_state or chunk_size < seq_len:
        return
    fit = max(1, seq_len // 4)
    raise ValueError(
        f"config fields model.memory.chunk_size={chunk_size} and data.seq_len={seq_len}: with "
        f"model.memory.read='chunk_start' every token of a {seq_len}-token window reads the "
        f"chunk-start state, which inside one chunk is W0, so the memory never reads a write in "
        f"training (and meets written states only when carried at evaluation). Use a chunk "
        f"smaller than the window (e.g. --config.model.memory.chunk_size={fit}), a window of "
        f"several chunks (--config.data.seq_len={4 * chunk_size}), or train.carry_state=True.")


def check_config_alignment(cfg, *, training: bool = True) -> None:
    """The chunk-grid checks for a run config (an ml_collections ConfigDict):
    :func:`check_reset_alignment` of ``model.segment_len`` against ``model.memory.chunk_size``
    where the model has both, and, for a config to train (``training``),
    :func:`check_chunk_start_reads` where the memory reads the chunk-start state."""
    model = cfg.model
    if "memory" not in model or "chunk_size" not in model.memory:
        return
    chunk = int(model.memory.chunk_size)
    if training and reads_chunk_start(model.memory):
        check_chunk_start_reads(chunk, int(cfg.data.seq_len),
                                bool(cfg.train.get("carry_state", False)))
    if "segment_len" in model:
        check_reset_alignment(chunk, {"model.segment_len": int(model.segment_len)})
