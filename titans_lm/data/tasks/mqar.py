"""MQAR rows of the synthetic tasks (row contract: :mod:`titans_lm.data.tasks`).

**MQAR** (multi-query associative recall; Arora, Eyuboglu et al. 2023, "Zoology: Measuring and
improving recall in efficient language models", section 3 and the ``multiquery_ar`` generator of
the Zoology repository), ``n`` pairs at length ``L``:

- keys are drawn without replacement from the key half of the vocabulary ``[4, V // 2)``, values
  without replacement from the value half ``[V // 2, V)`` (Zoology: ``[1, V // 2)`` and
  ``[V // 2, V)``; id 0 is its blank, here ids 0-3 are reserved);
- the context is ``k_1 v_1 k_2 v_2 ... k_n v_n`` (``2n`` tokens);
- the query region after it has ``space = (L - 2n) // 2`` slots at even offsets; ``n`` distinct
  slots ("gaps") are drawn without replacement with ``p(g) ∝ (g + 1) ** (a - 1)``, ``g = 0 ..
  space - 1`` (Zoology's power law, ``a = power_a = 0.01``: queries close to the context are
  the most likely); slot ``g`` of key ``k_i`` holds ``k_i`` at position ``2n + 2g`` and its value
  ``v_i`` right after it, the scored answer;
- every other position is a uniform random token of ``[4, V)`` (Zoology's ``random_non_queries``).
  Zoology keeps the answer only in the labels; in one teacher-forced row the answer is the next
  token, so it sits in the sequence too (it is only seen after it is predicted).

Needs ``4n <= L`` and ``n <= V // 2 - 4``.
"""

from __future__ import annotations

import numpy as np

N_RESERVED = 4  # PAD, UNK, BOS, EOS (titans_lm.config)


def mqar_example(rng: np.random.Generator, seq_len: int, num_pairs: int, vocab_size: int,
                 power_a: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """One MQAR row (see the module doc).

    Args:
      rng: the numpy generator the example is drawn from.
      seq_len: L; the row has L + 1 tokens (L predictions).
      num_pairs: n key-value pairs, each queried once.
      vocab_size: V.
      power_a: Zoology's power-law exponent a (1.0: uniform gaps).

    Returns:
      ``(tokens int32[L+1], loss_mask int32[L+1])``; exactly ``n`` positions are marked.

    Raises:
      ValueError: ``4n > L``, too few keys for ``n``, or non-positive sizes.
    """
    L, n, V = int(seq_len), int(num_pairs), int(vocab_size)
    if n < 1 or L < 4 * n:
        raise ValueError(f"MQAR needs 1 <= num_pairs and 4 * num_pairs <= seq_len (Zoology's "
                         f"context + query region), got num_pairs={n}, seq_len={L}")
    half = V // 2
    if n > half - N_RESERVED or n > V - half:
        raise ValueError(f"MQAR with num_pairs={n} needs vocab_size >= {2 * (n + N_RESERVED)}, "
                         f"got {V}")
    if power_a <= 0:
        raise ValueError(f"power_a must be positive, got {power_a}")
    keys = rng.choice(np.arange(N_RESERVED, half), size=n, replace=False)
    values = rng.choice(np.arange(half, V), size=n, replace=False)
    space = (L - 2 * n) // 2
    p = np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1.0)
    gaps = rng.choice(space, size=n, replace=False, p=p / p.sum())
    tokens = rng.integers(N_RESERVED, V, size=L + 1)
    tokens[0:2 * n:2] = keys
    tokens[1:2 * n:2] = values
    query = 2 * n + 2 * gaps
    tokens[query] = keys
    tokens[query + 1] = values
    mask = np.zeros(L + 1, np.int32)
    mask[query + 1] = 1
    return tokens.astype(np.int32), mask


def solve_mqar(tokens: np.ndarray, loss_mask: np.ndarray, num_pairs: int) -> np.ndarray:
    """The exact answers of an MQAR row from the row alone: a dict of the ``num_pairs`` context
    pairs, looked up at the token before each marked position. Returns int32[#marked]."""
    table = {int(tokens[2 * i]): int(tokens[2 * i + 1]) for i in range(num_pairs)}
    return np.array([table[int(tokens[t - 1])] for t in np.flatnonzero(loss_mask)], np.int32)
