"""``titans-lm generate`` and ``titans-lm eval --context`` through the command line (in process),
on a copy of the session's tiny Transformer++ run (the ``tiny_run`` fixture). A tokenizer that
cannot be rebuilt is tested where it is raised (tests/generate/test_run.py)."""

import json
import shutil

import numpy as np
import pytest

import _tiny_run
from titans_lm.eval.results import read_results

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def run_cli(args):
    """``titans_lm.cli.main`` with ``args``, in this process (``_tiny_run.call_cli``)."""
    return _tiny_run.call_cli(args)


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory):
    """A copy of the session's run (these tests write evaluation results into it)."""
    workdir = tmp_path_factory.mktemp("gen") / "run"
    shutil.copytree(tiny_run[0] / "run", workdir)
    return workdir


@pytest.fixture(scope="module")
def greedy_alone(run):
    p = _gen(run, "--prompt=First Citizen:", "--temperature=0")
    assert p.returncode == 0, p.stderr
    return p


def _no_traceback(p):
    assert "Traceback" not in p.stdout + p.stderr, p.stderr


def _gen(workdir, *args):
    return run_cli(["generate", f"--workdir={workdir}", "--max_new_tokens=12", *args])


def test_greedy_generation_is_deterministic_and_timed(run, greedy_alone):
    workdir = run
    a = greedy_alone
    b = _gen(workdir, "--prompt=First Citizen:", "--temperature=0", "--seed=5")
    assert a.stdout == b.stdout and a.stdout.startswith("First Citizen:")
    assert len(a.stdout) > len("First Citizen:") + 1
    for text in ("prefill", "decode 11 steps x 1 rows", "tokens/s", "ms/step", "compile",
                 "compiling the prefill (1 x ", "compiled the decode step (1 x 1 token) in ",
                 "compilation cache: "):
        assert text in a.stderr, a.stderr
    s = _gen(workdir, "--prompt=ROMEO:", "--temperature=1.0", "--top_k=20", "--top_p=0.9")
    assert s.returncode == 0 and s.stdout.startswith("ROMEO:"), s.stderr


def test_batched_prompts_of_different_lengths(run, greedy_alone, tmp_path):
    workdir = run
    f = tmp_path / "prompts.txt"
    f.write_text("ROMEO:\n\nFirst Citizen:\nBefore we proceed any further, hear me speak.\n")
    p = _gen(workdir, f"--prompt_file={f}", "--temperature=0")
    assert p.returncode == 0, p.stderr
    parts = p.stdout.split("=== prompt ")[1:]
    assert [x.split(" ===")[0] for x in parts] == ["1", "2", "3"]
    assert parts[1].split("===\n", 1)[1].rstrip("\n") == greedy_alone.stdout.rstrip("\n")
    assert "3 rows" in p.stderr


def test_bad_input_gets_one_clear_message(run, tmp_path):
    workdir = run
    p = _gen(workdir, "--prompt=")
    assert p.returncode == 1 and "empty prompt" in p.stderr
    _no_traceback(p)
    p = run_cli(["generate", "--prompt=x"])
    assert p.returncode == 2 and "--workdir is required" in p.stderr
    p = _gen(workdir, "--prompt=" + "Now is the winter of our discontent " * 20)
    assert p.returncode == 1 and "longer than the model's context" in p.stderr, p.stderr
    assert "max_context=64" in p.stderr and "--max_context=" in p.stderr
    _no_traceback(p)


def test_eval_reports_both_context_modes(run, tmp_path):
    workdir = run
    short = tmp_path / "short.txt"
    short.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n")
    p = run_cli(["eval", f"--workdir={workdir}", f"--text={short}", "--context=both"])
    assert p.returncode == 0, p.stderr
    res = json.loads(next(workdir.glob("eval_text-short.txt-*.json")).read_text())
    assert set(res["modes"]) == {"reset", "carry"} and res["model_context"] == "reset"
    r, c = res["modes"]["reset"]["model"], res["modes"]["carry"]["model"]
    assert 0 < r["n_tokens"] < 64 and r["n_tokens"] == c["n_tokens"]  # shorter than one window
    np.testing.assert_allclose(c["nll_nats"], r["nll_nats"], rtol=1e-6)
    assert res["model"] == r
    for text in ("reset", "carry", "token ppl", "sliding-context baseline", "last 64 tokens"):
        assert text in p.stdout, p.stdout

    p = run_cli(["eval", f"--workdir={workdir}", "--context=carry", "--nowikitext"])
    assert p.returncode == 0, p.stderr
    (res,) = [r for r in read_results(workdir, "tinyshakespeare-test") if r["context"] == "carry"]
    assert res["file"] == f"eval_tinyshakespeare-test_step{res['step']}_carry.json"
    assert list(res["modes"]) == ["carry"] and res["model_context"] == "carry"
    assert res["model"]["n_tokens"] > 64 and res["modes"]["carry"]["tokens_per_s"] > 0
    p = run_cli(["eval", f"--workdir={workdir}", "--context=sideways"])
    assert p.returncode == 2 and "--context" in p.stderr
