"""The command line parses and validates its arguments before JAX is imported: ``--help``, a bad
flag, a config error and ``titans-lm config`` answer without loading it."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = """
import sys
from titans_lm import cli
codes = [cli.main(["titans-lm", "--help"]), cli.main(["titans-lm", "train", "--help"]),
         cli.main(["titans-lm", "train", "--config=configs/lmm.py:tiny", "--bogus"]),
         cli.main(["titans-lm", "train", "--config=configs/mac.py:tiny",
                   "--config.model.d_model=100"]),
         cli.main(["titans-lm", "config", "--config=configs/mag.py:tiny"])]
print(codes, sorted(m for m in ("jax", "numpy", "orbax", "flax") if m in sys.modules))
"""


def test_parsing_and_validating_imports_no_jax():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, cwd=REPO,
                         check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[0, 0, 2, 1, 0] []", out.stdout + out.stderr
    assert "config fields model.d_model=100 and model.n_heads=4" in out.stderr
