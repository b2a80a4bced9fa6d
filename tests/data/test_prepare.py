"""Tests for titans_lm.data.prepare: stores per split, caching and reuse, tokenizer hand-over."""

from pathlib import Path

import numpy as np
import pytest

from titans_lm.config import BOS_ID, base_config
from titans_lm.data import prepare as prepare_mod
from titans_lm.data import tokenizer as tokenizer_mod
from titans_lm.data.corpora import load_documents
from titans_lm.data.prepare import prepare, resolve_cache_dir, tokenize_documents


@pytest.fixture(scope="module")
def data_cfg(tmp_path_factory):
    c = base_config().data
    c.corpus = "tinyshakespeare"
    c.vocab_size = 512
    c.tokenizer_sentences = 10_000
    c.doc_align = 64
    c.cache_dir = str(tmp_path_factory.mktemp("cache"))
    return c


@pytest.fixture(scope="module")
def prepared(data_cfg):
    return prepare(data_cfg, log=None)


def test_stores_hold_the_split_texts(prepared, data_cfg):
    assert set(prepared.stores) == {"train", "validation", "test"}
    for split, store in prepared.stores.items():
        docs = load_documents(data_cfg.corpus, split, data_cfg.data_dir)
        assert store.num_docs == len(docs) and store.doc_align == 64
        assert store.vocab_size == prepared.tokenizer.vocab_size == 512
        for d, doc in enumerate(docs):
            toks = store.doc_tokens(d)
            assert toks[0] == BOS_ID
            assert prepared.tokenizer.decode(toks) == doc.text


def test_second_prepare_reuses_everything(prepared, data_cfg, monkeypatch):
    def fail(*a, **k):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", fail)
    monkeypatch.setattr(prepare_mod, "build_token_store", fail)
    lines = []
    again = prepare(data_cfg, log=lines.append)
    assert again.tokenizer.fingerprint == prepared.tokenizer.fingerprint
    assert {s: st.path for s, st in again.stores.items()} == {s: st.path for s, st in prepared.stores.items()}
    assert sum("reusing" in line for line in lines) == 4  # tokenizer + 3 stores
    # Another doc_align is another store.
    other = data_cfg.copy_and_resolve_references()
    other.doc_align = 32
    with pytest.raises(AssertionError, match="rebuilt"):
        prepare(other, splits=["test"], log=None)


def test_eval_corpus_with_a_given_tokenizer(prepared, data_cfg):
    wiki = data_cfg.copy_and_resolve_references()
    wiki.corpus = "wikitext-2"
    with pytest.raises(ValueError, match="'wikitext-2' has no train split to train a tokenizer"):
        prepare(wiki, log=None)
    got = prepare(wiki, tokenizer=prepared.tokenizer, splits=["validation"], log=None)
    assert set(got.stores) == {"validation"} and got.stores["validation"].num_docs >= 55
    bad_vocab = data_cfg.copy_and_resolve_references()
    bad_vocab.vocab_size = 1024
    with pytest.raises(ValueError, match="tokenizer has 512 ids but data.vocab_size=1024"):
        prepare(bad_vocab, tokenizer=prepared.tokenizer, splits=["test"], log=None)


def test_tokenize_documents_and_cache_dir(prepared, data_cfg):
    docs = load_documents(data_cfg.corpus, "test", data_cfg.data_dir)
    toks = tokenize_documents(prepared.tokenizer, docs)
    np.testing.assert_array_equal(toks[0], prepared.stores["test"].doc_tokens(0))
    c = base_config().data
    c.cache_dir = ""
    assert resolve_cache_dir(c).name == ".cache"
    assert resolve_cache_dir(c).parent == Path(c.data_dir).resolve().parent
