"""Task accuracy of a run trained on a synthetic task (``titans_lm.data.tasks``).

Accuracy is measured on the answer positions of each row (``loss_mask``), teacher-forced: the
prediction at an answer is the argmax of the logits given the true prefix.

- ``token_acc``: the fraction of answer tokens predicted exactly (MQAR: accuracy per query, the
  metric of Zoology).
- ``exact_match``: the fraction of rows whose answer tokens are all right (S-NIAH: RULER's exact
  match of the value; with teacher forcing, all answer tokens right is exactly what greedy
  decoding of the answer would produce).
- ``mad_acc`` (MAD tasks): MAD's accuracy, macro-averaged over classes (``titans_lm.eval.mad``);
  a MAD row's ``targets`` field holds its targets (not always the next input).

How a row longer than one model call is run (``context``):

- ``"reset"``: cut into consecutive windows of the training length ``T``, each scored as a fresh
  sequence (today's evaluation protocol, ``titans_lm.data.windows``): nothing carries across a
  window boundary, so a query can only use what lies in its own window.
- ``"whole"``: one parallel call over the whole row (the stateless training path at a longer
  length; attention's cost grows with the square of it).
- ``"carry"``: consecutive windows of ``T`` with the model state carried (the stateful API:
  ``init_state(params, B)``, ``apply(params, tokens_BT, segment_ids_BT, state) -> (logits,
  state)``), one
  pass in constant memory, equal to ``"whole"`` for every backbone whose stateful call matches its
  parallel form.

The drivers take a window-level function, so they are independent of the backbone:
:func:`reset_predictions` / :func:`whole_predictions` take ``predict(inputs_BT, segment_ids_BT)
-> int[B, T]``, :func:`carry_predictions` takes the stateful API and the parameters.

Outputs of :func:`evaluate_task`, named like the perplexity results (``titans_lm.eval.results``)
so that another checkpoint step, context or length limit never replaces them:
``<workdir>/task_<context>_step<N>[_upto<L>].json`` (one record per setting), the same name in
``.md`` (the table) and ``.png`` (the heat map); ``_upto<L>``: only lengths up to ``max_length``.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from titans_lm.config.overrides import result_suffix
from titans_lm.data.tasks import MAD_TASKS, eval_settings, task_rows, task_spec
from titans_lm.eval.mad import class_counts, macro_accuracy
from titans_lm.eval.exported import is_export, read_config as read_export_config
from titans_lm.eval.restore import load_run
from titans_lm.eval.streaming import stream_init_fn
from titans_lm.train.checkpoint import Checkpointer, CheckpointError
from titans_lm.train.plot import heat_map
from titans_lm.train.state import model_fns

Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]
CONTEXTS = ("reset", "whole", "carry")


def answer_accuracy(predictions_BL: np.ndarray, batch: dict[str, np.ndarray]) -> dict[str, float]:
    """Counts of right answers.

    Args:
      predictions_BL: int[B, L], the predicted next token at each input position.
      batch: ``{"tokens": int[B, L+1], "loss_mask": int[B, L+1]}``.

    Returns:
      ``{"n_rows", "n_answers", "correct_tokens", "correct_rows", "token_acc", "exact_match"}``.

    Raises:
      ValueError: shapes that do not match.
    """
    tokens, mask = np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"])
    targets = np.asarray(batch.get("targets", tokens))  # MAD: targets that are not the next input
    preds = np.asarray(predictions_BL)
    if preds.shape != (tokens.shape[0], tokens.shape[1] - 1) or mask.shape != tokens.shape:
        raise ValueError(f"predictions {preds.shape} do not match tokens {tokens.shape} / "
                         f"loss_mask {mask.shape}: expected [B, L] with [B, L+1]")
    m = mask[:, 1:] != 0
    right = (preds == targets[:, 1:]) & m
    n_ans, n_right = int(m.sum()), int(right.sum())
    rows = int(np.all(right | ~m, axis=1).sum())
    return {"n_rows": int(tokens.shape[0]), "n_answers": n_ans, "correct_tokens": n_right,
            "correct_rows": rows, "token_acc": n_right / max(n_ans, 1),
            "exact_match": rows / max(int(tokens.shape[0]), 1)}


def reset_predictions(predict: Predict, inputs_BL: np.ndarray, segment_ids_BL: np.ndarray,
                      window: int) -> np.ndarray:
    """Predictions with each window of ``window`` inputs run on its own (``context="reset"``).

    The last window is padded to ``window`` with PAD / segment 0 (one compiled shape); the
    padding's predictions are dropped. Returns int32[B, L].
    """
    B, L = inputs_BL.shape
    out = np.zeros((B, L), np.int32)
    for s in range(0, L, window):
        x, g = inputs_BL[:, s:s + window], segment_ids_BL[:, s:s + window]
        n = x.shape[1]
        if n < window:
            x = np.pad(x, ((0, 0), (0, window - n)))
            g = np.pad(g, ((0, 0), (0, window - n)))
        out[:, s:s + n] = np.asarray(predict(x, g))[:, :n]
    return out


def whole_predictions(predict: Predict, inputs_BL: np.ndarray, segment_ids_BL: np.ndarray,
                      window: int | None = None) -> np.ndarray:
    """Predictions of one call over the whole row (``context="whole"``). Returns int32[B, L]."""
    del window
    return np.asarray(predict(inputs_BL, segment_ids_BL)).astype(np.int32)


def carry_predictions(model: Any, inputs_BL: np.ndarray, segment_ids_BL: np.ndarray,
                      window: int) -> np.ndarray:
    """Predictions streaming windows of ``window`` inputs with the state carried
    (``context="carry"``), by the stateful API over parameters: ``model = (stateful, params)``,
    ``state = stateful.init_state(params, B)``, then for each window ``logits_BTV, state =
    stateful.apply(params, tokens_BT, segment_ids_BT, state)`` (``titans_lm.train.state.ModelFns``
    or its jitted calls).

    The last window is passed at its own (shorter) length, so no padding enters the state.
    Returns int32[B, L] (argmax of the logits).

    Raises:
      ValueError: a model without ``init_state`` (a build without the stateful API).
    """
    stateful, params = model if isinstance(model, tuple) and len(model) == 2 else (model, None)
    if not (hasattr(stateful, "init_state") and hasattr(stateful, "apply")):
        raise ValueError("context 'carry' needs a model with the stateful API "
                         "(init_state(params, B) and apply(params, tokens, segment_ids, state) -> "
                         "(logits, state)); this model has none: use context 'reset' or 'whole'")
    B, L = inputs_BL.shape
    state = stateful.init_state(params, B)
    out = np.zeros((B, L), np.int32)
    for s in range(0, L, window):
        logits, state = stateful.apply(params, inputs_BL[:, s:s + window],
                                       segment_ids_BL[:, s:s + window], state)
        out[:, s:s + window] = np.argmax(np.asarray(logits), axis=-1)
    return out


def task_accuracy(run: Callable[..., np.ndarray], fn: Any, batches: Sequence[dict[str, np.ndarray]],
                  window: int, num_classes: int | None = None) -> dict[str, float]:
    """Accuracy summed over ``batches`` with the driver ``run`` (one of the three above) and its
    window-level ``fn``; same keys as :func:`answer_accuracy`, and with ``num_classes`` (MAD)
    ``mad_acc``, MAD's macro-averaged accuracy (:mod:`titans_lm.eval.mad`)."""
    tot = {"n_rows": 0, "n_answers": 0, "correct_tokens": 0, "correct_rows": 0}
    counts = None if num_classes is None else np.zeros((3, num_classes), np.int64)
    for b in batches:
        preds = run(fn, b["tokens"][:, :-1], b["segment_ids"][:, :-1], window)
        a = answer_accuracy(preds, b)
        for k in tot:
            tot[k] += a[k]
        if counts is not None:
            counts += class_counts(preds, b.get("targets", b["tokens"])[:, 1:],
                                   b["loss_mask"][:, 1:] != 0, num_classes)
    tot["token_acc"] = tot["correct_tokens"] / max(tot["n_answers"], 1)
    tot["exact_match"] = tot["correct_rows"] / max(tot["n_rows"], 1)
    if counts is not None:
        tot["mad_acc"] = macro_accuracy(counts)
    return tot


DRIVERS = {"reset": reset_predictions, "whole": whole_predictions, "carry": carry_predictions}


# -------------------------------------------------------------------------------- tables, plots

def _col_key(r: dict) -> str:
    if "setting" in r:
        return str(r["setting"])
    return f"{r['pairs']} pairs" if "pairs" in r else f"depth {r['depth']:g}%"


def _grid(records: Sequence[dict]) -> tuple[list[str], list[str], dict]:
    """(row labels, column labels, {(row, col): record}): S-NIAH rows are depths and columns
    lengths; MQAR (one pair count per length) has one row and columns "length (pairs)"."""
    if records and "pairs" in records[0]:
        cols = [f"{r['length']} ({r['pairs']} pairs)" for r in records]
        return ["MQAR"], cols, {("MQAR", c): r for c, r in zip(cols, records)}
    lengths = sorted({r["length"] for r in records})
    rows = list(dict.fromkeys(_col_key(r) for r in records))
    return rows, [str(x) for x in lengths], {(_col_key(r), str(r["length"])): r for r in records}


def format_task_table(records: Sequence[dict], metric: str = "token_acc", title: str = "") -> str:
    """Markdown table of ``metric`` (in %): S-NIAH one row per depth and one column per length;
    MQAR one row with a column per (length, pairs); a MAD task one row per setting."""
    rows, cols, cell = _grid(records)
    label = ("task" if rows == ["MQAR"] else
             "setting" if records and "setting" in records[0] else "depth")
    lines = ([title, ""] if title else []) + [
        f"| {label} | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        vals = [cell.get((r, c)) for c in cols]
        lines.append(f"| {r} | " + " | ".join(f"{100 * v[metric]:.1f}" if v else "" for v in vals)
                     + " |")
    return "\n".join(lines) + "\n"


def plot_task_heatmap(records: Sequence[dict], path: str | Path, metric: str = "token_acc",
                      title: str = "") -> Path:
    """A PNG heat map of ``metric`` in % (S-NIAH: depth x length; MQAR: one row by length)."""
    rows, cols, cell = _grid(records)
    grid = np.full((len(rows), len(cols)), np.nan)
    for (r, c), rec in cell.items():
        grid[rows.index(r), cols.index(c)] = 100.0 * rec[metric]
    return heat_map(path, grid, rows, cols, title, xlabel="sequence length (tokens)",
                    colorbar_label=f"{metric} (%)")


# ---------------------------------------------------------------------------------- evaluation

def is_task_run(workdir: str | Path, step: int | None = None) -> bool:
    """Whether the run in ``workdir`` was trained on a synthetic task (``data.task`` set).

    Every checkpoint of a run holds the same data section (resuming refuses a changed one), so
    without ``step`` the newest checkpoint whose config reads answers: a damaged newest one is
    left for the loader to name and fall back from, or refuse.

    Raises:
      titans_lm.train.checkpoint.CheckpointError: no checkpoint (or none for ``step``), or
        ``step``'s config cannot be read.
    """
    if is_export(workdir):
        return bool(read_export_config(workdir).data.get("task", ""))
    ckpt = Checkpointer(Path(workdir).resolve(), read_only=True)
    try:
        candidates = [ckpt.resolve_step(step)] if step is not None else ckpt.steps()[::-1]
        for i, s in enumerate(candidates):
            try:
                return bool(ckpt.read_config(s).data.get("task", ""))
            except CheckpointError:
                if i + 1 == len(candidates):
                    raise
        raise CheckpointError(f"no checkpoints in {ckpt.directory}")
    finally:
        ckpt.close()


def eval_batches_for(cfg, setting: dict, *, n_examples: int, batch_size: int
                     ) -> list[dict[str, np.ndarray]]:
    """The fixed evaluation rows of one setting (split "test", seeded by ``data.shuffle_seed``
    and the setting), in batches of ``batch_size`` (the last one may be smaller)."""
    spec = task_spec(cfg)
    index = (setting["length"], setting.get("pairs", 0), int(round(10 * setting.get("depth", 0))))
    rows = task_rows(spec, "test", cfg.data.shuffle_seed, index, n_examples, setting["length"],
                     num_pairs=setting.get("pairs"), depth=setting.get("depth"))
    return [{k: v[i:i + batch_size] for k, v in rows.items()}
            for i in range(0, n_examples, batch_size)]


def evaluate_task(workdir: str | Path, step: int | None = None, *,
                  context: str | Sequence[str] | None = None, max_length: int | None = None,
                  log: Callable[[str], None] = print, overrides: dict[str, str] | None = None,
                  bad_checkpoint: str = "fallback") -> list[dict[str, Any]]:
    """Task accuracy of the run in ``workdir`` over its config's evaluation grid.

    The checkpoint is restored once, by :func:`titans_lm.eval.restore.load_run`, as for
    perplexity: the saved config with ``overrides`` applied and validated, a damaged newest
    checkpoint named and the previous complete one used (``bad_checkpoint="fallback"``).

    Args:
      workdir: a run trained with ``data.task`` set.
      step: the checkpoint (default: the newest).
      context: "reset", "whole" or "carry", or a sequence of them (each scored in turn; default:
        the config's ``task.eval_context``). In "reset" and "carry", full attention
        (Transformer++) keeps ``model.max_context`` tokens, the training length unless set
        (:func:`titans_lm.train.max_context.with_max_context`): carry streams through a KV cache of
        that many tokens. "whole" attends over the whole row.
      max_length: skip settings longer than this (e.g. "whole" attention at 16K on a CPU).
      log: message sink.
      overrides: ``{field: value text}`` applied to the checkpoint's config
        (:func:`titans_lm.config.overrides.apply_eval_overrides`).
      bad_checkpoint: "fallback" or "refuse" (:func:`titans_lm.eval.restore.load_run`).

    Returns:
      one record per setting and context (``length``, ``pairs`` or ``depth``, ``context`` and the
      counts and rates of :func:`answer_accuracy`), also written per context to
      ``<workdir>/task_<context>_step<N>[_upto<L>].json`` with the table (``.md``) and heat map
      (``.png``) of the same name (module docstring).

    Raises:
      ValueError: an unknown context, an override evaluation cannot apply, or "carry" with a
        model that has no stateful API.
      titans_lm.train.checkpoint.CheckpointError: no (or an unreadable) checkpoint.
    """
    contexts = [context] if context is None or isinstance(context, str) else list(context)
    for c in contexts:
        if c is not None and c not in CONTEXTS:
            raise ValueError(f"unknown context {c!r}; valid: {', '.join(CONTEXTS)}")
    workdir = Path(workdir).resolve()
    run = load_run(workdir, step, overrides=overrides, bad_checkpoint=bad_checkpoint,
                   log=lambda m: log(m) if jax.process_index() == 0 else None)
    default = run.cfg.task.get("eval_context", "reset")
    if default not in CONTEXTS:
        raise ValueError(f"task.eval_context {default!r} is not a context; valid: "
                         f"{', '.join(CONTEXTS)}")
    suffix = result_suffix(overrides or {}, run.saved_cfg)
    records = []
    for c in contexts:
        records += _evaluate_context(run, c or default, workdir, max_length, log, suffix)
    return records


def task_result_stem(context: str, step: int, max_length: int | None = None,
                     suffix: str = "") -> str:
    """``task_<context>_step<step>[_upto<max_length>]<suffix>``: the result files' name without
    extension; ``suffix`` tells eval-time overrides apart
    (:func:`titans_lm.config.overrides.result_suffix`)."""
    return (f"task_{context}_step{int(step)}" + ("" if max_length is None else f"_upto{max_length}")
            + suffix)


def answer_loss(workdir: str | Path, step: int | None = None, *,
                overrides: dict[str, str] | None = None) -> dict[str, float]:
    """Mean NLL (nats) of the answer tokens (``loss_mask``) of the evaluation rows at the training
    length ``data.seq_len``, one call per batch from the initial state, over every setting of
    the task's evaluation grid at that length (S-NIAH: each depth); the loss the task trains.

    Returns ``{"answer_loss", "n_answers"}`` (``answer_loss`` None when no setting has the
    training length).

    Raises:
      as :func:`evaluate_task`.
    """
    run = load_run(Path(workdir).resolve(), step, overrides=overrides)
    cfg, fns, params = run.cfg, run.fns, run.params
    T = int(cfg.data.seq_len)

    @jax.jit
    def nll(tokens, segment_ids, mask):
        logits = fns.apply(params, tokens[:, :-1], segment_ids[:, :-1],
                           fns.init_state(params, tokens.shape[0]))[0]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        target = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        m = mask[:, 1:] != 0
        return -jnp.sum(jnp.where(m, target, 0.0)), jnp.sum(m)

    total, count = 0.0, 0
    for setting in eval_settings(cfg):
        if setting["length"] != T:
            continue
        for b in eval_batches_for(cfg, setting, n_examples=int(cfg.task.get("eval_examples", 64)),
                                  batch_size=int(cfg.task.get("eval_batch_size", 16))):
            a, c = nll(b["tokens"], b["segment_ids"], b["loss_mask"])
            total, count = total + float(a), count + int(c)
    return {"answer_loss": total / count if count else None, "n_answers": count}


def _evaluate_context(run: Any, context: str, workdir: Path, max_length: int | None,
                      log: Callable[[str], None], suffix: str = "") -> list[dict[str, Any]]:
    """:func:`evaluate_task` of one context on a restored run (``LoadedRun``)."""
    cfg, fns, params, step = run.cfg, run.fns, run.params, run.step
    if context == "whole" and "max_context" in cfg.model:
        # one call over the whole row: full attention unbounded unless the saved config bounds it
        # (the field changes no parameter, so the restored ones serve the rebuilt model)
        cfg = ml_collections.ConfigDict(cfg.to_dict())
        cfg.model.max_context = int(run.saved_cfg.model.get("max_context", 0) or 0)
        fns = model_fns(cfg.model)
    window = int(cfg.data.seq_len)
    if context == "carry":
        # one compiled program per window length (stream_init_fn: no fresh mark)
        fn = (types.SimpleNamespace(init_state=stream_init_fn(fns), apply=jax.jit(fns.apply)),
              params)
    else:
        fn = jax.jit(lambda x, g: jnp.argmax(
            fns.apply(params, x, g, fns.init_state(params, x.shape[0]))[0], axis=-1))
    n_examples = int(cfg.task.get("eval_examples", 64))
    batch_size = int(cfg.task.get("eval_batch_size", 16))
    records = []
    for setting in eval_settings(cfg):
        if max_length is not None and setting["length"] > max_length:
            continue
        batches = eval_batches_for(cfg, setting, n_examples=n_examples, batch_size=batch_size)
        mad = cfg.data.task in MAD_TASKS
        acc = task_accuracy(DRIVERS[context], fn, batches, window,
                            int(cfg.data.vocab_size) if mad else None)
        rec = {**setting, "context": context, "task": cfg.data.task,
               "variant": cfg.task.get("variant", "") if cfg.data.task == "niah" else "",
               "model_name": cfg.model.name, "window": window, "step": step, **acc}
        records.append(rec)
        log(f"{cfg.data.task} length {setting['length']} {_col_key(setting)} ({context}): "
            f"token acc {100 * acc['token_acc']:.1f}%, exact match {100 * acc['exact_match']:.1f}%")
    title = (f"{cfg.data.task} {cfg.task.get('variant', '') if cfg.data.task == 'niah' else ''} "
             f"{cfg.model.name} step {step}, context {context} (training window {window})")
    metric = ("token_acc" if cfg.data.task == "mqar" else
              "mad_acc" if cfg.data.task in MAD_TASKS else "exact_match")
    if jax.process_index() == 0 and records:
        stem = workdir / task_result_stem(context, step, max_length, suffix)
        stem.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
        table = format_task_table(records, metric, f"{title}: {metric} (%)")
        stem.with_suffix(".md").write_text(table)
        plot_task_heatmap(records, stem.with_suffix(".png"), metric, title)
        log(table)
        log(f"wrote {stem}.json, .md and .png")
    return records
