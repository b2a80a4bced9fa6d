"""Linear RNNs on the memory engine: Linear Transformer, DeltaNet, Gated DeltaNet.

Each is the LMM's stack without persistent tokens: pre-norm blocks x + Mixer(RMSNorm(x)), then
x + SwiGLU(RMSNorm(x)), whose mixer is a ``NeuralMemory`` with a linear memory W [d_k, d_v] that
starts from zero (``learned_w0=False``); the config's ``memory`` section picks the rule
(``titans_lm.config.backbones.LINEAR_RNN_RULES``), so all three run on the one engine:

- ``linear_attention`` (Katharopoulos et al. 2020, arXiv:2006.16236): the dot attentional bias
  with constant theta 1/2 gives S_t = S_{t-1} + phi(k_t)^T v_t; phi = elu + 1; the read is
  normalised by phi(q_t) z_t + eps, z carried as one more value column (``read_normalizer``).
- ``deltanet`` (Schlag et al. 2021; Yang et al. 2024, arXiv:2406.06484): W_t = W_{t-1} +
  beta_t k_t^T (v_t - k_t W_{t-1}), beta_t = sigmoid(.) = 2 theta_t (theta_max 0.5), online
  (``gradient_at="previous_token"``), computed chunk by chunk in WY form
  (``titans_lm.memory.delta``).
- ``gated_deltanet`` (Yang, Kautz, Hatamizadeh 2024, arXiv:2412.06464): W_t = a_t (I - beta_t
  k_t^T k_t) W_{t-1} + beta_t k_t^T v_t, a_t the forget gate.

Output: the layer's RMSNorm per head, then (gated_deltanet) the SiLU output gate, then W_O.

Model config fields: ``titans_lm.models.lm.SHELL_FIELDS`` and ``memory``.
"""

from __future__ import annotations

from flax import nnx

from titans_lm.models.lm import LanguageModel
from titans_lm.models.memory_mixer import build_memory_lm
from titans_lm.models.registry import register


def _build(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """A linear-RNN LM from a model config (module docstring).

    Raises:
      ValueError: on missing fields or invalid memory settings.
    """
    return build_memory_lm(model_cfg, rngs=rngs)


for _name in ("linear_attention", "deltanet", "gated_deltanet"):
    register(_name)(_build)
