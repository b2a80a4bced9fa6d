"""DeltaNet configs: ``--config=configs/deltanet.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

DeltaNet (Schlag, Irie, Schmidhuber 2021; Yang et al. 2024, arXiv:2406.06484): the delta rule
W_t = W_{t-1} + beta_t k_t^T (v_t - k_t W_{t-1}), beta_t = sigmoid(x w + b) (theta_max 0.5, beta =
2 theta), SiLU + short convolution + l2-normalised q and k, W0 = 0, chunkwise WY form.

Pre-norm blocks of this mixer and SwiGLU (``titans_lm.models.linear_rnn``); the memory settings:
``titans_lm.config.backbones.LINEAR_RNN_RULES``.
"""

from __future__ import annotations

from titans_lm.config.presets import PAPER_SIZES
from titans_lm.config.backbones import linear_rnn_config

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 17, 2048),
    "340m": (1024, 22, 2736),
    "400m": (1024, 26, 2736),
    "760m": (1536, 23, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES


def get_config(size: str = "tiny"):
    """Full run config for a DeltaNet LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return linear_rnn_config("deltanet", size, _PAPER)
