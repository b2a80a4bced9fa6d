"""Does a prediction depend on the pair it must recall? MQAR's pair sensitivity.

Accuracy says whether a model recalls; this says what its prediction at a query depends on, also
before training and for a model stuck at chance. For each MQAR query (the key ``k_i`` repeated
after the context; the model must predict ``v_i``) whose pair's value ``v_i`` lies at least
``min_distance`` tokens back, the value token is replaced by another value and the change of the
query's logits is measured relative to their spread:

    s = ||logits_t(x with v_i replaced) - logits_t(x)|| / ||logits_t(x) - mean(logits_t(x))||

``own``: replacing the queried pair's value ``v_i``; ``other``: replacing the value of a
neighbouring pair (``v_{i+1}``, cyclically) in the same row. Causal models only see the change
through what carries context: attention within its window, a convolution within its kernel, the
memory's state beyond both. With ``min_distance`` beyond the attention window and the
convolution, ``own`` is what the memory passes on about the pair, and ``own / other`` (the
selectivity) whether it is that pair's value or interference: a model that recalls has
``own >> other``, one that ignores its past has both near 0.

The perturbation keeps the row a valid MQAR row up to the query: the replacement is a value id
(the value half ``[V // 2, V)``), and the answer position (after the query) is not read by the
query's causal prediction.

Why a memory does not recall can show in what it writes: :func:`chunk_key_cosine` measures how
alike the keys of one write are (a memory whose keys are all alike stores a blur).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Logits = Callable[[np.ndarray], np.ndarray]


def query_pairs(tokens_L1: np.ndarray, loss_mask_L1: np.ndarray, num_pairs: int
                ) -> list[tuple[int, int, int]]:
    """``(t, value_pos, other_value_pos)`` for each query of one MQAR row.

    ``t`` is the input position of the query key (its prediction is scored at ``t + 1``),
    ``value_pos`` the position of its pair's value in the context, ``other_value_pos`` that of the
    next pair's value (cyclically). Positions index the inputs ``tokens[:-1]``.

    Raises:
      ValueError: a query key that is not one of the row's ``num_pairs`` context keys.
    """
    keys = [int(k) for k in tokens_L1[0:2 * num_pairs:2]]
    out = []
    for answer in np.flatnonzero(loss_mask_L1):
        t = int(answer) - 1
        key = int(tokens_L1[t])
        if key not in keys:
            raise ValueError(f"query at position {t} holds {key}, not one of the row's "
                             f"{num_pairs} context keys: not an MQAR row with {num_pairs} pairs")
        i = keys.index(key)
        out.append((t, 2 * i + 1, 2 * ((i + 1) % num_pairs) + 1))
    return out


def _other_value(v: int, vocab_size: int, shift: int = 7) -> int:
    """A different id of the value half ``[V // 2, V)``."""
    half = vocab_size // 2
    n = vocab_size - half
    return half + (v - half + (shift % n or 1)) % n


def pair_sensitivity(logits_fn: Logits, tokens_BL1: np.ndarray, loss_mask_BL1: np.ndarray,
                     num_pairs: int, vocab_size: int, *, min_distance: int = 1,
                     batch_size: int = 32) -> dict[str, float]:
    """Own-pair and other-pair sensitivity of the query predictions (see the module doc).

    Args:
      logits_fn: ``inputs int32[N, L] -> logits float[N, L, V]`` (one parallel call per batch).
      tokens_BL1, loss_mask_BL1: MQAR rows ``int32[B, L+1]`` (``titans_lm.data.tasks``).
      num_pairs: pairs per row.
      vocab_size: V (the replacement is drawn from the value half).
      min_distance: only queries at least this many tokens after their pair's value (and after
        the other pair's value) count.
      batch_size: rows per ``logits_fn`` call.

    Returns:
      ``{"n_queries", "own_median", "other_median", "own_mean", "other_mean", "selectivity"}``
      (selectivity = own_median / other_median; NaN when nothing qualifies or other is 0).
    """
    inputs = np.asarray(tokens_BL1)[:, :-1]
    base_rows, perturbed, where = [], [], []
    for b in range(inputs.shape[0]):
        for t, pv, po in query_pairs(tokens_BL1[b], loss_mask_BL1[b], num_pairs):
            if t - max(pv, po) < min_distance:
                continue
            for kind, pos in (("own", pv), ("other", po)):
                x = inputs[b].copy()
                x[pos] = _other_value(int(x[pos]), vocab_size)
                perturbed.append(x)
                where.append((kind, b, t))
        base_rows.append(inputs[b])

    def run(rows: Sequence[np.ndarray]) -> np.ndarray:
        out = []
        for s in range(0, len(rows), batch_size):
            chunk = np.stack(rows[s:s + batch_size])
            n = chunk.shape[0]
            if n < batch_size:  # one compiled shape
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - n, 0)])
            out.append(np.asarray(logits_fn(chunk), np.float64)[:n])
        return np.concatenate(out) if out else np.zeros((0,))

    if not perturbed:
        nan = float("nan")
        return {"n_queries": 0, "own_median": nan, "other_median": nan, "own_mean": nan,
                "other_mean": nan, "selectivity": nan}
    base = run(base_rows)
    moved = run(perturbed)
    scores = {"own": [], "other": []}
    for (kind, b, t), logits in zip(where, moved):
        ref = base[b, t]
        scores[kind].append(np.linalg.norm(logits[t] - ref) / max(np.linalg.norm(ref - ref.mean()),
                                                                   1e-30))
    own, other = np.asarray(scores["own"]), np.asarray(scores["other"])
    o_med, x_med = float(np.median(own)), float(np.median(other))
    return {"n_queries": int(own.size), "own_median": o_med, "other_median": x_med,
            "own_mean": float(own.mean()), "other_mean": float(other.mean()),
            "selectivity": o_med / x_med if x_med > 0 else float("nan")}


def chunk_key_cosine(k_BHTD: np.ndarray, chunk_size: int) -> float:
    """Mean cosine between the keys of two distinct tokens of one chunk, over every chunk, head
    and row: how alike the keys are that one chunk of the memory's write stores.

    Keys that are all alike (cosine near 1) make the memory a blur: every read returns about the
    same mixture of the stored values, whatever the query (``own ~ other`` above); the write's
    stability bound (``titans_lm.memory.config.MemoryConfig.write_gain``) assumes cosine 1, the
    worst case.

    Args:
      k_BHTD: keys float[B, H, T, Dh] as the memory writes them; only the T // chunk_size whole
        chunks count.
      chunk_size: b >= 2 tokens per chunk.

    Returns:
      The mean off-diagonal cosine (NaN without a whole chunk).

    Raises:
      ValueError: for chunk_size < 2 or keys that are not 4-D.
    """
    k = np.asarray(k_BHTD, np.float64)
    if k.ndim != 4 or chunk_size < 2:
        raise ValueError(f"want keys [B, H, T, Dh] and chunk_size >= 2, got {k.shape} and "
                         f"{chunk_size}")
    B, H, T, Dh = k.shape
    n = T // chunk_size
    if n == 0:
        return float("nan")
    k = k[:, :, :n * chunk_size].reshape(B, H, n, chunk_size, Dh)
    k = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-30)
    cos = np.einsum("bhcid,bhcjd->bhcij", k, k)
    off = ~np.eye(chunk_size, dtype=bool)
    return float(cos[..., off].mean())
