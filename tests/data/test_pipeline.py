"""Tests for titans_lm.data.pipeline: determinism, alignment, epochs, state restore, sharding."""

import itertools
import json

import numpy as np
import pytest

from titans_lm.config import BOS_ID, PAD_ID
from titans_lm.data.pipeline import make_train_iterator, window_starts
from titans_lm.data.store import build_token_store

T, ALIGN = 16, 4


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Documents of assorted lengths whose non-BOS tokens are unique across the store."""
    rng = np.random.default_rng(0)
    docs, next_id = [], 4
    for length in rng.integers(1, 40, size=25):
        docs.append([BOS_ID, *range(next_id, next_id + int(length))])
        next_id += int(length)
    return build_token_store(tmp_path_factory.mktemp("pipe") / "s", docs, ALIGN)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _rows(batches):
    return [row for b in batches for row in b["tokens"]]


def _locate(store, row):
    """The store position where a window row starts (found from its first unique token)."""
    j = next(i for i, t in enumerate(row) if t not in (BOS_ID, PAD_ID))
    return int(np.flatnonzero(np.asarray(store.tokens) == row[j])[0]) - j


def _it(store, **kw):
    args = dict(seq_len=T, batch_size=4, seed=0, doc_align=ALIGN, shard_index=0, shard_count=1)
    return make_train_iterator(store, **{**args, **kw})


def test_batches_follow_contract(store):
    starts = set(window_starts(store.num_tokens, T, ALIGN).tolist())
    for batch in _take(_it(store), 10):
        assert set(batch) == {"tokens", "segment_ids"}
        for key in batch:
            assert batch[key].shape == (4, T + 1) and batch[key].dtype == np.int32
        for tokens, segs in zip(batch["tokens"], batch["segment_ids"]):
            start = _locate(store, tokens)
            assert start % ALIGN == 0 and start in starts
            np.testing.assert_array_equal(tokens, store.window(start, T + 1))
            np.testing.assert_array_equal(segs, store.segment_ids(start, T + 1))
            # A document starts where the id changes to a non-zero value: always at a multiple of
            # doc_align, and on a BOS.
            prev = np.concatenate([[0], segs[:-1]])
            doc_starts = np.flatnonzero((segs != prev) & (segs != 0))
            doc_starts = doc_starts[doc_starts > 0]
            assert np.all(doc_starts % ALIGN == 0)
            assert np.all(tokens[doc_starts] == BOS_ID)
            assert np.all(tokens[segs == 0] == PAD_ID)


def test_same_seed_same_batches_different_seed_different(store):
    a, b, c = (_take(_it(store, seed=s), 6) for s in (0, 0, 1))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["tokens"], y["tokens"])
    assert any(not np.array_equal(x["tokens"], z["tokens"]) for x, z in zip(a, c))


def test_every_window_once_per_epoch_new_order_each_epoch(store):
    starts = window_starts(store.num_tokens, T, ALIGN)
    n = len(starts)
    rows = _rows(_take(_it(store, batch_size=1), 3 * n))
    epochs = [[_locate(store, r) for r in rows[e * n:(e + 1) * n]] for e in range(3)]
    for order in epochs:
        assert sorted(order) == starts.tolist()
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]


def test_state_save_restore(store):
    it = _it(store)
    _take(it, 7)
    state = json.loads(json.dumps(it.get_state()))
    expected = _take(it, 5)
    fresh = _it(store)
    fresh.set_state(state)
    for x, y in zip(expected, _take(fresh, 5)):
        np.testing.assert_array_equal(x["tokens"], y["tokens"])
        np.testing.assert_array_equal(x["segment_ids"], y["segment_ids"])


def test_process_shards_are_the_row_blocks_of_the_global_batch(store):
    """Each process reads its contiguous block of the same global batch, so the global batch
    (and the loss) does not depend on the number of processes."""
    n = len(window_starts(store.num_tokens, T, ALIGN))
    whole = _take(_it(store, batch_size=4), n // 2)
    shards = [_take(_it(store, batch_size=4, shard_index=i, shard_count=2), n // 2) for i in range(2)]
    for b, b0, b1 in zip(whole, *shards):
        assert b0["tokens"].shape == (2, T + 1)
        for k in ("tokens", "segment_ids"):
            np.testing.assert_array_equal(np.concatenate([b0[k], b1[k]]), b[k])
    assert not ({_locate(store, r) for r in _rows(shards[0][:1])}
                & {_locate(store, r) for r in _rows(shards[1][:1])})


def test_default_shard_is_this_process(store):
    a = _take(make_train_iterator(store, seq_len=T, batch_size=4, seed=3, doc_align=ALIGN), 2)
    b = _take(_it(store, seed=3), 2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["tokens"], y["tokens"])


def test_bad_arguments(store):
    with pytest.raises(ValueError, match="batch_size=3 must be a positive multiple.*shard_count=2"):
        _it(store, batch_size=3, shard_index=0, shard_count=2)
    with pytest.raises(ValueError, match="shard_index=2 must lie in"):
        _it(store, shard_index=2, shard_count=2)
    with pytest.raises(ValueError, match="doc_align=6 must be a positive multiple of the store's doc_align=4"):
        _it(store, doc_align=6)
    with pytest.raises(ValueError, match="fewer than one window"):
        _it(store, seq_len=store.num_tokens)
    assert list(itertools.islice(window_starts(20, 3, 4), 10)) == [0, 4, 8, 12, 16]
    assert window_starts(20, 16, 4).tolist() == [0]


def test_state_in_orbax_checkpoint(store, tmp_path):
    import grain
    import orbax.checkpoint as ocp

    it = _it(store)
    _take(it, 3)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
        expected = _take(it, 4)
        fresh = _it(store)
        mngr.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
    for x, y in zip(expected, _take(fresh, 4)):
        np.testing.assert_array_equal(x["tokens"], y["tokens"])
