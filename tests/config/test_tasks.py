"""configs/tasks/*.py: a backbone's config with the data replaced by a synthetic task."""

from pathlib import Path

import pytest

from titans_lm.config import load_module, validate
from titans_lm.data.tasks import eval_settings, task_spec

TASKS = Path(__file__).resolve().parents[2] / "configs" / "tasks"


def _load(name):
    return load_module(TASKS / f"{name}.py")


@pytest.mark.parametrize("backbone", ["transformer", "swa", "lmm", "mag-tiny"])
def test_mqar_config(backbone):
    c = _load("mqar").get_config(backbone)
    validate(c)
    assert c.data.task == "mqar" and c.data.seq_len == 256 and c.model.vocab_size == 8192
    assert c.task.train_pairs == (16, 32, 64)
    assert eval_settings(c) == [{"length": 256, "pairs": 64}, {"length": 512, "pairs": 128},
                                {"length": 1024, "pairs": 256}]
    c.data.vocab_size = 1024  # the model's vocabulary follows the task's
    assert c.model.vocab_size == 1024
    assert task_spec(c).vocab_size == 1024


def test_niah_config():
    c = _load("niah").get_config("lmm")
    validate(c)
    assert c.data.task == "niah" and c.model.name == "lmm" and c.model.vocab_size == 1024
    s = eval_settings(c)
    assert len(s) == 25 and {x["length"] for x in s} == {1024, 2048, 4096, 8192, 16384}
    assert task_spec(c).variant == "niah_single_1"


def test_unknown_backbone_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown backbone 'lstm'.*transformer"):
        _load("mqar").get_config("lstm")


@pytest.mark.parametrize("backbone", ["transformer", "lmm", "mac", "ttt_linear"])
def test_mad_config_puts_the_backbone_in_mads_architecture_and_run(backbone):
    c = _load("mad").get_config(f"fuzzy_in_context_recall-{backbone}")
    validate(c)
    m = c.model
    assert (m.d_model, m.n_layers, m.d_ff, m.tie_embeddings) == (128, 2, 352, False)
    assert m.get("n_heads", 16) == 16 and ("memory" not in m or m.memory.n_heads == 0)
    assert (c.data.seq_len, c.data.vocab_size) == (128, 20)
    assert (c.train.batch_size, c.train.steps, c.optim.lr, c.optim.warmup_steps) == (
        128, 20000, 5e-4, 0)
    assert eval_settings(c) == [{"length": 128, "setting": "baseline"}]
    assert task_spec(c).mad.k_motif_size == 3


@pytest.mark.parametrize("task", ["compression", "memorization", "selective_copying"])
def test_mad_config_gives_a_chunk_start_reader_chunks_its_rows_can_hold(task):
    """LaCT reads the chunk-start state: its 512-token chunk would make every MAD row one chunk
    that never reads a write (refused by validate); MAD's template gives it chunks of 16."""
    c = _load("mad").get_config(f"{task}-lact")
    validate(c)
    assert c.model.memory.chunk_size == 16 < c.data.seq_len
    assert _load("mad").get_config(f"{task}-lmm").model.memory.chunk_size == 16  # unchanged
