"""The training loop: ``train(cfg, workdir)``.

Order of work: validate the config, prepare the data (tokenizer and token stores, cached), build
the mesh, the model description, the optimiser and the checkpoint manager; resume from the newest
checkpoint in ``<workdir>/checkpoints`` (refusing one written by a different model/data config)
or initialise from ``train.seed``; compile the step ahead of time; then step.

Per step: draw the next batch from the grain iterator, place it on the mesh, run the jitted
``train_step`` (state donated). Metrics are read back one step late, so the host prepares step
s+1 while the device runs step s; before every checkpoint the current step's loss is read and
checked, so a saved state always follows only finite losses.

Stopping:

- ``train.steps`` reached: final checkpoint, status ``"completed"``.
- SIGTERM or Ctrl-C (SIGINT): the current step finishes, a checkpoint is saved and awaited, a
  message says how to resume, status ``"interrupted"`` (the CLI then exits with 128 + the signal
  number: 143 for SIGTERM, 130 for Ctrl-C, so shells and job schedulers see an unfinished run).
  A second Ctrl-C is not intercepted: it raises KeyboardInterrupt at once (the CLI exits with
  130). A save already started is still completed on the way out; if the process dies during
  it, orbax's atomic rename discards the partial checkpoint and the previous one stays valid.
- ``stop_at_step``: like an interruption at that step (status ``"stopped"``); used to split a run.
- A non-finite loss: :class:`NonFiniteLossError` naming the step and the likely cause (the
  memory's inner loop or the optimiser, from the step's memory-state norms:
  ``titans_lm.train.diagnose``); nothing is saved after it, the newest checkpoint on disk is the
  last good one.

Resuming is exact: the parameters, optimiser state, step and RNG come from the checkpoint, and so
does the data iterator's position, so N steps + restart + N steps equal 2N steps straight.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from titans_lm.config import validate
from titans_lm.data.pipeline import make_train_iterator
from titans_lm.data.prepare import prepare
from titans_lm.data.stream_pipeline import StreamIterator
from titans_lm.data.tasks import MAD_TASKS, TaskData
from titans_lm.progress import hms, terminal_columns, timestamp
from titans_lm.train import sharding as shd
from titans_lm.train.checkpoint import Checkpointer, DamagedCheckpointError
from titans_lm.train.compilation import Announced, compile_announced
from titans_lm.train.diagnose import likely_cause, memory_norms
from titans_lm.train.distributed import check_process_rows
from titans_lm.train.max_context import with_max_context
from titans_lm.train.mfu import peak_flops, train_step_flops
from titans_lm.train.optimizer import make_optimizer, schedule_warnings
from titans_lm.train.run_files import check_run_data, write_run_config, write_run_data
from titans_lm.train.state import (NO_CARRY, Carry, abstract_state, count_params, init_state,
                                   model_fns, state_shardings)
from titans_lm.train.step import jit_eval_step, jit_train_step
from titans_lm.train.validation import (carried_validation_batches, make_carried_validation,
                                        validation_batches)
from titans_lm.train.warm_start import warm_start_params
from titans_lm.train.writers import MetricWriter

Log = Callable[[str], None]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclasses.dataclass
class TrainResult:
    """What a call to :func:`train` did.

    Attributes:
      status: "completed", "interrupted" (a signal), or "stopped" (``stop_at_step``).
      step: the step of the final state (updates applied).
      workdir: the run directory.
      losses: step -> training loss of the steps run by this call (step s = the loss of the
        update that produced state s).
      val_losses: step -> validation loss of the evaluations run by this call (reset windows:
        ``titans_lm.train.validation.validation_batches``).
      val_losses_carried: the same for the carried windows of a ``train.carry_state`` run
        (``titans_lm.train.validation.carried_validation_batches``); empty otherwise.
      signal: the signal number for "interrupted", else None.
    """
    status: str
    step: int
    workdir: Path
    losses: dict[int, float] = dataclasses.field(default_factory=dict)
    val_losses: dict[int, float] = dataclasses.field(default_factory=dict)
    val_losses_carried: dict[int, float] = dataclasses.field(default_factory=dict)
    signal: int | None = None


def check_train_config(cfg: ml_collections.ConfigDict) -> None:
    """:func:`titans_lm.config.validate` plus the checks that involve several sections.

    Raises:
      ValueError: naming the offending fields.
    """
    validate(cfg)
    if "vocab_size" not in cfg.model:
        raise ValueError("config field model.vocab_size: missing; the config file must set it")
    if cfg.data.vocab_size != cfg.model.vocab_size:
        raise ValueError(f"config fields data.vocab_size={cfg.data.vocab_size} and "
                         f"model.vocab_size={cfg.model.vocab_size} must agree")
    for name in ("log_every", "eval_every", "ckpt_every", "keep_checkpoints"):
        if cfg.train[name] < 1:
            raise ValueError(f"config field train.{name}: must be >= 1, got {cfg.train[name]}")


def carry_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The run config as trained: with ``train.carry_state`` a full-attention model keeps a KV
    cache of ``model.max_context`` tokens across steps, ``data.seq_len`` unless set (what
    ``titans-lm eval --context=carry`` uses too); otherwise ``cfg`` itself."""
    if not cfg.train.get("carry_state", False):
        return cfg
    return with_max_context(cfg, None)


def carry_of(cfg: ml_collections.ConfigDict) -> Carry:
    """The train state's carried model state for ``cfg`` (``titans_lm.train.carry``)."""
    if not cfg.train.get("carry_state", False):
        return NO_CARRY
    return Carry(batch_size=int(cfg.train.batch_size), compute_dtype=cfg.train.compute_dtype)


def check_mesh_fits(cfg: ml_collections.ConfigDict, mesh) -> None:
    """The global batch must split evenly over processes and, per micro-batch, over the batch axes.

    Raises:
      ValueError: naming train.batch_size, train.grad_accum and the mesh sizes.
    """
    n = shd.batch_divisor(mesh)
    micro = cfg.train.batch_size // cfg.train.grad_accum
    if cfg.train.batch_size % jax.process_count() or micro % n:
        raise ValueError(
            f"config field train.batch_size={cfg.train.batch_size} with train.grad_accum="
            f"{cfg.train.grad_accum} gives micro-batches of {micro} rows, which must be a multiple "
            f"of mesh data*fsdp = {n} (and the batch a multiple of {jax.process_count()} processes)")


class _StopFlag:
    """Records SIGTERM / SIGINT instead of dying; restores the previous handlers on exit."""

    def __init__(self, log: Log):
        self.signum: int | None = None
        self._log = log
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame):
        del frame
        if self.signum is None:
            self.signum = signum
            again = "a second Ctrl-C" if signum == signal.SIGINT else "Ctrl-C"
            self._log(f"\nreceived {signal.Signals(signum).name}: finishing the current step, then "
                      f"saving a checkpoint ({again} interrupts at once)")
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> "_StopFlag":
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


_terminal_columns = terminal_columns  # (the loop looks it up here, so tests can replace it)
LINE_EVERY_S = 30.0  # without a bar: a progress line at least this often (and every log_every steps)


def _default_log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def train(cfg: ml_collections.ConfigDict, workdir: str | Path, *,
          stop_at_step: int | None = None, log: Log = _default_log,
          progress: bool = True, bad_checkpoint: str = "fallback") -> TrainResult:
    """Train (or resume training) the model of ``cfg`` in ``workdir``.

    Args:
      cfg: the full run config (``titans_lm.config.base_config`` + a backbone's model section).
      workdir: run directory; holds ``checkpoints/``, ``metrics.jsonl`` and ``tb/``.
      stop_at_step: stop (with a checkpoint) once this step is reached, before ``train.steps``.
      log: sink for messages (default: printed above the progress bar).
      progress: show the tqdm progress bar.
      bad_checkpoint: "fallback" (a damaged newest checkpoint is named, moved to
        ``<workdir>/damaged_checkpoints/`` and the previous complete one used) or "refuse".

    Returns:
      a :class:`TrainResult`.

    Raises:
      ValueError: an invalid config (naming the field), or data problems from
        ``titans_lm.data.prepare``.
      FileNotFoundError: a missing data file.
      titans_lm.train.checkpoint.CheckpointError: the workdir's checkpoint is unreadable or was
        written with a different config.
      NonFiniteLossError: the loss became NaN/inf (naming the step).
    """
    check_train_config(cfg)
    cfg = carry_config(cfg)
    workdir = Path(workdir).resolve()
    primary = jax.process_index() == 0
    if not primary:
        log = lambda msg: None  # noqa: E731  (messages, metrics and the bar: process 0 only)
    for warning in schedule_warnings(cfg.optim, cfg.train.steps):
        log(f"warning: {warning}")
    mesh = shd.make_mesh(cfg.mesh)
    check_mesh_fits(cfg, mesh)
    check_process_rows(mesh, cfg.train.batch_size // cfg.train.grad_accum)
    tcfg = cfg.train
    T = int(cfg.data.seq_len)

    task = cfg.data.get("task", "")
    if task:  # a synthetic task (titans_lm.data.tasks): no corpus, no tokenizer
        data = TaskData.from_config(cfg)
    else:
        data = prepare(cfg.data, splits=("train", "validation"), log=log if primary else None)
    fns = model_fns(cfg.model)
    carry = carry_of(cfg)
    log(f"model {cfg.model.name}: {count_params(fns):,} parameters; mesh "
        f"{dict(mesh.shape)} over {mesh.size} {jax.devices()[0].platform} device(s)")
    tx, schedule = make_optimizer(cfg.optim, tcfg.steps)
    if carry.batch_size or cfg.data.get("streamed", False):  # each row reads its documents in order
        it = StreamIterator(data.stores["train"], seq_len=T, batch_size=tcfg.batch_size,
                            seed=cfg.data.shuffle_seed, doc_align=cfg.data.doc_align,
                            shard_index=jax.process_index(), shard_count=jax.process_count())
        log(f"each of the {tcfg.batch_size} rows streams whole documents, window after window; " +
            ("the model state carried from step to step (carry_state, gradient stopped at window "
             "boundaries)" if carry.batch_size else
             "every window starts from the initial state (data.streamed without carry_state)"))
    elif task:
        it = data.train_iterator(seq_len=T, batch_size=tcfg.batch_size, seed=cfg.data.shuffle_seed,
                                 shard_index=jax.process_index(), shard_count=jax.process_count())
    else:
        it = make_train_iterator(data.stores["train"], seq_len=T, batch_size=tcfg.batch_size,
                                 seed=cfg.data.shuffle_seed, doc_align=cfg.data.doc_align,
                                 shard_index=jax.process_index(), shard_count=jax.process_count())

    ckpt = Checkpointer(workdir, keep=tcfg.keep_checkpoints)
    try:
        latest = ckpt.latest_step()
        if latest is not None:
            try:
                ckpt.check_config(cfg, latest)
            except DamagedCheckpointError:
                pass  # named, and skipped for an earlier one, by resume_state below
            if not cfg.data.task:  # a synthetic task has no corpus or tokenizer to check
                check_run_data(workdir, data, cfg.data.corpus, action="resume")
        if primary:  # the checkpoint (if any) fits this config and data: record them
            if not cfg.data.task:
                write_run_data(workdir, data, cfg.data.corpus)
            write_run_config(workdir, cfg)
        if latest is not None:
            if tcfg.get("init_from", ""):
                log(f"train.init_from={tcfg.init_from!r} is not used: this run resumes from its "
                    f"own checkpoint")
            state, it_state, latest = resume_state(ckpt, cfg, abstract_state(fns, tx, mesh, carry),
                                                   bad_checkpoint, log)
            it.set_state(it_state)
        else:
            params = None
            if tcfg.get("init_from", ""):
                params = warm_start_params(tcfg.init_from,
                                           abstract_state(fns, tx, mesh, carry).params, cfg, log)
            state = init_state(cfg.model, fns, tx, mesh, tcfg.seed, carry, params)
        return _run(cfg, workdir, state, it, ckpt, fns, tx, schedule, mesh, data, stop_at_step,
                    log, progress and primary)
    finally:
        ckpt.close()


def resume_state(ckpt: Checkpointer, cfg: ml_collections.ConfigDict, abstract, policy: str,
                 log: Log):
    """``(state, data_iterator_state, step)`` of the newest usable checkpoint (see
    :meth:`Checkpointer.newest_usable`); says which, and names any save that was cut short.

    Raises:
      titans_lm.train.checkpoint.CheckpointError: a config mismatch, a damaged checkpoint with
        policy "refuse", or no usable checkpoint.
    """
    def use(step):
        ckpt.check_config(cfg, step)
        state, it_state, _ = ckpt.restore(abstract, step)
        if it_state is None:
            raise ValueError(f"checkpoint {step} in {ckpt.workdir} holds no data-iterator state")
        return state, it_state
    (state, it_state), step = ckpt.newest_usable(use, policy=policy, log=log, quarantine=True)
    cut = [n for n in ckpt.cut_short() if n.split(".")[0].isdigit() and int(n.split(".")[0]) > step]
    note = (f" (the save of step {cut[-1].split('.')[0]} did not complete: {cut[-1]} is ignored)"
            if cut else "")
    log(f"resuming from the checkpoint at step {step} in {ckpt.directory}{note}")
    return state, it_state, step


def _run(cfg, workdir: Path, state, it: Iterator, ckpt: Checkpointer, fns, tx, schedule, mesh,
         data, stop_at_step: int | None, log: Log, progress: bool) -> TrainResult:
    tcfg = cfg.train
    start = int(jax.device_get(state.step))
    result = TrainResult(status="completed", step=start, workdir=workdir)
    end = tcfg.steps if stop_at_step is None else min(tcfg.steps, stop_at_step)
    if start >= end:
        log(f"nothing to do: the checkpoint is at step {start}, the run ends at step {end}")
        result.status = "completed" if start >= tcfg.steps else "stopped"
        return result

    # From here on SIGTERM / Ctrl-C only raise a flag, checked after each step.
    with _StopFlag(log) as stop:
        return _steps(cfg, state, it, ckpt, fns, tx, schedule, mesh, data, start, end, result,
                      stop, log, progress)


def batch_task_fields(task: str) -> tuple[str, ...]:
    """The batch fields a task adds: ``loss_mask``, and ``targets`` where the targets are not
    the next tokens (MAD)."""
    if not task:
        return ()
    return ("loss_mask", "targets") if task in MAD_TASKS else ("loss_mask",)


def _steps(cfg, state, it: Iterator, ckpt: Checkpointer, fns, tx, schedule, mesh, data,
           start: int, end: int, result: TrainResult, stop: _StopFlag, log: Log,
           progress: bool) -> TrainResult:
    tcfg = cfg.train
    T = int(cfg.data.seq_len)
    state_sh = state_shardings(fns, tx, mesh, carry_of(cfg))
    step_fn = jit_train_step(fns, tx, schedule, state_sh, mesh, grad_accum=tcfg.grad_accum,
                             compute_dtype=tcfg.compute_dtype, remat=cfg.model.get("remat", "none"))
    batch_spec = {k: jax.ShapeDtypeStruct((tcfg.batch_size, T + 1), np.int32,
                                          sharding=shd.batch_sharding(mesh))
                  for k in ("tokens", "segment_ids") + batch_task_fields(cfg.data.get("task", ""))}
    compiled = compile_announced(step_fn, state, batch_spec, log=log,
                                 what=f"train step ({tcfg.batch_size} x {T} tokens)")
    eval_fn = Announced(jit_eval_step(fns, state_sh.params, mesh),
                        f"validation step ({cfg.eval.batch_size} x {T} tokens)", log)
    if cfg.data.get("task"):
        val = data.validation_batches(seq_len=T, batch_size=cfg.eval.batch_size,
                                      n_batches=tcfg.eval_batches, seed=cfg.data.shuffle_seed,
                                      multiple=shd.batch_divisor(mesh))
    else:
        val = validation_batches(data.stores["validation"], seq_len=T,
                                 batch_size=cfg.eval.batch_size, n_batches=tcfg.eval_batches,
                                 multiple=shd.batch_divisor(mesh))

    carried_val = None  # a carry_state run: validation text streamed with the state carried too
    if carry_of(cfg).batch_size and not cfg.data.get("task"):
        mult = shd.batch_divisor(mesh)
        batches = carried_validation_batches(data.stores["validation"], seq_len=T,
                                             batch_size=cfg.eval.batch_size,
                                             n_batches=tcfg.eval_batches, multiple=mult)
        if batches:
            carried_val = (batches, make_carried_validation(fns, state_sh.params, mesh,
                                                            len(batches[0]["tokens"])))

    writer = MetricWriter(result.workdir, resume_step=start, enabled=jax.process_index() == 0,
                          config=cfg.to_dict())
    # A live bar on a terminal; otherwise (logs, pipes, a terminal of zero width) one timestamped
    # line every log_every steps (and the first, and at least every LINE_EVERY_S seconds).
    use_bar = progress and _terminal_columns(sys.stderr) > 0
    bar = tqdm(total=tcfg.steps, initial=start, disable=not use_bar, dynamic_ncols=True,
               mininterval=1.0, unit="step")
    t_start = time.perf_counter()
    tokens_per_step = tcfg.batch_size * T
    step_flops = train_step_flops(cfg.model, T, tcfg.batch_size)
    peak, peak_source = peak_flops(mesh, tcfg.compute_dtype) if step_flops else (0.0, "")
    if step_flops:
        log(f"MFU: {step_flops / 1e9:,.3g} model GFLOP a step against a peak of "
            f"{peak / 1e12:,.3g} TFLOP/s ({peak_source})")
    last_line = {"t": time.perf_counter()}
    last_saved = start if ckpt.latest_step() == start else None
    pending: list = []  # [(step, device metrics)] not yet read back
    peak_memory_norm: dict[int, float] = {}  # the largest memory_norm_i so far (the NaN message)
    clock = {"t": time.perf_counter()}

    def drain() -> None:
        """Read back pending metrics; stop on a non-finite loss; log."""
        while pending:
            s, m = pending.pop(0)
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            if not math.isfinite(m["loss"]):
                good = ckpt.latest_step()
                where = (f"the last good checkpoint (step {good}) is kept in {ckpt.directory}"
                         if good is not None else "no checkpoint was written")
                raise NonFiniteLossError(
                    f"non-finite loss ({m['loss']}) at step {s}; training stopped and this state "
                    f"was not saved; {where}. {likely_cause(m, peak_memory_norm)}")
            for i, v in memory_norms(m).items():
                peak_memory_norm[i] = max(peak_memory_norm.get(i, 0.0), v)
            now = time.perf_counter()
            tps = tokens_per_step / max(now - clock["t"], 1e-9)
            clock["t"] = now
            result.losses[s] = m["loss"]
            extra = {"tokens_per_sec": tps, "tokens_seen": float(s * tokens_per_step)}
            if step_flops:
                extra["mfu"] = step_flops * tps / tokens_per_step / peak
            # The postfix first: update() redraws, and the bar must show step s with s's loss.
            bar.set_postfix(loss=f"{m['loss']:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
            due = s % tcfg.log_every == 0 or s == end or s == start + 1
            if due:
                writer.write(s, {**m, **extra}, "train")
            if progress and not use_bar and (due or now - last_line["t"] >= LINE_EVERY_S):
                last_line["t"] = now
                rate = (now - t_start) / max(s - start, 1)
                mfu = f", MFU {extra['mfu']:.1%}" if "mfu" in extra else ""
                log(f"{timestamp()} step {s}/{tcfg.steps}: loss {m['loss']:.4f}, "
                    f"{tps:,.0f} tokens/s{mfu}, lr {m['lr']:.3g}, "
                    f"{s * tokens_per_step:,} tokens seen, ETA {hms(rate * (tcfg.steps - s))}")

    def validate_now(s: int) -> None:
        nll, n = 0.0, 0.0
        t_first = time.perf_counter()
        for i, b in enumerate(val):  # the first call compiles the step (announced)
            a, c = eval_fn(state.params, shd.put_global_batch(b, mesh))
            nll, n = nll + float(a), n + float(c)
            if i == 0:
                t_first = time.perf_counter()
        loss = nll / max(n, 1.0)
        result.val_losses[s] = loss
        sec = time.perf_counter() - t_first
        rec = {"val_loss": loss, "val_ppl": math.exp(min(loss, 700.0))}
        if sec > 0 and len(val) > 1:  # the windows of the batches after the first, per second
            rec["val_tokens_per_sec"] = (len(val) - 1) * len(val[0]["tokens"]) * T / sec
        line = (f"step {s}: validation loss {loss:.4f} (ppl {math.exp(min(loss, 700.0)):.2f}) "
                f"on {int(n):,} tokens")
        if carried_val is not None:
            c_nll, c_n = carried_val[1](state.params, carried_val[0],
                                        lambda b: shd.put_global_batch(b, mesh))
            carried = c_nll / max(c_n, 1.0)
            result.val_losses_carried[s] = carried
            rec.update(val_loss_carried=carried, val_ppl_carried=math.exp(min(carried, 700.0)))
            line += (f"; carried windows {carried:.4f} (ppl {math.exp(min(carried, 700.0)):.2f}) "
                     f"on {int(c_n):,} tokens")
        writer.write(s, rec, "val")
        log(line)

    def save(s: int) -> None:
        nonlocal last_saved
        if last_saved != s:
            ckpt.save(s, state, it.get_state(), cfg)
            last_saved = s

    try:
        for s in range(start + 1, end + 1):
            batch = shd.put_batch(next(it), mesh)
            state, metrics = compiled(state, batch)
            drain()  # the previous step's metrics, while this one runs
            pending.append((s, metrics))
            due_ckpt = s % tcfg.ckpt_every == 0 or s == end or stop.signum is not None
            if due_ckpt or s % tcfg.eval_every == 0:
                drain()
            if s % tcfg.eval_every == 0 or s == tcfg.steps:
                validate_now(s)
            if due_ckpt:
                save(s)
            if due_ckpt or s % tcfg.eval_every == 0:
                clock["t"] = time.perf_counter()  # throughput excludes evaluation and saving
            result.step = s
            if stop.signum is not None:
                ckpt.wait()
                result.status, result.signal = "interrupted", stop.signum
                log(f"stopped by {signal.Signals(stop.signum).name} at step {s}; checkpoint "
                    f"saved in {ckpt.directory}. Run the same command again to resume.")
                break
        else:
            drain()
            save(end)
            ckpt.wait()
            if end < tcfg.steps:
                result.status = "stopped"
                log(f"stopped at step {end} as asked; checkpoint saved in {ckpt.directory}")
    finally:
        bar.close()
        writer.close()
        ckpt.wait()
    return result
