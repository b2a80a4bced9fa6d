import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID, document_ids, segment_positions
from titans_lm.nn.stream import Stream, StreamState, fresh_stream_state, make_stream

P = PERSISTENT_SEGMENT_ID


def document_starts(seg):
    """Memory document starts of one call: the id changes to a non-zero id (padding is none)."""
    prev = jnp.pad(seg[:, :-1], ((0, 0), (1, 0)), constant_values=0)
    return (seg != prev) & (seg != 0)


def test_document_starts_of_a_fresh_stream():
    seg = jnp.array([[1, 1, 2, 2, 0, 0, 3, 3], [0, 0, 5, 5, 5, 5, 5, 5]])
    starts = np.asarray(make_stream(seg, fresh_stream_state(2))[0].starts)
    assert starts[0].nonzero()[0].tolist() == [0, 2, 6]
    assert starts[1].nonzero()[0].tolist() == [2]       # padding is not a document start

CASES = [
    [[1, 1, 1, 2, 2, 0, 0, 3], [0, 0, 5, 5, 5, 5, 6, 6]],
    [[P, P, 1, 1, 2, 2, 1, 1], [P, P, 0, 4, 4, 0, 4, 4]],
    [[7, 7, 7, 7, 7, 7, 7, 7], [0, 0, 0, 0, 0, 0, 0, 0]],
]


@pytest.mark.parametrize("ids", CASES)
def test_fresh_state_reproduces_single_window_conventions(ids):
    seg = jnp.array(ids, jnp.int32)
    stream, state = make_stream(seg, fresh_stream_state(2))
    np.testing.assert_array_equal(stream.doc_ids, document_ids(seg))
    np.testing.assert_array_equal(stream.positions, segment_positions(seg))
    np.testing.assert_array_equal(stream.starts, document_starts(seg))
    np.testing.assert_array_equal(stream.segment_ids, seg)
    assert int(stream.offset) == 0 and int(state.position) == 8
    assert stream.doc_ids.dtype == stream.positions.dtype == jnp.int32


@pytest.mark.parametrize("ids", CASES)
@pytest.mark.parametrize("split", [1, 3, 5, 7])
def test_split_calls_equal_one_call(ids, split):
    """Calls over w1 then w2 with the carried state give the fields of one call over [w1 || w2]."""
    seg = jnp.array(ids, jnp.int32)
    whole, end = make_stream(seg, fresh_stream_state(2))
    first, mid = make_stream(seg[:, :split], fresh_stream_state(2))
    second, end2 = make_stream(seg[:, split:], mid)
    for name in ("segment_ids", "doc_ids", "starts", "positions"):
        joined = np.concatenate([getattr(first, name), getattr(second, name)], axis=1)
        np.testing.assert_array_equal(joined, getattr(whole, name), err_msg=name)
    assert int(first.offset) == 0 and int(second.offset) == split
    for a, b in zip(end, end2):
        np.testing.assert_array_equal(a, b)


def test_continued_call_does_not_restart_but_a_changed_id_does():
    _, state = make_stream(jnp.array([[3, 3, 3], [3, 3, 3]], jnp.int32), fresh_stream_state(2))
    stream, _ = make_stream(jnp.array([[3, 3], [4, 4]], jnp.int32), state)
    np.testing.assert_array_equal(stream.starts, [[False, False], [True, False]])
    np.testing.assert_array_equal(stream.positions, [[3, 4], [0, 1]])
    np.testing.assert_array_equal(stream.doc_ids, [[1, 1], [2, 2]])
    assert int(stream.offset) == 3


def test_padding_continues_its_run_and_is_not_a_memory_start():
    _, state = make_stream(jnp.array([[2, 0]], jnp.int32), fresh_stream_state(1))
    stream, _ = make_stream(jnp.array([[0, 0, 2]], jnp.int32), state)
    np.testing.assert_array_equal(stream.positions, [[1, 2, 0]])
    np.testing.assert_array_equal(stream.doc_ids, [[2, 2, 3]])
    np.testing.assert_array_equal(stream.starts, [[False, False, True]])


def test_after_a_persistent_prefix_the_first_token_starts():
    _, state = make_stream(jnp.full((1, 3), P, jnp.int32), fresh_stream_state(1))
    stream, _ = make_stream(jnp.array([[5, 5]], jnp.int32), state._replace(position=jnp.int32(0)))
    np.testing.assert_array_equal(stream.starts, [[True, False]])
    np.testing.assert_array_equal(stream.positions, [[0, 1]])
    np.testing.assert_array_equal(stream.doc_ids, [[2, 2]])  # the prefix was run 1
    # as in one window [P P P 5 5]
    whole = jnp.array([[P, P, P, 5, 5]], jnp.int32)
    np.testing.assert_array_equal(stream.doc_ids, document_ids(whole)[:, 3:])
    np.testing.assert_array_equal(stream.starts, document_starts(whole)[:, 3:])


def test_stream_is_a_pytree_with_static_fresh():
    seg = jnp.array([[1, 1, 2]], jnp.int32)
    stream, _ = make_stream(seg, fresh_stream_state(1), fresh=True)
    assert len(jax.tree.leaves(stream)) == 5

    @jax.jit
    def f(st: Stream):
        assert st.fresh is True  # static: a Python bool under jit
        return st.positions + 1

    np.testing.assert_array_equal(f(stream), [[1, 2, 1]])
    assert stream._replace(fresh=False).fresh is False
    jitted, _ = jax.jit(make_stream)(seg, fresh_stream_state(1))
    np.testing.assert_array_equal(jitted.doc_ids, stream.doc_ids)


def test_bad_input_messages():
    with pytest.raises(ValueError, match="batch size"):
        make_stream(jnp.ones((2, 3), jnp.int32), fresh_stream_state(1))
    with pytest.raises(ValueError, match="T = 0"):
        make_stream(jnp.ones((1, 0), jnp.int32), fresh_stream_state(1))
    with pytest.raises(ValueError, match="integer"):
        make_stream(jnp.ones((1, 3)), fresh_stream_state(1))
    with pytest.raises(ValueError, match="batch_size"):
        fresh_stream_state(0)
    assert isinstance(fresh_stream_state(2), StreamState)


def test_a_stream_without_persistent_tokens_refuses_persistent_ids():
    seg = jnp.asarray([[PERSISTENT_SEGMENT_ID, 1, 1]], jnp.int32)
    with pytest.raises(ValueError, match="persistent tokens"):
        make_stream(seg, fresh_stream_state(1), no_persistent=True)
    stream, _ = make_stream(seg, fresh_stream_state(1))
    assert not stream.no_persistent


def test_a_stream_without_persistent_tokens_traces_under_jit_over_closed_over_ids():
    # Under jit, ids closed over as a constant are concrete, but a jnp op on them is staged: the
    # check must not turn a staged value into a Python bool.
    seg = jnp.ones((2, 4), jnp.int32)
    f = jax.jit(lambda: make_stream(seg, fresh_stream_state(2), fresh=True,
                                    no_persistent=True)[0].doc_ids)
    np.testing.assert_array_equal(f(), document_ids(seg))
