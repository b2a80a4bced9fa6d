"""Shared set-up for the memory-backbone tests: the real ``configs/<name>.py`` shrunk to test size
(d_model 32, 2 layers, vocabulary 64, memory heads of 16), built in float64 or float32, and a batch
layout that checks causality and document independence with one compiled forward pass."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from titans_lm.config import load
from titans_lm.models import build_model

REPO = Path(__file__).resolve().parent.parent
BACKBONES = ("ttt_linear", "ttt_mlp", "lmm", "mac", "mag", "mal")
VOCAB = 64
T = 128
DOC2 = 64  # the second packed document starts here (a multiple of 64, as the pipeline guarantees)
LEN_A = 50  # the first document's length; positions LEN_A..DOC2-1 are padding


def load_config(name: str, size: str = "tiny"):
    path = REPO / "configs" / f"{name}.py"
    return load(path, size)


def small_model_cfg(name: str, dtype: str = "float64", **changes):
    """The tiny model section at test size; ``changes`` set model fields, ``memory__x`` memory ones."""
    m = load_config(name).model
    m.vocab_size, m.d_model, m.n_layers, m.d_ff = VOCAB, 32, 2, 64
    m.dtype, m.param_dtype = dtype, dtype
    if "memory" in m:
        m.memory.head_dim = 16
    if "n_heads" in m:
        m.n_heads = 2
    if "window" in m:
        m.window = 24
    if "segment_len" in m:
        m.segment_len = 32
    if "n_persistent" in m:
        m.n_persistent = 3
    for key, value in changes.items():
        if key.startswith("memory__"):
            m.memory[key[len("memory__"):]] = value
        else:
            m[key] = value
    return m


def build(model_cfg, seed: int = 0):
    return build_model(model_cfg, rngs=nnx.Rngs(seed))


# One jitted function each, so models (or mixers) of one structure share a compilation.
_FORWARD = nnx.jit(lambda m, t, s: m(t, s))


def forward(model, tokens, segment_ids):
    """``model(tokens, segment_ids)`` (any nnx module with that call), jitted."""
    return _FORWARD(model, jnp.asarray(tokens), jnp.asarray(segment_ids))


_MIXER = nnx.jit(lambda m, x, s, n_p: mixer_call(m, x, s, n_p), static_argnums=3)


def mixer_call(mixer, x_BSD, ids_BS, n_p: int):
    """One training-path call of a token mixer (the mixer protocol): the ``n_p`` leading persistent
    positions go first as their own call, as ``LanguageModel.init_state`` feeds them, then
    the rest from the state they leave. Returns the outputs of every position."""
    from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID
    from titans_lm.nn.stream import fresh_stream_state, make_stream
    B = x_BSD.shape[0]
    state, sstate, outs = mixer.init_state(B), fresh_stream_state(B), []
    if n_p:
        stream, sstate = make_stream(jnp.full((B, n_p), PERSISTENT_SEGMENT_ID), sstate, fresh=True)
        y, state = mixer(x_BSD[:, :n_p], stream, state)
        outs.append(y)
        sstate = sstate._replace(position=jnp.zeros((), jnp.int32))
    stream, _ = make_stream(ids_BS[:, n_p:], sstate, fresh=True)
    outs.append(mixer(x_BSD[:, n_p:], stream, state)[0])
    return jnp.concatenate(outs, axis=1)


def forward_mixer(mixer, x_BSD, ids_BS):
    """:func:`mixer_call`, jitted (the persistent positions are the leading ids -1)."""
    n_p = int(np.sum(np.asarray(ids_BS)[0] == -1))
    return _MIXER(mixer, jnp.asarray(x_BSD), jnp.asarray(ids_BS), n_p)


def mixer_input(seed: int = 0, dtype=jnp.float64, n_prefix: int = 0):
    """A [2, n_prefix + T, 32] mixer input and its segment ids (two packed documents, padding and
    ``n_prefix`` persistent positions first)."""
    _, segs, _ = probe_batch(perturb=())
    ids = np.concatenate([np.full((2, n_prefix), -1, np.int32), segs[:2]], axis=1)
    x = jax.random.normal(jax.random.key(seed), ids.shape + (32,), dtype)
    return x, jnp.asarray(ids)


def probe_batch(seed: int = 0, perturb=(5, 21, 40, 70, 93, 127)):
    """Rows: 0 the packed window [doc A (LEN_A) + padding | doc B from DOC2]; 1 doc A alone;
    2 doc B alone (both followed by padding); then one row per position j of ``perturb``: the
    packed window with token j changed.

    Returns (tokens int32 [R, T], segment_ids int32 [R, T], perturb).
    """
    rng = np.random.default_rng(seed)
    packed = rng.integers(4, VOCAB, T).astype(np.int32)
    packed[0] = packed[DOC2] = 2  # BOS
    seg = np.ones(T, np.int32)
    seg[LEN_A:DOC2] = 0
    seg[DOC2:] = 2
    packed[seg == 0] = 0
    alone_a = np.zeros(T, np.int32)
    alone_a[:LEN_A] = packed[:LEN_A]
    seg_a = np.zeros(T, np.int32)
    seg_a[:LEN_A] = 1
    alone_b = np.zeros(T, np.int32)
    alone_b[:T - DOC2] = packed[DOC2:]
    seg_b = np.zeros(T, np.int32)
    seg_b[:T - DOC2] = 1
    tokens, segs = [packed, alone_a, alone_b], [seg, seg_a, seg_b]
    for j in perturb:
        row = packed.copy()
        row[j] = 4 + (row[j] + 7) % (VOCAB - 4)
        tokens.append(row)
        segs.append(seg)
    return np.stack(tokens), np.stack(segs), tuple(perturb)


def check_causal_and_documents(logits, perturb, doc_atol: float | None):
    """Assert (a) changing token j leaves every output at positions < j bit-for-bit unchanged and
    changes the output at j; (b) changing a token of document A leaves document B bit-for-bit
    unchanged; (c) unless ``doc_atol`` is None, the packed documents equal each one alone."""
    logits = np.asarray(logits)
    base = logits[0]
    for r, j in enumerate(perturb, start=3):
        np.testing.assert_array_equal(logits[r, :j], base[:j],
                                      err_msg=f"output before position {j} depends on token {j}")
        assert np.max(np.abs(logits[r, j] - base[j])) > 0, f"token {j} does not reach its output"
        if j < LEN_A:
            np.testing.assert_array_equal(logits[r, DOC2:], base[DOC2:],
                                          err_msg=f"document B depends on token {j} of document A")
    assert any(j < LEN_A for j in perturb) and np.isfinite(logits).all()
    if doc_atol is not None:
        np.testing.assert_allclose(base[:LEN_A], logits[1, :LEN_A], rtol=0, atol=doc_atol,
                                   err_msg="document A differs packed vs alone")
        np.testing.assert_allclose(base[DOC2:], logits[2, :T - DOC2], rtol=0, atol=doc_atol,
                                   err_msg="document B differs packed vs alone")


# Packed documents equal each one alone to float64 rounding for every backbone (attention computes
# its softmax in float64 in float64 mode, ``titans_lm.nn.attention.dot_product_attention``).
DOC_ATOL: dict = {}


def run_probe(name: str, alone_equal: bool = True, **changes):
    """Build the backbone in float64 and run :func:`check_causal_and_documents` on it
    (``alone_equal=False`` skips the packed-equals-alone comparison)."""
    with jax.enable_x64(True):
        model = build(small_model_cfg(name, "float64", **changes))
        tokens, segs, perturb = probe_batch()
        logits = forward(model, tokens, segs)
        assert logits.dtype == jnp.float64
        check_causal_and_documents(logits, perturb,
                                   DOC_ATOL.get(name, 1e-10) if alone_equal else None)
    return model


def copy_shared_params(src, dst):
    """Give ``dst`` the values of every parameter that ``src`` has at the same path and shape."""
    src_flat = dict(nnx.to_flat_state(nnx.state(src, nnx.Param)))
    dst_state = nnx.state(dst, nnx.Param)
    for path, var in nnx.to_flat_state(dst_state):
        if path in src_flat and src_flat[path][...].shape == var[...].shape:
            var[...] = src_flat[path][...]
    nnx.update(dst, dst_state)
