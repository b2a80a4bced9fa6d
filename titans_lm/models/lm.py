"""The language-model shell shared by every backbone:

    tokens -> embedding -> blocks -> RMSNorm -> LM head -> logits

with an explicit carried state (one interface for every backbone):

    state = model.init_state(B)                       # LMState: stream context + one state per block
    logits_BTV, state = model(tokens_BT, segment_ids_BT, state)

A stateless caller (training, reset-mode evaluation) passes ``init_state(B)`` and drops the state
it gets back: the initial state is marked ``fresh`` (static), so that call compiles to the
single-sequence program (no cache or buffer work, the returned state's unused parts removed by
jit). ``model(tokens_BT, segment_ids_BT)`` is that call's logits, a shorthand for tests.

A call over [w1 || w2] equals the call over w1 followed by the call over w2 with the returned state
(documents are given by the segment ids across calls, ``titans_lm.nn.stream``). A backbone supplies
``make_mixer(layer, rngs) -> mixer`` (the token mixer of each block, with the mixer protocol
``titans_lm.models.mixer.Mixer``) and, optionally, a number of persistent-memory tokens (Titans
section 3.3): ``init_state`` runs the blocks over them (segment id -1), so every stream starts from
the state they leave and the real tokens alone are processed by each call. The head is the transposed
embedding (tied) or a separate [D, V] matrix (untied), by ``tie_embeddings``.

Init (GPT-2/GPT-3 style): embeddings, the untied head and input projections N(0, init_std^2);
residual-branch output projections (attention's W_O, SwiGLU's W_down) N(0, (init_std /
sqrt(2 n_layers))^2), see ``titans_lm.nn.init.scaled_out_std``; norm scales 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.models.blocks import Block
from titans_lm.models.remat import REMAT_MODES, check_remat, remat_call  # noqa: F401
from titans_lm.nn.dtypes import logits_dtype, to_dtype
from titans_lm.nn.init import normal_param, scaled_out_std
from titans_lm.nn.norm import RMSNorm
from titans_lm.nn.persistent import PersistentMemory
from titans_lm.nn.stream import Stream, StreamState, fresh_stream_state, make_stream

MixerFactory = Callable[[int, nnx.Rngs], nnx.Module]

SHELL_FIELDS = ("name", "vocab_size", "d_model", "n_layers", "d_ff", "tie_embeddings", "dtype",
                "remat", "norm_eps", "init_std")


def check_model_config(model_cfg, fields=SHELL_FIELDS) -> None:
    """Raise ValueError naming every field of ``fields`` missing from ``model_cfg``."""
    missing = [f for f in fields if f not in model_cfg]
    if missing:
        raise ValueError(f"model config ({model_cfg.get('name', '?')!r}) is missing field(s) "
                         f"{missing}; set them in configs/<backbone>.py")


@dataclasses.dataclass(frozen=True)
class LMState:
    """The carried state of a LanguageModel (a pytree of arrays).

    stream: the stream context (``titans_lm.nn.stream.StreamState``).
    layers: tuple of one mixer state per block, in block order.
    fresh: static (part of the pytree structure): True for the state ``init_state`` returns,
      which holds no token of the stream yet; the call from it then runs the single-sequence
      program (``titans_lm.nn.stream.Stream.fresh``). The state a call returns is not fresh.
      :meth:`continued` drops the mark, so that a loop over a stream compiles one program for
      its first call and the later ones (the results are the same either way).
    """

    stream: StreamState
    layers: tuple
    fresh: bool = False

    def _replace(self, **changes) -> "LMState":
        return dataclasses.replace(self, **changes)

    def continued(self) -> "LMState":
        """The same state without the ``fresh`` mark."""
        return dataclasses.replace(self, fresh=False)


jax.tree_util.register_dataclass(LMState, data_fields=["stream", "layers"], meta_fields=["fresh"])


def continued(state):
    """``state.continued()`` for an :class:`LMState`; any other state unchanged."""
    return state.continued() if isinstance(state, LMState) else state


def count_params(model) -> int:
    """Number of scalar parameters (``nnx.Param`` leaves) of a model, concrete or abstract."""
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    return int(sum(math.prod(x.shape) for x in leaves))


class LanguageModel(nnx.Module):
    """Decoder-only LM: ``model(tokens_BT, segment_ids_BT[, state])`` (module docstring).

    Args:
      vocab_size: V. d_model: D. n_layers: number of blocks. d_ff: SwiGLU hidden width.
      make_mixer: ``make_mixer(layer_index, rngs) -> mixer`` with ``mixer.init_state(B)`` and
        ``mixer(x_BTD, stream, state) -> (y_BTD, state)``; it should use
        ``scaled_out_std(init_std, n_layers)`` for its output projection.
      tie_embeddings: LM head = embedding^T (True) or its own [D, V] matrix ("embed", "vocab").
      norm_eps: RMSNorm epsilon. init_std: base init std.
      dtype: compute dtype name or dtype ("float32" | "bfloat16" | "float64").
      param_dtype: parameter dtype (float32; float64 for numerical tests under enable_x64).
      remat: a policy name of ``titans_lm.models.remat`` ("none", "full"/"block", "minimal",
        "dots"): what the backward pass keeps of each block's forward.
      n_persistent: number of persistent-memory tokens fed before every stream (0 = none).
      rngs: nnx.Rngs.

    Call:
      tokens_BT: int [B, T] token ids in [0, V), T >= 1; segment_ids_BT: int [B, T] (0 = padding,
      a new document wherever the id changes, also across calls); state: an ``LMState`` from
      ``init_state(B)`` or a previous call. Returns float32 logits [B, T, V] (float64 when
      computing in float64) and the state after the call (None for the state: the logits of
      the call from ``init_state(B)``, alone). Padding
      positions get finite logits. Attention and RoPE positions restart at each document start.
      The residual stream between blocks is float32 whatever the compute dtype.

    Raises:
      ValueError: on invalid sizes, remat mode or dtype, on ill-shaped inputs, or a state of
        another batch size.
    """

    def __init__(self, *, vocab_size: int, d_model: int, n_layers: int, d_ff: int,
                 make_mixer: MixerFactory, tie_embeddings: bool = True, norm_eps: float = 1e-6,
                 init_std: float = 0.02, dtype="float32", param_dtype="float32",
                 remat: str = "none", n_persistent: int = 0, rngs: nnx.Rngs):
        for field, v in (("vocab_size", vocab_size), ("d_model", d_model), ("n_layers", n_layers),
                         ("d_ff", d_ff)):
            if int(v) < 1:
                raise ValueError(f"model {field} must be >= 1, got {v}")
        check_remat(remat)
        if n_persistent < 0:
            raise ValueError(f"n_persistent must be >= 0, got {n_persistent}")
        dtype, param_dtype = to_dtype(dtype), to_dtype(param_dtype)
        self.vocab_size, self.d_model, self.n_layers = vocab_size, d_model, n_layers
        self.tie_embeddings, self.remat, self.n_persistent = bool(tie_embeddings), remat, n_persistent
        self.dtype = dtype
        out_std = scaled_out_std(init_std, n_layers)
        self.embed = nnx.Embed(
            vocab_size, d_model, dtype=logits_dtype(dtype), param_dtype=param_dtype,
            embedding_init=nnx.with_partitioning(nnx.initializers.normal(init_std), ("vocab", "embed")),
            rngs=rngs)
        self.persistent = (PersistentMemory(n_persistent, d_model, init_std=init_std,
                                            param_dtype=param_dtype, rngs=rngs)
                           if n_persistent else None)
        self.blocks = nnx.List([
            Block(make_mixer(i, rngs), d_model=d_model, d_ff=d_ff, norm_eps=norm_eps, dtype=dtype,
                  param_dtype=param_dtype, init_std=init_std, out_init_std=out_std, rngs=rngs)
            for i in range(n_layers)])
        self.final_norm = RMSNorm(d_model, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.head = (None if self.tie_embeddings else
                     normal_param(rngs, (d_model, vocab_size), init_std, ("embed", "vocab"), param_dtype))

    @classmethod
    def from_config(cls, model_cfg, make_mixer: MixerFactory, *, rngs: nnx.Rngs,
                    n_persistent: int = 0) -> "LanguageModel":
        """Build from the shell fields of a model config (see ``SHELL_FIELDS``; ``param_dtype``
        optional, default float32)."""
        check_model_config(model_cfg)
        return cls(vocab_size=model_cfg.vocab_size, d_model=model_cfg.d_model,
                   n_layers=model_cfg.n_layers, d_ff=model_cfg.d_ff, make_mixer=make_mixer,
                   tie_embeddings=model_cfg.tie_embeddings, norm_eps=model_cfg.norm_eps,
                   init_std=model_cfg.init_std, dtype=model_cfg.dtype,
                   param_dtype=model_cfg.get("param_dtype", "float32"), remat=model_cfg.remat,
                   n_persistent=n_persistent, rngs=rngs)

    def init_state(self, batch_size: int) -> LMState:
        """The state a stream starts from: every mixer's ``init_state`` after the persistent
        prefix (if any) has been run through the blocks as one call (stream position then reset
        to 0, see ``titans_lm.nn.stream``). Traceable (under jit) and cheap: N_p tokens.

        Raises:
          ValueError: for batch_size < 1.
        """
        stream_state = fresh_stream_state(batch_size)
        layers = tuple(block.init_state(batch_size) for block in self.blocks)
        if self.persistent is not None:
            x_BPD, ids_BP = self.persistent(batch_size, logits_dtype(self.dtype))
            stream, stream_state = make_stream(ids_BP, stream_state, fresh=True)
            _, layers = self._blocks(x_BPD, stream, layers)
            stream_state = stream_state._replace(position=jnp.zeros((), jnp.int32))
        return LMState(stream_state, layers, fresh=True)

    def reset_memory(self, state: LMState, rows_B: jax.Array) -> LMState:
        """``state`` with every block's neural memory reset in the rows ``rows_B`` (bool [B])
        (each mixer's ``reset_memory``, ``titans_lm.models.mixer.Mixer``); attention caches, the
        stream context and everything else unchanged. Pure and jit-compatible."""
        layers = tuple(block.mixer.reset_memory(s, rows_B)
                       for block, s in zip(self.blocks, state.layers))
        return state._replace(layers=layers)

    def memory_norms(self, state: LMState) -> tuple[jax.Array, ...]:
        """One float32 scalar per neural memory of the model, in block order: the norm of the
        memory the state holds relative to its layer's W0 (``titans_lm.memory.stats``); () for
        a model without a neural memory."""
        return tuple(n for block, s in zip(self.blocks, state.layers)
                     for n in block.mixer.memory_norms(s))

    def _blocks(self, x_BTD: jax.Array, stream: Stream, layers: tuple) -> tuple[jax.Array, tuple]:
        new_layers = []
        for block, layer_state in zip(self.blocks, layers):
            x_BTD, layer_state = remat_call(self.remat, block, x_BTD, stream, layer_state)
            new_layers.append(layer_state)
        return x_BTD, tuple(new_layers)

    def __call__(self, tokens_BT: jax.Array, segment_ids_BT: jax.Array,
                 state: LMState | None = None):
        tokens_BT, segment_ids_BT = jnp.asarray(tokens_BT), jnp.asarray(segment_ids_BT)
        if tokens_BT.ndim != 2 or not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
            raise ValueError(f"tokens must be an integer array [B, T], got {tokens_BT.dtype} "
                             f"{tokens_BT.shape}")
        if segment_ids_BT.shape != tokens_BT.shape:
            raise ValueError(f"segment_ids shape {segment_ids_BT.shape} differs from tokens shape "
                             f"{tokens_BT.shape}")
        logits_only = state is None
        if logits_only:
            state = self.init_state(tokens_BT.shape[0])
        elif not isinstance(state, LMState) or len(state.layers) != len(self.blocks):
            raise ValueError("state must be the LMState of this model (model.init_state(B) or the "
                             "state a previous call returned)")
        # The model feeds its persistent tokens itself (init_state): a call's ids are >= 0.
        stream, stream_state = make_stream(segment_ids_BT, state.stream, fresh=state.fresh,
                                           no_persistent=True)
        # The residual stream is kept in float32 (float64 in float64 mode) even when computing in
        # bfloat16 (the embedding lookup is done in that dtype): the norms, mixers and MLPs run in
        # the compute dtype, their outputs are added to the stream at full precision.
        x_BTD, layers = self._blocks(self.embed(tokens_BT), stream, state.layers)
        x_BTD = self.final_norm(x_BTD)
        out_dt = logits_dtype(self.dtype)
        x_BTD = x_BTD.astype(self.dtype)
        if self.tie_embeddings:
            logits = jnp.einsum("btd,vd->btv", x_BTD, self.embed.embedding[...].astype(self.dtype),
                                preferred_element_type=out_dt)
        else:
            logits = jnp.einsum("btd,dv->btv", x_BTD, self.head[...].astype(self.dtype),
                                preferred_element_type=out_dt)
        return logits if logits_only else (logits, LMState(stream_state, layers))
