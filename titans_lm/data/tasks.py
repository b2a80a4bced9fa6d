"""Synthetic long-context tasks as data sources: MQAR and S-NIAH, deterministic from a seed.

Every example is one row of ``L + 1`` tokens (inputs ``tokens[:-1]``, targets ``tokens[1:]``, the
batch contract of ``titans_lm.data.pipeline``) in one document (segment id 1 everywhere), plus an
int32 ``loss_mask[L + 1]``: ``loss_mask[t] = 1`` exactly when token ``t`` is an answer token, i.e.
the target of input position ``t - 1`` is scored (``loss_mask[0]`` is always 0). Training scores
only those targets (``titans_lm.train.step.split_batch``) and task accuracy is measured on them
(``titans_lm.eval.tasks``).

Tokens are the task's own vocabulary (no sentencepiece): ids 0-3 stay PAD / UNK / BOS / EOS of
``titans_lm.config`` and are never generated.

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
from collections.abc import Sequence

import numpy as np

from titans_lm.data.corpora import load_documents

N_RESERVED = 4  # PAD, UNK, BOS, EOS (titans_lm.config)
TASKS = ("mqar", "niah")
NIAH_VARIANTS = ("niah_single_1", "niah_single_2", "niah_single_3")
NIAH_KEYS = 256
NOISE_SENTENCE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again.")


# ------------------------------------------------------------------------------------------ MQAR

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


# ----------------------------------------------------------------------------------------- S-NIAH

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


# ------------------------------------------------------------------------------- task batches

@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What to generate, from the config's ``task`` section (``configs/tasks/*.py``).

    Attributes:
      name: "mqar" or "niah".
      vocab_size: V (``data.vocab_size``).
      train_pairs: MQAR pairs per training row, drawn uniformly per row from this tuple.
      power_a: MQAR power-law exponent.
      variant: the S-NIAH variant.
      train_depths: S-NIAH training depths are uniform in [lo, hi] percent.
      corpus, data_dir: the book text of S-NIAH variants 2 and 3 (train split for training,
        test split for evaluation).
    """
    name: str
    vocab_size: int
    train_pairs: tuple[int, ...] = (16, 32, 64)
    power_a: float = 0.01
    variant: str = "niah_single_1"
    train_depths: tuple[float, float] = (0.0, 100.0)
    corpus: str = "books"
    data_dir: str = ""


def task_spec(cfg) -> TaskSpec:
    """The :class:`TaskSpec` of a run config with ``data.task`` set.

    Raises:
      ValueError: an unknown task or variant, or a config without its ``task`` section.
    """
    name = cfg.data.get("task", "")
    if name not in TASKS:
        raise ValueError(f"config field data.task: unknown task {name!r}; valid: {', '.join(TASKS)}")
    if "task" not in cfg:
        raise ValueError(f"data.task={name!r} needs the config's task section; use "
                         f"--config=configs/tasks/{name}.py:<backbone>")
    t = cfg.task
    spec = TaskSpec(name=name, vocab_size=int(cfg.data.vocab_size),
                    train_pairs=tuple(int(x) for x in t.get("train_pairs", (16, 32, 64))),
                    power_a=float(t.get("power_a", 0.01)), variant=str(t.get("variant", "niah_single_1")),
                    train_depths=tuple(float(x) for x in t.get("train_depths", (0.0, 100.0))),
                    corpus=cfg.data.corpus, data_dir=cfg.data.data_dir)
    if name == "niah":
        niah_value_kind(spec.variant)
        NiahVocab(spec.vocab_size)
    return spec


_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


def example_rng(seed: int, split: str, *index: int) -> np.random.Generator:
    """The generator of one example: ``SeedSequence([seed, split code, *index])``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), _SPLIT_CODE[split],
                                                         *map(int, index)]))


_TEXT_CACHE: dict[tuple, np.ndarray] = {}


def book_text(spec: TaskSpec, split: str) -> np.ndarray:
    """The split's book text in the S-NIAH word scheme (cached per process)."""
    key = (spec.corpus, spec.data_dir, split, spec.vocab_size)
    if key not in _TEXT_CACHE:
        vocab = NiahVocab(spec.vocab_size)
        docs = load_documents(spec.corpus, split, spec.data_dir)
        _TEXT_CACHE[key] = np.concatenate([text_to_tokens(d.text, vocab) for d in docs])
    return _TEXT_CACHE[key]


def task_rows(spec: TaskSpec, split: str, seed: int, index: Sequence[int], n_rows: int,
              seq_len: int, *, num_pairs: int | None = None, depth: float | None = None
              ) -> dict[str, np.ndarray]:
    """``n_rows`` examples, row ``r`` drawn from ``example_rng(seed, split, *index, r)``.

    Training rows (``num_pairs`` / ``depth`` None) draw MQAR's pairs from ``spec.train_pairs``
    and S-NIAH's depth uniformly from ``spec.train_depths``; evaluation sets pass them.

    Returns:
      ``{"tokens", "segment_ids", "loss_mask"}`` int32[n_rows, seq_len + 1] (segment id 1
      everywhere), plus ``"depth"`` float64[n_rows] (S-NIAH: realised depth; MQAR: nan).
    """
    toks = np.zeros((n_rows, seq_len + 1), np.int32)
    mask = np.zeros_like(toks)
    depths = np.full(n_rows, np.nan)
    vocab = NiahVocab(spec.vocab_size) if spec.name == "niah" else None
    text = (book_text(spec, "train" if split == "train" else "test")
            if spec.name == "niah" and spec.variant != "niah_single_1" else None)
    for r in range(n_rows):
        rng = example_rng(seed, split, *index, r)
        if spec.name == "mqar":
            n = num_pairs if num_pairs is not None else int(rng.choice(spec.train_pairs))
            toks[r], mask[r] = mqar_example(rng, seq_len, n, spec.vocab_size, spec.power_a)
        else:
            lo, hi = spec.train_depths
            d = depth if depth is not None else float(rng.uniform(lo, hi))
            toks[r], mask[r], depths[r] = niah_example(rng, seq_len, d, spec.variant, vocab, text)
    return {"tokens": toks, "segment_ids": np.ones_like(toks), "loss_mask": mask, "depth": depths}


class TaskIterator:
    """The infinite training batches of a task: batch ``i`` is :func:`task_rows` with index
    ``(i,)`` (global rows; this process keeps its contiguous share), so the state is the batch
    counter and resuming is exact.

    ``next(it)`` -> ``{"tokens", "segment_ids", "loss_mask"}`` int32[B_local, T + 1];
    ``get_state()`` -> ``{"batch": i}``; ``set_state(state)`` restores it.
    """

    def __init__(self, spec: TaskSpec, *, seq_len: int, batch_size: int, seed: int,
                 shard_index: int = 0, shard_count: int = 1):
        if batch_size % shard_count:
            raise ValueError(f"batch_size={batch_size} must be a multiple of the number of "
                             f"processes shard_count={shard_count}")
        self.spec, self.seq_len, self.batch_size, self.seed = spec, seq_len, batch_size, seed
        self._rows = slice(shard_index * batch_size // shard_count,
                           (shard_index + 1) * batch_size // shard_count)
        self._batch = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        b = task_rows(self.spec, "train", self.seed, (self._batch,), self.batch_size, self.seq_len)
        self._batch += 1
        return {k: b[k][self._rows] for k in ("tokens", "segment_ids", "loss_mask")}

    def get_state(self) -> dict[str, int]:
        return {"batch": self._batch}

    def set_state(self, state: dict) -> None:
        self._batch = int(state["batch"])


def task_validation_batches(spec: TaskSpec, *, seq_len: int, batch_size: int, n_batches: int,
                            seed: int, multiple: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed validation batches (split "validation", training distribution), ``batch_size``
    rounded up to a multiple of ``multiple`` (the batch shards)."""
    bsz = -(-batch_size // multiple) * multiple
    out = []
    for i in range(n_batches):
        b = task_rows(spec, "validation", seed, (i,), bsz, seq_len)
        out.append({k: b[k] for k in ("tokens", "segment_ids", "loss_mask")})
    return out


def eval_settings(cfg) -> list[dict]:
    """The evaluation grid of a task config: MQAR ``(length, pairs)`` zipped from
    ``task.eval_lengths`` and ``task.eval_pairs``; S-NIAH every ``length x depth`` of
    ``task.eval_lengths`` and ``task.eval_depths``. Each entry: ``{"length", "pairs" | "depth"}``.

    Raises:
      ValueError: MQAR lengths and pairs of different counts.
    """
    t = cfg.task
    lengths = [int(x) for x in t.eval_lengths]
    if cfg.data.task == "mqar":
        pairs = [int(x) for x in t.eval_pairs]
        if len(pairs) != len(lengths):
            raise ValueError(f"config fields task.eval_lengths {lengths} and task.eval_pairs "
                             f"{pairs} must have the same number of entries")
        return [{"length": L, "pairs": n} for L, n in zip(lengths, pairs)]
    return [{"length": L, "depth": float(d)} for L in lengths for d in t.eval_depths]


@dataclasses.dataclass(frozen=True)
class TaskData:
    """The data side of a task run for the trainer (in place of ``titans_lm.data.prepare``)."""
    spec: TaskSpec

    @classmethod
    def from_config(cls, cfg) -> "TaskData":
        return cls(task_spec(cfg))

    def train_iterator(self, *, seq_len: int, batch_size: int, seed: int, shard_index: int = 0,
                       shard_count: int = 1) -> TaskIterator:
        return TaskIterator(self.spec, seq_len=seq_len, batch_size=batch_size, seed=seed,
                            shard_index=shard_index, shard_count=shard_count)

    def validation_batches(self, **kw) -> list[dict[str, np.ndarray]]:
        return task_validation_batches(self.spec, **kw)
