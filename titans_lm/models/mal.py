"""Titans MAL, Memory as a Layer (Behrouz et al. 2025, arXiv:2501.00663, section 4.3, eqs. 29-31).

    x~ = [p_1 .. p_Np || x]          persistent tokens, prepended once by the LM shell
    y  = x~ + M(x~)                  the neural memory as a residual layer
    o  = SW-Attn(y)                  sliding-window causal attention over the memory layer's output

Each block is x + o(RMSNorm(x)), then the SwiGLU MLP. The memory layer carries its own residual
(every Titans block is residual, section 4.4), so the attention sees the tokens as well as what the
memory makes of them; its W_O gets the depth-scaled residual init. The memory writes the
persistent tokens first (``titans_lm.models.memory_mixer.prefixed_memory``). Outputs at persistent
positions carry no loss.

Layers listed by ``memory_layers`` ("all" by default) are MAL layers; the others are plain
sliding-window attention with the same window.

Model config fields: as ``titans_lm.models.mag`` (``n_heads``, ``rope_theta``, ``window``,
``n_persistent``, ``memory_layers``, ``memory`` and the shell fields).
"""

from __future__ import annotations

import jax
from flax import nnx

from titans_lm.memory.layer import NeuralMemory
from titans_lm.models.lm import LanguageModel
from titans_lm.models.mag import hybrid_attention, hybrid_settings
from titans_lm.models.memory_mixer import make_memory, prefixed_memory
from titans_lm.models.registry import register
from titans_lm.nn.attention import Attention


class MALMixer(nnx.Module):
    """``mixer(x_BSD, segment_ids_BS) -> o_BSD``: memory layer, then sliding-window attention.

    Args:
      memory: ``NeuralMemory`` (attribute ``memory``).
      attention: sliding-window ``Attention`` (attribute ``attention``).
      n_persistent: number of persistent positions at the front of the sequence.
    """

    def __init__(self, memory: NeuralMemory, attention: Attention, n_persistent: int):
        self.memory, self.attention, self.n_persistent = memory, attention, n_persistent

    def __call__(self, x_BSD: jax.Array, segment_ids_BS: jax.Array) -> jax.Array:
        m = prefixed_memory(self.memory, x_BSD, segment_ids_BS, self.n_persistent)
        y = x_BSD + m.astype(x_BSD.dtype)
        return self.attention(y, segment_ids_BS)


@register("mal")
def build_mal(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """Titans MAL LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields or invalid sizes / memory settings.
    """
    mcfg, n_p, layers, out_std = hybrid_settings(model_cfg)

    def make_mixer(layer: int, rngs: nnx.Rngs):
        attention = hybrid_attention(model_cfg, out_std, rngs=rngs)
        if layer not in layers:
            return attention
        return MALMixer(make_memory(mcfg, rngs=rngs, out_init_std=out_std), attention, n_p)

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs, n_persistent=n_p)
