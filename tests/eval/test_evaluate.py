"""evaluate(): perplexities of a trained tiny run equal a direct float64 computation."""

import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.config import BOS_ID, PAD_ID
from titans_lm.data.corpora import load_documents
from titans_lm.data.prepare import prepare
from titans_lm.eval.evaluate import evaluate
from titans_lm.train.checkpoint import Checkpointer
from titans_lm.train.state import model_fns


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory):
    """A copy of the suite's finished 6-step tiny run (evaluation writes its results into it)."""
    root, cfg = tiny_run
    workdir = tmp_path_factory.mktemp("eval") / "run"
    shutil.copytree(root / "run", workdir)
    return cfg, workdir


def _log_softmax64(logits):
    logits = np.asarray(logits, np.float64)
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def _direct_nll(apply, params, tokens, T):
    """Summed float64 nll of tokens[1:]: the full windows of T targets as one batch, the last
    partial window on its own at its true length (no padding involved)."""
    n_full = (len(tokens) - 1) // T
    total = 0.0
    if n_full:
        win = np.stack([tokens[i * T:i * T + T + 1] for i in range(n_full)])
        x = jnp.asarray(win[:, :-1])
        logp = _log_softmax64(apply(params, x, jnp.ones_like(x)))
        total -= np.take_along_axis(logp, win[:, 1:, None].astype(np.int64), -1).sum()
    rest = tokens[n_full * T:]
    if len(rest) > 1:
        x = jnp.asarray(rest[None, :-1])
        logp = _log_softmax64(apply(params, x, jnp.ones_like(x)))[0]
        total -= logp[np.arange(len(rest) - 1), rest[1:]].sum()
    return total


def test_evaluate_matches_direct_computation(run):
    cfg, workdir = run
    results = evaluate(workdir, split="validation", log=lambda s: None, progress=False)
    assert set(results) == {"tinyshakespeare-validation", "wikitext2-validation"}  # same split

    prep = prepare(cfg.data, splits=("train",), log=None)
    fns = model_fns(cfg.model)
    with Checkpointer(workdir, read_only=True) as ck:
        abstract = fns.abstract_params()
        params, step = ck.restore_params(abstract)
    assert step == 6
    apply = jax.jit(lambda p, x, s: fns.apply(p, x, s, fns.init_state(p, x.shape[0]))[0])
    train_tokens = np.asarray(prep.stores["train"].tokens)
    counts = np.bincount(train_tokens, minlength=cfg.model.vocab_size).astype(np.float64)
    counts[PAD_ID] = counts[BOS_ID] = 0
    uni_logp = np.log((counts + 1) / (counts.sum() + cfg.model.vocab_size))

    for name, corpus, split in (("tinyshakespeare-validation", "tinyshakespeare", "validation"),
                                ("wikitext2-validation", "wikitext-2", "validation")):
        docs = load_documents(corpus, split, cfg.data.data_dir)[:cfg.eval.max_docs]
        nll = n_tok = uni = 0.0
        words = nbytes = 0
        for d in docs:
            toks = prep.tokenizer.encode_array(d.text, add_bos=True)
            nll += _direct_nll(apply, params, toks, cfg.data.seq_len)
            uni -= uni_logp[toks[1:]].sum()
            n_tok += len(toks) - 1
            words += len(d.text.split())
            nbytes += len(d.text.encode("utf-8"))
        r = results[name]
        assert r["n_docs"] == len(docs) and r["step"] == 6
        m = r["model"]
        assert m["n_tokens"] == n_tok and m["n_words"] == words and m["n_bytes"] == nbytes
        np.testing.assert_allclose(m["nll_nats"], nll, rtol=2e-6)
        np.testing.assert_allclose(m["token_ppl"], math.exp(nll / n_tok), rtol=2e-6)
        np.testing.assert_allclose(m["word_ppl"], math.exp(nll / words), rtol=1e-4)
        np.testing.assert_allclose(m["bits_per_byte"], nll / nbytes / math.log(2), rtol=2e-6)
        np.testing.assert_allclose(r["unigram"]["nll_nats"], uni, rtol=1e-9)
        assert r["unigram"]["n_tokens"] == n_tok
        saved = json.loads((workdir / r["file"]).read_text())
        assert saved["model"] == m


def test_table_lists_each_dataset(run):
    cfg, workdir = run
    lines = []
    evaluate(workdir, wikitext=False, log=lines.append, progress=False)
    table = "\n".join(lines)
    assert "checkpoint step 6" in table and "tinyshakespeare-test" in table
    assert "wikitext2-test" not in table


def test_results_of_other_steps_and_document_limits_are_kept(tiny_run, tmp_path):
    """Each (dataset, step, document limit, context) has its own file; the identical evaluation
    rerun replaces only its own, and each file written is named in the log."""
    root, _ = tiny_run
    workdir = tmp_path / "run"
    shutil.copytree(root / "run", workdir)
    lines = []
    evaluate(workdir, log=lines.append, progress=False)  # eval.max_docs 2: WikiText limited
    evaluate(workdir, step=3, wikitext=False, log=lines.append, progress=False)
    evaluate(workdir, overrides={"eval.max_docs": "1"}, log=lines.append, progress=False)
    expected = {"eval_tinyshakespeare-test_step6_reset.json",  # one document: never limited
                "eval_wikitext2-test_step6_docs2_reset.json",
                "eval_tinyshakespeare-test_step3_reset.json",
                "eval_wikitext2-test_step6_docs1_reset.json"}
    assert {p.name for p in workdir.glob("eval_*.json")} == expected
    assert {line.removeprefix(f"wrote {workdir}/") for line in lines
            if line.startswith("wrote ")} == expected
    step3 = workdir / "eval_tinyshakespeare-test_step3_reset.json"
    first = json.loads(step3.read_text())
    assert first["step"] == 3 and first["max_docs"] == 0 and first["context"] == "reset"
    docs1 = json.loads((workdir / "eval_wikitext2-test_step6_docs1_reset.json").read_text())
    assert docs1["n_docs"] == 1 and docs1["max_docs"] == 1
    step3.write_text("{}")
    evaluate(workdir, step=3, wikitext=False, log=lambda m: None, progress=False)
    assert {p.name for p in workdir.glob("eval_*.json")} == expected
    assert json.loads(step3.read_text())["model"] == first["model"]  # rewritten, the same


def test_evaluation_plan_gives_tokens_time_and_after_training_the_flag_to_skip_it(tmp_path):
    from titans_lm.eval.evaluate import evaluation_plan, validation_rate
    line = evaluation_plan({"books-test": 200_000, "wikitext2-test": 40_000}, 1, 400.0, True)
    assert line.startswith("evaluating 240,000 tokens (books-test 200,000, wikitext2-test 40,000)")
    assert "about 0:10:00 at the 400 tokens/s" in line and "--noeval_after" in line
    both = evaluation_plan({"books-test": 1_000}, 2, None, False)
    assert both == "evaluating 2,000 tokens (books-test 1,000 in each of 2 contexts)"
    (tmp_path / "metrics.jsonl").write_text('{"step": 3, "val_loss": 1.0, "val_tokens_per_sec": 50.0}\n'
                                            '{"step": 6, "val_loss": 1.0, "val_tokens_per_sec": 80.0}\n')
    assert validation_rate(tmp_path) == 80.0 and validation_rate(tmp_path / "none") is None
