import json

import numpy as np
import pytest

from _tiny_run import call_cli
from titans_lm.eval import by_position as bp


def test_edges_are_log_spaced_and_cover_the_positions():
    np.testing.assert_array_equal(bp.bucket_edges(0), [0, 1])
    np.testing.assert_array_equal(bp.bucket_edges(1), [0, 1, 2])
    np.testing.assert_array_equal(bp.bucket_edges(1000), [0, 1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                          512, 1024])


def test_buckets_sum_to_the_total_loss_and_hold_the_right_tokens():
    rng = np.random.default_rng(0)
    loss = rng.uniform(0, 8, (3, 500))
    pos = np.tile(np.arange(500), (3, 1))
    w = rng.uniform(size=loss.shape) > 0.2
    r = bp.loss_by_position(loss, pos, w)
    assert np.isclose(sum(r["loss_sum"]), loss[w].sum()) and np.isclose(r["total_loss"],
                                                                          loss[w].sum())
    assert sum(r["count"]) == w.sum() == r["total_count"]
    e = r["edges"]
    for i in range(len(e) - 1):
        inb = w & (pos >= e[i]) & (pos < e[i + 1])
        assert r["count"][i] == inb.sum()
        assert np.isclose(r["mean_loss"][i], loss[inb].mean())
    json.dumps(r)  # serialisable


def test_merge_adds_exactly():
    rng = np.random.default_rng(1)
    loss, pos = rng.uniform(0, 5, 300), rng.integers(0, 3000, 300)
    whole = bp.loss_by_position(loss, pos)
    a = bp.loss_by_position(loss[:100], pos[:100])
    b = bp.loss_by_position(loss[100:], pos[100:])
    m = bp.merge_by_position(a, b)
    assert m["edges"] == whole["edges"]
    np.testing.assert_allclose(m["loss_sum"], whole["loss_sum"])
    assert m["count"] == whole["count"]


def test_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        bp.loss_by_position(np.zeros(3), np.zeros(4, int))
    with pytest.raises(ValueError, match="beyond the last bucket edge"):
        bp.loss_by_position(np.zeros(2), np.array([1, 9]), edges=[0, 1, 2, 4, 8])


def test_plot_and_script_write_the_figure(tmp_path):
    for name, slope in (("lmm", -0.3), ("transformer", -0.1)):
        w = tmp_path / name
        w.mkdir()
        pos = np.arange(1, 5000)
        r = bp.loss_by_position(6 + slope * np.log(pos), pos)
        bp.write_by_position(w / "by_position_test.json", {**r, "name": "test"})
    bp.write_by_position(w / "by_position_test_step7.json", {**r, "name": "test", "step": 7})
    labels = bp.plot_runs([w], tmp_path / "two.png")["curves"]  # two steps of one mode
    assert set(labels) == {"transformer test", "transformer test step 7"}
    (w / "by_position_test_step7.json").unlink()
    out = bp.plot_by_position({"a": r}, tmp_path / "one.png")
    assert out.stat().st_size > 1000
    plot = ["plot", "--by_position"]
    res = call_cli(plot + [str(tmp_path / "lmm"), str(tmp_path / "transformer"),
                           f"--out={tmp_path / 'fig.png'}"])
    assert res.returncode == 0, res.stderr
    assert set(json.loads(res.stdout)["curves"]) == {"lmm", "transformer"}
    assert (tmp_path / "fig.png").stat().st_size > 1000
    bad = call_cli(plot + [str(tmp_path)])
    assert bad.returncode == 1 and "no by_position" in bad.stderr
    helped = call_cli(["plot", "--help"])
    assert helped.returncode == 0 and "--by_position:" in helped.stdout
    assert "--pattern:" in helped.stdout and "--title:" in helped.stdout
