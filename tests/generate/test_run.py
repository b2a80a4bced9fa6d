"""``titans-lm generate`` helpers: prompt reading, incremental text, the context bound."""

import ml_collections
import pytest

from titans_lm.generate.run import (TextStream, TokenizerMissingError, context_bound, read_prompts,
                                   run_tokenizer)


def test_read_prompts(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("one\n\n  \ntwo words\n")
    assert read_prompts(["a"], str(f)) == ["a", "one", "two words"]
    with pytest.raises(ValueError, match="no prompt: pass --prompt"):
        read_prompts(None, None)
    with pytest.raises(ValueError, match="empty prompt"):
        read_prompts(["  "], None)
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no prompt in the file"):
        read_prompts(None, str(tmp_path / "blank.txt"))


class _PieceTokenizer:
    """Ids are pieces; '_' is sentencepiece's leading-space mark (dropped at the start)."""
    pieces = {2: "", 4: "_he", 5: "llo", 6: "_wor", 7: "ld", 8: "\xc3", 9: "\xa9"}

    def decode(self, ids):
        raw = "".join(self.pieces[i] for i in ids).encode("latin-1").decode("utf-8", "replace")
        return raw.replace("_", " ").lstrip(" ")


def test_text_stream_prints_each_piece_once():
    s = TextStream(_PieceTokenizer(), [2, 4])
    out = [s.push(t) for t in (5, 6, 7, 8, 9)]
    assert out == ["llo", " wor", "ld", "", "é"]  # half a UTF-8 character is held back
    assert "".join(out) == s.text() == "llo world\u00e9"


def test_context_bound():
    tf = ml_collections.ConfigDict({"name": "transformer", "max_context": 256})
    assert context_bound(tf) == 256
    assert context_bound(ml_collections.ConfigDict({"name": "lmm"})) is None


def test_a_tokenizer_that_cannot_be_rebuilt_names_its_source(tmp_path):
    cfg = ml_collections.ConfigDict({
        "data": {"corpus": "tinyshakespeare", "data_dir": str(tmp_path / "moved"),
                 "vocab_size": 320, "tokenizer_sentences": 1000, "cache_dir": str(tmp_path)},
        "model": {"vocab_size": 320}})
    with pytest.raises(TokenizerMissingError, match="has no tokenizer of its own") as e:
        run_tokenizer(cfg, tmp_path / "run")
    assert str(tmp_path / "moved") in str(e.value) and "data/README.md" in str(e.value)
