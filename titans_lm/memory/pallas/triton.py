"""The memory-scan forward kernel for GPUs (Pallas Triton lowering).

Layout: one kernel launch per call; the grid is (value-column blocks,) for the linear memory and
(1,) for the MLP, and ``jax.vmap`` over batch and heads adds grid axes in front, so every program
owns one (sequence, head, column block). A program runs the whole sequence: a loop over
checkpoint groups, each a loop over chunks. The memory state lives in the kernel's state outputs
(global memory, L2-resident: the MLP state of a head is too big for registers), read, updated and
written back chunk by chunk, tile by tile (:mod:`titans_lm.memory.pallas.chunk`); thread barriers
(``debug_barrier``) separate the reads of one chunk from the writes that overwrite them. Per chunk
only its keys, values, queries and gates are loaded and its reads stored, so the state never makes
a round trip per chunk through a kernel boundary and there is one launch per call instead of one
per chunk.

Why not one kernel per chunk with ``lax.scan`` carrying the state: a launch per chunk
(thousands per sequence) plus the state's HBM round trip per chunk; the in-kernel loop keeps
both inside one program. The price: parallelism is batch x heads (x column blocks for the linear
memory), which a training batch provides.

Inputs (one head; vmap adds leading axes): k, q [N, b, d_k], v [N, b, d_v] (input dtype); gate
rows [N, 8, b] and columns [N, b, 8] (compute dtype: theta, eta, log(1 - alpha), reset flag,
read scale); the state at t = 0, its momentum and the reset target as tuples of arrays. Outputs:
reads [N, b, d_v], the final state and momentum (compute dtype) and, when ``save_states``, the
state at the start of every group [n_groups, ...] for the backward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from titans_lm.memory.pallas import chunk as pc
from titans_lm.memory.pallas.plan import KernelPlan


def _kernel(plan: KernelPlan, save_states: bool, n_params: int, *refs):
    cdt = jnp.dtype(plan.compute_dtype)
    b, g = plan.chunk_size, plan.group
    k_ref, v_ref, q_ref, rows_ref, cols_ref, P0, S0, R, reads_ref, P, S, bnd_P, bnd_S = \
        pc.split_refs(refs, n_params, save_states)
    barrier = (lambda: None) if plan.interpret else plgpu.debug_barrier
    precision = plan.lax_precision()

    if plan.kind == "linear":
        col0 = pl.program_id(0) * plan.block_v
        tiles = pc.linear_tiles(plan.d_k, col0, plan.block_v)
        v_cols = pl.ds(col0, plan.block_v)
    else:
        tiles = pc.mlp_tiles(plan.d_k, plan.hidden, plan.d_v, plan.block_h, unroll=False)
        v_cols = slice(None)

    pc.copy_state(tiles, P0, P)
    pc.copy_state(tiles, S0, S)
    barrier()

    def chunk(c):
        reset = rows_ref[c, pc.ROW_RESET, 0]

        @pl.when(reset > 0.5)
        def _():
            pc.copy_state(tiles, R, P)
            pc.zero_state(tiles, S)

        barrier()
        gates = pc.load_gates(rows_ref, cols_ref, (c,), cdt)
        coef = pc.kernel_coefficients(gates, pc.valid_row(c, b, plan.seq_len),
                                      plan.coefficient_precision())
        k = k_ref[c].astype(cdt)
        q = q_ref[c].astype(cdt)
        v = v_ref[c, :, v_cols].astype(cdt)
        if plan.kind == "linear":
            y = pc.linear_chunk(k, v, q, P, S, tiles, coef, read=plan.read, precision=precision,
                                barrier=barrier)
        else:
            y = pc.mlp_chunk(k, v, q, P, S, tiles, coef, activation=plan.activation,
                             read=plan.read, precision=precision, barrier=barrier)
        reads_ref[c, :, v_cols] = y.astype(reads_ref.dtype)
        barrier()

    def group(grp, carry):
        if save_states:
            pc.copy_state(tiles, P, bnd_P, dst_prefix=(grp,))
            pc.copy_state(tiles, S, bnd_S, dst_prefix=(grp,))
            barrier()

        def one(cc, carry):
            chunk(grp * g + cc)
            return carry

        return lax.fori_loop(0, g, one, carry)

    lax.fori_loop(0, plan.n_groups, group, 0)


def triton_forward(plan: KernelPlan, k, v, q, gate_rows, gate_cols, params0, momentum0, reset_to,
                   *, save_states: bool):
    """Run the forward kernel (Pallas Triton, or its interpreter when ``plan.interpret``).

    Args:
      plan: a KernelPlan with backend "triton".
      k, q: [N, b, d_k]; v: [N, b, d_v] with N = plan.n_chunks (padded).
      gate_rows: [N, 8, b]; gate_cols: [N, b, 8] (compute dtype).
      params0, momentum0, reset_to: tuples of the inner model's arrays.
      save_states: also return the state at the start of every group.
    Returns:
      (reads [N, b, d_v] in k's dtype, P_T, S_T, bnd_P, bnd_S) with the states in the compute
      dtype; bnd_P / bnd_S are tuples of [n_groups, ...] arrays (empty without save_states).
    """
    cdt = jnp.dtype(plan.compute_dtype)
    n = len(params0)
    state = tuple(jax.ShapeDtypeStruct(p.shape, cdt) for p in params0)
    saved = tuple(jax.ShapeDtypeStruct((plan.n_groups,) + p.shape, cdt) for p in params0)
    out_shape = ((jax.ShapeDtypeStruct((plan.n_chunks, plan.chunk_size, plan.d_v), k.dtype),)
                 + state + state + (saved + saved if save_states else ()))
    n_programs = plan.d_v // plan.block_v if plan.kind == "linear" else 1
    call = pl.pallas_call(
        functools.partial(_kernel, plan, save_states, n),
        out_shape=out_shape,
        grid=(n_programs,),
        compiler_params=plgpu.CompilerParams(num_warps=plan.num_warps, num_stages=1),
        interpret=plan.interpret,
        name=f"memory_scan_{plan.kind}_fwd",
    )
    outs = call(k, v, q, gate_rows, gate_cols, *params0, *momentum0, *reset_to)
    return pc.split_outputs(outs, n, save_states)
