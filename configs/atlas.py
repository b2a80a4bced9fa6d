"""Atlas (Behrouz et al. 2025, arXiv:2505.23735): ``--config=configs/atlas.py:<size>``, size in
tiny | 170m | 340m | 400m | 760m, each also as ``<size>-mag`` (Atlas-MAG).

Atlas is the Titans LMM (``configs/lmm.py``: the memory as the only token mixer, persistent
tokens) whose memory is written by Atlas' rule, all three parts of it fields of the one engine:

- the **Omega rule** (``omega_window`` c = 16): token t writes the gamma-weighted sum of the
  gradients of its last c tokens, gamma_j = sigmoid(x_j w + b) per token and head
  (docs/design.md#the-omega-rule); c = 16 is rkstgr/atlas-jax's default (the paper sweeps c);
- **Muon** on the momentum (``ns_steps`` 5): theta_t NS_5(S_t) per weight matrix
  (docs/design.md#newton-schulz-momentum);
- **polynomial features** of degree 2 on q and k (``feature_map="poly"``), so the memory's key
  width is C(head_dim + 2, 2) - 1 (docs/design.md#attentional-biases-feature-maps-the-normaliser);

on the Titans deep memory (2 layers, 2x expansion), decaying toward its initial state. Atlas-MAG
(``<size>-mag``): the same memory in ``configs/mag.py``'s hybrid (sliding-window attention and
the memory) with the paper's gate (``model.combine="gate"``; ``configs/mag.py`` ships a sum).
The ablation rows of Atlas' table: ``--config.model.memory.omega_window=1`` (c = 1),
``--config.model.memory.ns_steps=0`` (without Muon), ``--config.model.memory.feature_map=silu``
(without the polynomial map).

Sizes. Tiny: head_dim 16 (16 memory heads at d_model 256), so the polynomial key width is 152
and each token's Newton-Schulz steps act on [152, 32] and [32, 16] matrices; paper sizes: the
Titans head_dim 64 (key width 2,144). Cost: the Muon write materialises every token's state
(the tiny LMM's train step took 33x as long with it at head_dim 64 on one CPU core;
docs/design.md#newton-schulz-momentum). theta_max is 0.0005 without the surprise clip (the
Titans presets' former bound; not tuned for the Muon write, whose step is theta times unit
singular values).
"""

from __future__ import annotations

from pathlib import Path

from titans_lm.config import load_module
from titans_lm.config.backbones import memory_variant
from titans_lm.config.presets import PAPER_SIZES

BASE_SIZES = ("tiny",) + PAPER_SIZES
SIZES = BASE_SIZES + tuple(f"{s}-mag" for s in BASE_SIZES)
TINY_HEAD_DIM = 16


def get_config(size: str = "tiny"):
    """Full run config for Atlas (or Atlas-MAG with a ``-mag`` suffix) of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    size = (size or "tiny").strip()
    if size not in SIZES:
        raise ValueError(f"unknown atlas size {size!r}; valid sizes: {list(SIZES)}")
    base, _, hybrid = size.partition("-")
    backbone = load_module(Path(__file__).with_name("mag.py" if hybrid else "lmm.py"))
    c = backbone.get_config(base)
    memory_variant(c.model.memory, "atlas")   # MEMORY_VARIANTS["atlas"]: any memory backbone takes it
    if hybrid:
        c.model.combine = "gate"   # Atlas-MAG as published: MAG's gate (configs/mag.py ships a sum)
    if base == "tiny":
        c.model.memory.head_dim = TINY_HEAD_DIM
    return c
