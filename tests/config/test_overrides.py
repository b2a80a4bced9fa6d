"""Eval-time overrides of a checkpoint's config, result names, and the warm-up warning."""

import pytest

from _tiny_run import tiny_config
from titans_lm.config.overrides import apply_eval_overrides, result_suffix, split_overrides
from titans_lm.train.optimizer import schedule_warnings


def test_split_and_apply_overrides():
    argv, ov = split_overrides(["eval", "--workdir=w", "--config.data.seq_len=1024",
                                "--config.eval.batch_size=2"])
    assert argv == ["eval", "--workdir=w"] and ov == {"data.seq_len": "1024", "eval.batch_size": "2"}
    saved = tiny_config("/c")
    cfg = apply_eval_overrides(saved, {**ov, "model.dtype": "bfloat16"})
    assert cfg.data.seq_len == 1024 and cfg.eval.batch_size == 2 and cfg.model.dtype == "bfloat16"
    assert saved.data.seq_len == 64  # a copy
    assert result_suffix(ov, saved) == "_seq_len1024"
    assert result_suffix({"data.seq_len": "64"}, saved) == ""  # the training value: same name
    with pytest.raises(ValueError, match="eval cannot override --config.model.n_layers"):
        apply_eval_overrides(saved, {"model.n_layers": "3"})
    with pytest.raises(ValueError, match="expected int"):
        apply_eval_overrides(saved, {"data.seq_len": "long"})
    with pytest.raises(ValueError, match="has no such field"):
        apply_eval_overrides(saved, {"model.memory.impl": "reference"})  # Transformer++: no memory
    with pytest.raises(ValueError, match="--config.x: write overrides as"):
        split_overrides(["--config.x"])


def test_a_field_added_after_the_checkpoint_takes_its_old_meaning_first():
    """A MAG checkpoint written before MAG read ``model.memory_ablation``: the override applies
    (the absent field meant "none"); a backbone that does not read the field still refuses it."""
    saved = tiny_config("/c")
    saved.model.name = "mag"
    assert "memory_ablation" not in saved.model
    cfg = apply_eval_overrides(saved, {"model.memory_ablation": "gated_read"})
    assert cfg.model.memory_ablation == "gated_read" and "memory_ablation" not in saved.model
    assert result_suffix({"model.memory_ablation": "gated_read"}, saved) == \
        "_memory_ablation-gated_read"
    saved.model.name = "transformer"
    with pytest.raises(ValueError, match="has no such field"):
        apply_eval_overrides(saved, {"model.memory_ablation": "gated_read"})


def test_warmup_warning():
    cfg = tiny_config("/c")
    cfg.optim.warmup_steps = 80
    (w,) = schedule_warnings(cfg.optim, 30)
    assert "optim.warmup_steps=80 is not shorter than train.steps=30" in w and "38%" in w
    assert "--config.optim.warmup_steps=3" in w
    assert schedule_warnings(cfg.optim, 800) == []
