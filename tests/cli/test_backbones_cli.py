"""A memory backbone's tiny config through the command line: train with checkpoints, resume
from a checkpoint, then the run's evaluation (``--eval_after``) on the held-out text and
WikiText-2. Test size: tinyshakespeare, vocabulary 320, 64-token windows, d_model 32, one layer.

The command line, the checkpoints and the evaluation do not depend on the backbone (they see a
config, a parameter pytree and a stateful apply), so this runs one memory backbone, the Titans
memory alone (``lmm``; TTT shares its engine); ``test_cli.py`` runs Transformer++. What does depend
on the backbone is tested in process, once per backbone: its config (``tests/config``), a
training call equal to the stateful call and split calls equal to one call
(``tests/models/test_stateful.py``), reset and carried evaluation (``tests/eval/test_streaming.py``)."""

import json
import math
import shutil

import pytest

from _backbones import REPO
from _tiny_run import call_cli
from titans_lm.eval.results import latest_result

pytestmark = pytest.mark.e2e

OVERRIDES = {
    "data.corpus": "tinyshakespeare", "data.vocab_size": 320, "model.vocab_size": 320,
    "data.seq_len": 64, "model.d_model": 32, "model.n_layers": 1, "model.d_ff": 64,
    "model.memory.head_dim": 16, "train.batch_size": 2, "train.log_every": 1,
    "train.eval_every": 2, "train.eval_batches": 1, "train.ckpt_every": 2, "eval.batch_size": 8,
    "eval.max_docs": 1, "optim.warmup_steps": 1, "mesh.data": 1,
}
CLI_BACKBONES = ("lmm",)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A data cache (tokenizer, token stores) shared by the runs (the suite's compilation cache,
    set in conftest, lets the rerun find its train and validation steps compiled)."""
    return tmp_path_factory.mktemp("data_cache")


def _run(args):
    return call_cli(args)


@pytest.mark.slow
@pytest.mark.parametrize("name", CLI_BACKBONES)
def test_train_checkpoint_resume_eval(name, shared, tmp_path):
    """Train 4 steps (checkpoints at 2 and 4), drop the step-4 checkpoint as if the run had been
    stopped after step 2, rerun: it resumes at step 2, repeats steps 3-4 with the same losses
    (the same compiled step, from the compilation cache), and evaluates."""
    data_cache = shared
    workdir = tmp_path / name
    overrides = {**OVERRIDES, "data.cache_dir": data_cache}
    args = [f"--config={REPO / 'configs' / f'{name}.py'}:tiny", f"--workdir={workdir}",
            "--config.train.steps=4"]
    args += [f"--config.{k}={v}" for k, v in overrides.items()]

    p = _run(["train", *args, "--eval_after=false"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"model {name}:" in p.stderr and "parameters" in p.stderr
    first = _train_losses(workdir)
    assert sorted(first) == [1, 2, 3, 4] and all(math.isfinite(v) for v in first.values())
    shutil.rmtree(workdir / "checkpoints" / "4")

    p = _run(["train", *args])  # resumes, then evaluates (--eval_after)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from the checkpoint at step 2" in p.stderr
    again = _train_losses(workdir)
    assert sorted(again) == [1, 2, 3, 4]
    for step in (3, 4):
        assert abs(again[step] - first[step]) <= 1e-5 * abs(first[step]), (step, first, again)
    assert "token ppl" in p.stdout  # the evaluation table
    for dataset in ("tinyshakespeare-test", "wikitext2-test"):
        res = latest_result(workdir, dataset)
        assert res["step"] == 4 and res["model_name"] == name and res["model"]["n_tokens"] > 0
        assert 1 < res["model"]["token_ppl"] < 1e4


def _train_losses(workdir):
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}
