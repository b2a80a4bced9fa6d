"""The six MAD tasks (Mechanistic Architecture Design; Poli et al. 2024, arXiv:2403.17844, and the
task generators of its repository athms/mad-lab), as rows of the synthetic-task contract.

Each generator draws one MAD example from a numpy generator, in MAD's own token ids ``0 .. V-1``
(its special tokens at the top of the vocabulary) and MAD's form: ``inputs int[S]`` and
``targets int[S]``, ``targets[i]`` the token the model must output at input ``i``, or
:data:`IGNORE` (-100, MAD's ``target_ignore_idx``) where nothing is scored. :func:`mad_row` turns
one into a row of ``titans_lm.data.tasks`` (ids shifted by :data:`N_RESERVED`, a ``targets`` row
next to ``tokens`` and ``loss_mask``).

- **in-context recall** (multi-query, as MAD's benchmark runs it): ``S // 2`` key-value pairs,
  keys from the lower half of the vocabulary, values from the upper half, a key's value fixed
  within the row; the row ends with a pair whose key was shown before. Test rows score every
  value whose key already appeared; training rows score every next token (MAD trains these on
  the plain language-modelling targets).
- **noisy in-context recall**: the same with a noise vocabulary of ``noise_vocab_size`` ids above
  the keys and values; each pair is replaced, with probability ``frac_noise``, by two noise
  tokens (never scored).
- **fuzzy in-context recall**: keys and values are motifs of 1 .. ``k_motif_size`` /
  ``v_motif_size`` distinct tokens (test keys always ``k_motif_size`` long); one probe pair is
  placed at a random offset and repeated at the end; rows are left-padded with a pad id to
  ``S + 1`` tokens.
- **selective copying**: ``n = num_tokens_to_copy`` tokens scattered among blanks, a copy token,
  then ``n`` blanks at which the tokens must be output in order.
- **compression**: ``S - 1`` random tokens and a compression token; the model must reconstruct
  the whole sequence (see :func:`compression` for how that is posed to a causal LM).
- **memorization**: a fixed key-to-value map (from the seed) that the weights must learn: rows
  of ``key, insert`` pairs, the value scored at each insert token.

Token budgets, the difficulty settings and the sizes are :mod:`titans_lm.data.tasks.mad_settings`.
"""

from __future__ import annotations

import numpy as np

from titans_lm.data.tasks.mqar import N_RESERVED

IGNORE = -100  # MAD's target_ignore_idx


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def in_context_recall(rng: np.random.Generator, vocab_size: int, seq_len: int, *, train: bool,
                      noise_vocab_size: int = 0, frac_noise: float = 0.0
                      ) -> tuple[np.ndarray, np.ndarray]:
    """One (noisy) in-context recall example, MAD's multi-query form.

    Vocabulary: keys ``[0, n/2)``, values ``[n/2, n)`` with ``n = vocab_size - noise_vocab_size``,
    noise ``[n, vocab_size)``. The stream has ``seq_len`` tokens (``seq_len // 2`` pairs; one
    pair, chosen at random among the first ``seq_len // 2 - 1``, is never noise); inputs are its
    first ``seq_len - 1`` tokens, targets the next token at each.

    Returns:
      ``(inputs int64[seq_len-1], targets int64[seq_len-1])``, targets :data:`IGNORE` where not
      scored.

    Raises:
      ValueError: an odd or too short ``seq_len``, too small a vocabulary, a noise fraction
        outside [0, 1) or noise without a noise vocabulary.
    """
    V, S = int(vocab_size), int(seq_len)
    _need(S >= 4 and S % 2 == 0, f"in-context recall needs an even seq_len >= 4, got {S}")
    _need(0.0 <= frac_noise < 1.0, f"frac_noise must be in [0, 1), got {frac_noise}")
    _need(frac_noise == 0 or noise_vocab_size > 0,
          f"frac_noise={frac_noise} needs noise_vocab_size > 0")
    n = V - noise_vocab_size
    _need(n >= 2, f"in-context recall with vocab_size={V} and noise_vocab_size={noise_vocab_size} "
                  f"leaves {n} ids for keys and values; it needs at least 2")
    half = n // 2
    n_pairs = S // 2
    keep = int(rng.integers(n_pairs - 1))
    value_of: dict[int, int] = {}
    stream: list[int] = []
    scored: list[bool] = []
    for i in range(n_pairs - 1):
        if frac_noise > 0 and i != keep and rng.random() < frac_noise:
            stream += [int(x) for x in rng.integers(n, V, size=2)]
            scored += [False, False]
            continue
        k = int(rng.integers(half))
        seen = k in value_of
        if not seen:
            value_of[k] = int(rng.integers(half, n))
        stream += [k, value_of[k]]
        scored += [False, seen]
    probe = int(rng.choice(sorted(value_of)))
    stream += [probe, value_of[probe]]
    scored += [False, True]
    stream_a = np.array(stream, np.int64)
    targets = stream_a[1:].copy()
    if not train:
        targets[~np.array(scored[1:])] = IGNORE
    return stream_a[:-1], targets


def fuzzy_in_context_recall(rng: np.random.Generator, vocab_size: int, seq_len: int, *,
                            train: bool, k_motif_size: int = 3, v_motif_size: int = 3,
                            noise_vocab_size: int = 0, frac_noise: float = 0.0
                            ) -> tuple[np.ndarray, np.ndarray]:
    """One fuzzy in-context recall example, MAD's multi-query form.

    Vocabulary: pad ``vocab_size - 1``; keys ``[0, n/2)`` and values ``[n/2, n)`` with ``n =
    vocab_size - 1 - noise_vocab_size``; a key (value) is a motif of 1 .. ``k_motif_size``
    (``v_motif_size``) distinct tokens in order, its size drawn per pair (test keys:
    ``k_motif_size`` always). A probe pair is inserted once the row reaches a random offset and
    repeated at the end; the row is left-padded to ``seq_len + 1`` tokens. Scored (test): every
    value token of a pair whose key appeared before, except the inserted probe's, and the final
    value; training: every next token.

    Returns:
      ``(inputs int64[seq_len], targets int64[seq_len])``.

    Raises:
      ValueError: fewer keys than ``k_motif_size`` or values than ``v_motif_size``, a bad noise
        setting, or too short a ``seq_len``.
    """
    V, S, km, vm = int(vocab_size), int(seq_len), int(k_motif_size), int(v_motif_size)
    _need(km >= 1 and vm >= 1, f"motif sizes must be >= 1, got {km}, {vm}")
    _need(0.0 <= frac_noise < 1.0, f"frac_noise must be in [0, 1), got {frac_noise}")
    _need(frac_noise == 0 or noise_vocab_size > 0,
          f"frac_noise={frac_noise} needs noise_vocab_size > 0")
    pad = V - 1
    n = V - 1 - noise_vocab_size
    half = n // 2
    _need(half >= km and n - half >= vm,
          f"fuzzy recall with vocab_size={V} has {half} key ids and {n - half} value ids; motifs "
          f"of {km} / {vm} distinct tokens need vocab_size >= "
          f"{1 + noise_vocab_size + 2 * max(km, vm)}")
    _need(S > 4 * (km + vm), f"fuzzy recall needs seq_len > 4 * (k_motif_size + v_motif_size) = "
                             f"{4 * (km + vm)}, got {S}")

    def motif(lo: int, hi: int, size: int) -> tuple[int, ...]:
        return tuple(int(x) for x in rng.choice(np.arange(lo, hi), size=size, replace=False))

    def key_size() -> int:
        return int(rng.integers(1, km + 1)) if train else km

    pk_size = key_size()
    pv_size = int(rng.integers(1, vm + 1))
    p_key, p_value = motif(0, half, pk_size), motif(half, n, pv_size)
    probe_len = pk_size + pv_size
    probe_at = int(rng.integers(S - 2 * probe_len))
    value_of: dict[tuple, tuple] = {}
    presented: set[tuple] = set()
    inputs: list[int] = []
    targets: list[int] = []
    probe_added = False
    while len(inputs) < S - probe_len - (km + vm):
        ks, vs = key_size(), int(rng.integers(1, vm + 1))
        if len(inputs) >= probe_at and not probe_added:
            inputs += [*p_key, *p_value]
            targets += [IGNORE] * probe_len
            value_of[p_key] = p_value
            presented.add(p_key)
            probe_added = True
            continue
        if frac_noise > 0 and rng.random() < frac_noise:
            inputs += [int(x) for x in rng.integers(n, n + noise_vocab_size, size=ks + vs)]
            targets += [IGNORE] * (ks + vs)
            continue
        k = motif(0, half, ks)
        if k == p_key:
            v = p_value
            probe_added = True
        else:
            v = value_of.setdefault(k, motif(half, n, vs))
        inputs += [*k, *v]
        targets += [IGNORE] * len(k) + (list(v) if k in presented else [IGNORE] * len(v))
        presented.add(k)
    inputs += [*p_key, *p_value]
    targets += [IGNORE] * pk_size + list(p_value)
    n_pad = S + 1 - len(inputs)
    stream = np.array([pad] * n_pad + inputs, np.int64)
    marks = np.array([IGNORE] * n_pad + targets, np.int64)
    if train:
        return stream[:-1], stream[1:].copy()
    return stream[:-1], marks[1:]


def selective_copying(rng: np.random.Generator, vocab_size: int, seq_len: int, *,
                      num_tokens_to_copy: int) -> tuple[np.ndarray, np.ndarray]:
    """One selective copying example: ``n`` tokens of ``[0, V-2)`` with ``S - 2n - 1`` blanks
    (``V - 2``) inserted before random ones of them (never after the last), the copy token
    (``V - 1``), then ``n`` blanks whose targets are the ``n`` tokens in order.

    Returns:
      ``(inputs int64[seq_len], targets int64[seq_len])``; only the last ``n`` targets scored.

    Raises:
      ValueError: ``seq_len <= 2n + 1``, ``n < 1`` or ``vocab_size < 3``.
    """
    V, S, n = int(vocab_size), int(seq_len), int(num_tokens_to_copy)
    _need(n >= 1, f"num_tokens_to_copy must be >= 1, got {n}")
    _need(S > 2 * n + 1, f"selective copying needs seq_len > 2 * num_tokens_to_copy + 1 = "
                         f"{2 * n + 1}, got {S}")
    _need(V >= 3, f"selective copying needs vocab_size >= 3 (blank, copy and a token), got {V}")
    copy_token, blank = V - 1, V - 2
    n_blank = S - 2 * n - 1
    to_copy = rng.integers(V - 2, size=n)
    at = rng.integers(0, n, size=n_blank)
    body = np.insert(to_copy, at, blank)
    inputs = np.concatenate([body, [copy_token], np.full(n, blank)]).astype(np.int64)
    targets = np.concatenate([np.full(S - n, IGNORE), to_copy]).astype(np.int64)
    return inputs, targets


def compression(rng: np.random.Generator, vocab_size: int, seq_len: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """One compression example, posed to a causal LM.

    MAD's sequence is ``S - 1`` tokens of ``[0, V-1)`` and the compression token ``V - 1``, and
    its target is the sequence itself, decoded by MAD's encoder-decoder backbone from the last
    position's state. A causal LM gets the sequence, then ``S`` position queries (ids
    ``V .. V+S-1``, query ``i`` asks for token ``i``): inputs ``2S`` tokens, the last ``S`` targets scored (all
    ``S`` tokens, as MAD scores them). The vocabulary is ``V + S``.

    Returns:
      ``(inputs int64[2*seq_len], targets int64[2*seq_len])``.

    Raises:
      ValueError: ``seq_len < 2`` or ``vocab_size < 2``.
    """
    V, S = int(vocab_size), int(seq_len)
    _need(S >= 2 and V >= 2, f"compression needs seq_len >= 2 and vocab_size >= 2, got {S}, {V}")
    seq = np.concatenate([rng.integers(V - 1, size=S - 1), [V - 1]]).astype(np.int64)
    inputs = np.concatenate([seq, V + np.arange(S)])
    targets = np.concatenate([np.full(S, IGNORE), seq])
    return inputs, targets


def memorization_map(vocab_size: int, seed: int) -> dict[int, int]:
    """The fixed key -> value map of the memorization task: keys ``[0, n/2)`` paired at random
    (seeded by ``seed`` alone, so every split shares it) with distinct values of ``[n/2, n)``,
    ``n = vocab_size - 1`` (``V - 1`` is the insert token)."""
    n = int(vocab_size) - 1
    _need(n >= 2, f"memorization needs vocab_size >= 3, got {vocab_size}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x4D4144]))
    keys = rng.permutation(n // 2)
    values = rng.permutation(np.arange(n // 2, n))
    return {int(k): int(v) for k, v in zip(keys, values)}


def memorization(rng: np.random.Generator, vocab_size: int, seq_len: int,
                 kv_map: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One memorization example: ``seq_len // 2`` pairs ``key, insert`` (insert ``V - 1``), keys
    drawn uniformly from ``kv_map``; the target at each insert token is the key's value.

    Returns:
      ``(inputs int64[2*(seq_len//2)], targets int64[same])``.

    Raises:
      ValueError: ``seq_len < 2`` or an empty map.
    """
    V, S = int(vocab_size), int(seq_len)
    _need(S >= 2 and kv_map, f"memorization needs seq_len >= 2 and a key-value map, got {S}")
    keys = np.array(sorted(kv_map), np.int64)
    drawn = keys[rng.integers(len(keys), size=S // 2)]
    inputs = np.stack([drawn, np.full_like(drawn, V - 1)], axis=1).reshape(-1)
    values = np.array([kv_map[int(k)] for k in drawn], np.int64)
    targets = np.stack([np.full_like(drawn, IGNORE), values], axis=1).reshape(-1)
    return inputs, targets


def mad_row(inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A MAD example as a task row of ``L + 1`` tokens (``L = len(inputs)``, ids shifted by
    :data:`N_RESERVED`).

    Returns:
      ``(tokens, targets, loss_mask)`` int32[L+1]: ``tokens[:-1]`` the inputs (``tokens[-1]`` is
      PAD, never an input), ``targets[t + 1]`` the target of input ``t`` and ``loss_mask[t + 1]``
      1 where it is scored (``targets[0]``, ``loss_mask[0]`` are 0).
    """
    scored = targets != IGNORE
    tokens = np.concatenate([inputs + N_RESERVED, [0]]).astype(np.int32)
    tgt = np.concatenate([[0], np.where(scored, targets + N_RESERVED, 0)]).astype(np.int32)
    mask = np.concatenate([[0], scored]).astype(np.int32)
    return tokens, tgt, mask


def solve_recall(inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The scored targets of an (noisy) in-context recall test row from its inputs alone: a dict
    of the pairs so far (a key at each even position, its value after it), looked up at each
    scored key. Returns int64[#scored]."""
    value: dict[int, int] = {}
    out = []
    for t in range(len(inputs)):
        if t % 2 == 0 and targets[t] != IGNORE:
            out.append(value[int(inputs[t])])
        elif t % 2 == 1:
            value[int(inputs[t - 1])] = int(inputs[t])
    return np.array(out, np.int64)


def solve_selective_copying(inputs: np.ndarray, vocab_size: int) -> np.ndarray:
    """The tokens to copy, by filtering the blanks out of the inputs before the copy token."""
    stop = int(np.flatnonzero(inputs == vocab_size - 1)[0])
    body = inputs[:stop]
    return body[body != vocab_size - 2]
