"""Metric files: JSONL records, TensorBoard events, truncation on resume."""

import datetime
import math
import sys

import pytest

from titans_lm.train.writers import MetricWriter, read_metrics


def test_records_and_resume_truncation(tmp_path):
    w = MetricWriter(tmp_path)
    for s in (1, 2, 3, 4):
        w.write(s, {"loss": 1.0 / s, "lr": 0.1}, "train")
    w.write(4, {"val_loss": math.inf}, "val")
    w.close()
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 4]
    assert {k: recs[1][k] for k in ("step", "loss", "lr")} == {"step": 2, "loss": 0.5, "lr": 0.1}
    assert recs[-1]["val_loss"] == "inf"
    # every record carries when it was written (UTC) and the run's training seconds so far
    assert set(recs[1]) == {"step", "loss", "lr", "time", "wall_s"}
    assert datetime.datetime.fromisoformat(recs[1]["time"]).tzinfo is not None
    walls = [r["wall_s"] for r in recs]
    assert walls == sorted(walls) and walls[0] >= 0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    # resuming from step 2: the records written after it are dropped, new ones appended
    w = MetricWriter(tmp_path, resume_step=2)
    w.write(3, {"loss": 9.0}, "train")
    w.close()
    assert read_metrics(tmp_path)[-1]["wall_s"] >= walls[1]  # continues the resumed run's clock
    assert [(r["step"], r.get("loss"), r.get("event")) for r in read_metrics(tmp_path)] == [
        (1, 1.0, None), (2, 0.5, None), (2, None, "resume"), (3, 9.0, None)]
    # resuming from the same step again: one resume record for it, not two
    MetricWriter(tmp_path, resume_step=2).close()
    assert [(r["step"], r.get("event")) for r in read_metrics(tmp_path)] == [
        (1, None), (2, None), (2, "resume")]
    assert read_metrics(tmp_path / "nowhere") == []
    off = MetricWriter(tmp_path / "other", enabled=False)
    off.write(1, {"loss": 1.0}, "train")
    off.close()
    assert not (tmp_path / "other").exists()


def test_weights_and_biases_offline_gets_the_same_scalars_and_resumes_its_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the optional extra, titans-lm[wandb]
    monkeypatch.setenv("TITANS_LM_WANDB", "titans-test")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, no account
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = MetricWriter(tmp_path, config={"train": {"steps": 3}})
    run = w._wandb.run
    logged, log = [], run.log
    monkeypatch.setattr(run, "log",
                        lambda data, step: logged.append((data, step)) or log(data, step=step))
    w.write(1, {"loss": 2.0}, "train")
    assert logged == [({"train/loss": 2.0}, 1)] and run.config["train"] == {"steps": 3}
    w.close()
    assert (tmp_path / "wandb_run_id").read_text().strip() == run.id
    history = next((tmp_path / "wandb").glob(f"offline-run-*-{run.id}/run-{run.id}.wandb"))
    assert history.stat().st_size > 0
    run_id = run.id
    w = MetricWriter(tmp_path, resume_step=1)  # a resumed training: the same W&B run
    assert w._wandb.run.id == run_id
    w.close()


def test_weights_and_biases_not_installed_is_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("TITANS_LM_WANDB", "titans-test")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ValueError, match=r"not installed; pip install 'titans-lm\[wandb\]'"):
        MetricWriter(tmp_path)
