"""Gated DeltaNet configs: ``--config=configs/gated_deltanet.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv:2412.06464): W_t = a_t (I - beta_t k_t^T
k_t) W_{t-1} + beta_t k_t^T v_t (the gradient at the decayed state a_t W_{t-1}), beta and the
forget gate a_t = 1 - alpha_t per token and head, output RMSNorm and SiLU gate.

Pre-norm blocks of this mixer and SwiGLU (``titans_lm.models.linear_rnn``); the memory settings:
``titans_lm.config.backbones.LINEAR_RNN_RULES``.
"""

from __future__ import annotations

from titans_lm.config.presets import PAPER_SIZES
from titans_lm.config.backbones import linear_rnn_config

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 16, 2048),
    "340m": (1024, 20, 2736),
    "400m": (1024, 24, 2736),
    "760m": (1536, 21, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES


def get_config(size: str = "tiny"):
    """Full run config for a Gated DeltaNet LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return linear_rnn_config("gated_deltanet", size, _PAPER)
