"""Prefill + token-by-token decoding with the carried state equals one parallel forward, and a
batch of prompts of different lengths decodes each row as if alone (float64 models)."""

import jax
import numpy as np
import pytest

from _float64_lm import float64_lm as _build_model
from titans_lm.config import BOS_ID
from titans_lm.generate.decode import Decoder, generate, pad_prompts
from titans_lm.generate.sampling import SamplingConfig

pytestmark = pytest.mark.usefixtures("x64")  # float64 models (tests/conftest.py)

# The loop is the same for every backbone: it runs here on Transformer++; every backbone's
# prefill + decode == parallel forward, rows at different points of their prompts included, is
# tests/models/test_stateful.py's.
BACKBONES = [pytest.param("transformer", {"max_context": 64}, id="transformer")]




def _prompt(n, seed):
    t = np.random.default_rng(seed).integers(4, 64, n).astype(np.int32)
    t[0] = BOS_ID
    return t


_DECODERS = {}
_MODELS = {}


def _model(name, **changes):
    """The float64 test model (built once per module and setting)."""
    key = (name, tuple(sorted(changes.items())))
    if key not in _MODELS:
        _MODELS[key] = _build_model(name, **changes)
    return _MODELS[key]


def _run(fns, params, prompts, n_new, sampling=SamplingConfig(temperature=0.0), **kw):
    """generate() with one Decoder per model and sampling setting (compiled shapes reused)."""
    key = (id(fns), sampling)
    if key not in _DECODERS:
        _DECODERS[key] = (fns, Decoder(fns, sampling))
    return generate(_DECODERS[key][1], params, prompts, max_new_tokens=n_new, return_logits=True,
                    **kw)


@pytest.mark.parametrize("name,changes", BACKBONES)
def test_decode_equals_parallel_forward(name, changes):
    """Prompts shorter than a chunk (3), of exactly one chunk (8) and longer than the attention
    window / a chunk (19); greedy decoding of 6 tokens."""
    fns, params = _model(name, **changes)
    forward = jax.jit(lambda t, s: fns.module(params)(t, s))  # one compilation per length
    for L in (3, 8, 19):
        p = _prompt(L, L)
        gen, logits = _run(fns, params, [p], 6)
        seq = np.concatenate([p, gen.new_tokens[0]])[None, :-1]
        want = np.asarray(forward(seq, np.ones_like(seq)))[:, L - 1:]
        np.testing.assert_allclose(logits, want, rtol=0, atol=1e-10)
        np.testing.assert_array_equal(gen.new_tokens[0], np.argmax(want[0], -1))
        assert gen.decode_steps == 5 and gen.prefill_tokens == L


@pytest.mark.parametrize("name,changes", BACKBONES)
def test_batch_of_different_lengths_decodes_each_row_as_if_alone(name, changes):
    fns, params = _model(name, **changes)
    prompts = [_prompt(n, 10 + n) for n in (5, 12, 9)]
    n_new = 4
    gen, logits = _run(fns, params, prompts, n_new)
    assert gen.decode_steps == 12 - 5 + n_new - 1
    for r, p in enumerate(prompts):
        alone, alone_logits = _run(fns, params, [p], n_new)
        np.testing.assert_array_equal(gen.new_tokens[r], alone.new_tokens[0])
        lag = len(p) - 5
        np.testing.assert_allclose(logits[r, lag:lag + n_new], alone_logits[0], rtol=0, atol=1e-10)


def test_sampling_is_seeded_and_rows_keep_their_own_stream():
    fns, params = _model("transformer", max_context=64)
    p = _prompt(6, 0)
    cfg = SamplingConfig(temperature=1.0, top_p=0.95)
    a, _ = _run(fns, params, [p, p], 10, sampling=cfg, seed=3)
    b, _ = _run(fns, params, [p, _prompt(9, 1)], 10, sampling=cfg, seed=3)
    c, _ = _run(fns, params, [p], 10, sampling=cfg, seed=4)
    np.testing.assert_array_equal(a.new_tokens[0], b.new_tokens[0])  # row 0: same key stream
    assert (a.new_tokens[0] != a.new_tokens[1]).any()  # rows draw with different keys
    assert (a.new_tokens[0] != c.new_tokens[0]).any()  # another seed, another sample


def test_bad_prompts_and_lengths():
    with pytest.raises(ValueError, match="no prompt"):
        pad_prompts([])
    with pytest.raises(ValueError, match="beginning with BOS"):
        pad_prompts([np.array([], np.int32)])
    fns, params = _model("transformer", max_context=64)
    with pytest.raises(ValueError, match="max_new_tokens"):
        _run(fns, params, [_prompt(3, 0)], 0)
