"""The neural memory as a token mixer: config mapping, persistent prefixes, layer selection.

Shared by the memory backbones (TTT-Linear, TTT-MLP, Titans LMM, MAC, MAG, MAL):

- :func:`memory_config`: the ``model.memory`` config section -> ``titans_lm.memory.MemoryConfig``
  (``d_model``, ``dtype`` and ``param_dtype`` come from the model section; ``n_heads = 0`` means
  ``d_model // head_dim``).
- :func:`make_memory`: a ``NeuralMemory`` whose output projection W_O, when it feeds the residual
  stream directly, gets the LM's depth-scaled init (GPT-2, see ``titans_lm.nn.init.scaled_out_std``)
  like every other residual branch.
- :func:`prefixed_memory`: M(x~) for x~ = [p_1 .. p_Np || x] (Titans eqs. 26 and 29, persistent
  tokens prepended by the LM shell). The memory first writes (and reads) the N_p persistent
  positions from its learned initial state W0, giving a state P_p that depends on parameters only;
  every document of the packed window then starts from (P_p, 0) instead of (W0, 0). So each
  document sees exactly what a lone sequence [p || document] would give it (the paper's setting,
  one document per sequence), and the documents' chunk grid stays aligned with the window (a
  document start at a multiple of 64 in x is a chunk start), whatever N_p is.
- :func:`memory_layer_indices`: which layers of a hybrid carry memory (config ``memory_layers``).
- :func:`build_memory_lm`: an LM whose every token mixer is a memory (TTT-Linear/MLP, LMM).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import MemoryInputs, NeuralMemory
from titans_lm.models.lm import LanguageModel, check_model_config
from titans_lm.nn.init import normal_param, scaled_out_std


def memory_config(model_cfg) -> MemoryConfig:
    """The memory-layer settings of a backbone's model config.

    ``model_cfg.memory`` holds MemoryConfig fields (all but d_model, dtype, param_dtype, which come
    from the model section). ``n_heads = 0`` (or missing) means ``d_model // head_dim``.

    Raises:
      ValueError: for a missing ``memory`` section, an unknown field, a bad value, or a d_model
        that head_dim does not divide when n_heads is automatic.
    """
    if "memory" not in model_cfg:
        raise ValueError(f"model config ({model_cfg.get('name', '?')!r}) has no 'memory' section")
    if "memory_eta_max" in model_cfg:
        raise ValueError("model.memory_eta_max is not a model field: the momentum gate bound is "
                         "model.memory.eta_max")
    section = model_cfg.memory
    values = dict(section.to_dict() if hasattr(section, "to_dict") else section)
    for key in ("d_model", "dtype", "param_dtype"):
        if key in values:
            raise ValueError(f"model.memory.{key} is taken from the model section; set model.{key}")
    d_model = int(model_cfg.d_model)
    head_dim = int(values.get("head_dim", MemoryConfig.head_dim))
    if not values.get("n_heads"):
        if head_dim < 1 or d_model % head_dim:
            raise ValueError(f"model.memory.head_dim={head_dim} must divide model.d_model={d_model} "
                             "when model.memory.n_heads is 0 (automatic)")
        values["n_heads"] = d_model // head_dim
    return MemoryConfig.from_dict(values, d_model=d_model, dtype=str(model_cfg.dtype),
                                  param_dtype=str(model_cfg.get("param_dtype", "float32")))


def make_memory(cfg: MemoryConfig, *, rngs: nnx.Rngs,
                out_init_std: Optional[float] = None) -> NeuralMemory:
    """A NeuralMemory; with ``out_init_std`` its W_O [H, Dh, D] is drawn from N(0, out_init_std^2)
    (the residual-branch init) instead of the layer's fan-in default."""
    memory = NeuralMemory(cfg, rngs=rngs)
    if out_init_std is not None:
        memory.w_out = normal_param(rngs, (cfg.n_heads, cfg.head_dim, cfg.d_model), out_init_std,
                                    ("heads", "head_dim", "embed"), jnp.dtype(cfg.param_dtype))
    return memory


def memory_layer_indices(spec, n_layers: int) -> frozenset[int]:
    """Parse the ``memory_layers`` field: "all", "none", or comma-separated layer indices ("0,2").

    Negative indices count from the end ("-1" is the last layer).

    Raises:
      ValueError: for an unparsable spec or an index outside [-n_layers, n_layers).
    """
    text = str(spec).strip().lower()
    if text == "all":
        return frozenset(range(n_layers))
    if text in ("none", ""):
        return frozenset()
    out = set()
    for part in text.split(","):
        try:
            i = int(part)
        except ValueError:
            raise ValueError(f"model.memory_layers must be 'all', 'none' or comma-separated layer "
                             f"indices, got {spec!r}") from None
        if not -n_layers <= i < n_layers:
            raise ValueError(f"model.memory_layers index {i} is outside the {n_layers} layers")
        out.add(i % n_layers)
    return frozenset(out)


def _time_slice(inputs: MemoryInputs, start: int, stop: int) -> MemoryInputs:
    return MemoryInputs(q=inputs.q[:, :, start:stop], k=inputs.k[:, :, start:stop],
                        v=inputs.v[:, :, start:stop], theta=inputs.theta[:, :, start:stop],
                        eta=inputs.eta[:, :, start:stop], alpha=inputs.alpha[:, :, start:stop],
                        reset=inputs.reset[:, start:stop],
                        log_keep=(None if inputs.log_keep is None
                                  else inputs.log_keep[:, :, start:stop]))


def prefixed_memory(memory: NeuralMemory, x_BSD: jax.Array, segment_ids_BS: jax.Array,
                    n_prefix: int) -> jax.Array:
    """M(x~) over a sequence whose first ``n_prefix`` positions are persistent tokens.

    Args:
      memory: the NeuralMemory layer.
      x_BSD: [B, N_p + T, D] the mixer input, persistent positions first.
      segment_ids_BS: int [B, N_p + T] (persistent positions carry PERSISTENT_SEGMENT_ID).
      n_prefix: N_p >= 0; 0 is the plain layer call.
    Returns:
      [B, N_p + T, D] in the memory's compute dtype (see the module docstring for the state at
      document starts).
    Raises:
      ValueError: if n_prefix is negative or not shorter than the sequence.
    """
    if not 0 <= n_prefix < x_BSD.shape[1]:
        raise ValueError(f"n_prefix={n_prefix} must be in [0, {x_BSD.shape[1]}) for a sequence of "
                         f"{x_BSD.shape[1]} positions")
    inputs = memory.project(x_BSD, segment_ids_BS)
    state0 = memory.initial_state(x_BSD.shape[0])
    if n_prefix == 0:
        reads, _ = memory.scan(state0, inputs.q, inputs.k, inputs.v, inputs.theta, inputs.eta,
                               inputs.alpha, inputs.reset, log_keep=inputs.log_keep)
        return memory.output(reads, x_BSD)
    pre = _time_slice(inputs, 0, n_prefix)
    rest = _time_slice(inputs, n_prefix, x_BSD.shape[1])
    reads_p, state_p = memory.scan(state0, pre.q, pre.k, pre.v, pre.theta, pre.eta, pre.alpha,
                                   pre.reset, log_keep=pre.log_keep)
    reads_x, _ = memory.scan(state_p, rest.q, rest.k, rest.v, rest.theta, rest.eta, rest.alpha,
                             rest.reset, reset_to=state_p[0], log_keep=rest.log_keep)  # documents restart from the prefix's state
    return memory.output(jnp.concatenate([reads_p, reads_x], axis=2), x_BSD)


class MemoryMixer(nnx.Module):
    """The neural memory as a block's token mixer: ``mixer(x_BSD, segment_ids_BS) -> y_BSD``.

    Args:
      memory: the NeuralMemory layer (attribute ``memory``).
      n_persistent: number of persistent positions the LM shell prepends (0: none); see
        :func:`prefixed_memory`.
    """

    def __init__(self, memory: NeuralMemory, n_persistent: int = 0):
        if n_persistent < 0:
            raise ValueError(f"n_persistent must be >= 0, got {n_persistent}")
        self.memory, self.n_persistent = memory, n_persistent

    def __call__(self, x_BSD: jax.Array, segment_ids_BS: jax.Array) -> jax.Array:
        return prefixed_memory(self.memory, x_BSD, segment_ids_BS, self.n_persistent)


def build_memory_lm(model_cfg, *, rngs: nnx.Rngs, n_persistent: int = 0):
    """An LM whose every block mixes tokens with a NeuralMemory only (TTT, Titans LMM).

    The memory's W_O gets the depth-scaled residual init; ``n_persistent`` persistent tokens are
    prepended by the LM shell and handled by :func:`prefixed_memory`.

    Raises:
      ValueError: on missing or invalid config fields.
    """
    check_model_config(model_cfg)
    check_model_config(model_cfg, ("memory",))
    mcfg = memory_config(model_cfg)
    out_std = scaled_out_std(model_cfg.init_std, model_cfg.n_layers)

    def make_mixer(layer: int, rngs: nnx.Rngs) -> MemoryMixer:
        del layer
        return MemoryMixer(make_memory(mcfg, rngs=rngs, out_init_std=out_std), n_persistent)

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs, n_persistent=n_persistent)
