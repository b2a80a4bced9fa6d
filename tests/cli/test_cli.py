"""The ``titans-lm`` command line (``titans_lm.cli.main`` called in this process: ``call_cli``)."""

import json

import pytest

from _tiny_run import CONFIG_FILE, call_cli, cli_args
from titans_lm.eval.results import read_results

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _no_traceback(proc):
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr


def test_unknown_config_field_is_named(cache, tmp_path):
    p = call_cli(["train"] + cli_args(cache, tmp_path / "w") + ["--config.train.stpes=5"])
    assert p.returncode == 2
    assert "unknown config field 'train.stpes'" in p.stderr and 'Did you mean "steps"' in p.stderr
    _no_traceback(p)
    p = call_cli(["train"] + cli_args(cache, tmp_path / "w") + ["--config.train.steps=abc"])
    assert p.returncode == 2 and "--config.train.steps=abc" in p.stderr
    _no_traceback(p)
    p = call_cli(["train"] + cli_args(cache, tmp_path / "w", train__steps=-1))
    assert p.returncode == 1 and "config field train.steps: must be positive" in p.stderr
    _no_traceback(p)


def test_missing_config_file_and_unknown_size(tmp_path):
    p = call_cli(["train", f"--config={tmp_path}/nope.py:tiny"])
    assert p.returncode == 2 and f"config file '{tmp_path}/nope.py' not found" in p.stderr
    _no_traceback(p)
    p = call_cli(["train", f"--config={CONFIG_FILE}:huge"])
    assert p.returncode == 2 and "unknown transformer size 'huge'" in p.stderr
    _no_traceback(p)
    p = call_cli(["frobnicate"])
    assert p.returncode == 2 and "unknown command 'frobnicate'" in p.stderr


def test_command_help_lists_the_command_flags():
    p = call_cli(["train", "--help"])
    assert p.returncode == 0, p.stderr
    for text in ("--config:", "--workdir:", "--eval_after:", "--noeval_after", "--config.<section>",
                 "143 / 130"):
        assert text in p.stdout, p.stdout
    assert "rerun the command to resume" in p.stdout
    p = call_cli(["eval", "-h"])
    assert p.returncode == 0 and "--step:" in p.stdout and "--eval_after" not in p.stdout
    assert "143 / 130" in p.stdout and "resume" not in p.stdout  # nothing of eval resumes
    assert "allowed fields: data.seq_len" in p.stdout  # the overrides eval honours
    _no_traceback(p)


def test_missing_data_file_is_named(cache, tmp_path):
    empty = tmp_path / "empty_data"
    empty.mkdir()
    p = call_cli(["train"] + cli_args(cache, tmp_path / "w", data__data_dir=empty))
    assert p.returncode == 1
    assert "missing data file" in p.stderr and f"{empty}/tinyshakespeare/input.txt" in p.stderr
    _no_traceback(p)
    p = call_cli(["eval", f"--workdir={tmp_path / 'never_trained'}"])
    assert p.returncode == 1 and "never_trained: no such folder" in p.stderr, p.stderr
    _no_traceback(p)
    p = call_cli(["eval", f"--workdir={empty}"])  # a folder without a run
    assert p.returncode == 1 and "no checkpoints in" in p.stderr, p.stderr


def test_prepare_train_then_eval(cache, tmp_path):
    args = cli_args(cache, "unused", train__steps=4)[:-1]  # no --workdir: the default is used
    p = call_cli(["prepare"] + args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "tinyshakespeare/train: 1 documents" in p.stdout and "tokenizer: vocabulary 320" in p.stdout
    p = call_cli(["train"] + args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    workdir = tmp_path / "runs" / "transformer-tiny"
    assert "model transformer:" in p.stderr and "parameters" in p.stderr
    for name in ("tinyshakespeare-test", "wikitext2-test"):  # --eval_after: the table and JSON
        assert name in p.stdout
        (res,) = read_results(workdir, name)
        assert res["step"] == 4 and res["model"]["n_tokens"] > 0
        assert res["model"]["token_ppl"] > 1 and res["unigram"]["token_ppl"] > 1
    assert "token ppl" in p.stdout and "bits/byte" in p.stdout and "unigram" in p.stdout
    text = tmp_path / "my notes.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 5)
    p = call_cli(["eval", f"--workdir={workdir}", f"--text={text}", "--step=3"])
    assert p.returncode == 0, p.stderr
    (res_file,) = workdir.glob("eval_text-my notes.txt-*_step3_reset.json")
    res = json.loads(res_file.read_text())
    assert res["step"] == 3 and res["model"]["n_words"] == 50 and "text-my notes.txt-" in p.stdout
