"""Document structure of a token stream that arrives in consecutive calls (carried state).

A stream is what a batch row sees over several calls ``model(tokens_BT, segment_ids_BT, state)``:
the tokens of call n follow those of call n - 1. :func:`make_stream` derives, once per call, the
document structure every mixer needs (:class:`Stream`) from the call's segment ids and the small
:class:`StreamState` the shell carries, so that a call over ``[w1 || w2]`` and the call over ``w1``
followed by the call over ``w2`` see the same runs, document starts and positions.

Conventions (identical to a single call when the state is fresh):

- runs, for attention and RoPE (``titans_lm.nn.segments``): a new run starts wherever the id
  changes, a change to or from padding included; the first token of a stream starts a run.
  ``doc_ids`` are 1-based run counters that keep counting across calls (so two runs never share an
  id within a row); persistent positions (:data:`PERSISTENT_SEGMENT_ID`) get -1. ``positions``
  count from 0 at each run start and continue across calls; persistent positions get 0.
- memory document starts: the id changes to a non-zero id (padding is not a start; a padding
  run continues, and with theta = 0 leaves frozen, the memory of the document before it). A continued call whose first token has the id of the previous call's
  last token does NOT start a document there.

Persistent tokens (Titans, Behrouz et al. 2025, section 3.3) sit before the stream:
``LanguageModel.init_state`` feeds them as one call and then sets ``position`` back to 0, so the
stream's real tokens start at position 0 and the memory's chunk grid (``offset % chunk_size``) is
that of the real tokens.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID, _check_ids, is_concrete


class StreamState(NamedTuple):
    """What the shell carries between calls about the stream (a pytree of int32 arrays).

    position: int32 [] tokens of the stream seen so far (every row advances by T per call).
    last_segment_id: int32 [B] segment id of the last token of the previous call (0 at init).
    doc_index: int32 [B] number of runs seen in the row so far (0 at init).
    doc_position: int32 [B] within-run position of the last token seen (-1 at init: nothing seen).
    """

    position: jax.Array
    last_segment_id: jax.Array
    doc_index: jax.Array
    doc_position: jax.Array


@dataclasses.dataclass(frozen=True)
class Stream:
    """The document structure of one call, computed once by the shell and passed to every mixer.

    Array fields (int32 unless said):
      segment_ids [B, T]: this call's raw ids (0 padding, -1 persistent, documents >= 1).
      doc_ids [B, T]: run ids unique in the row across calls (for attention masks and caches);
        persistent positions -1.
      starts bool [B, T]: memory document starts (the id changes to a non-zero id; token 0 is a
        start iff its id differs from the previous call's last id and is non-zero).
      positions [B, T]: within-run positions continuing across calls (RoPE, conv taps);
        persistent positions 0.
      offset []: stream position of token 0 (= ``StreamState.position``); the memory's chunk phase
        is ``offset % chunk_size``.

    Static fields (part of the pytree structure, not traced):
      fresh: True when the mixers' incoming state holds no token of the stream yet (it is
        ``mixer.init_state(B)``, or what ``LanguageModel.init_state`` leaves after the persistent
        prefix) and ``offset`` is 0, so a mixer may skip cache / buffer work. False promises
        nothing (a mixer then handles any state); the results are the same either way.
      no_persistent: True promises that no position of the call is persistent (the LM shell's
        calls: its persistent tokens come in their own call, from ``init_state``), so
        sliding-window attention may run in bands of W queries. False promises nothing.

    A registered pytree (``jax.tree_util.register_dataclass``), so it passes through jit, remat
    and scan; ``_replace`` works as on a NamedTuple.
    """

    segment_ids: jax.Array
    doc_ids: jax.Array
    starts: jax.Array
    positions: jax.Array
    offset: jax.Array
    fresh: bool = False
    no_persistent: bool = False

    def _replace(self, **changes) -> "Stream":
        return dataclasses.replace(self, **changes)

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T) of the call."""
        return tuple(self.segment_ids.shape)


jax.tree_util.register_dataclass(
    Stream, data_fields=["segment_ids", "doc_ids", "starts", "positions", "offset"],
    meta_fields=["fresh", "no_persistent"])


def fresh_stream_state(batch_size: int) -> StreamState:
    """The state of a stream that has seen nothing: position 0, last id 0, no runs, position -1.

    Raises:
      ValueError: for batch_size < 1.
    """
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    B = int(batch_size)
    return StreamState(position=jnp.zeros((), jnp.int32),
                       last_segment_id=jnp.zeros((B,), jnp.int32),
                       doc_index=jnp.zeros((B,), jnp.int32),
                       doc_position=jnp.full((B,), -1, jnp.int32))


def make_stream(segment_ids_BT, state: StreamState, *, fresh: bool = False,
                no_persistent: bool = False) -> tuple[Stream, StreamState]:
    """This call's :class:`Stream` and the state after it.

    Args:
      segment_ids_BT: int [B, T] segment ids of the call (T >= 1).
      state: the :class:`StreamState` before the call (``fresh_stream_state(B)`` for a new stream).
      fresh: the static ``Stream.fresh`` promise (see :class:`Stream`); pass True only when the
        mixers' states hold no token yet and ``state.position`` is 0.
      no_persistent: the static ``Stream.no_persistent`` promise; checked when the ids are
        concrete (outside jit).

    Returns:
      (stream, new_state). With a fresh state the stream equals, field for field,
      ``segments.document_ids`` / ``segments.segment_positions`` (runs), and its ``starts`` are
      ``(ids != ids shifted right by one, 0 in front) & (ids != 0)`` (memory starts).

    Raises:
      ValueError: on ids that are not a 2-D integer array, an empty call, a state whose batch
        size differs from the ids', or (outside jit) persistent ids under ``no_persistent``.
    """
    s = _check_ids(segment_ids_BT).astype(jnp.int32)
    # numpy, not jnp: under jit a jnp op on a closed-over constant is staged (a tracer)
    if no_persistent and is_concrete(s) and bool(np.any(np.asarray(s) == PERSISTENT_SEGMENT_ID)):
        raise ValueError(f"segment id {PERSISTENT_SEGMENT_ID} marks the model's own persistent "
                         "tokens, which it feeds itself (LanguageModel.init_state); use ids >= 1 "
                         "for documents and 0 for padding")
    B, T = s.shape
    if T < 1:
        raise ValueError("a call must hold at least one token (segment_ids_BT has T = 0)")
    if state.last_segment_id.shape != (B,):
        raise ValueError(f"the stream state is for batch size {state.last_segment_id.shape}, the "
                         f"call has batch size {B}; start a stream with fresh_stream_state({B})")
    prev_B1 = state.last_segment_id.astype(jnp.int32)[:, None]
    seen_B1 = (state.doc_position >= 0)[:, None]
    prev_BT = jnp.concatenate([prev_B1, s[:, :-1]], axis=1)
    # Runs (attention / RoPE): the first token of the stream always starts one.
    run_start_BT = s != prev_BT
    run_start_BT = run_start_BT.at[:, 0].set(run_start_BT[:, 0] | ~seen_B1[:, 0])
    runs_BT = state.doc_index.astype(jnp.int32)[:, None] + jnp.cumsum(
        run_start_BT.astype(jnp.int32), axis=1)
    idx_1T = jnp.arange(T, dtype=jnp.int32)[None, :]
    last_start_BT = lax.cummax(jnp.where(run_start_BT, idx_1T, -1), axis=1)
    continued_BT = state.doc_position.astype(jnp.int32)[:, None] + 1 + idx_1T
    run_pos_BT = jnp.where(last_start_BT >= 0, idx_1T - last_start_BT, continued_BT)
    persistent_BT = s == PERSISTENT_SEGMENT_ID
    stream = Stream(
        segment_ids=s,
        doc_ids=jnp.where(persistent_BT, PERSISTENT_SEGMENT_ID, runs_BT).astype(jnp.int32),
        starts=(s != prev_BT) & (s != 0),
        positions=jnp.where(persistent_BT, 0, run_pos_BT).astype(jnp.int32),
        offset=jnp.asarray(state.position, jnp.int32),
        fresh=bool(fresh), no_persistent=bool(no_persistent))
    new_state = StreamState(position=(state.position + T).astype(jnp.int32),
                            last_segment_id=s[:, -1],
                            doc_index=runs_BT[:, -1],
                            doc_position=run_pos_BT[:, -1].astype(jnp.int32))
    return stream, new_state
