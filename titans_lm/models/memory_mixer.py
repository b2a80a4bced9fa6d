"""The neural memory as a token mixer: config mapping, persistent prefixes, layer selection.

Shared by the memory backbones (TTT-Linear, TTT-MLP, Titans LMM, MAC, MAG, MAL):

- :func:`memory_config`: the ``model.memory`` config section -> ``titans_lm.memory.MemoryConfig``
  (``d_model``, ``dtype`` and ``param_dtype`` come from the model section; ``n_heads = 0`` means
  ``d_model // head_dim``).
- :func:`make_memory`: a ``NeuralMemory`` whose output projection W_O, when it feeds the residual
  stream directly, gets the LM's depth-scaled init (GPT-2, see ``titans_lm.nn.init.scaled_out_std``)
  like every other residual branch.
- :class:`MemoryMixer`: the memory as a block's token mixer on the mixer protocol
  (``init_state(B)``, ``mixer(x_BTD, stream, state) -> (y_BTD, state)``). Persistent tokens
  (Titans eqs. 26 and 29) are run by ``LanguageModel.init_state`` as a call of their own: the
  memory writes (and reads) the N_p persistent positions from its learned initial state W0, giving
  a state P_p that depends on parameters only, and every document then starts from (P_p, 0)
  instead of (W0, 0), on a chunk grid that starts at the first real token
  (``titans_lm.memory.layer``). So each document sees exactly what a lone sequence
  [p || document] would give it (the paper's setting, one document per sequence), and a document
  start on the chunk grid is a chunk start whatever N_p is.
- :func:`memory_layer_indices`: which layers of a hybrid carry memory (config ``memory_layers``).
- :func:`build_memory_lm`: an LM whose every token mixer is a memory (TTT-Linear/MLP, LMM).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.carried import MemoryState
from titans_lm.memory.layer import NeuralMemory
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


class MemoryMixer(nnx.Module):
    """The neural memory as a block's token mixer (the mixer protocol).

    ``mixer.init_state(B) -> MemoryState``; ``mixer(x_BTD, stream, state) -> (y_BTD, state)``
    (``titans_lm.memory.layer.NeuralMemory``).

    Args:
      memory: the NeuralMemory layer (attribute ``memory``).
    """

    def __init__(self, memory: NeuralMemory):
        self.memory = memory

    def init_state(self, batch_size: int) -> MemoryState:
        return self.memory.init_state(batch_size)

    def __call__(self, x_BTD: jax.Array, stream, state: MemoryState
                 ) -> tuple[jax.Array, MemoryState]:
        return self.memory(x_BTD, stream, state)

    def reset_memory(self, state: MemoryState, rows_B: jax.Array) -> MemoryState:
        return self.memory.reset_memory(state, rows_B)

    def memory_norms(self, state: MemoryState) -> tuple[jax.Array]:
        return self.memory.memory_norms(state)


def build_memory_lm(model_cfg, *, rngs: nnx.Rngs, n_persistent: int = 0):
    """An LM whose every block mixes tokens with a NeuralMemory only (TTT, Titans LMM).

    The memory's W_O gets the depth-scaled residual init; ``n_persistent`` persistent tokens are
    run by the LM shell's ``init_state`` (see :class:`MemoryMixer`).

    Raises:
      ValueError: on missing or invalid config fields.
    """
    check_model_config(model_cfg)
    check_model_config(model_cfg, ("memory",))
    mcfg = memory_config(model_cfg)
    out_std = scaled_out_std(model_cfg.init_std, model_cfg.n_layers)

    def make_mixer(layer: int, rngs: nnx.Rngs) -> MemoryMixer:
        del layer
        return MemoryMixer(make_memory(mcfg, rngs=rngs, out_init_std=out_std))

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs, n_persistent=n_persistent)
