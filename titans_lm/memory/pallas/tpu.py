"""The memory-scan forward kernel for TPUs (Pallas Mosaic TPU lowering).

Layout: the grid is (chunks,) with "arbitrary" (sequential) semantics, and ``jax.vmap`` over batch
and heads adds "parallel" grid axes in front. BlockSpecs hand each grid step one chunk's keys,
values, queries and packed gates (the Pallas TPU pipeline prefetches the next chunk's blocks while
this one computes) and take its reads. The state outputs have a constant block index, so they stay
resident in VMEM for the whole sequence and serve as the working state: initialised from the
t = 0 state at chunk 0, updated in place every chunk, written to HBM once at the end. The states
saved for the backward pass have block index (chunk // group) and are written at each group's
first chunk. The whole state is one VMEM block (a 2-layer MLP with d = 128 and hidden 512 is
512 KiB for parameters and momentum), so the MXU sees whole [b, d] x [d, h] matmuls.

A reset (document start) at a chunk is applied with a vector select (the flag is a [1, 1] vector
loaded with the gates), which avoids scalar memory and keeps vmap over batch and heads plain.

Inputs and outputs are those of :func:`titans_lm.memory.pallas.triton.triton_forward`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from titans_lm.memory.pallas import chunk as pc
from titans_lm.memory.pallas.plan import KernelPlan

# Scoped VMEM the kernel may use before it asks for more (the TPU default is 16-32 MiB).
_DEFAULT_VMEM_BYTES = 12 * 2 ** 20


def _kernel(plan: KernelPlan, save_states: bool, n_params: int, *refs):
    cdt = jnp.dtype(plan.compute_dtype)
    b, g = plan.chunk_size, plan.group
    k_ref, v_ref, q_ref, rows_ref, cols_ref, P0, S0, R, reads_ref, P, S, bnd_P, bnd_S = \
        pc.split_refs(refs, n_params, save_states)
    precision = plan.lax_precision()
    if plan.kind == "linear":
        tiles = pc.linear_tiles(plan.d_k, 0, plan.block_v)
    else:
        tiles = pc.mlp_tiles(plan.d_k, plan.hidden, plan.d_v, plan.block_h, unroll=True)
    c = pl.program_id(0)

    @pl.when(c == 0)
    def _():
        pc.copy_state(tiles, P0, P)
        pc.copy_state(tiles, S0, S)

    if save_states:
        @pl.when(lax.rem(c, g) == 0)      # lax.rem, not %: c >= 0 and no sign fix-up
        def _():
            pc.copy_state(tiles, P, bnd_P)
            pc.copy_state(tiles, S, bnd_S)

    reset = rows_ref[pl.ds(pc.ROW_RESET, 1), pl.ds(0, 1)] > 0.5          # [1, 1]
    pc.select_state(tiles, reset, R, P, S)
    gates = pc.load_gates(rows_ref, cols_ref, (), cdt)
    coef = pc.kernel_coefficients(gates, pc.valid_row(c, b, plan.seq_len),
                                  plan.coefficient_precision())
    k = k_ref[...].astype(cdt)
    q = q_ref[...].astype(cdt)
    v = v_ref[...].astype(cdt)
    no_barrier = lambda: None  # noqa: E731  (a TPU core executes its vector ops in order)
    if plan.kind == "linear":
        y = pc.linear_chunk(k, v, q, P, S, tiles, coef, read=plan.read, precision=precision,
                            barrier=no_barrier)
    else:
        y = pc.mlp_chunk(k, v, q, P, S, tiles, coef, activation=plan.activation, read=plan.read,
                         precision=precision, barrier=no_barrier)
    reads_ref[...] = y.astype(reads_ref.dtype)


def _vmem_bytes(params0, save_states: bool) -> int:
    state = sum(int(p.size) for p in params0) * 4
    # P0, S0, reset target in; P, S (and the saved P, S) out; each double-buffered.
    return 2 * state * (3 + 2 + (2 if save_states else 0))


def tpu_forward(plan: KernelPlan, k, v, q, gate_rows, gate_cols, params0, momentum0, reset_to,
                *, save_states: bool):
    """Run the forward kernel (Pallas TPU, or the TPU interpreter when ``plan.interpret``).

    Arguments and results as :func:`titans_lm.memory.pallas.triton.triton_forward`.
    """
    cdt = jnp.dtype(plan.compute_dtype)
    n = len(params0)
    b, d_k, d_v = plan.chunk_size, plan.d_k, plan.d_v

    def whole(p):
        return pl.BlockSpec(p.shape, lambda c, nd=p.ndim: (0,) * nd)

    def per_group(p):
        return pl.BlockSpec((None,) + p.shape,
                            lambda c, nd=p.ndim: (lax.div(c, plan.group),) + (0,) * nd)

    in_specs = ([pl.BlockSpec((None, b, d_k), lambda c: (c, 0, 0)),
                 pl.BlockSpec((None, b, d_v), lambda c: (c, 0, 0)),
                 pl.BlockSpec((None, b, d_k), lambda c: (c, 0, 0)),
                 pl.BlockSpec((None, pc.GATE_ROWS, b), lambda c: (c, 0, 0)),
                 pl.BlockSpec((None, b, pc.GATE_ROWS), lambda c: (c, 0, 0))]
                + [whole(p) for p in params0] * 3)
    state = tuple(jax.ShapeDtypeStruct(p.shape, cdt) for p in params0)
    saved = tuple(jax.ShapeDtypeStruct((plan.n_groups,) + p.shape, cdt) for p in params0)
    out_shape = ((jax.ShapeDtypeStruct((plan.n_chunks, b, d_v), k.dtype),) + state + state
                 + (saved + saved if save_states else ()))
    out_specs = ([pl.BlockSpec((None, b, d_v), lambda c: (c, 0, 0))]
                 + [whole(p) for p in params0] * 2
                 + ([per_group(p) for p in params0] * 2 if save_states else []))
    vmem = _vmem_bytes(params0, save_states)
    # dimension_semantics stays None: the chunk axis then defaults to "arbitrary" (sequential) and
    # the axes vmap adds become "parallel". (Passing ("arbitrary",) explicitly is equivalent when
    # compiled, but the TPU interpreter of jax 0.10 does not extend it over vmapped grid axes.)
    params = pltpu.CompilerParams(
        vmem_limit_bytes=None if vmem <= _DEFAULT_VMEM_BYTES else int(vmem + (8 << 20)))
    call = pl.pallas_call(
        functools.partial(_kernel, plan, save_states, n),
        out_shape=out_shape,
        grid=(plan.n_chunks,),
        in_specs=in_specs,
        out_specs=out_specs,
        compiler_params=params,
        interpret=pltpu.InterpretParams() if plan.interpret else False,
        name=f"memory_scan_{plan.kind}_fwd",
    )
    outs = call(k, v, q, gate_rows, gate_cols, *params0, *momentum0, *reset_to)
    return pc.split_outputs(outs, n, save_states)
