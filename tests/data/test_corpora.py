"""Tests for titans_lm.data.corpora: splits, Gutenberg stripping, WikiText articles, errors."""

import lzma
import re
from pathlib import Path

import pytest

from titans_lm.config import default_data_dir
from titans_lm.data import corpora
from titans_lm.data.corpora import (CORPORA, SPLITS, corpus_splits, load_documents, load_text_file,
                                    read_text, strip_gutenberg)

DATA = default_data_dir()


def _sources_body_words() -> dict[str, int]:
    """Body word counts from the books' SOURCES.md table (between START and END markers)."""
    out = {}
    for line in (Path(DATA) / "books" / "SOURCES.md").read_text().splitlines():
        m = re.match(r"\| `(pg\w+)\.txt` \|.*\| (\d+) \| `[0-9a-f]{64}` \|$", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def test_books_splits_and_stripping():
    docs = {s: load_documents("books", s, DATA) for s in SPLITS}
    assert [d.name for d in docs["validation"]] == ["pg345_stoker_dracula"]
    assert [d.name for d in docs["test"]] == ["pg98_dickens_tale_of_two_cities"]
    assert len(docs["train"]) == 9
    names = [d.name for s in SPLITS for d in docs[s]]
    assert len(set(names)) == 11
    expected_words = _sources_body_words()
    assert set(expected_words) == set(names)
    for d in (d for s in SPLITS for d in docs[s]):
        assert "*** START OF" not in d.text and "*** END OF" not in d.text
        assert "FULL LICENSE" not in d.text and "gutenberg.org/license" not in d.text.lower()
        assert not re.search(r"^End of (the )?Project Gutenberg", d.text, re.MULTILINE | re.IGNORECASE)
        assert d.text[0].strip() and d.text.endswith("\n") and not d.text.endswith("\n\n")
        assert "\ufeff" not in d.text
        # Only the closing "End of ... Project Gutenberg ..." paragraph (a few words) is removed
        # from the body between the markers counted in SOURCES.md.
        removed = expected_words[d.name] - len(d.text.split())
        assert 5 <= removed <= 20, (d.name, removed)


def test_strip_gutenberg_on_synthetic_text():
    text = ("header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n\nBody line.\n\nMore.\n\n"
            "End of the Project Gutenberg EBook of X\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicense\n")
    assert strip_gutenberg(text) == "Body line.\n\nMore.\n"
    with pytest.raises(ValueError, match="START OF"):
        strip_gutenberg("no markers here", "f.txt")
    with pytest.raises(ValueError, match="END OF"):
        strip_gutenberg("*** START OF THE PROJECT GUTENBERG EBOOK X ***\nbody\n", "f.txt")
    with pytest.raises(ValueError, match="empty"):
        strip_gutenberg("*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n"
                        "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\n", "f.txt")


@pytest.mark.parametrize("split,filename,published_tokens", [
    ("validation", "wiki.valid.raw.xz", 217_646), ("test", "wiki.test.raw.xz", 245_569)])
def test_wikitext_articles(split, filename, published_tokens):
    docs = load_documents("wikitext-2", split, DATA)
    assert 55 <= len(docs) <= 70  # WikiText-2 has about 60 articles per held-out split
    raw = lzma.open(Path(DATA) / "wikitext-2" / filename).read().decode()
    # Lossless: the articles are the file minus its leading blank line.
    assert "".join(d.text for d in docs) == raw.removeprefix(" \n")
    for d in docs:
        lines = d.text.split("\n")
        assert re.fullmatch(r" = [^=].* = ", lines[0]) and lines[0].strip()[2:-2].strip() == d.name
        assert not any(re.fullmatch(r" = [^=](.*[^=])? = ", line) for line in lines[1:])
    assert sum(" = = " in d.text for d in docs) > len(docs) // 2  # subsections stay inside articles
    # Merity et al. (2016) count words plus one <eos> per line.
    assert sum(len(d.text.split()) for d in docs) + raw.count("\n") == published_tokens


def test_tinyshakespeare_line_splits():
    full = read_text(Path(DATA) / "tinyshakespeare" / "input.txt.xz")
    docs = {s: load_documents("tinyshakespeare", s, DATA) for s in SPLITS}
    assert all(len(docs[s]) == 1 for s in SPLITS)
    assert "".join(docs[s][0].text for s in SPLITS) == full
    n = len(full.splitlines())
    counts = [len(docs[s][0].text.splitlines()) for s in SPLITS]
    assert counts == [round(0.9 * n), round(0.95 * n) - round(0.9 * n), n - round(0.95 * n)]


def test_unknown_corpus_and_split():
    with pytest.raises(ValueError, match="unknown corpus 'nope'.*books, wikitext-2, tinyshakespeare"):
        load_documents("nope", "train", DATA)
    with pytest.raises(ValueError, match="unknown split 'dev'.*train, validation, test"):
        load_documents("books", "dev", DATA)
    with pytest.raises(ValueError, match="'wikitext-2' has no 'train' split.*validation, test"):
        load_documents("wikitext-2", "train", DATA)
    assert corpus_splits("wikitext-2") == ("validation", "test")
    assert set(CORPORA) == {"books", "wikitext-2", "tinyshakespeare"}


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"input\.txt\.xz: missing data file; expected"):
        load_documents("tinyshakespeare", "train", tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_text_file(tmp_path / "absent.txt")


def test_plain_copy_is_accepted(tmp_path):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    docs = load_documents("tinyshakespeare", "test", tmp_path)
    assert docs[0].text == "line 19\n"


def test_invalid_utf8_names_file_and_offset(tmp_path):
    d = tmp_path / "tinyshakespeare"
    d.mkdir()
    (d / "input.txt.xz").write_bytes(lzma.compress("abc é\n".encode() + b"\xff rest\n"))
    with pytest.raises(ValueError, match=r"input\.txt\.xz: not valid UTF-8 at byte offset 7"):
        load_documents("tinyshakespeare", "train", tmp_path)
    bad = tmp_path / "user.txt"
    bad.write_bytes(b"ok\n\xc3(")
    with pytest.raises(ValueError, match=r"user\.txt: not valid UTF-8 at byte offset 3"):
        load_text_file(bad)
    notxz = tmp_path / "fake.txt.xz"
    notxz.write_bytes(b"plain text")
    with pytest.raises(ValueError, match="not a valid xz"):
        load_text_file(notxz)


def test_empty_corpus_and_file(tmp_path):
    d = tmp_path / "tinyshakespeare"
    d.mkdir()
    (d / "input.txt.xz").write_bytes(lzma.compress(b""))
    with pytest.raises(ValueError, match="'tinyshakespeare' split 'train'.*no text"):
        load_documents("tinyshakespeare", "train", tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\t\n")
    with pytest.raises(ValueError, match=r"empty\.txt: the file contains no text"):
        load_text_file(empty)


def test_load_text_file(tmp_path):
    text = "\ufeffFirst line\n  second\t line 中文 🎉\n"
    p = tmp_path / "mine.txt.xz"
    p.write_bytes(lzma.compress(text.encode()))
    docs = load_text_file(p)
    assert [d.name for d in docs] == ["mine.txt.xz"] and docs[0].text == text[1:]
    assert corpora.Document("a", "b").text == "b"
