"""Carried state across every backbone, in float64 (``LanguageModel.init_state`` / the stateful
call): a stream cut into calls equals one training call over it, and so does a prefill followed
by one token per call (decoding), at every position.

Sizes (``tests/_backbones.py``): d_model 32, one layer (two for the LMM: ``TWO_LAYERS``), memory
chunk 16, attention window 24, MAC segment 32, 3 persistent tokens; Transformer++ with max_context
40 (so its bound is reached too).
The stream holds two rows: one document with trailing padding, and documents starting at 16, 37,
53 and 80, so every split call after the first holds a document boundary, and the cuts at 40 and
64 fall inside documents that started inside a chunk (37 and 53: offset 5 of a chunk, inside a
MAC segment and a sliding window).

Each distinct call length is one compilation per backbone, so the cases share lengths: the split
calls are 5, 11, 24, 24 and 32 tokens long, the decode prefills 5 tokens, then feeds one per call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import VOCAB, build, load_config, small_model_cfg

# DeltaNet is Gated DeltaNet without the forget gate (the same engine path), and TTT-MLP is
# TTT-Linear's mixer with the LMM's MLP memory (whose carried state the engine's tests split at
# every chunk phase: tests/memory/test_state.py): neither repeated here.
BACKBONES = ("transformer", "ttt_linear", "lmm", "mac", "mag", "mal", "linear_attention",
             "gated_deltanet")
CHUNK, WINDOW, SEGMENT, MAX_CONTEXT = 16, 24, 32, 40
T = 96
ATOL = 1e-10

# Call boundaries of one stream: inside a chunk before the window fills (5), at a chunk start
# (16), inside a MAC segment after the window fills (40), at a segment start (64); row 1's
# documents start at 16, 37, 53 and 80, one inside each call after the first.
SPLITS = (5, 16, 40, 64)


# Two layers for the LMM, whose state then holds one memory per layer (the model carries each
# layer's state in its own slot: a mix-up shows there); one layer for every other backbone, whose
# carried state is its mixer's (a second layer would double each compilation).
TWO_LAYERS = ("lmm",)


def model_cfg(name: str):
    n_layers = 2 if name in TWO_LAYERS else 1
    if name == "transformer":
        m = load_config("transformer").model
        m.vocab_size, m.d_model, m.n_layers, m.d_ff, m.n_heads = VOCAB, 32, n_layers, 64, 2
        m.dtype = m.param_dtype = "float64"
        m.max_context = MAX_CONTEXT
        return m
    return small_model_cfg(name, "float64", memory__chunk_size=CHUNK, n_layers=n_layers)


_MODELS: dict = {}


def model(name: str):
    if name not in _MODELS:
        with jax.enable_x64(True):
            _MODELS[name] = build(model_cfg(name), seed=1)
    return _MODELS[name]


_CALL = nnx.jit(lambda m, t, s, st: m(t, s, st))
_TRAIN = nnx.jit(lambda m, t, s: m(t, s))
# without the fresh mark: every call below, the first included, runs the carried-state program
# (the fresh first call is the training call itself, ``test_models_lm``)
_INIT = nnx.jit(lambda m, b: m.init_state(b).continued(), static_argnums=1)


def stream_batch(seed: int = 0):
    """tokens, segment ids int32 [2, T]: row 0 one document then padding from 88; row 1 documents
    at 0, 16, 37, 53 and 80."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, VOCAB, (2, T)).astype(np.int32)
    seg = np.ones((2, T), np.int32)
    seg[0, 88:] = 0
    tokens[0, 88:] = 0
    seg[1, 16:37], seg[1, 37:53], seg[1, 53:80], seg[1, 80:] = 2, 3, 4, 5
    return tokens, seg


def run_calls(m, tokens, seg, bounds):
    """Logits of the stream cut at ``bounds``, state carried from ``init_state``."""
    state = _INIT(m, tokens.shape[0])
    outs, edges = [], [0, *bounds, tokens.shape[1]]
    for a, b in zip(edges[:-1], edges[1:]):
        logits, state = _CALL(m, jnp.asarray(tokens[:, a:b]), jnp.asarray(seg[:, a:b]), state)
        outs.append(np.asarray(logits))
    return np.concatenate(outs, axis=1), state


_WHOLE: dict = {}


def whole(name: str):
    """One training call over the whole stream."""
    if name not in _WHOLE:
        tokens, seg = stream_batch()
        _WHOLE[name] = np.asarray(_TRAIN(model(name), jnp.asarray(tokens), jnp.asarray(seg)))
    return _WHOLE[name]


def max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize("name", BACKBONES)
def test_split_stream_equals_one_call(name):
    """The stateful calls from ``init_state`` equal the training call over the whole stream."""
    with jax.enable_x64(True):
        m = model(name)
        tokens, seg = stream_batch()
        got, state = run_calls(m, tokens, seg, SPLITS)
        ref = whole(name)
        assert got.dtype == np.float64
        edges = [0, *SPLITS, T]
        per_call = [max_diff(got[:, a:b], ref[:, a:b]) for a, b in zip(edges[:-1], edges[1:])]
        print(f"STATEFUL {name} bounds={SPLITS} max_abs_diff per call "
              + " ".join(f"{d:.3e}" for d in per_call))
        assert max(per_call) <= ATOL
        assert int(state.stream.position) == T


PREFILL = 5  # the split test's first call length: no compilation of its own


@pytest.mark.parametrize("name", BACKBONES)
def test_prefill_then_decode_equals_one_call(name):
    """Prefill 5 tokens (inside the first chunk), then one token per call to the end of the
    stream: the decode crosses chunk starts, the window, MAC segments, row 1's document starts
    and row 0's padding, and every position's logits equal the training call's. The tokens fed
    are the stream's: a decoded token is an input like any other (sampling is
    tests/generate's)."""
    with jax.enable_x64(True):
        m = model(name)
        tokens, seg = stream_batch()
        got, state = run_calls(m, tokens, seg, (PREFILL, *range(PREFILL + 1, T)))
        diff = max_diff(got, whole(name))
        print(f"STATEFUL {name} decode prefill={PREFILL} max_abs_diff={diff:.3e}")
        assert diff <= ATOL
        assert int(state.stream.position) == T
