"""Document starts and chunk starts in the engine: resets off a chunk start raise outside jit, and
packed documents of every length from 1 to 3 chunks (each padded to the alignment, as the pipeline
pads them) equal each one alone. (The configs that could put a reset inside a chunk are rejected
by the config: tests/config/test_alignment.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory import MemoryConfig, NeuralMemory, memory_scan
from _memory_call import call_fresh

CHUNK = 4


def test_a_reset_off_a_chunk_start_raises_outside_jit_and_is_ignored_under_jit():
    with jax.enable_x64(True):
        T, d = 8, 3
        rng = np.random.default_rng(0)
        k, v, q = (jnp.asarray(rng.normal(size=(T, d))) for _ in range(3))
        g = jnp.full((T,), 0.1)
        W = (jnp.eye(d),)
        reset = jnp.zeros(T, bool).at[3].set(True)
        kw = dict(model="linear", chunk_size=CHUNK)
        with pytest.raises(ValueError, match="reset at position 3 .* is not a chunk start"):
            memory_scan(W, (jnp.zeros((d, d)),), k, v, q, g, g, g, reset=reset, **kw)
        f = jax.jit(lambda r: memory_scan(W, (jnp.zeros((d, d)),), k, v, q, g, g, g, reset=r,
                                          **kw)[0])
        np.testing.assert_array_equal(f(reset), f(jnp.zeros(T, bool)))


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
def test_packed_documents_of_every_length_equal_each_alone(settings):
    lengths = list(range(1, 3 * CHUNK + 1))        # 1 token .. 3 chunks
    ids, starts = _packed_window(lengths, CHUNK)
    T = len(ids)
    with jax.enable_x64(True):
        cfg = MemoryConfig(d_model=16, n_heads=2, head_dim=8, chunk_size=CHUNK, memory_expansion=2.0,
                           theta_max=0.3, alpha_bias_init=-2.0, dtype="float64",
                           param_dtype="float64", **settings)
        with nnx.use_eager_sharding(False):
            layer = NeuralMemory(cfg, rngs=nnx.Rngs(0))
        x = jax.random.normal(jax.random.key(1), (1, T, 16), jnp.float64)
        packed = np.asarray(call_fresh(layer, x, jnp.asarray(ids)[None]))
        alone_x = np.zeros((len(lengths), 3 * CHUNK, 16))
        alone_ids = np.zeros((len(lengths), 3 * CHUNK), np.int32)
        for n, (L, s) in enumerate(zip(lengths, starts)):
            alone_x[n, :L] = np.asarray(x[0, s:s + L])
            alone_ids[n, :L] = 1
        alone = np.asarray(call_fresh(layer, jnp.asarray(alone_x), jnp.asarray(alone_ids)))
        worst = 0.0
        for n, (L, s) in enumerate(zip(lengths, starts)):
            worst = max(worst, float(np.max(np.abs(packed[0, s:s + L] - alone[n, :L]))))
        print(f"\n{len(lengths)} documents of 1..{3 * CHUNK} tokens packed in {T}: "
              f"max |packed - alone| = {worst:.1e}")
        assert worst < 1e-12
        assert np.max(np.abs(packed)) > 0.1
