"""Titans MAC (Memory as a Context) configs: ``--config=configs/mac.py:<size>``, size in
tiny | 170m | 340m | 400m | 760m.

The hybrid of ``titans_lm.models.mac``: per segment, retrieval from the memory left by earlier
segments, attention over [persistent || retrieved || segment], write with the attention output. The
memory is the LMM's (``titans_lm.models.presets.TITANS_MEMORY``: deep memory L_M = 2 with 2x
expansion, momentum, decay, per-token gates, short convolution, output gate, head_dim 64,
mini-batch 16, inner learning rate below 0.0005 and momentum below 0.9); N_p persistent tokens per
MAC layer.

Segments: 64 tokens at tiny, equal to the data pipeline's document alignment, so every document
starts on a segment start and a packed document computes exactly what it would alone. 512 tokens
at the paper sizes, with ``data.doc_align`` raised to 512 for the same reason (documents are padded
to multiples of 512 tokens; with a smaller alignment, documents stay isolated but one starting
inside a segment gets a shorter first segment).

``model.memory_layers`` ("all", "none" or indices such as "0,2") says which layers carry memory;
the others run the same segment attention without a memory.

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
    """Full run config for a Titans MAC (Memory as a Context) LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    c = titans_config("mac", size, _PAPER)
    c.model.memory_layers = "all"
    c.model.segment_len = 64 if c.model.size == "tiny" else 512
    if c.model.size != "tiny":
        c.data.doc_align = c.model.segment_len  # documents start on segment starts
    return c
