"""Document starts from segment ids (0 = padding, a change to a non-zero id starts a document)."""

import jax.numpy as jnp
import numpy as np

from titans_lm.memory.documents import document_index, document_starts


def test_document_starts_and_index():
    seg = jnp.array([[1, 1, 2, 2, 0, 0, 3, 3], [0, 0, 5, 5, 5, 5, 5, 5]])
    starts = np.asarray(document_starts(seg))
    assert starts[0].nonzero()[0].tolist() == [0, 2, 6]
    assert starts[1].nonzero()[0].tolist() == [2]       # padding is not a document start
    assert np.asarray(document_index(seg)).tolist() == [[1, 1, 2, 2, 2, 2, 3, 3],
                                                        [0, 0, 1, 1, 1, 1, 1, 1]]
