"""Titans MAG, Memory as a Gate (Behrouz et al. 2025, arXiv:2501.00663, section 4.2, eqs. 26-28).

    x~ = [p_1 .. p_Np || x]          persistent tokens, fed once before the stream by the LM shell
    y  = SW-Attn*(x~)                sliding-window causal attention (persistent tokens always visible)
    m  = M(x~)                       the neural memory over the same sequence, in parallel
    o  = (RMSNorm_y(y) * sigmoid(RMSNorm_m(m))) W_O     the non-linear gate y ⊗ M(x~)

(``titans_lm.nn.gated_combine``: both branches normalised with learned vector-valued weights, then
a sigmoid gate and the output projection.) With ``combine="sum"`` the two branches are added,
o = y + m, each with its own output projection (LaCT's block, Zhang et al. 2025: window attention
plus the large-chunk TTT layer; configs/lact.py, docs/design.md#lact-large-chunks). Each block is x + o(RMSNorm(x)), then the SwiGLU MLP.
The shell runs the persistent tokens through the blocks in ``LanguageModel.init_state``: the
attention keeps their keys/values in never-evicted slots, the memory writes them first and every
document starts from the state they leave. A MAG layer's state is (attention state, memory state):
the window's KV cache and the memory's carried state (``titans_lm.memory.layer.NeuralMemory``).

Layers listed by ``memory_layers`` ("all" by default) are MAG layers; the others are plain
sliding-window attention with the same window.

Ablation switch for evaluation (``memory_ablation``, :data:`MAG_ABLATIONS`; changes no parameter):
``"gated_read"`` replaces the memory's read m by zeros, so the gate becomes the constant
sigmoid(0) = 1/2 (with ``combine="sum"``: o = y); the memory is still written and carried, as
MAC's switch of the same name does (``titans_lm.models.mac``). ``"none"`` (the default) runs the
layer as described.

Model config fields: ``titans_lm.models.lm.SHELL_FIELDS``, ``n_heads`` (attention heads),
``rope_theta``, ``window`` (sliding window in tokens; 0 = full causal attention), ``n_persistent``,
``memory_layers``, optional ``combine`` ("gate", the paper's and what an absent field means, or
"sum", ``configs/mag.py``'s default: a deviation, docs/design.md), ``memory_ablation``
(default "none") and ``memory`` (see ``titans_lm.models.memory_mixer.memory_config``); optional
``max_context`` (with window 0 only: full attention's KV cache, see ``titans_lm.models.transformer``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.config.fields import MEMORY_ABLATIONS, check_memory_ablation
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from titans_lm.models.lm import LanguageModel, check_model_config
from titans_lm.models.memory_mixer import make_memory, memory_config, memory_layer_indices
from titans_lm.models.registry import register
from titans_lm.nn.attention import Attention
from titans_lm.nn.dtypes import to_dtype
from titans_lm.nn.gated_combine import GatedCombine, branch_out_stds, make_combine
from titans_lm.nn.init import scaled_out_std
from titans_lm.nn.stream import Stream

HYBRID_FIELDS = ("n_heads", "rope_theta", "window", "n_persistent", "memory_layers", "memory")
MAG_ABLATIONS = MEMORY_ABLATIONS["mag"]  # ("none", "gated_read")


class HybridSettings(NamedTuple):
    """What a MAG or MAL builder reads from the model config."""
    memory: MemoryConfig          # the memory layers' settings
    n_persistent: int             # N_p persistent tokens prepended once to the sequence
    memory_layers: frozenset      # indices of the layers that carry a memory
    out_std: float                # depth-scaled init std of the residual output projections


def hybrid_settings(model_cfg) -> HybridSettings:
    """Check a MAG/MAL model config and read its settings.

    Raises:
      ValueError: on missing fields or invalid sizes / memory settings.
    """
    check_model_config(model_cfg)
    check_model_config(model_cfg, HYBRID_FIELDS)
    return HybridSettings(memory_config(model_cfg), int(model_cfg.n_persistent),
                          memory_layer_indices(model_cfg.memory_layers, model_cfg.n_layers),
                          scaled_out_std(model_cfg.init_std, model_cfg.n_layers))


class MAGMixer(nnx.Module):
    """``mixer(x_BTD, stream, state) -> (o_BTD, state)``: attention and memory in parallel, gated.

    Args:
      attention: sliding-window ``Attention`` (attribute ``attention``).
      memory: ``NeuralMemory`` (attribute ``memory``).
      combine: ``GatedCombine``, or ``SumCombine`` with ``combine="sum"`` (attribute ``combine``).
      ablation: one of :data:`MAG_ABLATIONS` (module docstring); "none" to run the layer.

    State: ``(attention_state, memory_state)``.

    Raises:
      ValueError: an ``ablation`` outside :data:`MAG_ABLATIONS`.
    """

    def __init__(self, attention: Attention, memory: NeuralMemory, combine: GatedCombine, *,
                 ablation: str = "none"):
        self.attention, self.memory, self.combine = attention, memory, combine
        self.ablation = check_memory_ablation("mag", ablation)

    def init_state(self, batch_size: int) -> tuple:
        return self.attention.init_state(batch_size), self.memory.init_state(batch_size)

    def __call__(self, x_BTD: jax.Array, stream: Stream, state: tuple) -> tuple[jax.Array, tuple]:
        attention_state, memory_state = state
        y, attention_state = self.attention(x_BTD, stream, attention_state)
        m, memory_state = self.memory(x_BTD, stream, memory_state)
        if self.ablation == "gated_read":
            m = jnp.zeros_like(m)
        return self.combine(y, m), (attention_state, memory_state)

    def reset_memory(self, state: tuple, rows_B: jax.Array) -> tuple:
        return state[0], self.memory.reset_memory(state[1], rows_B)

    def memory_norms(self, state: tuple) -> tuple[jax.Array]:
        return self.memory.memory_norms(state[1])


def hybrid_attention(model_cfg, out_init_std: float, *, rngs: nnx.Rngs) -> Attention:
    """The sliding-window attention of a MAG/MAL layer (or of a layer without memory), with slots
    for the model's persistent tokens. With ``window`` 0 it is full attention bounded by
    ``max_context`` (optional field, 0 = unbounded within one call)."""
    return Attention(model_cfg.d_model, model_cfg.n_heads, rope_theta=model_cfg.rope_theta,
                     window=int(model_cfg.window) or None,
                     max_context=int(model_cfg.get("max_context", 0)) or None,
                     n_persistent=int(model_cfg.n_persistent), dtype=to_dtype(model_cfg.dtype),
                     param_dtype=to_dtype(model_cfg.get("param_dtype", "float32")),
                     init_std=model_cfg.init_std, out_init_std=out_init_std, rngs=rngs)


@register("mag")
def build_mag(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """Titans MAG LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields or invalid sizes / memory settings.
    """
    mcfg, n_p, layers, out_std = hybrid_settings(model_cfg)
    attention_std, memory_std = branch_out_stds(model_cfg, out_std)
    ablation = str(model_cfg.get("memory_ablation", "none"))

    def make_mixer(layer: int, rngs: nnx.Rngs):
        if layer not in layers:
            return hybrid_attention(model_cfg, out_std, rngs=rngs)
        attention = hybrid_attention(model_cfg, attention_std, rngs=rngs)
        memory = make_memory(mcfg, rngs=rngs, out_init_std=memory_std)
        return MAGMixer(attention, memory, make_combine(model_cfg, out_std, rngs=rngs),
                        ablation=ablation)

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs, n_persistent=n_p)
