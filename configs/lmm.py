"""Titans (LMM) configs: ``--config=configs/lmm.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

The neural long-term memory as the only token mixer (``titans_lm.models.lmm``) with the Titans
memory settings of ``titans_lm.models.presets.TITANS_MEMORY``: deep memory (L_M = 2 with 2x
expansion and SiLU; the paper does not state the expansion), momentum, decay, per-token gates,
short convolution, output gate, head_dim 64, mini-batch (chunk) 16, inner learning rate below
0.0005 and momentum below 0.9 (larger rates diverge on correlated keys, see there), and N_p
persistent tokens.

tiny: the shape of ``configs/transformer.py:tiny`` (d_model 256, 4 layers, SwiGLU 688, vocabulary
8192, 256-token windows, batch 8, 800 steps: ``titans_lm.models.presets.set_tiny_run``) with 4
memory heads of 64 and 4 persistent tokens.

Paper sizes (Titans, Behrouz et al. 2025, section 5.1: vocabulary 32K, 4K context, 0.5M tokens per
batch, AdamW lr 4e-4, cosine, weight decay 0.1): widths and depths chosen so that the parameter
count is within a few percent of the name (tests/test_backbones_params.py), 16 persistent tokens.

Ablation switches (Titans table 5) are fields of ``model.memory``: ``use_momentum``,
``use_decay``, ``use_conv``, ``memory_depth`` (1..4), ``chunk_size``; and ``model.n_persistent``
(0 = none).
"""

from __future__ import annotations

from titans_lm.models.presets import PAPER_SIZES, titans_config

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 15, 2048),
    "340m": (1024, 19, 2736),
    "400m": (1024, 24, 2736),
    "760m": (1536, 21, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES


def get_config(size: str = "tiny"):
    """Full run config for a Titans LMM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return titans_config("lmm", size, _PAPER, shape_fields=("d_model", "n_layers", "d_ff"))
