"""Prefill and token-by-token decoding with the model's carried state.

For a batch of prompts (token arrays beginning with BOS, lengths ``L_r``):

1. **prefill**: one parallel call ``model(prompt[:, :L_min], seg, init_state(B))`` over the common
   length ``L_min = min_r L_r`` (the chunked / dual form for memories, full attention for the
   rest); it returns the state after ``L_min`` tokens and the logits of position ``L_min - 1``;
2. **decode**: calls of one token, ``model(token_B1, seg, state)`` (the memory's per-token update
   from its buffered chunk, the attention cache), all rows together, so every row stays at the same
   stream position. At stream position ``q`` a row whose prompt is longer than ``q`` is fed its
   own prompt token ``prompt_r[q]`` (forced); the others are fed the token sampled from the
   previous call's logits. A row therefore sees exactly its own prompt followed by its own
   samples, as if it were alone in the batch.

Segment id 1 on every token (one document per row, starting at the prompt's BOS).

Randomness: the token sampled for row ``r`` at stream position ``q`` uses the key
``fold_in(fold_in(key(seed), r), q)``; greedy decoding (temperature 0) uses none and is
deterministic. The prefill and decode functions are compiled ahead of time, so the reported
times (``Generation``) exclude compilation (reported on its own).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.config import BOS_ID
from titans_lm.generate.sampling import SamplingConfig, sample_logits
from titans_lm.models.lm import continued
from titans_lm.train.compilation import compile_announced


@dataclasses.dataclass(frozen=True)
class Generation:
    """The outcome of :func:`generate`.

    Attributes:
      prompts: the prompt token arrays (int32, BOS first).
      new_tokens: int32 [B, max_new_tokens], each row's sampled tokens.
      prefill_tokens: tokens processed by the prefill call (B * L_min).
      prefill_seconds: wall time of the prefill call (compiled, results ready).
      decode_steps: number of one-token calls (L_max - L_min + max_new_tokens - 1).
      decode_seconds: wall time of all decode calls.
      compile_seconds: ahead-of-time compilation of the prefill and decode functions.
    """

    prompts: tuple[np.ndarray, ...]
    new_tokens: np.ndarray
    prefill_tokens: int
    prefill_seconds: float
    decode_steps: int
    decode_seconds: float
    compile_seconds: float

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens processed per second by the decode calls (B per call, forced ones included)."""
        n = self.decode_steps * self.new_tokens.shape[0]
        return n / self.decode_seconds if self.decode_seconds > 0 and n else None

    @property
    def decode_ms_per_step(self) -> float | None:
        return 1e3 * self.decode_seconds / self.decode_steps if self.decode_steps else None


def pad_prompts(prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens int32 [B, L_max], lengths int32 [B])`` of prompts right-padded with 0.

    Raises:
      ValueError: no prompt, an empty prompt, or one not beginning with BOS.
    """
    if not prompts:
        raise ValueError("no prompt given")
    arrs = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    for i, a in enumerate(arrs):
        if a.size == 0 or a[0] != BOS_ID:
            raise ValueError(f"prompt {i} must be a token array beginning with BOS={BOS_ID}")
    lengths = np.array([a.size for a in arrs], np.int32)
    tokens = np.zeros((len(arrs), int(lengths.max())), np.int32)
    for i, a in enumerate(arrs):
        tokens[i, :a.size] = a
    return tokens, lengths


def _next_tokens(logits_BV, prompt_BL, lengths_B, q, base_keys_B, sampling):
    """The token each row is fed at stream position ``q``: its prompt token while ``q < L_r``,
    else a sample from ``logits_BV`` (the logits of position ``q - 1``)."""
    keys_B = jax.vmap(lambda k: jax.random.fold_in(k, q))(base_keys_B)
    sampled_B = sample_logits(logits_BV, keys_B, sampling)
    L = prompt_BL.shape[1]
    forced_B = jnp.take_along_axis(prompt_BL, jnp.minimum(q, L - 1) * jnp.ones_like(lengths_B)[:, None],
                                   axis=1)[:, 0]
    return jnp.where(q < lengths_B, forced_B, sampled_B).astype(jnp.int32)


def make_decode_fns(model: Any, sampling: SamplingConfig) -> tuple[Callable, Callable]:
    """``(prefill, decode)``, pure functions to jit.

    ``prefill(params, prompt_BL, lengths_B, base_keys_B, l_min) -> (next_B, logits_BV, state)``
    (``l_min`` static) runs the first ``l_min`` prompt tokens from ``init_state(params, B)``;
    ``decode(params, state, token_B, q, prompt_BL, lengths_B, base_keys_B) -> (next_B, logits_BV,
    state)`` feeds ``token_B``, the tokens at stream position ``q``, and returns ``next_B``, the
    tokens to feed at ``q + 1``. ``logits_BV`` are the logits after the call's last token.

    Args:
      model: the model's stateful API over parameters, ``model.init_state(params, batch_size)
        -> state`` and ``model.apply(params, tokens_BT, segment_ids_BT, state) -> (logits_BTV,
        state)`` (:class:`titans_lm.train.state.ModelFns`).
      sampling: how sampled tokens are chosen.
    """
    def prefill(params, prompt_BL, lengths_B, base_keys_B, l_min: int):
        B = prompt_BL.shape[0]
        state = continued(model.init_state(params, B))
        tokens_BT = prompt_BL[:, :l_min]
        logits_BTV, state = model.apply(params, tokens_BT, jnp.ones_like(tokens_BT), state)
        logits_BV = logits_BTV[:, -1]
        nxt = _next_tokens(logits_BV, prompt_BL, lengths_B, jnp.int32(l_min), base_keys_B, sampling)
        return nxt, logits_BV, state

    def decode(params, state, token_B, q, prompt_BL, lengths_B, base_keys_B):
        tokens_BT = token_B[:, None]
        logits_BTV, state = model.apply(params, tokens_BT, jnp.ones_like(tokens_BT), state)
        logits_BV = logits_BTV[:, -1]
        nxt = _next_tokens(logits_BV, prompt_BL, lengths_B, q + 1, base_keys_B, sampling)
        return nxt, logits_BV, state

    return prefill, decode


PROMPT_BUCKET = 64  # prompt arrays are padded to a multiple of this (one decode compile per B)


class Decoder:
    """The compiled prefill and decode functions of one model and sampling setting.

    Compiled ahead of time on first use for each shape and kept: prefill per (B, padded prompt
    length, L_min), decode per (B, padded prompt length), prompts padded to a multiple of
    :data:`PROMPT_BUCKET` (padding is never read: a row's forced tokens stop at its length).

    Args:
      model: the model's stateful API over parameters (see :func:`make_decode_fns`), e.g. its
        :class:`titans_lm.train.state.ModelFns`.
      sampling: how sampled tokens are chosen (default greedy).
      log: where each compile is announced, with its time and size
        (:func:`titans_lm.train.compilation.compile_announced`; None: silent).
    """

    def __init__(self, model: Any, sampling: SamplingConfig = SamplingConfig(temperature=0.0),
                 log: Callable[[str], None] | None = None):
        self.sampling = sampling
        self.log = log
        self._prefill_fn, self._decode_fn = make_decode_fns(model, sampling)
        self._prefill_jit = jax.jit(self._prefill_fn, static_argnums=4)
        self._decode_jit = jax.jit(self._decode_fn, donate_argnums=1)
        self._cache: dict[tuple, Any] = {}

    def compiled(self, params, prompt_BL, lengths_B, base_keys_B, l_min: int):
        """``(prefill, decode)`` compiled for these shapes (cached)."""
        B, L = prompt_BL.shape
        kp, kd = ("prefill", B, L, l_min), ("decode", B, L)
        if kp not in self._cache:
            self._cache[kp] = compile_announced(
                self._prefill_jit, params, prompt_BL, lengths_B, base_keys_B, l_min,
                what=f"prefill ({B} x {l_min} tokens)", log=self.log)
        if kd not in self._cache:
            state = jax.eval_shape(functools.partial(self._prefill_fn, l_min=l_min), params,
                                   prompt_BL, lengths_B, base_keys_B)[2]
            self._cache[kd] = compile_announced(
                self._decode_jit, params, state, jnp.zeros((B,), jnp.int32), jnp.int32(0),
                prompt_BL, lengths_B, base_keys_B, what=f"decode step ({B} x 1 token)",
                log=self.log)
        return self._cache[kp], self._cache[kd]


def generate(decoder: Decoder, params: Any, prompts: Sequence[np.ndarray], *,
             max_new_tokens: int, seed: int = 0,
             on_tokens: Callable[[np.ndarray, np.ndarray], None] | None = None,
             return_logits: bool = False) -> Generation | tuple[Generation, np.ndarray]:
    """Prefill the prompts in parallel, then decode ``max_new_tokens`` per row (module docstring).

    Args:
      decoder: the model's :class:`Decoder` (its sampling setting is used).
      params: the model parameters.
      prompts: one int token array per row, each beginning with BOS (lengths may differ).
      max_new_tokens: tokens to sample per row (>= 1).
      seed: PRNG seed of the samples.
      on_tokens: called after every call with ``(tokens_B, is_new_B)``: the token each row will be
        fed next and whether it is a sampled one (False: still the prompt, or the row is done);
        e.g. to print text as it is produced.
      return_logits: also return float [B, L_max - L_min + max_new_tokens, V]: the logits after
        each stream position from ``L_min - 1`` on (for tests).

    Returns:
      :class:`Generation` (and the logits when ``return_logits``). ``compile_seconds`` is 0 when
      the decoder had compiled these shapes already.

    Raises:
      ValueError: ``max_new_tokens < 1``; see :func:`pad_prompts`.
    """
    if int(max_new_tokens) < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {max_new_tokens}")
    n_new = int(max_new_tokens)
    prompt_np, lengths_np = pad_prompts(prompts)
    B = prompt_np.shape[0]
    l_min, l_max = int(lengths_np.min()), int(lengths_np.max())
    width = -(-l_max // PROMPT_BUCKET) * PROMPT_BUCKET
    prompt_np = np.pad(prompt_np, ((0, 0), (0, width - l_max)))
    prompt_BL, lengths_B = jnp.asarray(prompt_np), jnp.asarray(lengths_np)
    root = jax.random.key(int(seed))
    base_keys_B = jax.vmap(lambda r: jax.random.fold_in(root, r))(jnp.arange(B))

    t0 = time.perf_counter()
    prefill_c, decode_c = decoder.compiled(params, prompt_BL, lengths_B, base_keys_B, l_min)
    compile_s = time.perf_counter() - t0

    out = np.zeros((B, n_new), np.int32)
    logits_seen = []

    def record(nxt, q):
        """``nxt``: the tokens to feed at stream position q."""
        nxt = np.asarray(nxt)
        g = q - lengths_np  # index among each row's new tokens
        is_new = (g >= 0) & (g < n_new)
        out[is_new, g[is_new]] = nxt[is_new]
        if on_tokens is not None:
            on_tokens(nxt, is_new)

    t0 = time.perf_counter()
    nxt, logits, state = prefill_c(params, prompt_BL, lengths_B, base_keys_B)
    jax.block_until_ready((nxt, state))
    prefill_s = time.perf_counter() - t0
    if return_logits:
        logits_seen.append(np.asarray(logits))
    record(nxt, l_min)

    n_steps = l_max - l_min + n_new - 1
    t0 = time.perf_counter()
    for i in range(n_steps):
        q = l_min + i  # the position of the token fed now
        nxt, logits, state = decode_c(params, state, nxt, jnp.int32(q), prompt_BL, lengths_B,
                                      base_keys_B)
        if return_logits:
            logits_seen.append(np.asarray(logits))
        record(nxt, q + 1)
    jax.block_until_ready(nxt)
    decode_s = time.perf_counter() - t0
    gen = Generation(prompts=tuple(np.asarray(p, np.int32) for p in prompts), new_tokens=out,
                     prefill_tokens=B * l_min, prefill_seconds=prefill_s, decode_steps=n_steps,
                     decode_seconds=decode_s, compile_seconds=compile_s)
    if return_logits:
        return gen, np.stack(logits_seen, axis=1)
    return gen


__all__ = ["Decoder", "Generation", "PROMPT_BUCKET", "generate", "make_decode_fns", "pad_prompts"]
