"""Checkpoint faults: damaged files named and skipped (train and eval), a process killed during an
asynchronous save, a full disk during a save; the integrity manifest itself."""

import errno
import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

from _tiny_run import REPO, cli_args, one_device_env, run_cli, tiny_config, tree_max_abs_diff
from titans_lm.train import integrity
from titans_lm.train import sharding as shd
from titans_lm.train.checkpoint import (Checkpointer, CheckpointError, CheckpointSaveError,
                                        DamagedCheckpointError)
from titans_lm.train.loop import train
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import abstract_state, model_fns

pytestmark = pytest.mark.e2e

MESH1 = {"data": 1, "fsdp": 1, "tensor": 1}


@pytest.fixture
def run6(tiny_run):
    """The suite's finished 6-step tiny run (checkpoints at steps 3 and 6; tests/conftest.py)."""
    return tiny_run


def _copy(run6, tmp_path):
    root, cfg = run6
    shutil.copytree(root / "run", tmp_path / "run")
    return tmp_path / "run", cfg


def _file(workdir, step, prefix):
    step_dir = workdir / "checkpoints" / str(step)
    hits = sorted(p for p in (step_dir / "state").glob(f"{prefix}*/*")
                  if p.is_file() and not p.name.startswith("."))
    assert hits, f"no {prefix} file in {step_dir}"
    return hits[0], str(hits[0].relative_to(step_dir))


def _state(workdir, cfg, step):
    fns = model_fns(cfg.model)
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    with Checkpointer(workdir) as ck:
        return jax.device_get(ck.restore(abstract_state(fns, tx, shd.make_mesh(MESH1)), step)[0])


def test_manifest_names_missing_truncated_and_corrupted_files(run6, tmp_path):
    workdir, _ = _copy(run6, tmp_path)
    step_dir = workdir / "checkpoints" / "6"
    assert integrity.verify(step_dir, 6) == []
    manifest = json.loads((step_dir / integrity.MANIFEST).read_text())
    assert manifest["step"] == 6 and any(f.startswith("state/params.") for f in manifest["files"])
    f, rel = _file(workdir, 6, "params.")
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[: size // 2])
    g, grel = _file(workdir, 6, "opt_state.")
    data = bytearray(g.read_bytes())
    data[len(data) // 2] ^= 0xFF
    g.write_bytes(bytes(data))
    (step_dir / "config" / "metadata").unlink()
    found = {d.file: d for d in integrity.verify(step_dir, 6)}
    assert found[rel].problem == f"truncated ({size // 2} of {size} bytes)"
    assert found[rel].part == "parameters"
    assert found[grel].problem.startswith("corrupted") and found[grel].part == "optimizer state"
    assert found["config/metadata"].problem == "missing" and found["config/metadata"].part == "config"
    assert integrity.verify(workdir / "checkpoints" / "3", 3) == []
    (step_dir / integrity.MANIFEST).unlink()
    assert integrity.verify(step_dir, 6) is None  # unverified: only reading it can tell


def test_train_names_a_damaged_checkpoint_and_falls_back(run6, tmp_path):
    workdir, cfg = _copy(run6, tmp_path)
    want = _state(workdir, cfg, 6)
    f, rel = _file(workdir, 6, "params.")
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[:10])
    msgs = []
    with pytest.raises(DamagedCheckpointError) as e:
        train(cfg, workdir, progress=False, log=msgs.append, bad_checkpoint="refuse")
    assert str(e.value) == (
        f"checkpoint step 6 in {workdir / 'checkpoints'} is damaged: {rel} (parameters) is "
        f"truncated (10 of {size} bytes); refusing to use it (--bad_checkpoint=refuse): move "
        f"{workdir / 'checkpoints' / '6'} away to fall back to step 3, or rerun with "
        f"--bad_checkpoint=fallback")
    res = train(cfg, workdir, progress=False, log=msgs.append)
    line = (f"checkpoint step 6 in {workdir / 'checkpoints'} is damaged: {rel} (parameters) is "
            f"truncated (10 of {size} bytes); falling back to the previous complete checkpoint, "
            f"step 3 (moved to {workdir / 'damaged_checkpoints' / '6'})")
    assert line in msgs
    assert f"resuming from the checkpoint at step 3 in {workdir / 'checkpoints'}" in msgs
    assert res.status == "completed" and sorted(res.losses) == [4, 5, 6]
    assert (workdir / "damaged_checkpoints" / "6" / rel).stat().st_size == 10  # nothing deleted
    assert tree_max_abs_diff(_state(workdir, cfg, 6), want) == 0.0  # steps 4-6 replayed exactly


def test_eval_ignores_damaged_optimizer_state_and_falls_back_on_damaged_parameters(run6, tmp_path):
    from titans_lm.eval.evaluate import evaluate
    workdir, _ = _copy(run6, tmp_path)
    g, grel = _file(workdir, 6, "opt_state.")
    g.write_bytes(b"")
    kw = dict(wikitext=False, log=lambda m: None, progress=False)
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        res = evaluate(workdir, **kw)
    assert next(iter(res.values()))["step"] == 6
    # (orbax may log its own warnings around it, depending on the absl verbosity others left)
    line = next(x for x in err.getvalue().splitlines() if x.startswith("checkpoint step 6: "))
    assert (f"checkpoint step 6: {grel} (optimizer state) is truncated (0 of " in line
            and line.endswith("not needed here, so step 6 is used (training could not resume "
                              "from it)"))
    f, rel = _file(workdir, 6, "params.")
    f.write_bytes(b"x")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        res = evaluate(workdir, **kw)
    assert next(iter(res.values()))["step"] == 3
    assert (f"checkpoint step 6 in {workdir / 'checkpoints'} is damaged: {rel} (parameters) is "
            f"truncated (1 of") in err.getvalue()
    assert "falling back to the previous complete checkpoint, step 3\n" in err.getvalue()
    assert (workdir / "checkpoints" / "6").is_dir()  # eval moves nothing
    with pytest.raises(DamagedCheckpointError, match="refusing to use it"):
        evaluate(workdir, bad_checkpoint="refuse", **kw)
    with pytest.raises(DamagedCheckpointError, match="no earlier complete checkpoint"):
        evaluate(workdir, step=6, **kw)


def test_cli_eval_names_the_bad_checkpoint_in_one_line(run6, tmp_path):
    workdir, _ = _copy(run6, tmp_path)
    f, rel = _file(workdir, 6, "params.")
    f.write_bytes(b"")
    p = run_cli(["eval", f"--workdir={workdir}", "--nowikitext", "--bad_checkpoint=refuse"])
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("titans-lm eval: error:")]
    assert len(err) == 1 and f"checkpoint step 6 in {workdir / 'checkpoints'} is damaged: {rel} " \
        "(parameters) is truncated (0 of" in err[0] and "refusing to use it" in err[0]
    p = run_cli(["eval", f"--workdir={workdir}", "--nowikitext", "--bad_checkpoint=refuse",
                 "--verbose"])
    assert p.returncode == 1 and "Traceback" in p.stderr


KILLER = """
import os, signal, sys
from orbax.checkpoint._src.path import atomicity
_finalize = atomicity.AtomicRenameTemporaryPath.finalize
async def finalize(self):
    if self._final_path.name == os.environ["KILL_AT_STEP"]:  # all files written, not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)
    return await _finalize(self)
atomicity.AtomicRenameTemporaryPath.finalize = finalize
from titans_lm.cli import main
sys.exit(main(["titans-lm"] + sys.argv[1:]))
"""


@pytest.mark.slow
def test_sigkill_during_an_async_save_resumes_from_the_newest_complete(run6, tmp_path):
    root, _ = run6
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    args = ["train", *cli_args(root / "cache", tmp_path / "run"), "--noeval_after"]
    env = one_device_env(KILL_AT_STEP="6", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, str(killer), *args], capture_output=True, text=True,
                       timeout=240, env=env, cwd=REPO)
    assert p.returncode == -9, p.stderr
    ckdir = tmp_path / "run" / "checkpoints"
    assert sorted(x.name for x in ckdir.iterdir() if x.name.isdigit()) == ["3"]
    tmp = [x.name for x in ckdir.iterdir() if x.name.startswith("6.orbax-checkpoint-tmp")]
    assert len(tmp) == 1
    p = run_cli(args)
    assert p.returncode == 0, p.stderr
    assert (f"resuming from the checkpoint at step 3 in {ckdir} (the save of step 6 did not "
            f"complete: {tmp[0]} is ignored)") in p.stderr
    assert integrity.verify(ckdir / "6", 6) == []


def test_full_disk_during_a_save_is_reported_and_the_run_resumes(run6, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp
    root, cfg = run6
    writer = ocp.JsonCheckpointHandler._save_fn

    async def full_disk(self, x, directory):
        if "6.orbax-checkpoint-tmp" in str(directory):
            (directory / "metadata").write_text("{\"iter")  # a partial write, then ENOSPC
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return await writer(self, x, directory)
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", full_disk)
    workdir = tmp_path / "run"
    with pytest.raises(CheckpointSaveError) as e:
        train(cfg, workdir, progress=False, log=lambda m: None)
    assert str(e.value) == (
        f"saving the checkpoint of step 6 in {workdir / 'checkpoints'} failed (the disk is "
        f"full); the partial save 6.orbax-checkpoint-tmp is ignored (delete it to free its "
        f"space) and the earlier checkpoints are intact (newest: step 3). Free some space and "
        f"run the same command again to resume")
    ckdir = workdir / "checkpoints"
    assert sorted(x.name for x in ckdir.iterdir() if x.name.isdigit()) == ["3"]
    assert integrity.verify(ckdir / "3", 3) == []
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", writer)
    msgs = []
    res = train(cfg, workdir, progress=False, log=msgs.append)
    assert res.status == "completed" and sorted(res.losses) == [4, 5, 6]
    assert (f"resuming from the checkpoint at step 3 in {ckdir} (the save of step 6 did not "
            f"complete: 6.orbax-checkpoint-tmp is ignored)") in msgs
    assert tree_max_abs_diff(_state(workdir, cfg, 6), _state(root / "run", cfg, 6)) == 0.0


def test_unknown_policy_and_no_checkpoint(tmp_path):
    with Checkpointer(tmp_path / "run") as ck:
        with pytest.raises(ValueError, match="unknown bad-checkpoint policy 'skip'"):
            ck.newest_usable(lambda s: s, policy="skip")
        with pytest.raises(CheckpointError, match="no checkpoints in"):
            ck.newest_usable(lambda s: s)


def _run_until(args, env, target: int, sig: int) -> tuple[int, str]:
    """Start ``titans-lm train``; once it logs step >= target send ``sig``; return the exit code
    and the log."""
    import re
    import signal
    import threading
    p = subprocess.Popen([sys.executable, "-m", "titans_lm.cli", *args], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    watchdog = threading.Timer(180, p.kill)
    watchdog.start()
    lines = []
    try:
        for line in p.stderr:
            lines.append(line)
            m = re.search(r"step (\d+)/\d+: loss", line)
            if m and int(m.group(1)) >= target:
                p.send_signal(sig)
                break
        lines.append(p.stderr.read())
        return p.wait(), "".join(lines)
    finally:
        watchdog.cancel()
        if p.poll() is None:
            p.kill()
        del signal


@pytest.mark.slow
def test_kill_and_resume_soak_ends_with_the_uninterrupted_parameters(run6, tmp_path):
    """2 kills at random steps (a SIGTERM and a SIGKILL, in random order), each followed by a
    resume. SIGTERM saves a checkpoint at the step it stops (checkpoints every 4 steps otherwise),
    says so in one line without a traceback, and the next run resumes from that step; the metrics
    hold each step once."""
    import random
    import re
    import signal
    root, _ = run6
    steps = 16
    changes = dict(train__steps=steps, train__ckpt_every=4, train__eval_every=100)
    cfg = tiny_config(root / "cache", mesh__data=1, **changes)
    # The uninterrupted run goes through the CLI too (one CPU device, as the soak's processes).
    p = run_cli(["train", *cli_args(root / "cache", tmp_path / "straight", **changes),
                 "--noeval_after"])
    assert p.returncode == 0, p.stderr
    rng = random.Random(12)
    targets = sorted(rng.sample(range(2, steps - 2), 2))
    sigs = [signal.SIGTERM, signal.SIGKILL]
    rng.shuffle(sigs)
    args = ["train", *cli_args(root / "cache", tmp_path / "soak", **changes), "--noeval_after"]
    env = one_device_env()
    saved_at = None  # the step a SIGTERM stopped and saved at
    for t, s in zip(targets, sigs):
        code, log = _run_until(args, env, t, s)
        assert code == (-9 if s == signal.SIGKILL else 128 + signal.SIGTERM), log
        if saved_at is not None:
            assert f"resuming from the checkpoint at step {saved_at} " in log, log
        saved_at = None
        if s == signal.SIGTERM:
            assert "Traceback" not in log, log
            m = re.search(r"stopped by SIGTERM at step (\d+); checkpoint saved in \S+\. Run the "
                          r"same command again to resume\.", log)
            assert m and t <= int(m.group(1)) < steps, log
            saved_at = int(m.group(1))
    p = run_cli(args)
    assert p.returncode == 0, p.stderr
    if saved_at is not None:
        assert f"resuming from the checkpoint at step {saved_at} " in p.stderr
    recs = [json.loads(x) for x in (tmp_path / "soak" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["step"] for r in recs if "loss" in r]
    assert logged == sorted(set(logged)) and logged[-1] == steps
    assert tree_max_abs_diff(_state(tmp_path / "soak", cfg, steps),
                             _state(tmp_path / "straight", cfg, steps)) == 0.0
