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

How remat shows in XLA's memory estimate (measured with JAX 0.10.2 on CPU,
``compiled.memory_analysis().temp_size_in_bytes``): a jax.checkpoint around each block of a Python
loop of blocks cuts the saved residuals (tiny Transformer++ at T = 2048: 1090 MB -> 36 MB by
``jax._src.ad_checkpoint.saved_residuals``) and adds the recomputation (109 -> 137 GFLOP), yet
the compiled temporaries stay at 1.07 GB. Nothing in the program orders a block's recomputation
after the backward of the blocks above it (it depends only on the block's saved input), and the
CPU compiler's schedule keeps as much live as without remat. In a ``lax.scan`` over layers the
loop orders it
(a toy 8-layer stack: 148 MB without remat, 56 MB with it in a scan; 156 MB for both unrolled).
So on CPU the estimate of an unrolled model is that of no remat; scanning the layers (MaxText's
``scan_layers``) is what makes a policy show there.
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


def check_remat(name: str) -> str:
    """Return ``name`` if it is a policy name.

    Raises:
      ValueError: naming the valid policies.
    """
    if name not in POLICIES:
        raise ValueError(f"model remat must be one of {REMAT_MODES}, got {name!r}")
    return name


def remat_call(name: str, block, *args):
    """``block(*args)``, under the remat policy ``name`` (an nnx.Module call)."""
    if check_remat(name) == "none":
        return block(*args)
    return nnx.remat(lambda blk, *a: blk(*a), policy=POLICIES[name])(block, *args)
