"""Transformer++ configs: ``--config=configs/transformer.py:<size>``, size in tiny | 125m | 340m | 760m.

tiny: trains on a 2-core CPU (d_model 256, 4 layers, 4 heads, vocab 8192, tied embeddings, 256-token
windows, batch 8, 800 steps = 1.6M tokens; ~5.3M parameters).

125m / 340m / 760m: the GPT-3 shapes (Brown et al. 2020, table 2.1: 125M d 768 / 12 layers / 12
heads; 350M d 1024 / 24 / 16; 760M d 1536 / 24 / 16) with the SwiGLU widths of the TTT paper's
Transformer baselines (Sun et al. 2024: d_ff 2048 / 2736 / 4096, about 8/3 d_model), vocab 32000
and 4096-token context as in the Titans and TTT setups. The LM head is untied: with a 32K
vocabulary the tied 125M model has only 110M parameters (12% short of its name), while untied heads
give 134M / 368M / 778M, all within 10% of the names (TTT's Llama-style baselines are untied too).

Optimiser (Titans, Behrouz et al. 2025, section 5.1): AdamW, peak lr 4e-4, cosine decay to 10% of
the peak, weight decay 0.1, b2 0.95, 0.5M tokens per batch (batch = 524288 // 4096 = 128 windows).
Warmup: 2000 steps, capped at 10% of the run (the papers do not state a warmup; 2000 steps is the
common choice at these scales). Training length: 125m 2.5B tokens (TTT's Chinchilla budget),
340m 15B and 760m 30B tokens (Titans).
"""

from __future__ import annotations

from titans_lm.config import base_config
from titans_lm.config.presets import check_size, set_paper_run, set_shell, set_tiny_run

#            d_model, n_layers, n_heads, d_ff, train tokens
_PAPER_SIZES = {
    "125m": (768, 12, 12, 2048, 2_500_000_000),
    "340m": (1024, 24, 16, 2736, 15_000_000_000),
    "760m": (1536, 24, 16, 4096, 30_000_000_000),
}
SIZES = ("tiny",) + tuple(_PAPER_SIZES)


def get_config(size: str = "tiny"):
    """Full run config for a Transformer++ of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    size = check_size(size, SIZES, "transformer")
    c = base_config()
    m = c.model
    set_shell(m, "transformer", size)
    m.window = 0  # 0: full causal attention; > 0: sliding window of this many tokens
    # Full attention's KV cache for a carried state (streaming eval, generation): the most tokens a
    # query sees. 0: unbounded within one call, no carried state (the eval sets data.seq_len).
    m.max_context = 0
    if size == "tiny":
        m.d_model, m.n_layers, m.n_heads, m.d_ff = 256, 4, 4, 688
        set_tiny_run(c)
    else:
        d_model, n_layers, n_heads, d_ff, tokens = _PAPER_SIZES[size]
        m.d_model, m.n_layers, m.n_heads, m.d_ff = d_model, n_layers, n_heads, d_ff
        set_paper_run(c, size, train_tokens=tokens)
    return c
