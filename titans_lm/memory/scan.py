"""The memory engine's one entry point: validate inputs, then dispatch to an implementation.

All implementations share one contract (docs/design.md#implementations-one-contract) and agree to ~1e-10 in float64 on the
reads, the final state and every gradient. Adding one is one line in ``IMPLEMENTATIONS``
(``"name": "module.path:function"``, imported lazily on first use) or a call to
:func:`register_implementation`. An implementation is called as

    fn(params0, momentum0, k, v, q, theta, eta, alpha, reset, *, model, chunk_size, read,
       reset_to, [state_length,] **impl_options) -> (reads [T, d_v], (params_L, momentum_L))

with validated inputs: tuples of arrays for the states, one floating dtype for everything, an
:class:`~titans_lm.memory.inner_models.InnerModel` spec for ``model`` and a [T] bool ``reset``;
``running_mean=True``, ``log_keep`` (a [T] array), ``state_length`` (an int32 scalar, possibly
traced), ``no_momentum=True`` and ``no_decay=True`` (eta, resp. alpha, is then an array of zeros
to ignore) arrive as keyword arguments only when the caller sets them (built-in implementations take
``running_mean`` and ``log_keep``; ``alpha`` is then still an array). An implementation that
supports ``state_length`` returns the state after that many tokens. The Omega rule's
``omega_window`` (an int > 1), ``gamma`` ([T]) and ``omega_tail`` (a tuple, or absent) arrive the
same way, only for a window > 1 and only to implementations that name ``omega_window``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory.biases import DEFAULT_BIAS, get_bias
from titans_lm.memory.chunked import starts_inside_chunks
from titans_lm.memory.delta import check_delta_model
from titans_lm.memory.inner_models import InnerModel, resolve_model
from titans_lm.memory.newton_schulz import NS_GRADIENTS
from titans_lm.nn.segments import is_concrete

IMPLEMENTATIONS: dict[str, str | Callable] = {
    "reference": "titans_lm.memory.reference:reference_scan",
    "chunked": "titans_lm.memory.chunked:chunked_scan",
    # Pallas kernels (titans_lm/memory/pallas/): "pallas" runs the fused kernel (interpreted on
    # CPU); "auto" is "pallas" on GPU/TPU and "chunked" on CPU.
    "pallas": "titans_lm.memory.pallas.scan:pallas_scan",
    "auto": "titans_lm.memory.pallas.scan:auto_scan",
}

READ_MODES = ("after_write", "chunk_start")
GRADIENT_AT = ("chunk_start", "previous_token")
DECAY_TARGETS = ("zero", "initial")


def register_implementation(name: str, fn: str | Callable) -> None:
    """Add (or replace) an implementation: a callable or a lazy "module:function" path."""
    IMPLEMENTATIONS[name] = fn


def get_implementation(name: str) -> Callable:
    """The implementation registered under ``name``.

    Raises:
      ValueError: for an unknown name (listing the known ones).
    """
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown memory implementation {name!r}; known: {sorted(IMPLEMENTATIONS)}")
    fn = IMPLEMENTATIONS[name]
    if isinstance(fn, str):
        module, attr = fn.split(":")
        fn = getattr(importlib.import_module(module), attr)
        IMPLEMENTATIONS[name] = fn
    return fn


def _as_params(tree, name) -> tuple:
    if not isinstance(tree, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of arrays (the inner model's parameters in order), "
                         f"got {type(tree).__name__}")
    return tuple(jnp.asarray(p) for p in tree)


def _check_same_structure(a, b, name_a, name_b):
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError(f"{name_b} must have the structure and shapes of {name_a}: "
                         f"{[tuple(x.shape) for x in a]} vs {[tuple(y.shape) for y in b]}")


def check_gates(theta, eta, alpha=None, log_keep=None) -> None:
    """Raise ValueError for gates outside their ranges (concrete arrays only; any shape).

    theta >= 0, 0 <= eta <= 1, 0 <= alpha <= 1, log_keep <= 0 (NaN fails every check). Arrays that
    are tracers (under jax.jit, vmap or grad) are not checked: their values are unknown until the
    computation runs. Out-of-range gates under jit are not clamped: they produce numbers that no
    recurrence defines and that differ between implementations (the chunked and pallas segment
    products take logs of the gates). The layer's gates are in range by construction
    (:mod:`titans_lm.memory.gates`).
    """
    checks = (("theta", theta, lambda g: g >= 0, ">= 0 (an inner learning rate)"),
              ("eta", eta, lambda g: (g >= 0) & (g <= 1), "in [0, 1] (a momentum decay)"),
              ("alpha", alpha, lambda g: (g >= 0) & (g <= 1), "in [0, 1] (a forget gate)"),
              ("log_keep", log_keep, lambda g: g <= 0, "<= 0 (log(1 - alpha))"))
    for name, g, ok, want in checks:
        if g is None or not is_concrete(g):
            continue
        g = np.asarray(g)
        bad = ~ok(g)
        if bad.any():
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), g.shape))
            raise ValueError(f"{name} must be {want} at every token; {name}{list(first)} = "
                             f"{float(g[first])} ({int(bad.sum())} bad value(s)). Build the gates with "
                             f"titans_lm.memory.gates or clip them before memory_scan")


def memory_scan(params0, momentum0, k, v, q, theta, eta, alpha, *, model: InnerModel | str,
                chunk_size: int, impl: str = "chunked", read: str = "after_write", reset=None,
                reset_to=None, running_mean: bool = False, log_keep=None, state_length=None,
                attentional_bias: str = DEFAULT_BIAS, gradient_at: str = "chunk_start",
                decay_target: str = "zero", ns_steps: int = 0, ns_gradient: str = "exact",
                fast_weight_norm: bool = False, omega_window: int = 1, gamma=None, omega_tail=None,
                omega_normalize: bool = False, **impl_options):
    """Run the neural memory over one head's sequence: write every token, read every query.

    Titans' long-term memory (Behrouz et al. 2025, arXiv:2501.00663, eqs. 12-15) with mini-batch
    gradient descent over chunks of ``chunk_size`` tokens (t' = start of t's chunk):

        l(P; k_t, v_t) = ||f(k_t; P) - v_t||^2                (no 1/2)
        S_t = eta_t S_{t-1} - theta_t grad_P l(P_{t'}; k_t, v_t)
        P_t = (1 - alpha_t) P_{t-1} + S_t
        read_t = f(q_t; P_t)   (read="after_write": after token t's own write; causal)
               = f(q_t; P_{t'}) (read="chunk_start": the state before the chunk, as MAC retrieves)

    chunk_size = 1 is online gradient descent (with momentum and decay); eta = alpha = 0 is TTT's
    mini-batch GD; a linear f with chunk_size 1 and eta = alpha = 0 is the delta rule with
    beta_t = 2 theta_t. Works under jax.jit, jax.vmap (batch, heads) and jax.grad of every input.
    Inputs are validated eagerly, then the implementation runs under ``jax.jit`` with the model,
    chunk size, read mode and non-array options static: called outside jit it compiles once per
    configuration and shapes, not per call (inside an outer jit the nested jit is inlined).

    Args:
      params0: tuple of the inner model's parameters at t = 0 (layouts in
        :mod:`titans_lm.memory.inner_models`; linear: ``(W,)`` with W [d_k, d_v]).
      momentum0: tuple with the same shapes, the momentum S at t = 0 (zeros for a fresh memory).
      k: [T, d_k] keys; v: [T, d_v] values; q: [T, d_k] queries.
      theta: [T] inner learning rates (>= 0; theta = 0 writes nothing).
      eta: [T] momentum decays in [0, 1]; alpha: [T] forget gates in [0, 1] (None when
        log_keep is given). Outside jit out-of-range gates raise ValueError; under jit they are
        not checked (see :func:`check_gates`). ``eta=None``: a memory without momentum (eta = 0
        at every token); ``alpha=None`` with ``log_keep=None``: one without decay (alpha = 0).
        Both give the numbers of zero arrays, but known before tracing: "chunked" (and "auto" /
        "pallas" where they run it) then forms the chunk coefficients without the [b, b] gate
        products (``no_momentum`` / ``no_decay``, passed to the implementations that name them;
        the others get arrays of zeros). TTT and LaCT run so.
      model: an InnerModel spec, or "linear" / "mlp" (depth 2, SiLU, no biases).
      chunk_size: mini-batch size b >= 1 of the inner gradient descent. T need not be a multiple
        of it (the last chunk is partial) and may be smaller than it.
      impl: "chunked" (dual form, default), "reference" (token by token), "pallas" (fused
        kernel), "auto" (pallas on GPU/TPU, chunked on CPU), or any registered one.
      read: "after_write" or "chunk_start" (see above).
      reset: optional [T] bool document starts, at any position: before a token with
        reset=True the state returns to (reset_to, 0) and a new mini-batch begins there (a start
        inside a chunk cuts that chunk in two; the chunk grid stays at multiples of chunk_size).
        Exact in every implementation (docs/design.md#resets-inside-a-chunk).
      reset_to: the parameters a reset restores (default: params0); same structure as params0.
      running_mean: TTT's reads inside a mini-batch (Sun et al. 2024; ttt-lm-jax ``token_idx``):
        the read at position j (0-based) of its chunk sees the gradient terms scaled by
        b / (j + 1), i.e. with theta carrying 1/b, the mean of the j + 1 gradients so far; the
        state after each chunk (and the read at its last position) is unchanged.
      log_keep: optional [T] log(1 - alpha), the forget gate in log form (from the gate's
        pre-activation a: log_sigmoid(-a)); when given it is used for every decay product and
        its gradient, and alpha is ignored. Keeps the precision that 1 - alpha loses in float32
        near alpha -> 0 and -> 1.
      state_length: None, or the number L of leading tokens whose state is returned: an int in
        0..T, or an integer scalar that may be traced (values outside 0..T are clipped). The
        reads are still those of all T tokens (causal); the returned state is the one after token
        L - 1 (before any reset of token L), (params0, momentum0) for L = 0. A carried memory
        uses it to return the state at the start of the chunk that a call ends inside.
        Supported by "reference" and "chunked"; "pallas" (and "auto" on GPU/TPU) run "chunked"
        when it is given.
      attentional_bias: the inner loss l(f(k), v) (:mod:`titans_lm.memory.biases`): a name,
        "l2" (default, ||f(k) - v||^2), "dot" (-2 <f(k), v>, Hebbian), "lp" (||f(k) - v||_p^p
        with p = 2) or "huber" (delta = 1), or an ``AttentionalBias`` for another p or delta
        (``titans_lm.memory.biases.get_bias("lp", p=3.0)``). Implementations "chunked" and
        "reference" only (passed, like the next option, only when not the default, as an
        ``AttentionalBias``).
      gradient_at: "chunk_start" (default: mini-batch gradient descent, above) or
        "previous_token": online gradient descent with token t's gradient taken at the decayed
        state just before its write, (1 - alpha_t) P_{t-1} (Gated DeltaNet's order; Titans takes
        it before the decay): W_t = a_t (I - beta_t k_t^T k_t) W_{t-1} + beta_t k_t^T v_t with
        a = 1 - alpha and beta = 2 theta. Needs a linear memory without bias, the l2 bias, eta = 0
        and no running mean or surprise clip; "chunked" runs it in the WY form of
        :mod:`titans_lm.memory.delta`, exact for any chunk_size (the chunk size then sets only
        the work per step, not the math).
      decay_target: "zero" (default, eq. 14: the forget gate decays the state toward 0) or
        "initial": toward ``reset_to``, the state a document starts from,
        P_t = (1 - alpha_t) P_{t-1} + alpha_t reset_to + S_t (a retention term
        ||P - reset_to||^2 instead of ||P||^2, in MIRAS' terms; docs/design.md#retention-toward-the-initial-state).
        A state carried for any length then stays near the states training saw. With
        gradient_at "chunk_start"; "pallas" (and "auto" on GPU/TPU) run "chunked" for it.
      ns_steps: k >= 0 Newton-Schulz steps on the momentum (Atlas' Muon rule, arXiv:2505.23735;
        docs/design.md#newton-schulz-momentum): k > 0 accumulates raw gradients,
        S_t = eta_t S_{t-1} - G_t, and writes P_t = (1 - alpha_t) P_{t-1} + theta_t NS_k(S_t) per
        weight matrix (theta_t S_t per vector parameter), NS_k Muon's quintic map
        (:func:`titans_lm.memory.newton_schulz.newton_schulz`). 0 (default): the rule above.
        With gradient_at "chunk_start" and no running mean; composes with the surprise clip
        (on G_t) and both decay targets. "chunked" materialises each chunk's per-token states
        (O(chunk_size d_in d_out) memory per weight matrix); "pallas" (and "auto" on GPU/TPU)
        run "chunked" for it.
      ns_gradient: NS_k's backward: "exact" (default: automatic differentiation through the
        iterations) or "straight_through" (the identity; Atlas' estimator).
      fast_weight_norm: LaCT's weight normalisation (Zhang et al. 2025): at every mini-batch end
        (t % chunk_size == chunk_size - 1, the token before a document start, and t = T - 1),
        after that token's read, each weight matrix of the state is rescaled column by column
        to the column norms of ``reset_to`` (:mod:`titans_lm.memory.weight_norm`); vectors
        are left as they are. The state returned for ``state_length`` L >= 1 is normalised
        too. With gradient_at "chunk_start"; implemented by "chunked" and "reference";
        "pallas" (and "auto" on GPU/TPU) run "chunked" for it (logged once).
      omega_window: c >= 1 (default 1: the rule above). c > 1 is Atlas' Omega rule (Behrouz et
        al. 2025, arXiv:2505.23735, sec. 3; docs/design.md#the-omega-rule): token t's gradient
        becomes u_t = sum_j gamma_j grad l(P_{t'}; k_j, v_j) over the window j = t - c + 1..t of
        t's document (every gradient at the same state as today's; the window reaches back
        before the chunk and the call, never into an earlier document). gamma_j depends on the
        token j only (Atlas' gamma_i^(t) may depend on t), so the window is a banded matrix.
        Implementations "chunked" and "reference" ("pallas" and "auto" run "chunked"); not with
        gradient_at "previous_token".
      gamma: [T] the Omega gates gamma_j in [0, 1] (with omega_window > 1 only, then required;
        outside jit out-of-range values raise ValueError).
      omega_tail: with omega_window > 1, None (a fresh stream: no token before token 0) or the
        c - 1 tokens before token 0, oldest first: (k [c - 1, d_k], v [c - 1, d_v],
        gamma [c - 1], valid bool [c - 1]); valid: the token is in the document that continues at
        token 0 (a start at token 0 still cuts it off). One call over a sequence equals calls
        over its parts when each passes the previous part's last c - 1 tokens here.
      omega_normalize: with omega_window > 1, divide each u_t by sum_j gamma_j over its window
        (the gates-weighted mean of the window's gradients; not in Atlas): a write's size no
        longer grows with c (:mod:`titans_lm.memory.omega`).
      **impl_options: passed to the implementation (chunked: ``chunks_per_checkpoint``).
        ``inside_starts`` (a bool scalar, possibly traced: does any document start inside a
        chunk? ``titans_lm.memory.chunked.starts_inside_chunks``) lets "chunked" and "pallas"
        skip the work of such starts where none occurs; where it is not given it is known before
        tracing (no reset, or a concrete one) or the exact path runs. Implementations that do
        not take it never see it.
    Returns:
      (reads [T, d_v], (params_L, momentum_L)): the state after the last token (after the first
      ``state_length`` tokens when given), in the common floating dtype of the inputs (float32
      or float64).
    Raises:
      ValueError: naming the first bad argument (shapes, ranks, chunk size, read mode, impl,
        parameter layout; outside jit also gate ranges).
    """
    model = resolve_model(model)
    params0 = _as_params(params0, "params0")
    momentum0 = _as_params(momentum0, "momentum0")
    reset_to = params0 if reset_to is None else _as_params(reset_to, "reset_to")
    d_in, d_out = model.check_params(params0)
    _check_same_structure(params0, momentum0, "params0", "momentum0")
    _check_same_structure(params0, reset_to, "params0", "reset_to")
    # None gates are constant zeros: no momentum (eta) / no decay (alpha and log_keep). The
    # implementations that name no_momentum / no_decay skip their products; the others get zeros.
    no_momentum, no_decay = eta is None, alpha is None and log_keep is None
    theta = jnp.asarray(theta)
    if no_momentum:
        eta = jnp.zeros(theta.shape, theta.dtype)
    if no_decay:
        alpha = jnp.zeros(theta.shape, theta.dtype)
    elif alpha is None:
        alpha = -jnp.expm1(jnp.asarray(log_keep))
    k, v, q, theta, eta, alpha = (jnp.asarray(x) for x in (k, v, q, theta, eta, alpha))
    if k.ndim != 2 or v.ndim != 2 or q.ndim != 2:
        raise ValueError(f"k, v, q must be [T, d] (one head; vmap over batch and heads), got shapes "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(q.shape)}")
    T = k.shape[0]
    if T < 1:
        raise ValueError("the sequence must have at least one token (T >= 1)")
    if k.shape != (T, d_in) or q.shape != (T, d_in):
        raise ValueError(f"k and q must be [T, d_k] = [{T}, {d_in}] for these parameters, got "
                         f"{tuple(k.shape)} and {tuple(q.shape)}")
    if v.shape != (T, d_out):
        raise ValueError(f"v must be [T, d_v] = [{T}, {d_out}] for these parameters, got {tuple(v.shape)}")
    if log_keep is not None:
        log_keep = jnp.asarray(log_keep)
    for name, g in (("theta", theta), ("eta", eta), ("alpha", alpha), ("log_keep", log_keep)):
        if g is not None and g.shape != (T,):
            raise ValueError(f"{name} must be [T] = [{T}] (one gate per token), got {tuple(g.shape)}")
    given_reset = reset is not None
    if reset is None:
        reset = jnp.zeros((T,), bool)
    else:
        reset = jnp.asarray(reset)
        if reset.shape != (T,):
            raise ValueError(f"reset must be [T] = [{T}], got {tuple(reset.shape)}")
        reset = reset.astype(bool)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if read not in READ_MODES:
        raise ValueError(f"read must be one of {READ_MODES}, got {read!r}")
    check_gates(theta, eta, None if log_keep is not None else alpha, log_keep)
    if state_length is not None:
        if isinstance(state_length, bool):
            raise ValueError(f"state_length must be an integer, got {state_length!r}")
        if isinstance(state_length, int):
            if not 0 <= state_length <= T:
                raise ValueError(f"state_length must be in 0..T = 0..{T}, got {state_length}")
        elif jnp.ndim(state_length) != 0 or not jnp.issubdtype(jnp.result_type(state_length),
                                                                jnp.integer):
            raise ValueError(f"state_length must be an integer scalar, got "
                             f"{getattr(state_length, 'dtype', type(state_length))} of shape "
                             f"{jnp.shape(state_length)}")
        impl_options["state_length"] = state_length
    fn = get_implementation(impl)
    bias = get_bias(attentional_bias)
    _check_rule(fn, impl, model, bias.name, gradient_at, eta, running_mean,
                impl_options.get("surprise_max_norm", 0.0), decay_target, fast_weight_norm)
    _check_newton_schulz(fn, impl, ns_steps, ns_gradient, gradient_at, running_mean,
                         fast_weight_norm)
    if ns_steps:
        impl_options.update(ns_steps=ns_steps, ns_gradient=ns_gradient)
    if bias.name != DEFAULT_BIAS:
        impl_options["attentional_bias"] = bias
    if gradient_at != GRADIENT_AT[0]:
        impl_options["gradient_at"] = gradient_at
    if decay_target != DECAY_TARGETS[0]:
        impl_options["decay_target"] = decay_target
    if fast_weight_norm:
        impl_options["fast_weight_norm"] = True
    for name, constant in (("no_momentum", no_momentum), ("no_decay", no_decay)):
        if constant and _accepts(fn, name):
            impl_options[name] = True
    impl_options.update(_check_omega(fn, impl, omega_window, gamma, omega_tail, gradient_at, k, v,
                                     omega_normalize))
    if _accepts(fn, "inside_starts"):
        if impl_options.get("inside_starts") is None:
            impl_options["inside_starts"] = _inside_starts(given_reset, reset, chunk_size)
    else:
        impl_options.pop("inside_starts", None)   # a hint for the implementations that take it

    arrays = (k, v, q, theta, eta, alpha) + params0 + momentum0 + reset_to
    dtype = jnp.result_type(*arrays)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"inputs must be floating point, got common dtype {dtype}")
    cast = lambda xs: tuple(x.astype(dtype) for x in xs)  # noqa: E731
    k, v, q, theta, eta, alpha = cast((k, v, q, theta, eta, alpha))
    if running_mean:   # passed only when used, so implementations without them keep working
        impl_options["running_mean"] = True
    if log_keep is not None:
        impl_options["log_keep"] = log_keep.astype(dtype)
    if "gamma" in impl_options:
        impl_options["gamma"] = impl_options["gamma"].astype(dtype)
    if impl_options.get("omega_tail") is not None:
        tk, tv, tg, tvalid = impl_options["omega_tail"]
        impl_options["omega_tail"] = cast((tk, tv, tg)) + (tvalid,)
    dynamic = {name: value for name, value in impl_options.items()
               if name in ("log_keep", "state_length", "gamma", "omega_tail") or _is_array(value)}
    static = {name: value for name, value in impl_options.items() if name not in dynamic}
    compiled = _compiled(fn, tuple(sorted(static)))
    return compiled(cast(params0), cast(momentum0), k, v, q, theta, eta, alpha, reset,
                    cast(reset_to), dynamic, model=model, chunk_size=chunk_size, read=read,
                    **static)


def _check_rule(fn, impl, model, bias, gradient_at, eta, running_mean, surprise_max_norm,
                decay_target=DECAY_TARGETS[0], fast_weight_norm=False):
    """Raise ValueError for an attentional bias (``bias``: its name), gradient point, decay
    target or weight normalisation that ``impl`` or the rest of the configuration does not
    support (one message naming the cause and the fix)."""
    if gradient_at not in GRADIENT_AT:
        raise ValueError(f"gradient_at must be one of {GRADIENT_AT}, got {gradient_at!r}")
    if decay_target not in DECAY_TARGETS:
        raise ValueError(f"decay_target must be one of {DECAY_TARGETS}, got {decay_target!r}")
    if gradient_at == "previous_token" and decay_target != DECAY_TARGETS[0]:
        raise ValueError("decay_target='initial' is not implemented for gradient_at="
                         "'previous_token' (its WY form decays toward zero); use one of the two")
    if gradient_at == "previous_token" and fast_weight_norm:
        raise ValueError("fast_weight_norm is not implemented for gradient_at='previous_token' "
                         "(its WY form has no mini-batch end state); use one of the two")
    for name, value, default in (("attentional_bias", bias, DEFAULT_BIAS),
                                 ("gradient_at", gradient_at, GRADIENT_AT[0]),
                                 ("decay_target", decay_target, DECAY_TARGETS[0]),
                                 ("fast_weight_norm", bool(fast_weight_norm), False)):
        if value != default and not _accepts(fn, name):
            raise ValueError(f"{name}={value!r} is supported by impl 'chunked' and 'reference' "
                             f"only, not {impl!r}; change impl or use {name}={default!r}")
    if gradient_at == "previous_token":
        check_delta_model(model)
        problems = [what for what, bad in (
            (f"attentional_bias {bias!r} (needs 'l2')", bias != DEFAULT_BIAS),
            ("read_running_mean", running_mean),
            ("surprise_max_norm > 0", surprise_max_norm > 0),
            ("momentum (eta != 0)", is_concrete(eta) and bool(np.any(np.asarray(eta) != 0))))
            if bad]
        if problems:
            raise ValueError(f"gradient_at='previous_token' (the delta rule) takes a linear memory "
                             f"with the l2 bias and no momentum, running mean or surprise clip; "
                             f"got {', '.join(problems)}. Turn those off or use "
                             f"gradient_at='chunk_start'")


def _check_newton_schulz(fn, impl, ns_steps, ns_gradient, gradient_at, running_mean,
                         fast_weight_norm=False):
    """Raise ValueError for Newton-Schulz options that are bad or that ``impl`` or the rest of
    the configuration does not support (one message naming the field and the fix)."""
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 0:
        raise ValueError(f"ns_steps must be an int >= 0 (0: off; Atlas uses 5), got {ns_steps!r}")
    if ns_gradient not in NS_GRADIENTS:
        raise ValueError(f"ns_gradient must be one of {NS_GRADIENTS}, got {ns_gradient!r}")
    if not ns_steps:
        return
    if gradient_at != GRADIENT_AT[0]:
        raise ValueError(f"ns_steps > 0 (Newton-Schulz momentum) needs gradient_at="
                         f"{GRADIENT_AT[0]!r}; the delta rule's WY form ({gradient_at!r}) has no "
                         f"momentum to orthogonalise. Set ns_steps=0 or gradient_at="
                         f"{GRADIENT_AT[0]!r}")
    if running_mean:
        raise ValueError("ns_steps > 0 (Newton-Schulz momentum) does not take running_mean (TTT's "
                         "running-mean reads); turn one of them off")
    if fast_weight_norm:
        raise ValueError("ns_steps > 0 (Newton-Schulz momentum) does not take fast_weight_norm "
                         "(LaCT's weight normalisation is built for the dual form's chunk ends); "
                         "turn one of them off")
    if not _accepts(fn, "ns_steps"):
        raise ValueError(f"ns_steps > 0 is supported by impl 'chunked', 'reference', 'pallas' and "
                         f"'auto' only, not {impl!r}; change impl or set ns_steps=0")


def _check_omega(fn, impl, omega_window, gamma, omega_tail, gradient_at, k, v,
                 omega_normalize=False) -> dict:
    """The implementation options of the Omega rule (none for omega_window = 1), validated: one
    ValueError naming the argument and the fix for a bad window, gate or tail, or a combination
    that is not implemented."""
    if not isinstance(omega_window, int) or isinstance(omega_window, bool) or omega_window < 1:
        raise ValueError(f"omega_window must be an int >= 1 (1: the plain rule), got {omega_window!r}")
    if omega_window == 1:
        for name, value in (("gamma", gamma), ("omega_tail", omega_tail)):
            if value is not None:
                raise ValueError(f"{name} is an input of the Omega rule only; pass it with "
                                 f"omega_window > 1, or drop it")
        if omega_normalize:
            raise ValueError("omega_normalize=True normalises the Omega window's sum; pass it "
                             "with omega_window > 1, or drop it")
        return {}
    if gradient_at != GRADIENT_AT[0]:
        raise ValueError(f"omega_window > 1 (the Omega rule) takes every gradient at the chunk "
                         f"start; gradient_at={gradient_at!r} is not implemented with it. Use "
                         f"gradient_at='chunk_start' or omega_window=1")
    if not _accepts(fn, "omega_window"):
        raise ValueError(f"omega_window > 1 is supported by impl 'chunked', 'reference', 'pallas' "
                         f"and 'auto' (which run 'chunked' for it), not {impl!r}; change impl or "
                         f"use omega_window=1")
    T, n = k.shape[0], omega_window - 1
    if gamma is None:
        raise ValueError("omega_window > 1 needs gamma, the [T] window gates in [0, 1]")
    gamma = jnp.asarray(gamma)
    if gamma.shape != (T,):
        raise ValueError(f"gamma must be [T] = [{T}] (one gate per token), got {tuple(gamma.shape)}")
    _check_unit_interval("gamma", gamma)
    options = {"omega_window": omega_window, "gamma": gamma}
    if omega_normalize:
        options["omega_normalize"] = True
    if omega_tail is not None:
        if not isinstance(omega_tail, (tuple, list)) or len(omega_tail) != 4:
            raise ValueError("omega_tail must be a tuple (k, v, gamma, valid) of the c - 1 tokens "
                             "before token 0, or None for a fresh stream")
        tail = tuple(jnp.asarray(x) for x in omega_tail)
        want = ((n, k.shape[1]), (n, v.shape[1]), (n,), (n,))
        for name, x, shape in zip(("k", "v", "gamma", "valid"), tail, want):
            if x.shape != shape:
                raise ValueError(f"omega_tail's {name} must be {list(shape)} (the c - 1 = {n} "
                                 f"tokens before token 0), got {tuple(x.shape)}")
        _check_unit_interval("omega_tail's gamma", tail[2])
        options["omega_tail"] = tail[:3] + (tail[3].astype(bool),)
    return options


def _check_unit_interval(name, g) -> None:
    if not is_concrete(g):
        return
    g = np.asarray(g)
    bad = ~((g >= 0) & (g <= 1))
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(f"{name} must be in [0, 1] at every token; {name}[{first}] = "
                         f"{float(g[first])} ({int(bad.sum())} bad value(s)). Build it with a "
                         f"sigmoid or clip it before memory_scan")


def _accepts(fn, name: str) -> bool:
    """Whether ``fn`` names the keyword parameter ``name`` (``**kwargs`` does not count)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _inside_starts(given: bool, reset, chunk_size: int):
    """Whether a document starts inside a chunk, as a Python bool where it is known before
    tracing (no resets given, or concrete ones); None for traced resets."""
    if not given:
        return False
    if not is_concrete(reset):
        return None
    with jax.ensure_compile_time_eval():   # concrete even under an outer trace
        return bool(starts_inside_chunks(jnp.asarray(reset), chunk_size))


def _is_array(value) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


@functools.lru_cache(maxsize=None)
def _compiled(fn: Callable, static_names: tuple) -> Callable:
    """``fn`` under ``jax.jit`` with the model, chunk size, read mode and the non-array options
    static, so that calls outside jit compile once per configuration and shapes (inside an outer
    jit the nested jit is inlined)."""
    def call(params0, momentum0, k, v, q, theta, eta, alpha, reset, reset_to, dynamic, **static):
        return fn(params0, momentum0, k, v, q, theta, eta, alpha, reset, reset_to=reset_to,
                  **dynamic, **static)
    return jax.jit(call, static_argnames=("model", "chunk_size", "read") + static_names)


def memory_read(params: Sequence[jax.Array], q: jax.Array, model: InnerModel | str) -> jax.Array:
    """Retrieve from a given memory state without writing: f(q; P) (Titans' M*(q), eq. 15).

    Args:
      params: tuple of the inner model's parameters.
      q: [T, d_k] queries (or a single [d_k] query).
      model: InnerModel spec or shorthand.
    Returns:
      [T, d_v] (or [d_v]) reads.
    Raises:
      ValueError: for a parameter layout or query width that does not fit the model.
    """
    model = resolve_model(model)
    params = _as_params(params, "params")
    d_in, _ = model.check_params(params)
    q = jnp.asarray(q)
    if q.ndim not in (1, 2) or q.shape[-1] != d_in:
        raise ValueError(f"q must be [T, {d_in}] or [{d_in}], got {tuple(q.shape)}")
    return model.apply(params, q)
