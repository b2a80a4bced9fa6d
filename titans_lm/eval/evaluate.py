"""Held-out perplexity of a trained run: ``evaluate(workdir)`` / ``titans-lm eval --workdir W``.

The checkpoint's own saved config rebuilds the model and the tokenizer (the tokenizer is trained
deterministically on the training split, so it comes back from the cache or is retrained
identically). Each document is cut into non-overlapping windows of the training length
(``titans_lm.data.windows``), every token after a document's BOS is predicted once, and the
summed log-likelihoods give token perplexity, word perplexity and bits per byte
(``titans_lm.eval.perplexity``; ratios of totals over whole documents).

Default datasets: the training corpus's held-out ``split`` (for ``books``, the test book) and the
WikiText-2 raw set of the same split (``test`` by default, ``validation`` with
``split="validation"``; each article a document; the test set is the text of the Titans paper's
"Wiki. ppl"). ``text_file`` scores one user file as a single document instead.

``overrides`` change the checkpoint's config at evaluation time (``titans_lm.config.overrides``:
the window length ``data.seq_len``, the compute dtype, the memory implementation, batch sizes); the
results of a changed window, dtype or implementation are named apart (``eval_<name>_seq_len1024``).

Baseline: a unigram model of the same tokenizer, frequencies counted on the training split's
tokens (BOS and padding excluded: neither is ever a target) with add-one smoothing over the V
ids, ``p(v) = (count(v) + 1) / (N + V)``, scored on exactly the tokens the model is scored on.

Context (``context``, ``titans-lm eval --context=reset|carry|both``): ``reset`` (the default)
scores every window from the model's initial state, the protocol the models are trained under
and the one every number of the project was reported with; ``carry`` streams each document
window after window with the model's state carried (``titans_lm.eval.streaming``), so memories
see the whole document and Transformer++ becomes the sliding-context baseline (a KV cache of the
last ``seq_len`` tokens); ``both`` reports the two side by side. Both modes score the same tokens.

Results are printed as a table, and each dataset's is written to its own file,
``<workdir>/eval_<name>_step<N>[_docs<M>]_<context>.json`` (:mod:`titans_lm.eval.results`: another
checkpoint step, document limit ``eval.max_docs``, split or context never replaces it; the
identical evaluation rerun does), whose path is printed: ``model`` holds the totals of the first
mode run (reset when it is run; ``model_context`` names it), ``modes`` the totals, seconds and
tokens/s of each mode. For a text file the name is ``text-<file name>-<8 hex digits of the sha256
of its absolute path>``, so two files never share a result file.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from titans_lm.config.overrides import result_suffix
from titans_lm.config import BOS_ID, PAD_ID
from titans_lm.data.corpora import load_documents, load_text_file
from titans_lm.data.prepare import prepare, tokenize_documents
from titans_lm.data.tokenizer import Tokenizer
from titans_lm.data.user_corpus import corpus_label, load_split
from titans_lm.data.windows import eval_batches
from titans_lm.eval.perplexity import PerplexityTotals, score_batch, text_totals
from titans_lm.eval.restore import load_run, require_run_dir
from titans_lm.eval.results import result_file_name
from titans_lm.eval.streaming import (CONTEXT_MODES, carry_note, make_carry_step,
                                      score_documents_carry)
from titans_lm.eval.tasks import evaluate_task, is_task_run
from titans_lm.progress import Progress, hms
from titans_lm.train import sharding as shd
from titans_lm.train.compilation import Announced
from titans_lm.train.run_files import check_run_data
from titans_lm.train.state import ModelFns, count_params
from titans_lm.train.writers import read_metrics

Log = Callable[[str], None]
WIKITEXT_CORPUS = "wikitext-2"


def unigram_log_probs(train_tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """float64[V]: add-one smoothed unigram log-probabilities (nats) of ``train_tokens``.

    PAD and BOS occurrences are not counted (padding, and a token never predicted).
    """
    counts = np.bincount(np.asarray(train_tokens, dtype=np.int64), minlength=vocab_size)
    counts = counts[:vocab_size].astype(np.float64)
    counts[PAD_ID] = counts[BOS_ID] = 0.0
    return np.log(counts + 1.0) - np.log(counts.sum() + vocab_size)


def unigram_totals(docs_tokens: Sequence[np.ndarray], texts: Sequence[str],
                   log_probs: np.ndarray) -> PerplexityTotals:
    """Totals of the unigram baseline on the same targets as the model (tokens after BOS)."""
    nll = -sum(float(log_probs[np.asarray(t[1:], np.int64)].sum()) for t in docs_tokens)
    n_tok = sum(max(len(t) - 1, 0) for t in docs_tokens)
    counts = text_totals(texts)
    return PerplexityTotals(nll, n_tok, counts.n_words, counts.n_bytes)


def make_score_fn(fns: ModelFns, params_sh: Any, mesh) -> Callable:
    """Jitted ``(params, batch) -> (nll_sum, n_tokens)`` via :func:`score_batch` (traced under
    ``mesh``, so the memory layers' Pallas kernels run per shard: ``shd.traced_under``)."""
    def score(params, batch):
        tokens, seg = batch["tokens"][:, :-1], batch["segment_ids"][:, :-1]
        logits, _ = fns.apply(params, tokens, seg, fns.init_state(params, tokens.shape[0]))
        return score_batch(logits, batch)
    rep = shd.replicated(mesh)
    return jax.jit(shd.traced_under(mesh, score),
                   in_shardings=(params_sh, shd.batch_sharding(mesh)),
                   out_shardings=(rep, rep))


def score_documents(score_fn: Callable, params: Any, docs_tokens: Sequence[np.ndarray],
                    texts: Sequence[str], *, seq_len: int, batch_size: int, mesh,
                    progress: bool = False, desc: str = "") -> PerplexityTotals:
    """Model totals over documents (each a token array starting with BOS, plus its text).

    ``batch_size`` is rounded up to a multiple of the mesh's batch shards (extra rows are padding).
    """
    mult = shd.batch_divisor(mesh)
    bsz = -(-batch_size // mult) * mult
    n_rows = sum(-(-(len(t) - 1) // seq_len) for t in docs_tokens if len(t) > 1)
    nll, n_tok = 0.0, 0
    with Progress(-(-n_rows // bsz), desc, "batch", enabled=progress) as bar:
        for batch in eval_batches(docs_tokens, seq_len=seq_len, batch_size=bsz, pad_last_batch=True):
            a, c = score_fn(params, shd.put_global_batch(batch, mesh))
            nll += float(a)
            n_tok += int(c)
            bar.update(1)
    counts = text_totals(texts)
    return PerplexityTotals(nll, n_tok, counts.n_words, counts.n_bytes)


def validation_rate(workdir: str | Path) -> float | None:
    """The run's last measured validation speed in tokens/s (``val_tokens_per_sec`` of its
    ``metrics.jsonl``), or None."""
    rates = [r["val_tokens_per_sec"] for r in read_metrics(workdir)
             if isinstance(r.get("val_tokens_per_sec"), (int, float))]
    return float(rates[-1]) if rates else None


def evaluation_plan(tokens: dict[str, int], n_modes: int, rate: float | None,
                    after_training: bool) -> str:
    """One line before an evaluation: the tokens of each set, the time the run's validation
    speed ``rate`` (tokens/s; None: unknown) predicts, and, after training, how to skip it."""
    total = sum(tokens.values()) * n_modes
    sets = ", ".join(f"{n} {t:,}" for n, t in tokens.items())
    est = (f"; about {hms(total / rate)} at the {rate:,.0f} tokens/s of training's validation "
           f"(plus compiling)" if rate else "")
    each = f" in each of {n_modes} contexts" if n_modes > 1 else ""
    line = f"evaluating {total:,} tokens ({sets}{each}){est}"
    if after_training:
        line += ("; --noeval_after skips this evaluation after training (`titans-lm eval` runs "
                 "it later), --config.eval.max_docs=N scores only N documents of each set")
    return line


def context_modes(context: str) -> tuple[str, ...]:
    """The modes of ``--context``: "reset" -> ("reset",), "carry" -> ("carry",), "both" -> both.

    Raises:
      ValueError: any other value.
    """
    if context == "both":
        return CONTEXT_MODES
    if context not in CONTEXT_MODES:
        raise ValueError(f"unknown context {context!r}: use reset, carry or both")
    return (context,)


def _datasets(cfg, split: str, text_file: str | None, wikitext: bool):
    """[(name, corpus or None, split or None, documents)]."""
    if text_file is not None:
        where = hashlib.sha256(str(Path(text_file).resolve()).encode()).hexdigest()[:8]
        return [(f"text-{Path(text_file).name}-{where}", None, None, load_text_file(text_file))]
    out = [(f"{corpus_label(cfg.data)}-{split}", cfg.data.corpus, split, load_split(cfg.data, split))]
    if wikitext and cfg.data.corpus != WIKITEXT_CORPUS:  # WikiText-2 of the same split
        out.append((f"wikitext2-{split}", WIKITEXT_CORPUS, split,
                    load_documents(WIKITEXT_CORPUS, split, cfg.data.data_dir)))
    return out


def evaluate(workdir: str | Path, split: str = "test", text_file: str | None = None,
             step: int | None = None, *, wikitext: bool = True, context: str | None = None,
             log: Log = print, progress: bool = True, overrides: dict[str, str] | None = None,
             bad_checkpoint: str = "fallback", after_training: bool = False
             ) -> dict[str, dict[str, Any]]:
    """Score a trained run on held-out text.

    Args:
      workdir: the run directory (``<workdir>/checkpoints``).
      split: held-out split of the training corpus ("test" or "validation").
      text_file: score this UTF-8 file (one document) instead of the corpora.
      step: the checkpoint to load (default: the newest).
      wikitext: also score WikiText-2's ``split`` (when ``text_file`` is None).
      context: "reset" (every window from the initial state), "carry" (documents streamed with
        the state carried, ``titans_lm.eval.streaming``) or "both"; None: "reset". A run trained
        on a synthetic task is scored by :func:`titans_lm.eval.tasks.evaluate_task` instead
        (accuracy on its answers), in each of these contexts; None: its ``task.eval_context``.
      overrides: ``{field: value text}`` applied to the checkpoint's config
        (:func:`titans_lm.config.overrides.apply_eval_overrides`).
      log: message sink. progress: show progress bars.
      bad_checkpoint: "fallback" or "refuse" (:func:`titans_lm.eval.restore.load_run`).
      after_training: the evaluation ``titans-lm train`` runs when training ends (its plan line
        names the flag that skips it).

    Returns:
      name -> result dict (``model`` and ``unigram`` totals and metrics, ``modes``: per context
      mode its totals, seconds and tokens/s; document count, step, ``max_docs``, ``context``),
      each also written to ``<workdir>/<its "file">`` (:func:`titans_lm.eval.results.result_file_name`).

    Raises:
      titans_lm.train.checkpoint.CheckpointError: no (or an unreadable) checkpoint.
      FileNotFoundError: ``workdir`` does not exist.
      ValueError / FileNotFoundError: unknown split or context, missing or unreadable text, an
        override eval cannot apply, or training data that changed since the run was trained.
    """
    require_run_dir(workdir)
    if is_task_run(workdir, step):  # a synthetic task: accuracy on its answers, not perplexity
        modes = context_modes(context) if context is not None else None
        return {"task": {"records": evaluate_task(workdir, step, context=modes, log=log,
                                                  overrides=overrides,
                                                  bad_checkpoint=bad_checkpoint)}}
    modes = context_modes(context or "reset")
    workdir = Path(workdir).resolve()
    if jax.process_index() != 0:  # one process speaks for a multi-process evaluation
        log, progress = (lambda msg: None), False
    run = load_run(workdir, step, overrides=overrides, bad_checkpoint=bad_checkpoint)
    cfg, fns, params, params_sh, mesh, step = (run.cfg, run.fns, run.params, run.params_sh,
                                               run.mesh, run.step)
    suffix = result_suffix(overrides or {}, run.saved_cfg)
    datasets = _datasets(cfg, split, text_file, wikitext)
    # An exported model brings its tokenizer; a run folder's is rebuilt from the training text.
    exported_tok = Tokenizer.load(run.tokenizer_file) if run.tokenizer_file else None
    prepared = prepare(cfg.data, tokenizer=exported_tok, splits=("train",), log=None,
                       check_windows=False)
    check_run_data(workdir, prepared, cfg.data.corpus, action="evaluate")
    tokenizer = prepared.tokenizer

    n_params = count_params(fns)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else None
    score_fn = (Announced(make_score_fn(fns, params_sh, mesh), "eval step", say)
                if "reset" in modes else None)
    carry_fns = make_carry_step(fns) if "carry" in modes else None
    if carry_fns is not None:
        carry_fns = (carry_fns[0], Announced(carry_fns[1], "carry eval step", say))
    log_probs = unigram_log_probs(prepared.stores["train"].tokens, cfg.model.vocab_size)
    seq_len = int(cfg.data.seq_len)
    max_docs = int(cfg.eval.get("max_docs", 0) or 0)
    context_name = "both" if len(modes) > 1 else modes[0]
    limits = {n: (max_docs if 0 < max_docs < len(docs) else 0) for n, _, _, docs in datasets}
    datasets = [(n, c, s, docs[:limits[n]] if limits[n] else docs) for n, c, s, docs in datasets]
    tokens_of = {n: tokenize_documents(tokenizer, docs) for n, _, _, docs in datasets}
    if progress:
        print(evaluation_plan({n: sum(len(t) - 1 for t in toks) for n, toks in tokens_of.items()},
                              len(modes), validation_rate(workdir), after_training),
              file=sys.stderr, flush=True)
    results: dict[str, dict[str, Any]] = {}
    for name, corpus, split_name, docs in datasets:
        limit = limits[name]  # the key of a partial evaluation
        name += suffix
        texts = [d.text for d in docs]
        toks = tokens_of.pop(name.removesuffix(suffix))
        if progress:
            print(f"scoring {name}: {len(docs)} document(s), {sum(len(t) - 1 for t in toks):,} "
                  f"tokens in windows of {seq_len}, context {'+'.join(modes)}", file=sys.stderr,
                  flush=True)
        t_all = time.perf_counter()
        by_mode = {}
        for mode in modes:
            t0 = time.perf_counter()
            if mode == "reset":
                totals = score_documents(score_fn, params, toks, texts, seq_len=seq_len,
                                         batch_size=int(cfg.eval.batch_size), mesh=mesh,
                                         progress=progress, desc=f"{name} reset")
            else:
                totals = score_documents_carry(*carry_fns, params, toks, texts, seq_len=seq_len,
                                               batch_size=int(cfg.eval.batch_size), mesh=mesh,
                                               progress=progress, desc=f"{name} carry")
            sec = time.perf_counter() - t0
            by_mode[mode] = {"model": totals.as_dict(), "seconds": sec,
                             "tokens_per_s": totals.n_tokens / sec if sec > 0 else None}
        if "carry" in by_mode:
            by_mode["carry"]["note"] = carry_note(cfg.model, seq_len)
        uni = unigram_totals(toks, texts, log_probs)
        file = result_file_name(name, step=step, max_docs=limit, context=context_name)
        res = {"name": name, "file": file, "corpus": corpus, "split": split_name,
               "text_file": text_file, "workdir": str(workdir), "step": step,
               "max_docs": limit, "context": context_name, "model_name": cfg.model.name,
               "n_params": n_params, "seq_len": seq_len, "n_docs": len(docs),
               "overrides": dict(overrides or {}),
               "model": by_mode[modes[0]]["model"], "model_context": modes[0],
               "modes": by_mode, "unigram": uni.as_dict(),
               "seconds": time.perf_counter() - t_all}
        results[name] = res
        if jax.process_index() == 0:
            _write_json(workdir / file, res)
    log(format_table(results, cfg, step, n_params))
    for res in results.values():
        log(f"wrote {workdir / res['file']}")
    return results


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically (an interrupted write leaves the old file whole)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.2f}" if x < 1e6 else f"{x:.3g}"


def format_table(results: dict[str, dict[str, Any]], cfg: ml_collections.ConfigDict, step: int,
                 n_params: int) -> str:
    """A plain-text table of the results: per dataset the model's token ppl, word ppl and
    bits/byte (with two context modes, each metric has a reset and a carry column side by side),
    then the same three for the unigram baseline of the same tokenizer (columns prefixed
    "unigram"); lines under the table say what each mode means for this model."""
    modes = list(next(iter(results.values()))["modes"]) if results else ["reset"]
    seq_len = int(cfg.data.seq_len)
    metrics = (("token ppl", "token_ppl"), ("word ppl", "word_ppl"), ("bits/byte", "bits_per_byte"))
    w = 11
    nw = max([22] + [len(r["name"]) + 2 for r in results.values()])
    left = f"{'dataset':<{nw}}{'docs':>6}{'tokens':>11}{'words':>10}"
    uni_head = f"{'unigram token ppl':>18}{'unigram word ppl':>17}{'unigram bits/byte':>18}"
    lines = [f"{cfg.model.name} ({n_params:,} parameters), checkpoint step {step}, windows of "
             f"{seq_len} tokens, context {' and '.join(modes)}"]
    if len(modes) == 1:
        head = left + "  " + "".join(f"{label:>{w}}" for label, _ in metrics) + "  " + uni_head
    else:
        lines.append(" " * len(left) + "".join(f"  {label:^{w * len(modes)}}" for label, _ in metrics))
        head = left + "".join("  " + "".join(f"{m:>{w}}" for m in modes) for _ in metrics) + \
            "  " + uni_head
    lines += [head, "-" * len(head)]
    for r in results.values():
        u, m0 = r["unigram"], r["modes"][modes[0]]["model"]
        row = f"{r['name']:<{nw}}{r['n_docs']:>6}{m0['n_tokens']:>11,}{m0['n_words']:>10,}"
        if len(modes) == 1:
            row += "  " + "".join(f"{_fmt(m0.get(key)):>{w}}" for _, key in metrics)
        else:
            row += "".join("  " + "".join(f"{_fmt(r['modes'][m]['model'].get(key)):>{w}}"
                                          for m in modes) for _, key in metrics)
        row += (f"  {_fmt(u.get('token_ppl')):>18}{_fmt(u.get('word_ppl')):>17}"
                f"{_fmt(u.get('bits_per_byte')):>18}")
        lines.append(row)
    if "reset" in modes:
        lines.append("reset: every window starts from the model's initial state (as in training)")
    if "carry" in modes:
        lines.append(f"carry: each document streamed in windows of {seq_len} tokens with the state "
                     f"carried; {carry_note(cfg.model, seq_len)}")
    return "\n".join(lines)


__all__ = ["context_modes", "evaluate", "format_table", "make_score_fn", "score_documents",
           "unigram_log_probs", "unigram_totals"]
