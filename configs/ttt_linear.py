"""TTT-Linear configs: ``--config=configs/ttt_linear.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

TTT-Linear (Sun et al. 2024, arXiv:2407.04620) as the token mixer of Transformer++ blocks
(``titans_lm.models.ttt``): inner model f(x) = x + LN(x W + b) with fast W, b and an outer-loop
LN scale and shift, TTT's base inner learning rate 1.0, and the causal short convolution of TTT's
Mamba backbone on q, k and v (kernel 4, for recall; below). The rest (mini-batch 16 with TTT's
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
# Without a short convolution k_t, q_t and v_t come from token t alone and the memory stores no
# "previous tokens -> this token" association: on S-NIAH (trained on 128-token rows) TTT-Linear
# found no needle at 1K-16K (0%, 20-23% of digits). With it, both seeds learnt the task (carried
# 1K / 4K / 16K: 28.7 / 0.0 / 1.2% and 88.8 / 81.9 / 87.5%) at 3.9% on the book's mean (reset
# 210.6 / 200.5 against 199.1 / 196.8). ``--config.model.memory.use_conv=False``: without it.
# docs/results/memory-suite.md#ttt-linear-with-a-short-convolution
SHORT_CONV = True


def get_config(size: str = "tiny"):
    """Full run config for a TTT-Linear LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return ttt_config("ttt_linear", size, _PAPER, paper_base_lr=PAPER_BASE_LR,
                      short_conv=SHORT_CONV, memory_depth=1)
