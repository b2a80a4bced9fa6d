"""Weights out and in: ``titans-lm export`` writes a folder that ``eval``, ``generate`` and
``titans_lm.load`` read like the run it came from, with identical numbers."""

import io
import json
import shutil
import signal
import sys

import numpy as np
import pytest
from absl import flags

import titans_lm
from titans_lm.data.user_corpus import load_split
from titans_lm.eval.evaluate import evaluate
from titans_lm.eval.exported import ExportError
from titans_lm.eval.restore import load_run
from titans_lm.generate.run import generate_text
from titans_lm.pretrained import export
from titans_lm.train.checkpoint import CheckpointError

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    """``(cfg, run folder, exported folder)``: a copy of the suite's tiny run (step 6), exported
    through the command line (in process)."""
    from titans_lm import cli
    root, cfg = tiny_run
    base = tmp_path_factory.mktemp("export")
    run = base / "run"
    shutil.copytree(root / "run", run)
    handler, argv = signal.getsignal(signal.SIGTERM), sys.argv
    try:
        assert cli.main(["titans-lm", "export", f"--workdir={run}", f"--out={base / 'out'}"]) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
        sys.argv = argv
        flags.FLAGS.unparse_flags()
    return cfg, run, base / "out"


def test_an_export_reproduces_the_evaluation_logits_and_samples(exported):
    cfg, run, out = exported
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "data.json", "export.json", "model.safetensors", "tokenizer.model"]
    assert json.loads((out / "export.json").read_text())["step"] == 6
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert len(set(modes.values())) == 1, modes   # the weights as readable as the rest
    kw = dict(wikitext=False, log=lambda m: None, progress=False)
    (a,), (b,) = evaluate(run, **kw).values(), evaluate(out, **kw).values()
    assert b["model"] == a["model"] and b["step"] == 6 and b["n_docs"] == a["n_docs"]
    from_run, from_export = titans_lm.load(run), titans_lm.load(out)
    logits = from_export.logits(TEXT)
    assert logits.shape == (len(from_export.tokenizer.encode(TEXT)), cfg.model.vocab_size)
    np.testing.assert_array_equal(logits, from_run.logits(TEXT))
    docs = [d.text for d in load_split(cfg.data, "test")[:cfg.eval.max_docs]]
    assert from_export.score(docs).as_dict() == b["model"]  # the API's score is eval's number
    assert from_export.perplexity(docs) == b["model"]["token_ppl"]
    sample = from_export.generate("ROMEO:", 6, temperature=0.0)
    assert isinstance(sample, str) and sample == from_run.generate("ROMEO:", 6, temperature=0.0)


def test_an_export_generates_without_the_training_corpus(exported, tmp_path):
    _, _, out = exported
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    saved = json.loads((moved / "config.json").read_text())
    saved["data"]["data_dir"] = str(tmp_path / "no_corpus_here")
    (moved / "config.json").write_text(json.dumps(saved))
    text, err = io.StringIO(), io.StringIO()
    res = generate_text(moved, ["ROMEO:"], max_new_tokens=4, out=text, err=err)
    assert text.getvalue().startswith("ROMEO:") and len(res.generation.new_tokens[0]) == 4
    assert "checkpoint step 6" in err.getvalue()


def test_bad_exports_are_refused_by_name(exported, tmp_path):
    _, run, out = exported
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    for target, message in ((tmp_path / "busy", "other files in it"), (run, "is a run folder")):
        with pytest.raises(ExportError, match=message):
            export(run, target)
    with pytest.raises(CheckpointError, match="an export of checkpoint step 6; it has no step 3"):
        load_run(out, step=3)
    wrong = tmp_path / "wrong"
    shutil.copytree(out, wrong)
    saved = json.loads((wrong / "config.json").read_text())
    saved["model"]["d_ff"] = 2 * saved["model"]["d_ff"]
    (wrong / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ExportError, match=r"tensor '.*' is float32\[.*\], the model expects"):
        load_run(wrong)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        titans_lm.load(tmp_path / "nowhere")
