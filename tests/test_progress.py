"""Progress of a long phase: timestamped lines with an ETA in a log, a bar on a terminal."""

import io
import re

import pytest

from titans_lm import progress
from titans_lm.progress import Progress, hms


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", c)
    return c


def test_hms():
    assert hms(0) == "0:00:00" and hms(3725.9) == "1:02:05" and hms(-4) == "0:00:00"


def test_lines_in_a_log_quiet_at_first_then_periodic_with_an_eta_that_skips_the_first_unit(clock):
    lines = []
    bar = Progress(10, "books-test reset", "batch", stream=io.StringIO(), log=lines.append,
                   every_s=30, quiet_s=5)
    assert not bar.bar_mode
    clock.t += 4  # the first batch (with its compile) takes 4 s: still quiet
    bar.update()
    assert lines == []
    clock.t += 2  # then 2 s a batch
    bar.update()
    assert len(lines) == 1  # 6 s in: the first line, its rate and ETA from the second batch
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d books-test reset: 2/10 batches \(20%\), "
                        r"0\.50 batches/s, 0:00:06 so far, ETA 0:00:16", lines[0]), lines[0]
    for _ in range(7):  # 14 s more: no line before 30 s since the last
        clock.t += 2
        bar.update()
    assert len(lines) == 1
    clock.t += 2
    bar.update()  # the last batch: a closing line without an ETA
    bar.close()
    assert len(lines) == 2 and "10/10 batches (100%)" in lines[1] and "ETA" not in lines[1]


def test_a_short_phase_writes_no_line_and_an_interrupted_one_says_where_it_stopped(clock):
    lines = []
    with Progress(3, "x", "step", stream=io.StringIO(), log=lines.append) as bar:
        for _ in range(3):
            clock.t += 1
            bar.update()
    assert lines == []
    with Progress(None, "y", "document", stream=io.StringIO(), log=lines.append) as bar:
        for _ in range(4):
            clock.t += 3
            bar.update()
    assert len(lines) == 2 and lines[-1].endswith("y: 4 documents, 0.33 documents/s, 0:00:12 so far")


def test_a_terminal_gets_a_bar_and_no_lines(monkeypatch):
    monkeypatch.setattr(progress, "terminal_columns", lambda stream: 80)
    lines = []
    with Progress(2, "z", stream=io.StringIO(), log=lines.append, quiet_s=0) as bar:
        assert bar.bar_mode
        bar.update(2)
    assert lines == []


def test_a_line_after_only_the_first_unit_gives_no_rate_or_eta(clock):
    lines = []
    bar = Progress(10, "w", "batch", stream=io.StringIO(), log=lines.append, quiet_s=5)
    clock.t += 7  # a first batch that compiled for 7 s
    bar.update()
    assert lines[0].endswith("w: 1/10 batches (10%), 0:00:07 so far"), lines
