"""MQAR pair sensitivity (titans_lm.eval.recall) against exact toy predictors: a perfect recaller,
one that sees only a window, and one that ignores its past."""

import math

import numpy as np
import pytest

from titans_lm.data.tasks import mqar_example, solve_mqar
from titans_lm.eval.recall import pair_sensitivity, query_pairs

V, L, N = 64, 64, 8


def _rows(n=8, seed=0):
    rng = np.random.default_rng(seed)
    rows = [mqar_example(rng, L, N, V) for _ in range(n)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def _recaller(window=None):
    """Logits of an exact key-value lookup over the last ``window`` inputs (None: all)."""
    def logits(x_NL):
        out = np.zeros(x_NL.shape + (V,))
        for n, row in enumerate(x_NL):
            for t in range(row.shape[0]):
                lo = 0 if window is None else max(0, t - window)
                for s in range(max(lo, 1), t):  # latest pair (row[s - 1], row[s]) keyed by row[t]
                    if row[s - 1] == row[t] and row[s] >= V // 2:
                        out[n, t, :] = 0.0
                        out[n, t, row[s]] = 1.0
                out[n, t, row[t] % V] += 0.5  # something that depends on the query token
        return out
    return logits


def test_query_pairs_point_at_the_answers():
    tokens, mask = _rows()
    for b in range(tokens.shape[0]):
        qp = query_pairs(tokens[b], mask[b], N)
        assert [tokens[b, pv] for _, pv, _ in qp] == list(solve_mqar(tokens[b], mask[b], N))
        assert all(po != pv and tokens[b, po] >= V // 2 for _, pv, po in qp)
        assert [t + 1 for t, _, _ in qp] == list(np.flatnonzero(mask[b]))
    bad = tokens[0].copy()
    bad[np.flatnonzero(mask[0])[0] - 1] = 3
    with pytest.raises(ValueError, match="not one of the row's 8 context keys"):
        query_pairs(bad, mask[0], N)


def test_a_recaller_depends_on_its_own_pair_only():
    tokens, mask = _rows()
    r = pair_sensitivity(_recaller(), tokens, mask, N, V, min_distance=8, batch_size=5)
    assert r["n_queries"] > 10
    assert r["own_median"] > 1.0 and r["other_median"] == 0.0
    assert math.isnan(r["selectivity"])


def test_a_window_or_no_past_shows_nothing_beyond_reach():
    tokens, mask = _rows()
    near = pair_sensitivity(_recaller(window=20), tokens, mask, N, V, min_distance=1)
    far = pair_sensitivity(_recaller(window=20), tokens, mask, N, V, min_distance=21)
    assert near["own_median"] > 1.0 or near["own_mean"] > 0.3  # in reach: it recalls
    assert far["n_queries"] > 0 and far["own_mean"] == 0.0 and far["other_mean"] == 0.0
    blind = pair_sensitivity(lambda x: np.eye(V)[x % V], tokens, mask, N, V)
    assert blind["own_mean"] == 0.0 and blind["other_mean"] == 0.0
    none = pair_sensitivity(_recaller(), tokens, mask, N, V, min_distance=10 * L)
    assert none["n_queries"] == 0 and math.isnan(none["own_median"])


def test_chunk_key_cosine_exact_cases():
    from titans_lm.eval.recall import chunk_key_cosine
    same = np.tile(np.array([1.0, 2.0, 0.0]), (1, 1, 8, 1))
    assert chunk_key_cosine(same, 4) == pytest.approx(1.0)
    eye = np.eye(4)[None, None]                                 # orthogonal keys in one chunk
    assert chunk_key_cosine(eye, 4) == pytest.approx(0.0)
    # Two chunks: one of identical keys (1), one of +e, -e alternating (2 pairs at 1, 4 at -1)
    alt = np.array([[1.0, 0], [-1, 0], [1, 0], [-1, 0]])
    keys = np.concatenate([np.tile([[0.0, 3.0]], (4, 1)), alt])[None, None]
    assert chunk_key_cosine(keys, 4) == pytest.approx((1.0 + (2 - 4) / 6) / 2)
    assert chunk_key_cosine(keys[:, :, :6], 4) == pytest.approx(1.0)  # the partial chunk is left out
    assert math.isnan(chunk_key_cosine(keys[:, :, :3], 4))
    with pytest.raises(ValueError, match="chunk_size >= 2"):
        chunk_key_cosine(keys[0], 4)
