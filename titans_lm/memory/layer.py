"""NeuralMemory: the Titans long-term memory as a Flax NNX layer (also TTT-Linear / TTT-MLP).

Per head h and token t (Titans arXiv:2501.00663 sec. 3.1 and 4.4; docs/design.md#the-inner-loop):

    q, k, v = x W_Q, x W_K, x W_V                      [D] -> [H, head_dim]
    (optional) causal depthwise conv (kernel 4, restarting at document starts), then SiLU
      (q and k: the feature map phi instead, feature_map "elu1": titans_lm.memory.features)
    q, k <- q / ||q||, k / ||k||                        (qk_l2_norm)
    q, k <- phi_p(q), phi_p(k)                           (feature_map "poly": Atlas' monomials of
                                                          degree 1..p, [Dh] -> [key_width])
    v <- v / ||v||                                       (v_l2_norm; see MemoryConfig)
    theta, eta, alpha = gates(x)                         (see titans_lm.memory.gates; the forget
                                                          gate also as log(1 - alpha) = log_sigmoid(-a))
    reads = memory_scan(W0_h, 0, k, v, q, theta, eta, alpha)   (titans_lm.memory.scan; W0 = 0
                                                          without learned_w0)
    (read_normalizer: v gets a ones column, reads = reads[:Dh] / (reads[Dh] + norm_eps))
    y = (RMSNorm(reads) * SiLU(x W_g)) W_O               [H, head_dim] -> [D]

Call (the mixer protocol): ``state = layer.init_state(B)``; ``y_BTD, state = layer(x_BTD, stream,
state)`` with the call's :class:`titans_lm.nn.stream.Stream`. Documents: ``stream.starts`` marks
document starts (a changed, non-zero segment id; a continued call does not restart at its first
token); the memory state returns to (reset_to, 0) there, at any position (a start inside a
chunk cuts the chunk: docs/design.md#resets-inside-a-chunk), and the conv window restarts. Padding tokens
(segment id 0) get theta = eta = alpha = 0: they write nothing, the memory parameters stay frozen
through them and the momentum is cleared.

Carried state: :class:`titans_lm.memory.carried.MemoryState` (the memory at the start of the
current chunk, the chunk's tokens so far and the conv tail; see that module for how a call runs
from it, so that any split of a sequence into calls gives the mini-batch semantics of one call).

Shapes: B batch, T tokens, D d_model, H n_heads, Dh head_dim. A (params, momentum) pair is a pair
of tuples of arrays with leading [B, H] (layout of the inner model, see
titans_lm.memory.inner_models).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.memory import gates as gate_fns
from titans_lm.memory import sharded
from titans_lm.memory import stats as memory_stats
from titans_lm.memory.carried import (MemoryState, Tokens, empty_state, next_state, reset_rows,
                                      with_buffer)
from titans_lm.memory.chunked import starts_inside_chunks
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.features import feature_map, poly_features
from titans_lm.memory.scan import memory_read, memory_scan
from titans_lm.nn.channel_scale import channel_scale
from titans_lm.nn.conv import carried_causal_conv
from titans_lm.nn.project import project
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID

State = tuple  # (params: tuple[[B, H, ...]], momentum: tuple[[B, H, ...]])


def _eager_sharding() -> bool:
    """Shard parameters at creation only where a mesh is set (the trainer's); elsewhere a layer
    builds without one, keeping its logical axis names as metadata."""
    return nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty


class MemoryInputs(NamedTuple):
    """What :meth:`NeuralMemory.project` returns (inner-loop dtype: float32, or float64).

    q, k: [B, H, T, Dh] queries and keys; v: [B, H, T, Dh] values;
    theta, eta, alpha: [B, H, T] gates; reset: bool [B, T] document starts;
    log_keep: [B, H, T] log(1 - alpha) from the gate's pre-activation (log_sigmoid), the forget
    gate as the engine uses it (None: the engine forms 1 - alpha).
    gamma: [B, H, T] Atlas' Omega gates in [0, 1] (0 for padding) with omega_window > 1, else None.
    """

    q: jax.Array
    k: jax.Array
    v: jax.Array
    theta: jax.Array
    eta: jax.Array
    alpha: jax.Array
    reset: jax.Array
    log_keep: Optional[jax.Array] = None
    gamma: Optional[jax.Array] = None


def _param(rngs, init, shape, axes, dtype):
    return nnx.Param(nnx.with_partitioning(init, axes)(rngs.params(), shape, dtype),
                     eager_sharding=_eager_sharding())


def _const_init(value):
    def init(key, shape, dtype):
        del key
        return jnp.full(shape, value, dtype)
    return init


class NeuralMemory(nnx.Module):
    """Titans neural long-term memory layer (and TTT layer with ``gate_style="ttt"``).

    Call (mixer protocol): ``layer.init_state(B) -> MemoryState``;
    ``layer(x_BTD, stream, state) -> (y_BTD, MemoryState)`` (module docstring).
    ``layer.reset_memory(state, rows_B)``, ``layer.memory_norms(state)`` (the rest of the mixer
    protocol, ``titans_lm.models.mixer``). Lower-level pieces for other wirings (MAC's segment
    loop): :meth:`project`, :meth:`initial_params`, :meth:`scan`, :meth:`read`, :meth:`output`.

    Parameters (logical axis names): w_q, w_k, w_v, w_gate [D, H, Dh] ("embed", "heads",
    "head_dim"); conv_q, conv_k, conv_v [K, H, Dh] (None, "heads", "head_dim") when use_conv (row 0
    multiplies the current token, row i the token i steps back: ``titans_lm.nn.conv``);
    theta_w / eta_w / alpha_w [D, H] ("embed", "heads") and *_b [H] ("heads",), eta and alpha only
    when momentum / decay are on; gamma_w [D, H], gamma_b [H] (Atlas' Omega gates) only with
    omega_window > 1; w0 (nnx.List, the inner model's initial parameters per head:
    matrices [H, d_in, d_out] (the first d_in = ``cfg.key_width``) ("heads", None, "memory"), vectors [H, d] ("heads", "memory"));
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
        if cfg.gate_style != "constant":
            self.theta_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
            self.theta_b = _param(rngs, _const_init(cfg.theta_bias_init), (H,), ("heads",), pdt)
        if cfg.use_momentum:
            self.eta_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
            self.eta_b = _param(rngs, _const_init(cfg.eta_bias_init), (H,), ("heads",), pdt)
        if cfg.use_decay:
            self.alpha_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
            self.alpha_b = _param(rngs, _const_init(cfg.alpha_bias_init), (H,), ("heads",), pdt)

        Dk = cfg.key_width   # head_dim, or the polynomial features' width
        shapes = self.model.param_shapes(Dk, cfg.memory_width)
        w0 = []
        if cfg.learned_w0:
            keys = jax.random.split(rngs.params(), H)
            per_head = jax.vmap(lambda key: self.model.init(key, Dk, cfg.memory_width, pdt))(keys)
            for value, shape in zip(per_head, shapes):
                axes = ("heads", None, "memory") if len(shape) == 2 else ("heads", "memory")
                w0.append(nnx.Param(value, out_sharding=axes, eager_sharding=_eager_sharding()))
        self.w0 = nnx.List(w0)
        self._w0_shapes = tuple((H,) + tuple(shape) for shape in shapes)

        self.norm_scale = _param(rngs, _const_init(1.0), (H, Dh), ("heads", "head_dim"), pdt)
        if cfg.use_output_gate:
            self.w_gate = _param(rngs, proj_init, (D, H, Dh), qkv_axes, pdt)
        self.w_out = _param(rngs, out_init, (H, Dh, D), ("heads", "head_dim", "embed"), pdt)
        if cfg.omega_window > 1:   # last, so that the other parameters draw what they draw without
            self.gamma_w = _param(rngs, gate_w_init, (D, H), ("embed", "heads"), pdt)
            self.gamma_b = _param(rngs, _const_init(cfg.omega_gamma_bias_init), (H,), ("heads",),
                                  pdt)

    # ----------------------------------------------------------------------------- dtypes
    @property
    def compute_dtype(self):
        return jnp.dtype(self.cfg.dtype)

    @property
    def inner_dtype(self):
        """The inner loop's dtype: float32, or float64 when the layer computes in float64."""
        return jnp.promote_types(jnp.float32, self.compute_dtype)

    # ----------------------------------------------------------------------------- pieces
    def project(self, x_BTD: jax.Array, stream, conv_tail: tuple = (), *, tail_at=None
                ) -> tuple[MemoryInputs, tuple]:
        """Queries, keys, values, gates and document resets for every head.

        Args:
          x_BTD: [B, T, D] layer input.
          stream: the call's :class:`titans_lm.nn.stream.Stream` (segment_ids, starts, positions;
            ``titans_lm.nn.stream.make_stream``), for tokens whose chunk grid starts at token 0.
          conv_tail: the carried pre-conv projections (``MemoryState.conv_tail``), or () for a
            stream that starts here.
          tail_at: None, or a token index in 0..T (may be traced): the returned conv tail is the
            one before that token instead of after the call (``nn.conv.carried_causal_conv``).
        Returns:
          (MemoryInputs with q, k, v [B, H, T, Dh], theta, eta, alpha [B, H, T] (padding masked,
          per-chunk gates applied), reset bool [B, T]; the new conv tail).
        Raises:
          ValueError: for a wrong input width or stream shape.
        """
        tokens, tail = self._tokens(x_BTD, stream, conv_tail, tail_at)
        return self._finish(tokens), tail

    def _tokens(self, x_BTD, stream, conv_tail=(), tail_at=None) -> tuple[Tokens, tuple]:
        cfg = self.cfg
        B, T, D = self._check_input(x_BTD)
        if tuple(stream.segment_ids.shape) != (B, T):
            raise ValueError(f"the stream is for calls of shape {tuple(stream.segment_ids.shape)}, "
                             f"x_BTD has [B, T] = [{B}, {T}]")
        cdt, idt = self.compute_dtype, self.inner_dtype
        xc = x_BTD.astype(cdt)
        tails = list(conv_tail) if conv_tail else [None] * 3
        new_tails = []

        def qkv(w, conv, tail, act):
            y = project(xc, w[...].astype(cdt))  # einsum btd,dhk->bthk
            if cfg.use_conv:
                y, new_tail = carried_causal_conv(y, conv[...].astype(y.dtype), stream.positions,
                                                  tail, tail_at)
                new_tails.append(new_tail)
            return act(y).astype(idt)

        phi = feature_map(cfg.feature_map)   # q and k: SiLU, elu + 1, or SiLU then monomials ("poly")
        q = qkv(self.w_q, getattr(self, "conv_q", None), tails[0], phi)
        k = qkv(self.w_k, getattr(self, "conv_k", None), tails[1], phi)
        v = qkv(self.w_v, getattr(self, "conv_v", None), tails[2], jax.nn.silu)
        if cfg.qk_l2_norm:
            q, k = self._l2_normalize(q), self._l2_normalize(k)
        if cfg.v_l2_norm:
            v = self._l2_normalize(v)

        xi = x_BTD.astype(idt)

        def pre(w, b):
            return jnp.einsum("btd,dh->bth", xi, w[...].astype(idt)) + b[...].astype(idt)

        if cfg.gate_style == "constant":
            theta = jnp.full(xi.shape[:2] + (cfg.n_heads,), cfg.theta_bound, idt)
        elif cfg.gate_style == "titans":
            theta = gate_fns.titans_theta(pre(self.theta_w, self.theta_b), cfg.theta_bound)
        else:
            theta = gate_fns.ttt_theta(pre(self.theta_w, self.theta_b), cfg.ttt_base_lr,
                                       cfg.head_dim)
        zeros = jnp.zeros_like(theta)
        eta = (gate_fns.titans_eta(pre(self.eta_w, self.eta_b), cfg.eta_max) if cfg.use_momentum
               else zeros)
        # log(1 - alpha) = log_sigmoid(-a): exact near alpha -> 0 and -> 1, where 1 - alpha is not
        log_keep = jax.nn.log_sigmoid(-pre(self.alpha_w, self.alpha_b)) if cfg.use_decay else zeros
        gamma = (gate_fns.omega_gamma(pre(self.gamma_w, self.gamma_b)) if cfg.omega_window > 1
                 else None)

        to_bhtd = lambda y: jnp.transpose(y, (0, 2, 1, 3))  # noqa: E731
        to_bht = lambda g: jnp.transpose(g, (0, 2, 1))  # noqa: E731
        tokens = Tokens(q=to_bhtd(q), k=to_bhtd(k), v=to_bhtd(v), theta=to_bht(theta),
                         eta=to_bht(eta), log_keep=to_bht(log_keep), real=stream.segment_ids != 0,
                         reset=jnp.asarray(stream.starts, bool),
                         gamma=None if gamma is None else to_bht(gamma))
        return tokens, tuple(new_tails)

    def _finish(self, t: Tokens) -> MemoryInputs:
        """Per-chunk gates (gate_granularity "chunk": a gate is elementwise in its
        pre-activation, so taking the chunk's first gate equals gating its first pre-activation)
        and the padding mask, for tokens whose chunk grid starts at index 0. The Omega gates
        gamma stay per token (they weight a token's loss in the windows it is in), padding 0."""
        gates = (t.theta, t.eta, t.log_keep)
        if self.cfg.gate_granularity == "chunk":
            gates = tuple(gate_fns.first_of_chunk(jnp.swapaxes(g, 1, 2), self.cfg.chunk_size,
                                                  t.reset).swapaxes(1, 2) for g in gates)
        real = t.real[:, None, :]
        theta, eta, log_keep = (jnp.where(real, g, 0) for g in gates)
        gamma = None if t.gamma is None else jnp.where(real, t.gamma, 0)
        return MemoryInputs(q=t.q, k=t.k, v=t.v, theta=theta, eta=eta, alpha=-jnp.expm1(log_keep),
                            reset=t.reset, log_keep=log_keep, gamma=gamma)

    def initial_params(self) -> tuple:
        """The per-head initial memory parameters W0: tuple of [H, ...] (inner dtype); learned,
        or zeros without ``learned_w0``."""
        if not self.cfg.learned_w0:
            return tuple(jnp.zeros(shape, self.inner_dtype) for shape in self._w0_shapes)
        return tuple(p[...].astype(self.inner_dtype) for p in self.w0)

    def _w0(self, batch_size: int) -> tuple:
        """W0 broadcast to [B, H, ...] (inner dtype): the parameters at a document start."""
        return tuple(jnp.broadcast_to(p, (batch_size,) + p.shape) for p in self.initial_params())

    def scan(self, state: State, q, k, v, theta, eta, alpha, reset=None, log_keep=None,
             gamma=None, *, read: Optional[str] = None, reset_to: Optional[tuple] = None,
             state_length=None, omega_tail: Optional[tuple] = None):
        """Write every token into the memory and read every query (vmapped engine).

        A kernel engine (``impl="pallas"``, or ``"auto"`` on GPU/TPU) runs per shard of JAX's
        current mesh (``jax.shard_map`` over the batch rows and heads, no communication;
        :mod:`titans_lm.memory.sharded`); without a mesh, and for the other engines, the engine
        is called directly.

        Args:
          state: (params, momentum) with leading [B, H] (e.g. ``init_state(B)``'s
            ``(params, momentum)`` or a carried one).
          q, k, v: [B, H, T, Dh]; theta, eta, alpha: [B, H, T]; reset: bool [B, T] or None.
          read: "after_write" | "chunk_start"; None uses cfg.read.
          reset_to: parameters with leading [B, H] that a reset (a document start) restores,
            with zero momentum; None restores the learned W0 (not the given state).
          log_keep: [B, H, T] log(1 - alpha) (MemoryInputs.log_keep), used instead of alpha;
            after reset in MemoryInputs' order, so ``scan(state, *inputs)`` passes it.
          state_length: None, or an int scalar (may be traced) shared by all rows: return the
            state after that many tokens (``memory_scan``'s ``state_length``).
          gamma: [B, H, T] the Omega gates (MemoryInputs.gamma), required with omega_window > 1.
          omega_tail: with omega_window > 1, None (a fresh stream) or (k [B, H, c - 1, Dh],
            v [B, H, c - 1, Dh], gamma [B, H, c - 1], valid bool [B, c - 1]): the c - 1 tokens
            before the first (``carried.OmegaState``'s tail; keys before the feature map).
        Returns:
          (reads [B, H, T, Dh], final state) in the inner dtype.
        Raises:
          ValueError: with omega_window > 1 and no gamma (a wiring that does not pass it).
        """
        cfg = self.cfg
        params, momentum = state
        B, _, T, _ = q.shape
        if reset is None:
            reset = jnp.zeros((B, T), bool)
        if reset_to is None:
            reset_to = self._w0(B)
        options = {"chunks_per_checkpoint": cfg.chunks_per_checkpoint} if cfg.impl == "chunked" else {}
        if cfg.read_running_mean:
            options["running_mean"] = True
        if cfg.surprise_max_norm > 0:
            options["surprise_max_norm"] = cfg.surprise_max_norm
        options.update(attentional_bias=cfg.bias(), gradient_at=cfg.gradient_at,
                       decay_target=cfg.decay_target, ns_steps=cfg.ns_steps,
                       ns_gradient=cfg.ns_gradient)
        if cfg.fast_weight_norm:
            options["fast_weight_norm"] = True
        omega = cfg.omega_window > 1
        if omega and gamma is None:
            raise ValueError("omega_window > 1 (the Omega rule) needs gamma, the window gates "
                             "(MemoryInputs.gamma from project()); this wiring does not pass them: "
                             "set model.memory.omega_window=1")
        if not omega and (gamma is not None or omega_tail is not None):
            raise ValueError("gamma and omega_tail are inputs of the Omega rule only; set "
                             "omega_window > 1 or drop them")
        q, k = self._features(q), self._features(k)
        ones = lambda x: jnp.ones(x.shape[:-1] + (1,), x.dtype)  # noqa: E731
        if cfg.read_normalizer:   # z = sum theta phi(k) rides along as the last value column
            v = jnp.concatenate([v, ones(v)], axis=-1)
        om = None
        if omega:
            c = cfg.omega_window
            if omega_tail is None:
                z = jnp.zeros(k.shape[:2] + (c - 1,), self.inner_dtype)
                omega_tail = (jnp.zeros(z.shape + (cfg.head_dim,), z.dtype),) * 2 + (
                    z, jnp.zeros((B, c - 1), bool))
            tk, tv, tg, tvalid = omega_tail
            tk = self._features(tk.astype(self.inner_dtype))
            tv = tv.astype(self.inner_dtype)
            if cfg.read_normalizer:
                tv = jnp.concatenate([tv, ones(tv)], axis=-1)
            om = (gamma.astype(self.inner_dtype), tk, tv, tg.astype(self.inner_dtype), tvalid)
        engine = functools.partial(memory_scan, model=self.model, chunk_size=cfg.chunk_size,
                                   impl=cfg.impl, read=read or cfg.read, **options)

        def one(p, m, k_, v_, q_, th, et, al, rs, p0, lk, sl, inside, om_=None):
            kw = {} if lk is None else {"log_keep": lk}
            if sl is not None:
                kw["state_length"] = sl
            if om_ is not None:
                kw.update(omega_window=cfg.omega_window, gamma=om_[0], omega_tail=om_[1:],
                          omega_normalize=cfg.omega_normalize)
            # One flag for all rows, so that it stays a branch under vmap: without a document
            # start inside a chunk the engines skip that work (the kernel runs).
            # Without momentum / decay their gates are the constant 0: passed as None, so the
            # engine forms its coefficients without the gates' [b, b] products.
            if not cfg.use_momentum:
                et = None
            if not cfg.use_decay:
                al = None
                kw.pop("log_keep", None)
            return engine(p, m, k_, v_, q_, th, et, al, reset=rs, reset_to=p0,
                          inside_starts=inside, **kw)

        per_row = jax.vmap(one, in_axes=(0,) * 11 + (None, None, 0))

        def over_batch(p, m, k_, v_, q_, th, et, al, rs, p0, lk, sl, om_=None):
            # One vmap over the B * H rows, not one over B around one over H: with a single
            # batch dimension XLA's CPU dots ran the engine of a d_model 256, 4-head layer 1.5x
            # faster (fwd + bwd at T = 4096: 0.55 s -> 0.36 s). Shapes come from the operands:
            # under shard_map they are per shard.
            Bl, Hl = k_.shape[:2]
            flat = lambda x: x.reshape((Bl * Hl,) + x.shape[2:])  # noqa: E731
            flat_all = lambda xs: tuple(flat(x) for x in xs)  # noqa: E731
            if om_ is not None:   # the tail's in-document flags are per row: repeat over heads
                om_ = flat_all(om_[:4]) + (jnp.repeat(om_[4], Hl, axis=0),)
            reads, (P, S) = per_row(flat_all(p), flat_all(m), flat(k_), flat(v_), flat(q_),
                                    flat(th), flat(et), flat(al), jnp.repeat(rs, Hl, axis=0),
                                    flat_all(p0), None if lk is None else flat(lk), sl,
                                    starts_inside_chunks(rs, cfg.chunk_size), om_)
            unflat = lambda x: x.reshape((Bl, Hl) + x.shape[1:])  # noqa: E731
            return unflat(reads), (tuple(map(unflat, P)), tuple(map(unflat, S)))
        idt = self.inner_dtype
        cast = lambda xs: tuple(x.astype(idt) for x in xs)  # noqa: E731
        operands = (cast(params), cast(momentum), k.astype(idt), v.astype(idt), q.astype(idt),
                    theta.astype(idt), eta.astype(idt), alpha.astype(idt), reset, cast(reset_to),
                    None if log_keep is None else log_keep.astype(idt), state_length)
        if omega:   # no kernel for the Omega rule: the engines run "chunked" (pallas, auto)
            reads, (P, S) = over_batch(*operands, om)
        else:       # kernel engines run per shard of the current mesh (titans_lm.memory.sharded)
            reads, (P, S) = sharded.run_engine(over_batch, operands, impl=cfg.impl, batch=B,
                                               heads=cfg.n_heads)
        return self._normalised(reads), (P, S)

    def read(self, state: State, q_BHTD: jax.Array) -> jax.Array:
        """Retrieve from a state without writing: f(q; P) per batch and head -> [B, H, T, Dh]."""
        params, _ = state
        fn = functools.partial(memory_read, model=self.model)
        q = self._features(q_BHTD.astype(self.inner_dtype))
        return self._normalised(jax.vmap(jax.vmap(fn))(params, q))

    def _features(self, x):
        """[..., Dh] -> [..., key_width]: Atlas' polynomial features with feature_map "poly"
        (``titans_lm.memory.features.poly_features``), else unchanged. Applied where q and k
        enter the engine (:meth:`scan`, :meth:`read`), so carried buffers keep width Dh."""
        if self.cfg.feature_map != "poly":
            return x
        return poly_features(x, self.cfg.feature_degree)

    def _normalised(self, reads):
        """With read_normalizer: [..., Dh + 1] -> [..., Dh], the read divided by its normaliser
        column phi(q) z (>= 0: positive features, dot bias, zero W0) plus norm_eps, so a read
        before any write (padding, nothing written) is 0, never 0 / 0 (Katharopoulos et al. 2020,
        eq. 6 with the eps of common implementations). Unchanged without it."""
        if not self.cfg.read_normalizer:
            return reads
        return reads[..., :-1] / (reads[..., -1:] + self.cfg.norm_eps)

    def output(self, reads_BHTD: jax.Array, x_BTD: jax.Array) -> jax.Array:
        """RMSNorm per head, output gate SiLU(x W_g), projection W_O: -> [B, T, D] (compute dtype)."""
        cfg = self.cfg
        cdt = self.compute_dtype
        r = reads_BHTD.astype(jnp.promote_types(jnp.float32, cdt))
        r = r * jax.lax.rsqrt(jnp.mean(r ** 2, axis=-1, keepdims=True) + cfg.norm_eps)
        r = channel_scale(jnp.transpose(r, (0, 2, 1, 3)).astype(cdt),
                          self.norm_scale[...].astype(cdt))
        if cfg.use_output_gate:
            gate = project(x_BTD.astype(cdt), self.w_gate[...].astype(cdt))  # btd,dhk->bthk
            r = r * jax.nn.silu(gate)
        return project(r, self.w_out[...].astype(cdt), 2)  # einsum bthk,hkd->btd

    def init_state(self, batch_size: int) -> MemoryState:
        """The state of a stream that has seen nothing: (W0, 0) at a chunk start, reset to W0,
        an empty buffer and a zero conv tail (``titans_lm.memory.carried.empty_state``). The
        layer's one state constructor: a wiring that needs the bare (params, momentum) pair at a
        document start (MAC) takes ``state.params, state.momentum`` of it.

        Raises:
          ValueError: for batch_size < 1.
        """
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        cfg, B = self.cfg, int(batch_size)
        tail = ()
        if cfg.use_conv:
            tail = tuple(jnp.zeros((B, cfg.conv_kernel - 1, cfg.n_heads, cfg.head_dim),
                                   self.compute_dtype) for _ in range(3))
        return empty_state(self._w0(B), chunk_size=cfg.chunk_size, head_dim=cfg.head_dim,
                           inner_dtype=self.inner_dtype, conv_tail=tail,
                           omega_window=cfg.omega_window)

    def reset_memory(self, state: MemoryState, rows_B: jax.Array) -> MemoryState:
        """The mixer protocol's memory reset: ``titans_lm.memory.carried.reset_rows``."""
        return reset_rows(state, rows_B)

    def memory_norms(self, state: MemoryState) -> tuple[jax.Array]:
        """``(||P|| / ||W0||,)`` of the state's chunk-start memory (``titans_lm.memory.stats``)."""
        return (memory_stats.memory_norm(state.params, self.initial_params()),)

    def __call__(self, x_BTD: jax.Array, stream, state: MemoryState
                 ) -> tuple[jax.Array, MemoryState]:
        """One call of a stream: y_BTD and the state after it (module docstring).

        Args:
          x_BTD: [B, T, D] layer input.
          stream: the call's :class:`titans_lm.nn.stream.Stream`.
          state: the :class:`MemoryState` before the call (``init_state(B)`` for a new stream).
        Returns:
          (y_BTD [B, T, D] in the compute dtype, the MemoryState after the call). Equal, for any
          split of a sequence into consecutive calls, to one call over the whole sequence.
        Raises:
          ValueError: for a wrong input width or stream shape.
        """
        cfg = self.cfg
        b = cfg.chunk_size
        B, T, _ = self._check_input(x_BTD)
        fresh = bool(getattr(stream, "fresh", False))
        tokens, tail = self._tokens(x_BTD, stream, () if fresh else state.conv_tail)
        prefix = jnp.all(stream.segment_ids == PERSISTENT_SEGMENT_ID)   # the persistent pass
        if fresh:   # static: no buffer, the chunk grid starts at token 0
            n, seq = 0, tokens
        else:
            n = state.n_buf
            seq = with_buffer(state, tokens, n)
        m = n + T                    # tokens of the current chunk grid, buffered ones included
        n_next = m % b               # tokens after the last chunk start
        if fresh and T % b == 0:     # static: the call ends on a chunk boundary
            length = None
        else:
            length = jnp.where(prefix, m, m - n_next)
        inputs = self._finish(seq)
        om = state.omega   # the Omega window's tail before the chunk start (omega_window > 1)
        reads, (P, S) = self.scan((state.params, state.momentum), inputs.q, inputs.k, inputs.v,
                                  inputs.theta, inputs.eta, inputs.alpha, inputs.reset,
                                  reset_to=state.reset_to, state_length=length,
                                  log_keep=inputs.log_keep, gamma=inputs.gamma,
                                  omega_tail=(om.tail_k, om.tail_v, om.tail_gamma,
                                              om.tail_valid) if om else None)
        if not fresh:
            reads = jax.lax.dynamic_slice_in_dim(reads, n, T, axis=2)
        y = self.output(reads, x_BTD)
        new_state = next_state(state, seq, P, S, m - n_next, prefix, n_next, tail,
                               inner_dtype=self.inner_dtype)
        return y, new_state

    # ----------------------------------------------------------------------------- helpers
    def _l2_normalize(self, x):
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps)

    def _check_input(self, x_BTD):
        if x_BTD.ndim != 3 or x_BTD.shape[-1] != self.cfg.d_model:
            raise ValueError(f"x_BTD must be [B, T, d_model={self.cfg.d_model}], got {tuple(x_BTD.shape)}")
        return x_BTD.shape
