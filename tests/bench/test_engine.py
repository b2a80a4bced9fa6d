"""The engine benchmark's process isolation (``scripts/benchmark.py engine --isolate``)."""

import json
import subprocess
import sys

from _backbones import REPO
from titans_lm.bench import engine as bm

SCRIPT = REPO / "scripts" / "benchmark.py"


def test_without_flag_drops_the_flag_and_its_values():
    argv = ["--impls", "chunked", "reference", "--T", "64", "--isolate=3", "--d", "8"]
    assert bm._without_flag(argv, "--impls") == ["--T", "64", "--isolate=3", "--d", "8"]
    assert bm._without_flag(argv, "--isolate") == ["--impls", "chunked", "reference", "--T", "64",
                                                   "--d", "8"]
    assert bm._without_flag(["--isolate", "2", "--T", "1"], "--isolate") == ["--T", "1"]


def test_isolate_merges_the_timed_calls_of_every_process():
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "engine", "--impls", "chunked", "--models", "linear", "--d", "8",
         "--chunks", "4", "--T", "16", "--modes", "fwd", "--repeats", "2", "--isolate", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    (row,) = [r for r in rows if r.get("impl") == "chunked"]
    assert row["processes"] == 2 and len(row["fwd"]["seconds_all"]) == 4
    assert row["fwd"]["seconds_min"] == min(row["fwd"]["seconds_all"])
    assert row["fwd"]["tokens_per_s"] > 0
