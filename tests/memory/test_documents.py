"""Documents in the memory layer: packed documents of every length from 1 to 3 chunks, back to back
(so they start at every offset inside a chunk) or padded to the chunk grid, equal each one alone
at the same offset inside a chunk (the other documents replaced by padding)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory import MemoryConfig, NeuralMemory
from _memory_call import call_fresh

CHUNK = 4


def _packed_window(lengths, align):
    """Documents of the given lengths, each padded to a multiple of align, back to back."""
    ids, starts = [], []
    for n, L in enumerate(lengths, start=1):
        starts.append(len(ids))
        padded = -(-L // align) * align
        ids += [n] * L + [0] * (padded - L)
    return np.asarray(ids, np.int32), starts


@pytest.mark.parametrize("settings", [
    dict(impl="chunked"),
    dict(impl="reference"),
    dict(impl="chunked", memory_depth=1, memory_residual_ln=True, memory_ln_fast=False,
         memory_bias=True, read_running_mean=True, gate_style="ttt", use_momentum=False,
         use_decay=False, use_conv=False, qk_l2_norm=False),
], ids=["titans-chunked", "titans-reference", "ttt-chunked"])
@pytest.mark.parametrize("align", [1, CHUNK], ids=["back-to-back", "chunk-aligned"])
def test_packed_documents_of_every_length_equal_each_alone(settings, align):
    lengths = list(range(1, 3 * CHUNK + 1))        # 1 token .. 3 chunks
    ids, starts = _packed_window(lengths, align)
    T = len(ids)
    with jax.enable_x64(True):
        cfg = MemoryConfig(d_model=16, n_heads=2, head_dim=8, chunk_size=CHUNK, memory_expansion=2.0,
                           theta_max=0.3, alpha_bias_init=-2.0, dtype="float64",
                           param_dtype="float64", **settings)
        with nnx.use_eager_sharding(False):
            layer = NeuralMemory(cfg, rngs=nnx.Rngs(0))
        x = jax.random.normal(jax.random.key(1), (1, T, 16), jnp.float64)
        packed = np.asarray(call_fresh(layer, x, jnp.asarray(ids)[None]))
        alone_x = np.zeros((len(lengths), 4 * CHUNK, 16))       # padding, then the document
        alone_ids = np.zeros((len(lengths), 4 * CHUNK), np.int32)  # at its offset in a chunk
        for n, (L, s) in enumerate(zip(lengths, starts)):
            o = s % CHUNK
            alone_x[n, o:o + L] = np.asarray(x[0, s:s + L])
            alone_ids[n, o:o + L] = 1
        alone = np.asarray(call_fresh(layer, jnp.asarray(alone_x), jnp.asarray(alone_ids)))
        worst = 0.0
        for n, (L, s) in enumerate(zip(lengths, starts)):
            o = s % CHUNK
            worst = max(worst, float(np.max(np.abs(packed[0, s:s + L] - alone[n, o:o + L]))))
        assert align == CHUNK or {s % CHUNK for s in starts} == set(range(CHUNK))
        print(f"\n{len(lengths)} documents of 1..{3 * CHUNK} tokens packed in {T}: "
              f"max |packed - alone| = {worst:.1e}")
        assert worst < 1e-12
        assert np.max(np.abs(packed)) > 0.1
