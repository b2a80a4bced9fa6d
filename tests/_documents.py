"""Random token documents for the streaming-evaluation tests: BOS then uniform ids in [4, vocab)."""

from __future__ import annotations

import numpy as np

from titans_lm.config import BOS_ID


def random_docs(lengths, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """One int32 document per length (its first token BOS), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        t = rng.integers(4, vocab, n).astype(np.int32)
        t[0] = BOS_ID
        out.append(t)
    return out
