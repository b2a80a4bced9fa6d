"""Document starts against the memory's chunk grid: configurations that could put a reset inside a
chunk are rejected by ``validate``, naming every offending field; the check is the config's own
(the config package imports nothing of the engine)."""

import subprocess
import sys
from pathlib import Path

import pytest

from titans_lm.config import load, validate
from titans_lm.config.alignment import alignment_problems, check_reset_alignment

REPO = Path(__file__).resolve().parents[2]


def _load(name):
    return load(REPO / "configs" / f"{name}.py", "tiny")


def test_config_rejects_a_chunk_size_that_does_not_divide_the_document_alignment():
    c = _load("lmm")
    validate(c)                                    # 16 divides 64
    c.model.memory.chunk_size = 48
    with pytest.raises(ValueError, match=r"model.memory.chunk_size=48 must divide data.doc_align=64"):
        validate(c)


def test_config_names_every_offending_field():
    c = _load("mac")
    c.model.memory.chunk_size = 48
    c.model.segment_len = 100
    with pytest.raises(ValueError) as e:
        validate(c)
    msg = str(e.value)
    assert "model.memory.chunk_size=48" in msg and "data.doc_align=64" in msg
    assert "model.segment_len=100" in msg
    c.model.memory.chunk_size = 16
    c.model.segment_len = 64
    validate(c)
    check_reset_alignment(8, {"data.doc_align": 64, "model.segment_len": 32})


def test_alignment_problems_lists_each_field_off_the_grid():
    assert alignment_problems(16, {"data.doc_align": 64, "model.segment_len": 128}) == []
    assert alignment_problems(16, {"data.doc_align": 40, "model.segment_len": 0}) == [
        "data.doc_align=40", "model.segment_len=0"]
    with pytest.raises(ValueError, match=r"chunk=8 must divide data.doc_align=12"):
        check_reset_alignment(8, {"data.doc_align": 12}, chunk_field="chunk")


def test_the_config_package_imports_nothing_else_of_titans_lm():
    code = ("import sys, titans_lm.config, titans_lm.config.overrides, titans_lm.config.compat, "
            "titans_lm.config.tasks, titans_lm.config.presets, titans_lm.config.serialize; "
            "print(sorted(m for m in sys.modules if m.startswith('titans_lm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    loaded = eval(out)
    assert loaded and all(m == "titans_lm" or m.startswith("titans_lm.config") for m in loaded), loaded
