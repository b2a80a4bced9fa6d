"""A backbone's tiny config in float64 (d_model 32, 2 layers, memory head 16, chunk 8, windows of
8 tokens), built as ``(ModelFns, params)``: the models of the streaming, decoding and carried-state
equivalence tests."""

from _tiny_run import REPO
from titans_lm.config import load
from titans_lm.train.state import init_params, model_fns

VOCAB = 64


def _load(name):
    return load(REPO / "configs" / f"{name}.py", "tiny").model


def float64_lm(name, memory_changes=None, **changes):
    """``(fns, params)`` of ``configs/<name>.py:tiny`` at the test size, in float64; ``changes``
    set model fields, ``memory_changes`` fields of ``model.memory``."""
    m = _load(name)
    m.vocab_size, m.d_model, m.n_layers, m.d_ff = VOCAB, 32, 2, 64
    m.dtype = m.param_dtype = "float64"
    if "n_heads" in m:
        m.n_heads = 2
    if "memory" in m:
        m.memory.head_dim = 16
        if "chunk_size" in m.memory:
            m.memory.chunk_size = 8
        for k, v in (memory_changes or {}).items():
            m.memory[k] = v
    if "window" in m and name != "transformer":
        m.window = 8
    for k, v in changes.items():
        m[k] = v
    fns = model_fns(m)
    params = init_params(m, 0)
    return fns, params
