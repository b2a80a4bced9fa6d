"""NeuralMemory: the Titans long-term memory as a Flax NNX layer (also TTT-Linear / TTT-MLP).

Per head h and token t (Titans arXiv:2501.00663 sec. 3.1 and 4.4; DESIGN.md sec. 2):

    q, k, v = x W_Q, x W_K, x W_V                      [D] -> [H, head_dim]
    (optional) causal depthwise conv (kernel 4, restarting at document starts), then SiLU
    q, k <- q / ||q||, k / ||k||                        (qk_l2_norm)
    v <- v / ||v||                                       (v_l2_norm; see MemoryConfig)
    theta, eta, alpha = gates(x)                         (see titans_lm.memory.gates)
    reads = memory_scan(W0_h, 0, k, v, q, theta, eta, alpha)   (titans_lm.memory.scan)
    y = (RMSNorm(reads) * SiLU(x W_g)) W_O               [H, head_dim] -> [D]

Documents: ``segment_ids_BT`` (0 = padding) give document starts where the id changes to a
non-zero id; the memory state returns to (W0, 0) there (honoured at chunk starts, which the data
pipeline guarantees for chunk sizes dividing 64) and the conv window restarts. Padding tokens get
theta = eta = alpha = 0: they write nothing, the memory parameters stay frozen through them and
the momentum is cleared.

Shapes: B batch, T tokens, D d_model, H n_heads, Dh head_dim. A state is a pair
(params, momentum) of tuples of arrays with leading [B, H] (layout of the inner model, see
titans_lm.memory.inner_models).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.memory import gates as gate_fns
from titans_lm.memory import stats as memory_stats
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.documents import document_starts
from titans_lm.memory.scan import memory_read, memory_scan
from titans_lm.nn.conv import causal_depthwise_conv

State = tuple  # (params: tuple[[B, H, ...]], momentum: tuple[[B, H, ...]])


class MemoryInputs(NamedTuple):
    """What :meth:`NeuralMemory.project` returns (inner-loop dtype: float32, or float64).

    q, k: [B, H, T, Dh] queries and keys; v: [B, H, T, Dh] values;
    theta, eta, alpha: [B, H, T] gates; reset: bool [B, T] document starts.
    """

    q: jax.Array
    k: jax.Array
    v: jax.Array
    theta: jax.Array
    eta: jax.Array
    alpha: jax.Array
    reset: jax.Array


def _param(rngs, init, shape, axes, dtype):
    return nnx.Param(nnx.with_partitioning(init, axes)(rngs.params(), shape, dtype))


def _const_init(value):
    def init(key, shape, dtype):
        del key
        return jnp.full(shape, value, dtype)
    return init


class NeuralMemory(nnx.Module):
    """Titans neural long-term memory layer (and TTT layer with ``gate_style="ttt"``).

    Call: ``layer(x_BTD, segment_ids_BT=None) -> y_BTD`` (segment_ids None: one document).
    Lower-level pieces for other wirings (MAC's segment loop):
    :meth:`project`, :meth:`initial_state`, :meth:`reset_state`, :meth:`scan`, :meth:`read`,
    :meth:`output`.

    Parameters (logical axis names): w_q, w_k, w_v, w_gate [D, H, Dh] ("embed", "heads",
    "head_dim"); conv_q, conv_k, conv_v [K, H, Dh] (None, "heads", "head_dim") when use_conv (row 0
    multiplies the current token, row i the token i steps back: ``titans_lm.nn.conv``);
    theta_w / eta_w / alpha_w [D, H] ("embed", "heads") and *_b [H] ("heads",), eta and alpha only
    when momentum / decay are on; w0 (nnx.List, the inner model's initial parameters per head:
    matrices [H, d_in, d_out] ("heads", None, "memory"), vectors [H, d] ("heads", "memory"));
    norm_scale [H, Dh] ("heads", "head_dim"); w_out [H, Dh, D] ("heads", "head_dim", "embed").

    Initialisation: projections truncated-normal with variance 1/fan_in; conv taps uniform in
    +-1/sqrt(K); gate weights N(0, 0.02^2) with biases from the config (theta_bias_init, ...); W0
    per head from the inner model's ``init`` (LeCun-normal matrices, zero biases, unit LN scales);
    norm scale ones.
    """

    def __init__(self, cfg: MemoryConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.model = cfg.inner_model()
        D, H, Dh = cfg.d_model, cfg.n_heads, cfg.head_dim
        pdt = jnp.dtype(cfg.param_dtype)
        proj_init = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0,
                                                      out_axis=(1, 2))
        out_init = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                     in_axis=(0, 1), out_axis=2)
        qkv_axes = ("embed", "heads", "head_dim")
        self.w_q = _param(rngs, proj_init, (D, H, Dh), qkv_axes, pdt)
        self.w_k = _param(rngs, proj_init, (D, H, Dh), qkv_axes, pdt)
        self.w_v = _param(rngs, proj_init, (D, H, Dh), qkv_axes, pdt)
        if cfg.use_conv:
            bound = 1.0 / cfg.conv_kernel ** 0.5
            conv_init = nnx.initializers.uniform(2 * bound)
            shifted = lambda key, shape, dtype: conv_init(key, shape, dtype) - bound  # noqa: E731
            conv_axes = (None, "heads", "head_dim")
            K = cfg.conv_kernel
            self.conv_q = _param(rngs, shifted, (K, H, Dh), conv_axes, pdt)
            self.conv_k = _param(rngs, shifted, (K, H, Dh), conv_axes, pdt)
            self.conv_v = _param(rngs, shifted, (K, H, Dh), conv_axes, pdt)
        gate_w_init = nnx.initializers.normal(0.02)
        self.theta_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
        self.theta_b = _param(rngs, _const_init(cfg.theta_bias_init), (H,), ("heads",), pdt)
        if cfg.use_momentum:
            self.eta_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
            self.eta_b = _param(rngs, _const_init(cfg.eta_bias_init), (H,), ("heads",), pdt)
        if cfg.use_decay:
            self.alpha_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
            self.alpha_b = _param(rngs, _const_init(cfg.alpha_bias_init), (H,), ("heads",), pdt)

        shapes = self.model.param_shapes(Dh, Dh)
        keys = jax.random.split(rngs.params(), H)
        per_head = jax.vmap(lambda key: self.model.init(key, Dh, Dh, pdt))(keys)
        w0 = []
        for value, shape in zip(per_head, shapes):
            axes = ("heads", None, "memory") if len(shape) == 2 else ("heads", "memory")
            w0.append(nnx.Param(value, out_sharding=axes))
        self.w0 = nnx.List(w0)

        self.norm_scale = _param(rngs, _const_init(1.0), (H, Dh), ("heads", "head_dim"), pdt)
        if cfg.use_output_gate:
            self.w_gate = _param(rngs, proj_init, (D, H, Dh), qkv_axes, pdt)
        self.w_out = _param(rngs, out_init, (H, Dh, D), ("heads", "head_dim", "embed"), pdt)

    # ----------------------------------------------------------------------------- dtypes
    @property
    def compute_dtype(self):
        return jnp.dtype(self.cfg.dtype)

    @property
    def inner_dtype(self):
        """The inner loop's dtype: float32, or float64 when the layer computes in float64."""
        return jnp.promote_types(jnp.float32, self.compute_dtype)

    # ----------------------------------------------------------------------------- pieces
    def project(self, x_BTD: jax.Array, segment_ids_BT: Optional[jax.Array] = None) -> MemoryInputs:
        """Queries, keys, values, gates and document resets for every head.

        Args:
          x_BTD: [B, T, D] layer input.
          segment_ids_BT: int [B, T] document ids (0 = padding); None = one document.
        Returns:
          MemoryInputs with q, k, v [B, H, T, Dh], theta, eta, alpha [B, H, T], reset bool [B, T].
        Raises:
          ValueError: for a wrong input width or segment-id shape.
        """
        cfg = self.cfg
        B, T, D = self._check_input(x_BTD)
        if segment_ids_BT is None:
            segment_ids_BT = jnp.ones((B, T), jnp.int32)
        if segment_ids_BT.shape != (B, T):
            raise ValueError(f"segment_ids_BT must be [B, T] = [{B}, {T}], got {tuple(segment_ids_BT.shape)}")
        cdt, idt = self.compute_dtype, self.inner_dtype
        xc = x_BTD.astype(cdt)
        reset = document_starts(segment_ids_BT)

        def qkv(w, conv):
            y = jnp.einsum("btd,dhk->bthk", xc, w[...].astype(cdt))
            if cfg.use_conv:
                y = causal_depthwise_conv(y, conv[...].astype(y.dtype), segment_ids_BT)
            return jax.nn.silu(y).astype(idt)

        q = qkv(self.w_q, getattr(self, "conv_q", None))
        k = qkv(self.w_k, getattr(self, "conv_k", None))
        v = qkv(self.w_v, getattr(self, "conv_v", None))
        if cfg.qk_l2_norm:
            q, k = self._l2_normalize(q), self._l2_normalize(k)
        if cfg.v_l2_norm:
            v = self._l2_normalize(v)

        xi = x_BTD.astype(idt)

        def pre(w, b):
            a = jnp.einsum("btd,dh->bth", xi, w[...].astype(idt)) + b[...].astype(idt)
            if cfg.gate_granularity == "chunk":
                a = gate_fns.first_of_chunk(a, cfg.chunk_size)
            return a

        a_theta = pre(self.theta_w, self.theta_b)
        if cfg.gate_style == "titans":
            theta = gate_fns.titans_theta(a_theta, cfg.theta_max)
        else:
            theta = gate_fns.ttt_theta(a_theta, cfg.ttt_base_lr, cfg.head_dim)
        zeros = jnp.zeros_like(theta)
        eta = (gate_fns.titans_eta(pre(self.eta_w, self.eta_b), cfg.eta_max) if cfg.use_momentum
               else zeros)
        alpha = jax.nn.sigmoid(pre(self.alpha_w, self.alpha_b)) if cfg.use_decay else zeros
        real = (segment_ids_BT != 0)[:, :, None]
        theta, eta, alpha = (jnp.where(real, g, 0) for g in (theta, eta, alpha))

        to_bhtd = lambda y: jnp.transpose(y, (0, 2, 1, 3))  # noqa: E731
        to_bht = lambda g: jnp.transpose(g, (0, 2, 1))  # noqa: E731
        return MemoryInputs(q=to_bhtd(q), k=to_bhtd(k), v=to_bhtd(v), theta=to_bht(theta),
                            eta=to_bht(eta), alpha=to_bht(alpha), reset=reset)

    def initial_params(self) -> tuple:
        """The learned per-head initial memory parameters W0: tuple of [H, ...] (inner dtype)."""
        return tuple(p[...].astype(self.inner_dtype) for p in self.w0)

    def initial_state(self, batch_size: int) -> State:
        """(W0 broadcast to [B, H, ...], zero momentum): the state at a document start."""
        params = tuple(jnp.broadcast_to(p, (batch_size,) + p.shape) for p in self.initial_params())
        return params, tuple(jnp.zeros_like(p) for p in params)

    def reset_state(self, state: State, reset_B: jax.Array) -> State:
        """Where reset_B (bool [B]) is True, replace the state by the initial state."""
        params, momentum = state
        init_params, init_momentum = self.initial_state(reset_B.shape[0])
        sel = lambda r, a, b: jnp.where(r.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)  # noqa: E731
        return (tuple(sel(reset_B, i, p) for i, p in zip(init_params, params)),
                tuple(sel(reset_B, i, m) for i, m in zip(init_momentum, momentum)))

    def scan(self, state: State, q, k, v, theta, eta, alpha, reset=None, *,
             read: Optional[str] = None, reset_to: Optional[tuple] = None):
        """Write every token into the memory and read every query (vmapped engine).

        Args:
          state: (params, momentum) with leading [B, H] (e.g. initial_state(B) or a carried one).
          q, k, v: [B, H, T, Dh]; theta, eta, alpha: [B, H, T]; reset: bool [B, T] or None.
          read: "after_write" | "chunk_start"; None uses cfg.read.
          reset_to: parameters with leading [B, H] that a reset (at a chunk start) restores,
            with zero momentum; None restores the learned W0 (not the given state).
        Returns:
          (reads [B, H, T, Dh], final state) in the inner dtype.
        """
        cfg = self.cfg
        params, momentum = state
        B, _, T, _ = q.shape
        if reset is None:
            reset = jnp.zeros((B, T), bool)
        if reset_to is None:
            reset_to = self.initial_state(B)[0]
        options = {"chunks_per_checkpoint": cfg.chunks_per_checkpoint} if cfg.impl == "chunked" else {}
        if cfg.surprise_max_norm > 0:
            options["surprise_max_norm"] = cfg.surprise_max_norm
        engine = functools.partial(memory_scan, model=self.model, chunk_size=cfg.chunk_size,
                                   impl=cfg.impl, read=read or cfg.read, **options)

        def one(p, m, k_, v_, q_, th, et, al, rs, p0):
            return engine(p, m, k_, v_, q_, th, et, al, reset=rs, reset_to=p0)

        over_heads = jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None, 0))
        over_batch = jax.vmap(over_heads)
        idt = self.inner_dtype
        cast = lambda xs: tuple(x.astype(idt) for x in xs)  # noqa: E731
        reads, (P, S) = over_batch(cast(params), cast(momentum), k.astype(idt), v.astype(idt),
                                   q.astype(idt), theta.astype(idt), eta.astype(idt),
                                   alpha.astype(idt), reset, cast(reset_to))
        memory_stats.record_state(self, P, self.initial_params())
        return reads, (P, S)

    def read(self, state: State, q_BHTD: jax.Array) -> jax.Array:
        """Retrieve from a state without writing: f(q; P) per batch and head -> [B, H, T, Dh]."""
        params, _ = state
        fn = functools.partial(memory_read, model=self.model)
        return jax.vmap(jax.vmap(fn))(params, q_BHTD.astype(self.inner_dtype))

    def output(self, reads_BHTD: jax.Array, x_BTD: jax.Array) -> jax.Array:
        """RMSNorm per head, output gate SiLU(x W_g), projection W_O: -> [B, T, D] (compute dtype)."""
        cfg = self.cfg
        cdt = self.compute_dtype
        r = reads_BHTD.astype(jnp.promote_types(jnp.float32, cdt))
        r = r * jax.lax.rsqrt(jnp.mean(r ** 2, axis=-1, keepdims=True) + cfg.norm_eps)
        r = jnp.transpose(r, (0, 2, 1, 3)).astype(cdt) * self.norm_scale[...].astype(cdt)
        if cfg.use_output_gate:
            gate = jnp.einsum("btd,dhk->bthk", x_BTD.astype(cdt), self.w_gate[...].astype(cdt))
            r = r * jax.nn.silu(gate)
        return jnp.einsum("bthk,hkd->btd", r, self.w_out[...].astype(cdt))

    def __call__(self, x_BTD: jax.Array, segment_ids_BT: Optional[jax.Array] = None) -> jax.Array:
        """y_BTD = output(scan(initial_state, project(x)), x): [B, T, D] -> [B, T, D]."""
        inputs = self.project(x_BTD, segment_ids_BT)
        reads, _ = self.scan(self.initial_state(x_BTD.shape[0]), inputs.q, inputs.k, inputs.v,
                             inputs.theta, inputs.eta, inputs.alpha, inputs.reset)
        return self.output(reads, x_BTD)

    # ----------------------------------------------------------------------------- helpers
    def _l2_normalize(self, x):
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps)

    def _check_input(self, x_BTD):
        if x_BTD.ndim != 3 or x_BTD.shape[-1] != self.cfg.d_model:
            raise ValueError(f"x_BTD must be [B, T, d_model={self.cfg.d_model}], got {tuple(x_BTD.shape)}")
        return x_BTD.shape
