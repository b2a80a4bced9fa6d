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
