"""Settings of the NeuralMemory layer, one field per switch, so a backbone config maps onto it 1:1.

A backbone config section holding these keys becomes a layer config with
``MemoryConfig.from_dict(dict(cfg.model.memory), d_model=cfg.model.d_model)``; an unknown key or a
bad value raises ValueError naming it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from titans_lm.memory.biases import BIASES, AttentionalBias, bias_problem, get_bias
from titans_lm.memory.features import FEATURE_MAPS, poly_width
from titans_lm.memory.inner_models import InnerModel, make_inner_model
from titans_lm.memory.newton_schulz import NS_GRADIENTS
from titans_lm.memory.scan import DECAY_TARGETS, GRADIENT_AT, IMPLEMENTATIONS

GATE_STYLES = ("titans", "ttt", "constant")
GATE_GRANULARITIES = ("token", "chunk")
READ_MODES = ("after_write", "chunk_start")
DTYPES = ("float32", "bfloat16", "float64")


def chunk_write_gain(theta: float, eta: float, chunk_size: int) -> float:
    """Worst-case step of one chunk's write along a direction shared by all its unit keys.

    2 theta b sum_{i=1..b} (1 - eta^i) / (1 - eta): b gradients at the chunk start, each carried
    by the momentum into the i-th later state with weight (1 - eta^i) / (1 - eta), 2 from the loss
    without 1/2. b = 1, eta = 0 gives the delta rule's 2 theta ||k||^2 with ||k|| = 1.
    The write is stable while this stays below about 2 (1 + eta^b) (see MemoryConfig).

    Args:
      theta: inner learning rate; eta: momentum decay in [0, 1]; chunk_size: b >= 1.
    """
    b = int(chunk_size)
    if eta >= 1:
        steps = b * (b + 1) / 2
    else:
        steps = sum((1 - eta ** i) / (1 - eta) for i in range(1, b + 1))
    return 2 * theta * b * steps


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """NeuralMemory settings (Titans arXiv:2501.00663 sec. 3; TTT arXiv:2407.04620 sec. 2.7).

    Attributes:
      d_model: model width D (input and output of the layer).
      n_heads: memory heads H; each has its own memory of width head_dim.
      head_dim: d_k = d_v of each head's memory.
      memory_depth: 1 = linear memory, 2..4 = MLP memory (Titans' L_M).
      memory_expansion: MLP hidden width / head_dim.
      memory_activation: "silu" | "gelu" | "gelu_tanh" (MLP memories), or "swiglu" with
        memory_depth 2 and no memory_bias: f(x) = (silu(x W_1) * (x W_3)) W_2, LaCT's fast
        weights (:class:`~titans_lm.memory.inner_models.SwiGLUMemory`; hidden width
        memory_expansion * head_dim).
      memory_bias: biases in the inner model (fast weights too).
      memory_residual_ln: TTT's inner model x + LN(f(x)) (fits LN(f(k)) to v - k).
      memory_ln_fast: with memory_residual_ln, the LN scale and shift are fast weights updated
        by the inner loop (True) or outer-loop parameters that only the outer loss trains
        (False: TTT, ttt-lm-jax's ``ttt_norm``).
      chunk_size: mini-batch size b of the inner gradient descent (TTT: 16). A document that
        starts inside a chunk cuts it (its first mini-batch is the rest of the chunk).
      theta_max: upper bound of the Titans inner learning rate theta = theta_max * sigmoid(.).
        Default 0.0005 with eta_max 0.9: stable for any keys of unit norm at chunk 16
        (:func:`chunk_write_gain`; see "Stable range" below).
      theta_ref_head_dim: the head width theta_max is stated for; 0 (default): theta_max as
        given at any width. D > 0: the bound is theta_max * sqrt(head_dim / D)
        (:attr:`theta_bound`), so a write moves the memory by the same fraction of its initial
        state at any head width: a write's norm is bounded in absolute terms (theta times the
        clipped surprise) while ||W0|| grows as sqrt(head_dim) (7.1 at head_dim 16, 14.0 at 64,
        the Titans preset's init). The LMM's write (theta_max 0.3 at head_dim 64) trains at
        head_dim 16 only at half that bound (docs/results/titans-family-rules.md). Titans and
        constant gates; gate_style "ttt" already divides by head_dim and refuses it.
      gate_style: "titans": theta = theta_max * sigmoid(x w_theta + b_theta);
        "ttt": theta = ttt_base_lr * sigmoid(x w_theta + b_theta) / head_dim (TTT's learnable
        inner learning rate); "constant": theta = theta_max at every token, no theta parameters
        (linear attention: theta_max 0.5 with the dot bias writes P += phi(k)^T v). eta and
        alpha are set by use_momentum / use_decay in every style. Under the l2 bias the delta
        rule's beta is 2 theta (no 1/2 in the loss): DeltaNet's beta = sigmoid(.) is "titans"
        with theta_max 0.5.
      ttt_base_lr: TTT's base learning rate (TTT-Linear 1.0, TTT-MLP 0.1).
      eta_max: bound of the momentum gate, eta = eta_max * sigmoid(x w_eta + b_eta) in
        (0, eta_max); 1 is Titans' eta in (0, 1); default 0.9. Near 1 the momentum stops decaying and the
        effective inner rate theta / (1 - eta) grows without bound; with mini-batch gradients (all
        taken at the chunk-start state) the write then diverges on correlated keys (measured: the
        optimiser drove eta to 0.999 and the tiny MAC's loss to NaN at lr 3e-3), so the Titans
        configs use 0.9 (``titans_lm.config.backbones.TITANS_MEMORY``).
      gate_granularity: "token": gates per token; "chunk": every token of a mini-batch uses the
        gate pre-activations of its first token (the chunk's, or a document start's; causal:
        that token precedes or is the token itself, so no read depends on a later token; a mean
        over the chunk would not be causal).
      use_momentum: False gives eta = 0 exactly (no momentum parameters).
      use_decay: False gives alpha = 0 exactly (no forget-gate parameters).
      theta_bias_init, eta_bias_init, alpha_bias_init: initial biases of the gate
        pre-activations (sigmoid(0) = 0.5, sigmoid(2) = 0.88, sigmoid(-6) = 0.0025).
      use_conv: causal depthwise short convolution on q, k, v (reset at document starts).
      conv_kernel: its width (Titans: 4).
      qk_l2_norm: l2-normalise queries and keys (Titans).
      v_l2_norm: l2-normalise the values too (the memory's targets). The read is RMS-normalised
        before the output gate, so the values' scale never reaches the output, but it sets the
        inner loop's step: the surprise grows with ||v||, and a deep memory (memory_depth >= 2)
        that moves its weights far to fit large targets raises its own curvature (a product of
        its layers' norms), so unnormalised values of norm ~10 made a depth-4 memory diverge
        within its theta / (1 - eta) bound. With unit keys and unit values that bound holds at
        every depth. Off by default (Titans normalises q and k only); on in the Titans configs.
      use_output_gate: y = RMSNorm(reads) * SiLU(x W_g) before the output projection.
      read: "after_write" (read token t after its own write) or "chunk_start".
      read_running_mean: TTT's reads inside a mini-batch: the read at position j of a chunk
        weights the gradients so far by 1 / (j + 1) (their running mean) rather than by the
        per-token theta, which carries 1/b in the TTT configs (``memory_scan(running_mean=True)``;
        ttt-lm-jax ``token_idx``). The state after each chunk is the same either way.
      surprise_max_norm: the in-graph guard against inner-loop divergence, off at 0: each
        token's momentary surprise (the gradient of its inner loss at the chunk-start state, over
        all inner parameters) is clipped to this Frobenius norm before it enters the momentum,
        which is the same as lowering that token's theta. It bounds every write by
        theta_bound * surprise_max_norm / (1 - eta_max) whatever the memory's curvature (which
        grows with memory_depth). Cost: one norm per token from the factors the engine already
        has (``scripts/benchmark.py --variants``). In "chunked" and "reference"; "pallas" (and "auto"
        on GPU/TPU) run "chunked" for it (the kernel does not clip).
      attentional_bias: the inner loss (:mod:`titans_lm.memory.biases`; MIRAS,
        arXiv:2504.13173): "l2" ||f(k) - v||^2 (Titans, TTT, the delta rule), "dot"
        -2 <f(k), v> (Hebbian: linear attention), "lp" ||f(k) - v||_p^p with p = bias_p
        (MIRAS' Moneta) or "huber" (Huber's loss times 2 with threshold huber_delta, per
        coordinate; MIRAS' Yaad). Engines "chunked" and "reference" only.
      bias_p: the exponent p > 1 of the "lp" bias (2 is "l2"; MIRAS' Moneta: 3).
      huber_delta: the threshold delta > 0 of the "huber" bias, one constant per layer (MIRAS'
        Yaad makes it input-dependent; see docs/design.md).
      feature_map: phi on q and k (:mod:`titans_lm.memory.features`): "silu" (the layer's
        SiLU), "elu1" (elu + 1 in place of the SiLU; Katharopoulos et al. 2020) or "poly" (Atlas'
        polynomial features of degree 1..feature_degree after the SiLU and the l2 norm; the
        memory's key width becomes :attr:`key_width`).
      feature_degree: the degree p >= 1 of the "poly" feature map (1: the identity).
      read_normalizer: linear attention's normaliser: the values get a ones column, so the
        memory (W [d_k, d_v + 1]) carries z = sum_s theta_s-weighted phi(k_s) as its last column,
        and the read is y = (phi(q) W)[:d_v] / ((phi(q) W)[d_v] + norm_eps). Needs a positive
        z: the dot bias, feature_map "elu1", a zero untrained W0 (learned_w0 False) and a linear
        memory without bias.
      learned_w0: the memory starts (and restarts at every document) from a learned W0 per head
        (True; Titans, TTT) or from zero with no W0 parameter (False; linear attention, DeltaNet).
      gradient_at: "chunk_start": every gradient of a chunk at the chunk-start state (mini-batch
        gradient descent, TTT's b = chunk_size; Titans); "previous_token": each token's gradient
        at the state just before its own write, after its decay (online gradient descent in
        Gated DeltaNet's order, computed exactly chunk by chunk in WY form:
        :mod:`titans_lm.memory.delta`). "previous_token" needs memory_depth 1 without bias or
        residual LN, the l2 bias, no momentum, no running mean, no surprise clip.
      decay_target: where the forget gate alpha pulls the state: "zero" (Titans eq. 14,
        P_t = (1 - alpha_t) P_{t-1} + S_t) or "initial", the state every document starts from
        (W0, or what the persistent tokens leave): P_t = (1 - alpha_t) P_{t-1} + alpha_t P_init
        + S_t. With "zero" a state carried past the training window decays to one training
        never saw (W0 fades, the reads go to 0); with "initial" it stays within the writes of
        the last ~1/alpha tokens of P_init (docs/design.md#retention-toward-the-initial-state).
        Same as "zero" without learned_w0 and persistent tokens. Needs gradient_at
        "chunk_start"; impl "pallas" (and "auto" on GPU/TPU) then runs "chunked" (the kernel
        decays toward zero).
      ns_steps: Newton-Schulz steps on the momentum, Atlas' Muon rule (arXiv:2505.23735;
        docs/design.md#newton-schulz-momentum), off at 0. With k > 0 the momentum accumulates
        the raw gradients and theta moves outside the map: S_t = eta_t S_{t-1} - G_t,
        P_t = (1 - alpha_t) P_{t-1} + theta_t NS_k(S_t) for every weight matrix (NS_k: Muon's
        quintic iteration, k = 5 in Atlas; it is scale invariant, so a theta inside S would
        cancel), theta_t S_t for vector parameters (biases, LN scale and shift), which have no
        orthogonalisation. Each write then has unit-scale singular values times theta, whatever
        the gradient's size: theta_max bounds the step directly (the stable-range arithmetic
        below assumes ns_steps 0). Composes with surprise_max_norm (the clip acts on G_t, so
        it only changes the mix inside the momentum) and both decay targets. Needs gradient_at
        "chunk_start" and read_running_mean False; impl "pallas" (and "auto" on GPU/TPU) then
        runs "chunked", which materialises each chunk's per-token states
        (O(chunk_size d_in d_out) memory per weight matrix, row and head).
      ns_gradient: NS_k's backward: "exact" (differentiate through the iterations) or
        "straight_through" (the identity, as atlas-jax does).
      fast_weight_norm: LaCT's weight normalisation (Zhang et al. 2025, arXiv:2505.23884), its
        replacement for a forget gate: at every mini-batch end each fast-weight matrix is
        rescaled column by column (per output unit, over the input dim) to the norms of the
        state the document started from (:mod:`titans_lm.memory.weight_norm`;
        docs/design.md#lact-large-chunks). Needs gradient_at "chunk_start" and learned_w0
        (a zero W0 has no norms to keep); impl "pallas" (and "auto" on GPU/TPU) then runs
        "chunked".
      omega_window: c >= 1, Atlas' Omega rule (Behrouz et al. 2025, arXiv:2505.23735, sec. 3;
        docs/design.md#the-omega-rule) for c > 1: each token writes the gates-weighted sum of
        the gradients of its last c tokens (of its document; all at the state today's gradient
        is taken at), u_t = sum_{j=t-c+1..t} gamma_j grad l(k_j, v_j), instead of its own
        gradient alone. gamma_j = sigmoid(x_j W_gamma + b_gamma) per token and head depends on
        the token j only (Atlas' gamma_i^(t) may also depend on t; here the window is a banded
        matrix). The window reaches across chunks and calls (the carried state keeps the c - 1
        tokens before the chunk start), never into an earlier document. 1 (default): the plain
        rule, no gamma parameters. Needs gradient_at "chunk_start"; impl "pallas" and "auto" run
        "chunked" for it; MAC's segment loop does not take it. Cost: c - 1 more gradient rows
        per chunk.
      omega_gamma_bias_init: initial bias of the gamma gate (2.0: sigmoid ~ 0.88, windows start
        mostly on).
      omega_normalize: with omega_window > 1, write the gates-weighted mean of the window's
        gradients, u_t / sum_j gamma_j, instead of their sum (not in Atlas; False: as Atlas
        writes). The sum makes a write up to sum_j gamma_j (~0.88 c at init) times a c = 1
        write, so a step bound chosen at c = 1 (theta_max, surprise_max_norm) no longer holds;
        the mean keeps it at any c (docs/design.md#the-omega-rule).
      impl: engine implementation ("chunked", "reference", "pallas", "auto", or a registered
        one). Under a data/fsdp/tensor mesh "pallas" runs per shard (batch rows over data x fsdp,
        heads over tensor; ``titans_lm.memory.sharded``); n_heads should be a multiple of
        mesh.tensor, or the heads run whole on each tensor device (a warning says so).
      chunks_per_checkpoint: chunks per rematerialisation group of the chunked engine: the
        backward pass stores the state once per group and recomputes the chunks' internals. 0:
        no rematerialisation (every chunk's internals kept for the backward, no recompute; on
        CPU that measured slower, with 1.5-1.6x the train step's temporaries). Other engines
        ignore it.
      dtype: compute dtype of the projections ("float32" | "bfloat16" | "float64"); the inner
        loop always runs in float32 or wider.
      param_dtype: parameter dtype.
      norm_eps: epsilon of the output RMSNorm and of the l2 normalisation.

    Stable range (the defaults satisfy it; the Titans configs use the defaults). With the loss
    ||f(k) - v||^2 a linear write of one token moves the error along k by the factor
    1 - 2 theta ||k||^2: the delta rule is stable for theta ||k||^2 < 1 (theta < 1 with unit keys).
    Momentum sums the steps: the effective rate is theta / (1 - eta). Within a chunk of b tokens
    all gradients are taken at the chunk-start state, so b keys along one direction (cosine 1, the
    worst case; text reaches 0.96) move it by :func:`chunk_write_gain` =
    2 theta b sum_{i<=b} (1 - eta^i) / (1 - eta), which must stay below about 2 (1 + eta^b). At
    theta_max 0.0005, eta_max 0.9, b = 16 the gain is 1.4 < 2.4; the former defaults
    (theta_max 0.1, eta_max 1.0) give about 130 at init (theta 0.05, eta 0.88) and the layer's
    output overflowed to inf on a window of near-identical tokens (measured).
    """

    d_model: int
    n_heads: int = 4
    head_dim: int = 32
    memory_depth: int = 2
    memory_expansion: float = 4.0
    memory_activation: str = "silu"
    memory_bias: bool = False
    memory_residual_ln: bool = False
    memory_ln_fast: bool = True
    chunk_size: int = 16
    theta_max: float = 0.0005
    theta_ref_head_dim: int = 0
    gate_style: str = "titans"
    ttt_base_lr: float = 1.0
    eta_max: float = 0.9
    gate_granularity: str = "token"
    use_momentum: bool = True
    use_decay: bool = True
    theta_bias_init: float = 0.0
    eta_bias_init: float = 2.0
    alpha_bias_init: float = -6.0
    use_conv: bool = True
    conv_kernel: int = 4
    qk_l2_norm: bool = True
    v_l2_norm: bool = False
    use_output_gate: bool = True
    read: str = "after_write"
    read_running_mean: bool = False
    surprise_max_norm: float = 0.0
    attentional_bias: str = "l2"
    bias_p: float = 3.0
    huber_delta: float = 1.0
    feature_map: str = "silu"
    feature_degree: int = 2
    read_normalizer: bool = False
    learned_w0: bool = True
    gradient_at: str = "chunk_start"
    decay_target: str = "zero"
    ns_steps: int = 0
    ns_gradient: str = "exact"
    fast_weight_norm: bool = False
    omega_window: int = 1
    omega_gamma_bias_init: float = 2.0
    omega_normalize: bool = False
    impl: str = "chunked"
    chunks_per_checkpoint: int = 1
    dtype: str = "float32"
    param_dtype: str = "float32"
    norm_eps: float = 1e-6

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first field with a bad value."""
        def need(ok, field, msg):
            if not ok:
                raise ValueError(f"MemoryConfig.{field}: {msg}, got {getattr(self, field)!r}")

        for f in ("d_model", "n_heads", "head_dim", "chunk_size", "conv_kernel"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, f, "must be a positive int")
        need(isinstance(self.chunks_per_checkpoint, int) and self.chunks_per_checkpoint >= 0,
             "chunks_per_checkpoint", "must be an int >= 0 (0: no rematerialisation)")
        need(1 <= self.memory_depth <= 4, "memory_depth", "must be in 1..4 (1 = linear)")
        need(self.memory_expansion > 0, "memory_expansion", "must be positive")
        need(self.memory_activation in ("silu", "gelu", "gelu_tanh", "swiglu"), "memory_activation",
             "must be 'silu', 'gelu', 'gelu_tanh' or 'swiglu'")
        need(self.memory_activation != "swiglu" or (self.memory_depth == 2 and not self.memory_bias),
             "memory_activation", "'swiglu' (three matrices, no biases) needs memory_depth 2 and "
             "memory_bias False")
        need(self.theta_max > 0, "theta_max", "must be positive")
        need(isinstance(self.theta_ref_head_dim, int) and not isinstance(self.theta_ref_head_dim, bool)
             and self.theta_ref_head_dim >= 0, "theta_ref_head_dim",
             "must be an int >= 0 (0: theta_max at any head width)")
        need(self.theta_ref_head_dim == 0 or self.gate_style != "ttt", "theta_ref_head_dim",
             "> 0 scales theta_max, which gate_style 'ttt' does not use (its rate is "
             "ttt_base_lr / head_dim); set it to 0")
        need(self.ttt_base_lr > 0, "ttt_base_lr", "must be positive")
        need(0 < self.eta_max <= 1, "eta_max", "must be in (0, 1]")
        need(self.gate_style in GATE_STYLES, "gate_style", f"must be one of {GATE_STYLES}")
        need(self.gate_granularity in GATE_GRANULARITIES, "gate_granularity",
             f"must be one of {GATE_GRANULARITIES}")
        need(self.read in READ_MODES, "read", f"must be one of {READ_MODES}")
        need(self.impl in IMPLEMENTATIONS, "impl", f"must be one of {sorted(IMPLEMENTATIONS)}")
        need(self.surprise_max_norm >= 0, "surprise_max_norm", "must be >= 0 (0: off)")
        need(self.attentional_bias in BIASES, "attentional_bias", f"must be one of {sorted(BIASES)}")
        need(isinstance(self.bias_p, (int, float)) and self.bias_p > 1, "bias_p",
             "must be a number > 1 (the l_p bias's exponent)")
        need(isinstance(self.huber_delta, (int, float)) and self.huber_delta > 0, "huber_delta",
             "must be a number > 0 (the Huber bias's threshold)")
        need(bias_problem(self.attentional_bias, self.bias_p, self.huber_delta) is None,
             "attentional_bias", str(bias_problem(self.attentional_bias, self.bias_p,
                                                  self.huber_delta)))
        need(self.feature_map in FEATURE_MAPS, "feature_map", f"must be one of {sorted(FEATURE_MAPS)}")
        need(isinstance(self.feature_degree, int) and not isinstance(self.feature_degree, bool)
             and self.feature_degree >= 1, "feature_degree", "must be an integer >= 1")
        need(self.feature_map != "poly" or not self.memory_residual_ln, "feature_map",
             "'poly' widens the keys, and memory_residual_ln needs keys as wide as the values; "
             "turn one of them off")
        need(self.gradient_at in GRADIENT_AT, "gradient_at", f"must be one of {GRADIENT_AT}")
        need(self.decay_target in DECAY_TARGETS, "decay_target", f"must be one of {DECAY_TARGETS}")
        need(self.decay_target == "zero" or self.gradient_at == "chunk_start", "decay_target",
             "'initial' needs gradient_at 'chunk_start' (the delta rule's WY form decays toward "
             "zero); use decay_target 'zero' or gradient_at 'chunk_start'")
        need(isinstance(self.ns_steps, int) and not isinstance(self.ns_steps, bool)
             and self.ns_steps >= 0, "ns_steps", "must be an int >= 0 (0: off; Atlas uses 5)")
        need(self.ns_gradient in NS_GRADIENTS, "ns_gradient", f"must be one of {NS_GRADIENTS}")
        if self.ns_steps:
            bad = [what for what, on in (("gradient_at 'chunk_start'",
                                          self.gradient_at != "chunk_start"),
                                         ("read_running_mean False", self.read_running_mean),
                                         ("fast_weight_norm False", self.fast_weight_norm)) if on]
            need(not bad, "ns_steps", f"> 0 (Newton-Schulz momentum) needs {', '.join(bad)}; set "
                                      f"ns_steps 0 or change those")
        need(isinstance(self.omega_window, int) and not isinstance(self.omega_window, bool)
             and self.omega_window >= 1, "omega_window", "must be an int >= 1 (1: off)")
        need(self.omega_window == 1 or self.gradient_at == "chunk_start", "omega_window",
             "> 1 (the Omega rule) needs gradient_at 'chunk_start'; use omega_window 1 or "
             "gradient_at 'chunk_start'")
        need(isinstance(self.omega_gamma_bias_init, (int, float)), "omega_gamma_bias_init",
             "must be a number")
        need(isinstance(self.omega_normalize, bool), "omega_normalize", "must be True or False")
        need(not self.omega_normalize or self.omega_window > 1, "omega_normalize",
             "normalises the Omega window's sum: it needs omega_window > 1; set omega_normalize "
             "False or omega_window > 1")
        for field, default in (("attentional_bias", "l2"), ("gradient_at", "chunk_start")):
            need(getattr(self, field) == default or self.impl in ("chunked", "reference"), field,
                 f"other than {default!r} is supported by impl 'chunked' and 'reference' only "
                 f"(impl is {self.impl!r}); set it to {default!r} or change impl")
        linear = self.memory_depth == 1 and not self.memory_bias and not self.memory_residual_ln
        if self.gradient_at == "previous_token":
            bad = [what for what, on in (
                ("memory_depth 1 without memory_bias or memory_residual_ln", not linear),
                ("attentional_bias 'l2'", self.attentional_bias != "l2"),
                ("use_momentum False", self.use_momentum),
                ("read_running_mean False", self.read_running_mean),
                ("surprise_max_norm 0", self.surprise_max_norm > 0)) if on]
            need(not bad, "gradient_at", f"'previous_token' (the delta rule) needs {', '.join(bad)}")
        if self.read_normalizer:
            bad = [what for what, on in (
                ("attentional_bias 'dot' (under 'l2' the normaliser column can turn negative)",
                 self.attentional_bias != "dot"),
                ("feature_map 'elu1' (positive features)", self.feature_map != "elu1"),
                ("learned_w0 False (the normaliser starts at zero)", self.learned_w0),
                ("memory_depth 1 without memory_bias or memory_residual_ln", not linear)) if on]
            need(not bad, "read_normalizer", f"True needs {'; '.join(bad)}")
        need(isinstance(self.fast_weight_norm, bool), "fast_weight_norm", "must be True or False")
        if self.fast_weight_norm:
            bad = [what for what, on in (
                ("gradient_at 'chunk_start'", self.gradient_at != "chunk_start"),
                ("learned_w0 True (a zero W0 has no norms to keep)", not self.learned_w0)) if on]
            need(not bad, "fast_weight_norm", f"True needs {', '.join(bad)}")
        need(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}")
        need(self.param_dtype in DTYPES, "param_dtype", f"must be one of {DTYPES}")
        need(self.norm_eps > 0, "norm_eps", "must be positive")

    @property
    def theta_bound(self) -> float:
        """The bound of theta the gates use: theta_max, times sqrt(head_dim / theta_ref_head_dim)
        where theta_ref_head_dim > 0."""
        if self.theta_ref_head_dim:
            return self.theta_max * math.sqrt(self.head_dim / self.theta_ref_head_dim)
        return self.theta_max

    def write_gain(self) -> float:
        """:func:`chunk_write_gain` at the gates' upper bounds (Titans gates; unit keys)."""
        eta = self.eta_max if self.use_momentum else 0.0
        return chunk_write_gain(self.theta_bound, eta, self.chunk_size)

    def bias(self) -> AttentionalBias:
        """The attentional bias with its parameters (``titans_lm.memory.biases.get_bias``)."""
        return get_bias(self.attentional_bias, p=self.bias_p, delta=self.huber_delta)

    @property
    def key_width(self) -> int:
        """d_k of each head's memory (the inner model's d_in): head_dim, or the polynomial
        features' width C(head_dim + p, p) - 1 with feature_map "poly"."""
        if self.feature_map == "poly":
            return poly_width(self.head_dim, self.feature_degree)
        return self.head_dim

    @property
    def memory_width(self) -> int:
        """d_v of each head's memory: head_dim, plus the normaliser column with read_normalizer."""
        return self.head_dim + (1 if self.read_normalizer else 0)

    def inner_model(self) -> InnerModel:
        """The per-head inner model these settings describe."""
        # polynomial keys widen only the first matrix: the hidden width follows the values
        hidden = (max(1, round(self.memory_expansion * self.head_dim))
                  if self.feature_map == "poly" and self.memory_depth > 1 else 0)
        return make_inner_model(self.memory_depth, expansion=self.memory_expansion,
                                activation=self.memory_activation, bias=self.memory_bias,
                                residual_ln=self.memory_residual_ln,
                                fast_ln=self.memory_ln_fast, hidden=hidden)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides: Any) -> "MemoryConfig":
        """Build from a mapping (e.g. an ml_collections section) plus keyword overrides.

        Raises:
          ValueError: for keys that are not fields (listing them) or bad values.
        """
        merged = {**dict(values), **overrides}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(merged) - names)
        if unknown:
            raise ValueError(f"unknown MemoryConfig field(s) {unknown}; known: {sorted(names)}")
        return cls(**merged)
