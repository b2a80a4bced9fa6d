"""``pallas`` and ``auto``: the memory scan as a fused Pallas kernel, differentiable via custom_vjp.

``pallas_scan`` is the ``impl="pallas"`` implementation of :func:`titans_lm.memory.memory_scan`
(same contract, validated inputs). The forward pass is one Pallas kernel per call
(:mod:`titans_lm.memory.pallas.triton` on GPUs, :mod:`titans_lm.memory.pallas.tpu` on TPUs, either
one in Pallas' interpreter on CPU) that computes, per chunk, the gradients at the chunk-start
state, the gate matrices, the dual-form reads and the chunk-end parameters and momentum
(:mod:`titans_lm.memory.pallas.chunk`).

Gradients (``jax.custom_vjp``): the forward kernel also saves the state at the start of every group
of ``chunks_per_checkpoint`` chunks. The backward pass is ``chunked``'s: the gate coefficients of
all chunks at once (:func:`titans_lm.memory.coefficients.chunk_coefficients` and ``end_rows``),
then the groups in reverse, each recomputed from its saved state under ``jax.vjp`` of the chunk
loop of :func:`titans_lm.memory.chunked.chunk_step_from_coefficients`, and last one batched vjp
from the coefficients' cotangents to the gates. That is the recomputation and the arithmetic of
``chunked`` with ``jax.checkpoint`` per group, so the meta-gradients with respect to k, v, q,
theta, eta, alpha, the initial state and the reset target equal ``chunked``'s (up to the rounding
of the saved states, which the kernel computes in float32). The backward pass is XLA code, not a
kernel: forward + backward gains only the forward pass's share of the time.

Problems outside the kernels' shapes (:mod:`titans_lm.memory.pallas.plan`) run ``chunked`` and log
the reason once. A call with ``state_length`` (a carried memory's continued call) runs ``chunked``
as well: the kernel returns the state after the last token only. ``auto_scan`` (``impl="auto"``) is ``pallas`` on GPU and TPU, ``chunked`` on CPU.

Under a device mesh the layer calls these per shard (:mod:`titans_lm.memory.sharded`): one
``pallas_call`` sees only its device's batch rows and heads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory.chunked import (chunk_step_from_coefficients, chunked_scan, end_rows,
                                      starts_inside_chunks)
from titans_lm.memory.coefficients import chunk_coefficients, running_mean_scale, with_running_mean
from titans_lm.memory.inner_models import InnerModel
from titans_lm.memory.pallas.chunk import (GATE_ROWS, ROW_ETA, ROW_LOG_KEEP, ROW_READ_SCALE,
                                           ROW_RESET, ROW_THETA)
from titans_lm.memory.pallas.plan import KernelPlan, log_fallback, make_plan, resolve_backend


def _forward_fn(plan: KernelPlan):
    if plan.backend == "tpu":
        from titans_lm.memory.pallas.tpu import tpu_forward  # deliberate: the plan's backend only
        return tpu_forward
    from titans_lm.memory.pallas.triton import triton_forward  # deliberate: the plan's backend only
    return triton_forward


def _pad_rows(x, total, value):
    pad = total - x.shape[0]
    if pad == 0:
        return x
    return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), constant_values=value)


def _padded_inputs(plan: KernelPlan, k, v, q, theta, eta, alpha, reset):
    """Inputs padded to n_chunks * b tokens (zero k, v, q; theta 0, eta 1, alpha 0; no reset),
    cut into chunks: k, v, q [N, b, d]; theta, eta, alpha (log(1 - alpha) with plan.log_keep)
    [N, b] (compute dtype); reset [N] bool (the flag of each chunk's first token)."""
    N, b = plan.n_chunks, plan.chunk_size
    total = N * b
    cdt = jnp.dtype(plan.compute_dtype)
    k_c, v_c, q_c = (_pad_rows(x, total, 0).reshape(N, b, x.shape[-1]) for x in (k, v, q))
    th = _pad_rows(theta.astype(cdt), total, 0).reshape(N, b)
    et = _pad_rows(eta.astype(cdt), total, 1).reshape(N, b)
    al = _pad_rows(alpha.astype(cdt), total, 0).reshape(N, b)   # alpha = 0 and log(1 - 0) = 0
    rs = _pad_rows(reset, total, False).reshape(N, b)[:, 0]
    return k_c, v_c, q_c, th, et, al, rs


def _gate_blocks(plan: KernelPlan, th, et, al, rs):
    """Packed gates: rows [N, 8, b] (theta, eta, log(1 - alpha), reset flag, read scale, zeros)
    and columns [N, b, 8]."""
    cdt = jnp.dtype(plan.compute_dtype)
    N, b = th.shape
    rows = [jnp.zeros((N, b), cdt)] * GATE_ROWS
    rows[ROW_THETA], rows[ROW_ETA] = th, et
    rows[ROW_LOG_KEEP] = al if plan.log_keep else jnp.log1p(-al)
    rows[ROW_RESET] = jnp.broadcast_to(rs.astype(cdt)[:, None], (N, b))
    scale = running_mean_scale(b, cdt) if plan.running_mean else jnp.ones((b,), cdt)
    rows[ROW_READ_SCALE] = jnp.broadcast_to(scale[None, :], (N, b))
    gate_rows = jnp.stack(rows, axis=1)
    return gate_rows, jnp.swapaxes(gate_rows, 1, 2)


def _run_kernel(plan: KernelPlan, params0, momentum0, k, v, q, theta, eta, alpha, reset, reset_to,
                save_states: bool):
    cdt = jnp.dtype(plan.compute_dtype)
    k_c, v_c, q_c, th, et, al, rs = _padded_inputs(plan, k, v, q, theta, eta, alpha, reset)
    gate_rows, gate_cols = _gate_blocks(plan, th, et, al, rs)
    cast = lambda xs: tuple(x.astype(cdt) for x in xs)  # noqa: E731
    reads, P, S, bnd_P, bnd_S = _forward_fn(plan)(
        plan, k_c, v_c, q_c, gate_rows, gate_cols, cast(params0), cast(momentum0), cast(reset_to),
        save_states=save_states)
    reads = reads.reshape(plan.n_chunks * plan.chunk_size, plan.d_v)[:plan.seq_len]
    dt = k.dtype
    P = tuple(p.astype(dt) for p in P)
    S = tuple(s.astype(dt) for s in S)
    return (reads, (P, S)), (bnd_P, bnd_S)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def kernel_scan(plan: KernelPlan, params0, momentum0, k, v, q, theta, eta, alpha, reset, reset_to):
    """The kernel path of :func:`pallas_scan` for a given plan, without the platform checks.

    ``pallas_scan`` makes the plan from the call and the local platform; calling this directly
    with a plan for another platform's lowering (``interpret=False``) is how the kernels are
    lowered (not run) for a GPU or TPU from a CPU-only machine, e.g.
    ``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))``.

    Args: a KernelPlan and memory_scan's validated arrays (tuples for the states; reset bool [T]).
    Returns: (reads [T, d_v], (params_T, momentum_T)) in k's dtype. Differentiable (custom_vjp).
    """
    out, _ = _run_kernel(plan, params0, momentum0, k, v, q, theta, eta, alpha, reset, reset_to,
                         save_states=False)
    return out


def _kernel_scan_fwd(plan, params0, momentum0, k, v, q, theta, eta, alpha, reset, reset_to):
    out, (bnd_P, bnd_S) = _run_kernel(plan, params0, momentum0, k, v, q, theta, eta, alpha, reset,
                                      reset_to, save_states=True)
    return out, (bnd_P, bnd_S, k, v, q, theta, eta, alpha, reset, reset_to)


def _kernel_scan_bwd(plan, residuals, cotangents):
    bnd_P, bnd_S, k, v, q, theta, eta, alpha, reset, reset_to = residuals
    d_reads, (d_P, d_S) = cotangents
    dt = k.dtype
    cdt = jnp.dtype(plan.compute_dtype)
    n_groups, g, b, N = plan.n_groups, plan.group, plan.chunk_size, plan.n_chunks
    total = N * b
    T = plan.seq_len
    model, read = plan.model, plan.read

    k_c, v_c, q_c, th, et, al, rs = _padded_inputs(plan, k, v, q, theta, eta, alpha, reset)
    n_valid = jnp.asarray(np.clip(T - np.arange(N) * b, 0, b).astype(np.int32))

    # As chunked_scan: the gate coefficients of all chunks at once, outside the sequential loop;
    # their cotangents are collected by the loop and pulled back to the gates in one batched vjp.
    def coefficients(th, et, al):
        if plan.log_keep:
            coef = jax.vmap(lambda t, e, lk: chunk_coefficients(t, e, None, log_keep=lk))(th, et, al)
        else:
            coef = jax.vmap(chunk_coefficients)(th, et, al)
        ends = jax.vmap(end_rows)(coef, n_valid)
        return (with_running_mean(coef) if plan.running_mean else coef), ends

    (coef, ends), coef_vjp = jax.vjp(coefficients, th, et, al)
    grouped = lambda x: x.reshape((n_groups, g) + x.shape[1:])  # noqa: E731
    kvq = tuple(grouped(x.astype(cdt)) for x in (k_c, v_c, q_c))
    coef_g, ends_g = jax.tree.map(grouped, (coef, ends))
    rs_g = grouped(rs)
    d_reads_g = grouped(_pad_rows(d_reads.astype(cdt), total, 0).reshape(N, b, plan.d_v))
    R = tuple(r.astype(cdt) for r in reset_to)
    zeros = tuple(jnp.zeros_like(r) for r in R)

    def group_fn(P, S, kvq_g, coef_g, ends_g, R_, rs_):
        # chunked_scan's chunk loop: reset at chunk starts, then the dual-form chunk step.
        def one_chunk(carry, x):
            P, S = carry
            kc, vc, qc, cf, ed, r = x
            P = tuple(jnp.where(r, r_, p) for r_, p in zip(R_, P))
            S = tuple(jnp.where(r, z, s) for z, s in zip(zeros, S))
            reads, P, S = chunk_step_from_coefficients(model, P, S, kc, vc, qc, cf, ed, read=read)
            return (P, S), reads

        (P, S), reads = jax.lax.scan(one_chunk, (P, S), kvq_g + (coef_g, ends_g, rs_))
        return reads, (P, S)

    def back(carry, inp):
        dP, dS, dR = carry
        P_g, S_g, kvq_g, cf_g, ed_g, rs_, dr_g = inp
        fn = lambda P_, S_, x_, c_, e_, R_: group_fn(P_, S_, x_, c_, e_, R_, rs_)  # noqa: E731
        _, vjp = jax.vjp(fn, P_g, S_g, kvq_g, cf_g, ed_g, R)
        dP_g, dS_g, dkvq_g, dcf_g, ded_g, dR_g = vjp((dr_g, (dP, dS)))
        dR = tuple(a + c for a, c in zip(dR, dR_g))
        return (dP_g, dS_g, dR), (dkvq_g, dcf_g, ded_g)

    init = (tuple(x.astype(cdt) for x in d_P), tuple(x.astype(cdt) for x in d_S), zeros)
    (dP0, dS0, dR), (dkvq, dcoef, dends) = jax.lax.scan(
        back, init, (tuple(bnd_P), tuple(bnd_S), kvq, coef_g, ends_g, rs_g, d_reads_g),
        reverse=True)
    ungroup = lambda x: x.reshape((N,) + x.shape[2:])  # noqa: E731
    dth, det, dal = coef_vjp(jax.tree.map(ungroup, (dcoef, dends)))
    dk, dv, dq = (x.reshape(total, x.shape[-1])[:T].astype(dt) for x in dkvq)
    dth, det, dal = (x.reshape(total)[:T].astype(dt) for x in (dth, det, dal))
    cast = lambda xs: tuple(x.astype(dt) for x in xs)  # noqa: E731
    return cast(dP0), cast(dS0), dk, dv, dq, dth, det, dal, None, cast(dR)


kernel_scan.defvjp(_kernel_scan_fwd, _kernel_scan_bwd)


def pallas_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, *, model: InnerModel,
                chunk_size: int, read: str, reset_to, chunks_per_checkpoint: int = 1,
                backend: str | None = None, interpret: bool | None = None,
                precision: str = "highest", running_mean: bool = False, log_keep=None,
                state_length=None, inside_starts=None, decay_target: str = "zero",
                ns_steps: int = 0, ns_gradient: str = "exact", fast_weight_norm: bool = False,
                omega_window: int = 1, gamma=None, omega_tail=None,
                omega_normalize: bool = False, surprise_max_norm: float = 0.0,
                no_momentum: bool = False, no_decay: bool = False):
    """The ``pallas`` implementation of :func:`titans_lm.memory.memory_scan` (validated inputs).

    Args (besides memory_scan's):
      chunks_per_checkpoint: chunks per saved state for the backward pass (as ``chunked``'s).
      backend: "triton" | "tpu" | None (from the platform: gpu -> triton, tpu -> tpu,
        cpu -> triton in interpret mode).
      interpret: run the kernel in Pallas' interpreter (``interpret=True`` for Triton,
        ``pltpu.InterpretParams()`` for the TPU kernel); None = when the platform cannot compile
        the chosen lowering (always on CPU).
      precision: of the data matmuls: "highest" (float32, default), "tf32x3" (three TF32
        passes, compiled Triton only) or "default" (the platform's fast float32 matmul: TF32 on
        NVIDIA GPUs, bfloat16 passes on TPUs).
      running_mean, log_keep: as memory_scan's (the kernel receives the forget gate as
        log(1 - alpha) either way, and the read scale as a gate row).
      inside_starts: bool scalar, whether any document starts inside a chunk
        (:func:`~titans_lm.memory.chunked.starts_inside_chunks`). The kernel resets only at chunk
        starts; where this is true the call runs ``chunked`` instead, exact either way: a Python
        bool picks one (``memory_scan`` derives it where the resets are absent or concrete), a
        traced scalar picks at run time (``lax.cond``). None: both run and each row selects its
        result (a flag computed from a ``reset`` batched by vmap would turn a cond into that
        select anyway), so the layer computes one flag for the whole batch and passes it
        unbatched (``NeuralMemory.scan``).
      decay_target: as memory_scan's; the kernel decays toward zero, so "initial" runs
        ``chunked`` (logged once).
      ns_steps, ns_gradient: as memory_scan's; the kernel has no Newton-Schulz steps, so
        ns_steps > 0 runs ``chunked`` (logged once).
      fast_weight_norm: as memory_scan's; the kernel does not normalise, so True runs
        ``chunked`` (logged once).
      omega_window, gamma, omega_tail, omega_normalize: as memory_scan's; the kernel has no
        Omega window, so omega_window > 1 runs ``chunked`` (logged once).
      surprise_max_norm: as memory_scan's (the guard); the kernel does not clip, so a value
        > 0 runs ``chunked`` (logged once).
      no_momentum, no_decay: eta, resp. alpha, is 0 at every token (memory_scan's None gates):
        the kernel takes the arrays of zeros it receives; ``chunked``, where it runs, skips the
        products of those gates.
    Returns:
      (reads [T, d_v], (params_T, momentum_T)) in the inputs' dtype.
    Raises:
      ValueError: for an unknown backend or precision, chunks_per_checkpoint < 1,
        interpret=False with a lowering this platform cannot compile, or "tf32x3" outside the
        compiled Triton kernel.
    Unsupported problems (see :mod:`titans_lm.memory.pallas.plan`) run ``chunked`` and log why;
    so does a call with ``state_length`` (silently: it is the carried-state path by design).
    """
    def whole_call_chunked():
        return chunked_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, model=model,
                            chunk_size=chunk_size, read=read, reset_to=reset_to,
                            chunks_per_checkpoint=chunks_per_checkpoint, running_mean=running_mean,
                            log_keep=log_keep, state_length=state_length,
                            inside_starts=inside_starts, decay_target=decay_target,
                            ns_steps=ns_steps, ns_gradient=ns_gradient,
                            fast_weight_norm=fast_weight_norm,
                            omega_window=omega_window, gamma=gamma, omega_tail=omega_tail,
                            omega_normalize=omega_normalize,
                            surprise_max_norm=surprise_max_norm, no_momentum=no_momentum,
                            no_decay=no_decay)

    # rules the kernel does not implement: the first that applies is logged, chunked runs
    unsupported = (
        (decay_target != "zero", f"decay_target={decay_target!r} (the kernel decays toward zero)"),
        (ns_steps, f"ns_steps={ns_steps} (the kernel has no Newton-Schulz steps)"),
        (fast_weight_norm, "fast_weight_norm=True (the kernel does not normalise the fast weights)"),
        (omega_window > 1, f"omega_window={omega_window} (the kernel writes one gradient per token)"),
        (surprise_max_norm > 0, f"surprise_max_norm={surprise_max_norm} (the kernel does not clip)"))
    reason = next((why for applies, why in unsupported if applies), None)
    if reason is not None:
        log_fallback(reason)
        return whole_call_chunked()
    if state_length is not None:
        return whole_call_chunked()
    backend, interpret = resolve_backend(backend, interpret, jax.default_backend())
    plan = make_plan(model, params0, k.dtype, seq_len=k.shape[0], chunk_size=chunk_size, read=read,
                     chunks_per_checkpoint=chunks_per_checkpoint, backend=backend,
                     interpret=interpret, precision=precision, running_mean=running_mean,
                     log_keep=log_keep is not None)
    if isinstance(plan, str):
        log_fallback(plan)
        return whole_call_chunked()

    def exact_chunked(operands):
        p0, m0, k_, v_, q_, th, et, al, rs, r0, lk = operands
        return chunked_scan(p0, m0, k_, v_, q_, th, et, al, rs, model=model, chunk_size=chunk_size,
                            read=read, reset_to=r0, chunks_per_checkpoint=chunks_per_checkpoint,
                            running_mean=running_mean, log_keep=lk, inside_starts=True,
                            no_momentum=no_momentum, no_decay=no_decay)

    def kernel(operands):
        p0, m0, k_, v_, q_, th, et, al, rs, r0, lk = operands
        reads, (P, S) = kernel_scan(plan, p0, m0, k_, v_, q_, th, et, al if lk is None else lk,
                                    rs, r0)
        return reads.astype(k_.dtype), (tuple(x.astype(k_.dtype) for x in P),
                                        tuple(x.astype(k_.dtype) for x in S))

    operands = (tuple(params0), tuple(momentum0), k, v, q, theta, eta, alpha, reset,
                tuple(reset_to), log_keep)
    if isinstance(inside_starts, bool):
        return (exact_chunked if inside_starts else kernel)(operands)
    if inside_starts is None:
        # Traced resets and no flag from the caller (e.g. vmap over memory_scan itself): the
        # flag would be batched, and a cond on it a select, so run both and select per row.
        return jax.tree.map(functools.partial(jnp.where, starts_inside_chunks(reset, chunk_size)),
                            exact_chunked(operands), kernel(operands))
    return jax.lax.cond(inside_starts, exact_chunked, kernel, operands)


def auto_choice(platform: str) -> str:
    """What ``impl="auto"`` runs on a JAX platform: "pallas" on gpu/tpu, else "chunked"."""
    return "pallas" if platform in ("gpu", "tpu") else "chunked"


def auto_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, *, model: InnerModel,
              chunk_size: int, read: str, reset_to, chunks_per_checkpoint: int = 1,
              running_mean: bool = False, log_keep=None, state_length=None, inside_starts=None,
              decay_target: str = "zero", ns_steps: int = 0, ns_gradient: str = "exact",
              fast_weight_norm: bool = False, omega_window: int = 1, gamma=None, omega_tail=None,
              omega_normalize: bool = False, surprise_max_norm: float = 0.0,
              no_momentum: bool = False, no_decay: bool = False, **pallas_options):
    """The ``auto`` implementation: :func:`pallas_scan` on GPU/TPU, ``chunked`` on CPU.

    ``pallas_options`` (backend, interpret, precision) apply only when the kernel runs;
    ``inside_starts``, ``decay_target``, ``ns_steps``, ``ns_gradient``, ``fast_weight_norm``,
    the Omega rule's ``omega_window``, ``gamma``, ``omega_tail``, ``omega_normalize``,
    ``surprise_max_norm``, ``no_momentum`` and ``no_decay`` as :func:`pallas_scan`'s.
    """
    rules = dict(omega_window=omega_window, gamma=gamma, omega_tail=omega_tail,
                 omega_normalize=omega_normalize,
                 surprise_max_norm=surprise_max_norm, no_momentum=no_momentum, no_decay=no_decay)
    if auto_choice(jax.default_backend()) == "pallas":
        return pallas_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, model=model,
                           chunk_size=chunk_size, read=read, reset_to=reset_to,
                           chunks_per_checkpoint=chunks_per_checkpoint, running_mean=running_mean,
                           log_keep=log_keep, state_length=state_length,
                           inside_starts=inside_starts, decay_target=decay_target,
                           ns_steps=ns_steps, ns_gradient=ns_gradient,
                           fast_weight_norm=fast_weight_norm, **rules, **pallas_options)
    return chunked_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, model=model,
                        chunk_size=chunk_size, read=read, reset_to=reset_to,
                        chunks_per_checkpoint=chunks_per_checkpoint, running_mean=running_mean,
                        log_keep=log_keep, state_length=state_length,
                        inside_starts=inside_starts, decay_target=decay_target,
                        ns_steps=ns_steps, ns_gradient=ns_gradient,
                        fast_weight_norm=fast_weight_norm, **rules)
