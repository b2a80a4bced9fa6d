"""TTT-Linear and TTT-MLP (Sun et al. 2024, "Learning to (Learn at Test Time)", arXiv:2407.04620)
as the token mixer of Transformer++ blocks (pre-norm, RMSNorm, SwiGLU; the paper's "Transformer
backbone", section 2.7).

The TTT layer is the memory engine with the TTT settings of the config's ``memory`` section:

- inner model f(x) = x + LN(g(x)) with g linear (TTT-Linear) or a 2-layer MLP with 4x expansion and
  GELU (TTT-MLP), with fast biases (``memory_bias``); fitting f(k) to v is fitting LN(g(k)) to
  v - k (``memory_residual_ln``); the LN scale and shift are outer-loop parameters, learned per
  head with W0 and not updated by the inner loop (``memory_ln_fast = False``);
- the initial fast weights W0 are learned, one set per head;
- mini-batch gradient descent with mini-batch (chunk) size 16, no momentum (eta = 0 exactly:
  ``use_momentum = False``); TTT has no decay either (``use_decay = False``: alpha = 0 exactly),
  the shipped configs add the Titans forget gate toward W0 for length
  (``titans_lm.config.backbones.TTT_LENGTH``);
- the learnable inner learning rate theta = base_lr * sigmoid(x w_theta + b) / head_dim
  (``gate_style = "ttt"``; TTT's base_lr 1.0 for TTT-Linear and 0.1 for TTT-MLP, divided by
  2 b in the configs: TTT's loss has a factor 1/2 and its mini-batch step is the mean of the b
  gradients, the engine's the sum without 1/2);
- the read f(q_t; W_t) after token t's own write, where W_t inside a mini-batch takes the running
  mean of the gradients so far (TTT's 1/i, ``read_running_mean``; the dual form computes it
  exactly).

Options: the paper's gate (``use_output_gate``: output * SiLU(x W_g), its Mamba-backbone variant)
and causal short convolution on q, k, v (``use_conv``, after the Mamba backbone's; TTT-Linear's
config ships it: without it k_t, v_t and q_t come from token t alone and TTT-Linear learnt no
S-NIAH, ``docs/results/memory-suite.md``). Differences from the reference
implementation: the layer's projections pass through SiLU (the memory layer's fixed choice) and
start from a fan-in init (TTT: normal(0.02)), there is no RoPE inside the TTT layer, ttt-lm-jax's
learnable offset of the 1/i read weights (zero at init) is not modelled, and the output norm is an
RMSNorm per head.

Registered names: ``ttt_linear`` (requires memory_depth 1) and ``ttt_mlp`` (memory_depth >= 2).
Model config fields: ``titans_lm.models.lm.SHELL_FIELDS`` and ``memory`` (see
``titans_lm.models.memory_mixer.memory_config``).
"""

from __future__ import annotations

from flax import nnx

from titans_lm.models.lm import LanguageModel
from titans_lm.models.memory_mixer import build_memory_lm
from titans_lm.models.registry import register


def _check_depth(model_cfg, name: str, linear: bool) -> None:
    depth = int(model_cfg.memory.get("memory_depth", 0)) if "memory" in model_cfg else 0
    if linear and depth != 1:
        raise ValueError(f"{name} needs model.memory.memory_depth = 1 (linear inner model), got {depth}")
    if not linear and depth < 2:
        raise ValueError(f"{name} needs model.memory.memory_depth >= 2 (MLP inner model), got {depth}")


@register("ttt_linear")
def build_ttt_linear(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """TTT-Linear LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields, invalid memory settings, or memory_depth != 1.
    """
    _check_depth(model_cfg, "ttt_linear", linear=True)
    return build_memory_lm(model_cfg, rngs=rngs)


@register("ttt_mlp")
def build_ttt_mlp(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """TTT-MLP LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields, invalid memory settings, or memory_depth < 2.
    """
    _check_depth(model_cfg, "ttt_mlp", linear=False)
    return build_memory_lm(model_cfg, rngs=rngs)
