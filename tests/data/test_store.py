"""Tests for titans_lm.data.store: layout, padding, segment ids, atomic build, corruption."""

import json
import os

import numpy as np
import pytest

from titans_lm.config import BOS_ID, PAD_ID
from titans_lm.data.store import TokenStore, build_token_store, token_dtype

DOCS = [[BOS_ID, 10, 11, 12], [BOS_ID, 20], [BOS_ID, 30, 31, 32, 33, 34, 35, 36], [BOS_ID]]


def _reference_layout(docs, align):
    """Plain-Python store layout: tokens and segment ids position by position."""
    tokens, segs = [], []
    for d, doc in enumerate(docs):
        pad = (-len(doc)) % align
        tokens += list(doc) + [PAD_ID] * pad
        segs += [d + 1] * len(doc) + [0] * pad
    return np.array(tokens), np.array(segs)


@pytest.mark.parametrize("align", [1, 4, 8])
def test_round_trip_padding_and_segments(tmp_path, align):
    store = build_token_store(tmp_path / "s", DOCS, align, vocab_size=100)
    ref_tokens, ref_segs = _reference_layout(DOCS, align)
    assert isinstance(store.tokens, np.memmap) and store.tokens.dtype == np.uint16
    assert store.num_tokens == len(ref_tokens) and store.num_tokens % align == 0
    assert store.num_docs == len(DOCS) and store.num_real_tokens == sum(map(len, DOCS))
    np.testing.assert_array_equal(store.tokens, ref_tokens)
    np.testing.assert_array_equal(store.doc_lengths, [len(d) for d in DOCS])
    assert np.all(store.doc_offsets % align == 0)
    np.testing.assert_array_equal(store.segment_ids(0, store.num_tokens), ref_segs)
    for start in range(store.num_tokens):
        for length in (0, 1, 3):
            if start + length <= store.num_tokens:
                np.testing.assert_array_equal(store.segment_ids(start, length), ref_segs[start:start + length])
                np.testing.assert_array_equal(store.window(start, length), ref_tokens[start:start + length])
    assert store.segment_ids(0, 2).dtype == np.int32 and store.window(0, 2).dtype == np.int32
    reopened = TokenStore.open(tmp_path / "s")
    for d, doc in enumerate(DOCS):
        np.testing.assert_array_equal(reopened.doc_tokens(d), doc)
    with pytest.raises(IndexError, match="outside the store"):
        store.segment_ids(store.num_tokens - 1, 2)
    with pytest.raises(IndexError, match="document 4 outside"):
        store.doc_tokens(4)


def test_dtype_follows_vocab(tmp_path):
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.int32
    big = build_token_store(tmp_path / "big", [[BOS_ID, 70_000, 5]], 4, vocab_size=70_001)
    assert big.tokens.dtype == np.int32
    np.testing.assert_array_equal(big.doc_tokens(0), [BOS_ID, 70_000, 5])
    inferred = build_token_store(tmp_path / "inferred", [np.array([BOS_ID, 7], np.int32)], 2)
    assert inferred.vocab_size == 8 and inferred.tokens.dtype == np.uint16


def test_build_is_atomic_and_once(tmp_path):
    build_token_store(tmp_path / "s", DOCS, 4)
    assert sorted(os.listdir(tmp_path)) == ["s"]  # no temporary directory left behind
    with pytest.raises(FileExistsError, match="already exists"):
        build_token_store(tmp_path / "s", DOCS, 4)


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="zero documents"):
        build_token_store(tmp_path / "a", [], 4)
    with pytest.raises(ValueError, match="document 1 does not begin with BOS"):
        build_token_store(tmp_path / "b", [[BOS_ID, 5], [5, 6]], 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        build_token_store(tmp_path / "c", [[BOS_ID, 100]], 4, vocab_size=100)
    with pytest.raises(ValueError, match="doc_align must be >= 1"):
        build_token_store(tmp_path / "d", DOCS, 0)
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_missing_and_corrupt(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a token store, tokens.npy is missing"):
        TokenStore.open(tmp_path / "nothing")
    path = tmp_path / "s"
    build_token_store(path, DOCS, 4)

    truncated = (path / "tokens.npy").read_bytes()
    (path / "tokens.npy").write_bytes(truncated[:-6])
    with pytest.raises(ValueError, match="corrupt token store"):
        TokenStore.open(path)
    (path / "tokens.npy").write_bytes(truncated)
    TokenStore.open(path)

    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "num_tokens": meta["num_tokens"] + 4}))
    with pytest.raises(ValueError, match="corrupt token store.*tokens.npy has shape"):
        TokenStore.open(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt token store.*meta.json"):
        TokenStore.open(path)
    (path / "meta.json").write_text(json.dumps(meta))

    np.save(path / "doc_lengths.npy", np.array([4, 1, 8, 9]))  # longer than its padded slot
    with pytest.raises(ValueError, match="corrupt token store.*inconsistent"):
        TokenStore.open(path)
    os.remove(path / "doc_offsets.npy")
    with pytest.raises(FileNotFoundError, match="doc_offsets.npy is missing"):
        TokenStore.open(path)
