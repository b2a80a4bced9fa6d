"""Held-out perplexity of a trained run: ``evaluate(workdir)`` / ``titans-lm eval --workdir W``.

The checkpoint's own saved config rebuilds the model and the tokenizer (the tokenizer is trained
deterministically on the training split, so it comes back from the cache or is retrained
identically). Each document is cut into non-overlapping windows of the training length
(``titans_lm.eval.windows``), every token after a document's BOS is predicted once, and the
summed log-likelihoods give token perplexity, word perplexity and bits per byte
(``titans_lm.eval.perplexity``; ratios of totals over whole documents).

Default datasets: the training corpus's held-out ``split`` (for ``books``, the test book) and the
WikiText-2 raw test set (each article a document; the text of the Titans paper's "Wiki. ppl").
``text_file`` scores one user file as a single document instead.

Baseline: a unigram model of the same tokenizer, frequencies counted on the training split's
tokens (BOS and padding excluded: neither is ever a target) with add-one smoothing over the V
ids, ``p(v) = (count(v) + 1) / (N + V)``, scored on exactly the tokens the model is scored on.

Results are printed as a table and written to ``<workdir>/eval_<name>.json``.
"""

from __future__ import annotations

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
from tqdm import tqdm

from titans_lm.config import BOS_ID, PAD_ID
from titans_lm.eval.perplexity import PerplexityTotals, score_batch, text_counts
from titans_lm.eval.windows import eval_batches
from titans_lm.train import sharding as shd
from titans_lm.train.checkpoint import Checkpointer
from titans_lm.train.state import ModelFns, count_params, model_fns

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
    words, nbytes = zip(*(text_counts(x) for x in texts)) if texts else ((), ())
    return PerplexityTotals(nll, n_tok, int(sum(words)), int(sum(nbytes)))


def make_score_fn(fns: ModelFns, params_sh: Any, mesh) -> Callable:
    """Jitted ``(params, batch) -> (nll_sum, n_tokens)`` via :func:`score_batch`."""
    def score(params, batch):
        logits = fns.apply(params, batch["tokens"][:, :-1], batch["segment_ids"][:, :-1])
        return score_batch(logits, batch)
    rep = shd.replicated(mesh)
    return jax.jit(score, in_shardings=(params_sh, shd.batch_sharding(mesh)),
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
    with tqdm(total=-(-n_rows // bsz), disable=not (progress and sys.stderr.isatty()), desc=desc,
              unit="batch",
              leave=False, dynamic_ncols=True) as bar:
        for batch in eval_batches(docs_tokens, seq_len=seq_len, batch_size=bsz, pad_last_batch=True):
            local = {k: np.array_split(v, jax.process_count())[jax.process_index()]
                     for k, v in batch.items()}
            a, c = score_fn(params, shd.put_batch(local, mesh))
            nll += float(a)
            n_tok += int(c)
            bar.update(1)
    words, nbytes = zip(*(text_counts(x) for x in texts)) if texts else ((), ())
    return PerplexityTotals(nll, n_tok, int(sum(words)), int(sum(nbytes)))


def _eval_mesh(cfg: ml_collections.ConfigDict):
    try:
        return shd.make_mesh(cfg.mesh)
    except ValueError:  # trained on another device count: plain data parallelism here
        return shd.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})


def _datasets(cfg, split: str, text_file: str | None, wikitext: bool):
    """[(name, corpus or None, split or None, documents)]."""
    from titans_lm.data.corpora import Document, load_documents, read_text
    if text_file is not None:
        text = read_text(text_file)
        if not text.strip():
            raise ValueError(f"{text_file}: the file holds no text to score")
        return [(f"text-{Path(text_file).name.split('.')[0]}", None, None,
                 [Document(Path(text_file).name, text)])]
    out = [(f"{cfg.data.corpus}-{split}", cfg.data.corpus, split,
            load_documents(cfg.data.corpus, split, cfg.data.data_dir))]
    if wikitext and cfg.data.corpus != WIKITEXT_CORPUS:
        out.append(("wikitext2-test", WIKITEXT_CORPUS, "test",
                    load_documents(WIKITEXT_CORPUS, "test", cfg.data.data_dir)))
    return out


def evaluate(workdir: str | Path, split: str = "test", text_file: str | None = None,
             step: int | None = None, *, wikitext: bool = True, log: Log = print,
             progress: bool = True, bad_checkpoint: str = "fallback") -> dict[str, dict[str, Any]]:
    """Score a trained run on held-out text.

    Args:
      workdir: the run directory (``<workdir>/checkpoints``).
      split: held-out split of the training corpus ("test" or "validation").
      text_file: score this UTF-8 file (one document) instead of the corpora.
      step: the checkpoint to load (default: the newest).
      wikitext: also score WikiText-2 test (when ``text_file`` is None).
      log: message sink. progress: show progress bars.
      bad_checkpoint: "fallback" (a checkpoint whose parameters or config are damaged is named
        and the previous complete one scored; not with an explicit ``step``) or "refuse".
        Damage to the optimiser state only is named and does not matter here.

    Returns:
      name -> result dict (``model`` and ``unigram`` totals and metrics, document count, step),
      also written to ``<workdir>/eval_<name>.json``.

    Raises:
      titans_lm.train.checkpoint.CheckpointError: no (or an unreadable) checkpoint.
      ValueError / FileNotFoundError: unknown split, missing or unreadable text.
    """
    from titans_lm.data.prepare import prepare, tokenize_documents

    workdir = Path(workdir).resolve()
    primary = jax.process_index() == 0
    if not primary:  # one process speaks for a multi-process evaluation
        log, progress = (lambda msg: None), False
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        def load(s: int):
            cfg = ckpt.read_config(s)
            fns = model_fns(cfg.model)
            mesh = _eval_mesh(cfg)
            params_sh = shd.param_shardings(fns.abstract_params(), fns.logical_axes, mesh)
            abstract = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                                    fns.abstract_params(), params_sh)
            return cfg, fns, mesh, params_sh, ckpt.restore_params(abstract, s)[0]
        # Evaluation reads the parameters and the config: damage elsewhere (the optimiser state)
        # is reported and does not stop it.
        needed = ("parameters", "config")
        explicit = None if step is None else [ckpt.resolve_step(step)]
        (cfg, fns, mesh, params_sh, params), step = ckpt.newest_usable(
            load, policy=bad_checkpoint, needed=needed,
            log=lambda m: print(m, file=sys.stderr) if primary else None,
            steps=explicit)
        datasets = _datasets(cfg, split, text_file, wikitext)
        prepared = prepare(cfg.data, splits=("train",), log=None)
        tokenizer = prepared.tokenizer
    finally:
        ckpt.close()

    n_params = count_params(fns)
    score_fn = make_score_fn(fns, params_sh, mesh)
    log_probs = unigram_log_probs(prepared.stores["train"].tokens, cfg.model.vocab_size)
    seq_len = int(cfg.data.seq_len)
    max_docs = int(cfg.eval.get("max_docs", 0) or 0)
    results: dict[str, dict[str, Any]] = {}
    for name, corpus, split_name, docs in datasets:
        if max_docs:
            docs = docs[:max_docs]
        texts = [d.text for d in docs]
        toks = tokenize_documents(tokenizer, docs)
        if progress:
            print(f"scoring {name}: {len(docs)} document(s), {sum(len(t) - 1 for t in toks):,} "
                  f"tokens in windows of {seq_len}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        model = score_documents(score_fn, params, toks, texts, seq_len=seq_len,
                                batch_size=int(cfg.eval.batch_size), mesh=mesh,
                                progress=progress, desc=name)
        uni = unigram_totals(toks, texts, log_probs)
        res = {"name": name, "corpus": corpus, "split": split_name, "text_file": text_file,
               "workdir": str(workdir), "step": step, "model_name": cfg.model.name,
               "n_params": n_params, "seq_len": seq_len, "n_docs": len(docs),
               "model": model.as_dict(), "unigram": uni.as_dict(),
               "seconds": time.perf_counter() - t0}
        results[name] = res
        if jax.process_index() == 0:
            (workdir / f"eval_{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    log(format_table(results, cfg, step, n_params))
    return results


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.2f}" if x < 1e6 else f"{x:.3g}"


def format_table(results: dict[str, dict[str, Any]], cfg: ml_collections.ConfigDict, step: int,
                 n_params: int) -> str:
    """A plain-text table of the results: the model's token ppl, word ppl and bits/byte, then the
    same three for the unigram baseline of the same tokenizer (columns prefixed "unigram")."""
    head = (f"{'dataset':<22}{'docs':>6}{'tokens':>11}{'words':>10}  {'token ppl':>10}"
            f"{'word ppl':>11}{'bits/byte':>10}  {'unigram token ppl':>18}{'unigram word ppl':>17}"
            f"{'unigram bits/byte':>18}")
    lines = [f"{cfg.model.name} ({n_params:,} parameters), checkpoint step {step}, windows of "
             f"{cfg.data.seq_len} tokens", head, "-" * len(head)]
    for r in results.values():
        m, u = r["model"], r["unigram"]
        lines.append(f"{r['name']:<22}{r['n_docs']:>6}{m['n_tokens']:>11,}{m['n_words']:>10,}  "
                     f"{_fmt(m.get('token_ppl')):>10}{_fmt(m.get('word_ppl')):>11}"
                     f"{_fmt(m.get('bits_per_byte')):>10}  {_fmt(u.get('token_ppl')):>18}"
                     f"{_fmt(u.get('word_ppl')):>17}{_fmt(u.get('bits_per_byte')):>18}")
    return "\n".join(lines)


__all__ = ["evaluate", "format_table", "score_documents", "unigram_log_probs", "unigram_totals",
           "make_score_fn"]
