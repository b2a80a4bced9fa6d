"""TTT-Linear configs: ``--config=configs/ttt_linear.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

TTT-Linear (Sun et al. 2024, arXiv:2407.04620) as the token mixer of Transformer++ blocks
(``titans_lm.models.ttt``): inner model f(x) = x + LN(x W + b) with fast W, b and an outer-loop
LN scale and shift, TTT's base inner learning rate 1.0. The rest (mini-batch 16 with TTT's
running-mean reads, no momentum, a forget gate toward W0 (a deviation, for length), learned
W0, heads of 64, runs): ``titans_lm.config.backbones.ttt_config``.
"""

from __future__ import annotations

from titans_lm.config.presets import PAPER_SIZES
from titans_lm.config.backbones import ttt_config

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 17, 2048),
    "340m": (1024, 22, 2736),
    "400m": (1024, 26, 2736),
    "760m": (1536, 23, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES
PAPER_BASE_LR = 1.0  # TTT's base_lr for TTT-Linear


def get_config(size: str = "tiny"):
    """Full run config for a TTT-Linear LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return ttt_config("ttt_linear", size, _PAPER, paper_base_lr=PAPER_BASE_LR, memory_depth=1)
