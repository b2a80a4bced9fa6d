"""Streaming evaluation: each document scored window after window with the model's state carried.

``--context=reset`` (``titans_lm.data.windows``) scores every window of ``T`` tokens from the
initial state, as in training. ``--context=carry`` (this module) cuts each document into exactly
the same windows, but feeds a document's windows to one batch row in order and carries the state
from each call to the next (``model(tokens_BT, segment_ids_BT, state) -> (logits, state)``):

* one jitted step function ``(params, state, window batch) -> (nll_sum, n_tokens, state)`` is
  reused for every window, so a document of any length (the 214K-token held-out book) is one
  pass in constant memory; nothing is truncated;
* documents are batched across rows: each row takes the next document of the queue when its
  current one ends (the row whose document ends first is refilled first); rows left without a
  document get padding windows (weight 0);
* a document's first window carries its own segment id (``doc_index + 1``, as in reset mode) while
  the row's previous window held another document (or padding), so the model starts a new
  document there exactly as in training: memories reset to their initial state, attention never
  looks at the previous document's keys;
* scoring is :func:`titans_lm.eval.perplexity.score_batch` on the same windows and targets as the
  reset path, so both modes sum the log-likelihoods of the same tokens, once each.

A document shorter than one window therefore scores as in reset mode. What the state buys is
context across windows: a memory model's weights keep what the document's earlier windows wrote
into them; Transformer++ with its KV cache bounded by ``max_context = T`` attends to the last
``T`` tokens (the standard sliding-context baseline); MAG/MAL carry their sliding-window cache and
the memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from titans_lm.eval.perplexity import PerplexityTotals, score_batch, text_counts
from titans_lm.data.windows import assign_rows, num_windows, stream_batches
from titans_lm.models.lm import continued
from titans_lm.progress import Progress
from titans_lm.train import sharding as shd
from titans_lm.train.state import ModelFns

CONTEXT_MODES = ("reset", "carry")


def stream_init_fn(fns: ModelFns) -> Callable:
    """Jitted ``(params, batch_size) -> state`` (``batch_size`` static): ``fns.init_state``
    without the fresh mark, so that a stream's first window and the later ones run one compiled
    program (``titans_lm.models.lm.LMState.continued``)."""
    return jax.jit(lambda params, batch_size: continued(fns.init_state(params, batch_size)),
                   static_argnums=1)


def make_carry_step(fns: ModelFns) -> tuple[Callable, Callable]:
    """``(init_fn, step_fn)``, both jitted, from the model's stateful API
    (``fns.init_state``, ``fns.apply``; :class:`titans_lm.train.state.ModelFns`).

    ``init_fn(params, batch_size)`` gives the initial state (``batch_size`` static,
    :func:`stream_init_fn`); ``step_fn(params, state, batch) -> (nll_sum, n_tokens, state)`` runs
    one window batch (``{"tokens", "segment_ids"}: int32 [B, T+1]``; inputs ``[:, :-1]``) from
    ``state`` and scores it with :func:`score_batch`. The incoming state is donated (updated in
    place).
    """
    def step(params, state, batch):
        logits, state = fns.apply(params, batch["tokens"][:, :-1], batch["segment_ids"][:, :-1],
                                  state)
        nll, n = score_batch(logits, batch)
        return nll, n, state
    return stream_init_fn(fns), jax.jit(step, donate_argnums=1)


def stream_rows(n_docs: int, batch_size: int, mesh) -> int:
    """Rows for carry mode: ``batch_size``, or fewer when there are fewer documents, rounded up to
    a multiple of the mesh's batch shards."""
    mult = shd.batch_divisor(mesh)
    rows = max(1, min(int(batch_size), int(n_docs)))
    return -(-rows // mult) * mult


def score_documents_carry(init_fn: Callable, step_fn: Callable, params: Any,
                          docs_tokens: Sequence[np.ndarray], texts: Sequence[str], *, seq_len: int,
                          batch_size: int, mesh, progress: bool = False,
                          desc: str = "") -> PerplexityTotals:
    """Model totals over documents in carry mode (the counterpart of
    :func:`titans_lm.eval.evaluate.score_documents`).

    Args:
      init_fn, step_fn: from :func:`make_carry_step`.
      params: the model parameters.
      docs_tokens: one token array per document, each beginning with BOS; texts: their texts.
      seq_len: T, the window length. batch_size: at most this many rows (see :func:`stream_rows`).
      mesh: the device mesh (batches are sharded over its batch axes).

    Returns:
      :class:`PerplexityTotals` of every token after each document's BOS.
    """
    n_rows = stream_rows(len(docs_tokens), batch_size, mesh)
    _, n_steps = assign_rows([num_windows(len(t), seq_len) for t in docs_tokens], n_rows)
    state = init_fn(params, n_rows)
    nll, n_tok = 0.0, 0
    with Progress(n_steps, desc, "window", enabled=progress) as bar:
        for batch in stream_batches(docs_tokens, seq_len=seq_len, n_rows=n_rows):
            a, c, state = step_fn(params, state, shd.put_global_batch(batch, mesh))
            nll += float(a)
            n_tok += int(c)
            bar.update(1)
    words, nbytes = zip(*(text_counts(x) for x in texts)) if texts else ((), ())
    return PerplexityTotals(nll, n_tok, int(sum(words)), int(sum(nbytes)))


def carry_note(model_cfg, seq_len: int) -> str:
    """What carry mode means for this backbone (printed under the table, saved in the JSON)."""
    name = str(model_cfg.get("name", ""))
    if name == "transformer":
        c = int(model_cfg.get("max_context", 0) or seq_len)
        return (f"carry for Transformer++ is the sliding-context baseline: its KV cache keeps the "
                f"last {c} tokens")
    return "carry: the memory state (and any attention cache) is carried across the windows"


__all__ = ["CONTEXT_MODES", "assign_rows", "carry_note", "make_carry_step", "stream_init_fn",
           "score_documents_carry", "stream_batches", "stream_rows"]
