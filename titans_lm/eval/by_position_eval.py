"""Loss by position over whole documents, and the memory ablation probe.

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

Files: ``<workdir>/by_position_<dataset>_<mode>.json`` (one per mode) and
``<workdir>/by_position_<dataset>.png`` (one curve per mode); ``titans-lm plot --by_position``
draws several runs on one figure.

Memory ablation (``titans-lm eval --ablate_at=P``, :func:`ablate_memory`): the carry run again,
but at the first window boundary at or after ``P`` inside each document (``P`` rounded up to a
multiple of the window ``T``: ``P' = ceil(P / T) * T``), every neural memory of the model is
reset in that document's row. LMM, TTT and the memories of MAG and MAL
(``titans_lm.memory.layer.MemoryState``) go to the state a document start restores: weights to
``reset_to`` (W0, or the state the persistent tokens leave), momentum to zero, and the tokens
buffered for the current chunk are dropped (marked padding, so they are never written). MAC's
memory (``titans_lm.models.mac.MACState.memory``, the state at the current segment's start) goes
to the layer's W0 from the current parameters with zero momentum; its segment buffer is kept, so
the current segment's tokens before ``P'`` (fewer than ``segment_len``; none when
``segment_len`` divides ``T``) are retrieved from W0 and written into the reset memory again when
the next window runs (their outputs were scored before the reset and are not used): the reset
removes what the segments completed before the one holding ``P'`` wrote (nothing where ``P'``
falls inside a document's first segment). Nothing else changes: attention caches, segment buffers, the memories'
convolution tails and the stream positions stay, and no document boundary is signalled.
Positions ``< P'`` are therefore scored exactly as in the unablated run, and the mean loss over
positions ``>= P'`` against the unablated run's is the loss the memory's content saves
(``<workdir>/ablation_<dataset>_at<P'>.json``, with the count of non-finite losses of each run).
A model without a neural memory (Transformer++) is refused.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from titans_lm.config.overrides import result_suffix
from titans_lm.data.prepare import prepare, tokenize_documents
from titans_lm.data.windows import document_windows, num_windows
from titans_lm.eval.by_position import loss_by_position, plot_by_position, write_by_position
from titans_lm.eval.evaluate import _datasets, context_modes
from titans_lm.eval.restore import load_run
from titans_lm.eval.streaming import StatefulLM, assign_rows, stream_batches, stream_rows
from titans_lm.memory.layer import MemoryState
from titans_lm.models.mac import MACState
from titans_lm.train import sharding as shd
from titans_lm.train.run_files import check_run_data

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


def _memory_types() -> tuple[type, ...]:
    return MemoryState, MACState


def _is_memory_node(x) -> bool:
    return isinstance(x, _memory_types())


def ablate_memory(state: Any, rows_B: jax.Array, initial: Any = None) -> Any:
    """Reset every neural memory in a model state, in the rows ``rows_B`` (bool [B]).

    The memories are found by type anywhere in ``state`` (any pytree, e.g.
    ``titans_lm.models.lm.LMState``):

    * :class:`~titans_lm.memory.layer.MemoryState` (LMM, TTT-Linear/MLP, the memories of MAG and
      MAL): ``params = reset_to`` (W0, or the state the persistent tokens leave: what a document
      start restores), ``momentum = 0``, and the tokens buffered for the current chunk are marked
      padding (``buf_real = False``: never written). The conv tail is kept.
    * :class:`~titans_lm.models.mac.MACState` (MAC): ``memory``, the (params, momentum) at the
      current segment's start, becomes ``initial``'s (the layer's W0 from the current parameters,
      zero momentum). The segment buffer (the current segment's tokens so far, which the next call
      runs again from that memory) and the conv tails are kept, so those tokens retrieve from W0
      and are written into the reset memory again (their outputs are not used): what is removed
      is what the segments completed before the current one wrote.

    Every other leaf (attention caches, stream positions, segment buffers) is returned as is.
    Pure and jit-compatible.

    Args:
      state: the carried model state (pytree), arrays with leading batch axis B.
      rows_B: bool [B], the rows to reset.
      initial: the state a stream starts from, with the same structure as ``state``
        (``StatefulLM.init_state(params, B)``); read only where a memory state does not carry
        its reset state (MAC). None is enough for a state without MAC layers.

    Raises:
      ValueError: the state holds no neural memory, or holds a MAC memory and ``initial`` is None.
    """
    rows_B = jnp.asarray(rows_B, bool)
    found = []

    def sel(new, old):
        return jnp.where(rows_B.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)

    def fix(node, init=None):
        if isinstance(node, MACState):
            if init is None:
                raise ValueError("ablate_memory: a MAC memory state does not hold the state a "
                                 "document start restores; pass initial (the model's "
                                 "init_state for this batch)")
            found.append(1)
            (params, momentum), (params0, _) = node.memory, init.memory
            return node._replace(memory=(
                tuple(jax.tree.map(sel, params0, params)),
                tuple(jax.tree.map(lambda m: sel(jnp.zeros_like(m), m), momentum))))
        if not isinstance(node, MemoryState):
            return node
        found.append(1)
        return node._replace(
            params=jax.tree.map(sel, node.reset_to, node.params),
            momentum=jax.tree.map(lambda m: sel(jnp.zeros_like(m), m), node.momentum),
            buf_real=sel(jnp.zeros_like(node.buf_real), node.buf_real))

    if initial is None:
        out = jax.tree.map(fix, state, is_leaf=_is_memory_node)
    else:
        out = jax.tree.map(fix, state, initial, is_leaf=_is_memory_node)
    if not found:
        raise ValueError("--ablate_at needs a model with a neural memory (LMM, TTT, MAG, MAL, "
                         "MAC); this model's state holds none")
    return out


def ablation_window(ablate_at: int, seq_len: int) -> int:
    """The window index ``ceil(P / T)`` at whose start the memory is reset (``P >= 1``).

    Raises:
      ValueError: ``ablate_at < 1``.
    """
    if int(ablate_at) < 1:
        raise ValueError(f"--ablate_at must be a position >= 1, got {ablate_at}")
    return -(-int(ablate_at) // int(seq_len))


def make_position_step(lm: StatefulLM) -> tuple[Callable, Callable]:
    """``(init_fn, step_fn)``, jitted: ``step_fn(params, state, batch) -> (nll_BT, weight_BT,
    state)`` runs one window batch of :func:`stream_position_batches` from ``state``, first
    resetting the memories of the rows whose ``batch["ablate"]`` (bool [B]) is set
    (:func:`ablate_memory`, against ``lm.init_state(params, B)``, the initial state from the
    current parameters; with no row set the state is unchanged)."""
    def step(params, state, batch):
        if "ablate" in batch:  # XLA drops the initial state where no MAC memory reads it
            initial = lm.init_state(params, batch["tokens"].shape[0])
            state = ablate_memory(state, batch["ablate"], initial)
        logits, state = lm.apply(params, batch["tokens"][:, :-1], batch["segment_ids"][:, :-1],
                                 state)
        nll, w = token_losses(logits, batch)
        return nll, w, state
    return jax.jit(lm.init_state, static_argnums=1), jax.jit(step, donate_argnums=1)


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


def _put(batch, mesh):
    local = {k: np.array_split(v, jax.process_count())[jax.process_index()]
             for k, v in batch.items()}
    return shd.put_batch(local, mesh)


def carry_losses(init_fn: Callable, step_fn: Callable, params: Any,
                 docs_tokens: Sequence[np.ndarray], *, seq_len: int, batch_size: int, mesh,
                 ablate_at: int | None = None, baseline_of_ablation: bool = False,
                 progress: bool = False, desc: str = "") -> tuple[np.ndarray, np.ndarray]:
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
    """
    n_rows = stream_rows(len(docs_tokens), batch_size, mesh)
    _, n_steps = assign_rows([num_windows(len(t), seq_len) for t in docs_tokens], n_rows)
    w_abl = None if ablate_at is None else ablation_window(ablate_at, seq_len)
    state = init_fn(params, n_rows)
    losses, positions = [], []
    with tqdm(total=n_steps, disable=not (progress and sys.stderr.isatty()), desc=desc,
              unit="window", leave=False, dynamic_ncols=True) as bar:
        for batch, window, pos in stream_position_batches(docs_tokens, seq_len=seq_len,
                                                          n_rows=n_rows):
            if w_abl is not None or baseline_of_ablation:
                batch = {**batch, "ablate": (np.zeros(window.shape, bool) if w_abl is None
                                             else window == w_abl)}
            nll, w, state = step_fn(params, state, _put(batch, mesh))
            w = np.asarray(w)
            losses.append(np.asarray(nll, np.float64)[w])
            positions.append(pos[w])
            bar.update(1)
    return np.concatenate(losses or [np.zeros(0)]), np.concatenate(positions or [np.zeros(0, int)])


def make_reset_losses_fn(fns) -> Callable:
    """Jitted ``(params, batch) -> (nll_BT, weight_BT)`` from the initial state."""
    def f(params, batch):
        return token_losses(fns.apply(params, batch["tokens"][:, :-1],
                                      batch["segment_ids"][:, :-1]), batch)
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
    for i in tqdm(range(0, len(rows), bsz), disable=not (progress and sys.stderr.isatty()),
                  desc=desc, unit="batch", leave=False, dynamic_ncols=True):
        chunk = rows[i:i + bsz]
        pad = bsz - len(chunk)
        tok = np.stack([r[0] for r in chunk] + [np.zeros(seq_len + 1, np.int32)] * pad)
        seg = np.stack([r[1] for r in chunk] + [np.zeros(seq_len + 1, np.int32)] * pad)
        pos = np.stack([r[2] for r in chunk] + [np.zeros(seq_len, np.int64)] * pad)
        nll, w = loss_fn(params, _put({"tokens": tok, "segment_ids": seg}, mesh))
        w = np.asarray(w)
        losses.append(np.asarray(nll, np.float64)[w])
        positions.append(pos[w])
    return np.concatenate(losses or [np.zeros(0)]), np.concatenate(positions or [np.zeros(0, int)])


def ablation_summary(base: tuple[np.ndarray, np.ndarray], ablated: tuple[np.ndarray, np.ndarray],
                     ablate_at: int, seq_len: int) -> dict[str, Any]:
    """Mean losses before and after the ablation point of the unablated and ablated carry runs.

    Returns a dict: ``ablate_at`` (as asked), ``ablate_position`` (``P'``, where the reset
    happens), token counts and mean losses (nats) before / after ``P'`` of both runs,
    ``loss_increase`` (ablated - unablated mean after ``P'``), ``loss_increase_first_window``
    (the same over ``[P', P' + T)``, the window right after the reset) and
    ``max_abs_diff_before`` (0 when the positions before ``P'`` are untouched, as they must be;
    NaN where a loss before ``P'`` is not finite), ``n_nonfinite`` / ``n_nonfinite_ablated``
    (losses that are NaN or inf in each run: a memory whose inner loop diverged, whose means are
    then not finite either).

    Raises:
      ValueError: the two runs scored different tokens, or ``ablate_at < 1``.
    """
    p = ablation_window(ablate_at, seq_len) * int(seq_len)
    (lb, pb), (la, pa) = base, ablated
    if not np.array_equal(pb, pa):
        raise ValueError("the ablated run scored other tokens than the unablated one")
    after = pb >= p

    def mean(x):
        return float(x.mean()) if x.size else None

    out = {"ablate_at": int(ablate_at), "ablate_position": p, "seq_len": int(seq_len),
           "n_tokens_before": int((~after).sum()), "n_tokens_after": int(after.sum()),
           "loss_before": mean(lb[~after]), "loss_before_ablated": mean(la[~after]),
           "loss_after": mean(lb[after]), "loss_after_ablated": mean(la[after]),
           "max_abs_diff_before": float(np.max(np.abs(lb[~after] - la[~after])))
           if (~after).any() else 0.0}
    out["n_nonfinite"] = int((~np.isfinite(lb)).sum())
    out["n_nonfinite_ablated"] = int((~np.isfinite(la)).sum())
    out["loss_increase"] = (out["loss_after_ablated"] - out["loss_after"]
                            if after.any() else None)
    first = after & (pb < p + int(seq_len))  # the window right after the reset
    out["n_tokens_first_window"] = int(first.sum())
    out["loss_increase_first_window"] = (float(la[first].mean() - lb[first].mean())
                                         if first.any() else None)
    return out


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
    prepared = prepare(cfg.data, splits=("train",), log=None, check_windows=False)
    check_run_data(workdir, prepared, cfg.data.corpus, action="evaluate")
    name, _, _, docs = _datasets(cfg, split, text_file, False)[0]
    name += suffix
    max_docs = int(cfg.eval.get("max_docs", 0) or 0)
    docs = docs[:max_docs] if max_docs else docs
    toks = tokenize_documents(prepared.tokenizer, docs)
    if max_tokens:
        toks = [t[:int(max_tokens) + 1] for t in toks]
    seq_len, bsz = int(cfg.data.seq_len), int(cfg.eval.batch_size)
    lm = StatefulLM(run.fns)
    if ablate_at is not None:  # refuse a model without a memory before any scoring
        jax.eval_shape(lambda s: ablate_memory(s, jnp.zeros(1, bool), s),
                       jax.eval_shape(lambda p: lm.init_state(p, 1), run.params))
    if progress:
        print(f"by position: {name}, {len(toks)} document(s), {sum(len(t) - 1 for t in toks):,} "
              f"tokens in windows of {seq_len}", file=sys.stderr, flush=True)
    carry_fns = make_position_step(lm) if ("carry" in modes or ablate_at is not None) else None
    kw = dict(seq_len=seq_len, batch_size=bsz, mesh=mesh, progress=progress)
    base_kw = dict(kw, baseline_of_ablation=ablate_at is not None)
    runs, results, files, seconds = {}, {}, [], {}
    for mode in modes if by_position else (("carry",) if ablate_at is not None else ()):
        t0 = time.perf_counter()
        if mode == "carry":
            runs[mode] = carry_losses(*carry_fns, run.params, toks, desc=f"{name} carry",
                                      **base_kw)
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
            results[mode] = r
            if jax.process_index() == 0:
                files.append(str(write_by_position(
                    workdir / f"by_position_{name}_{mode}.json", r)))
        if jax.process_index() == 0:
            files.append(str(plot_by_position(
                {f"{cfg.model.name} {m}": r for m, r in results.items()},
                workdir / f"by_position_{name}.png",
                title=f"{cfg.model.name} step {run.step}, {name}, windows of {seq_len}")))
        log(format_by_position(results))
    summary = None
    if ablate_at is not None:
        ablated = carry_losses(*carry_fns, run.params, toks, ablate_at=ablate_at,
                               desc=f"{name} ablated", **kw)
        summary = ablation_summary(runs["carry"], ablated, ablate_at, seq_len)
        summary.update(model_name=cfg.model.name, dataset=name, step=run.step, n_docs=len(toks))
        if jax.process_index() == 0:
            path = workdir / f"ablation_{name}_at{summary['ablate_position']}.json"
            path.write_text(json.dumps(summary, indent=1) + "\n")
            files.append(str(path))
        log(format_ablation(summary))
    if files:
        log("wrote " + ", ".join(files))
    return {"by_position": results, "ablation": summary, "files": files}


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


def format_ablation(s: dict[str, Any]) -> str:
    def f(x):
        return "-" if x is None or not math.isfinite(x) else f"{x:.4f}"
    return (f"memory ablation at position {s['ablate_position']} (asked {s['ablate_at']}): "
            f"loss after {f(s['loss_after'])} -> {f(s['loss_after_ablated'])} nats "
            f"(increase {f(s['loss_increase'])}) over {s['n_tokens_after']:,} tokens, "
            f"{f(s.get('loss_increase_first_window'))} in the window after it; before: "
            f"{f(s['loss_before'])} vs {f(s['loss_before_ablated'])} "
            f"(max difference {s['max_abs_diff_before']:.2e})"
            + (f"; non-finite losses: {s['n_nonfinite']:,} unablated, "
               f"{s['n_nonfinite_ablated']:,} ablated (the memory diverged?)"
               if s.get("n_nonfinite") or s.get("n_nonfinite_ablated") else ""))


__all__ = ["ablate_memory", "ablation_summary", "ablation_window", "carry_losses",
           "evaluate_by_position", "format_ablation", "format_by_position",
           "make_position_step", "make_reset_losses_fn", "reset_losses",
           "stream_position_batches", "token_losses"]
