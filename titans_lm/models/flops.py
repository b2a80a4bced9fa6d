"""Analytic matmul FLOP counts of every backbone's forward pass, for MFU.

One multiply-add is 2 FLOPs. Only matrix products are counted (``dot_general``: projections,
attention scores and values, the SwiGLU MLP, the LM head and the memory's dual form); norms,
softmax, RoPE, activations, the short convolution and gate non-linearities are elementwise and
left out (each a few FLOPs per element against hundreds per element for the matmuls). The train
step's model FLOPs are taken as 3x the forward (the backward of a matmul is two matmuls of the
same size: the convention of PaLM's MFU, Chowdhery et al. 2022 appendix B; recomputation by remat
is not counted).

Two counts per sequence of T tokens (:class:`FlopCount`):

- ``model``: the work the architecture needs: causal attention counts the keys each query may see
  (for full causal attention (T + 1) / 2 on average; min(t + 1, window) with a sliding window),
  and the memory counts only real tokens.
- ``executed``: what this implementation computes: attention is a dense masked [T, S] product
  (``jax.nn.dot_product_attention``'s XLA path on CPU), or, for a sliding window W with T a
  multiple of W and T >= 2W, bands of W queries over [persistent || 2W] keys (:func:`banded`), the memory pads the sequence to whole
  chunks, MAC computes the W0 retrieval of every token and the attention over
  [persistent || retrieved || segment] densely. ``tests/models/test_flops.py`` checks this count
  exactly against the ``dot_general`` FLOPs of the traced forward (:func:`jaxpr_matmul_flops`)
  for backbones without persistent tokens; the persistent pass of ``LanguageModel.init_state``
  (which also keeps its end state) and MAC's carried segment loop add bookkeeping matmuls that
  the count leaves out (a few percent at the tiny sizes; checked to 5%).

Per component (``FlopCount.parts``): ``attention_proj`` (W_Q, W_K, W_V, W_O), ``attention_core``
(q k^T and p v), ``mlp`` (SwiGLU: 3 matrices, 6 D d_ff per token), ``memory_proj`` (the memory's
W_Q, W_K, W_V, gate rows theta/eta/alpha/gamma [D, H] (none for a constant theta), output gate
W_g and W_O), ``memory_dual`` (the inner loop, below: the dual form, the materialised
Newton-Schulz states, or the delta rule's WY form), ``memory_read`` (MAC's retrievals f(q; P)
without a write), ``combine`` (the MAG/MAC gate's W_O [D, D]) and ``head`` (2 D V per scored
token).

The dual form per head and chunk of b tokens (``titans_lm.memory.chunked``), for each weight
matrix W [d_in, d_out] of the inner model (a depth-2 MLP of width d and hidden h has
[d, h] and [h, d]):

- gradient factors at the chunk-start state P0: the forward u @ W (2 b d_in d_out) and, for every
  matrix after the first, the backward of its input d @ W^T (2 b d_in d_out);
- the read after each token's write (read="after_write"): r @ P0 and r @ S0 (4 b d_in d_out),
  r @ u^T (2 b^2 d_in) and (C * r u^T) @ d (2 b^2 d_out); read="chunk_start": r @ P0 only;
- the chunk-end parameters and momentum: u^T (C_b * d) and u^T (M_b * d) (4 b d_in d_out);

for each vector parameter of width d (the LayerNorm scale and shift of TTT's inner model, biases):
C @ signals in the read (2 b^2 d) and two [b] @ [b, d] rows for the chunk end (4 b d); and the
gate coefficients (``titans_lm.memory.coefficients``): from alpha, two segment-product prefix
sums (tri @ log g, tri @ zeros: 8 b^2), A = D @ E0 (2 b^2) and C = D @ E (2 b^3); from the
log form log(1 - alpha) that the layer passes, 6 b^2 + 4 b^3 in all; plus the reset-target row
R = D (keep * reset) (2 b^2) where the resets are not known before tracing (the layer's). A chunk
in which a document starts inside it costs more (another gradient pass at the reset target and
one more read matmul per weight: docs/design.md#resets-inside-a-chunk); not counted here.
Without momentum (eta = None to the engine) E is the identity: no E, A or C = D @ E; without
decay (alpha = None) D is the document mask and R = 1 - B: no D or R product. Without both (LaCT,
TTT) the coefficients are the gates themselves, masked: no matmul, in both counts.

So per token and head the dual form costs about 10 sum(d_in d_out) + 2 b (sum d_in + d_out) +
2 b^2: linear in d_in d_out like a projection, plus terms that grow with the chunk size (at b =
1024 and head_dim 64 the coefficient matmul D @ E dominates). Under the dot attentional bias
(linear attention) the gradient -2 v ignores the memory's output, so the last matrix's forward
product is dead code and not counted. The widths are the memory's: d_in the key width, d_out the
value width (head_dim + 1 with linear attention's normaliser column).

The Omega rule (``omega_window`` c > 1, ``titans_lm.memory.omega``) takes the gradient factors
over the chunk's extended set of w = b + c - 1 tokens [c - 1 before it || its b], so the terms
that run over the written tokens widen from b to w: the factors (2 w d_in d_out per product), the
read's r @ u^T and (C * r u^T) @ d (2 b w (d_in + d_out)), the chunk end (4 w d_in d_out), per
vector C @ signals (2 b w d) and the end rows (4 w d); the coefficient rows become C @ Wmask
(the read's C: 2 b^2 w, after-write reads only; the end rows of C and M: 4 b w), and the gate
gamma is one more [D, H] row of the projections. The banded mask, the gamma weighting and the
tail carried across chunks (k, v, gamma of the c - 1 tokens before it; zeros for a fresh stream,
counted like real ones) are elementwise or gathers: no matmul.

Newton-Schulz momentum (``ns_steps`` k > 0, ``titans_lm.memory.newton_schulz``) materialises
every token's state instead of the dual form; per weight matrix, with the same factors (w rows;
w = b without the Omega rule): S_t = E0_t S0 - sum_s M[t, s] u_s^T d_s, one three-operand
einsum, 2 b w d_in d_out after the cheapest product without a contraction (opt_einsum's path:
2 w min(b d_in, b d_out, d_in d_out)); NS_k of each of the b matrices, on X [p, r] with p =
min(d_in, d_out), r = max, k times X X^T, A @ A and (b A + c A^2) @ X (4 p^2 r + 2 p^3 a step);
P_t = B_t P0 + sum_s C[t, s] NS_k(S_s) (2 b^2 d_in d_out); the read through each token's P_t
(through P0 for chunk-start reads: 2 b d_in d_out either way); no chunk-end product (the state
is the last token's). Per vector: M @ d (2 b w d) and C @ S (2 b^2 d). The coefficients: the
momentum's E and the parameters' D, E and C of two ``chunk_coefficients`` calls, 8 b^2 + 4 b^3
from log(1 - alpha), plus R as above (the calls' other products are dead code, removed). With
the Omega rule only the momentum's rows widen, M @ Wmask (2 b^2 w). So per token and head about
k (4 p^2 r + 2 p^3) + 2 (b + w) d_in d_out per matrix: the NS steps dominate.

The delta rule (``gradient_at="previous_token"``: DeltaNet, Gated DeltaNet) runs the WY form
instead (``titans_lm.memory.delta``, :func:`delta_chunk_flops`); per head and chunk of b tokens,
W [d_k, d_v]: the keys and queries at the chunk-start state, k W and q W (4 b d_k d_v); k k^T
(2 b^2 d_k); the inverse (I + A)^{-1} by recursive block inversion, 2 n (n^2 - 1) / 3 for b padded
to the power of two n (the cost of inverting a triangular matrix, b^3 / 3 multiply-adds); the
pseudo-values U = (I + A)^{-1} rhs (2 b^2 d_v); the read after the write, q k^T and (D * q k^T) U
(2 b^2 (d_k + d_v)); the chunk-end state k^T (D_e * U) (2 b d_k d_v). About 6 d_k d_v + 4 b (d_k +
d_v) + 2 b^2 / 3 per token and head. Executed, k and q are also multiplied by the reset target
(a document start inside the chunk selects it per token): 4 b d_k d_v more, not in the model
count. The short convolution, the l2 norms of q and k, the gates' non-linearities and the decay
ratios are elementwise and left out, as above.
"""

from __future__ import annotations

import warnings
import dataclasses
import math
from collections import defaultdict

import jax
import numpy as np

from titans_lm.memory.config import MemoryConfig
from titans_lm.models.memory_mixer import memory_config, memory_layer_indices

LINEAR_RNNS = ("linear_attention", "deltanet", "gated_deltanet")   # the LMM's stack, another rule
PARTS = ("attention_proj", "attention_core", "mlp", "memory_proj", "memory_dual", "memory_read",
         "combine", "head")


@dataclasses.dataclass
class FlopCount:
    """Forward matmul FLOPs of one sequence, per component, in two counts (module docstring).

    Attributes:
      tokens: T, the scored tokens of the sequence.
      model: {part: FLOPs} the architecture's count. executed: {part: FLOPs} this implementation's.
    """

    tokens: int
    model: dict
    executed: dict

    @property
    def model_total(self) -> float:
        return float(sum(self.model.values()))

    @property
    def executed_total(self) -> float:
        return float(sum(self.executed.values()))

    def per_token(self) -> dict:
        """Forward and train-step (3x) FLOPs per token, both counts, and the parts (model count)."""
        T = self.tokens
        return {"fwd_model": self.model_total / T, "fwd_executed": self.executed_total / T,
                "train_model": 3 * self.model_total / T, "train_executed": 3 * self.executed_total / T,
                "parts_model": {k: v / T for k, v in self.model.items() if v},
                "parts_executed": {k: v / T for k, v in self.executed.items() if v}}


class _Acc:
    def __init__(self):
        self.model, self.executed = defaultdict(float), defaultdict(float)

    def add(self, part, model, executed=None):
        self.model[part] += float(model)
        self.executed[part] += float(model if executed is None else executed)


def _mean_visible(n: int, window: int | None) -> float:
    """Mean over positions t < n of min(t + 1, window): keys a causal query sees."""
    w = window or n
    t = np.arange(n)
    return float(np.minimum(t + 1, w).mean()) if n else 0.0


def _inner_shapes(mcfg: MemoryConfig):
    """(matrix shapes, widths of the vectors the inner loop updates): outer-loop vectors (TTT's
    LayerNorm scale and shift, ``InnerModel.outer_params``) are read at their initial value and
    never written, so the dual form spends no matmul on them."""
    model = mcfg.inner_model()
    shapes = model.param_shapes(mcfg.key_width, mcfg.memory_width)
    outer = model.outer_params()
    return ([s for s in shapes if len(s) == 2],
            [s[0] for i, s in enumerate(shapes) if len(s) == 1 and i not in outer])


def _coefficient_flops(b: int, *, log_keep: bool, reset_row: bool, newton_schulz: bool,
                       momentum: bool = True, decay: bool = True) -> float:
    """The gate coefficients of one chunk (``titans_lm.memory.coefficients``; module docstring).

    The dual form: D (from log(1 - alpha): 2 b^3; from alpha: 4 b^2), E (4 b^2), A = D @ E0
    (2 b^2), C = D @ E (2 b^3), and R = D (keep * reset) (2 b^2) where ``reset_row``. Newton-Schulz
    momentum (``ns_chunk_coefficients``) keeps the momentum's E and D (and R) of the parameters'
    call, whose C = D theta has no product (no momentum there). Without momentum (E the identity)
    E, A and C's product are gone; without decay (D the document mask, R = 1 - B) D and R are
    gone, and with momentum A and C are running sums of E (no matmul): no momentum and no decay
    (LaCT, TTT) cost no matmul at all."""
    f = 0.0
    if decay:
        f += (2 * b ** 3 if log_keep else 4 * b * b) + (2 * b * b if reset_row else 0)
    if momentum:
        f += 4 * b * b
        if decay and not newton_schulz:
            f += 2 * b * b + 2 * b ** 3
    return f


def _outer_sum_flops(b: int, w: int, di: int, do: int) -> float:
    """S_t = sum_s M[t, s] u_s^T d_s for b rows t and w tokens s (``jnp.einsum("ts,si,sj->tij")``):
    the contraction over s (2 b w d_in d_out) after the cheapest of the three pairwise products
    without a contraction (M u, M d or u d: opt_einsum's path),
    2 w min(b d_in, b d_out, d_in d_out)."""
    return 2 * b * w * di * do + 2 * w * min(b * di, b * do, di * do)


def newton_schulz_flops(m: int, n: int, steps: int) -> float:
    """NS_k of one [m, n] matrix (``titans_lm.memory.newton_schulz.newton_schulz``), on X [p, r]
    with p = min(m, n), r = max(m, n): per step A = X X^T (2 p^2 r), A @ A (2 p^3) and
    (b A + c A^2) @ X (2 p^2 r)."""
    p, r = min(m, n), max(m, n)
    return steps * (4 * p * p * r + 2 * p ** 3)


def memory_chunk_flops(mcfg: MemoryConfig, b: int | None = None, read: str | None = None,
                       log_keep: bool = True, traced_resets: bool = True,
                       executed: bool = True) -> float:
    """Matmul FLOPs of one head's chunk of b tokens (module docstring): the dual form, or with
    ``ns_steps`` k > 0 the materialised Newton-Schulz states; ``omega_window`` c > 1 widens the
    writes to the chunk's b + c - 1 extended tokens.

    ``log_keep``: the forget gate reaches the engine as log(1 - alpha), as the NeuralMemory layer
    passes it (the dual form's coefficients cost 6 b^2 + 4 b^3 against 10 b^2 + 2 b^3 from alpha).
    ``traced_resets``: the document starts are traced (the layer's), so the coefficients include
    the reset-target row R (2 b^2). Decaying toward the initial state (``decay_target``), R is
    1 - B (no matmul) and every after-write read of the dual form adds R_i (r R0) through each
    matrix. Products whose results go unused are not counted (XLA removes them; compare with
    :func:`traced_forward_flops`, which removes them too).

    ``executed``: False gives the model count (the dual form's count is the same for both; the
    gate coefficients of a memory without momentum or decay are counted as the engine forms them:
    without both, as LaCT and TTT, C[i, s] = theta_s for s <= i, a masked row of the gates, no
    matmul).

    Returns:
      FLOPs (float).
    """
    b = b or mcfg.chunk_size
    read = read or mcfg.read
    mats, vecs = _inner_shapes(mcfg)
    to_target = mcfg.decay_target == "initial"
    ns, c = mcfg.ns_steps, mcfg.omega_window
    w = b + c - 1                                         # the extended token set (Omega rule)
    f = 0.0
    for i, (di, do) in enumerate(mats):
        f += 2 * w * di * do * (1 if i == 0 else 2)      # factors: forward, backward of the input
        if mcfg.attentional_bias == "dot" and i == len(mats) - 1:
            f -= 2 * w * di * do                          # dl/dy = -2 v: the output y is dead
        if ns:
            f += _outer_sum_flops(b, w, di, do)           # S_t = E0_t S0 - sum_s M[t, s] G_s
            f += b * newton_schulz_flops(di, do, ns)      # NS_k(S_t) for every token
            f += 2 * b * b * di * do                      # P_t = ... + sum_s C[t, s] NS_k(S_s)
            f += 2 * b * di * do                          # the read through P_t (or P0)
            continue
        if read == "after_write":
            f += (6 if to_target else 4) * b * di * do + 2 * b * w * (di + do)
        else:
            f += 2 * b * di * do
        f += 4 * w * di * do                              # chunk-end P and S
    for d in vecs:
        if ns:
            f += 2 * b * w * d + 2 * b * b * d            # S_t = ... - M @ d, P_t = ... + C @ S
        else:
            f += (2 * b * w * d if read == "after_write" else 0) + 4 * w * d
    f += _coefficient_flops(b, log_keep=log_keep, newton_schulz=bool(ns),
                            reset_row=traced_resets and not to_target,
                            momentum=mcfg.use_momentum, decay=mcfg.use_decay)
    if c > 1:                                             # rows C @ Wmask over the extended set
        if ns:
            f += 2 * b * b * w                            # M (the momentum's rows)
        else:
            f += (2 * b * b * w if read == "after_write" else 0) + 4 * b * w   # C; end rows C, M
    return f


def delta_chunk_flops(mcfg: MemoryConfig, b: int | None = None, read: str | None = None,
                      executed: bool = True) -> float:
    """Matmul FLOPs of one head's chunk of b tokens of the delta rule in WY form
    (``titans_lm.memory.delta.delta_chunk`` and the chunk-end state; module docstring).

    ``executed``: also the products of k and q with the reset target (computed for every chunk,
    selected per token where a document starts inside it); False gives the model count."""
    b = b or mcfg.chunk_size
    read = read or mcfg.read
    dk, dv = mcfg.key_width, mcfg.memory_width
    n = 1 << max(0, (b - 1).bit_length())                 # the inverse pads b to a power of two
    f = (2 if executed else 1) * 2 * (2 * b * dk * dv)    # k W, q W (and k R0, q R0)
    f += 2 * b * b * dk                                   # k k^T
    f += 2 * (n if executed else b) * ((n if executed else b) ** 2 - 1) / 3   # (I + A)^{-1}
    f += 2 * b * b * dv                                   # U = (I + A)^{-1} rhs
    if read == "after_write":
        f += 2 * b * b * (dk + dv)                        # q k^T, (D * q k^T) U
    f += 2 * b * dk * dv                                  # W_end = k^T (D_e * U)
    return f


def memory_plain_read_flops(mcfg: MemoryConfig) -> float:
    """f(q; P) of one head and token without a write: 2 sum(d_in d_out)."""
    mats, _ = _inner_shapes(mcfg)
    return float(sum(2 * di * do for di, do in mats))


def _memory_scan(acc: _Acc, mcfg: MemoryConfig, n_tokens: int) -> None:
    """The inner loop over n_tokens (one scan call; padded to whole chunks when executed)."""
    b = mcfg.chunk_size
    if mcfg.gradient_at == "previous_token":
        model = delta_chunk_flops(mcfg, executed=False) * mcfg.n_heads
        executed = delta_chunk_flops(mcfg) * mcfg.n_heads
    else:
        model = memory_chunk_flops(mcfg, executed=False) * mcfg.n_heads
        executed = memory_chunk_flops(mcfg) * mcfg.n_heads
    n_exec = math.ceil(n_tokens / b) * b
    acc.add("memory_dual", model * n_tokens / b, executed * n_exec / b)


def _memory_project(acc: _Acc, mcfg: MemoryConfig, n: int, *, only_q: bool = False) -> None:
    D, HK = mcfg.d_model, mcfg.n_heads * mcfg.head_dim
    if only_q:
        acc.add("memory_proj", 2 * n * D * HK)
        return
    n_gates = (int(mcfg.gate_style != "constant") + int(mcfg.use_momentum) + int(mcfg.use_decay)
               + int(mcfg.omega_window > 1))                 # theta, eta, alpha, gamma rows
    acc.add("memory_proj", n * (3 * 2 * D * HK + n_gates * 2 * D * mcfg.n_heads))


def _memory_output(acc: _Acc, mcfg: MemoryConfig, n: int) -> None:
    D, HK = mcfg.d_model, mcfg.n_heads * mcfg.head_dim
    acc.add("memory_proj", n * (2 * HK * D + (2 * D * HK if mcfg.use_output_gate else 0)))


def _prefixed_memory(acc: _Acc, mcfg: MemoryConfig, n_p: int, T: int) -> None:
    """``prefixed_memory`` over [N_p persistent || T tokens]: two scans when N_p > 0."""
    _memory_project(acc, mcfg, n_p + T)
    if n_p:
        _memory_scan(acc, mcfg, n_p)
    _memory_scan(acc, mcfg, T)
    _memory_output(acc, mcfg, n_p + T)


def banded(T: int, window: int | None) -> bool:
    """Whether a call of T tokens runs its sliding-window attention in bands of W queries over
    2W keys (``titans_lm.nn.attention.blocked_window_attention``) rather than densely."""
    return bool(window) and T % window == 0 and T >= 2 * window


def _attention(acc: _Acc, D: int, HK: int, n: int, window: int | None) -> None:
    """Causal (sliding-window) self-attention over n positions (executed: dense [n, n], or
    n x 2W keys when banded)."""
    acc.add("attention_proj", n * 4 * 2 * D * HK)
    keys = 2 * window if banded(n, window) else n
    acc.add("attention_core", n * 4 * HK * _mean_visible(n, window), n * 4 * HK * keys)


def _mlp(acc: _Acc, D: int, d_ff: int, n: int) -> None:
    acc.add("mlp", n * 6 * D * d_ff)


def _mac_layer(acc: _Acc, model_cfg, mcfg: MemoryConfig | None, T: int) -> None:
    D, N = int(model_cfg.d_model), int(model_cfg.segment_len)
    H = int(model_cfg.n_heads)
    HK = (D // H) * H
    n_p = int(model_cfg.n_persistent)
    n_seg = math.ceil(T / N)
    Tp = n_seg * N
    seg_model = [min(N, T - s * N) for s in range(n_seg)]   # real tokens per segment
    aligned = 1 if mcfg is None else 2                       # [x] or [h, x]
    # Attention: q of the segment, k/v of the persistent tokens (once per segment) and of the
    # aligned rows, o; queries see N_p + aligned * (i + 1) keys, executed densely over all.
    # (A layer without memory runs all segments as one batch: its persistent k/v once.)
    kv_p = 2 * 2 * n_p * D * HK
    if mcfg is None:
        acc.add("attention_proj", kv_p)
    for n in seg_model:
        acc.add("attention_proj", n * 2 * D * HK * (2 + 2 * aligned) + (kv_p if mcfg else 0),
                N * 2 * D * HK * (2 + 2 * aligned) + (kv_p if mcfg else 0))
        acc.add("attention_core", 4 * HK * n * (n_p + aligned * (n + 1) / 2),
                4 * HK * N * (n_p + aligned * N))
    if mcfg is None:
        return
    n_tail = mcfg.conv_kernel - 1 if mcfg.use_conv else 0
    H_m = mcfg.n_heads
    read1 = memory_plain_read_flops(mcfg) * H_m
    # Retrieval: queries of every token, the W0 read of every token (for documents starting in
    # a segment) and the read of the carried state, then the output gate and W_O.
    acc.add("memory_proj", 2 * T * D * H_m * mcfg.head_dim, 2 * Tp * D * H_m * mcfg.head_dim)
    acc.add("memory_read", 2 * T * read1, 2 * Tp * read1)
    for n in seg_model:
        sub = _Acc()
        _memory_output(sub, mcfg, n)                         # h = output(h_reads)
        _memory_project(sub, mcfg, n + n_tail)               # write: project [tail || y]
        _memory_scan(sub, mcfg, n)
        _memory_output(sub, mcfg, n)                         # output(reads, y)
        sub_exec = _Acc()
        _memory_output(sub_exec, mcfg, N)
        _memory_project(sub_exec, mcfg, N + n_tail)
        _memory_scan(sub_exec, mcfg, N)
        _memory_output(sub_exec, mcfg, N)
        for part in sub.model:
            acc.add(part, sub.model[part], sub_exec.executed[part])
        acc.add("combine", n * 2 * D * D, N * 2 * D * D)


def count_flops(model_cfg, seq_len: int) -> FlopCount:
    """Forward matmul FLOPs of one sequence of ``seq_len`` tokens through ``model_cfg``'s backbone.

    Args:
      model_cfg: the ``model`` section of a config (``configs/<name>.py``), any registered
        backbone: transformer, ttt_linear, ttt_mlp, lmm, mac, mag, mal, linear_attention,
        deltanet, gated_deltanet.
      seq_len: T.
    Returns:
      :class:`FlopCount` (multiply by the batch size for a batch).
    Raises:
      ValueError: for an unknown backbone name.
    """
    name = str(model_cfg.name)
    T = int(seq_len)
    D, L, d_ff, V = (int(model_cfg[k]) for k in ("d_model", "n_layers", "d_ff", "vocab_size"))
    acc = _Acc()
    if name == "transformer":
        H = int(model_cfg.n_heads)
        for _ in range(L):
            _attention(acc, D, (D // H) * H, T, int(model_cfg.get("window", 0)) or None)
            _mlp(acc, D, d_ff, T)
    elif name in ("ttt_linear", "ttt_mlp", "lmm") + LINEAR_RNNS:
        mcfg = memory_config(model_cfg)
        n_p = int(model_cfg.get("n_persistent", 0))
        for _ in range(L):
            _prefixed_memory(acc, mcfg, n_p, T)
            _mlp(acc, D, d_ff, n_p + T)
    elif name in ("mag", "mal"):
        mcfg = memory_config(model_cfg)
        n_p = int(model_cfg.n_persistent)
        H = int(model_cfg.n_heads)
        layers = memory_layer_indices(model_cfg.memory_layers, L)
        window = int(model_cfg.window) or None
        for i in range(L):
            # The persistent tokens are ordinary positions of the attention (always visible to a
            # window: counted as n_p extra keys per query in the model count).
            n = n_p + T
            acc.add("attention_proj", n * 4 * 2 * D * (D // H) * H)
            vis = (_mean_visible(T, window) + n_p) if window else _mean_visible(n, None)
            executed = (T * 4 * (D // H) * H * (2 * window + n_p) + n_p * 4 * (D // H) * H * n_p
                        if banded(T, window) else n * 4 * (D // H) * H * n)
            acc.add("attention_core", n * 4 * (D // H) * H * vis, executed)
            if i in layers:
                _prefixed_memory(acc, mcfg, n_p, T)
                if name == "mag" and model_cfg.get("combine", "gate") == "gate":
                    acc.add("combine", n * 2 * D * D)
            _mlp(acc, D, d_ff, n)
    elif name == "mac":
        mcfg = memory_config(model_cfg)
        layers = memory_layer_indices(model_cfg.memory_layers, L)
        for i in range(L):
            _mac_layer(acc, model_cfg, mcfg if i in layers else None, T)
            _mlp(acc, D, d_ff, T)
    else:
        raise ValueError(f"no FLOP count for backbone {name!r}; known: transformer, ttt_linear, "
                         "ttt_mlp, lmm, mac, mag, mal, " + ", ".join(LINEAR_RNNS))
    acc.add("head", T * 2 * D * V)
    return FlopCount(tokens=T, model={p: acc.model.get(p, 0.0) for p in PARTS},
                     executed={p: acc.executed.get(p, 0.0) for p in PARTS})


# ----------------------------------------------------------------------------- from a program
def _dot_flops(eqn) -> float:
    lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    batch = math.prod(lhs[i] for i in lb)
    contract = math.prod(lhs[i] for i in lc)
    lfree = math.prod(d for i, d in enumerate(lhs) if i not in lc and i not in lb)
    rfree = math.prod(d for i, d in enumerate(rhs) if i not in rc and i not in rb)
    return 2.0 * batch * contract * lfree * rfree


def _sub_jaxprs(eqn):
    for key, val in eqn.params.items():
        vals = val if isinstance(val, (tuple, list)) else (val,)
        for v in vals:
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield key, v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield key, v


def jaxpr_matmul_flops(jaxpr) -> float:
    """Sum of the ``dot_general`` FLOPs of a (closed) jaxpr, through scans (times their length),
    jit, remat and custom-derivative calls (their primal only); a ``cond`` counts its smallest
    branch (the model's conds are the memory's: they skip the work of document starts inside a
    chunk where none occurs, and the count is that of such a batch).

    Raises:
      ValueError: for a ``while`` loop (unknown trip count).
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        prim = eqn.primitive.name
        if prim == "dot_general":
            total += _dot_flops(eqn)
        elif prim == "while":
            raise ValueError("jaxpr_matmul_flops cannot count a while loop")
        elif prim == "cond":
            total += min(jaxpr_matmul_flops(b) for b in eqn.params["branches"])
        elif prim == "scan":
            total += eqn.params["length"] * jaxpr_matmul_flops(eqn.params["jaxpr"])
        else:
            subs = list(_sub_jaxprs(eqn))
            primal = [j for k, j in subs if k in ("jaxpr", "call_jaxpr", "fun_jaxpr")]
            for j in (primal[:1] if primal else [j for _, j in subs]):
                total += jaxpr_matmul_flops(j)
    return total


def traced_forward_flops(fn, *args, dce: bool = True) -> float:
    """``dot_general`` FLOPs of ``fn(*args)`` as traced by JAX, dead code removed (``dce``) the
    way XLA removes it (the memory layer projects keys and gates that MAC's retrieval does not
    use).

    JAX has no public dead-code elimination of a jaxpr: this function is the package's one use
    of a private JAX module. Where that module is missing or changed, the count is made without
    dead-code elimination (an upper bound) and a warning says so.
    """
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    if dce:
        try:
            from jax._src.interpreters import partial_eval as pe  # deliberate: private, no public DCE
            jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
        except (ImportError, AttributeError, TypeError) as e:
            warnings.warn(f"traced_forward_flops: no dead-code elimination in this JAX ({e!r}); "
                          "counting every traced matmul (an upper bound)", RuntimeWarning,
                          stacklevel=2)
    return jaxpr_matmul_flops(jaxpr)
