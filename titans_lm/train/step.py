"""The pure train step and eval step, and their jitted, sharded forms.

Loss (next-token cross-entropy, in nats per scored token):

    L = sum_{b,t} w_bt * (-log softmax(logits_bt)[y_bt]) / sum_{b,t} w_bt

with ``y = tokens[:, 1:]`` and the contract's weight
``w = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)``: a target is
scored when it continues the document of its input position, so no prediction crosses a document
boundary and padding is never scored. Logits and the loss are float32 whatever the compute dtype.

Gradient accumulation: with ``grad_accum = A`` the global batch of B rows is split into A
micro-batches (row i goes to micro-batch ``i mod A``, so every device keeps an equal share of
each), a ``lax.scan`` sums the *unnormalised* gradients ``d(sum w * nll)/d(params)`` and the weight
counts over them, and one optimiser update uses ``sum_grads / sum_weights``. That is exactly the
gradient of the one-big-batch loss above (up to float summation order), and one train step is
one optimiser update.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from titans_lm.memory import stats as memory_stats
from titans_lm.models.lm import continued
from titans_lm.models.remat import compiler_options
from titans_lm.nn.dtypes import cast_floats
from titans_lm.train import sharding as shd
from titans_lm.train.carry import cast_like, refresh
from titans_lm.train.state import ModelFns, TrainState

Batch = Mapping[str, jax.Array]


def split_batch(batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(inputs_BT, targets_BT, input_segment_ids_BT, weights_BT)`` of a ``[B, T+1]`` batch.

    ``weights_BT`` is float32 (1.0 for a scored target, 0.0 otherwise), by the contract above;
    a batch with an int ``loss_mask`` [B, T+1] (the synthetic tasks) scores only the targets
    ``t`` with ``loss_mask[:, t + 1] != 0`` among them; one with ``targets`` [B, T+1] (MAD:
    targets that are not the next input) takes target ``t`` from ``targets[:, t + 1]``.
    """
    tokens, seg = batch["tokens"], batch["segment_ids"]
    weights = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    if "loss_mask" in batch:  # synthetic tasks (titans_lm.data.tasks): only the answers count
        weights = weights & (batch["loss_mask"][:, 1:] != 0)
    targets = batch["targets"][:, 1:] if "targets" in batch else tokens[:, 1:]
    return tokens[:, :-1], targets, seg[:, :-1], weights.astype(jnp.float32)


def loss_sums(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
    """``(sum of weighted nll in nats, sum of weights)``, both float32 scalars (float64 for
    float64 logits)."""
    dt = jnp.promote_types(logits_BTV.dtype, jnp.float32)
    nll_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(dt), targets_BT)
    w = weights_BT.astype(dt)
    return jnp.sum(nll_BT * w), jnp.sum(w)


def _nll_sum(params: Any, batch: Batch, fns: ModelFns, compute_dtype: jnp.dtype
             ) -> tuple[jax.Array, tuple[jax.Array, Any]]:
    """``(nll_sum, (n_tokens, state after the batch))`` from the initial state (stateless)."""
    inputs, targets, seg_in, weights = split_batch(batch)
    p = cast_floats(params, compute_dtype)
    logits, state = fns.apply(p, inputs, seg_in, fns.init_state(p, inputs.shape[0]))
    nll, n = loss_sums(logits, targets, weights)
    return nll, (n, state)


def carried_nll_sum(params: Any, model_state: Any, batch: Batch, fns: ModelFns,
                    compute_dtype: jnp.dtype) -> tuple[jax.Array, tuple[jax.Array, Any]]:
    """``(nll_sum, (n_tokens, new_model_state))`` of one window batch run from a carried state
    (stateful training, ``titans_lm.train.carry``).

    The incoming ``model_state`` is a constant (gradient stopped at the window boundary) except
    for its parameter-derived parts, rebuilt from ``params`` (:func:`titans_lm.train.carry.refresh`);
    the new state has the incoming state's dtypes.
    """
    inputs, targets, seg_in, weights = split_batch(batch)
    p = cast_floats(params, compute_dtype)
    model_state = continued(model_state)
    fresh = continued(fns.init_state(p, inputs.shape[0]))
    state_in = refresh(jax.lax.stop_gradient(model_state), fresh)
    logits, state_out = fns.apply(p, inputs, seg_in, state_in)
    nll, n = loss_sums(logits, targets, weights)
    return nll, (n, jax.lax.stop_gradient(cast_like(state_out, model_state)))


def _nll_sum_and_stats(params: Any, batch: Batch, fns: ModelFns, compute_dtype: jnp.dtype,
                       model_state: Any = None):
    """``(nll_sum, (n_tokens, memory stats, new model state))``: the memory layers' state norms
    (``titans_lm.memory.stats``, computed from the state the call returns) ride along as
    auxiliary outputs, and with a carried ``model_state`` the state after this batch (else
    None)."""
    if model_state is None:
        nll, (n, state) = _nll_sum(params, batch, fns, compute_dtype)
        new_state = None
    else:
        nll, (n, state) = carried_nll_sum(params, model_state, batch, fns, compute_dtype)
        new_state = state
    norms = fns.memory_norms(cast_floats(params, compute_dtype), state)
    return nll, (n, memory_stats.as_metrics(norms), new_state)


def train_step(state: TrainState, batch: Batch, *, fns: ModelFns,
               tx: optax.GradientTransformation, schedule: optax.Schedule, grad_accum: int = 1,
               compute_dtype: str = "float32", micro_sharding: NamedSharding | None = None
               ) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update on a global batch.

    Args:
      state: the current :class:`TrainState` (donated by the jitted form). With a carried
        ``state.model_state`` (``train.carry_state``) the batch is run from it and the state it
        leaves is the new state's (truncated backprop through time, ``titans_lm.train.carry``).
      batch: ``{"tokens", "segment_ids"}`` int32 ``[B, T+1]``.
      fns: the model (:func:`titans_lm.train.state.model_fns`).
      tx, schedule: from :func:`titans_lm.train.optimizer.make_optimizer`.
      grad_accum: number of micro-batches A (must divide B).
      compute_dtype: "float32" or "bfloat16": parameters are cast to it for the forward and
        backward pass; the master parameters, gradients and optimiser state stay float32.
      micro_sharding: sharding of the ``[A, B/A, T+1]`` micro-batch stack (batch rows over the
        data axes), or None to let the compiler choose.

    Returns:
      ``(new_state, metrics)``; metrics are float32 scalars: ``loss`` (nats per scored token),
      ``grad_norm`` (global L2 norm before clipping), ``lr`` (rate used by this update),
      ``tokens`` (scored target tokens in the batch), and for each memory layer i
      ``memory_norm_i`` (its final state's norm relative to W0, ``titans_lm.memory.stats``).
    """
    dtype = jnp.dtype(compute_dtype)
    grad_fn = jax.value_and_grad(_nll_sum_and_stats, has_aux=True)

    model_state = state.model_state
    if model_state is not None and grad_accum != 1:
        raise ValueError("a carried model state (train.carry_state) needs grad_accum=1")
    if grad_accum == 1:
        (nll, (n_tok, mem, model_state)), grads = grad_fn(state.params, batch, fns, dtype,
                                                          model_state)
    else:
        def to_micro(x):
            x = x.reshape(x.shape[0] // grad_accum, grad_accum, *x.shape[1:]).swapaxes(0, 1)
            return x if micro_sharding is None else jax.lax.with_sharding_constraint(x, micro_sharding)
        micro = {k: to_micro(v) for k, v in batch.items()}

        def body(carry, mb):
            nll_acc, n_acc, g_acc = carry
            (nll_i, (n_i, mem_i, _)), g_i = grad_fn(state.params, mb, fns, dtype)
            return (nll_acc + nll_i, n_acc + n_i, jax.tree.map(jnp.add, g_acc, g_i)), mem_i

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros)
        (nll, n_tok, grads), mem = jax.lax.scan(body, init, micro)
        mem = {k: jnp.max(v) for k, v in mem.items()}  # the largest over the micro-batches
    denom = jnp.maximum(n_tok, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics = {"loss": nll / denom, "grad_norm": optax.tree.norm(grads),
               "lr": jnp.asarray(schedule(state.step), jnp.float32), "tokens": n_tok, **mem}
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1, rng=rng,
                      model_state=model_state), metrics


def eval_step(params: Any, batch: Batch, *, fns: ModelFns) -> tuple[jax.Array, jax.Array]:
    """``(nll_sum, n_tokens)``: summed nll (nats, float32) and scored-token count of a batch."""
    nll, (n, _) = _nll_sum(params, batch, fns, jnp.float32)
    return nll, n


def jit_train_step(fns: ModelFns, tx: optax.GradientTransformation, schedule: optax.Schedule,
                   state_sh: TrainState, mesh: Mesh, *, grad_accum: int = 1,
                   compute_dtype: str = "float32", remat: str = "none") -> Callable:
    """``train_step`` bound to its static arguments and jitted with shardings; the state is
    donated (its buffers are reused for the new state). The step is traced under ``mesh``
    (:func:`titans_lm.train.sharding.traced_under`), so the memory layers' Pallas kernels run
    per shard. ``remat``: the model's remat policy name, for the compiler options under which it
    holds on the mesh's backend (:func:`titans_lm.models.remat.compiler_options`)."""
    fn = functools.partial(train_step, fns=fns, tx=tx, schedule=schedule, grad_accum=grad_accum,
                           compute_dtype=compute_dtype,
                           micro_sharding=NamedSharding(mesh, P(None, shd.BATCH_AXES)))
    rep = shd.replicated(mesh)
    options = compiler_options(remat, mesh.devices.flat[0].platform)
    return jax.jit(shd.traced_under(mesh, fn), in_shardings=(state_sh, shd.batch_sharding(mesh)),
                   out_shardings=(state_sh, rep), donate_argnums=0, compiler_options=options)


def jit_eval_step(fns: ModelFns, params_sh: Any, mesh: Mesh) -> Callable:
    """``eval_step`` jitted with the parameters' shardings and a data-sharded batch (traced
    under ``mesh``, as :func:`jit_train_step`)."""
    rep = shd.replicated(mesh)
    return jax.jit(shd.traced_under(mesh, functools.partial(eval_step, fns=fns)),
                   in_shardings=(params_sh, shd.batch_sharding(mesh)), out_shardings=(rep, rep))


def carried_eval_step(params: Any, model_state: Any, batch: Batch, *, fns: ModelFns
                      ) -> tuple[jax.Array, jax.Array, Any]:
    """``(nll_sum, n_tokens, model_state after the batch)`` of one window batch run from a
    carried ``model_state`` (float32, as :func:`eval_step`; :func:`carried_nll_sum`)."""
    nll, (n, state) = carried_nll_sum(params, model_state, batch, fns, jnp.float32)
    return nll, n, state


def jit_carried_eval_step(fns: ModelFns, params_sh: Any, state_sh: Any, mesh: Mesh) -> Callable:
    """``carried_eval_step`` jitted with the parameters' and the model state's shardings
    (``titans_lm.train.carry.model_state_shardings``) and a data-sharded batch (traced under
    ``mesh``); the incoming model state is donated."""
    rep = shd.replicated(mesh)
    return jax.jit(shd.traced_under(mesh, functools.partial(carried_eval_step, fns=fns)),
                   in_shardings=(params_sh, state_sh, shd.batch_sharding(mesh)),
                   out_shardings=(rep, rep, state_sh), donate_argnums=1)
