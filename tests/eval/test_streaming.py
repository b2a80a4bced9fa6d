"""Streaming (carry) evaluation: the schedule of windows over rows, and the scores of carried
windows against reset windows and one long forward (float64 models)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _documents import random_docs
from _float64_lm import float64_lm as _model
from titans_lm.eval.evaluate import make_score_fn, score_documents
from titans_lm.eval.streaming import (assign_rows, make_carry_step,
                                      score_documents_carry, stream_batches, stream_rows)
from titans_lm.data.windows import num_windows
from titans_lm.train import sharding as shd

pytestmark = pytest.mark.usefixtures("x64")  # float64 models (tests/conftest.py)

T = 16
VOCAB = 64




def _docs(lengths, seed=0):
    return random_docs(lengths, VOCAB, seed)


def test_assign_rows_refills_the_row_that_frees_first():
    rows, n_steps = assign_rows([5, 1, 1, 0, 3, 2], n_rows=2)
    assert rows == [[0, 5], [1, 2, 4]] and n_steps == 7  # doc 5: both rows free at 5, row 0 wins
    rows, n_steps = assign_rows([3], n_rows=4)
    assert rows == [[0], [], [], []] and n_steps == 3


def test_stream_batches_hold_every_window_once_in_order():
    docs = _docs([1 + 5 * T, 3, 1 + T, 2 * T + 7, 9, 1])  # the last has nothing to score
    batches = list(stream_batches(docs, seq_len=T, n_rows=3))
    tok = np.stack([b["tokens"] for b in batches], 1)  # [rows, steps, T+1]
    seg = np.stack([b["segment_ids"] for b in batches], 1)
    seen = {}
    for r in range(tok.shape[0]):
        order = []  # the row's document per step (-1: padding)
        for s in range(tok.shape[1]):
            ids = set(seg[r, s][seg[r, s] > 0].tolist())
            assert len(ids) <= 1  # a window never holds two documents
            order.append(ids.pop() - 1 if ids else -1)
            if order[-1] >= 0:
                seen.setdefault(order[-1], []).append(tok[r, s][seg[r, s] > 0])
        blocks = [d for i, d in enumerate(order) if d >= 0 and (i == 0 or order[i - 1] != d)]
        assert len(blocks) == len(set(blocks))  # each document in consecutive steps of one row
    assert sorted(seen) == [0, 1, 2, 3, 4]
    for d, pieces in seen.items():  # windows overlap by one token (the next window's first input)
        rebuilt = np.concatenate([pieces[0]] + [p[1:] for p in pieces[1:]])
        np.testing.assert_array_equal(rebuilt, docs[d])  # nothing truncated
        assert len(pieces) == num_windows(len(docs[d]), T)


def _mesh():
    return shd.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})


def _reset_totals(fns, params, docs, batch_size=4):
    mesh = _mesh()
    params_sh = shd.param_shardings(fns.abstract_params(), fns.logical_axes, mesh)
    return score_documents(make_score_fn(fns, params_sh, mesh), params, docs, [], seq_len=T,
                           batch_size=batch_size, mesh=mesh)


def _carry_totals(fns, params, docs, batch_size=4):
    return score_documents_carry(*make_carry_step(fns), params, docs, [], seq_len=T,
                                 batch_size=batch_size, mesh=_mesh())


# The driver is the same for every backbone (every backbone's split calls and document starts
# equal one call: tests/models/test_stateful.py, tests/models/test_documents.py): the rows' reset
# at a document start is checked on a carried attention cache, the carried state over windows on
# one attention and one memory backbone (below).
def test_short_documents_score_as_in_reset_mode():
    """Documents of at most one window, several per row (each after another one's state)."""
    fns, params = _model("transformer", max_context=T)
    docs = _docs([T + 1, 5, 2, T, 11, 7, T + 1], seed=1)
    reset = _reset_totals(fns, params, docs)
    for rows in (1, 2):
        carry = _carry_totals(fns, params, docs, batch_size=rows)
        assert carry.n_tokens == reset.n_tokens == sum(len(d) - 1 for d in docs)
        np.testing.assert_allclose(carry.nll_nats, reset.nll_nats, rtol=1e-6)


def _long_forward_nll(fns, params, doc):
    """Summed nll of doc[1:] from one forward over the whole document (float64)."""
    x = doc[None, :-1]
    logits = np.asarray(jax.jit(lambda p, t: fns.module(p)(t, jnp.ones_like(t)))(params, x),
                        np.float64)
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return -logp[0, np.arange(len(doc) - 1), doc[1:]].sum()


@pytest.mark.parametrize("name,changes", [("transformer", {"max_context": 4 * T}),
                                          ("lmm", {"n_layers": 1})],
                         ids=["transformer_full_context", "lmm"])
def test_carry_equals_one_long_forward(name, changes):
    """Where the model sees the whole document in one call (a memory model; full attention with
    a cache as long as the document), carrying the state over its windows changes nothing."""
    fns, params = _model(name, **changes)
    docs = _docs([2 * T + 1, 3 * T - 5], seed=2)
    carry = _carry_totals(fns, params, docs, batch_size=2)
    long = sum(_long_forward_nll(fns, params, d) for d in docs)
    np.testing.assert_allclose(carry.nll_nats, long, rtol=1e-10)
    reset = _reset_totals(fns, params, docs)
    assert abs(reset.nll_nats - long) > 1e-3  # reset really loses the context


def test_stream_rows_follow_documents_and_mesh():
    mesh = _mesh()
    mult = shd.batch_divisor(mesh)
    assert stream_rows(1, 8, mesh) == mult and stream_rows(50, 3 * mult, mesh) == 3 * mult
    assert stream_rows(mult + 1, 8 * mult, mesh) == 2 * mult
