"""Tests for titans_lm.data.tokenizer: exact round trips, special ids, caching, errors."""

import os

import numpy as np
import pytest

from titans_lm.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, default_data_dir
from titans_lm.data import tokenizer as tokenizer_mod
from titans_lm.data.corpora import Document, load_documents
from titans_lm.data.tokenizer import Tokenizer, train_or_load_tokenizer, training_lines

VOCAB = 512


@pytest.fixture(scope="module")
def train_docs():
    return load_documents("tinyshakespeare", "train", default_data_dir())


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tok_cache")


@pytest.fixture(scope="module")
def tok(train_docs, cache_dir):
    return train_or_load_tokenizer(train_docs, VOCAB, cache_dir, max_sentences=20_000)


TRICKY = [
    "", " ", "   ", "\n", "\n\n\n", "\t", "a\tb\t\tc", "  two  spaces  ", " leading", "trailing ",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "中文字符 和 日本語のテキスト", "emoji 🎉👍🏽 family 👨‍👩‍👧", "é vs e\u0301 (NFC vs NFD)",
    "\x00\x01\x7f control \r\n CRLF \r", "zero\u200bwidth\ufeffBOM", "\u2581 lower eighth \u2581\u2581x\u2581",
    "<s></s><pad><unk> look like specials", "▁▁", "\U0010ffff\U0001f600", "ﬁ ligature ＦＵＬＬ width ①",
    "12345678901234567890 digits", "مرحبا بالعالم", "Ελληνικά", " \n \n = = Heading = = \n",
]


def test_special_ids_and_vocab(tok):
    assert tok.vocab_size == VOCAB
    assert tok.encode("") == [BOS_ID]
    assert tok.encode("", add_bos=False) == []
    ids = tok.encode("hello there")
    assert ids[0] == BOS_ID and BOS_ID not in ids[1:] and EOS_ID not in ids and PAD_ID not in ids
    assert tok.encode("hello there", add_bos=False) == ids[1:]


@pytest.mark.parametrize("text", TRICKY)
def test_exact_round_trip(tok, text):
    ids = tok.encode(text)
    assert UNK_ID not in ids
    assert all(0 <= i < VOCAB for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_round_trip_random_unicode(tok):
    rng = np.random.default_rng(0)
    ranges = [(0x0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    for _ in range(200):
        lo, hi = ranges[rng.integers(len(ranges))]
        n = int(rng.integers(0, 40))
        chars = [chr(int(c)) for c in rng.integers(lo, hi + 1, size=n)]
        chars += list(rng.choice(list(" \n\t\u2581ab"), size=int(rng.integers(0, 6))))
        rng.shuffle(chars)
        text = "".join(chars)
        ids = tok.encode(text)
        assert UNK_ID not in ids and tok.decode(ids) == text, repr(text)


def test_line_by_line_encoding_equals_whole_text(tok):
    text = load_documents("tinyshakespeare", "validation", default_data_dir())[0].text[:20_000]
    text += "\n\n  indented\ttab \n trailing\n"
    assert tok.encode(text, add_bos=False) == tok._sp.encode(text)
    assert tok.decode(tok.encode_array(text)) == text
    assert tok.encode_array(text).dtype == np.int32


def test_decode_drops_specials_and_checks_range(tok):
    ids = tok.encode("abc", add_bos=False)
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "abc"
    assert tok.decode(np.array(ids, dtype=np.uint16)) == "abc"
    with pytest.raises(ValueError, match="token id 512 outside the vocabulary"):
        tok.decode([*ids, VOCAB])


def test_cache_reuse_without_retraining(tok, train_docs, cache_dir, monkeypatch):
    files = sorted(p for p in os.listdir(cache_dir) if p.endswith(".model"))
    assert len(files) == 1 and not any(p.endswith(".tmp") for p in os.listdir(cache_dir))
    mtime = os.stat(cache_dir / files[0]).st_mtime_ns

    def fail(*a, **k):
        raise AssertionError("retrained although the tokenizer is cached")

    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", fail)
    messages = []
    again = train_or_load_tokenizer(train_docs, VOCAB, cache_dir, max_sentences=20_000, log=messages.append)
    assert again.fingerprint == tok.fingerprint
    assert os.stat(cache_dir / files[0]).st_mtime_ns == mtime
    assert messages and "reusing" in messages[0]
    # Any change of input is a different key and would retrain.
    with pytest.raises(AssertionError, match="retrained"):
        train_or_load_tokenizer(train_docs, VOCAB, cache_dir, max_sentences=19_999)
    with pytest.raises(AssertionError, match="retrained"):
        train_or_load_tokenizer(train_docs, VOCAB + 8, cache_dir, max_sentences=20_000)
    with pytest.raises(AssertionError, match="retrained"):
        train_or_load_tokenizer([Document("x", train_docs[0].text + "!")], VOCAB, cache_dir, max_sentences=20_000)


def test_training_is_deterministic(train_docs, tmp_path):
    lines = training_lines(train_docs, 5_000)
    assert lines == training_lines(train_docs, 5_000) and len(lines) == 5_000
    assert all(line.strip() and "\n" not in line for line in lines)
    a = tokenizer_mod.train_tokenizer(lines, 400)
    b = tokenizer_mod.train_tokenizer(lines, 400)
    assert a.fingerprint == b.fingerprint


def test_save_load(tok, tmp_path):
    path = tmp_path / "sub" / "tok.model"
    tok.save(path)
    loaded = Tokenizer.load(path)
    assert loaded.fingerprint == tok.fingerprint and loaded.vocab_size == tok.vocab_size
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a valid sentencepiece model"):
        Tokenizer.load(garbage)
    with pytest.raises(FileNotFoundError, match="no tokenizer model"):
        Tokenizer.load(tmp_path / "absent.model")


def test_bad_training_input(tmp_path):
    with pytest.raises(ValueError, match="cannot train a 5000-piece tokenizer"):
        train_or_load_tokenizer([Document("t", "a tiny text\nwith two lines\n")], 5000, tmp_path, 100)
    with pytest.raises(ValueError, match="no text"):
        train_or_load_tokenizer([Document("t", "\n \n")], 300, tmp_path, 100)
    with pytest.raises(ValueError, match="max_sentences must be >= 1"):
        training_lines([Document("t", "abc")], 0)
