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

TOKENS_PER_BATCH = 524_288
PAPER_SEQ_LEN = 4096
PAPER_VOCAB = 32_000

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
    size = (size or "tiny").strip()
    if size not in SIZES:
        raise ValueError(f"unknown transformer size {size!r}; valid sizes: {list(SIZES)}")
    c = base_config()
    m = c.model
    m.name = "transformer"
    m.size = size
    m.rope_theta = 10_000.0
    m.norm_eps = 1e-6
    m.init_std = 0.02
    m.param_dtype = "float32"
    m.window = 0  # 0: full causal attention; > 0: sliding window of this many tokens
    if size == "tiny":
        vocab = 8192
        m.d_model, m.n_layers, m.n_heads, m.d_ff = 256, 4, 4, 688
        m.tie_embeddings = True
        m.dtype = "float32"
        m.remat = "none"
        c.data.seq_len = 256
        # Default budget: 800 steps x 8 windows x 256 tokens = 1.6M tokens, about 10-15 minutes
        # on 2 CPU cores at ~2-2.5k train tokens/s.
        c.train.batch_size = 8
        c.train.steps = 800
        c.optim.lr = 2e-3
        c.optim.warmup_steps = 80
        c.train.eval_every = 200
        c.train.ckpt_every = 100
    else:
        vocab = PAPER_VOCAB
        d_model, n_layers, n_heads, d_ff, tokens = _PAPER_SIZES[size]
        m.d_model, m.n_layers, m.n_heads, m.d_ff = d_model, n_layers, n_heads, d_ff
        m.tie_embeddings = False
        m.dtype = "bfloat16"
        m.remat = "block"
        c.train.compute_dtype = "bfloat16"
        c.data.seq_len = PAPER_SEQ_LEN
        c.train.batch_size = TOKENS_PER_BATCH // PAPER_SEQ_LEN
        c.train.steps = tokens // TOKENS_PER_BATCH
        c.optim.lr = 4e-4
        c.optim.end_lr_ratio = 0.1
        c.optim.warmup_steps = min(2000, c.train.steps // 10)
        c.optim.b1, c.optim.b2 = 0.9, 0.95
        c.optim.weight_decay = 0.1
        c.optim.clip_norm = 1.0
        c.train.eval_every = 1000
        c.train.ckpt_every = 1000
    c.data.vocab_size = vocab
    m.vocab_size = vocab
    return c
