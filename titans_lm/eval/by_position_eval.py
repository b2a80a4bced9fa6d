"""Loss by position over whole documents (and the carry run of the memory ablation probe).

``titans-lm eval --by_position`` (:func:`evaluate_by_position`): every document of the held-out
split is scored token by token and each loss is kept with the within-document position of its
*input* token (position ``p`` predicts document token ``p + 1`` after reading tokens ``0..p``;
position 0 is BOS). The losses go into the log-spaced buckets of
:func:`titans_lm.eval.by_position.loss_by_position`, whose sums add up to the run's total loss
(the same tokens and the same windows as ``titans_lm.eval.evaluate``; see
``titans_lm.data.windows``):

* ``carry``: documents streamed window after window with the model state carried
  (``titans_lm.eval.streaming``), so positions run to each document's end with the whole
  document behind them (a memory model's weights; Transformer++'s sliding KV cache of
  ``max_context`` tokens);
* ``reset``: the same windows, each from the initial state, so a token at position ``p`` sees
  only the ``p mod T`` tokens of its window (the training protocol's curve: flat beyond ``T``).

Files: ``<workdir>/by_position_<key>_<mode>.json`` (one per mode) and
``<workdir>/by_position_<key>.png`` (one curve per mode), where ``<key>`` is
``<dataset>_step<N>[_docs<M>][_tokens<K>]`` (as the perplexity results,
``titans_lm.eval.results``: the checkpoint step, the document limit ``eval.max_docs`` when it cut
the set short, ``max_tokens`` when set), so another step or limit never replaces a result;
``titans-lm plot --by_position`` draws several runs on one figure.

The memory ablation probe (``titans-lm eval --ablate_at=P``) runs here too: the carry run again,
with the memories reset at a window boundary (``titans_lm.eval.ablation``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.config.overrides import result_suffix
from titans_lm.data.prepare import prepare, tokenize_documents
from titans_lm.data.tokenizer import Tokenizer
from titans_lm.data.windows import document_windows, num_windows
from titans_lm.eval.ablation import (ablate_memory, ablation_summary, ablation_window,
                                     check_has_memory, format_ablation)
from titans_lm.eval.by_position import loss_by_position, plot_by_position, write_by_position
from titans_lm.eval.evaluate import _datasets, context_modes
from titans_lm.eval.restore import load_run
from titans_lm.eval.streaming import assign_rows, stream_batches, stream_init_fn, stream_rows
from titans_lm.progress import Progress
from titans_lm.train import sharding as shd
from titans_lm.train.run_files import check_run_data
from titans_lm.train.state import ModelFns

Log = Callable[[str], None]


def token_losses(logits_BTV: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
    """Per-target losses of one batch: ``(nll_BT, weight_BT)``, float (nats) and bool [B, T].

    The same targets, weights and float32/float64 log-softmax as
    :func:`titans_lm.eval.perplexity.score_batch` (whose ``nll_sum`` is ``sum(nll_BT)``; the
    losses of unscored targets are 0).
    """
    targets_BT = jnp.asarray(batch["tokens"])[:, 1:]
    segs = jnp.asarray(batch["segment_ids"])
    weight_BT = (segs[:, 1:] == segs[:, :-1]) & (segs[:, 1:] != 0)
    logp_BTV = jax.nn.log_softmax(
        logits_BTV.astype(jnp.promote_types(logits_BTV.dtype, jnp.float32)), axis=-1)
    nll_BT = -jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return jnp.where(weight_BT, nll_BT, 0.0), weight_BT


def make_position_step(fns: ModelFns) -> tuple[Callable, Callable]:
    """``(init_fn, step_fn)``, jitted: ``step_fn(params, state, batch) -> (nll_BT, weight_BT,
    state)`` runs one window batch of :func:`stream_position_batches` from ``state``, first
    resetting the memories of the rows whose ``batch["ablate"]`` (bool [B]) is set
    (:func:`titans_lm.eval.ablation.ablate_memory`, from the current parameters; with no row set
    the state is unchanged). ``init_fn``: :func:`titans_lm.eval.streaming.stream_init_fn`."""
    def step(params, state, batch):
        if "ablate" in batch:
            state = ablate_memory(fns, params, state, batch["ablate"])
        logits, state = fns.apply(params, batch["tokens"][:, :-1], batch["segment_ids"][:, :-1],
                                  state)
        nll, w = token_losses(logits, batch)
        return nll, w, state
    return stream_init_fn(fns), jax.jit(step, donate_argnums=1)


def stream_position_batches(docs_tokens: Sequence[np.ndarray], *, seq_len: int, n_rows: int
                            ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]]:
    """:func:`titans_lm.eval.streaming.stream_batches` with each row's window index.

    Yields:
      ``(batch, window_B, positions_BT)``: the carry batch; int64 [B] the window index of each
      row's window within its document (-1 for padding rows); int64 [B, T] the within-document
      position of each input token (``window * T + j``).
    """
    prev = np.zeros(n_rows, np.int64)
    window = np.full(n_rows, -1, np.int64)
    for batch in stream_batches(docs_tokens, seq_len=seq_len, n_rows=n_rows):
        seg0 = batch["segment_ids"][:, 0].astype(np.int64)
        window = np.where(seg0 == 0, -1, np.where((seg0 == prev) & (window >= 0), window + 1, 0))
        prev = seg0
        positions = np.maximum(window, 0)[:, None] * seq_len + np.arange(seq_len)[None, :]
        yield batch, window, positions


def carry_losses(init_fn: Callable, step_fn: Callable, params: Any,
                 docs_tokens: Sequence[np.ndarray], *, seq_len: int, batch_size: int, mesh,
                 ablate_at: int | None = None, baseline_of_ablation: bool = False,
                 progress: bool = False, desc: str = "", norms_fn: Callable | None = None,
                 norms_out: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-token losses of the carry run: ``(losses, positions)``, float64 / int64 [N] over every
    scored token (N = the run's token count).

    Args:
      init_fn, step_fn: from :func:`make_position_step`.
      ablate_at: reset the memories at the window boundary ``ceil(P / T) * T`` of each document
        (None: no ablation).
      baseline_of_ablation: with ``ablate_at`` None, still pass the step an (all-False)
        ``ablate`` row mask, so that this unablated run executes the ablated run's own compiled
        program: its losses before P then equal the ablated run's bit for bit (two programs may
        round differently, by an ulp).
      norms_fn, norms_out: with both, after every window batch append
        ``(tokens, norms)`` to ``norms_out``: tokens = the furthest window end of the batch,
        norms = float [n_memories] of ``norms_fn(params, state)`` (``ModelFns.memory_norms``:
        each memory's ||P|| / ||W0||, max over rows and heads).
    """
    n_rows = stream_rows(len(docs_tokens), batch_size, mesh)
    _, n_steps = assign_rows([num_windows(len(t), seq_len) for t in docs_tokens], n_rows)
    w_abl = None if ablate_at is None else ablation_window(ablate_at, seq_len)
    state = init_fn(params, n_rows)
    losses, positions = [], []
    with Progress(n_steps, desc, "window", enabled=progress) as bar:
        for batch, window, pos in stream_position_batches(docs_tokens, seq_len=seq_len,
                                                          n_rows=n_rows):
            if w_abl is not None or baseline_of_ablation:
                batch = {**batch, "ablate": (np.zeros(window.shape, bool) if w_abl is None
                                             else window == w_abl)}
            nll, w, state = step_fn(params, state, shd.put_global_batch(batch, mesh))
            if norms_fn is not None and norms_out is not None:
                norms_out.append((int(window.max() + 1) * seq_len,
                                  [float(n) for n in norms_fn(params, state)]))
            w = np.asarray(w)
            losses.append(np.asarray(nll, np.float64)[w])
            positions.append(pos[w])
            bar.update(1)
    return np.concatenate(losses or [np.zeros(0)]), np.concatenate(positions or [np.zeros(0, int)])


def make_reset_losses_fn(fns) -> Callable:
    """Jitted ``(params, batch) -> (nll_BT, weight_BT)`` from the initial state."""
    def f(params, batch):
        tokens, seg = batch["tokens"][:, :-1], batch["segment_ids"][:, :-1]
        logits, _ = fns.apply(params, tokens, seg, fns.init_state(params, tokens.shape[0]))
        return token_losses(logits, batch)
    return jax.jit(f)


def reset_losses(loss_fn: Callable, params: Any, docs_tokens: Sequence[np.ndarray], *,
                 seq_len: int, batch_size: int, mesh, progress: bool = False, desc: str = ""
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-token losses of the reset run (every window from the initial state), as
    :func:`carry_losses`; ``loss_fn`` from :func:`make_reset_losses_fn`."""
    bsz = -(-int(batch_size) // shd.batch_divisor(mesh)) * shd.batch_divisor(mesh)
    rows = []  # (tokens, segs, positions) per window
    for d, t in enumerate(docs_tokens):
        if len(t) < 2:
            continue
        tok, seg = document_windows(t, seq_len, segment_id=d + 1)
        for w in range(len(tok)):
            rows.append((tok[w], seg[w], w * seq_len + np.arange(seq_len)))
    losses, positions = [], []
    bar = Progress(-(-len(rows) // bsz), desc, "batch", enabled=progress)
    for i in range(0, len(rows), bsz):
        chunk = rows[i:i + bsz]
        pad = bsz - len(chunk)
        tok = np.stack([r[0] for r in chunk] + [np.zeros(seq_len + 1, np.int32)] * pad)
        seg = np.stack([r[1] for r in chunk] + [np.zeros(seq_len + 1, np.int32)] * pad)
        pos = np.stack([r[2] for r in chunk] + [np.zeros(seq_len, np.int64)] * pad)
        nll, w = loss_fn(params, shd.put_global_batch({"tokens": tok, "segment_ids": seg}, mesh))
        w = np.asarray(w)
        losses.append(np.asarray(nll, np.float64)[w])
        positions.append(pos[w])
        bar.update(1)
    bar.close()
    return np.concatenate(losses or [np.zeros(0)]), np.concatenate(positions or [np.zeros(0, int)])


def evaluate_by_position(workdir: str | Path, split: str = "test", step: int | None = None, *,
                         text_file: str | None = None,
                         context: str = "carry", by_position: bool = True,
                         ablate_at: int | None = None, max_tokens: int = 0,
                         overrides: dict[str, str] | None = None, log: Log = print,
                         progress: bool = True) -> dict[str, Any]:
    """Loss by position (and the memory ablation) of a trained run on its held-out split.

    Args:
      workdir, split, step, text_file, overrides: as :func:`titans_lm.eval.evaluate.evaluate`
        (the corpus's held-out ``split``, or the one document of ``text_file``; no WikiText;
        ``eval.max_docs`` limits the documents).
      context: "carry", "reset" or "both": the curves to compute.
      by_position: write the by-position JSON and PNG.
      ablate_at: also run the memory ablation probe from this position (carry mode).
      max_tokens: score only the first ``max_tokens`` tokens of each document (0: all).

    Returns:
      ``{"by_position": {mode: result}, "ablation": summary or None, "files": [...]}``.

    Raises:
      ValueError: a bad context or ``ablate_at``, or a model the ablation cannot apply to;
        CheckpointError: no checkpoint (see :func:`titans_lm.eval.restore.load_run`).
    """
    modes = context_modes(context)
    if ablate_at is not None:
        ablation_window(ablate_at, 1)
    workdir = Path(workdir).resolve()
    run = load_run(workdir, step, overrides=overrides)
    cfg, mesh = run.cfg, run.mesh
    suffix = result_suffix(overrides or {}, run.saved_cfg)
    exported_tok = Tokenizer.load(run.tokenizer_file) if run.tokenizer_file else None
    prepared = prepare(cfg.data, tokenizer=exported_tok, splits=("train",), log=None,
                       check_windows=False)
    check_run_data(workdir, prepared, cfg.data.corpus, action="evaluate")
    name, _, _, docs = _datasets(cfg, split, text_file, False)[0]
    name += suffix
    max_docs = int(cfg.eval.get("max_docs", 0) or 0)
    limit = max_docs if 0 < max_docs < len(docs) else 0
    docs = docs[:limit] if limit else docs
    key = (f"{name}_step{run.step}" + (f"_docs{limit}" if limit else "")
           + (f"_tokens{int(max_tokens)}" if max_tokens else ""))
    toks = tokenize_documents(prepared.tokenizer, docs)
    if max_tokens:
        toks = [t[:int(max_tokens) + 1] for t in toks]
    seq_len, bsz = int(cfg.data.seq_len), int(cfg.eval.batch_size)
    if ablate_at is not None:  # refuse a model without a memory before any scoring
        check_has_memory(run.fns, run.params)
    if progress:
        print(f"by position: {name}, {len(toks)} document(s), {sum(len(t) - 1 for t in toks):,} "
              f"tokens in windows of {seq_len}", file=sys.stderr, flush=True)
    carry_fns = make_position_step(run.fns) if ("carry" in modes or ablate_at is not None) else None
    kw = dict(seq_len=seq_len, batch_size=bsz, mesh=mesh, progress=progress)
    base_kw = dict(kw, baseline_of_ablation=ablate_at is not None)
    runs, results, files, seconds, norms = {}, {}, [], {}, []
    for mode in modes if by_position else (("carry",) if ablate_at is not None else ()):
        t0 = time.perf_counter()
        if mode == "carry":
            runs[mode] = carry_losses(*carry_fns, run.params, toks, desc=f"{name} carry",
                                      norms_fn=jax.jit(run.fns.memory_norms),
                                      norms_out=norms, **base_kw)
        else:
            runs[mode] = reset_losses(make_reset_losses_fn(run.fns), run.params, toks,
                                      desc=f"{name} reset", **kw)
        seconds[mode] = time.perf_counter() - t0
    if "carry" not in runs and ablate_at is not None:
        runs["carry"] = carry_losses(*carry_fns, run.params, toks, desc=f"{name} carry",
                                     **base_kw)
    if by_position:
        for mode in modes:
            loss, pos = runs[mode]
            r = loss_by_position(loss, pos)
            r.update(name=mode, model_name=cfg.model.name, context=mode,
                     dataset=name, step=run.step, seq_len=seq_len, n_docs=len(toks),
                     seconds=seconds.get(mode))
            if mode == "carry" and norms and norms[0][1]:
                r["memory_norm"] = norms_at_doublings(norms, seq_len)
            results[mode] = r
            if jax.process_index() == 0:
                files.append(str(write_by_position(
                    workdir / f"by_position_{key}_{mode}.json", r)))
        if jax.process_index() == 0:
            files.append(str(plot_by_position(
                {f"{cfg.model.name} {m}": r for m, r in results.items()},
                workdir / f"by_position_{key}.png",
                title=f"{cfg.model.name} step {run.step}, {name}, windows of {seq_len}")))
        log(format_by_position(results))
        if "memory_norm" in results.get("carry", {}):
            log(format_memory_norms(results["carry"]["memory_norm"]))
    summary = None
    if ablate_at is not None:
        ablated = carry_losses(*carry_fns, run.params, toks, ablate_at=ablate_at,
                               desc=f"{name} ablated", **kw)
        summary = ablation_summary(runs["carry"], ablated, ablate_at, seq_len)
        summary.update(model_name=cfg.model.name, dataset=name, step=run.step, n_docs=len(toks))
        if jax.process_index() == 0:
            path = workdir / f"ablation_{key}_at{summary['ablate_position']}.json"
            path.write_text(json.dumps(summary, indent=1) + "\n")
            files.append(str(path))
        log(format_ablation(summary))
    if files:
        log("wrote " + ", ".join(files))
    return {"by_position": results, "ablation": summary, "files": files}


def norms_at_doublings(norms: list, seq_len: int) -> list[dict[str, Any]]:
    """The memory norms of :func:`carry_losses`' ``norms_out`` after seq_len, 2 seq_len,
    4 seq_len, ... tokens and after the last window: ``[{"tokens": n, "norms": [...]}, ...]``."""
    out, next_mark = [], seq_len
    for i, (tokens, values) in enumerate(norms):
        if tokens >= next_mark or i == len(norms) - 1:
            out.append({"tokens": tokens, "norms": values})
            while next_mark <= tokens:
                next_mark *= 2
    return out


def format_memory_norms(rows: list[dict[str, Any]]) -> str:
    """One line per point of :func:`norms_at_doublings`: tokens read, each memory's norm."""
    lines = ["memory state ||P|| / ||W0|| (max over rows and heads), carried:"]
    lines += [f"{r['tokens']:>16,} tokens: " + " ".join(f"{v:.4g}" for v in r["norms"])
              for r in rows]
    return "\n".join(lines)


def format_by_position(results: dict[str, dict[str, Any]]) -> str:
    """A table: one row per bucket ``[lo, hi)``, the mean loss of each mode side by side."""
    if not results:
        return ""
    modes = list(results)
    edges = max((r["edges"] for r in results.values()), key=len)
    lines = [f"{'positions':>16}{'tokens':>10}" + "".join(f"{m:>10}" for m in modes)]
    for i in range(len(edges) - 1):
        cells, count = [], 0.0
        for m in modes:
            r = results[m]
            v = r["mean_loss"][i] if i < len(r["mean_loss"]) else None
            count = max(count, r["count"][i] if i < len(r["count"]) else 0.0)
            cells.append(f"{v:>10.4f}" if v is not None else f"{'-':>10}")
        lines.append(f"{f'[{edges[i]}, {edges[i + 1]})':>16}{int(count):>10}" + "".join(cells))
    lines.append(f"{'all':>16}{int(results[modes[0]]['total_count']):>10}" + "".join(
        f"{r['total_loss'] / max(r['total_count'], 1):>10.4f}" for r in results.values()))
    return "\n".join(lines)


__all__ = ["carry_losses", "evaluate_by_position", "format_by_position", "format_memory_norms",
           "norms_at_doublings",
           "make_position_step", "make_reset_losses_fn", "reset_losses",
           "stream_position_batches", "token_losses"]
