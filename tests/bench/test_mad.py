import ml_collections
import pytest

from titans_lm.bench.mad import (OVERRIDES_FILE, PUBLISHED, check_overrides, format_table,
                                 point_overrides, points)
from titans_lm.config.loader import load
from titans_lm.config.mad import MAD_TASKS
from titans_lm.data.tasks import task_spec


def test_full_protocol_is_mads_sweep_and_reduced_one_run_per_task():
    full = points(["transformer"], MAD_TASKS, [0], "full")
    assert len(full) == 66 * 6  # 66 settings x lr {1e-4, 5e-4, 1e-3} x wd {0, 0.1}
    assert len({p.workdir for p in full}) == len(full)
    assert len(points(["transformer", "lmm"], MAD_TASKS, [0, 1], "reduced")) == 2 * 2 * 6
    with pytest.raises(ValueError, match="unknown protocol"):
        points(["transformer"], MAD_TASKS, [0], "quick")


def _apply(cfg, overrides):
    cfg = ml_collections.ConfigDict(cfg)
    for k, v in overrides.items():
        node = cfg
        *path, leaf = k.split(".")
        for p in path:
            node = node[p]
        node[leaf] = v
    return cfg


def test_every_point_of_the_full_sweep_makes_a_valid_run():
    for p in points(["transformer"], MAD_TASKS, [0], "full")[::6]:
        cfg = _apply(load("configs/tasks/mad.py", f"{p.task}-transformer"),
                     point_overrides(p, "full"))
        spec = task_spec(cfg)
        assert spec.mad.label == p.setting
        assert cfg.train.steps == 200 * -(-spec.mad.num_train_examples // 128)


def test_table_puts_the_published_rows_next_to_ours():
    scores = {"lmm": {"tasks": {"compression": 40.0}, "mad": 40.0, "seeds": 1}}
    md = format_table(scores, ["compression"], "reduced")
    assert "| lmm | 1 | 40.0 | 40.00 |" in md
    for name, avg in PUBLISHED.items():
        assert f"| {name} | - | - | {avg:.2f} |" in md
    assert "arXiv:2505.23735" in md


def test_a_named_variant_has_its_own_folder_and_row():
    plain = points(["mag"], ["compression"], [0], "reduced")[0]
    named = points(["mag"], ["compression"], [0], "reduced", name="mag-sum")[0]
    assert (plain.model, named.model, named.backbone) == ("mag", "mag-sum", "mag")
    assert named.workdir == plain.workdir.replace("mag/", "mag-sum/", 1)
    with pytest.raises(ValueError, match="one backbone"):
        points(["mag", "mal"], ["compression"], [0], "reduced", name="x")


def test_a_folder_is_never_continued_under_other_overrides(tmp_path):
    run = tmp_path / "mag-sum" / "compression"
    check_overrides(run, {"model.combine": "sum"})           # first start records them
    check_overrides(run, {"model.combine": "sum"})           # a resume with the same passes
    with pytest.raises(ValueError, match="--set=model.combine=sum, this command asks for no --set"):
        check_overrides(run, {})
    old = tmp_path / "mag" / "compression"                    # a run from before the record
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="was run without --set"):
        check_overrides(old, {"model.combine": "sum"})
    check_overrides(old, {})                                   # the shipped model goes on
    assert (old / OVERRIDES_FILE).read_text().strip() == "{}"
