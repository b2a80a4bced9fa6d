"""memory_scan's ``state_length``: the state after the first L tokens (L possibly traced), reads of
all T tokens; reference and chunked agree on values and gradients in float64."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import LinearMemory, MLPMemory, memory_scan

from _scan_problems import FAST_COMPILE, functional, problem

MODELS = {"linear": LinearMemory(), "mlp2": MLPMemory(depth=2, expansion=2.0)}
T, CHUNK = 21, 8
RESET = np.zeros(T, bool)
RESET[[0, 8, 16]] = [True, False, True]   # a document start at the chunk start 16


def scan(impl, model, args, length, **kw):
    return memory_scan(*args, model=model, chunk_size=CHUNK, impl=impl, reset=jnp.asarray(RESET),
                       state_length=length, **kw)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("name", list(MODELS))
def test_state_after_the_first_tokens_equals_a_scan_of_those_tokens(impl, name):
    model = MODELS[name]
    with jax.enable_x64(True):
        args = problem(model, T, seed=2)
        w0 = model.init(jax.random.key(7), 4, 4, jnp.float64)
        fn = jax.jit(lambda length: scan(impl, model, args, length, reset_to=w0),
                     compiler_options=FAST_COMPILE)
        full_reads, full_state = memory_scan(*args, model=model, chunk_size=CHUNK, impl=impl,
                                             reset=jnp.asarray(RESET), reset_to=w0)
        for length in (0, 1, 5, 8, 13, 16, 17, T):
            reads, state = fn(jnp.int32(length))       # traced length: one compilation
            np.testing.assert_allclose(reads, full_reads, atol=1e-13)
            if length == 0:
                want = (args[0], args[1])
            else:
                _, want = memory_scan(*args[:2], *(x[:length] for x in args[2:]), model=model,
                                      chunk_size=CHUNK, impl="reference",
                                      reset=jnp.asarray(RESET[:length]), reset_to=w0)
            for got, ref in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
                np.testing.assert_allclose(got, ref, atol=1e-12, err_msg=f"L={length}")
        # A static length gives the same; L = T is the plain scan's final state.
        _, state_T = scan(impl, model, args, T, reset_to=w0)
        for got, ref in zip(jax.tree.leaves(state_T), jax.tree.leaves(full_state)):
            np.testing.assert_allclose(got, ref, atol=1e-13)


@pytest.mark.parametrize("name,per_checkpoint", [("linear", 1), ("mlp2", 2)])
def test_chunked_matches_reference_gradients_with_a_traced_state_length(name, per_checkpoint):
    model = MODELS[name]
    with jax.enable_x64(True):
        args = problem(model, T, seed=4)
        weights = functional(5, T, args[0])

        def objective(impl, length, *a):
            opts = {"chunks_per_checkpoint": per_checkpoint} if impl == "chunked" else {}
            reads, (P, S) = scan(impl, model, a, length, **opts)
            w_r, w_p, w_s = weights
            return (jnp.sum(reads * w_r) + sum(jnp.sum(p * w) for p, w in zip(P, w_p))
                    + sum(jnp.sum(s * w) for s, w in zip(S, w_s)))

        for length in (3, 16, 19):
            grads = {}
            for impl in ("reference", "chunked"):
                f = jax.jit(jax.value_and_grad(functools.partial(objective, impl),
                                               argnums=tuple(range(1, 9))),
                            compiler_options=FAST_COMPILE)
                grads[impl] = f(jnp.int32(length), *args)
            for a, b in zip(jax.tree.leaves(grads["reference"]), jax.tree.leaves(grads["chunked"])):
                scale = max(1.0, float(jnp.max(jnp.abs(a))))
                assert float(jnp.max(jnp.abs(a - b))) <= 1e-10 * scale, f"L={length}"


def test_pallas_runs_chunked_when_a_state_length_is_given():
    model = MODELS["linear"]
    with jax.enable_x64(True):
        args = problem(model, T, seed=6)
        got = scan("pallas", model, args, jnp.int32(11))
        want = scan("chunked", model, args, jnp.int32(11))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)


def test_bad_state_lengths_raise_clear_errors():
    model = MODELS["linear"]
    args = problem(model, 5, seed=0)
    run = lambda length: memory_scan(*args, model=model, chunk_size=2, state_length=length)  # noqa: E731
    with pytest.raises(ValueError, match="state_length must be in 0..T"):
        run(6)
    with pytest.raises(ValueError, match="state_length must be an integer"):
        run(2.0)
    with pytest.raises(ValueError, match="state_length must be an integer"):
        run(True)
    with pytest.raises(ValueError, match="integer scalar"):
        run(jnp.array([1, 2]))
