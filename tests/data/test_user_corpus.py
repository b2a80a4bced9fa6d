"""A user's own corpus (``data.corpus=PATH``): files, documents, held-out splits, clear errors,
and a cache keyed by the files' content (tokenizer and stores rebuilt when a file changes)."""

import gzip
import json
import lzma

import pytest

from _tiny_run import tiny_config
from titans_lm.data.prepare import prepare
from titans_lm.data.user_corpus import corpus_label, load_splits, read_corpus

LINE = "The quick brown fox jumps over the lazy dog; {i} wolves sleep under the moon.\n"


def _text(i: int, lines: int = 40) -> str:
    return "".join(LINE.format(i=i * 100 + j) for j in range(lines))


def _folder(root, n=8):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n - 2):
        (root / f"doc{i}.txt").write_text(_text(i))
    (root / "sub").mkdir()
    (root / "sub" / "z.txt.gz").write_bytes(gzip.compress(_text(90).encode()))
    recs = [{"text": _text(91, 5), "id": 1}, {"text": "   "}, {"text": _text(92, 5)}]
    (root / "web.jsonl.xz").write_bytes(lzma.compress("\n".join(map(json.dumps, recs)).encode()))
    (root / "README.md").write_text("not a corpus file")
    return root


def _cfg(corpus, cache, **kw):
    cfg = tiny_config(cache, data__corpus=str(corpus), **kw)
    return cfg.data


def test_files_documents_and_splits(tmp_path):
    root = _folder(tmp_path / "c")
    files = read_corpus(str(root))
    names = [n for n, _ in files]
    assert names == ["doc0.txt", "doc1.txt", "doc2.txt", "doc3.txt", "doc4.txt", "doc5.txt",
                     "sub/z.txt.gz", "web.jsonl.xz"]  # sorted; README.md ignored
    assert [d.name for d in files[-1][1]] == ["web.jsonl.xz:1", "web.jsonl.xz:3"]  # blank dropped
    assert files[6][1][0].text == _text(90)
    data = _cfg(root, tmp_path / "cache", data__heldout_fraction=0.25)
    parts = load_splits(data, ("train", "validation", "test"))
    n = {s: len(d) for s, d in parts.items()}
    assert n == {"train": 7, "validation": 1, "test": 1}  # 9 documents, 25% held out
    again = load_splits(data, ("train", "validation", "test"))
    assert {s: [d.name for d in v] for s, v in again.items()} == \
        {s: [d.name for d in v] for s, v in parts.items()}  # deterministic
    named = _cfg(root, tmp_path / "cache", data__validation_files="doc1.txt",
                 data__test_files="sub/z.txt.gz, doc4.txt")
    parts = load_splits(named, ("train", "validation", "test"))
    assert [d.name for d in parts["validation"]] == ["doc1.txt"]
    assert [d.name for d in parts["test"]] == ["doc4.txt", "sub/z.txt.gz"]
    assert corpus_label(named) == "user-c"


@pytest.mark.parametrize("make, field, message", [
    (lambda r: None, {}, "no such file or folder"),
    (lambda r: r.mkdir(), {}, "the folder holds no .txt or .jsonl file"),
    (lambda r: (r.mkdir(), (r / "a.txt").write_text("  \n")), {}, "no text (every file is empty"),
    (lambda r: (r.mkdir(), (r / "a.txt").write_bytes(b"ok \xff\xfe")), {},
     "a.txt: not valid UTF-8 at byte offset 3"),
    (lambda r: (r.mkdir(), (r / "a.jsonl").write_text('{"body": "x"}\n')), {},
     "a.jsonl:1: expected an object with a string 'text' field, got ['body']"),
    (lambda r: (r.mkdir(), (r / "a.txt").write_text("x"), (r / "b.txt").write_text("y")), {},
     "holds 2 document(s); a held-out split by fraction needs at least 3"),
    (lambda r: _folder(r), {"data__validation_files": "nope.txt", "data__test_files": "doc1.txt"},
     "config field data.validation_files: ['nope.txt'] not in"),
])
def test_clear_errors(tmp_path, make, field, message):
    root = tmp_path / "corpus"
    make(root)
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        load_splits(_cfg(root, tmp_path / "cache", **field), ("train",))
    assert message in str(e.value)


def test_too_small_for_one_window(tmp_path):
    root = tmp_path / "small"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.txt").write_text(_text(i, 2))
    with pytest.raises(ValueError, match="fewer than one training window of data.seq_len"):
        prepare(_cfg(root, tmp_path / "cache", data__seq_len=512, data__doc_align=64), log=None)


def test_cache_keyed_by_content(tmp_path):
    root = _folder(tmp_path / "c")
    data = _cfg(root, tmp_path / "cache")
    logs = []
    first = prepare(data, log=logs.append)
    second = prepare(data, log=logs.append)
    assert {s: v.path for s, v in second.stores.items()} == {s: v.path for s, v in first.stores.items()}
    (root / "doc0.txt").write_text(_text(0) + "an added line\n")  # a corpus file changes
    third = prepare(data, log=None)
    assert third.stores["train"].path != first.stores["train"].path  # rebuilt, not reused
    assert third.tokenizer.fingerprint != first.tokenizer.fingerprint
    # the cached tokenizer file is changed after it was written: detected and trained again
    for path in (tmp_path / "cache").glob("tokenizer-*.model"):
        path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    logs.clear()
    fourth = prepare(data, log=logs.append)
    assert any("was changed after it was written" in m for m in logs), logs
    assert fourth.tokenizer.fingerprint == third.tokenizer.fingerprint


def test_both_held_out_splits_are_named_when_training_builds_one(tmp_path):
    """Training prepares train and validation only; the log still names the test documents."""
    root = _folder(tmp_path / "c")
    logs = []
    p = prepare(_cfg(root, tmp_path / "cache"), splits=("train", "validation"), log=logs.append)
    assert set(p.stores) == {"train", "validation"}
    parts = load_splits(_cfg(root, tmp_path / "cache"), ("validation", "test"))
    for split in ("validation", "test"):
        names = ", ".join(d.name for d in parts[split])
        assert f"{corpus_label(_cfg(root, tmp_path))}/{split} holds {names}" in logs, logs
