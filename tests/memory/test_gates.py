"""Gate parametrisations."""

import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory.gates import first_of_chunk, titans_theta, ttt_theta


def test_gate_ranges():
    pre = jnp.linspace(-20.0, 20.0, 41)
    th = np.asarray(titans_theta(pre, 0.3))
    assert np.all((th >= 0) & (th <= 0.3)) and th[20] == pytest.approx(0.15)
    lr = np.asarray(ttt_theta(pre, 1.0, 64))
    assert np.all((lr >= 0) & (lr <= 1 / 64)) and lr[20] == pytest.approx(0.5 / 64)


def test_first_of_chunk_is_causal_per_chunk():
    pre = jnp.arange(10.0).reshape(1, 10, 1)
    out = np.asarray(first_of_chunk(pre, 4))[0, :, 0]
    assert out.tolist() == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]
    assert np.all(out <= np.arange(10))   # never a later position


def test_first_of_chunk_starts_a_mini_batch_at_a_document_start():
    pre = jnp.arange(10.0).reshape(1, 10, 1)
    starts = jnp.zeros((1, 10), bool).at[0, 2].set(True).at[0, 6].set(True).at[0, 8].set(True)
    out = np.asarray(first_of_chunk(pre, 4, starts))[0, :, 0]
    assert out.tolist() == [0, 0, 2, 2, 4, 4, 6, 6, 8, 8]
