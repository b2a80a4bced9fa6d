"""Validation during training: a fixed set of windows, scored every ``train.eval_every`` steps.

- :func:`validation_batches` (every corpus run; ``val_loss``): windows taken at evenly spaced
  positions among all windows of the validation split, each run from the initial state.
- :func:`carried_validation_batches` and :func:`carried_loss` (a ``train.carry_state`` run;
  ``val_loss_carried``): the validation documents streamed as ``titans-lm eval --context=carry``
  streams them (:func:`titans_lm.data.windows.stream_batches`: each row reads its documents from
  their start, window after window, with the model state carried from one window to the next),
  the first ``train.eval_batches`` window batches of it. What a carry_state run is trained for is
  this carried use; the reset windows alone never show what the carried state adds. Both sets
  score a document's first window alike (the carried state is still the initial one there).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from titans_lm.data.windows import document_windows, stream_batches
from titans_lm.train.carry import model_state_shardings
from titans_lm.train.state import Carry, ModelFns, initial_model_state
from titans_lm.train.step import jit_carried_eval_step


def validation_batches(store, *, seq_len: int, batch_size: int, n_batches: int, multiple: int
                       ) -> list[dict[str, np.ndarray]]:
    """A fixed set of validation batches: ``n_batches * batch_size`` evaluation windows taken at
    evenly spaced positions among all windows of the split's documents (deterministic).

    Rows are the windows of :func:`titans_lm.data.windows.document_windows`; the batch is padded with
    all-padding rows (weight 0) up to a multiple of ``multiple`` (the batch shards).
    """
    rows = [document_windows(store.doc_tokens(d), seq_len, segment_id=d + 1)
            for d in range(store.num_docs)]
    tokens = np.concatenate([r[0] for r in rows])
    segs = np.concatenate([r[1] for r in rows])
    want = min(n_batches * batch_size, len(tokens))
    pick = np.unique(np.linspace(0, len(tokens) - 1, want).round().astype(np.int64))
    tokens, segs = tokens[pick], segs[pick]
    bsz = -(-batch_size // multiple) * multiple
    out = []
    for i in range(0, len(tokens), batch_size):
        t, s = tokens[i:i + batch_size], segs[i:i + batch_size]
        pad = bsz - len(t)
        out.append({"tokens": np.pad(t, ((0, pad), (0, 0))),
                    "segment_ids": np.pad(s, ((0, pad), (0, 0)))})
    return out


def carried_validation_batches(store, *, seq_len: int, batch_size: int, n_batches: int,
                               multiple: int) -> list[dict[str, np.ndarray]]:
    """The first ``n_batches`` window batches of the split's documents streamed in carry mode
    (:func:`titans_lm.data.windows.stream_batches`), ``batch_size`` rows rounded up to a multiple
    of ``multiple`` (the batch shards); fewer batches when the documents end sooner.

    Returns a list of ``{"tokens", "segment_ids"}: int32 [rows, seq_len + 1]``, to be run in
    order with the state carried (:func:`carried_loss`).
    """
    docs = [store.doc_tokens(d) for d in range(store.num_docs)]
    rows = -(-int(batch_size) // multiple) * multiple
    return list(itertools.islice(stream_batches(docs, seq_len=seq_len, n_rows=rows), n_batches))


def carried_loss(step_fn: Callable, params: Any, state: Any, batches: list[dict],
                 put: Callable = lambda b: b) -> tuple[float, float]:
    """``(nll_sum, n_tokens)`` of ``batches`` run in order from ``state``, each from the state
    the previous one left: ``step_fn(params, state, put(batch)) -> (nll_sum, n_tokens, state)``
    (``titans_lm.train.step.jit_carried_eval_step``; it may donate ``state``)."""
    nll, n = 0.0, 0.0
    for b in batches:
        a, c, state = step_fn(params, state, put(b))
        nll, n = nll + float(a), n + float(c)
    return nll, n


def make_carried_validation(fns: ModelFns, params_sh: Any, mesh, rows: int
                            ) -> Callable[[Any, list[dict], Callable], tuple[float, float]]:
    """``score(params, batches, put) -> (nll_sum, n_tokens)``: :func:`carried_loss` of the
    carried validation batches (``rows`` rows each) from the initial model state in float32
    (``titans_lm.train.state.initial_model_state``), with the jitted carried eval step; the
    state is sharded like the batch (``titans_lm.train.carry.model_state_shardings``)."""
    carry = Carry(batch_size=int(rows), compute_dtype="float32")
    abs_params = fns.abstract_params()
    state_sh = model_state_shardings(
        lambda b: jax.eval_shape(lambda p: initial_model_state(fns, carry, p, b), abs_params),
        carry.batch_size, mesh)
    init = jax.jit(lambda p: initial_model_state(fns, carry, p), in_shardings=(params_sh,),
                   out_shardings=state_sh)
    step = jit_carried_eval_step(fns, params_sh, state_sh, mesh)

    def score(params: Any, batches: list[dict], put: Callable = lambda b: b
              ) -> tuple[float, float]:
        return carried_loss(step, params, init(params), batches, put)
    return score
