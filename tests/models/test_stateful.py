"""Carried state across every backbone, in float64 (``LanguageModel.init_state`` / the stateful
call): a stream cut into calls equals one call, prefill + token-by-token decode equals one parallel
forward at every position, batch rows at different points of their prompts decode as if alone, and
the training call equals the stateful call from ``init_state``.

Sizes (``tests/_backbones.py``): d_model 32, 2 layers, memory chunk 16, attention window 24, MAC
segment 32, 3 persistent tokens; Transformer++ with max_context 40 (so its bound is reached too).
The stream holds two rows: one document with trailing padding, and documents starting at 16, 37,
53 and 80, so both halves of the middle splits hold a document boundary, and the cuts at 40 and
64 fall inside documents that started inside a chunk (37 and 53: offset 5 of a chunk, inside a
MAC segment and a sliding window).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import VOCAB, build, load_config, small_model_cfg

# DeltaNet is Gated DeltaNet without the forget gate (the same engine path): not repeated here.
BACKBONES = ("transformer", "ttt_linear", "ttt_mlp", "lmm", "mac", "mag", "mal", "linear_attention",
             "gated_deltanet")
CHUNK, WINDOW, SEGMENT, MAX_CONTEXT = 16, 24, 32, 40
T = 96
ATOL = 1e-10

# Call boundaries of one stream. "all_split_kinds" cuts inside a chunk before the window fills (5),
# at a chunk start (16), inside a MAC segment after the window fills (40), at a segment start (64);
# "docs_in_both_halves" cuts once at 40, with document boundaries at 16, 37 (first half), 53 and
# 80 (second half) in row 1. Few distinct call lengths keep the compilations few.
SPLITS = {
    "all_split_kinds": (5, 16, 40, 64),
    "docs_in_both_halves": (40,),
}


def model_cfg(name: str):
    if name == "transformer":
        m = load_config("transformer").model
        m.vocab_size, m.d_model, m.n_layers, m.d_ff, m.n_heads = VOCAB, 32, 2, 64, 2
        m.dtype = m.param_dtype = "float64"
        m.max_context = MAX_CONTEXT
        return m
    return small_model_cfg(name, "float64", memory__chunk_size=CHUNK)


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
def test_training_call_equals_stateful_call_from_init_state(name):
    with jax.enable_x64(True):
        m = model(name)
        tokens, seg = stream_batch()
        logits, state = _CALL(m, jnp.asarray(tokens), jnp.asarray(seg), _INIT(m, 2))
        assert logits.dtype == jnp.float64
        diff = max_diff(logits, whole(name))
        print(f"STATEFUL {name} train_vs_init_state max_abs_diff={diff:.3e}")
        assert diff <= ATOL
        assert int(state.stream.position) == T


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("name", BACKBONES)
def test_split_stream_equals_one_call(name, split):
    with jax.enable_x64(True):
        m = model(name)
        tokens, seg = stream_batch()
        bounds = SPLITS[split]
        got, state = run_calls(m, tokens, seg, bounds)
        ref = whole(name)
        edges = [0, *bounds, T]
        per_call = [max_diff(got[:, a:b], ref[:, a:b]) for a, b in zip(edges[:-1], edges[1:])]
        print(f"STATEFUL {name} split={split} bounds={bounds} max_abs_diff per call "
              + " ".join(f"{d:.3e}" for d in per_call))
        assert max(per_call) <= ATOL
        assert int(state.stream.position) == T


def decode(m, tokens, seg, prompt_lens, steps):
    """Prefill min(prompt_lens) tokens in one call, then one token per call for ``steps`` calls:
    row r is fed its own prompt token while its prompt lasts, then its greedy (argmax) token.
    Returns (logits of every position [B, P + steps, V], the tokens fed [B, P + steps])."""
    p = min(prompt_lens)
    fed = np.array(tokens[:, :p])
    logits, state = _CALL(m, jnp.asarray(fed), jnp.asarray(seg[:, :p]), _INIT(m, fed.shape[0]))
    outs = [np.asarray(logits)]
    for t in range(p, p + steps):
        greedy = outs[-1][:, -1].argmax(-1).astype(np.int32)
        nxt = np.where(np.asarray(prompt_lens) > t, tokens[:, t], greedy)[:, None]
        logits, state = _CALL(m, jnp.asarray(nxt), jnp.asarray(seg[:, t:t + 1]), state)
        outs.append(np.asarray(logits))
        fed = np.concatenate([fed, nxt], axis=1)
    return np.concatenate(outs, axis=1), fed


PROMPTS = {"shorter_than_chunk": 5, "one_chunk": CHUNK, "longer_than_window_and_segment": 40}
DECODE_TO = 48


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("name", BACKBONES)
def test_prefill_then_decode_equals_parallel_forward(name, prompt):
    with jax.enable_x64(True):
        m = model(name)
        tokens, seg = stream_batch(seed=3)
        seg = np.ones_like(seg)
        p = PROMPTS[prompt]
        logits, fed = decode(m, tokens[:, :DECODE_TO], seg[:, :DECODE_TO], (p, p), DECODE_TO - p)
        parallel = np.asarray(_TRAIN(m, jnp.asarray(fed), jnp.asarray(seg[:, :DECODE_TO])))
        diff = max_diff(logits, parallel)
        print(f"STATEFUL {name} decode prompt={prompt} max_abs_diff={diff:.3e}")
        assert diff <= ATOL


@pytest.mark.parametrize("name", BACKBONES)
def test_rows_at_different_prompt_positions_decode_as_if_alone(name):
    """Row 0 (prompt 5) decodes while row 1 (prompt 37, another document id) is still forced
    through its prompt token by token; each row equals the same run of that row alone."""
    with jax.enable_x64(True):
        m = model(name)
        tokens, _ = stream_batch(seed=5)
        seg = np.stack([np.full(T, 1, np.int32), np.full(T, 7, np.int32)])
        L = 48
        logits, fed = decode(m, tokens[:, :L], seg[:, :L], (5, 37), L - 5)
        diffs = []
        for r in range(2):
            alone = np.asarray(_TRAIN(m, jnp.asarray(fed[r:r + 1]), jnp.asarray(seg[r:r + 1, :L])))
            diffs.append(max_diff(logits[r:r + 1], alone))
        print(f"STATEFUL {name} rows_alone max_abs_diff={max(diffs):.3e}")
        assert max(diffs) <= ATOL
        np.testing.assert_array_equal(fed[1, :37], tokens[1, :37])
