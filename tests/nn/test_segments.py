import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.nn.segments import (PERSISTENT_SEGMENT_ID, attention_mask, doc_starts, document_ids,
                                   segment_positions)

P = PERSISTENT_SEGMENT_ID


def test_doc_starts_and_positions_hand_example():
    seg = jnp.array([[1, 1, 1, 2, 2, 0, 0, 3], [0, 0, 5, 5, 5, 5, 6, 6]], jnp.int32)
    np.testing.assert_array_equal(
        doc_starts(seg),
        [[1, 0, 0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(
        segment_positions(seg),
        [[0, 1, 2, 0, 1, 0, 1, 0], [0, 1, 0, 1, 2, 3, 0, 1]])
    assert segment_positions(seg).dtype == jnp.int32


def test_position_zero_is_always_a_start():
    seg = jnp.array([[7, 7, 7]], jnp.int32)
    np.testing.assert_array_equal(doc_starts(seg), [[1, 0, 0]])
    np.testing.assert_array_equal(segment_positions(seg), [[0, 1, 2]])


def test_persistent_tokens_get_position_zero_and_next_token_starts():
    seg = jnp.array([[P, P, P, 1, 1, 2]], jnp.int32)
    np.testing.assert_array_equal(segment_positions(seg), [[0, 0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(doc_starts(seg), [[1, 0, 0, 1, 0, 1]])


def test_document_ids_separate_reused_ids():
    seg = jnp.array([[1, 1, 2, 2, 1, 1, 0, 0], [P, P, 4, 4, 4, 0, 4, 4]], jnp.int32)
    np.testing.assert_array_equal(
        document_ids(seg), [[1, 1, 2, 2, 3, 3, 4, 4], [P, P, 2, 2, 2, 3, 4, 4]])


def test_causal_mask_hand_case():
    seg = jnp.array([[1, 1, 2, 2, 0]], jnp.int32)
    m = attention_mask(seg, seg)
    assert m.shape == (1, 1, 5, 5) and m.dtype == jnp.bool_
    np.testing.assert_array_equal(m[0, 0], [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1]])


def test_sliding_window_mask_hand_case():
    seg = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2]], jnp.int32)
    m = attention_mask(seg, seg, causal=True, window=2)
    np.testing.assert_array_equal(m[0, 0], [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 0, 0],   # document start: the window does not reach back
        [0, 0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 1, 1]])


def test_non_causal_window_is_symmetric():
    seg = jnp.array([[1, 1, 1, 1]], jnp.int32)
    m = attention_mask(seg, seg, causal=False, window=2)
    np.testing.assert_array_equal(m[0, 0], [
        [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]])


def test_persistent_prefix_mask_hand_case():
    seg = jnp.array([[P, P, 1, 1, 1, 2]], jnp.int32)
    m = attention_mask(seg, seg, causal=True, window=1)
    np.testing.assert_array_equal(m[0, 0], [
        [1, 1, 0, 0, 0, 0],   # persistent tokens see each other (both directions) ...
        [1, 1, 0, 0, 0, 0],   # ... and nothing else
        [1, 1, 1, 0, 0, 0],   # every token sees all persistent tokens, whatever the window
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 0, 0, 1]])


def test_mask_against_brute_force():
    rng = np.random.default_rng(0)
    seg = np.sort(rng.integers(0, 4, (3, 20)), axis=1).astype(np.int32)
    for window in (None, 3):
        m = np.asarray(attention_mask(jnp.asarray(seg), jnp.asarray(seg), window=window))
        for b in range(3):
            for i in range(20):
                for j in range(20):
                    want = seg[b, i] == seg[b, j] and j <= i and (window is None or i - j < window)
                    assert m[b, 0, i, j] == want


@pytest.mark.parametrize("bad", [np.zeros((4,), np.int32), np.zeros((2, 3), np.float32)])
def test_bad_ids_raise(bad):
    with pytest.raises(ValueError, match="segment_ids"):
        segment_positions(bad)


def test_bad_window_and_batch_raise():
    seg = jnp.ones((2, 4), jnp.int32)
    with pytest.raises(ValueError, match="window"):
        attention_mask(seg, seg, window=0)
    with pytest.raises(ValueError, match="batch"):
        attention_mask(seg, seg[:1])
