"""Large memory chunks (LaCT/TNT-style, up to 2048): accepted and built, and documents stay
isolated at a chunk of 128."""

import jax
import numpy as np
import pytest

from _backbones import BACKBONES, build, forward, load_config, small_model_cfg
from titans_lm.config import validate
from titans_lm.train.state import model_fns


def large_chunk_config(name, chunk):
    c = load_config(name)
    c.model.memory.chunk_size = chunk
    c.data.seq_len = 2 * chunk
    if "segment_len" in c.model:
        c.model.segment_len = chunk
    return c


@pytest.mark.parametrize("name", BACKBONES)
def test_chunk_2048_accepted(name):
    c = large_chunk_config(name, 2048)
    validate(c)
    model_fns(c.model)          # builds (abstractly)


def test_documents_isolated_at_chunk_128():
    with jax.enable_x64(True):
        m = small_model_cfg("lmm", memory__chunk_size=128)
        model = build(m)
        rng = np.random.default_rng(0)
        tok = rng.integers(4, 64, (1, 256)).astype(np.int32)
        seg = np.concatenate([np.ones(128), 2 * np.ones(128)])[None].astype(np.int32)
        packed = forward(model, tok, seg)
        alone_b = forward(model, tok[:, 128:], np.ones((1, 128), np.int32))
        np.testing.assert_allclose(packed[:, 128:], alone_b, rtol=1e-9, atol=1e-12)
        alone_a = forward(model, tok[:, :128], np.ones((1, 128), np.int32))
        np.testing.assert_allclose(packed[:, :128], alone_a, rtol=1e-9, atol=1e-12)
