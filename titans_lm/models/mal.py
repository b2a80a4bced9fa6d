"""Titans MAL, Memory as a Layer (Behrouz et al. 2025, arXiv:2501.00663, section 4.3, eqs. 29-31).

    x~ = [p_1 .. p_Np || x]          persistent tokens, fed once before the stream by the LM shell
    y  = x~ + M(x~)                  the neural memory as a residual layer
    o  = SW-Attn(y)                  sliding-window causal attention over the memory layer's output

Each block is x + o(RMSNorm(x)), then the SwiGLU MLP. The memory layer carries its own residual
(every Titans block is residual, section 4.4), so the attention sees the tokens as well as what the
memory makes of them; its W_O gets the depth-scaled residual init. The shell runs the persistent
tokens through the blocks in ``LanguageModel.init_state`` (the memory writes them first; attention
keeps their keys/values). A MAL layer's state is (memory state, attention state).

Layers listed by ``memory_layers`` ("all" by default) are MAL layers; the others are plain
sliding-window attention with the same window.

``read_to_output=True`` (a deviation, off in ``configs/mal.py``): o = SW-Attn(y) + M(x~), the
memory's read also added to the layer's output, as MAG's and MAC's summed branches add theirs.
In the paper's layer the read reaches a token's output only through the attention's projections,
mixed over the window; at the tiny budget that MAL learnt no recall past its window, and with the
read added (and the LMM's write) it did, at a cost on the book
(docs/results/memory-suite.md#mals-read-added-to-its-output).

Ablation switch for evaluation (``memory_ablation``, :data:`MAL_ABLATIONS`; changes no parameter):
``"read"`` replaces the memory layer's output m by zeros, so the attention sees y = x~ (and
``read_to_output`` adds zeros); the memory is still written and carried. ``"none"`` (the
default) runs the layer as described.

Model config fields: as ``titans_lm.models.mag`` (``n_heads``, ``rope_theta``, ``window``,
``n_persistent``, ``memory_layers``, ``memory`` and the shell fields), optional
``read_to_output`` (default False: the paper's layer) and ``memory_ablation`` (default "none").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.config.fields import MEMORY_ABLATIONS, check_memory_ablation
from titans_lm.memory.layer import NeuralMemory
from titans_lm.models.lm import LanguageModel
from titans_lm.models.mag import hybrid_attention, hybrid_settings
from titans_lm.models.memory_mixer import make_memory
from titans_lm.models.registry import register
from titans_lm.nn.attention import Attention
from titans_lm.nn.stream import Stream

MAL_ABLATIONS = MEMORY_ABLATIONS["mal"]  # ("none", "read")


class MALMixer(nnx.Module):
    """``mixer(x_BTD, stream, state) -> (o_BTD, state)``: memory layer, then sliding-window
    attention.

    Args:
      memory: ``NeuralMemory`` (attribute ``memory``).
      attention: sliding-window ``Attention`` (attribute ``attention``).
      ablation: one of :data:`MAL_ABLATIONS` (module docstring); "none" to run the layer.
      read_to_output: add the memory's read m to the attention's output (module docstring).

    State: ``(memory_state, attention_state)``.

    Raises:
      ValueError: an ``ablation`` outside :data:`MAL_ABLATIONS`.
    """

    def __init__(self, memory: NeuralMemory, attention: Attention, *, ablation: str = "none",
                 read_to_output: bool = False):
        self.memory, self.attention = memory, attention
        self.ablation = check_memory_ablation("mal", ablation)
        self.read_to_output = bool(read_to_output)

    def init_state(self, batch_size: int) -> tuple:
        return self.memory.init_state(batch_size), self.attention.init_state(batch_size)

    def __call__(self, x_BTD: jax.Array, stream: Stream, state: tuple) -> tuple[jax.Array, tuple]:
        memory_state, attention_state = state
        m, memory_state = self.memory(x_BTD, stream, memory_state)
        if self.ablation == "read":
            m = jnp.zeros_like(m)
        y = x_BTD + m.astype(x_BTD.dtype)
        o, attention_state = self.attention(y, stream, attention_state)
        if self.read_to_output:
            o = o + m.astype(o.dtype)
        return o, (memory_state, attention_state)

    def reset_memory(self, state: tuple, rows_B: jax.Array) -> tuple:
        return self.memory.reset_memory(state[0], rows_B), state[1]

    def memory_norms(self, state: tuple) -> tuple[jax.Array]:
        return self.memory.memory_norms(state[0])


@register("mal")
def build_mal(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """Titans MAL LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields or invalid sizes / memory settings.
    """
    mcfg, n_p, layers, out_std = hybrid_settings(model_cfg)
    ablation = str(model_cfg.get("memory_ablation", "none"))
    read_to_output = bool(model_cfg.get("read_to_output", False))

    def make_mixer(layer: int, rngs: nnx.Rngs):
        attention = hybrid_attention(model_cfg, out_std, rngs=rngs)
        if layer not in layers:
            return attention
        return MALMixer(make_memory(mcfg, rngs=rngs, out_init_std=out_std), attention,
                        ablation=ablation, read_to_output=read_to_output)

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs, n_persistent=n_p)
