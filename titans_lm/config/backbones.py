"""Config building blocks shared by the memory backbones' config files (``configs/<name>.py``).

- :func:`memory_section`: a ``model.memory`` ConfigDict with every field of the memory layer's
  ``MemoryConfig`` (:data:`MEMORY_DEFAULTS`; so any switch can be overridden from the command
  line, e.g. ``--config.model.memory.use_decay=False``); ``n_heads = 0`` means
  ``d_model // head_dim``.
- :func:`titans_memory_section`, :func:`titans_config`: the memory settings shared by the
  Titans backbones (LMM, MAC, MAG, MAL), with the stability bounds explained at TITANS_MEMORY.
- :func:`backbone_config`: the whole config of a memory backbone at a size, which each
  ``configs/<name>.py`` then specialises (window, segment length, memory layers);
  :func:`titans_config` and :func:`ttt_config` for the two families.

The run presets they use (sizes, token budgets, the tiny and paper runs) are
:mod:`titans_lm.config.presets`. Like the rest of this package they import nothing of the model
(a config file loads without JAX): :data:`MEMORY_DEFAULTS` mirrors ``MemoryConfig``'s fields and
defaults (``titans_lm.memory.config``; tests/config/test_backbones.py keeps the two equal).
"""

from __future__ import annotations

import math

import ml_collections

from titans_lm.config.base import base_config
from titans_lm.config.presets import (PAPER_SIZES, TINY_SHAPE, check_size, set_paper_run, set_shell,
                                      set_tiny_run)

# ``titans_lm.memory.config.MemoryConfig``'s fields and defaults, less those the model section
# gives (d_model, dtype, param_dtype).
MEMORY_DEFAULTS = dict(
    n_heads=4, head_dim=32, memory_depth=2, memory_expansion=4.0, memory_activation="silu",
    memory_bias=False, memory_residual_ln=False, memory_ln_fast=True, chunk_size=16,
    theta_max=0.0005, theta_ref_head_dim=0, gate_style="titans", ttt_base_lr=1.0, eta_max=0.9,
    gate_granularity="token",
    use_momentum=True, use_decay=True, theta_bias_init=0.0, eta_bias_init=2.0,
    alpha_bias_init=-6.0, use_conv=True, conv_kernel=4, qk_l2_norm=True, v_l2_norm=False,
    use_output_gate=True, read="after_write", read_running_mean=False, surprise_max_norm=0.0,
    attentional_bias="l2", bias_p=3.0, huber_delta=1.0, feature_map="silu",
    feature_degree=2, read_normalizer=False, learned_w0=True,
    gradient_at="chunk_start", decay_target="zero", ns_steps=0, ns_gradient="exact",
    fast_weight_norm=False, omega_window=1, omega_gamma_bias_init=2.0, omega_normalize=False,
    impl="chunked", chunks_per_checkpoint=1, norm_eps=1e-6)


def memory_section(**overrides) -> ml_collections.ConfigDict:
    """Every MemoryConfig field (:data:`MEMORY_DEFAULTS`, then ``overrides``), as a ConfigDict.

    Raises:
      ValueError: for an override that is not a MemoryConfig field or is set from the model section.
    """
    fields = dict(MEMORY_DEFAULTS)
    fields["n_heads"] = 0  # automatic: d_model // head_dim
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown memory field(s) {unknown}; known: {sorted(fields)}")
    fields.update(overrides)
    return ml_collections.ConfigDict(fields)


# The Titans memory shared by the LMM, MAC, MAG and MAL configs, so that they differ only in the
# wiring: deep memory L_M = 2 with 2x expansion and SiLU (the paper does not state the expansion;
# 2x keeps the inner loop affordable on CPU), momentum, decay, per-token gates, SiLU + l2-normalised
# q and k, causal short convolution, output gate, heads of 64, mini-batch (chunk) 16.
#
# Stability of the write. Within a chunk every gradient is taken at the chunk-start state and the
# momentum sums them: for b keys with mean cosine c the chunk's step along their common direction
# is about 2 theta (1 + (b - 1) c) sum_{i<=b} (1 - eta^i) / (1 - eta), to be kept below about
# 2 (1 + eta^b). Text reaches strong key correlations (repetitive passages; the attention outputs
# that MAC writes reach c ~ 0.96), and the optimiser drives theta and eta up within tens of steps.
# Measured on the tiny LMM/MAC on the books corpus at lr 3e-3 (batch 4, warmup 10): the layer's
# former defaults (theta < 0.1, eta < 1), theta < 0.01, theta < 0.002, chunks of 4, and theta < 0.002
# with eta < 0.9 all gave NaN losses within 5-28 steps (eta was driven to 0.96-0.999). With
# theta < 0.0005 and eta < 0.9 (b = 16, c = 1: 0.0005 * 2 * 16 * 87 = 1.4 < 2.4) MAC trained 50
# steps cleanly. So theta was kept in (0, 0.0005) and the momentum gate bounded to (0, 0.9)
# (``MemoryConfig.eta_max``), which are MemoryConfig's own defaults (``MemoryConfig.write_gain``);
# the LMM's preset now raises theta_max under the surprise guard (below). The effective
# per-token rate theta / (1 - eta) is then at most 0.005 (TTT-Linear: base_lr / head_dim =
# 0.016 without momentum, stabilised by its LayerNorm inner model).
#
# That bound assumes unit-norm keys *and* targets of comparable scale: a linear memory's write is
# affine in v, but a deep one (memory_depth >= 2) that moves its weights far to fit large values
# raises its own curvature. Unnormalised values reach norms of 4-10 (SiLU outputs over 64 dims);
# the tiny LMM with memory depth 4 at lr 3e-3 (batch 4, warmup 10) went to NaN at step 30 with
# every gate inside its bounds (theta <= 0.00047, eta <= 0.889): the last layer's inner loop
# diverged within the first quarter of a window. So the Titans configs l2-normalise the values
# too (``v_l2_norm``; the read is RMS-normalised before the output anyway, so the values' scale
# never reached the output). ``surprise_max_norm`` is the optional guard on top.
#
# Length. The forget gate decays the state toward the state documents start from (W0, or what
# the persistent tokens leave: ``decay_target="initial"``), not toward zero (eq. 14). Trained on
# 256-token windows, the tiny LMM decaying toward zero read a book 19x worse with its state
# carried than from reset windows (W0 fades: 0.5% of it is left after 2K tokens, and the reads are
# exactly 0 in float32 by 64K); decaying toward W0 the same run carried is no worse than reset
# (docs/results/reset-vs-carry.md#decay-toward-the-initial-state).
#
# The write that carries (``RAISED_WRITE``, the LMM's preset). Under that bound a write moves the
# reads by about 2% per 256 tokens, so the memory held nothing past a window (resetting it
# mid-book cost < 1e-4 nats a token) and no Titans backbone learnt S-NIAH or MQAR. The LMM
# therefore raises theta_max to 0.3 (titans-pytorch's NeuralMemory bounds its step by 1.0) under
# the surprise guard: each token's gradient is clipped to norm ``surprise_max_norm`` = 1 before
# the momentum, so a write is at most theta_max * 1 / (1 - eta_max) = 3 in Frobenius norm whatever
# the curvature, and the decay toward W0 holds the state in a band that grows with theta_max
# (tests/memory/test_stress.py: <= 60 theta_max x ||W0|| over 64K adversarial tokens at depth
# 1-4). The gate starts where the 0.1 bound started it, theta = 0.3 sigmoid(-ln 5) = 0.05, and
# training raises it where recall needs it. Chosen by the memory suite
# (docs/results/memory-suite.md#the-lmms-write-bound-03-started-at-005), two seeds each: against
# the 0.1 bound (the preset from f7ad840), S-NIAH carried to 4K 92% against 71% and MQAR at
# 256/64 48% against 26% (stage 1 learnt by 3 seeds of 4 against 1), the book 1.5% worse; the
# 0.3 bound started at its midpoint (0.15) read the book 19-20% worse. MAG with a raised bound
# and the paper's gate learns S-NIAH to 16K but reads the book worse, and worse carried than
# reset; with its branches summed (what configs/mag.py ships) it takes this write too
# (docs/results/memory-suite.md#mags-write-the-lmms-bound), and so does MAC, which found no S-NIAH
# needle at the bound above (docs/results/memory-suite.md#macs-write-the-lmms-bound). MAL keeps
# the preset's 5e-4: with this write it found no needle either and read the book 7% worse
# (docs/results/memory-suite.md#mal-with-the-lmms-write).
# The bound is stated for heads of 64 (``theta_ref_head_dim``): a narrower head's theta is bounded
# by 0.3 sqrt(head_dim / 64), since a write's norm is bounded absolutely while ||W0|| grows as
# sqrt(head_dim); at head_dim 16 (Atlas' tiny heads) the unscaled 0.3 read the book at 663.7 ppl
# and half of it at 210.0 (docs/results/titans-family-rules.md#the-lmms-write-at-any-head-width).
TITANS_MEMORY = dict(head_dim=64, memory_depth=2, memory_expansion=2.0, memory_activation="silu",
                     chunk_size=16, gate_style="titans", use_momentum=True, use_decay=True,
                     use_conv=True, qk_l2_norm=True, v_l2_norm=True, use_output_gate=True,
                     theta_max=0.0005,
                     eta_max=0.9, theta_bias_init=0.0, decay_target="initial")
RAISED_WRITE = dict(theta_max=0.3, theta_ref_head_dim=64, surprise_max_norm=1.0,
                    theta_bias_init=-math.log(5.0))
# What RAISED_WRITE changes, at the Titans preset's values (a variant that keeps the preset's
# write takes this, so a field added to RAISED_WRITE is undone with the others).
PRESET_WRITE = {k: TITANS_MEMORY.get(k, MEMORY_DEFAULTS[k]) for k in RAISED_WRITE}


# MIRAS' attentional biases and Atlas' feature map as memory overrides that any memory backbone
# takes (``memory_variant``; docs/design.md#attentional-biases-feature-maps-the-normaliser):
# from the command line, e.g. ``--config.model.memory.attentional_bias=lp
# --config.model.memory.bias_p=3``. MIRAS' Moneta, Yaad (arXiv:2504.13173, sec. 5): an MLP memory
# written by gradient descent without momentum; Moneta's l_q retention and Memora's KL
# retention do not fit the engine's decay (docs/design.md), so both keep the Titans forget gate.
MEMORY_VARIANTS = {
    "moneta": dict(attentional_bias="lp", bias_p=3.0, use_momentum=False),
    "yaad": dict(attentional_bias="huber", huber_delta=1.0, use_momentum=False),
    "poly": dict(feature_map="poly", feature_degree=2),   # Atlas' polynomial keys and queries
    # Atlas' write (arXiv:2505.23735): the Omega rule over 16 tokens (rkstgr/atlas-jax's window),
    # Muon (5 Newton-Schulz steps) on the momentum, polynomial keys of degree 2 (configs/atlas.py);
    # its step is theta times a matrix of unit singular values, so it keeps the preset's write
    # (theta_max 5e-4 from its midpoint, no surprise clip: Muon's map discards the gradient's
    # scale): not tuned for the Muon write
    "atlas": dict(omega_window=16, ns_steps=5, feature_map="poly", feature_degree=2,
                  **PRESET_WRITE),
}


def memory_variant(memory: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """``memory`` (a ``model.memory`` section) with the overrides of :data:`MEMORY_VARIANTS`
    ``name`` ("moneta", "yaad", "poly", "atlas") applied, in place; returns it.

    Raises:
      ValueError: for an unknown name (listing the known ones).
    """
    if name not in MEMORY_VARIANTS:
        raise ValueError(f"unknown memory variant {name!r}; known: {sorted(MEMORY_VARIANTS)}")
    for field, value in MEMORY_VARIANTS[name].items():
        memory[field] = value
    return memory


def titans_memory_section(**overrides) -> ml_collections.ConfigDict:
    """:func:`memory_section` with the Titans settings :data:`TITANS_MEMORY` (then ``overrides``)."""
    return memory_section(**{**TITANS_MEMORY, **overrides})


def backbone_config(name: str, size: str, paper_shapes: dict, memory: ml_collections.ConfigDict, *,
                    shape_fields: tuple = ("d_model", "n_layers", "d_ff"),
                    n_persistent: tuple | None = None) -> ml_collections.ConfigDict:
    """The full run config of memory backbone ``name`` at ``size`` (tiny or a paper size).

    Args:
      name: the registered backbone name (``model.name``).
      size: "tiny" ("" too) or one of :data:`PAPER_SIZES`.
      paper_shapes: {paper size: tuple of the ``shape_fields`` values}.
      memory: the ``model.memory`` section (:func:`memory_section`, :func:`titans_memory_section`).
      shape_fields: the model fields ``paper_shapes`` gives; tiny takes them from
        :data:`TINY_SHAPE`.
      n_persistent: (tiny, paper sizes) persistent tokens, or None for a backbone without them.

    Returns:
      The config: shell fields, shape, memory section, then :func:`set_tiny_run` or
      :func:`set_paper_run`.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    size = check_size(size, ("tiny",) + PAPER_SIZES, name)
    c = base_config()
    m = c.model
    set_shell(m, name, size)
    tiny = size == "tiny"
    shape = tuple(TINY_SHAPE[f] for f in shape_fields) if tiny else paper_shapes[size]
    for field, value in zip(shape_fields, shape, strict=True):
        m[field] = value
    m.memory = memory
    if n_persistent is not None:
        m.n_persistent = n_persistent[0] if tiny else n_persistent[1]
    if tiny:
        set_tiny_run(c)
    else:
        set_paper_run(c, size)
    return c


def titans_config(name: str, size: str, paper_shapes: dict, *,
                  shape_fields: tuple = ("d_model", "n_layers", "n_heads", "d_ff"),
                  memory: dict | None = None) -> ml_collections.ConfigDict:
    """:func:`backbone_config` of a Titans backbone (LMM, MAC, MAG, MAL).

    The LMM's memory :data:`TITANS_MEMORY` (L_M = 2 with 2x expansion, momentum bounded by 0.9,
    decay, per-token gates, short convolution, output gate, head_dim 64, chunk 16, theta below
    0.0005), then ``memory``'s fields (the LMM: :data:`RAISED_WRITE`); tiny = the tiny
    Transformer++ shape and run (:func:`set_tiny_run`) with 4 persistent tokens; the paper sizes
    use the Titans run (:func:`set_paper_run`) with 16 persistent tokens
    and the widths/depths of ``paper_shapes`` (tests/models/test_backbones_params.py keeps each within
    10% of its name). Ablation switches (Titans table 5): ``model.memory.{use_momentum, use_decay,
    use_conv, memory_depth, chunk_size}`` and ``model.n_persistent`` (0 = none).

    Raises:
      ValueError: for an unknown size.
    """
    return backbone_config(name, size, paper_shapes, titans_memory_section(**(memory or {})),
                           shape_fields=shape_fields, n_persistent=(4, 16))


def ttt_engine_lr(paper_base_lr: float, chunk_size: int) -> float:
    """TTT's base inner learning rate in the engine's convention: ``paper_base_lr / (2 b)``.

    TTT (Sun et al. 2024; ttt-lm-jax ``get_eta``) uses eta[i, s] = base_lr * token_idx[i] *
    sigmoid(x_s w + b) / head_dim with token_idx[i] = 1 / i (row i = 1..b of a mini-batch, the
    reader; column s the writer) and takes the gradient of 0.5 ||f(k) - v||^2 (the engine:
    ||f(k) - v||^2, twice as large). The state after a mini-batch uses row b (1/b): the mean of its
    b gradients, where the engine sums theta_s G_s. ``paper_base_lr / (2 b)`` in theta reproduces
    TTT's state after every mini-batch exactly, and the reads with the running-mean option
    (``model.memory.read_running_mean``: row i scaled by b / i) reproduce TTT's reads; the TTT
    configs set it. (ttt-lm-jax also adds a learnable offset to token_idx, zero-initialised;
    not modelled here.) Unscaled, the tiny TTT-Linear diverged (NaN) within 6 steps on the books
    corpus (measured).
    """
    return paper_base_lr / (2 * chunk_size)


# TTT's layer never forgets: every token's gradient stays in the fast weights. Trained on
# 256-token windows, TTT-Linear read the held-out book 6.3-6.6x worse with its state carried
# than reset (214.5 reset, 1,404.2 carried); LaCT's weight normalisation kept the norm at W0's
# and changed nothing (1,409.5): the state's content, not its size, leaves what training saw.
# The Titans forget gate toward W0 (alpha = sigmoid(x w + b), starting at sigmoid(-6) = 0.0025
# a token) fixed it on two seeds and lowered the reset score too (199.0 / 196.8 reset, 198.6 /
# 196.0 carried); TTT-MLP with it: 207.4 / 210.6 reset, 206.9 / 211.5 carried (the published
# layer: 222.8 reset). docs/results/reset-vs-carry.md#the-ttt-configs-ship-the-forget-gate-configsttt_linearpy-configsttt_mlppy.
TTT_LENGTH = dict(use_decay=True, decay_target="initial")


def ttt_config(name: str, size: str, paper_shapes: dict, *, paper_base_lr: float,
               short_conv: bool = False, **inner_model) -> ml_collections.ConfigDict:
    """:func:`backbone_config` of a TTT backbone (Sun et al. 2024, arXiv:2407.04620).

    The TTT layer as the token mixer of Transformer++ blocks: residual + LayerNorm inner model
    (``inner_model``: memory_depth, memory_expansion, memory_activation) with fast biases (b1, and
    b2 for the MLP: ``memory_bias``) and the LN scale and shift as outer-loop parameters
    (``memory_ln_fast = False``), learned W0 per head, mini-batch 16, reads inside a mini-batch as
    the running mean of its gradients so far (``read_running_mean``: TTT's 1/i), no momentum
    (eta = 0 exactly), TTT's learnable inner learning rate
    ``ttt_base_lr * sigmoid(x w + b) / head_dim`` with ``paper_base_lr`` converted by
    :func:`ttt_engine_lr`, head_dim 64, no q/k normalisation; the paper's output gate off
    (``model.memory.use_output_gate``). ``short_conv``: the causal short convolution of TTT's
    Mamba backbone (kernel 4, here on q, k and v: ``model.memory.use_conv``), which lets the
    memory store "previous tokens -> this token" (both TTT configs ship it, with their
    measurements; configs/ttt_mlp.py also takes TTT-Linear's ``paper_base_lr``).

    One deviation from the paper, for length (:data:`TTT_LENGTH`): the Titans forget gate
    decaying toward W0 (``use_decay``, ``decay_target="initial"``). TTT's layer as published
    (``--config.model.memory.use_decay=False``) never forgets, and trained on single windows it
    reads a held-out book 6.6x worse with its state carried than from reset windows. tiny = the tiny
    Transformer++ shape and run with 4 TTT heads of 64; paper sizes as :func:`backbone_config`.

    Raises:
      ValueError: for an unknown size or memory field.
    """
    chunk = 16
    memory = memory_section(head_dim=64, memory_residual_ln=True, memory_ln_fast=False,
                            memory_bias=True, read_running_mean=True, chunk_size=chunk,
                            gate_style="ttt", ttt_base_lr=ttt_engine_lr(paper_base_lr, chunk),
                            use_momentum=False, use_conv=short_conv,
                            qk_l2_norm=False, use_output_gate=False, **TTT_LENGTH, **inner_model)
    return backbone_config(name, size, paper_shapes, memory)


# The linear-RNN backbones (titans_lm.models.linear_rnn) as memory settings of the one engine:
# a linear memory (d_k = d_v = head_dim) starting from zero, no momentum, one field per rule.
LINEAR_RNN_MEMORY = dict(memory_depth=1, learned_w0=False, use_momentum=False, chunk_size=64,
                         use_conv=True, conv_kernel=4)
LINEAR_RNN_RULES = {
    # Katharopoulos et al. 2020: S_t = S_{t-1} + phi(k_t)^T v_t, y = phi(q) S / (phi(q) z + eps):
    # the dot bias with theta = 1/2 (gradient -2 phi(k)^T v), elu + 1 features, the normaliser
    # column; no short convolution and no output gate (the paper has neither).
    "linear_attention": dict(attentional_bias="dot", gate_style="constant", theta_max=0.5,
                             feature_map="elu1", read_normalizer=True, qk_l2_norm=False,
                             use_decay=False, use_conv=False, use_output_gate=False),
    # DeltaNet (Schlag et al. 2021; Yang et al. 2024): W_t = W_{t-1} + beta_t k_t^T (v_t - k_t
    # W_{t-1}), beta = sigmoid(x w + b) = 2 theta with theta_max 0.5; SiLU + short conv + l2-normed
    # q, k (Yang et al. 2024 sec. 4); output RMSNorm, no output gate (fla's DeltaNet default).
    "deltanet": dict(gradient_at="previous_token", gate_style="titans", theta_max=0.5,
                     qk_l2_norm=True, use_decay=False, use_output_gate=False),
    # Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024): W_t = a_t (I - beta_t k_t^T k_t) W_{t-1} +
    # beta_t k_t^T v_t; a_t = 1 - alpha_t is the Titans forget gate sigmoid(-x w - b) (the paper:
    # a Mamba2-style exp(-A softplus(.))), starting near 1 (alpha_bias_init -6); output RMSNorm
    # and SiLU gate as the paper.
    "gated_deltanet": dict(gradient_at="previous_token", gate_style="titans", theta_max=0.5,
                           qk_l2_norm=True, use_decay=True, alpha_bias_init=-6.0,
                           use_output_gate=True),
}


def linear_rnn_config(name: str, size: str, paper_shapes: dict) -> ml_collections.ConfigDict:
    """:func:`backbone_config` of a linear-RNN backbone: ``name`` in :data:`LINEAR_RNN_RULES`
    ("linear_attention", "deltanet", "gated_deltanet"), the memory :data:`LINEAR_RNN_MEMORY` with
    that rule, heads of 64 (tiny) or 128 (paper sizes, as Yang et al. 2024), chunks of 64, no
    persistent tokens.

    Raises:
      ValueError: for an unknown size or name.
    """
    if name not in LINEAR_RNN_RULES:
        raise ValueError(f"unknown linear-RNN backbone {name!r}; known: {sorted(LINEAR_RNN_RULES)}")
    head_dim = 64 if check_size(size, ("tiny",) + PAPER_SIZES, name) == "tiny" else 128
    memory = memory_section(**{**LINEAR_RNN_MEMORY, **LINEAR_RNN_RULES[name], "head_dim": head_dim})
    return backbone_config(name, size, paper_shapes, memory)
