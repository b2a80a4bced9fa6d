"""Titans MAG (Memory as a Gate) configs: ``--config=configs/mag.py:<size>``, size in
tiny | 170m | 340m | 400m | 760m.

The hybrid of ``titans_lm.models.mag``: sliding-window attention and the neural memory in parallel,
combined by a non-linear gate. The memory is the LMM's (``titans_lm.models.presets.TITANS_MEMORY``:
deep memory L_M = 2 with 2x expansion, momentum, decay, per-token gates, short convolution, output
gate, head_dim 64, mini-batch 16, inner learning rate below 0.0005 and momentum below 0.9). Sliding
window: 64 tokens at tiny, 1024 at the paper sizes (the paper does not state its window; 1024 is a
quarter of the 4K context). N_p persistent tokens are prepended once to the sequence.

``model.memory_layers`` ("all", "none" or indices such as "0,2") says which layers carry memory;
the others are plain sliding-window attention.

tiny: the shape of ``configs/transformer.py:tiny`` (d_model 256, 4 layers, 4 attention heads,
SwiGLU 688, vocabulary 8192, 256-token windows, batch 8, 800 steps:
``titans_lm.models.presets.set_tiny_run``), 4 memory heads of 64, 4 persistent tokens.

Paper sizes (Titans, Behrouz et al. 2025, section 5.1: vocabulary 32K, 4K context, 0.5M tokens per
batch, AdamW lr 4e-4, cosine, weight decay 0.1): widths and depths chosen so that the parameter
count is within a few percent of the name (tests/test_backbones_params.py), 16 persistent tokens.

Ablation switches are fields of ``model.memory`` (``use_momentum``, ``use_decay``, ``use_conv``,
``memory_depth`` 1..4, ``chunk_size``) and ``model.n_persistent`` (0 = none).
"""

from __future__ import annotations

from titans_lm.models.presets import PAPER_SIZES, titans_config

#            d_model, n_layers, n_heads, d_ff
_PAPER = {
    "170m": (768, 11, 12, 2048),
    "340m": (1024, 14, 16, 2736),
    "400m": (1024, 17, 16, 2736),
    "760m": (1536, 15, 16, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES


def get_config(size: str = "tiny"):
    """Full run config for a Titans MAG (Memory as a Gate) LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    c = titans_config("mag", size, _PAPER)
    c.model.memory_layers = "all"
    c.model.window = 64 if c.model.size == "tiny" else 1024
    return c
