"""The command line as a new user meets it: training on a folder of text files, the run folder
(config.json, data.json, timestamps, plot), evaluation flags that mean what they say, and
messages that lead with the cause. Every test calls ``titans_lm.cli.main`` (in this process;
the SIGTERM test runs ``python -m titans_lm.cli``)."""

import re
import json
import lzma
import signal
import subprocess
import sys

import pytest

from _tiny_run import REPO, call_cli, cli_args, one_device_env
from titans_lm.eval.results import read_results

LMM_CONFIG = REPO / "configs" / "lmm.py"
pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # one 6-step training run shared by the module, then CLI calls


def _no_traceback(p):
    assert "Traceback" not in p.stdout + p.stderr, p.stderr


@pytest.fixture(scope="module")
def corpus_text():
    return lzma.open(REPO / "data" / "tinyshakespeare" / "input.txt.xz").read().decode()


def _write_corpus(root, text, n=8, paragraphs=60):
    root.mkdir(parents=True)
    paras = text.split("\n\n")
    for i in range(n):
        (root / f"scene{i:02d}.txt").write_text("\n\n".join(paras[i * paragraphs:(i + 1) * paragraphs]))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus_text):
    """A finished 6-step run on a folder of 8 text files (evaluated after training)."""
    root = tmp_path_factory.mktemp("user")
    corpus = _write_corpus(root / "my_corpus", corpus_text)
    args = cli_args(root / "cache", root / "run", data__corpus=corpus, eval__max_docs=1)
    p = call_cli(["train"] + args)
    assert p.returncode == 0, p.stderr
    return root, corpus, args, p


def test_own_corpus_trains_evaluates_and_records_the_run(run):
    root, corpus, args, p = run
    w = root / "run"
    assert "user-my_corpus/train: tokenized 6 docs" in p.stderr  # 8 files: 1 validation, 1 test
    assert "user-my_corpus/validation holds" in p.stderr and "user-my_corpus/test holds" in p.stderr
    assert "step 1/6: loss" in p.stderr and "step 6/6: loss" in p.stderr  # no TTY: plain lines
    assert "user-my_corpus-test" in p.stdout
    assert (w / "eval_user-my_corpus-test_step6_reset.json").is_file()
    # config.json: the resolved config (absolute corpus path), what `titans-lm config` prints
    saved = json.loads((w / "config.json").read_text())
    assert saved["data"]["corpus"] == str(corpus) and saved["train"]["steps"] == 6
    c = call_cli(["config"] + args[:-1])
    assert c.returncode == 0 and json.loads(c.stdout) == saved, c.stderr
    data = json.loads((w / "data.json").read_text())
    assert data["corpus"] == str(corpus) and set(data["stores"]) == {"train", "validation"}
    recs = [json.loads(x) for x in (w / "metrics.jsonl").read_text().splitlines()]
    assert all("time" in r and r["wall_s"] >= 0 for r in recs)
    # the plot of one run and of two
    p = call_cli(["plot", str(w)])
    assert p.returncode == 0 and (w / "curves.png").stat().st_size > 10_000, p.stderr
    out = root / "both.png"
    p = call_cli(["plot", str(w), str(w), f"--out={out}"])
    assert p.returncode == 0 and f"wrote {out}" in p.stdout and out.is_file(), p.stderr


def test_eval_validation_scores_validation_sets_only(run):
    root, *_ = run
    w = root / "run"
    before = (w / "eval_wikitext2-test_step6_docs1_reset.json").read_text()
    p = call_cli(["eval", f"--workdir={w}", "--split=validation"])
    assert p.returncode == 0, p.stderr
    for name, split in (("user-my_corpus-validation", "validation"),
                        ("wikitext2-validation", "validation")):
        (res,) = read_results(w, name)
        assert res["split"] == split and name in p.stdout and f"wrote {w / res['file']}" in p.stdout
    assert "wikitext2-test" not in p.stdout
    assert (w / "eval_wikitext2-test_step6_docs1_reset.json").read_text() == before  # kept


def test_eval_overrides_honoured_or_refused_by_name(run):
    root, *_ = run
    w = root / "run"
    p = call_cli(["eval", f"--workdir={w}", "--config.data.seq_len=128", "--config.eval.batch_size=4",
                 "--nowikitext"])
    assert p.returncode == 0, p.stderr
    (res,) = read_results(w, "user-my_corpus-test_seq_len128")
    assert res["seq_len"] == 128 and res["overrides"] == {"data.seq_len": "128",
                                                           "eval.batch_size": "4"}
    assert "windows of 128 tokens" in p.stdout
    assert json.loads((w / "eval_user-my_corpus-test_step6_reset.json").read_text())["seq_len"] == 64
    p = call_cli(["eval", f"--workdir={w}", "--config.model.d_model=64", "--config.train.steps=9"])
    assert p.returncode == 1
    assert ("eval cannot override --config.model.d_model, --config.train.steps: the checkpoint "
            "fixes the model") in p.stderr and "data.seq_len" in p.stderr
    _no_traceback(p)


def test_text_results_are_named_apart(run, tmp_path):
    root, *_ = run
    w = root / "run"
    names = []
    for fname in ("notes.v1.txt", "notes.v2.txt"):  # the same name before the first dot
        f = tmp_path / fname
        f.write_text(f"{fname}: to be, or not to be.\n" * 4)
        p = call_cli(["eval", f"--workdir={w}", f"--text={f}"])
        assert p.returncode == 0, p.stderr
        names.append(next(l.split()[0] for l in p.stdout.splitlines() if l.startswith("text-")))
    results = sorted(x.name for x in w.glob("eval_text-notes.*"))
    assert len(results) == 2 and sorted(f"eval_{n}_step6_reset.json" for n in names) == results, results
    assert names[0].startswith("text-notes.v1.txt-")


def test_different_backbone_is_refused_leading_with_the_name(run):
    root, corpus, args, _ = run
    lmm = [a for a in args if not a.startswith(("--config=", "--config.model.n_heads"))]
    p = call_cli(["train", f"--config={LMM_CONFIG}:tiny", "--config.model.memory.head_dim=16"] + lmm)
    assert p.returncode == 1
    msg = p.stderr.split("titans-lm train: error: ", 1)[1]
    assert msg.startswith(f"cannot resume {root / 'run'}: its checkpoint (step 6) was written for "
                          "model.name='transformer', but the config asks for model.name='lmm'.")
    assert re.search(r"model\.memory\.\* \(\d+ fields\)", msg) and len(msg.splitlines()) <= 6
    assert all(len(line) < 200 for line in msg.splitlines())
    assert json.loads((root / "run" / "config.json").read_text())["model"]["name"] == "transformer"
    _no_traceback(p)


def test_sigterm_during_the_final_evaluation(run):
    root, corpus, args, _ = run
    # the run is complete: train does nothing, then evaluates it again; stop that evaluation
    env = one_device_env()
    proc = subprocess.Popen([sys.executable, "-m", "titans_lm.cli", "train"] + args, cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("scoring "):
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out
    assert "titans-lm train: stopped by SIGTERM during the final evaluation; training is complete" \
        in out and f"titans-lm eval --workdir={root / 'run'}" in out
    assert "Traceback" not in out


def test_changed_corpus_is_refused_not_mixed(run):  # last: it edits the run's corpus (restored)
    root, corpus, args, _ = run
    f = corpus / "scene00.txt"
    text = f.read_text()
    try:
        f.write_text(text + "A new line.\n")
        p = call_cli(["train"] + [a.replace("train.steps=6", "train.steps=9") for a in args]
                    + ["--config.optim.warmup_steps=80"])
    finally:
        f.write_text(text)
    # a warm-up longer than the run is warned about before anything else
    assert ("warning: optim.warmup_steps=80 is not shorter than train.steps=9: the learning rate "
            "never reaches optim.lr") in p.stderr and "--config.optim.warmup_steps=1 " in p.stderr
    assert p.returncode == 1
    assert f"cannot resume {root / 'run'}: the " in p.stderr
    assert f"of data.corpus={corpus}" in p.stderr or f"from data.corpus={corpus}" in p.stderr
    assert "changed since the run began" in p.stderr
    _no_traceback(p)
