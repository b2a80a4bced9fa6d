"""MAC's segments against the memory's chunk grid (documents may start anywhere): ``validate``
rejects a segment length the chunks do not tile, naming the fields; the check is the config's own
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


def test_document_alignment_is_free_and_mac_segments_must_tile_into_chunks():
    c = _load("lmm")
    c.model.memory.chunk_size = 48                 # documents may start inside a chunk
    c.data.doc_align = 1
    validate(c)
    c = _load("mac")
    c.model.memory.chunk_size = 48
    c.model.segment_len = 100
    with pytest.raises(ValueError, match=r"model.memory.chunk_size=48 must divide "
                                         r"model.segment_len=100: MAC runs its memory"):
        validate(c)
    c.model.memory.chunk_size = 16
    c.model.segment_len = 64
    validate(c)


def test_alignment_problems_lists_each_field_off_the_grid():
    assert alignment_problems(16, {"model.segment_len": 128}) == []
    assert alignment_problems(16, {"a": 40, "model.segment_len": 0}) == ["a=40", "model.segment_len=0"]
    with pytest.raises(ValueError, match=r"chunk=8 must divide model.segment_len=12"):
        check_reset_alignment(8, {"model.segment_len": 12}, chunk_field="chunk")


def test_the_config_package_imports_nothing_else_of_titans_lm():
    code = ("import sys, titans_lm.config, titans_lm.config.overrides, titans_lm.config.compat, "
            "titans_lm.config.tasks, titans_lm.config.presets, titans_lm.config.serialize; "
            "print(sorted(m for m in sys.modules if m.startswith('titans_lm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    loaded = eval(out)
    assert loaded and all(m == "titans_lm" or m.startswith("titans_lm.config") for m in loaded), loaded
