"""The inner-loop memory engine: fast-weight models that learn at test time.

Functional core (one head; vmap over batch and heads):
  memory_scan(params0, momentum0, k, v, q, theta, eta, alpha, *, model, chunk_size,
              impl="chunked", read="after_write", reset=None, reset_to=None,
              state_length=None) -> (reads, (P_L, S_L))
  memory_read(params, q, model) -> reads
Inner models: LinearMemory, MLPMemory, SwiGLUMemory, ResidualLN (+ the shorthands "linear", "mlp",
"swiglu"); LaCT's weight normalisation: normalize_fast_weights (titans_lm.memory.weight_norm).
Layer: NeuralMemory (titans_lm.memory.layer) configured by MemoryConfig (titans_lm.memory.config),
with its carried MemoryState (``init_state(B)``, ``layer(x_BTD, stream, state) -> (y, state)``).
"""

from titans_lm.memory.chunked import chunk_step, chunk_step_from_coefficients, chunked_scan
from titans_lm.memory.coefficients import ChunkCoefficients, chunk_coefficients, segment_products
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.inner_models import (InnerModel, LinearMemory, MLPMemory, ResidualLN,
                                           SwiGLUMemory, make_inner_model, resolve_model)
from titans_lm.memory.reference import reference_scan
from titans_lm.memory.scan import (IMPLEMENTATIONS, get_implementation, memory_read, memory_scan,
                                   register_implementation)
from titans_lm.memory.weight_norm import normalize_fast_weights
from titans_lm.memory.carried import MemoryState  # noqa: E402
from titans_lm.memory.layer import MemoryInputs, NeuralMemory  # noqa: E402  (after the engine)

__all__ = [
    "ChunkCoefficients", "IMPLEMENTATIONS", "InnerModel", "LinearMemory", "MLPMemory", "MemoryConfig",
    "MemoryInputs", "MemoryState", "NeuralMemory", "ResidualLN", "SwiGLUMemory",
    "chunk_coefficients", "chunk_step",
    "chunk_step_from_coefficients", "chunked_scan", "get_implementation", "make_inner_model",
    "memory_read", "memory_scan", "normalize_fast_weights", "reference_scan",
    "register_implementation", "resolve_model", "segment_products",
]
