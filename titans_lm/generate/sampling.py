"""Next-token sampling from logits: greedy, temperature, top-k and nucleus (top-p) filtering.

``sample_logits(logits_BV, key, temperature, top_k, top_p)`` returns int32 ids [B]:

* ``temperature == 0``: greedy, ``argmax`` (ties go to the lowest id); no randomness is used, so
  greedy decoding is deterministic.
* otherwise the logits are divided by ``temperature``, then filtered: top-k keeps the ``k``
  largest logits of each row (``k = 0``: no top-k); top-p keeps the smallest set of the most
  probable ids whose probability sums to at least ``p`` (Holtzman et al. 2020, "The Curious Case
  of Neural Text Degeneration", section 3.1; ``p = 1``: no top-p), computed on the distribution
  left by top-k. One categorical draw per row from what is left.

The settings are static Python numbers (each combination is one compiled function).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen.

    Attributes:
      temperature: >= 0; 0 is greedy (argmax).
      top_k: >= 0; keep the k most likely ids (0 = all).
      top_p: in (0, 1]; nucleus mass (1 = all).

    Raises:
      ValueError: on construction, for a value out of range (the message names the flag).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not (isinstance(t, (int, float)) and t >= 0 and t == t and t != float("inf")):
            raise ValueError(f"--temperature must be a finite number >= 0 (0 = greedy), got {t}")
        if not (isinstance(k, int) and k >= 0):
            raise ValueError(f"--top_k must be an integer >= 0 (0 = no top-k), got {k}")
        if not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise ValueError(f"--top_p must be in (0, 1] (1 = no nucleus filter), got {p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits_BV: jax.Array, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Logits with the ids outside the top-k / top-p set at ``-inf`` (float32 [B, V]).

    The kept set always holds each row's most likely id. Ids tied with the k-th largest logit are
    all kept (top-k by value threshold).
    """
    x = logits_BV.astype(jnp.float32)
    V = x.shape[-1]
    neg = jnp.asarray(-jnp.inf, x.dtype)
    if 0 < top_k < V:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, neg, x)
    if top_p < 1.0:
        sorted_x = jnp.sort(x, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_x, axis=-1)
        # Mass of the ids strictly more likely than each sorted position: keep while it is < p.
        before = jnp.cumsum(probs, axis=-1) - probs
        keep_sorted = before < top_p
        # The smallest kept logit is the threshold (ties at the threshold are kept).
        thresh = jnp.min(jnp.where(keep_sorted, sorted_x, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x < thresh, neg, x)
    return x


def sample_logits(logits_BV: jax.Array, keys_B: jax.Array, config: SamplingConfig) -> jax.Array:
    """int32 [B]: the next token of each row (see the module docstring).

    Args:
      logits_BV: float [B, V] next-token logits.
      keys_B: [B] PRNG keys, one per row (a row's draw depends on its own key only); unused when
        greedy.
      config: the sampling settings.
    """
    if config.greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    x = logits_BV.astype(jnp.float32) / jnp.float32(config.temperature)
    x = filter_logits(x, config.top_k, config.top_p)
    return jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys_B, x).astype(jnp.int32)


__all__ = ["SamplingConfig", "filter_logits", "sample_logits"]
