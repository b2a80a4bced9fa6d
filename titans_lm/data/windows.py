"""Evaluation windows: each document scored on its own, every token after BOS predicted once.

A document ``t[0..L-1]`` (``t[0]`` = BOS) has ``L - 1`` tokens to predict, ``t[1..L-1]``. With the
training length ``T`` it is cut into ``ceil((L - 1) / T)`` consecutive, non-overlapping windows;
window ``w`` holds the ``T + 1`` tokens ``t[wT .. wT+T]`` (inputs ``t[wT .. wT+T-1]``, targets
``t[wT+1 .. wT+T]``), so its first input is the previous window's last target. The last window is
padded with PAD (segment 0). A window never holds two documents.

Rows follow the batch contract (``titans_lm.config`` / the data pipeline): segment id
``doc_index + 1`` on real tokens, 0 on padding, so the training loss weight
``(seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)`` is 1 exactly on the scored targets.
A window other than a document's first starts mid-document; the model sees it as a fresh
segment (positions restart at 0), the usual non-overlapping evaluation protocol.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

import numpy as np

from titans_lm.config import BOS_ID, PAD_ID


def num_windows(doc_length: int, seq_len: int) -> int:
    """Windows for a document of ``doc_length`` tokens (BOS included): ``ceil((L - 1) / T)``."""
    return -(-(doc_length - 1) // seq_len) if doc_length > 1 else 0


def document_windows(doc_tokens: Sequence[int] | np.ndarray, seq_len: int,
                     segment_id: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The windows of one document.

    Args:
      doc_tokens: int[L], beginning with BOS.
      seq_len: T, the number of predicted tokens per window.
      segment_id: the id (>= 1) written on the document's real tokens.

    Returns:
      ``(tokens, segment_ids)``, both int32[num_windows(L, T), T + 1].

    Raises:
      ValueError: the document does not begin with BOS, or ``seq_len < 1`` / ``segment_id < 1``.
    """
    toks = np.asarray(doc_tokens, dtype=np.int32).reshape(-1)
    if toks.size == 0 or toks[0] != BOS_ID:
        raise ValueError(f"an evaluation document must begin with BOS={BOS_ID}, got {toks[:1].tolist()}")
    if seq_len < 1 or segment_id < 1:
        raise ValueError(f"seq_len and segment_id must be >= 1, got {seq_len}, {segment_id}")
    n = num_windows(toks.size, seq_len)
    starts = np.arange(n, dtype=np.int64)[:, None] * seq_len
    idx = starts + np.arange(seq_len + 1, dtype=np.int64)[None, :]
    real = idx < toks.size
    tokens = np.where(real, toks[np.minimum(idx, toks.size - 1)], PAD_ID).astype(np.int32)
    segment_ids = np.where(real, segment_id, 0).astype(np.int32)
    return tokens, segment_ids


def eval_batches(docs_tokens: Sequence[Sequence[int] | np.ndarray], *, seq_len: int, batch_size: int,
                 pad_last_batch: bool = True) -> Iterator[dict[str, np.ndarray]]:
    """Batches of evaluation windows over ``docs_tokens``, documents in order.

    Args:
      docs_tokens: one token sequence per document, each beginning with BOS.
      seq_len: T, the training window length.
      batch_size: rows per batch.
      pad_last_batch: fill the last batch with all-padding rows (weight 0) so every batch has
        ``batch_size`` rows (one compiled shape); otherwise the last batch may be smaller.

    Yields:
      ``{"tokens": int32[B, T+1], "segment_ids": int32[B, T+1]}``; document ``d``'s rows carry
      segment id ``d + 1``.

    Raises:
      ValueError: see :func:`document_windows`; ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    tok_rows: list[np.ndarray] = []
    seg_rows: list[np.ndarray] = []

    def flush(rows: int) -> dict[str, np.ndarray]:
        tokens = np.stack(tok_rows[:rows])
        segs = np.stack(seg_rows[:rows])
        del tok_rows[:rows], seg_rows[:rows]
        return {"tokens": tokens, "segment_ids": segs}

    for d, doc in enumerate(docs_tokens):
        tokens, segs = document_windows(doc, seq_len, segment_id=d + 1)
        tok_rows.extend(tokens)
        seg_rows.extend(segs)
        while len(tok_rows) >= batch_size:
            yield flush(batch_size)
    if tok_rows:
        if pad_last_batch:
            missing = batch_size - len(tok_rows)
            tok_rows.extend(np.full((missing, seq_len + 1), PAD_ID, np.int32))
            seg_rows.extend(np.zeros((missing, seq_len + 1), np.int32))
        yield flush(len(tok_rows))


def assign_rows(window_counts: Sequence[int], n_rows: int) -> tuple[list[list[int]], int]:
    """Which row streams which document: documents in order, each to the row that frees first.

    Args:
      window_counts: windows of each document (0 for a document with nothing to score).
      n_rows: batch rows.

    Returns:
      ``(rows, n_steps)``: ``rows[r]`` lists the document indices row ``r`` streams, in order;
      ``n_steps`` the number of window steps until every row is done. Ties go to the lowest row.
    """
    if n_rows < 1:
        raise ValueError(f"n_rows must be >= 1, got {n_rows}")
    heap = [(0, r) for r in range(n_rows)]
    rows: list[list[int]] = [[] for _ in range(n_rows)]
    for d, n in enumerate(window_counts):
        if n <= 0:
            continue
        t, r = heapq.heappop(heap)
        rows[r].append(d)
        heapq.heappush(heap, (t + int(n), r))
    return rows, max(t for t, _ in heap)


def stream_batches(docs_tokens: Sequence[np.ndarray], *, seq_len: int, n_rows: int
                   ) -> Iterator[dict[str, np.ndarray]]:
    """The window batches of carry mode (``titans_lm.eval.streaming``; the validation of a
    ``train.carry_state`` run), one per step: each row streams its documents
    (:func:`assign_rows`) window after window; a document's first window carries its own segment
    id, so the model starts a new document there.

    Args:
      docs_tokens: one int token array per document, each beginning with BOS.
      seq_len: T. n_rows: batch rows.

    Yields:
      ``{"tokens": int32[n_rows, T+1], "segment_ids": int32[n_rows, T+1]}``; row ``r`` of
      consecutive batches holds consecutive windows of its documents
      (:func:`titans_lm.data.windows.document_windows`, segment id ``d + 1`` for document ``d``),
      padding rows (all 0) once its documents are done.

    Raises:
      ValueError: see :func:`document_windows`.
    """
    counts = [num_windows(len(t), seq_len) for t in docs_tokens]
    rows, n_steps = assign_rows(counts, n_rows)
    queues = [list(reversed(r)) for r in rows]
    current: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n_rows
    cursor = [0] * n_rows
    for _ in range(n_steps):
        tokens = np.full((n_rows, seq_len + 1), PAD_ID, np.int32)
        segs = np.zeros((n_rows, seq_len + 1), np.int32)
        for r in range(n_rows):
            if current[r] is None or cursor[r] >= len(current[r][0]):
                current[r], cursor[r] = None, 0
                if queues[r]:
                    d = queues[r].pop()
                    current[r] = document_windows(docs_tokens[d], seq_len, segment_id=d + 1)
            if current[r] is not None:
                tokens[r], segs[r] = current[r][0][cursor[r]], current[r][1][cursor[r]]
                cursor[r] += 1
        yield {"tokens": tokens, "segment_ids": segs}
