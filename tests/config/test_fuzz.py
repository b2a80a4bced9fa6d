"""Config fuzzing through the CLI's config path: random tiny configs, valid and invalid, each
either trains one step or stops with one clear message naming a config field."""

import random
import re

import pytest

from _tiny_run import REPO, VOCAB
from titans_lm import cli
from titans_lm.config import load
from titans_lm.train.checkpoint import CheckpointError
from titans_lm.train.loop import train

CONFIGS = {"transformer": REPO / "configs" / "transformer.py", "lmm": REPO / "configs" / "lmm.py"}
BASE = {"data.corpus": "tinyshakespeare", "data.vocab_size": VOCAB, "model.vocab_size": VOCAB,
        "data.seq_len": 32, "data.doc_align": 16, "model.d_model": 32, "model.n_layers": 1,
        "model.d_ff": 64, "train.batch_size": 2, "train.steps": 1, "train.log_every": 1,
        "train.eval_every": 100, "train.eval_batches": 1, "train.ckpt_every": 100,
        "eval.batch_size": 2, "mesh.data": 1, "optim.warmup_steps": 0}
LMM_BASE = {"model.memory.head_dim": 16, "model.memory.chunk_size": 16, "model.n_persistent": 2}

# (field, valid values, invalid values); an invalid value must be named in the message.
FIELDS = {
    "both": [
        ("data.seq_len", [32, 64], [0, -32, 24]),
        ("train.batch_size", [2, 4], [0, -2]),
        ("train.grad_accum", [1, 2], [0, 3]),
        ("optim.lr", [1e-3, 3e-3], [0.0, -1.0]),
        ("model.d_model", [32], [-32]),
        ("model.n_layers", [1, 2], [0]),
        ("mesh.data", [1, -1], [0, -3]),
        ("train.compute_dtype", ["float32", "bfloat16"], ["float16"]),
        ("data.vocab_size", [], [100]),
        ("train.log_every", [1], [0]),
    ],
    "transformer": [
        ("model.n_heads", [2, 4], [3, 0]),
    ],
    "lmm": [
        ("model.memory.memory_depth", [1, 2, 4], [0, 5]),
        ("model.memory.chunk_size", [8, 16], [0]),
        ("model.memory.theta_max", [0.0005, 0.01], [-1.0, 0.0]),
        ("model.memory.eta_max", [0.5, 0.9], [1.5, 0.0]),
        ("model.memory.head_dim", [16], [12]),
        ("model.memory.surprise_max_norm", [0.0, 1.0], [-1.0]),
        ("model.memory.gate_style", ["titans", "ttt"], ["adam"]),
    ],
}
FIELD_NAME = re.compile(r"(config field|MemoryConfig\.|memory\.|model\.|data\.|train\.|optim\.|"
                        r"mesh\.|eval\.)")


def _draw(rng: random.Random):
    backbone = rng.choice(sorted(CONFIGS))
    pool = FIELDS["both"] + FIELDS[backbone]
    overrides = dict(BASE, **(LMM_BASE if backbone == "lmm" else {"model.n_heads": 2}))
    bad = None
    for field, good, wrong in rng.sample(pool, 3):
        if wrong and (not good or rng.random() < 0.35) and bad is None:
            overrides[field] = rng.choice(wrong)
            bad = field
        elif good:
            overrides[field] = rng.choice(good)
    if bad is None and rng.random() < 0.15:
        overrides["train.stpes"] = 3  # a misspelt field
        bad = "train.stpes"
    return backbone, overrides, bad


def _load(backbone):
    return load(CONFIGS[backbone], "tiny")


def _run(backbone, overrides, cache, workdir):
    """The CLI's config path, in-process: the config file's tiny config, locked, with each
    ``--config.<field>=value`` applied as config_flags does (an unknown field or a wrong type is
    refused naming the field), then ``train``. -> (trained one step, message)."""
    cfg = _load(backbone)
    cfg.lock()
    try:
        for key, value in {"data.cache_dir": str(cache), **overrides}.items():
            *path, leaf = key.split(".")
            node = cfg
            for part in path:
                node = node[part]
            if leaf not in node:
                raise cli.UsageError(f"unknown config field {key!r}")
            try:
                node[leaf] = value
            except TypeError as e:
                raise cli.UsageError(f"config field {key}: {e}") from None
        res = train(cfg, workdir, progress=False, log=lambda m: None)
        return res.step == 1, ""
    except (cli.UsageError, ValueError, CheckpointError) as e:
        return False, str(e)


@pytest.mark.slow
def test_random_configs_train_one_step_or_name_the_field(tmp_path):
    rng = random.Random(2366)
    cache = tmp_path / "cache"
    seen = {"trained": 0, "refused": 0}
    for i in range(12):  # 3 valid draws (1 of the LMM), 9 invalid ones naming 9 fields
        backbone, overrides, bad = _draw(rng)
        trained, msg = _run(backbone, overrides, cache, tmp_path / f"run{i}")
        where = f"draw {i} ({backbone}, bad field {bad}): {msg!r}"
        if bad is None:
            # A valid draw may still be refused for a combination (e.g. a batch that does not
            # split over the mesh); the message must then name a field.
            assert trained or FIELD_NAME.search(msg), where
        else:
            assert not trained, where
            leaf = bad.rsplit(".", 1)[1]
            assert leaf in msg, where  # the field is named (most messages give its section too)
        assert "\n" not in msg and "Traceback" not in msg, where
        seen["trained" if trained else "refused"] += 1
    assert seen["trained"] >= 3 and seen["refused"] >= 9, seen
