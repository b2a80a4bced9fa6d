"""Tests for titans_lm.eval.perplexity: hand-computed values, weight rule, counts, totals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.eval.perplexity import PerplexityTotals, score_batch, text_counts, text_totals


def test_uniform_logits_give_vocab_size():
    V, B, T = 37, 2, 5
    rng = np.random.default_rng(0)
    batch = {"tokens": rng.integers(0, V, size=(B, T + 1)).astype(np.int32),
             "segment_ids": np.ones((B, T + 1), np.int32)}
    nll, n = score_batch(jnp.full((B, T, V), 3.25, jnp.float32), batch)
    assert int(n) == B * T and nll.dtype == jnp.float32
    totals = PerplexityTotals(float(nll), int(n), n_words=1, n_bytes=1)
    np.testing.assert_allclose(totals.token_ppl, V, rtol=1e-5)


def test_two_token_example_by_hand():
    # V = 3. Position 0: softmax([0, ln 2, 0]) = [1/4, 1/2, 1/4], target 1 -> p = 1/2.
    # Position 1: softmax([ln 3, 0, 0]) = [3/5, 1/5, 1/5], target 2 -> p = 1/5.
    # Position 2 predicts padding (segment 0) and is not scored.
    logits = jnp.array([[[0.0, math.log(2.0), 0.0], [math.log(3.0), 0.0, 0.0], [50.0, 0.0, 0.0]]])
    batch = {"tokens": np.array([[2, 1, 2, 0]], np.int32), "segment_ids": np.array([[1, 1, 1, 0]], np.int32)}
    nll, n = jax.jit(score_batch)(logits, batch)
    assert int(n) == 2
    np.testing.assert_allclose(float(nll), math.log(10.0), rtol=1e-6)
    t = PerplexityTotals(float(nll), int(n), n_words=1, n_bytes=5)
    np.testing.assert_allclose(t.token_ppl, math.sqrt(10.0), rtol=1e-6)
    np.testing.assert_allclose(t.word_ppl, 10.0, rtol=1e-6)
    np.testing.assert_allclose(t.bits_per_byte, math.log2(10.0) / 5, rtol=1e-6)


def test_weight_rule_skips_document_boundaries_and_padding():
    # Targets at positions 1..4 with segments [1, 1, 2, 2, 0]: scored = (1->1) and (2->2) only.
    V = 4
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(1, 4, V)), jnp.float32)
    tokens = np.array([[2, 3, 2, 1, 0]], np.int32)
    batch = {"tokens": tokens, "segment_ids": np.array([[1, 1, 2, 2, 0]], np.int32)}
    nll, n = score_batch(logits, batch)
    x = np.asarray(logits, np.float64)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    ref = -(logp[0, 0, 3] + logp[0, 2, 1])
    assert int(n) == 2
    np.testing.assert_allclose(float(nll), ref, rtol=1e-6)


def test_score_batch_shape_check():
    batch = {"tokens": np.zeros((2, 5), np.int32), "segment_ids": np.zeros((2, 5), np.int32)}
    with pytest.raises(ValueError, match="do not match"):
        score_batch(jnp.zeros((2, 5, 3)), batch)


def test_word_and_byte_counts():
    text = "héllo  world\n\tfoo"
    assert text_counts(text) == (3, 18)  # h é(2 bytes) l l o, 2 spaces, world, \n, \t, foo
    assert text_counts("") == (0, 0)
    assert text_counts(" = Title = \n \n a @-@ b . \n") == (7, 26)  # 12 + 2 + 12 bytes
    assert text_counts("中文 🎉") == (2, 3 + 3 + 1 + 4)
    t = text_totals(["a b", "c"])
    assert (t.n_words, t.n_bytes, t.n_tokens, t.nll_nats) == (3, 4, 0, 0.0)


def test_totals_add_and_ratios():
    a = PerplexityTotals(nll_nats=2.0, n_tokens=3, n_words=1, n_bytes=4)
    b = PerplexityTotals(nll_nats=6.0 * math.log(2.0) - 2.0, n_tokens=1, n_words=1, n_bytes=2)
    s = a + b
    assert (s.n_tokens, s.n_words, s.n_bytes) == (4, 2, 6)
    np.testing.assert_allclose(s.nll_nats, 6.0 * math.log(2.0))
    np.testing.assert_allclose(s.bits_per_byte, 1.0)  # 6 bits over 6 bytes
    np.testing.assert_allclose(s.word_ppl, 8.0)  # exp(6 ln 2 / 2)
    np.testing.assert_allclose(s.token_ppl, 2.0 ** 1.5)
    # Summed, not averaged: the mean of the two token perplexities differs.
    assert not math.isclose(s.token_ppl, (a.token_ppl + b.token_ppl) / 2)
    d = s.as_dict()
    assert d["n_tokens"] == 4 and math.isclose(d["bits_per_byte"], 1.0)
    with pytest.raises(ValueError, match="no words were counted"):
        PerplexityTotals(1.0, 1, 0, 1).word_ppl
    assert "word_ppl" not in PerplexityTotals(1.0, 1, 0, 1).as_dict()
