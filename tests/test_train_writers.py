"""Metric files: JSONL records, TensorBoard events, truncation on resume."""

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
    assert recs[1] == {"step": 2, "loss": 0.5, "lr": 0.1} and recs[-1]["val_loss"] == "inf"
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    # resuming from step 2: the records written after it are dropped, new ones appended
    w = MetricWriter(tmp_path, resume_step=2)
    w.write(3, {"loss": 9.0}, "train")
    w.close()
    assert [(r["step"], r.get("loss")) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 0.5), (3, 9.0)]
    assert read_metrics(tmp_path / "nowhere") == []
    off = MetricWriter(tmp_path / "other", enabled=False)
    off.write(1, {"loss": 1.0}, "train")
    off.close()
    assert not (tmp_path / "other").exists()
