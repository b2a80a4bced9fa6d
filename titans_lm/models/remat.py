"""Rematerialisation policies for the LM's blocks, chosen by name (``model.remat``), as in MaxText.

=====================  ========================================================================
name                   what the backward pass keeps of each block's forward (the rest is recomputed)
=====================  ========================================================================
``none``               everything (no remat)
``full`` / ``block``   only the block's input (``jax.checkpoint_policies.nothing_saveable``)
``minimal``            the outputs of matmuls without batch dimensions, i.e. the weight
                       projections (q, k, v, o, the MLP, the memory's projections); attention
                       scores and the inner loop's batched matmuls are recomputed
                       (``dots_with_no_batch_dims_saveable``; MaxText's "minimal")
``dots``               the outputs of every matmul (``dots_saveable``)
=====================  ========================================================================

The memory engine has its own remat inside the chunk scan (``chunks_per_checkpoint``): its
backward keeps one state per group of chunks whatever the block policy.

On the CPU backend remat needs one compiler option (:func:`compiler_options`). JAX marks a
recomputation with ``optimization_barrier`` so that XLA cannot merge it with the forward pass's
values (common-subexpression elimination). XLA's GPU compiler removes the barriers after
scheduling; its CPU compiler removes them early (its ``cse_barrier_expander`` pass) and runs CSE
again later, which folds every recomputed block back onto the forward's values: the compiled
program is that of no remat, and so is ``compiled.memory_analysis()`` (measured with JAX 0.10.2:
tiny Transformer++, the same temporaries with and without ``block``; a toy 8-layer stack has 119
dots in its StableHLO and 87 in the compiled HLO under remat, as without it). Keeping the barriers
(``xla_disable_hlo_passes=cse_barrier_expander``) keeps the recomputation, and the estimate on CPU
then shows the policy (the toy: 84 -> 28 MiB). The train step is compiled with that option
wherever a policy is set and the backend is the CPU; the barriers are identities, so values and
gradients are unchanged.
"""

from __future__ import annotations

import jax
from flax import nnx

POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "block": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
}
REMAT_MODES = tuple(POLICIES)

#: The XLA option under which remat holds on the CPU backend (see the module docstring).
CPU_KEEP_REMAT = {"xla_disable_hlo_passes": "cse_barrier_expander"}


def check_remat(name: str) -> str:
    """Return ``name`` if it is a policy name.

    Raises:
      ValueError: naming the valid policies.
    """
    if name not in POLICIES:
        raise ValueError(f"model remat must be one of {REMAT_MODES}, got {name!r}")
    return name


def compiler_options(name: str, platform: str) -> dict[str, str] | None:
    """XLA compiler options for a program whose blocks run under the remat policy ``name`` on
    ``platform`` ("cpu", "gpu", "tpu", ...): :data:`CPU_KEEP_REMAT` for a policy on the CPU, else
    None (XLA's GPU compiler keeps remat's barriers until after scheduling).

    Raises:
      ValueError: for an unknown policy name.
    """
    if check_remat(name) == "none" or platform != "cpu":
        return None
    return dict(CPU_KEEP_REMAT)


def remat_call(name: str, block, *args):
    """``block(*args)``, under the remat policy ``name`` (an nnx.Module call)."""
    if check_remat(name) == "none":
        return block(*args)
    return nnx.remat(lambda blk, *a: blk(*a), policy=POLICIES[name])(block, *args)
