"""Perplexity from summed log-likelihoods: token perplexity, word perplexity, bits per byte.

Every metric is a ratio of totals summed over all scored documents (never an average of
per-window or per-document averages):

* ``token_ppl = exp(nll / n_tokens)``: ``nll`` is the summed negative log-likelihood in nats of
  the scored tokens, ``n_tokens`` their number (tokenizer-dependent).
* ``word_ppl = exp(nll / n_words)``: the same total spread over the text's words.
* ``bits_per_byte = nll / (ln 2 * n_bytes)``.

What is scored: every token of a document after its BOS (``titans_lm.data.windows``). No EOS is
appended or scored: documents are stored and trained as BOS + text (no end marker), so the
likelihood is that of the text given the start of a document, and the document's end is not
predicted.

What is counted (:func:`text_counts`): ``n_words`` = the whitespace-separated words of the
document text, ``len(text.split())``; ``n_bytes`` = its UTF-8 bytes. For WikiText raw this word
count equals the number of tokens of the word-level ``wiki.*.tokens`` files without their per-line
``<eos>`` (WikiText-2 test: 241,211 words; the original word-level protocol of Merity et al. 2016
scores 245,569 = words + one ``<eos>`` per line). lm-evaluation-harness counts
``len(re.split(r"\\s+", page))``, which adds at most 2 empty strings per article (< 0.06% on
WikiText-2 test).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class PerplexityTotals:
    """Summed statistics of scored text; add two with ``+``.

    Attributes:
      nll_nats: summed negative log-likelihood of the scored tokens, in nats (float64 on host).
      n_tokens: number of scored tokens.
      n_words: whitespace-separated words of the scored texts.
      n_bytes: UTF-8 bytes of the scored texts.
    """

    nll_nats: float = 0.0
    n_tokens: int = 0
    n_words: int = 0
    n_bytes: int = 0

    def __add__(self, other: PerplexityTotals) -> PerplexityTotals:
        if not isinstance(other, PerplexityTotals):
            return NotImplemented
        return PerplexityTotals(self.nll_nats + other.nll_nats, self.n_tokens + other.n_tokens,
                                self.n_words + other.n_words, self.n_bytes + other.n_bytes)

    @staticmethod
    def _ratio(num: float, den: int, what: str) -> float:
        if den <= 0:
            raise ValueError(f"cannot compute a per-{what} value: no {what}s were counted")
        return num / den

    @property
    def nats_per_token(self) -> float:
        return self._ratio(self.nll_nats, self.n_tokens, "token")

    @property
    def token_ppl(self) -> float:
        """``exp(nll / n_tokens)``. Raises ValueError when ``n_tokens == 0``."""
        return math.exp(self.nats_per_token)

    @property
    def word_ppl(self) -> float:
        """``exp(nll / n_words)``. Raises ValueError when ``n_words == 0``."""
        return math.exp(self._ratio(self.nll_nats, self.n_words, "word"))

    @property
    def bits_per_byte(self) -> float:
        """``nll / (ln 2 * n_bytes)``. Raises ValueError when ``n_bytes == 0``."""
        return self._ratio(self.nll_nats, self.n_bytes, "byte") / math.log(2.0)

    def as_dict(self) -> dict[str, float]:
        """The totals and every metric defined by them (metrics whose count is 0 are omitted)."""
        out: dict[str, float] = dataclasses.asdict(self)
        for name in ("token_ppl", "word_ppl", "bits_per_byte"):
            try:
                out[name] = getattr(self, name)
            except ValueError:
                pass
        return out


def text_counts(text: str) -> tuple[int, int]:
    """``(n_words, n_bytes)`` of a document: ``len(text.split())`` and ``len(text.encode("utf-8"))``."""
    return len(text.split()), len(text.encode("utf-8"))


def text_totals(texts) -> PerplexityTotals:
    """Word and byte counts of the scored texts (``nll_nats`` and ``n_tokens`` left at 0)."""
    words = nbytes = 0
    for text in texts:
        w, b = text_counts(text)
        words, nbytes = words + w, nbytes + b
    return PerplexityTotals(n_words=words, n_bytes=nbytes)


def score_batch(logits_BTV: jax.Array, batch: dict[str, np.ndarray | jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Summed NLL and count of the scored targets of one batch.

    Args:
      logits_BTV: float[B, T, V] logits for inputs ``batch["tokens"][:, :-1]``.
      batch: ``{"tokens": int32[B, T+1], "segment_ids": int32[B, T+1]}``.

    Returns:
      ``(nll_sum, n_tokens)``: float32 scalar (nats) and int32 scalar, over the targets
      ``tokens[:, 1:]`` with weight ``(seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)``.
      Computed in float32 (float64 for float64 logits) with ``jax.nn.log_softmax``;
      jit-compatible.

    Raises:
      ValueError: shapes that do not match (checked on static shapes).
    """
    tokens, segs = batch["tokens"], batch["segment_ids"]
    if logits_BTV.ndim != 3 or tokens.shape != segs.shape or \
            logits_BTV.shape[:2] != (tokens.shape[0], tokens.shape[1] - 1):
        raise ValueError(f"logits {logits_BTV.shape} do not match tokens {tokens.shape} / "
                         f"segment_ids {segs.shape}: expected [B, T, V] with tokens [B, T+1]")
    targets_BT = jnp.asarray(tokens)[:, 1:]
    segs = jnp.asarray(segs)
    weight_BT = (segs[:, 1:] == segs[:, :-1]) & (segs[:, 1:] != 0)
    logp_BTV = jax.nn.log_softmax(
        logits_BTV.astype(jnp.promote_types(logits_BTV.dtype, jnp.float32)), axis=-1)
    target_logp_BT = jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
    nll_sum = -jnp.sum(jnp.where(weight_BT, target_logp_BT, 0.0))
    return nll_sum, jnp.sum(weight_BT, dtype=jnp.int32)
