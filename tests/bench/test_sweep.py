"""The experiment scripts' sweep runner (``titans_lm.bench.sweep``) and the results that
``scripts/compare_backbones.py`` builds from a run directory, without training."""

import json

import pytest

from _backbones import REPO
from titans_lm.bench import sweep
from titans_lm.config import load_module

compare = load_module(REPO / "scripts" / "compare_backbones.py")


def _metrics(workdir, records):
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_train_records_keep_the_latest_record_of_a_step(tmp_path):
    _metrics(tmp_path, [{"step": 1, "loss": 5.0, "tokens_per_sec": 10.0},
                        {"step": 2, "loss": 4.0, "tokens_per_sec": 100.0},
                        {"step": 2, "val_loss": 9.0},
                        {"step": 2, "loss": 3.0, "tokens_per_sec": 300.0},   # resumed: again
                        {"step": 3, "loss": 2.0, "tokens_per_sec": 200.0},
                        {"step": 3, "loss": 7.0, "split": "val"}])
    recs = sweep.train_records(tmp_path)
    assert list(recs) == [1, 2, 3] and recs[2]["loss"] == 3.0
    assert sweep.final_train_loss(tmp_path, 2) == pytest.approx(2.5)
    assert sweep.final_train_loss(tmp_path, 10) == pytest.approx(10 / 3)
    assert sweep.median_tokens_per_sec(tmp_path) == 250.0      # the first step (compile) left out
    assert sweep.final_train_loss(tmp_path / "none", 3) is None
    assert sweep.median_tokens_per_sec(tmp_path / "none") is None


def test_run_grid_writes_after_every_point(capsys):
    seen = []
    rows = sweep.run_grid([1, 2, 3], lambda x: {"x": x, "sq": x * x},
                          describe=lambda x: f"point {x}", write=lambda r: seen.append(len(r)))
    assert rows == [{"x": 1, "sq": 1}, {"x": 2, "sq": 4}, {"x": 3, "sq": 9}]
    assert seen == [1, 2, 3]
    assert "[point 2] starting" in capsys.readouterr().err


def test_a_failing_training_reports_its_last_line(tmp_path):
    run = sweep.run_training(str(tmp_path / "missing.py") + ":tiny", tmp_path / "w",
                             {"train.steps": 1})
    assert run.returncode == 2 and not run.ok and "not found" in run.last_line
    assert run.last_line in (tmp_path / "w" / "train.log").read_text()
    cmd = sweep.train_command("c.py:tiny", "w", {"train.steps": 3}, ["--noeval_after"])
    assert cmd[-3:] == ["--workdir=w", "--noeval_after", "--config.train.steps=3"]


def test_compare_backbones_row_and_table(tmp_path):
    args = compare.parse_args(["--backbones=transformer", "--steps=3", "--batch_size=2",
                               "--seq_len=8", "--corpus=tinyshakespeare", "--final_window=2",
                               f"--out={tmp_path}"])
    w = tmp_path / "transformer"
    _metrics(w, [{"step": s, "loss": 4.0 - s, "tokens_per_sec": 100.0 * s} for s in (1, 2, 3)])
    for step, ppl in ((3, 12.5), (2, 99.0)):  # the newest step's result is the one quoted
        (w / f"eval_tinyshakespeare-test_step{step}_reset.json").write_text(json.dumps(
            {"name": "tinyshakespeare-test", "step": step, "model": {"token_ppl": ppl},
             "n_params": 1000}))
    row = compare.summarize("transformer", w, args, "ok", 5.0)
    assert row["steps"] == 3 and row["tokens_trained"] == 3 * 2 * 8
    assert row["final_train_loss"] == pytest.approx(1.5)
    assert row["train_tokens_per_sec"] == 250.0
    assert row["heldout_token_ppl"] == 12.5 and row["wiki2_word_ppl"] is None
    assert row["params"] == 1000
    assert "| transformer | 1,000 | 1.500 | 12.5 | - | 250 | 5s |" in compare.markdown_table(
        [row], args)


def test_set_is_parsed_once_for_every_script(capsys):
    args = compare.parse_args(["--set=model.memory.theta_max=0.3", "--set=task.train_pairs=(4,8)"])
    assert args.set == [("model.memory.theta_max", "0.3"), ("task.train_pairs", "(4,8)")]
    with pytest.raises(SystemExit):
        compare.parse_args(["--set=model.memory.theta_max"])
    assert "expected FIELD=VALUE" in capsys.readouterr().err
