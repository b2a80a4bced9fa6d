"""Metric files: JSONL records, TensorBoard events, truncation on resume."""

import datetime
import math

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
