"""Sampling: greedy, top-k and top-p filtering against a plain numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.generate.sampling import SamplingConfig, filter_logits, sample_logits


def _ref_filter(x, top_k, top_p):
    """Per row: keep the top-k ids (by value, ties at the k-th kept), then the smallest set of the
    most likely ids whose probability reaches top_p."""
    x = np.asarray(x, np.float64).copy()
    for row in x:
        if 0 < top_k < row.size:
            kth = np.sort(row)[::-1][top_k - 1]
            row[row < kth] = -np.inf
        if top_p < 1:
            order = np.argsort(-row, kind="stable")
            p = np.exp(row[order] - row[order[0]])
            p /= p.sum()
            keep = np.zeros(row.size, bool)
            mass = 0.0
            for i, idx in enumerate(order):
                if mass < top_p:
                    keep[idx] = True
                mass += p[i]
            kept_min = row[keep].min()
            row[row < kept_min] = -np.inf
    return x


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (1, 1.0), (5, 1.0), (0, 0.5), (0, 0.9),
                                         (7, 0.8), (40, 0.3)])
def test_filter_matches_reference(top_k, top_p):
    x = jax.random.normal(jax.random.key(0), (4, 37)) * 3
    got = np.asarray(filter_logits(x, top_k, top_p))
    want = _ref_filter(np.asarray(x), top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-6)
    assert np.isfinite(got).any(axis=-1).all()  # the most likely id always stays


def test_greedy_is_argmax_and_ignores_the_key():
    x = jax.random.normal(jax.random.key(1), (3, 50))
    cfg = SamplingConfig(temperature=0.0)
    a = sample_logits(x, jax.random.split(jax.random.key(0), 3), cfg)
    b = sample_logits(x, jax.random.split(jax.random.key(9), 3), cfg)
    np.testing.assert_array_equal(a, np.argmax(np.asarray(x), -1))
    np.testing.assert_array_equal(a, b)
    assert a.dtype == jnp.int32


def test_samples_stay_in_the_kept_set_and_follow_the_distribution():
    x = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(0), 4000)
    draw = jax.vmap(lambda k: sample_logits(x, k[None], SamplingConfig(1.0, top_k=0, top_p=0.7)))
    ids = np.asarray(draw(keys))[:, 0]
    assert set(ids.tolist()) <= {0, 1}  # 0.5 + 0.3 reaches 0.7: ids 2, 3 are cut
    np.testing.assert_allclose(np.mean(ids == 0), 0.5 / 0.8, atol=0.03)
    draw_k = jax.vmap(lambda k: sample_logits(x, k[None], SamplingConfig(2.0, top_k=3)))
    ids = np.asarray(draw_k(keys))[:, 0]
    p = np.array([0.5, 0.3, 0.15]) ** 0.5
    np.testing.assert_allclose(np.bincount(ids, minlength=4)[:3] / len(ids), p / p.sum(), atol=0.03)
    assert (ids != 3).all()


def test_a_row_draw_depends_on_its_own_key_only():
    x = jax.random.normal(jax.random.key(2), (2, 30))
    cfg = SamplingConfig(1.0)
    k = jax.random.split(jax.random.key(3), 3)
    a = sample_logits(x, jnp.stack([k[0], k[1]]), cfg)
    b = sample_logits(x, jnp.stack([k[0], k[2]]), cfg)
    assert a[0] == b[0]


@pytest.mark.parametrize("kw,flag", [({"temperature": -1.0}, "--temperature"),
                                     ({"top_k": -2}, "--top_k"), ({"top_p": 0.0}, "--top_p"),
                                     ({"top_p": 1.5}, "--top_p")])
def test_bad_settings_are_named(kw, flag):
    with pytest.raises(ValueError, match=flag):
        SamplingConfig(**kw)
