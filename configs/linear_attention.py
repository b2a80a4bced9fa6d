"""Linear Transformer configs: ``--config=configs/linear_attention.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

Linear attention (Katharopoulos et al. 2020, arXiv:2006.16236): S_t = S_{t-1} + phi(k_t)^T v_t,
y_t = phi(q_t) S_t / (phi(q_t) z_t + eps) with phi = elu + 1 and z_t = sum_{s<=t} phi(k_s): the
dot attentional bias with constant theta 1/2, feature_map elu1, the normaliser column, W0 = 0.

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
    """Full run config for a Linear Transformer LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return linear_rnn_config("linear_attention", size, _PAPER)
