"""S-NIAH rows of the synthetic tasks (row contract: :mod:`titans_lm.data.tasks`).


**S-NIAH** (single needle in a haystack; Hsieh et al. 2024, "RULER: What's the real context size
of your long-context language models?", tasks ``niah_single_1/2/3``): one needle
``NEEDLE key IS v_1 .. v_m .`` ("One of the special magic numbers for {key} is: {value}.") hidden
in a haystack at a depth in [0, 100]% (inserted at the sentence boundary nearest to that fraction
of the haystack, as RULER inserts at ``int(n_sentences * depth / 100)``), then one query at the
end, ``QUERY key ANSWER v_1 .. v_m`` ("What is the special magic number for {key} mentioned in
the provided text? The special magic number for {key} mentioned in the provided text is"),
whose value tokens are the answer (RULER scores exact match of the value):

- ``niah_single_1``: the haystack is RULER's noise sentence "The grass is green. The sky is blue.
  The sun is yellow. Here we go. There and back again." repeated; the value is a 7-digit number.
- ``niah_single_2``: the haystack is book text; the value is a 7-digit number.
- ``niah_single_3``: book text; the value a UUID (32 hex digits and 4 dashes, 36 tokens).

Keys are one token each from a set of ``NIAH_KEYS`` key ids (RULER's keys are adjective-noun
words). Book text (RULER uses Paul Graham's essays; here the corpus's books) is tokenised by a
simple word scheme, not the corpus tokenizer: each whitespace-separated word, lower-cased and
stripped of punctuation, maps to one of the remaining ids by CRC-32, and a word ending a sentence
(``.``, ``!``, ``?``) is followed by the PERIOD token, so sentence boundaries stay visible.
"""

from __future__ import annotations

import dataclasses
import re
import zlib

import numpy as np

NIAH_VARIANTS = ("niah_single_1", "niah_single_2", "niah_single_3")
NIAH_KEYS = 256
NOISE_SENTENCE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again.")


@dataclasses.dataclass(frozen=True)
class NiahVocab:
    """The S-NIAH token ids (all >= 4) for a vocabulary of ``vocab_size``.

    Layout: markers NEEDLE, IS, QUERY, ANSWER, PERIOD, DASH; 16 hex digits (the first ten are the
    decimal digits); the noise sentence's 15 words; ``NIAH_KEYS`` key ids; the rest are the
    hashed book-text words.
    """
    vocab_size: int

    NEEDLE = 4
    IS = 5
    QUERY = 6
    ANSWER = 7
    PERIOD = 8
    DASH = 9
    HEX = 10          # 10 .. 25: hex digit h -> HEX + h
    NOISE_WORDS = 26  # 26 .. 40

    def __post_init__(self):
        if self.vocab_size < self.text_start + 64:
            raise ValueError(f"S-NIAH needs vocab_size >= {self.text_start + 64} (markers, digits, "
                             f"noise words, {NIAH_KEYS} keys, 64 text words), got {self.vocab_size}")

    @property
    def key_start(self) -> int:
        return self.NOISE_WORDS + len(_NOISE_WORDS)

    @property
    def text_start(self) -> int:
        return self.key_start + NIAH_KEYS

    def word(self, w: str) -> int:
        """The id of a book-text word (CRC-32 of the lower-cased, punctuation-stripped word)."""
        return self.text_start + zlib.crc32(w.encode("utf-8")) % (self.vocab_size - self.text_start)


_NOISE_WORDS = tuple(dict.fromkeys(re.sub(r"[.]", "", NOISE_SENTENCE).lower().split()))


def text_to_tokens(text: str, vocab: NiahVocab) -> np.ndarray:
    """Book text in the S-NIAH word scheme (module doc): int32[N], PERIOD after sentence ends."""
    out: list[int] = []
    for raw in text.split():
        w = re.sub(r"[^\w']", "", raw.lower())
        if w:
            out.append(vocab.word(w))
        if raw.endswith((".", "!", "?")) or raw.endswith((".\"", "!\"", "?\"", ".'", "?'", "!'")):
            out.append(vocab.PERIOD)
    return np.asarray(out, np.int32)


def noise_tokens(vocab: NiahVocab) -> np.ndarray:
    """RULER's noise sentence (five sentences) in token ids, int32[25]."""
    out: list[int] = []
    for raw in NOISE_SENTENCE.split():
        out.append(vocab.NOISE_WORDS + _NOISE_WORDS.index(raw.strip(".").lower()))
        if raw.endswith("."):
            out.append(vocab.PERIOD)
    return np.asarray(out, np.int32)


def _value(rng: np.random.Generator, kind: str, vocab: NiahVocab) -> np.ndarray:
    if kind == "number":  # RULER: a 7-digit number in [10^6, 10^7)
        digits = str(int(rng.integers(10 ** 6, 10 ** 7)))
        return np.array([vocab.HEX + int(c) for c in digits], np.int32)
    hexd = rng.integers(0, 16, size=32)  # RULER: uuid.uuid4(); here 32 random hex digits
    groups = np.split(vocab.HEX + hexd, [8, 12, 16, 20])
    out = [groups[0]]
    for g in groups[1:]:
        out += [np.array([vocab.DASH]), g]
    return np.concatenate(out).astype(np.int32)


def niah_value_kind(variant: str) -> str:
    if variant not in NIAH_VARIANTS:
        raise ValueError(f"unknown S-NIAH variant {variant!r}; valid: {', '.join(NIAH_VARIANTS)}")
    return "uuid" if variant == "niah_single_3" else "number"


def niah_answer_length(variant: str) -> int:
    return 36 if niah_value_kind(variant) == "uuid" else 7


def niah_example(rng: np.random.Generator, seq_len: int, depth: float, variant: str,
                 vocab: NiahVocab, text: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, float]:
    """One S-NIAH row (see the module doc).

    Args:
      rng: the numpy generator.
      seq_len: L; the row has L + 1 tokens and ends with the answer.
      depth: needle depth in percent of the haystack, in [0, 100].
      variant: "niah_single_1" (noise, number), "niah_single_2" (book, number) or
        "niah_single_3" (book, UUID).
      vocab: the :class:`NiahVocab`.
      text: the book text in the word scheme (:func:`text_to_tokens`), needed by variants 2 and 3;
        the haystack is a random contiguous stretch of it starting at a sentence start.

    Returns:
      ``(tokens int32[L+1], loss_mask int32[L+1], realised_depth)``: the mask marks the answer's
      value tokens (the last 7 or 36 tokens); realised_depth is the needle's start as a
      percentage of the haystack length.

    Raises:
      ValueError: an unknown variant, a depth outside [0, 100], a length too short for needle
        and query, or book text shorter than the haystack.
    """
    kind = niah_value_kind(variant)
    if not 0.0 <= depth <= 100.0:
        raise ValueError(f"needle depth must lie in [0, 100] percent, got {depth}")
    key = vocab.key_start + int(rng.integers(0, NIAH_KEYS))
    value = _value(rng, kind, vocab)
    needle = np.concatenate([[vocab.NEEDLE, key, vocab.IS], value, [vocab.PERIOD]]).astype(np.int32)
    query = np.concatenate([[vocab.QUERY, key, vocab.ANSWER], value]).astype(np.int32)
    hay_len = seq_len + 1 - len(needle) - len(query)
    if hay_len < 1:
        raise ValueError(f"seq_len={seq_len} is too short for an S-NIAH {variant} example (needle "
                         f"{len(needle)} + query {len(query)} tokens + a haystack)")
    if variant == "niah_single_1":
        unit = noise_tokens(vocab)
        hay = np.tile(unit, -(-hay_len // len(unit)))[:hay_len]
    else:
        if text is None or len(text) < hay_len + 1:
            raise ValueError(f"{variant} needs book text of more than {hay_len} tokens, got "
                             f"{0 if text is None else len(text)}")
        starts = np.flatnonzero(text[: len(text) - hay_len] == vocab.PERIOD) + 1
        start = int(rng.choice(starts)) if starts.size else int(rng.integers(0, len(text) - hay_len))
        hay = text[start:start + hay_len]
    bounds = np.concatenate([[0], np.flatnonzero(hay == vocab.PERIOD) + 1])
    bounds = bounds[bounds <= hay_len]
    target = depth / 100.0 * hay_len
    at = int(bounds[np.argmin(np.abs(bounds - target))])
    tokens = np.concatenate([hay[:at], needle, hay[at:], query]).astype(np.int32)
    mask = np.zeros(seq_len + 1, np.int32)
    mask[-len(value):] = 1
    return tokens, mask, 100.0 * at / hay_len


def solve_niah(tokens: np.ndarray, vocab: NiahVocab) -> np.ndarray:
    """The exact answer of an S-NIAH row from the row alone: a dict key -> value built from every
    needle (``NEEDLE key IS value .``), looked up at the final query. Returns int32[m]."""
    toks = [int(t) for t in tokens]
    table: dict[int, list[int]] = {}
    for i, t in enumerate(toks):
        if t == vocab.NEEDLE:
            j = i + 3
            while toks[j] != vocab.PERIOD:
                j += 1
            table[toks[i + 1]] = toks[i + 3:j]
    q = len(toks) - 1 - toks[::-1].index(vocab.QUERY)
    return np.array(table[toks[q + 1]], np.int32)

