"""Inner (fast-weight) models of the memory: the function f(x; P) whose parameters P are the state.

Row vectors throughout: ``x`` [N, d_in] -> ``f(x; P)`` [N, d_out]. The parameters P are a tuple of
arrays; a 2-D entry is a weight matrix applied as ``h @ W`` ([d_in_l, d_out_l]), a 1-D entry is a
vector (bias, LayerNorm scale or shift) broadcast over the rows. Layouts:

* :class:`LinearMemory`: ``(W,)`` with W [d_k, d_v]; with ``bias=True``: ``(W, b)``, b [d_v].
  f(x) = x W (+ b). Titans' L_M = 1 memory; TTT-Linear's inner model.
* :class:`MLPMemory` of depth L (2..4 weight matrices): ``(W_1, ..., W_L)`` with
  W_1 [d_k, h], W_l [h, h], W_L [h, d_v]; with ``bias=True`` each W_l is followed by its bias:
  ``(W_1, b_1, ..., W_L, b_L)``. f(x) = act(... act(x W_1 + b_1) ...) W_L + b_L.
  Titans' deep memory (L_M >= 2, arXiv:2501.00663 sec. 3.1); TTT-MLP's inner model (L = 2, GELU).
* :class:`SwiGLUMemory`: ``(W_1, W_3, W_2)`` with W_1, W_3 [d_k, h], W_2 [h, d_v], no biases.
  f(x) = (silu(x W_1) * (x W_3)) W_2, the gated MLP of Shazeer (2020) as fast weights: LaCT's
  inner model (Zhang et al. 2025, arXiv:2505.23884), whose column-vector form
  W_down (silu(W_gate x) * (W_up x)) this is, transposed. W_1 and W_3 both take x: two matrices,
  each applied once, so the chunked dual form holds as for any MLP.
* :class:`ResidualLN` wraps an inner model g with d_k = d_v: f(x) = x + LN(g(x)), LN over the
  last axis with a learned scale and shift. Layout: g's parameters, then
  ``(ln_scale [d_v], ln_shift [d_v])``, fast weights or (``fast_ln=False``, TTT) outer-loop
  parameters that the inner loop leaves unchanged (:meth:`InnerModel.outer_params`). TTT's
  residual + LayerNorm inner model (arXiv:2407.04620 sec. 2.7): fitting f(k) to v is fitting
  LN(g(k)) to v - k.

Every model computes its forward through a :class:`ParamAccess` object instead of touching the
parameters directly. The same forward code then serves a plain evaluation (:class:`PlainAccess`),
the per-token gradient factors at a chunk-start state, and the dual-form read that never
materialises per-token weight matrices (both in :mod:`titans_lm.memory.chunked`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Protocol, Sequence

import jax
import jax.numpy as jnp

from titans_lm.memory.biases import DEFAULT_BIAS, get_bias

Params = tuple[jax.Array, ...]

_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}

LN_EPS = 1e-6


class ParamAccess(Protocol):
    """How a forward pass reads parameter ``index`` of the inner model."""

    def matmul(self, index: int, h: jax.Array) -> jax.Array:
        """``h @ P[index]`` for a weight matrix: h [N, d_in] -> [N, d_out]."""

    def vector(self, index: int) -> jax.Array:
        """A vector parameter, broadcastable against [N, d]: shape [d] or [N, d]."""


class PlainAccess:
    """Reads the parameters as they are (one shared set of parameters for all rows)."""

    def __init__(self, params: Sequence[jax.Array]):
        self.params = params

    def matmul(self, index: int, h: jax.Array) -> jax.Array:
        return h @ self.params[index]

    def vector(self, index: int) -> jax.Array:
        return self.params[index]


class InnerModel(abc.ABC):
    """Spec of an inner model: hashable, so it can be a static argument of jit.

    Subclasses implement :meth:`forward`, :meth:`param_shapes` and :meth:`check_params`.
    """

    @abc.abstractmethod
    def forward(self, access: ParamAccess, x: jax.Array) -> jax.Array:
        """f(x; P) with the parameters read through ``access``: x [N, d_in] -> [N, d_out]."""

    @abc.abstractmethod
    def param_shapes(self, d_in: int, d_out: int) -> tuple[tuple[int, ...], ...]:
        """Shapes of the parameter tuple for a memory mapping d_in -> d_out."""

    @abc.abstractmethod
    def check_params(self, params: Sequence[jax.Array]) -> tuple[int, int]:
        """Validate a parameter tuple; return (d_in, d_out).

        Raises:
          ValueError: naming the first parameter whose count, rank or shape does not fit.
        """

    @abc.abstractmethod
    def _init_one(self, rng: jax.Array, index: int, shape: tuple[int, ...], dtype) -> jax.Array:
        """Initial value of parameter ``index``."""

    def init(self, rng: jax.Array, d_in: int, d_out: int, dtype=jnp.float32) -> Params:
        """Initial parameters (e.g. the learned W0 of a head) for a memory d_in -> d_out.

        Weight matrices are LeCun-normal (std 1/sqrt(fan_in)), biases and LN shifts zero,
        LN scales one.

        Args:
          rng: a PRNG key.
          d_in, d_out: key and value widths (d_k, d_v).
          dtype: parameter dtype.
        Returns:
          the parameter tuple in the layout of the class docstring.
        """
        shapes = self.param_shapes(d_in, d_out)
        keys = jax.random.split(rng, len(shapes))
        return tuple(self._init_one(keys[i], i, s, dtype) for i, s in enumerate(shapes))

    def outer_params(self) -> frozenset[int]:
        """Indices of parameters the inner loop does not update (outer-loop parameters).

        They take part in f and in the inner gradients, but keep their chunk-start (initial)
        value through the whole sequence; only the outer loss trains them (through params0 and
        reset_to). Default: none, every parameter is a fast weight.
        """
        return frozenset()

    def apply(self, params: Sequence[jax.Array], x: jax.Array) -> jax.Array:
        """f(x; P): x [N, d_in] -> [N, d_out] (a single row vector [d_in] works as well)."""
        if x.ndim == 1:
            return self.forward(PlainAccess(tuple(params)), x[None])[0]
        return self.forward(PlainAccess(tuple(params)), x)

    def loss(self, params: Sequence[jax.Array], k: jax.Array, v: jax.Array,
             bias=DEFAULT_BIAS) -> jax.Array:
        """Inner loss summed over rows: sum_t l(f(k_t; P), v_t) with the attentional bias l
        (:mod:`titans_lm.memory.biases`, a name or an ``AttentionalBias``; "l2":
        ||f(k_t; P) - v_t||^2, Titans eq. 12, no 1/2).
        k [N, d_k], v [N, d_v] -> scalar."""
        return get_bias(bias).loss(self.apply(params, k), v)


def _lecun(rng, shape, dtype):
    return jax.random.normal(rng, shape, dtype) / math.sqrt(shape[0])


def _check_matrix(params, i, d_in, d_out, name):
    p = params[i]
    if p.ndim != 2 or (d_in is not None and p.shape[0] != d_in) or (d_out is not None and p.shape[1] != d_out):
        want = f"[{d_in if d_in is not None else '*'}, {d_out if d_out is not None else '*'}]"
        raise ValueError(f"inner model {name}: parameter {i} must be a matrix of shape {want}, "
                         f"got shape {tuple(p.shape)}")
    return p.shape


def _check_vector(params, i, d, name):
    p = params[i]
    if p.ndim != 1 or p.shape[0] != d:
        raise ValueError(f"inner model {name}: parameter {i} must be a vector of shape [{d}], "
                         f"got shape {tuple(p.shape)}")


def _check_count(params, n, name, layout):
    if len(params) != n:
        raise ValueError(f"inner model {name}: expected {n} parameter arrays {layout}, got {len(params)}")


@dataclasses.dataclass(frozen=True)
class LinearMemory(InnerModel):
    """f(x) = x W (+ b). Layout ``(W,)`` or, with ``bias``, ``(W, b)``; W [d_in, d_out]."""

    bias: bool = False

    def forward(self, access, x):
        y = access.matmul(0, x)
        return y + access.vector(1) if self.bias else y

    def param_shapes(self, d_in, d_out):
        return ((d_in, d_out), (d_out,)) if self.bias else ((d_in, d_out),)

    def check_params(self, params):
        name = repr(self)
        _check_count(params, 2 if self.bias else 1, name, "(W, b)" if self.bias else "(W,)")
        d_in, d_out = _check_matrix(params, 0, None, None, name)
        if self.bias:
            _check_vector(params, 1, d_out, name)
        return d_in, d_out

    def _init_one(self, rng, index, shape, dtype):
        return _lecun(rng, shape, dtype) if len(shape) == 2 else jnp.zeros(shape, dtype)


@dataclasses.dataclass(frozen=True)
class MLPMemory(InnerModel):
    """MLP with ``depth`` weight matrices (2..4), activation between them, optional biases.

    Layout ``(W_1, ..., W_L)`` or, with ``bias``, ``(W_1, b_1, ..., W_L, b_L)``. The hidden width
    is read from the parameters; ``expansion`` only sets it in :meth:`init`
    (hidden = round(expansion * d_in)), or ``hidden`` when > 0 (a key wider than the values:
    polynomial features, whose hidden width follows the values).
    """

    depth: int = 2
    expansion: float = 4.0
    activation: str = "silu"
    bias: bool = False
    hidden: int = 0

    def __post_init__(self):
        if not 2 <= self.depth <= 4:
            raise ValueError(f"MLPMemory.depth must be in 2..4, got {self.depth}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"MLPMemory.activation must be one of {sorted(_ACTIVATIONS)}, "
                             f"got {self.activation!r}")
        if self.expansion <= 0:
            raise ValueError(f"MLPMemory.expansion must be positive, got {self.expansion}")

    @property
    def _stride(self):
        return 2 if self.bias else 1

    def forward(self, access, x):
        act = _ACTIVATIONS[self.activation]
        h = x
        for layer in range(self.depth):
            i = layer * self._stride
            h = access.matmul(i, h)
            if self.bias:
                h = h + access.vector(i + 1)
            if layer < self.depth - 1:
                h = act(h)
        return h

    def hidden_width(self, d_in: int) -> int:
        if self.hidden > 0:
            return self.hidden
        return max(1, int(round(self.expansion * d_in)))

    def param_shapes(self, d_in, d_out):
        hidden = self.hidden_width(d_in)
        dims = [d_in] + [hidden] * (self.depth - 1) + [d_out]
        shapes = []
        for layer in range(self.depth):
            shapes.append((dims[layer], dims[layer + 1]))
            if self.bias:
                shapes.append((dims[layer + 1],))
        return tuple(shapes)

    def check_params(self, params):
        name = repr(self)
        layout = "(W_1, b_1, ..., W_L, b_L)" if self.bias else "(W_1, ..., W_L)"
        _check_count(params, self.depth * self._stride, name, layout)
        d_prev = None
        d_in = None
        for layer in range(self.depth):
            i = layer * self._stride
            shape = _check_matrix(params, i, d_prev, None, name)
            d_in = shape[0] if d_in is None else d_in
            d_prev = shape[1]
            if self.bias:
                _check_vector(params, i + 1, d_prev, name)
        return d_in, d_prev

    def _init_one(self, rng, index, shape, dtype):
        return _lecun(rng, shape, dtype) if len(shape) == 2 else jnp.zeros(shape, dtype)


@dataclasses.dataclass(frozen=True)
class SwiGLUMemory(InnerModel):
    """f(x) = (silu(x W_1) * (x W_3)) W_2, no biases: LaCT's SwiGLU fast weights.

    Layout ``(W_1, W_3, W_2)``: W_1 (gate) and W_3 (up) [d_in, h], W_2 (down) [h, d_out]. The
    hidden width h is read from the parameters; ``expansion`` sets it in :meth:`init`
    (h = round(expansion * d_in); LaCT: 1), or ``hidden`` when > 0. Every matrix is
    LeCun-normal at init (std 1/sqrt(fan_in), as LaCT's fast weights).
    """

    expansion: float = 1.0
    hidden: int = 0

    def __post_init__(self):
        if self.expansion <= 0:
            raise ValueError(f"SwiGLUMemory.expansion must be positive, got {self.expansion}")

    def forward(self, access, x):
        return access.matmul(2, jax.nn.silu(access.matmul(0, x)) * access.matmul(1, x))

    def hidden_width(self, d_in: int) -> int:
        return self.hidden if self.hidden > 0 else max(1, int(round(self.expansion * d_in)))

    def param_shapes(self, d_in, d_out):
        h = self.hidden_width(d_in)
        return ((d_in, h), (d_in, h), (h, d_out))

    def check_params(self, params):
        name = repr(self)
        _check_count(params, 3, name, "(W_1, W_3, W_2)")
        d_in, h = _check_matrix(params, 0, None, None, name)
        _check_matrix(params, 1, d_in, h, name)
        _, d_out = _check_matrix(params, 2, h, None, name)
        return d_in, d_out

    def _init_one(self, rng, index, shape, dtype):
        return _lecun(rng, shape, dtype)


@dataclasses.dataclass(frozen=True)
class ResidualLN(InnerModel):
    """f(x) = x + LN(g(x)), TTT's residual + LayerNorm inner model (arXiv:2407.04620 sec. 2.7).

    Layout: the parameters of ``inner`` followed by ``(ln_scale [d], ln_shift [d])``; requires
    d_in = d_out = d. LN normalises over the last axis with epsilon 1e-6.

    ``fast_ln``: True makes the LN scale and shift fast weights updated by the inner loop;
    False (TTT, ttt-lm-jax ``ttt_norm``) makes them outer-loop parameters
    (:meth:`InnerModel.outer_params`): they keep their initial value and only the outer loss
    trains them.
    """

    inner: InnerModel = dataclasses.field(default_factory=LinearMemory)
    fast_ln: bool = True

    def outer_params(self):
        if self.fast_ln:
            return self.inner.outer_params()
        n = self._scale_index
        return self.inner.outer_params() | {n, n + 1}

    def forward(self, access, x):
        g = self.inner.forward(access, x)
        mean = jnp.mean(g, axis=-1, keepdims=True)
        var = jnp.mean((g - mean) ** 2, axis=-1, keepdims=True)
        normed = (g - mean) * jax.lax.rsqrt(var + LN_EPS)
        i = self._scale_index
        return x + normed * access.vector(i) + access.vector(i + 1)

    @property
    def _scale_index(self) -> int:
        # The inner model's parameter count does not depend on the sizes.
        return len(self.inner.param_shapes(1, 1))

    def param_shapes(self, d_in, d_out):
        if d_in != d_out:
            raise ValueError(f"ResidualLN needs d_in == d_out, got {d_in} and {d_out}")
        return self.inner.param_shapes(d_in, d_out) + ((d_out,), (d_out,))

    def check_params(self, params):
        n = self._scale_index
        if len(params) != n + 2:
            raise ValueError(f"inner model {self!r}: expected {n + 2} parameter arrays "
                             f"(inner parameters, ln_scale, ln_shift), got {len(params)}")
        d_in, d_out = self.inner.check_params(tuple(params[:n]))
        if d_in != d_out:
            raise ValueError(f"inner model {self!r}: the residual needs d_in == d_out, "
                             f"got {d_in} and {d_out}")
        _check_vector(params, n, d_out, repr(self))
        _check_vector(params, n + 1, d_out, repr(self))
        return d_in, d_out

    def _init_one(self, rng, index, shape, dtype):
        n = self._scale_index
        if index < n:
            return self.inner._init_one(rng, index, shape, dtype)
        return jnp.ones(shape, dtype) if index == n else jnp.zeros(shape, dtype)


_SHORTHANDS = {
    "linear": LinearMemory(),
    "mlp": MLPMemory(depth=2, activation="silu", bias=False),
    "swiglu": SwiGLUMemory(),
}


def resolve_model(model: InnerModel | str) -> InnerModel:
    """Turn a shorthand ("linear", "mlp": depth 2, SiLU, no biases; "swiglu": SwiGLU of
    expansion 1) or a spec into a spec.

    Raises:
      ValueError: for an unknown shorthand or an object that is not an InnerModel.
    """
    if isinstance(model, InnerModel):
        return model
    if isinstance(model, str):
        if model not in _SHORTHANDS:
            raise ValueError(f"unknown inner model {model!r}; use one of {sorted(_SHORTHANDS)} "
                             f"or an InnerModel instance")
        return _SHORTHANDS[model]
    raise ValueError(f"model must be an InnerModel or one of {sorted(_SHORTHANDS)}, got {model!r}")


def make_inner_model(depth: int, *, expansion: float = 4.0, activation: str = "silu",
                     bias: bool = False, residual_ln: bool = False,
                     fast_ln: bool = True, hidden: int = 0) -> InnerModel:
    """The inner model of a memory of ``depth`` layers (1 = linear, 2..4 = MLP; ``hidden`` > 0
    fixes an MLP's hidden width, else expansion * d_in). ``activation="swiglu"`` with depth 2 and
    no bias is :class:`SwiGLUMemory` (the gate is the activation: three matrices).

    ``residual_ln`` wraps it as x + LN(g(x)) (:class:`ResidualLN`), whose LN scale and shift are
    fast weights with ``fast_ln`` and outer-loop parameters without.

    Raises:
      ValueError: for a depth outside 1..4, an unknown activation, or "swiglu" with a depth other
        than 2 or with bias.
    """
    if activation == "swiglu":
        if depth != 2 or bias:
            raise ValueError(f"the 'swiglu' inner model has depth 2 and no biases, got depth "
                             f"{depth} and bias={bias}; set memory_depth 2 and memory_bias False")
        swiglu = SwiGLUMemory(expansion=expansion, hidden=hidden)
        return ResidualLN(swiglu, fast_ln=fast_ln) if residual_ln else swiglu
    if depth == 1:
        base: InnerModel = LinearMemory(bias=bias)
    elif 2 <= depth <= 4:
        base = MLPMemory(depth=depth, expansion=expansion, activation=activation, bias=bias,
                         hidden=hidden)
    else:
        raise ValueError(f"memory depth must be in 1..4, got {depth}")
    return ResidualLN(base, fast_ln=fast_ln) if residual_ln else base
