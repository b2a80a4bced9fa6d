"""The training curves: a run's resume points are marked on both panels."""

import json

from titans_lm.train import plot


def test_resume_points_are_marked(tmp_path, monkeypatch):
    recs = [{"step": 1, "loss": 5.0, "tokens_per_sec": 10.0}, {"step": 3, "loss": 4.0},
            {"step": 3, "event": "resume"}, {"step": 5, "loss": 3.0, "tokens_per_sec": 12.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert plot.resume_steps(tmp_path) == [3]
    assert plot.run_curves(tmp_path)["loss"] == [(1, 5.0), (3, 4.0), (5, 3.0)]
    figures = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, path: figures.append(fig) or path)
    plot.plot_runs([tmp_path], tmp_path / "curves.png")
    for ax in figures[0].axes:
        vertical = [line for line in ax.lines if list(line.get_xdata()) == [3, 3]]
        assert len(vertical) == 1 and vertical[0].get_linestyle() == ":"
    assert any("resumed" in t.get_text() for t in figures[0].axes[0].get_legend().get_texts())
