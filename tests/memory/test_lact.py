"""LaCT's pieces in the memory engine (Zhang et al. 2025, arXiv:2505.23884), in float64:

- the SwiGLU inner model f(x) = (silu(x W_1) * (x W_3)) W_2: chunked == the token loop at chunk
  sizes 1, 4, 16 (reads, state, gradients of W0, k, v, q and the gates), documents starting
  inside chunks;
- the weight normalisation (``fast_weight_norm``): after every mini-batch (chunk ends and the
  token before a document start) each matrix's column norms are those of the reset target;
  chunked == the token loop with it, both read modes, the state kept inside a chunk and at a
  document start (``state_length``), gradients of W0 and the target too; a call split at a
  chunk end continues as one call does (the carried state is the normalised one);
- a large chunk (512 tokens, LaCT's regime) equals the token loop on the reads;
- chunk-start reads are causal inside a chunk;
- bad combinations get one clear message.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import memory_scan
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.inner_models import SwiGLUMemory, make_inner_model
from titans_lm.memory.weight_norm import column_norms
from _scan_problems import assert_chunked_equals_reference, documents_problem

T, D = 21, 4
STARTS = (6, 13, 14)   # document starts inside chunks of 4 and 16
SWIGLU = SwiGLUMemory(expansion=1.5)


def _params(seed):
    return SWIGLU.init(jax.random.key(seed), D, D, jnp.float64)


def run(impl, chunk, params, target, args, reset, *, state_length=None, read="after_write",
        norm=True, bias="dot"):
    k, v, q, theta, eta, log_keep = args
    reads, (P, _) = memory_scan(params, tuple(map(jnp.zeros_like, params)), k, v, q, theta, eta,
                                None, log_keep=log_keep, model=SWIGLU, chunk_size=chunk,
                                impl=impl, read=read, reset=reset, reset_to=target,
                                state_length=state_length, attentional_bias=bias,
                                fast_weight_norm=norm)
    return reads, P


def test_the_swiglu_memory_is_a_gated_mlp():
    with jax.enable_x64(True):
        W1, W3, W2 = _params(0)
        assert W1.shape == W3.shape == (D, 6) and W2.shape == (6, D)
        x = jnp.asarray(np.random.default_rng(0).normal(size=(3, D)))
        want = (jax.nn.silu(x @ W1) * (x @ W3)) @ W2
        np.testing.assert_allclose(SWIGLU.apply((W1, W3, W2), x), want, rtol=1e-14)
        assert make_inner_model(2, activation="swiglu", expansion=1.5) == SWIGLU


def test_swiglu_chunked_equals_the_token_loop():
    """The l2 bias with momentum and decay: the inner model alone, every gradient."""
    with jax.enable_x64(True):
        args, reset = documents_problem(T, D, STARTS, seed=0)
        params = _params(1)
        assert_chunked_equals_reference(
            lambda impl, chunk: lambda params, *args: run(impl, chunk, params, params, args,
                                                          reset, norm=False, bias="l2"),
            (params, *args), (1, 4, 16),
            ("W0", "k", "v", "q", "theta", "eta", "log_keep"), seed=2)


def test_the_weight_norm_holds_after_every_mini_batch():
    """The state after each mini-batch end (chunk ends of 4, the tokens before document starts,
    the sequence end) has the target's column norms; inside a mini-batch it has not."""
    with jax.enable_x64(True):
        args, reset = documents_problem(T, D, STARTS, seed=1)
        params, target = _params(1), _params(2)
        want = [column_norms(w) for w in target]
        ends = sorted({t for t in range(4, T + 1, 4)} | set(STARTS) | {T})
        for L in ends:
            _, P = run("reference", 4, params, target, args, reset, state_length=L)
            for p, n in zip(P, want):
                np.testing.assert_allclose(column_norms(p), n, rtol=1e-12)
        _, P = run("reference", 4, params, target, args, reset, state_length=T, norm=False)
        assert max(float(jnp.max(jnp.abs(column_norms(p) - n))) for p, n in zip(P, want)) > 1e-3


def test_chunked_equals_the_token_loop_with_the_weight_norm():
    """Documents inside chunks, both read modes, the state kept inside a chunk (10) and at a
    document start (13: the mini-batch end before it)."""
    with jax.enable_x64(True):
        args, reset = documents_problem(T, D, STARTS, seed=3)
        params, target = _params(1), _params(2)
        assert_chunked_equals_reference(
            lambda impl, case: lambda params, target, *args: run(
                impl, case[0], params, target, args, reset, state_length=case[1], read=case[2]),
            (params, target, *args),
            ((4, None, "after_write"), (16, 13, "after_write"), (4, 10, "chunk_start")),
            ("W0", "target", "k", "v", "q", "theta", "eta", "log_keep"), seed=4)


def test_a_split_call_continues_as_one_call():
    """Cut at a chunk end, the second call starts from the returned (normalised) state: its reads
    and final state are those of one call (no momentum, as LaCT)."""
    with jax.enable_x64(True):
        args, reset = documents_problem(T, D, (), seed=5)
        args = args[:4] + (jnp.zeros(T),) + args[5:]
        params = _params(1)
        reads, P = run("chunked", 4, params, params, args, reset)
        cut = 8
        first = tuple(a[:cut] for a in args)
        second = tuple(a[cut:] for a in args)
        _, P1 = run("chunked", 4, params, params, first, reset[:cut])
        reads2, P2 = run("chunked", 4, P1, params, second, reset[cut:])
        np.testing.assert_allclose(reads2, reads[cut:], rtol=0, atol=1e-12)
        for a, b in zip(P2, P):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_a_large_chunk_equals_the_token_loop():
    """LaCT's regime: chunks of 512 over 1,024 tokens, chunk-start reads, the dot bias."""
    with jax.enable_x64(True):
        n, d = 1024, 2
        rng = np.random.default_rng(6)
        k, q = (jnp.asarray(rng.normal(size=(n, d))) for _ in range(2))
        v = jnp.asarray(rng.normal(size=(n, d)))
        theta = jnp.asarray(0.01 * rng.random(n))
        zeros = jnp.zeros(n)
        W0 = SwiGLUMemory().init(jax.random.key(0), d, d, jnp.float64)

        def scan(impl):
            return memory_scan(W0, tuple(map(jnp.zeros_like, W0)), k, v, q, theta, zeros, zeros,
                               model=SwiGLUMemory(), chunk_size=512, impl=impl,
                               read="chunk_start", attentional_bias="dot",
                               fast_weight_norm=True)

        (got, (P, _)), (want, (P_ref, _)) = scan("chunked"), scan("reference")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-11)
        np.testing.assert_allclose(got[:512], SwiGLUMemory().apply(W0, q[:512]), rtol=0, atol=1e-13)
        for a, b in zip(P, P_ref):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-11)


def test_chunk_start_reads_are_causal():
    """Changing token 9 (key, value, query, theta) leaves the reads of tokens 0..8 unchanged,
    and those of 10..15 too (they read the state at their chunk start); later chunks see it."""
    with jax.enable_x64(True):
        args, reset = documents_problem(T, D, (), seed=7)
        params = _params(1)
        base, _ = run("chunked", 16, params, params, args, reset, read="chunk_start")
        changed = tuple(a.at[9].set(a[9] * 3 + 1) if a.ndim else a for a in args[:4]) + args[4:]
        moved, _ = run("chunked", 16, params, params, changed, reset, read="chunk_start")
        np.testing.assert_array_equal(moved[:9], base[:9])
        np.testing.assert_array_equal(moved[10:16], base[10:16])   # the chunk reads its start
        assert float(jnp.max(jnp.abs(moved[16:] - base[16:]))) > 1e-6


def test_bad_combinations_get_one_clear_message():
    for fields, match in (
            (dict(fast_weight_norm=True, learned_w0=False), "learned_w0 True"),
            (dict(fast_weight_norm=True, gradient_at="previous_token", memory_depth=1,
                  use_momentum=False), "gradient_at 'chunk_start'"),
            (dict(memory_activation="swiglu", memory_depth=3), "needs memory_depth 2"),
            (dict(memory_activation="swiglu", memory_bias=True), "memory_bias False")):
        with pytest.raises(ValueError, match=match):
            MemoryConfig(d_model=8, **fields)
    with jax.enable_x64(True):
        (k, v, q, theta, _, _), _ = documents_problem(T, D, (), seed=0)
        W = (jnp.zeros((D, D)),)
        zeros = jnp.zeros(T)
        with pytest.raises(ValueError, match="fast_weight_norm is not implemented"):
            memory_scan(W, W, k, v, q, theta, zeros, zeros, model="linear", chunk_size=4,
                        gradient_at="previous_token", fast_weight_norm=True)


def test_pallas_runs_chunked_for_it():
    with jax.enable_x64(True):
        args, reset = documents_problem(T, D, STARTS, seed=8)
        params = _params(1)
        got = run("pallas", 4, params, params, args, reset, bias="l2")
        want = run("chunked", 4, params, params, args, reset, bias="l2")
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)
