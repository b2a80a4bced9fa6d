"""Documents start anywhere, for every backbone, in float64 under jit: a second document starting
at every offset inside a memory chunk (so inside a MAC segment and inside a sliding window too),
and a one-token document ending the row. Changing another document's tokens, or replacing the
other documents by padding, changes no logit of a document (to 1e-10; the isolation table
``ISOLATION`` is printed with -s), and the gradients of a document's loss are those of the document
alone. Causality in the same rows: changing one token of the second document (at every phase of a
chunk and of a MAC segment, as the offset moves) leaves every earlier logit bit-for-bit unchanged
and changes its own. Packing: the second document at a chunk (and segment) start gives the logits
it gives at the start of a row of its own (to 1e-10).

Sizes (``tests/_backbones.py``): d_model 32, memory chunk 16, window 24, MAC segment 32, 3
persistent tokens, and one layer: isolation is each mixer's (the rest of the model acts per token),
and a second layer would double the compilation; the stateful tests run two
(tests/models/test_stateful.py).
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
CHUNK, T = 16, 96
FIRST = 2 * CHUNK          # the second document starts at FIRST + offset
ATOL = 1e-10
ISOLATION: dict = {}       # (backbone, offset) -> max |change| of a document's logits


def model_cfg(name: str):
    if name == "transformer":
        m = load_config("transformer").model
        m.vocab_size, m.d_model, m.n_layers, m.d_ff, m.n_heads = VOCAB, 32, 1, 64, 2
        m.dtype = m.param_dtype = "float64"
        return m
    return small_model_cfg(name, "float64", memory__chunk_size=CHUNK, n_layers=1)


CAUSAL = 7                 # row 4 changes B's token at s + CAUSAL
N_ROWS = 5


def rows(offset: int, seed: int = 0):
    """Five rows of one layout: documents A = [0, s), B = [s, T - 1), C = [T - 1, T) with
    s = FIRST + offset. 0 the packed row; 1 A's tokens changed; 2 B alone (A and C padding);
    3 A's and B's tokens changed; 4 B's token at s + CAUSAL changed."""
    rng = np.random.default_rng(seed + offset)
    s = FIRST + offset
    tok = rng.integers(4, VOCAB, T).astype(np.int32)
    seg = np.concatenate([np.ones(s), np.full(T - 1 - s, 2), [3]]).astype(np.int32)
    other = rng.integers(4, VOCAB, T).astype(np.int32)
    changed_a = np.where(seg == 1, other, tok)
    alone_b = np.where(seg == 2, tok, 0)
    changed_ab = np.where(seg < 3, other, tok)
    one = tok.copy()
    one[s + CAUSAL] = 4 + (tok[s + CAUSAL] - 3) % (VOCAB - 4)   # another token id
    tokens = np.stack([tok, changed_a, alone_b, changed_ab, one])
    segs = np.stack([seg, seg, np.where(seg == 2, 2, 0), seg, seg])
    return tokens, segs.astype(np.int32), s


def b_loss(model, tokens, segs, weights):
    """A linear functional of document B's logits (rows 0 and 2 separately: [2])."""
    logits = model(tokens, segs)
    mask = (segs == 2)[..., None]
    return jnp.sum(jnp.where(mask, logits * weights, 0), axis=(1, 2))


FAST_COMPILE = {"xla_backend_optimization_level": 0}   # tiny programs: compile time dominates


def compiled(model):
    """(forward(tokens, segs) -> logits, b_grads(tokens, segs, weights) -> the parameter
    gradients of B's functional for rows 0 (packed) and 2 (B alone), stacked), jitted."""
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    forward = jax.jit(lambda t, s: nnx.merge(graph, params, rest)(t, s),
                      compiler_options=FAST_COMPILE)

    def b_grads(tokens, segs, weights):
        def one(tok, seg):
            loss = lambda p: b_loss(nnx.merge(graph, p, rest), tok[None], seg[None], weights)[0]  # noqa: E731
            return jax.grad(loss)(params)
        return jax.vmap(one)(tokens[jnp.array([0, 2])], segs[jnp.array([0, 2])])
    return forward, jax.jit(b_grads, compiler_options=FAST_COMPILE)


@pytest.mark.parametrize("name", BACKBONES)
def test_documents_starting_at_every_offset_are_isolated(name):
    with jax.enable_x64(True):
        forward, b_grads = compiled(build(model_cfg(name), seed=1))
        layouts = [rows(o) for o in range(CHUNK)]
        tokens = np.concatenate([t for t, _, _ in layouts])
        segs = np.concatenate([g for _, g, _ in layouts])
        b0 = tokens[0, FIRST:T - 1]                  # offset 0: B starts a chunk; B at 0, alone
        tokens = np.concatenate([tokens, np.pad(b0, (0, T - len(b0)))[None]])
        segs = np.concatenate([segs, np.pad(np.full(len(b0), 2, np.int32), (0, T - len(b0)))[None]])
        logits = np.asarray(forward(jnp.asarray(tokens), jnp.asarray(segs)))
        np.testing.assert_allclose(logits[-1, :len(b0)], logits[0, FIRST:T - 1], rtol=0, atol=ATOL,
                                   err_msg=f"{name}: a packed document differs from it alone")
        worst = 0.0
        for o, (_, _, s) in enumerate(layouts):
            r = logits[N_ROWS * o:N_ROWS * (o + 1)]
            change = max(np.max(np.abs(r[1, s:] - r[0, s:])),          # A changed: B and C
                         np.max(np.abs(r[2, s:T - 1] - r[0, s:T - 1])),  # B alone
                         np.max(np.abs(r[3, T - 1] - r[0, T - 1])))      # A, B changed: C
            ISOLATION[(name, o)] = float(change)
            worst = max(worst, float(change))
            assert np.max(np.abs(r[1, :s] - r[0, :s])) > 1e-3          # A's change is seen in A
            j = s + CAUSAL                                               # causality
            np.testing.assert_array_equal(r[4, :j], r[0, :j], err_msg=f"{name}: token {j}")
            assert np.max(np.abs(r[4, j] - r[0, j])) > 0, f"{name}: token {j} unseen"
        print(f"\n| {name} | " + " | ".join(f"{ISOLATION[(name, o)]:.1e}" for o in range(CHUNK))
              + " |")
        assert worst <= ATOL, {o: ISOLATION[(name, o)] for o in range(CHUNK)}

        tok, seg, s = rows(5)
        weights = jnp.asarray(np.random.default_rng(1).normal(size=(1, T, VOCAB)))
        grads = jax.tree.leaves(b_grads(jnp.asarray(tok), jnp.asarray(seg), weights))
        leaves_p, leaves_a = [g[0] for g in grads], [g[1] for g in grads]
        assert max(float(jnp.max(jnp.abs(g))) for g in leaves_p) > 1e-3
        for gp, ga in zip(leaves_p, leaves_a):
            np.testing.assert_allclose(gp, ga, rtol=0, atol=ATOL * max(1.0, float(jnp.max(jnp.abs(gp)))))
