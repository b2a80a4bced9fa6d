"""The memory's chunk grid (documents may start anywhere): ``validate`` rejects a MAC segment
length the chunks do not tile and a chunk-start-reading memory (LaCT) whose training window is one
chunk or less, naming the fields; the checks are the config's own (the config package imports
nothing of the engine)."""

import subprocess
import sys
from pathlib import Path

import pytest

from titans_lm.config import load, validate
from titans_lm.config.alignment import (alignment_problems, check_chunk_start_reads,
                                        check_reset_alignment)

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


def test_chunk_start_reads_need_a_window_of_several_chunks():
    c = _load("lact")                               # chunk 512, windows of 2,048: accepted
    validate(c)
    c.data.seq_len = 512                            # one chunk: every read is W0's
    with pytest.raises(ValueError, match=r"model.memory.chunk_size=512 and data.seq_len=512: "
                                         r"with model.memory.read='chunk_start' .* never reads "
                                         r"a write .*chunk_size=128.*seq_len=2048.*carry_state"):
        validate(c)
    validate(c, training=False)                     # a run trained so can still be scored
    c.train.carry_state = True                      # later windows read earlier windows' writes
    validate(c)
    c.train.carry_state = False
    c.model.memory.chunk_size = 256                 # two chunks in a window
    validate(c)
    c = _load("lmm")                                # after-write reads: a single chunk is fine
    c.model.memory.chunk_size = c.data.seq_len
    validate(c)
    check_chunk_start_reads(16, 17, carry_state=False)
    with pytest.raises(ValueError, match="chunk_size=16 and data.seq_len=16"):
        check_chunk_start_reads(16, 16, carry_state=False)


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
