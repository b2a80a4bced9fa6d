"""The eval result files: their names and the readers that pick one (titans_lm.eval.results)."""

import json

import pytest

from titans_lm.eval.results import latest_result, read_results, result_file_name


def test_the_file_name_carries_step_document_limit_and_context():
    assert result_file_name("books-test", step=800, max_docs=0, context="reset") == \
        "eval_books-test_step800_reset.json"
    assert result_file_name("wikitext2-validation_seq_len1024", step=7, max_docs=2,
                            context="both") == "eval_wikitext2-validation_seq_len1024_step7_docs2_both.json"
    with pytest.raises(ValueError, match="bad result key"):
        result_file_name("books-test", step=-1, max_docs=0, context="reset")


def _write(w, name, step, max_docs=0, context="reset", ppl=1.0):
    modes = ("reset", "carry") if context == "both" else (context,)
    res = {"name": name, "step": step, "max_docs": max_docs, "context": context,
           "model": {"token_ppl": ppl},
           "modes": {m: {"model": {"token_ppl": ppl + (m == "carry")}} for m in modes}}
    (w / result_file_name(name, step=step, max_docs=max_docs, context=context)).write_text(
        json.dumps(res))


def test_latest_result_prefers_the_newest_step_scored_on_every_document(tmp_path):
    _write(tmp_path, "books-test", 800, ppl=10.0)
    _write(tmp_path, "books-test", 700, max_docs=2, ppl=20.0)
    _write(tmp_path, "books-test", 800, max_docs=2, ppl=30.0)
    _write(tmp_path, "wikitext2-test", 900, ppl=40.0)
    (tmp_path / "eval_notes.json").write_text("[1, 2]")  # not a result: skipped
    assert [r["step"] for r in read_results(tmp_path, "books-test")] == [700, 800, 800]
    assert len(read_results(tmp_path)) == 4
    assert latest_result(tmp_path, "books-test")["model"]["token_ppl"] == 10.0
    _write(tmp_path, "books-test", 900, context="both", ppl=50.0)
    assert latest_result(tmp_path, "books-test")["model"]["token_ppl"] == 50.0
    carry = latest_result(tmp_path, "books-test", context="carry")
    assert carry["model"]["token_ppl"] == 51.0 and carry["model_context"] == "carry"
    assert latest_result(tmp_path, "books-validation") is None
