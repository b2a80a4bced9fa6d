"""The titans-pytorch comparison's own side runs (``scripts/compare_titans_pytorch.py``).

torch is an optional extra and is not installed for the tests; the titans_lm worker is, and it
must keep calling the layer the way the package defines it.
"""

import json
import subprocess
import sys

from _backbones import REPO


def test_titans_lm_worker_times_the_layer():
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "compare_titans_pytorch.py"), "--frameworks",
         "titans_lm", "--chunks", "16", "--T", "64", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    (row,) = [r for r in rows if r.get("framework") == "titans_lm"]
    assert "error" not in row, row["error"]
    assert row["calls"] == 1 and row["tokens_per_s"] > 0
