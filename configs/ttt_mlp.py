"""TTT-MLP configs: ``--config=configs/ttt_mlp.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

TTT-MLP (Sun et al. 2024, arXiv:2407.04620) as the token mixer of Transformer++ blocks
(``titans_lm.models.ttt``): inner model f(x) = x + LN(MLP(x)), a 2-layer MLP of 4x expansion and
GELU with fast W1, b1, W2, b2 and an outer-loop LN scale and shift, TTT-Linear's base inner
learning rate 1.0 (the paper's for TTT-MLP: 0.1; a deviation, for recall) and the causal short
convolution of TTT's Mamba backbone on q, k and v (below). The rest (mini-batch 16 with TTT's
running-mean reads, no momentum, a forget gate toward W0 (a deviation, for length), learned W0,
heads of 64, runs): ``titans_lm.config.backbones.ttt_config``.
"""

from __future__ import annotations

from titans_lm.config.presets import PAPER_SIZES
from titans_lm.config.backbones import ttt_config

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 16, 2048),
    "340m": (1024, 21, 2736),
    "400m": (1024, 25, 2736),
    "760m": (1536, 23, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES
# With the paper's base lr (0.1), with or without the short convolution, TTT-MLP found no S-NIAH needle
# at 1K-16K (0%; trained on 128-token rows). With both TTT-Linear's base lr and the convolution
# both seeds learnt the task (carried 1K / 4K / 16K: 94.4 / 87.8 / 39.1% on the mean) and read
# the book 5.9% better (reset 198.9 / 194.3 against 207.4 / 210.6; carried 197.7 / 193.4).
# ``--config.model.memory.ttt_base_lr=0.003125 --config.model.memory.use_conv=False``: the
# paper's step and no convolution.
# docs/results/memory-suite.md#ttt-mlp-the-convolution-and-ttt-linears-step
BASE_LR = 1.0  # TTT-Linear's base_lr; ttt_config converts it (ttt_engine_lr)
SHORT_CONV = True


def get_config(size: str = "tiny"):
    """Full run config for a TTT-MLP LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return ttt_config("ttt_mlp", size, _PAPER, paper_base_lr=BASE_LR, short_conv=SHORT_CONV,
                      memory_depth=2, memory_expansion=4.0, memory_activation="gelu_tanh")
