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
operator open. h_j is mapped to the model width by the memory's output head (RMSNorm per head,
output gate, W_O) before it joins the attention's context.

Documents: the memory state resets to (W0, 0) at every document start (the data pipeline starts
documents at multiples of 64; chunk sizes that divide 64 make them chunk starts, and
``segment_len`` must be a multiple of the chunk size). A token whose document started inside the
current segment retrieves from W0, not from the state of the previous document. The short
convolution on the write's keys/values carries the last ``conv_kernel - 1`` attention outputs across
segment boundaries, restarting at document starts, so segments do not change it.

Layers listed by ``memory_layers`` ("all" by default) are MAC layers; the others run the same
segment attention over [persistent || segment] without a memory.

Model config fields: ``titans_lm.models.lm.SHELL_FIELDS``, ``n_heads``, ``rope_theta``,
``segment_len``, ``n_persistent`` (per layer), ``memory_layers`` and ``memory`` (whose
``eta_max`` bounds the momentum gate).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.memory.layer import MemoryInputs, NeuralMemory
from titans_lm.models.lm import LanguageModel, check_model_config
from titans_lm.models.memory_mixer import make_memory, memory_config, memory_layer_indices
from titans_lm.models.registry import register
from titans_lm.nn.context_attention import ContextAttention
from titans_lm.nn.dtypes import to_dtype
from titans_lm.nn.gated_combine import GatedCombine
from titans_lm.nn.init import scaled_out_std
from titans_lm.nn.segments import document_ids, segment_positions

MAC_FIELDS = ("n_heads", "rope_theta", "segment_len", "n_persistent", "memory_layers", "memory")


def _pad_time(a: jax.Array, total: int) -> jax.Array:
    pad = total - a.shape[1]
    return a if pad == 0 else jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))


def _to_segments(a: jax.Array, axis: int, seg: int) -> jax.Array:
    """Split ``axis`` (length S * seg) into [S, seg] and move S to the front."""
    shape = a.shape[:axis] + (a.shape[axis] // seg, seg) + a.shape[axis + 1:]
    return jnp.moveaxis(a.reshape(shape), axis, 0)


class MACMixer(nnx.Module):
    """``mixer(x_BTD, segment_ids_BT) -> o_BTD``: one MAC layer (see module docstring).

    Args:
      memory: the layer's ``NeuralMemory`` (attribute ``memory``).
      attention: ``ContextAttention`` over [persistent || h || segment] (attribute ``attention``).
      combine: ``GatedCombine`` for y ⊗ M*(y) (attribute ``combine``).
      segment_len: N, a multiple of the memory's chunk size. T need not be a multiple of N (the
        last segment is padded; padding writes nothing and its outputs are dropped).

    Raises:
      ValueError: if segment_len is not a positive multiple of the chunk size.
    """

    def __init__(self, memory: NeuralMemory, attention: ContextAttention, combine: GatedCombine,
                 segment_len: int):
        chunk = memory.cfg.chunk_size
        if segment_len < 1 or segment_len % chunk:
            raise ValueError(f"MAC segment_len={segment_len} must be a positive multiple of the "
                             f"memory chunk_size={chunk}")
        self.memory, self.attention, self.combine = memory, attention, combine
        self.segment_len = segment_len

    def __call__(self, x_BTD: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
        return self.forward(x_BTD, segment_ids_BT)[0]

    def forward(self, x_BTD: jax.Array, segment_ids_BT: jax.Array, *, collect: bool = False
                ) -> tuple[jax.Array, dict[str, Any]]:
        """The layer's output and, with ``collect``, what each segment retrieved from.

        Returns:
          (o_BTD, aux). With ``collect`` (S segments of N tokens): aux["state_in"] the memory
          state (params, momentum) entering each segment (tuples of [S, B, H, ...], before any
          reset); aux["h_reads"] the retrieved reads M*_{n-1}(q) [S, B, H, N, Dh] (W0 reads for
          tokens of a document that starts inside the segment); aux["y"] the attention outputs
          [S, B, N, D]; aux["m_reads"] the reads M*_t(y_t) after each token's write
          [S, B, H, N, Dh]. Otherwise aux is empty.
        """
        mem = self.memory
        B, T, D = x_BTD.shape
        if segment_ids_BT.shape != (B, T):
            raise ValueError(f"segment_ids shape {segment_ids_BT.shape} does not match x {(B, T)}")
        N = self.segment_len
        n_seg = math.ceil(T / N)
        Tp = n_seg * N
        x = _pad_time(x_BTD, Tp)
        ids = _pad_time(segment_ids_BT, Tp)
        doc = document_ids(ids)
        pos = segment_positions(ids)
        retrieval = mem.project(x, ids)  # queries for the retrieval, document starts
        reads_w0 = mem.read(mem.initial_state(B), retrieval.q)  # for documents starting here
        xs = (_to_segments(x, 1, N), _to_segments(ids, 1, N), _to_segments(doc, 1, N),
              _to_segments(pos, 1, N), _to_segments(retrieval.q, 2, N),
              _to_segments(reads_w0, 2, N), _to_segments(retrieval.reset, 1, N))
        n_tail = mem.cfg.conv_kernel - 1 if mem.cfg.use_conv else 0
        y_dtype = self.attention.dtype
        carry0 = (mem.initial_state(B), jnp.zeros((B, n_tail, D), y_dtype),
                  jnp.zeros((B, n_tail), ids.dtype))

        def body(carry, xs_n):
            state, tail_y, tail_ids = carry
            x_n, ids_n, doc_n, pos_n, q_n, w0_reads_n, reset_n = xs_n
            # Retrieval from the state left by earlier segments (W0 for documents starting here).
            fresh_BN = jnp.cumsum(reset_n.astype(jnp.int32), axis=1) > 0
            h_reads = jnp.where(fresh_BN[:, None, :, None], w0_reads_n, mem.read(state, q_n))
            h = mem.output(h_reads, x_n)
            y = self.attention(x_n, doc_n, pos_n, h).astype(y_dtype)
            # Write the attention output, read M*(y_t) after token t's own write.
            y_ext = jnp.concatenate([tail_y, y], axis=1)
            ids_ext = jnp.concatenate([tail_ids, ids_n], axis=1)
            w = mem.project(y_ext, ids_ext)
            w = MemoryInputs(q=w.q[:, :, n_tail:], k=w.k[:, :, n_tail:], v=w.v[:, :, n_tail:],
                             theta=w.theta[:, :, n_tail:], eta=w.eta[:, :, n_tail:],
                             alpha=w.alpha[:, :, n_tail:], reset=reset_n,
                             log_keep=w.log_keep[:, :, n_tail:])
            reads, new_state = mem.scan(state, w.q, w.k, w.v, w.theta, w.eta, w.alpha, w.reset,
                                        log_keep=w.log_keep)
            o = self.combine(y, mem.output(reads, y))
            keep = y_ext.shape[1] - n_tail
            new_carry = (new_state, y_ext[:, keep:], ids_ext[:, keep:])
            out = (o, (state, h_reads, y, reads)) if collect else (o, None)
            return new_carry, out

        _, (o_SBND, extra) = jax.lax.scan(body, carry0, xs)
        o = jnp.moveaxis(o_SBND, 0, 1).reshape(B, Tp, -1)[:, :T]
        aux = (dict(zip(("state_in", "h_reads", "y", "m_reads"), extra)) if collect else {})
        return o, aux


class SegmentAttentionMixer(nnx.Module):
    """MAC's attention without a memory: causal attention inside each segment over
    [persistent || segment] (a MAC layer that is not listed in ``memory_layers``).

    Call: ``mixer(x_BTD, segment_ids_BT) -> y_BTD``; the segments become batch rows.
    """

    def __init__(self, attention: ContextAttention, segment_len: int):
        if segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {segment_len}")
        self.attention, self.segment_len = attention, segment_len

    def __call__(self, x_BTD: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
        B, T, D = x_BTD.shape
        N = self.segment_len
        Tp = math.ceil(T / N) * N
        ids = _pad_time(segment_ids_BT, Tp)
        rows = lambda a: a.reshape((B * (Tp // N), N) + a.shape[2:])  # noqa: E731
        y = self.attention(rows(_pad_time(x_BTD, Tp)), rows(document_ids(ids)),
                           rows(segment_positions(ids)))
        return y.reshape(B, Tp, -1)[:, :T]


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

    def attention(out_init_std: float, rngs: nnx.Rngs) -> ContextAttention:
        return ContextAttention(model_cfg.d_model, model_cfg.n_heads,
                                n_persistent=int(model_cfg.n_persistent),
                                rope_theta=model_cfg.rope_theta, dtype=dtype,
                                param_dtype=param_dtype, init_std=model_cfg.init_std,
                                out_init_std=out_init_std, rngs=rngs)

    def make_mixer(layer: int, rngs: nnx.Rngs):
        if layer not in layers:
            return SegmentAttentionMixer(attention(out_std, rngs), seg)
        memory = make_memory(mcfg, rngs=rngs)
        combine = GatedCombine(model_cfg.d_model, norm_eps=model_cfg.norm_eps, dtype=dtype,
                               param_dtype=param_dtype, out_init_std=out_std, rngs=rngs)
        return MACMixer(memory, attention(model_cfg.init_std, rngs), combine, seg)

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs)
