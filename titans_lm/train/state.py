"""The train state (a plain pytree) and how it is built, sharded and described abstractly.

The model is an ``nnx.Module``; training works on its split form. ``nnx.split`` gives a static
graph definition and the parameters; the parameters travel as a *pure dict* of float32 arrays
(``nnx.to_pure_dict``), which jit, optax and orbax all handle as an ordinary pytree. The module
is rebuilt inside the jitted step by :class:`ModelFns`, whose two calls are the model's one API
over parameters (used by training, evaluation, streaming, the task probes and generation):

    state = fns.init_state(params, B)
    logits_BTV, state = fns.apply(params, tokens_BT, segment_ids_BT, state)

A stateless caller passes ``fns.init_state(params, B)`` and drops the state it gets back (the
initial state is marked fresh, so the call compiles to the single-sequence program;
``titans_lm.models.lm.LMState``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from titans_lm.models import build_model
from titans_lm.models.lm import continued
from titans_lm.nn.dtypes import cast_floats
from titans_lm.train import sharding as shd
from titans_lm.train.carry import model_state_shardings


@struct.dataclass
class TrainState:
    """Everything a train step reads and writes.

    Attributes:
      params: pure-dict tree of float32 parameters (the master copy).
      opt_state: the optax state (AdamW moments, counters), float32.
      step: int32 scalar, the number of optimiser updates applied so far.
      rng: uint32[2] raw PRNG key, split once per step (for stochastic layers; carried so that a
        resumed run continues the same random stream).
      model_state: with ``train.carry_state`` the model's carried state
        (``LanguageModel.init_state(B)`` for the global batch B, then what each step returns;
        ``titans_lm.train.carry``); None otherwise.
    """
    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    model_state: Any = None


@dataclasses.dataclass(frozen=True)
class ModelFns:
    """The static parts of a model: graph definition, parameter template, non-parameter state.

    Attributes:
      graphdef: ``nnx.GraphDef`` of the module.
      template: ``nnx.State`` of the parameters holding ``ShapeDtypeStruct`` (no data).
      rest: ``nnx.State`` of everything that is not an ``nnx.Param`` (constants of the module).
      logical_axes: pure-dict tree of logical ``PartitionSpec`` per parameter.
    """
    graphdef: Any
    template: Any
    rest: Any
    logical_axes: Any

    def module(self, params: Any) -> nnx.Module:
        """Rebuild the module with ``params`` (a pure dict) in place of the template's values."""
        state = jax.tree.map(lambda x: x, self.template)  # fresh Variables
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state, self.rest)

    def init_state(self, params: Any, batch_size: int) -> Any:
        """``model.init_state(batch_size)`` of the model with ``params``: the state a stream of
        ``batch_size`` rows starts from (``titans_lm.models.lm.LanguageModel.init_state``;
        marked fresh, see ``LMState.continued``). Pure and jit-compatible (``batch_size``
        static)."""
        with nnx.use_eager_sharding(False):
            return self.module(params).init_state(int(batch_size))

    def apply(self, params: Any, tokens_BT: jax.Array, segment_ids_BT: jax.Array,
              state: Any) -> tuple[jax.Array, Any]:
        """The model with ``params`` on int32 ``[B, T]`` inputs from ``state``
        (:meth:`init_state` or what a previous call returned): ``(logits_BTV, new_state)``,
        logits float32 (float64 for a float64 model). Pure and jit-compatible."""
        with nnx.use_eager_sharding(False):
            logits, new_state = self.module(params)(tokens_BT, segment_ids_BT, state)
        return logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), new_state

    def reset_memory(self, params: Any, state: Any, rows_B: jax.Array) -> Any:
        """``state`` with every neural memory of the rows ``rows_B`` (bool [B]) reset to what a
        document start restores with ``params`` (``LanguageModel.reset_memory``)."""
        with nnx.use_eager_sharding(False):
            return self.module(params).reset_memory(state, rows_B)

    def memory_norms(self, params: Any, state: Any) -> tuple[jax.Array, ...]:
        """Per neural memory, ``||P|| / ||W0||`` of the memory ``state`` holds
        (``LanguageModel.memory_norms``, ``titans_lm.memory.stats``)."""
        with nnx.use_eager_sharding(False):
            return self.module(params).memory_norms(state)

    def abstract_params(self) -> Any:
        """Pure-dict tree of ``ShapeDtypeStruct`` for the parameters."""
        return nnx.to_pure_dict(self.template)


def _build(model_cfg: ml_collections.ConfigDict, seed: int) -> nnx.Module:
    with nnx.use_eager_sharding(False):
        return build_model(model_cfg, rngs=nnx.Rngs(seed))


def init_params(model_cfg: ml_collections.ConfigDict, seed: int) -> Any:
    """The parameters a run with ``seed`` starts from, as a pure dict (the values
    :func:`init_state` places in its shardings; on the default device here)."""
    return nnx.to_pure_dict(nnx.split(_build(model_cfg, seed), nnx.Param, ...)[1])


def model_fns(model_cfg: ml_collections.ConfigDict) -> ModelFns:
    """Describe the model of ``model_cfg`` without allocating its parameters."""
    with nnx.use_eager_sharding(False):
        abstract = nnx.eval_shape(lambda: _build(model_cfg, 0))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    if jax.tree.leaves(rest):
        # Non-parameter variables are treated as constants of the module; materialise them once.
        rest = nnx.split(_build(model_cfg, 0), nnx.Param, ...)[2]
    return ModelFns(graphdef=graphdef, template=params, rest=rest,
                    logical_axes=shd.param_logical_axes(params))


def count_params(fns: ModelFns) -> int:
    """Number of scalar parameters."""
    return int(sum(x.size for x in jax.tree.leaves(fns.abstract_params())))


def _opt_state_shardings(abstract_opt_state: Any, abstract_params: Any, param_sh: Any,
                         mesh: Mesh) -> Any:
    """Shard each optimiser leaf like the parameter whose path ends its own path (moments),
    everything else (counters) replicated."""
    by_path = {tuple(p): (x.shape, s) for (p, x), s in zip(
        jax.tree_util.tree_flatten_with_path(abstract_params)[0], jax.tree.leaves(param_sh))}
    rep = shd.replicated(mesh)

    def pick(path, leaf):
        path = tuple(path)
        for i in range(len(path)):
            hit = by_path.get(path[i:])
            if hit is not None and hit[0] == leaf.shape:
                return hit[1]
        return rep
    return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


@dataclasses.dataclass(frozen=True)
class Carry:
    """How the train state carries the model state (``train.carry_state``; ``titans_lm.train.carry``).

    Attributes:
      batch_size: global batch rows B (0: no carried state, ``TrainState.model_state`` is None).
      compute_dtype: the dtype the parameters are cast to for the forward pass ("float32" or
        "bfloat16"); the carried state is built with the parameters in that dtype
        (:func:`initial_model_state`).
    """
    batch_size: int = 0
    compute_dtype: str = "float32"


NO_CARRY = Carry()


def initial_model_state(fns: ModelFns, carry: Carry, params: Any, batch_size: int | None = None
                        ) -> Any:
    """``fns.init_state`` with the parameters cast to ``carry.compute_dtype``, for
    ``batch_size`` rows (default ``carry.batch_size``), without the fresh mark
    (``LMState.continued``): the carried state keeps one structure from step to step."""
    b = carry.batch_size if batch_size is None else batch_size
    return continued(fns.init_state(cast_floats(params, jnp.dtype(carry.compute_dtype)), b))


def state_shardings(fns: ModelFns, tx: optax.GradientTransformation, mesh: Mesh,
                    carry: Carry = NO_CARRY) -> TrainState:
    """A ``TrainState`` of ``NamedSharding``: parameters by the logical-axis table, optimiser
    moments like their parameters, step and rng replicated, a carried model state like the batch
    (``titans_lm.train.carry.model_state_shardings``)."""
    abs_params = fns.abstract_params()
    param_sh = shd.param_shardings(abs_params, fns.logical_axes, mesh)
    abs_opt = jax.eval_shape(tx.init, abs_params)
    rep = shd.replicated(mesh)
    model_state = None
    if carry.batch_size:
        model_state = model_state_shardings(
            lambda b: jax.eval_shape(lambda p: initial_model_state(fns, carry, p, b), abs_params),
            carry.batch_size, mesh)
    return TrainState(params=param_sh,
                      opt_state=_opt_state_shardings(abs_opt, abs_params, param_sh, mesh),
                      step=rep, rng=rep, model_state=model_state)


def abstract_state(fns: ModelFns, tx: optax.GradientTransformation, mesh: Mesh,
                   carry: Carry = NO_CARRY) -> TrainState:
    """``TrainState`` of ``ShapeDtypeStruct`` carrying the target shardings (a restore target)."""
    abs_params = fns.abstract_params()
    model_state = (jax.eval_shape(lambda p: initial_model_state(fns, carry, p), abs_params)
                   if carry.batch_size else None)
    shapes = TrainState(params=abs_params, opt_state=jax.eval_shape(tx.init, abs_params),
                        step=jax.ShapeDtypeStruct((), jnp.int32),
                        rng=jax.ShapeDtypeStruct((2,), jnp.uint32), model_state=model_state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, state_shardings(fns, tx, mesh, carry))


def init_state(model_cfg: ml_collections.ConfigDict, fns: ModelFns,
               tx: optax.GradientTransformation, mesh: Mesh, seed: int,
               carry: Carry = NO_CARRY, params: Any = None) -> TrainState:
    """Fresh state from ``seed``, created directly in its shardings (one jitted init); with
    ``carry`` the model state a stream of ``carry.batch_size`` rows starts from.

    Parameter values depend on ``seed`` only, not on the mesh (JAX's partitionable threefry).
    ``params`` (a warm start, ``titans_lm.train.warm_start``) replaces them: the optimiser state,
    step and carried state are built from those as from fresh ones.
    """
    def init(params) -> TrainState:
        if params is None:
            params = init_params(model_cfg, seed)
        key = jax.random.fold_in(jax.random.key(seed), 1)  # distinct from the init stream
        model_state = initial_model_state(fns, carry, params) if carry.batch_size else None
        return TrainState(params=params, opt_state=tx.init(params),
                          step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(key),
                          model_state=model_state)
    return jax.jit(init, out_shardings=state_shardings(fns, tx, mesh, carry))(params)
