import json

import numpy as np
import pytest

from titans_lm.eval.mad import best_over_sweep, class_counts, macro_accuracy, mad_scores


def test_macro_accuracy_as_torchmetrics_averages_it():
    # scored targets 5,5,5,6 predicted 5,5,7,6; an unscored position predicts 9 and is ignored.
    # class 5: recall 2/3; class 6: 1/1; class 7 only predicted: 0 (counted); 9 not counted.
    preds = np.array([[5, 5, 7, 6, 9]])
    targets = np.array([[5, 5, 5, 6, 0]])
    scored = np.array([[True, True, True, True, False]])
    c = class_counts(preds, targets, scored, 10)
    assert macro_accuracy(c) == pytest.approx((2 / 3 + 1 + 0) / 3)
    # summed over two halves = the whole
    c2 = (class_counts(preds[:, :2], targets[:, :2], scored[:, :2], 10)
          + class_counts(preds[:, 2:], targets[:, 2:], scored[:, 2:], 10))
    np.testing.assert_array_equal(c, c2)
    assert macro_accuracy(np.zeros((3, 4), int)) == 0.0


def _rec(model, task, setting, lr, acc, seed=0):
    return {"model": model, "task": task, "setting": setting, "lr": lr, "mad_acc": acc,
            "seed": seed}


def test_mad_score_is_the_mean_over_tasks_of_the_mean_over_settings_of_the_best_run():
    recs = [
        _rec("m", "a", "baseline", 1e-4, 0.50), _rec("m", "a", "baseline", 1e-3, 0.90),
        _rec("m", "a", "seq_len=256", 1e-4, 0.70), _rec("m", "a", "seq_len=256", 1e-3, 0.30),
        _rec("m", "b", "baseline", 1e-4, 0.20), _rec("m", "b", "baseline", 1e-3, 0.40),
        _rec("m", "b", "baseline", 1e-3, 0.60, seed=1),
    ]
    assert best_over_sweep(recs)[("m", "a", "baseline", 0)]["lr"] == 1e-3
    s = mad_scores(recs, tasks=["a", "b"])["m"]
    # a: mean(90, 70) = 80; b: seeds 40 and 60 -> 50; MAD: mean(80, 50) = 65
    assert s["tasks"] == pytest.approx({"a": 80.0, "b": 50.0})
    assert s["mad"] == pytest.approx(65.0) and s["seeds"] == 2
    assert mad_scores(recs, tasks=["a", "b", "c"])["m"]["mad"] is None


def test_a_mad_run_trains_on_its_targets_and_is_scored_by_mads_metric(tmp_path):
    from pathlib import Path

    from titans_lm.config import load_module
    from titans_lm.eval.tasks import evaluate_task
    from titans_lm.train.loop import train

    mod = load_module(Path(__file__).resolve().parents[2] / "configs" / "tasks" / "mad.py")
    c = mod.get_config("selective_copying-transformer")
    c.task.update(vocab_size=8, seq_len=16, num_tokens_to_copy=4, num_train_examples=8,
                  eval_examples=4, eval_batch_size=4)
    c.model.update(d_model=16, n_layers=1, n_heads=2, d_ff=32)
    c.train.update(steps=2, batch_size=4, log_every=1, eval_every=2, eval_batches=1, ckpt_every=2)
    c.eval.batch_size = 4
    c.mesh.data = 1
    assert (c.data.seq_len, c.data.vocab_size) == (16, 12)
    train(c, tmp_path, progress=False, log=lambda m: None)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["tokens"] for m in metrics if "loss" in m] == [16, 16]  # 4 rows x 4 copied tokens
    (rec,) = evaluate_task(tmp_path, log=lambda m: None)
    assert rec["setting"] == "baseline" and rec["n_answers"] == 16
    assert 0 <= rec["mad_acc"] <= 1
    assert "| setting |" in (tmp_path / "task_reset_step2.md").read_text()
