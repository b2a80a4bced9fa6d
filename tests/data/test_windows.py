"""Tests for titans_lm.data.windows: every token after BOS predicted exactly once, per document."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.config import BOS_ID, PAD_ID
from titans_lm.eval.perplexity import score_batch
from titans_lm.data.windows import document_windows, eval_batches, num_windows

T = 8


def _docs(lengths, first_id=4):
    docs, next_id = [], first_id
    for n in lengths:
        docs.append(np.array([BOS_ID, *range(next_id, next_id + n - 1)], dtype=np.int32))
        next_id += n - 1
    return docs


LENGTHS = [1, 2, T, T + 1, T + 2, 2 * T + 1, 3 * T + 5, 5]


def _weights(segs):
    return (segs[:, 1:] == segs[:, :-1]) & (segs[:, 1:] != 0)


def test_every_token_predicted_exactly_once():
    docs = _docs(LENGTHS)
    batches = list(eval_batches(docs, seq_len=T, batch_size=3))
    assert all(b["tokens"].shape == (3, T + 1) and b["tokens"].dtype == np.int32 for b in batches)
    assert all(b["segment_ids"].dtype == np.int32 for b in batches)
    predicted = collections.Counter()
    for b in batches:
        w = _weights(b["segment_ids"])
        for row_targets, row_inputs_seg, row_w in zip(b["tokens"][:, 1:], b["segment_ids"][:, 1:], w):
            for tok, seg in zip(row_targets[row_w], row_inputs_seg[row_w]):
                predicted[(int(seg), int(tok))] += 1
    expected = collections.Counter((d + 1, int(t)) for d, doc in enumerate(docs) for t in doc[1:])
    assert predicted == expected  # each (document, token after BOS) exactly once, nothing else
    total_rows = sum(num_windows(n, T) for n in LENGTHS)
    assert sum(int(np.any(s)) for b in batches for s in b["segment_ids"]) == total_rows


def test_windows_are_consecutive_and_single_document():
    doc = _docs([3 * T + 5])[0]
    tokens, segs = document_windows(doc, T, segment_id=7)
    assert tokens.shape == (4, T + 1)
    assert tokens[0, 0] == BOS_ID
    for w in range(1, len(tokens)):
        assert tokens[w, 0] == tokens[w - 1, -1]  # input starts with the previous window's last target
    np.testing.assert_array_equal(tokens[:, :-1].reshape(-1)[:len(doc) - 1], doc[:-1])
    assert set(np.unique(segs)) == {0, 7}
    last_real = (len(doc) - 1) % T + 1  # tokens of the last window, its first input included
    assert np.all(segs[-1, :last_real] == 7) and np.all(segs[-1, last_real:] == 0)
    assert np.all(tokens[-1, last_real:] == PAD_ID)
    assert document_windows([BOS_ID], T)[0].shape == (0, T + 1)


def test_last_batch_padding():
    docs = _docs([2 * T + 1, T + 1])  # 3 windows
    padded = list(eval_batches(docs, seq_len=T, batch_size=2))
    assert [b["tokens"].shape[0] for b in padded] == [2, 2]
    assert not padded[-1]["segment_ids"][1].any() and not padded[-1]["tokens"][1].any()
    unpadded = list(eval_batches(docs, seq_len=T, batch_size=2, pad_last_batch=False))
    assert [b["tokens"].shape[0] for b in unpadded] == [2, 1]


def test_windowed_score_equals_direct_sum_for_bigram_model():
    """With a context-free (bigram) model, the windowed NLL equals the plain per-document sum."""
    V = 64
    table = np.random.default_rng(0).normal(size=(V, V)).astype(np.float32)
    docs = [np.array([BOS_ID, *np.random.default_rng(k).integers(4, V, size=n - 1)], np.int32)
            for k, n in enumerate(LENGTHS)]
    nll, count = 0.0, 0
    for b in eval_batches(docs, seq_len=T, batch_size=4):
        logits = jnp.asarray(table)[b["tokens"][:, :-1]]
        s, c = jax.jit(score_batch)(logits, b)
        nll, count = nll + float(s), count + int(c)
    logp = table - np.log(np.exp(table.astype(np.float64)).sum(-1, keepdims=True))
    ref = -sum(logp[doc[i - 1], doc[i]] for doc in docs for i in range(1, len(doc)))
    assert count == sum(n - 1 for n in LENGTHS)
    np.testing.assert_allclose(nll, ref, rtol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="must begin with BOS"):
        list(eval_batches([[5, 6, 7]], seq_len=T, batch_size=2))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        list(eval_batches([[BOS_ID, 5]], seq_len=T, batch_size=0))
