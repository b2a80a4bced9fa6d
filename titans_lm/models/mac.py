"""Titans MAC, Memory as a Context (Behrouz et al. 2025, arXiv:2501.00663, section 4.1,
eqs. 21-25).

The sequence is cut into segments S^(1), S^(2), ... of ``segment_len`` tokens. A MAC layer walks
over them with ``lax.scan``, carrying the memory state M_{n-1} left by the earlier segments:

    q      = x W_Q                                 (memory's query projection of the segment input)
    h_j    = M*_{n-1}(q_j)                         retrieval: no write from segment n itself
    y      = Attn([p_1 .. p_Np || h || S^(n)])     queries: the segment's tokens (ContextAttention)
    M_n    = M_{n-1} written with y                (keys and values from y, chunked GD)
    o_t    = (RMSNorm_y(y_t) * sigmoid(RMSNorm_m(M*_t(y_t)))) W_O     y ⊗ M*(y), read per token
                                                    after token t's own write

The attention mask lets a token see every persistent token, and h_j and x_j only for j at or
before its own position, inside its own document; persistent tokens are parameters of each MAC
layer (``titans_lm.nn.context_attention``). The ⊗ is the gate of MAG (``titans_lm.nn.gated_combine``:
normalised branches with learned weights, sigmoid, output projection); the paper leaves the MAC
operator open. With ``combine="sum"`` (a deviation, as for MAG: ``titans_lm.nn.gated_combine``;
``configs/mac.py``'s default) the branches are added, o_t = y_t W_O^attn + M*_t(.) read through
the memory's output head, both projections with the depth-scaled init. h_j is mapped to the
model width by the memory's output head (RMSNorm per head, output gate, W_O; with the sum, that
W_O's init is the depth-scaled one) before it joins the attention's context.

Documents: the memory state resets to (W0, 0) at every document start, at any position (a start
inside a chunk cuts it; ``segment_len`` must be a multiple of the chunk size so that the chunks
tile a segment). A token whose document started inside the current segment retrieves from W0,
not from the state of the previous document. The short
convolution on the write's queries/keys/values carries the projections of the last
``conv_kernel - 1`` attention outputs across segment boundaries, restarting at document starts, so
segments do not change it.

Carried state (the mixer protocol, ``MACMixer.init_state`` / ``mixer(x, stream, state)``): the
memory state at the current segment's start, the current segment's mixer inputs so far and the
conv tails before it. A call runs [current segment so far || call] again from that state, so a
stream cut anywhere (inside a chunk, inside a segment) gives exactly the outputs of one call, and a
decode step costs one segment's work, constant in the context. MAC's persistent tokens are
parameters of its attention and need no state.

Layers listed by ``memory_layers`` ("all" by default) are MAC layers; the others run the same
segment attention over [persistent || segment] without a memory.

What the memory is written and read with (``memory_input``, :data:`MEMORY_INPUTS`):

* ``"attention_output"`` (the paper, above): the write's keys/values and the gated read's queries
  come from the attention output y, and the gate is o = y ⊗ M*(y).
* ``"segment_input"`` (a deviation from the paper; the default of ``configs/mac.py``): the memory is written with the segment input x
  (keys and values from x, chunked GD, as the LMM writes its input) and the gated read queries it
  with x after each token's own write: o = y ⊗ M*(x). The retrieval h (from x) and the attention
  are unchanged. What the memory holds then does not depend on the attention's output, whose
  gradient reaches the memory only through h and the gate (docs/results/mac-memory.md measures
  both wirings).

Ablation switch for evaluation (``memory_ablation``, :data:`MEMORY_ABLATIONS`; changes no
parameter): ``"retrieval"`` replaces the retrieved h tokens by zeros (the attention still sees
those slots, with zero keys and values), ``"gated_read"`` replaces the gated read M*(.) by zeros
(the gate becomes the constant sigmoid(0) = 0.5), ``"both"`` does both; the memory is still
written and carried. ``"none"`` (the default) runs the layer as described.

Model config fields: ``titans_lm.models.lm.SHELL_FIELDS``, ``n_heads``, ``rope_theta``,
``segment_len``, ``n_persistent`` (per layer), ``memory_layers`` and ``memory`` (whose
``eta_max`` bounds the momentum gate); optional ``memory_input`` (default "attention_output"),
``combine`` (default "gate") and ``memory_ablation`` (default "none").
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.config.fields import MEMORY_ABLATIONS as FIELD_ABLATIONS, check_memory_ablation
from titans_lm.memory import stats as memory_stats
from titans_lm.memory.carried import select_rows
from titans_lm.memory.layer import NeuralMemory
from titans_lm.models.lm import LanguageModel, check_model_config
from titans_lm.models.memory_mixer import make_memory, memory_config, memory_layer_indices
from titans_lm.models.registry import register
from titans_lm.nn.context_attention import ContextAttention
from titans_lm.nn.dtypes import to_dtype
from titans_lm.nn.gated_combine import GatedCombine, branch_out_stds, make_combine
from titans_lm.nn.init import scaled_out_std

MAC_FIELDS = ("n_heads", "rope_theta", "segment_len", "n_persistent", "memory_layers", "memory")
MEMORY_INPUTS = ("attention_output", "segment_input")
MEMORY_ABLATIONS = FIELD_ABLATIONS["mac"]  # ("none", "retrieval", "gated_read", "both")


def _pad_time(a: jax.Array, total: int) -> jax.Array:
    pad = total - a.shape[1]
    return a if pad == 0 else jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))


def _to_segments(a: jax.Array, axis: int, seg: int) -> jax.Array:
    """Split ``axis`` (length S * seg) into [S, seg] and move S to the front."""
    shape = a.shape[:axis] + (a.shape[axis] // seg, seg) + a.shape[axis + 1:]
    return jnp.moveaxis(a.reshape(shape), axis, 0)


class SegmentBuffer(NamedTuple):
    """The current (partial) segment's tokens so far, which the next call runs again.

    x: [B, N - 1, D] mixer inputs (float32, or the compute dtype when wider); segment_ids, doc_ids, positions: int32 [B, N - 1] and starts:
    bool [B, N - 1] their ``Stream`` fields; n: int32 [] how many (the same in every row).
    """

    x: jax.Array
    segment_ids: jax.Array
    doc_ids: jax.Array
    positions: jax.Array
    starts: jax.Array
    n: jax.Array


class MACState(NamedTuple):
    """A MAC layer's carried state.

    memory: (params, momentum) tuples of [B, H, ...] at the current segment's start.
    segment: the current segment's tokens so far (:class:`SegmentBuffer`).
    retrieval_tail, write_tail: the memory's conv tails (pre-conv q/k/v projections of the K - 1
      tokens before the current segment) of the retrieval projection (of x) and of the write
      projection (of the attention output y, or of x with ``memory_input="segment_input"``); ()
      without conv.
    """

    memory: tuple
    segment: SegmentBuffer
    retrieval_tail: tuple
    write_tail: tuple


def _empty_buffer(batch_size: int, segment_len: int, d_model: int, dtype) -> SegmentBuffer:
    """No tokens yet; x is kept in float32 or wider (the mixer input's dtype round-trips)."""
    B, n = batch_size, segment_len - 1
    dtype = jnp.promote_types(dtype, jnp.float32)
    ints = jnp.zeros((B, n), jnp.int32)
    return SegmentBuffer(x=jnp.zeros((B, n, d_model), dtype), segment_ids=ints, doc_ids=ints,
                         positions=ints, starts=jnp.zeros((B, n), bool), n=jnp.zeros((), jnp.int32))


def _extended(x_BTD: jax.Array, stream, buf: SegmentBuffer, N: int):
    """[current segment so far || call], padded to whole segments of N, as (x, Stream, n, E):
    n the call's index in it (0 for a fresh stream, static) and E the static length.

    Padding: segment id 0 (writes nothing), outputs dropped; it only ever follows real tokens."""
    T = x_BTD.shape[1]
    fields = (x_BTD, stream.segment_ids, stream.doc_ids, stream.positions,
              jnp.asarray(stream.starts, bool))
    if stream.fresh:
        n, E = 0, math.ceil(T / N) * N
        ext = tuple(_pad_time(a, E) for a in fields)
    else:
        n, E = buf.n, math.ceil((N - 1 + T) / N) * N
        ext = tuple(jax.lax.dynamic_update_slice_in_dim(_pad_time(b, E), a.astype(b.dtype), n, 1)
                    for b, a in zip(buf[:5], fields))
    x, seg, doc, pos, starts = ext
    return x, stream._replace(segment_ids=seg, doc_ids=doc, positions=pos, starts=starts), n, E


def _next_buffer(x_ext, stream_ext, start, n_next, N: int) -> SegmentBuffer:
    """The tokens of the extended call from ``start`` on (N - 1 slots), ``n_next`` of them real."""
    def window(a):
        return jax.lax.dynamic_slice_in_dim(_pad_time(a, a.shape[1] + N - 1), start, N - 1, 1)

    return SegmentBuffer(x=window(x_ext), segment_ids=window(stream_ext.segment_ids),
                         doc_ids=window(stream_ext.doc_ids), positions=window(stream_ext.positions),
                         starts=window(stream_ext.starts),
                         n=jnp.asarray(n_next, jnp.int32))


def _segment_stream(stream, ids, starts, pos):
    return stream._replace(segment_ids=ids, doc_ids=ids, starts=starts, positions=pos)


class MACMixer(nnx.Module):
    """One MAC layer on the mixer protocol (see module docstring).

    ``mixer.init_state(B) -> MACState``; ``mixer(x_BTD, stream, state) -> (o_BTD, state)``.
    Carried state: the memory at the current segment's start, the current segment's tokens so
    far (run again, with the call, from that state: a call that ends inside a segment continues
    exactly) and the conv tails. A decode step costs O(segment_len), constant in the context.

    Args:
      memory: the layer's ``NeuralMemory`` (attribute ``memory``).
      attention: ``ContextAttention`` over [persistent || h || segment] (attribute ``attention``).
      combine: ``GatedCombine`` for y ⊗ M*(y), or ``SumCombine`` for y + M*(y) (attribute
        ``combine``).
      segment_len: N, a multiple of the memory's chunk size. T need not be a multiple of N (the
        last segment is padded; padding writes nothing and its outputs are dropped).
      memory_input: what the memory is written and read with, one of :data:`MEMORY_INPUTS`
        (module docstring).
      ablation: one of :data:`MEMORY_ABLATIONS` (module docstring); "none" to run the layer.

    Raises:
      ValueError: if segment_len is not a positive multiple of the chunk size, or an unknown
        memory_input or ablation.
    """

    def __init__(self, memory: NeuralMemory, attention: ContextAttention, combine: GatedCombine,
                 segment_len: int, *, memory_input: str = "attention_output",
                 ablation: str = "none"):
        chunk = memory.cfg.chunk_size
        if segment_len < 1 or segment_len % chunk:
            raise ValueError(f"MAC segment_len={segment_len} must be a positive multiple of the "
                             f"memory chunk_size={chunk}")
        if memory.cfg.omega_window > 1:
            raise ValueError(f"MAC does not take model.memory.omega_window="
                             f"{memory.cfg.omega_window} (its segment loop writes each segment "
                             f"without the Omega window's earlier tokens); set omega_window=1, or "
                             f"use the lmm, mag or mal backbone")
        if memory_input not in MEMORY_INPUTS:
            raise ValueError(f"MAC memory_input={memory_input!r}: must be one of "
                             f"{', '.join(MEMORY_INPUTS)}")
        self.memory, self.attention, self.combine = memory, attention, combine
        self.segment_len = segment_len
        self.memory_input = memory_input
        self.ablation = check_memory_ablation("mac", ablation)

    def init_state(self, batch_size: int) -> MACState:
        """(W0, 0) at a segment start, no tokens of a segment yet, zero conv tails."""
        start = self.memory.init_state(batch_size)
        return MACState(memory=(start.params, start.momentum),
                        segment=_empty_buffer(batch_size, self.segment_len, self.attention.d_model,
                                              self.attention.dtype),
                        retrieval_tail=start.conv_tail, write_tail=start.conv_tail)

    def reset_memory(self, state: MACState, rows_B: jax.Array) -> MACState:
        """``memory`` (the state at the current segment's start) of the rows ``rows_B`` back to
        the layer's W0 from the current parameters, with zero momentum. The segment buffer (the
        current segment's tokens so far, which the next call runs again from that memory) and
        the conv tails are kept, so those tokens retrieve from W0 and are written into the reset
        memory again: what is removed is what the segments completed before the current one
        wrote."""
        params, momentum = state.memory
        start = self.memory.init_state(rows_B.shape[0])
        return state._replace(memory=(
            tuple(select_rows(rows_B, p0.astype(p.dtype), p)
                  for p0, p in zip(start.params, params)),
            tuple(select_rows(rows_B, jnp.zeros_like(m), m) for m in momentum)))

    def memory_norms(self, state: MACState) -> tuple[jax.Array]:
        """``(||P|| / ||W0||,)`` of the memory at the current segment's start."""
        return (memory_stats.memory_norm(state.memory[0], self.memory.initial_params()),)

    def __call__(self, x_BTD: jax.Array, stream, state: MACState) -> tuple[jax.Array, MACState]:
        o, state, _ = self.forward(x_BTD, stream, state)
        return o, state

    def forward(self, x_BTD: jax.Array, stream, state: MACState, *, collect: bool = False
                ) -> tuple[jax.Array, MACState, dict[str, Any]]:
        """The layer's output, the state after the call and, with ``collect``, what each segment
        retrieved from.

        Returns:
          (o_BTD, state, aux). With ``collect`` (S segments of N tokens of the extended call, the
          current segment's earlier tokens first): aux["state_in"] the memory state (params,
          momentum) entering each segment (tuples of [S, B, H, ...], before any reset);
          aux["h_reads"] the retrieved reads M*_{n-1}(q) [S, B, H, N, Dh] (W0 reads for tokens of
          a document that starts inside the segment); aux["y"] the attention outputs
          [S, B, N, D]; aux["m_reads"] the reads M*_t(y_t) after each token's write
          [S, B, H, N, Dh]. Otherwise aux is empty.
        Raises:
          ValueError: for a stream whose shape differs from x's.
        """
        mem = self.memory
        B, T, D = x_BTD.shape
        if tuple(stream.segment_ids.shape) != (B, T):
            raise ValueError(f"the stream is for calls of shape {tuple(stream.segment_ids.shape)}, "
                             f"x_BTD has [B, T] = [{B}, {T}]")
        N = self.segment_len
        x, ext, n, E = _extended(x_BTD, stream, state.segment, N)
        m = n + T
        n_full = m // N                    # complete segments: the next state enters segment n_full
        # Queries for the retrieval, document starts; the retrieval conv tail before segment n_full.
        retrieval, r_tail = mem.project(x, ext, () if stream.fresh else state.retrieval_tail,
                                        tail_at=n_full * N)
        start = mem.init_state(B)
        reads_w0 = mem.read((start.params, start.momentum), retrieval.q)  # documents starting here
        xs = (_to_segments(x, 1, N), _to_segments(ext.segment_ids, 1, N),
              _to_segments(ext.doc_ids, 1, N), _to_segments(ext.positions, 1, N),
              _to_segments(ext.starts, 1, N), _to_segments(retrieval.q, 2, N),
              _to_segments(reads_w0, 2, N), jnp.arange(E // N))
        y_dtype = self.attention.dtype
        carry0 = (state.memory, () if stream.fresh else state.write_tail)
        if stream.fresh and mem.cfg.use_conv:
            carry0 = (state.memory, mem.init_state(B).conv_tail)
        keep_final = bool(stream.fresh) and T % N == 0     # static: the call ends a segment

        def body(carry, xs_n):
            (mstate, w_tail), kept = carry
            x_n, ids_n, doc_n, pos_n, starts_n, q_n, w0_reads_n, index = xs_n
            if not keep_final:
                kept = jax.tree.map(lambda a, b: jnp.where(index == n_full, a, b),
                                    (mstate, w_tail), kept)
            # Retrieval from the state left by earlier segments (W0 for documents starting here).
            fresh_BN = jnp.cumsum(starts_n.astype(jnp.int32), axis=1) > 0
            h_reads = jnp.where(fresh_BN[:, None, :, None], w0_reads_n, mem.read(mstate, q_n))
            h = mem.output(h_reads, x_n)
            if self.ablation in ("retrieval", "both"):
                h = jnp.zeros_like(h)
            y = self.attention(x_n, doc_n, pos_n, h).astype(y_dtype)
            # Write the attention output (or the segment input), read M*(.) after token t's own
            # write.
            src = y if self.memory_input == "attention_output" else x_n
            w, w_tail = mem.project(src, _segment_stream(ext, ids_n, starts_n, pos_n), w_tail)
            reads, new_state = mem.scan(mstate, w.q, w.k, w.v, w.theta, w.eta, w.alpha, w.reset,
                                        log_keep=w.log_keep)
            m_out = mem.output(reads, src)
            if self.ablation in ("gated_read", "both"):
                m_out = jnp.zeros_like(m_out)
            o = self.combine(y, m_out)
            out = (o, (mstate, h_reads, y, reads)) if collect else (o, None)
            return ((new_state, w_tail), kept), out

        (final, kept), (o_SBND, extra) = jax.lax.scan(body, (carry0, carry0), xs)
        if not keep_final:
            kept = jax.tree.map(lambda a, b: jnp.where(n_full * N == E, a, b), final, kept)
        else:
            kept = final
        o = jnp.moveaxis(o_SBND, 0, 1).reshape(B, E, -1)
        o = o[:, :T] if stream.fresh else jax.lax.dynamic_slice_in_dim(o, n, T, 1)
        new_state = MACState(memory=kept[0],
                             segment=_next_buffer(x, ext, n_full * N, m % N, N),
                             retrieval_tail=r_tail, write_tail=kept[1])
        aux = (dict(zip(("state_in", "h_reads", "y", "m_reads"), extra)) if collect else {})
        return o, new_state, aux


class SegmentAttentionMixer(nnx.Module):
    """MAC's attention without a memory: causal attention inside each segment over
    [persistent || segment] (a MAC layer that is not listed in ``memory_layers``).

    ``mixer.init_state(B) -> SegmentBuffer`` (the current segment's tokens so far, run again with
    the next call); ``mixer(x_BTD, stream, state) -> (y_BTD, state)``; the segments become batch
    rows.
    """

    def __init__(self, attention: ContextAttention, segment_len: int):
        if segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {segment_len}")
        self.attention, self.segment_len = attention, segment_len

    def init_state(self, batch_size: int) -> SegmentBuffer:
        return _empty_buffer(batch_size, self.segment_len, self.attention.d_model,
                             self.attention.dtype)

    def __call__(self, x_BTD: jax.Array, stream, state: SegmentBuffer
                 ) -> tuple[jax.Array, SegmentBuffer]:
        B, T, D = x_BTD.shape
        N = self.segment_len
        x, ext, n, E = _extended(x_BTD, stream, state, N)
        rows = lambda a: a.reshape((B * (E // N), N) + a.shape[2:])  # noqa: E731
        y = self.attention(rows(x), rows(ext.doc_ids), rows(ext.positions)).reshape(B, E, -1)
        y = y[:, :T] if stream.fresh else jax.lax.dynamic_slice_in_dim(y, n, T, 1)
        m = n + T
        return y, _next_buffer(x, ext, (m // N) * N, m % N, N)

    def reset_memory(self, state: SegmentBuffer, rows_B: jax.Array) -> SegmentBuffer:
        """No neural memory: ``state`` unchanged."""
        del rows_B
        return state

    def memory_norms(self, state: SegmentBuffer) -> tuple:
        """No neural memory: ()."""
        del state
        return ()


@register("mac")
def build_mac(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """Titans MAC LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields, a segment_len that is not a multiple of the chunk size, or
        invalid sizes / memory settings.
    """
    check_model_config(model_cfg)
    check_model_config(model_cfg, MAC_FIELDS)
    mcfg = memory_config(model_cfg)
    seg = int(model_cfg.segment_len)
    if seg < 1 or seg % mcfg.chunk_size:
        raise ValueError(f"model.segment_len={seg} must be a positive multiple of "
                         f"model.memory.chunk_size={mcfg.chunk_size}")
    layers = memory_layer_indices(model_cfg.memory_layers, model_cfg.n_layers)
    out_std = scaled_out_std(model_cfg.init_std, model_cfg.n_layers)
    dtype = to_dtype(model_cfg.dtype)
    param_dtype = to_dtype(model_cfg.get("param_dtype", "float32"))
    attention_std, memory_std = branch_out_stds(model_cfg, out_std)

    def attention(out_init_std: float, rngs: nnx.Rngs) -> ContextAttention:
        return ContextAttention(model_cfg.d_model, model_cfg.n_heads,
                                n_persistent=int(model_cfg.n_persistent),
                                rope_theta=model_cfg.rope_theta, dtype=dtype,
                                param_dtype=param_dtype, init_std=model_cfg.init_std,
                                out_init_std=out_init_std, rngs=rngs)

    def make_mixer(layer: int, rngs: nnx.Rngs):
        if layer not in layers:
            return SegmentAttentionMixer(attention(out_std, rngs), seg)
        memory = make_memory(mcfg, rngs=rngs, out_init_std=memory_std)
        combine = make_combine(model_cfg, out_std, rngs=rngs)
        return MACMixer(memory, attention(attention_std, rngs), combine, seg,
                        memory_input=str(model_cfg.get("memory_input", "attention_output")),
                        ablation=str(model_cfg.get("memory_ablation", "none")))

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs)
