"""Shared set-up for the trainer, checkpoint, CLI and evaluation tests: a tiny Transformer++ run
on tinyshakespeare (vocabulary 320, T = 64, d_model 32, 2 layers), built from the real
``configs/transformer.py``."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from titans_lm.config import load

REPO = Path(__file__).resolve().parent.parent
CONFIG_FILE = REPO / "configs" / "transformer.py"
VOCAB = 320

# The same settings as command-line overrides (for the CLI tests).
OVERRIDES = {
    "data.corpus": "tinyshakespeare", "data.vocab_size": VOCAB, "model.vocab_size": VOCAB,
    "data.seq_len": 64, "model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2,
    "model.d_ff": 64, "train.batch_size": 8, "train.steps": 6, "train.log_every": 1,
    "train.eval_every": 3, "train.eval_batches": 2, "train.ckpt_every": 3, "eval.batch_size": 8,
    "eval.max_docs": 2, "optim.warmup_steps": 2, "mesh.data": 1,
}


def load_config(size: str = "tiny"):
    return load(CONFIG_FILE, size)


def tiny_config(cache_dir: str | Path, **changes):
    """The tiny run config; ``changes`` maps "section.field" (dots as "__") to values."""
    cfg = load_config("tiny")
    for key, value in {**OVERRIDES, "data.cache_dir": str(cache_dir)}.items():
        section, field = key.split(".")
        cfg[section][field] = value
    for key, value in changes.items():
        section, field = key.split("__")
        cfg[section][field] = value
    return cfg


def cli_args(cache_dir: str | Path, workdir: str | Path, **changes) -> list[str]:
    """``titans-lm train`` arguments for the tiny run."""
    merged = {**OVERRIDES, "data.cache_dir": str(cache_dir)}
    merged.update({k.replace("__", "."): v for k, v in changes.items()})
    return ([f"--config={CONFIG_FILE}:tiny"] + [f"--config.{k}={v}" for k, v in merged.items()]
            + [f"--workdir={workdir}"])


def one_device_env(**extra: str) -> dict:
    """The environment of a CLI subprocess: one CPU device, the suite's compile flags (conftest)."""
    return {**os.environ, "XLA_FLAGS": os.environ.get("TITANS_LM_TEST_COMPILE_FLAGS", ""),
            "JAX_PLATFORMS": "cpu", **extra}


def run_cli(args: list[str], timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m titans_lm.cli <args>`` on one CPU device."""
    env = one_device_env()
    return subprocess.run([sys.executable, "-m", "titans_lm.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=kw.pop("cwd", REPO), **kw)


def call_cli(args: list[str], cwd: str | Path = REPO) -> subprocess.CompletedProcess:
    """``titans_lm.cli.main`` called in this process, answered as :func:`run_cli` answers (exit
    status, stdout, stderr) without starting an interpreter and JAX for each call. The command
    runs on this process's devices (the suite's 8 virtual CPUs; the tiny runs set mesh.data=1).
    Signals, several processes and anything that needs a fresh interpreter use :func:`run_cli`."""
    from titans_lm import cli  # only for the tests that call it
    out, err = io.StringIO(), io.StringIO()
    argv, here = list(sys.argv), Path.cwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["titans-lm", *(str(a) for a in args)])
    finally:
        os.chdir(here)
        sys.argv = argv
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def random_batch(batch_size: int, seq_len: int, seed: int = 0, vocab: int = VOCAB) -> dict:
    """Random tokens with two documents per row (boundary at 32) and 5 padding positions."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, vocab, (batch_size, seq_len + 1)).astype(np.int32)
    segs = np.ones((batch_size, seq_len + 1), np.int32)
    segs[:, 32:] = 2
    segs[:, -5:] = 0
    tokens[:, 0] = tokens[:, 32] = 2  # BOS at each document start
    tokens[segs == 0] = 0
    return {"tokens": tokens, "segment_ids": segs}


def tree_max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
