import json

import numpy as np
import pytest

from titans_lm.config import BOS_ID
from titans_lm.data.store import build_token_store
from titans_lm.data.stream_pipeline import StreamIterator

T = 16


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = [3, 40, 16, 17, 90, 5, 33]  # shorter than, equal to and several windows
    docs = [np.concatenate([[BOS_ID], rng.integers(4, 300, n - 1)]) for n in lengths]
    return build_token_store(tmp_path_factory.mktemp("s") / "store", docs, doc_align=8,
                             vocab_size=300), docs


def _row_streams(it, steps):
    """Per row: the concatenated windows (overlap token dropped) and their segment ids."""
    batches = [next(it) for _ in range(steps)]
    toks = [np.concatenate([b["tokens"][r, :-1] for b in batches]) for r in range(len(it.rows))]
    segs = [np.concatenate([b["segment_ids"][r, :-1] for b in batches]) for r in range(len(it.rows))]
    return batches, toks, segs


def test_consecutive_windows_of_a_row_concatenate_to_its_documents(store):
    st, docs = store
    it = StreamIterator(st, seq_len=T, batch_size=3, seed=5)
    batches, toks, segs = _row_streams(it, 30)
    for r in range(3):
        expect = np.concatenate([docs[it.document(r, j)] for j in range(60)])[:30 * T]
        np.testing.assert_array_equal(toks[r], expect)
        # ids number the row's documents: constant inside one, +1 at each new one (at its BOS)
        change = np.flatnonzero(np.diff(segs[r]) != 0) + 1
        assert (np.diff(segs[r]) >= 0).all() and (segs[r] > 0).all()
        assert (toks[r][change] == BOS_ID).all()
        assert segs[r][0] == 1
    for s in range(29):  # a window's last token is the next window's first, same id
        np.testing.assert_array_equal(batches[s]["tokens"][:, -1], batches[s + 1]["tokens"][:, 0])
        np.testing.assert_array_equal(batches[s]["segment_ids"][:, -1],
                                      batches[s + 1]["segment_ids"][:, 0])


def test_rows_deal_each_epoch_once(store):
    st, _ = store
    it = StreamIterator(st, seq_len=T, batch_size=3, seed=5)
    order = [it.document(k % 3, k // 3) for k in range(3 * st.num_docs)]
    assert sorted(order[:st.num_docs]) == list(range(st.num_docs))
    assert sorted(order[st.num_docs:2 * st.num_docs]) == list(range(st.num_docs))
    other = StreamIterator(st, seq_len=T, batch_size=3, seed=6)
    assert [other.document(k % 3, k // 3) for k in range(3 * st.num_docs)] != order
    # more rows than documents still works
    many = StreamIterator(st, seq_len=T, batch_size=10, seed=5)
    assert next(many)["tokens"].shape == (10, T + 1)


def test_resume_mid_document_is_exact(store):
    st, _ = store
    a = StreamIterator(st, seq_len=T, batch_size=4, seed=1)
    for _ in range(7):
        next(a)
    state = json.loads(json.dumps(a.get_state()))  # travels as JSON in the checkpoint
    assert any(o > 0 for _, o in state["rows"])  # some row stopped inside a document
    expect = [next(a) for _ in range(9)]
    b = StreamIterator(st, seq_len=T, batch_size=4, seed=1)
    b.set_state(state)
    for e in expect:
        got = next(b)
        for k in e:
            np.testing.assert_array_equal(got[k], e[k])
    with pytest.raises(ValueError, match="seed"):
        StreamIterator(st, seq_len=T, batch_size=4, seed=2).set_state(state)


def test_process_shards_are_the_global_rows(store):
    st, _ = store
    whole = next(StreamIterator(st, seq_len=T, batch_size=4, seed=3))
    half = next(StreamIterator(st, seq_len=T, batch_size=4, seed=3, shard_index=1, shard_count=2))
    np.testing.assert_array_equal(half["tokens"], whole["tokens"][2:])
    with pytest.raises(ValueError, match="multiple"):
        StreamIterator(st, seq_len=T, batch_size=3, seed=3, shard_count=2)


def test_doc_align_starts_every_document_at_a_multiple_and_pads_with_id_0(store):
    st, docs = store
    A = 8
    it = StreamIterator(st, seq_len=T, batch_size=3, seed=5, doc_align=A)
    _, toks, segs = _row_streams(it, 30)
    for r in range(3):
        real = segs[r] != 0
        assert (toks[r][~real] == 0).all()
        starts = np.flatnonzero(np.diff(np.concatenate([[0], segs[r]])) > 0)
        assert (starts % A == 0).all() and (toks[r][starts] == BOS_ID).all()
        n_docs = len(starts)
        expect = np.concatenate([docs[it.document(r, j)] for j in range(n_docs)])
        got = toks[r][real]
        np.testing.assert_array_equal(got, expect[:len(got)])
        # each document's padding fills its last block exactly: the next one starts right after
        ends = [-(-len(docs[it.document(r, j)]) // A) * A for j in range(n_docs - 1)]
        np.testing.assert_array_equal(np.diff(starts), ends)


def test_doc_align_resume_is_exact_and_a_changed_alignment_is_refused(store):
    st, _ = store
    a = StreamIterator(st, seq_len=T, batch_size=2, seed=3, doc_align=8)
    for _ in range(7):
        next(a)
    saved = json.loads(json.dumps(a.get_state()))
    want = [next(a) for _ in range(5)]
    b = StreamIterator(st, seq_len=T, batch_size=2, seed=3, doc_align=8)
    b.set_state(saved)
    for w in want:
        g = next(b)
        np.testing.assert_array_equal(g["tokens"], w["tokens"])
        np.testing.assert_array_equal(g["segment_ids"], w["segment_ids"])
    with pytest.raises(ValueError, match="doc_align"):
        StreamIterator(st, seq_len=T, batch_size=2, seed=3, doc_align=4).set_state(saved)
    with pytest.raises(ValueError, match="doc_align=5"):
        StreamIterator(st, seq_len=T, batch_size=2, seed=3, doc_align=5)
