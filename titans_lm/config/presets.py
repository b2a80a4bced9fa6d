"""Run presets shared by the config files (``configs/<name>.py``): sizes, token budgets, runs.

- :func:`set_shell`: the fields of the LM shell that every backbone shares.
- :func:`set_tiny_run`: the CPU-sized run shared by every tiny config, Transformer++ included
  (vocabulary 8192, 256-token windows, batch 8, 800 steps = 1.6M tokens, AdamW lr 2e-3, float32,
  tied embeddings), so tiny backbones compare fairly; :data:`TINY_SHAPE` their common shape.
- :func:`set_paper_run`: the Titans paper's training setup (Behrouz et al. 2025, section 5.1):
  vocabulary 32K, 4K context, 0.5M tokens per batch, AdamW lr 4e-4 with cosine decay, weight decay
  0.1; 15B training tokens for 170M/340M/400M and 30B for 760M; bfloat16 compute, remat per block,
  untied LM head (``configs/transformer.py``'s paper sizes use it with their own token budgets).
- :func:`check_size`: a config file's size argument, checked against its sizes.

The memory backbones' builders (``titans_config``, ``ttt_config``, the ``model.memory`` section)
are in :mod:`titans_lm.config.backbones`.
"""

from __future__ import annotations

import ml_collections

PAPER_SIZES = ("170m", "340m", "400m", "760m")
PAPER_VOCAB = 32_000
PAPER_SEQ_LEN = 4096
TOKENS_PER_BATCH = 524_288
PAPER_TRAIN_TOKENS = {"170m": 15_000_000_000, "340m": 15_000_000_000, "400m": 15_000_000_000,
                      "760m": 30_000_000_000}
TINY_VOCAB = 8192


def set_shell(m: ml_collections.ConfigDict, name: str, size: str) -> None:
    """Fields of the LM shell that every backbone shares (``titans_lm.models.lm.SHELL_FIELDS``)."""
    m.name = name
    m.size = size
    m.rope_theta = 10_000.0
    m.norm_eps = 1e-6
    m.init_std = 0.02
    m.param_dtype = "float32"


def set_tiny_run(c: ml_collections.ConfigDict) -> None:
    """The tiny CPU run of every ``configs/<name>.py:tiny``.

    Default budget: 800 steps x 8 windows x 256 tokens = 1.6M tokens, about 10-15 minutes on 2 CPU
    cores for the tiny Transformer++ (~2-3k train tokens/s; the memory backbones are 1-3x slower).
    """
    m = c.model
    m.tie_embeddings = True
    m.dtype = "float32"
    m.remat = "none"
    c.data.seq_len = 256
    c.train.batch_size = 8
    c.train.steps = 800
    c.optim.lr = 2e-3
    c.optim.warmup_steps = 80
    c.train.eval_every = 200
    c.train.ckpt_every = 100
    c.data.vocab_size = TINY_VOCAB
    m.vocab_size = TINY_VOCAB


def set_paper_run(c: ml_collections.ConfigDict, size: str, train_tokens: int | None = None) -> None:
    """The Titans paper's training run for ``size`` (see the module docstring).

    Args:
      c: the run config, changed in place.
      size: one of :data:`PAPER_SIZES`, or any name when ``train_tokens`` is given.
      train_tokens: training tokens (default: the Titans budget of ``size``).

    Raises:
      ValueError: for a size that is not one of :data:`PAPER_SIZES` and no ``train_tokens``.
    """
    if train_tokens is None:
        if size not in PAPER_TRAIN_TOKENS:
            raise ValueError(f"unknown paper size {size!r}; valid: {list(PAPER_SIZES)}")
        train_tokens = PAPER_TRAIN_TOKENS[size]
    m = c.model
    m.tie_embeddings = False
    m.dtype = "bfloat16"
    m.remat = "block"
    c.train.compute_dtype = "bfloat16"
    c.data.seq_len = PAPER_SEQ_LEN
    c.train.batch_size = TOKENS_PER_BATCH // PAPER_SEQ_LEN
    c.train.steps = train_tokens // TOKENS_PER_BATCH
    c.optim.lr = 4e-4
    c.optim.end_lr_ratio = 0.1
    c.optim.warmup_steps = min(2000, c.train.steps // 10)
    c.optim.b1, c.optim.b2 = 0.9, 0.95
    c.optim.weight_decay = 0.1
    c.optim.clip_norm = 1.0
    c.train.eval_every = 1000
    c.train.ckpt_every = 1000
    c.data.vocab_size = PAPER_VOCAB
    m.vocab_size = PAPER_VOCAB


def check_size(size: str, sizes: tuple, backbone: str) -> str:
    """Normalise ``size`` ("" -> "tiny") and check it is one of ``sizes``.

    Raises:
      ValueError: naming the valid sizes.
    """
    size = (size or "tiny").strip()
    if size not in sizes:
        raise ValueError(f"unknown {backbone} size {size!r}; valid sizes: {list(sizes)}")
    return size


# The tiny shape shared by every backbone (that of the tiny Transformer++).
TINY_SHAPE = {"d_model": 256, "n_layers": 4, "n_heads": 4, "d_ff": 688}
