"""Document starts and chunk starts: configurations that could put a reset inside a chunk are
rejected, resets off a chunk start raise outside jit, and packed documents of every length from
1 to 3 chunks (each padded to the alignment, as the pipeline pads them) equal each one alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.config import validate
from titans_lm.memory import MemoryConfig, NeuralMemory, memory_scan
from titans_lm.memory.alignment import check_reset_alignment
from _memory_call import call_fresh

CHUNK = 4


def _load(name):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config("tiny")


def test_config_rejects_a_chunk_size_that_does_not_divide_the_document_alignment():
    c = _load("lmm")
    validate(c)                                    # 16 divides 64
    c.model.memory.chunk_size = 48
    with pytest.raises(ValueError, match=r"model.memory.chunk_size=48 must divide data.doc_align=64"):
        validate(c)


def test_config_names_every_offending_field():
    c = _load("mac")
    c.model.memory.chunk_size = 48
    c.model.segment_len = 100
    with pytest.raises(ValueError) as e:
        validate(c)
    msg = str(e.value)
    assert "model.memory.chunk_size=48" in msg and "data.doc_align=64" in msg
    assert "model.segment_len=100" in msg
    c.model.memory.chunk_size = 16
    c.model.segment_len = 64
    validate(c)
    check_reset_alignment(8, {"data.doc_align": 64, "model.segment_len": 32})


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
