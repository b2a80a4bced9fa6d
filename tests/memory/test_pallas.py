"""impl="pallas" (titans_lm/memory/pallas/) against impl="chunked".

By default (CPU) the kernels run in Pallas' interpreters: the Triton kernel with interpret=True and
the TPU kernel with pltpu.InterpretParams(). With TITANS_LM_PALLAS_INTERPRET=0 on a GPU or TPU
machine the kernel tests compile the local lowering instead (and the interpreter-only tests skip).
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory import LinearMemory, MLPMemory, ResidualLN, memory_scan
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.pallas.plan import KernelPlan, make_plan, resolve_backend
from titans_lm.memory.pallas.scan import auto_choice, kernel_scan

pytestmark = pytest.mark.kernel

INTERPRET = os.environ.get("TITANS_LM_PALLAS_INTERPRET", "1") != "0"
PLATFORM = jax.default_backend()
if INTERPRET:
    MODES = [("triton", True), ("tpu", True)]
elif PLATFORM in ("gpu", "tpu"):
    MODES = [({"gpu": "triton", "tpu": "tpu"}[PLATFORM], False)]
else:
    MODES = []
MODE_IDS = [f"{b}-{'interpret' if i else 'compiled'}" for b, i in MODES]
needs_modes = pytest.mark.skipif(not MODES,
                                 reason="TITANS_LM_PALLAS_INTERPRET=0 needs a GPU or TPU")
interpret_only = pytest.mark.skipif(not INTERPRET, reason="interpreter-only test")

LINEAR = LinearMemory()
MLP = MLPMemory(depth=2, expansion=4.0, activation="silu")


def random_problem(model, T, d, seed=0, dtype=jnp.float32, batch=()):
    """Random one-head (or [*batch]-leading) memory problem: params0, momentum0, k, v, q, gates."""
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    keys = jax.random.split(jax.random.key(seed), int(np.prod(batch)) if batch else 1)
    params0 = jax.vmap(lambda key: model.init(key, d, d, dtype))(keys)
    params0 = tuple(p.reshape(tuple(batch) + p.shape[1:]) if batch else p[0] for p in params0)
    momentum0 = tuple(jnp.asarray(0.05 * rng.normal(size=p.shape), dtype) for p in params0)
    k, q = (jnp.asarray(unit(rng.normal(size=tuple(batch) + (T, d))), dtype) for _ in range(2))
    v = jnp.asarray(rng.normal(size=tuple(batch) + (T, d)), dtype)
    theta = jnp.asarray(rng.uniform(0.0, 0.2, tuple(batch) + (T,)), dtype)
    eta = jnp.asarray(rng.uniform(0.0, 1.0, tuple(batch) + (T,)), dtype)
    alpha = jnp.asarray(rng.uniform(0.0, 0.2, tuple(batch) + (T,)), dtype)
    return params0, momentum0, k, v, q, theta, eta, alpha


def outputs_and_grads(scan_fn, args, seed=1):
    """Outputs of scan_fn(*args) and the gradients of a random linear functional of them with
    respect to every argument (one compiled function)."""
    out_shapes = jax.eval_shape(scan_fn, *args)
    rng = np.random.default_rng(seed)
    weights = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype), out_shapes)

    def objective(*a):
        out = scan_fn(*a)
        value = sum(jnp.sum(o * w) for o, w in zip(jax.tree.leaves(out), jax.tree.leaves(weights)))
        return value, out

    grads, out = jax.jit(jax.grad(objective, argnums=tuple(range(len(args))), has_aux=True))(*args)
    return out, grads


def assert_close(got, want, rtol, what=""):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.shape, w.shape, g.dtype)
        wide = jnp.promote_types(g.dtype, jnp.float32)
        scale = max(1.0, float(jnp.max(jnp.abs(w.astype(wide)))))
        err = float(jnp.max(jnp.abs(g.astype(wide) - w.astype(wide))))
        assert err <= rtol * scale, f"{what} leaf {i}: |error| {err:.3g} > {rtol:g} x {scale:.3g}"


def scan_with(impl, model, chunk, reset=None, **options):
    def fn(params0, momentum0, k, v, q, theta, eta, alpha, reset_to):
        return memory_scan(params0, momentum0, k, v, q, theta, eta, alpha, model=model,
                           chunk_size=chunk, impl=impl, reset=reset, reset_to=reset_to, **options)
    return fn


# ----------------------------------------------------------------------------------- agreement
MODELS = {"linear": LINEAR, "mlp": MLP}
# (model, chunk, T, chunks_per_checkpoint, gradients too): T is never a multiple of the chunk.
CASES = [("linear", 16, 40, 2, True), ("mlp", 64, 100, 1, True), ("mlp", 16, 40, 2, False),
         ("linear", 64, 100, 1, False)]
_reference_cache: dict = {}


def _case_problem(name, chunk, T):
    model, d = MODELS[name], 16
    args = random_problem(model, T, d, seed=3) + (model.init(jax.random.key(11), d, d),)
    return model, args, jnp.zeros((T,), bool).at[chunk].set(True)


def _chunked_reference(key, fn, args, grads):
    """chunked's outputs (and gradients), computed once per case for all kernel modes."""
    if key not in _reference_cache:
        with jax.default_matmul_precision("highest"):
            _reference_cache[key] = outputs_and_grads(fn, args) if grads else (jax.jit(fn)(*args),)
    return _reference_cache[key]


@needs_modes
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-b{c[1]}-T{c[2]}" for c in CASES])
def test_kernel_matches_chunked_reads_state_and_gradients(mode, case):
    """Reads and final (P, S) match chunked to float32 tolerance, and (for the cases marked so)
    the gradients w.r.t. k, v, q, gates, P0, S0 and the reset target; a reset sits at chunk 1."""
    backend, interpret = mode
    name, chunk, T, group, grads = case
    model, args, reset = _case_problem(name, chunk, T)
    pallas = scan_with("pallas", model, chunk, reset, backend=backend, interpret=interpret,
                       chunks_per_checkpoint=group)
    chunked = scan_with("chunked", model, chunk, reset, chunks_per_checkpoint=group)
    want = _chunked_reference(case, chunked, args, grads)
    with jax.default_matmul_precision("highest"):
        got = outputs_and_grads(pallas, args) if grads else (jax.jit(pallas)(*args),)
    assert_close(got[0], want[0], 1e-5, "outputs")
    if grads:
        assert_close(got[1], want[1], 2e-5, "gradients")


@needs_modes
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_kernel_under_vmap_over_batch_and_heads(mode):
    """vmap over batch (with per-sequence document resets) and heads adds kernel grid axes; every
    (sequence, head) matches its own chunked run, forward and backward."""
    backend, interpret = mode
    B, H, T, d, chunk = 2, 2, 40, 16, 16
    params0, momentum0, k, v, q, theta, eta, alpha = random_problem(MLP, T, d, seed=5, batch=(B, H))
    reset = jnp.zeros((B, T), bool).at[0, 16].set(True).at[1, 32].set(True)

    def batched(impl, **options):
        def one(p, m, k_, v_, q_, th, et, al, rs):
            return memory_scan(p, m, k_, v_, q_, th, et, al, model=MLP, chunk_size=chunk, impl=impl,
                               reset=rs, **options)
        heads = jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None))
        over_batch = jax.vmap(heads)
        return lambda p, m, k_, v_, q_, th, et, al: over_batch(p, m, k_, v_, q_, th, et, al, reset)

    args = (params0, momentum0, k, v, q, theta, eta, alpha)
    want = _chunked_reference("vmap", batched("chunked"), args, True)
    with jax.default_matmul_precision("highest"):
        got = outputs_and_grads(batched("pallas", backend=backend, interpret=interpret), args)
    assert got[0][0].shape == (B, H, T, d)
    assert_close(got[0], want[0], 1e-5, "outputs")
    assert_close(got[1], want[1], 2e-5, "gradients")


@needs_modes
@pytest.mark.parametrize("mode", MODES[:1], ids=MODE_IDS[:1])
def test_read_at_chunk_start_matches_chunked(mode):
    """read="chunk_start" (MAC's retrieval): reads f(q; P0) and the same final state."""
    backend, interpret = mode
    T, d, chunk = 40, 16, 16
    for model in (LINEAR, MLP):
        args = random_problem(model, T, d, seed=8) + (model.init(jax.random.key(2), d, d),)
        with jax.default_matmul_precision("highest"):
            got = jax.jit(scan_with("pallas", model, chunk, read="chunk_start", backend=backend,
                                    interpret=interpret))(*args)
            want = jax.jit(scan_with("chunked", model, chunk, read="chunk_start"))(*args)
        assert_close(got, want, 1e-5, "outputs")


@needs_modes
@pytest.mark.parametrize("mode", MODES[:1], ids=MODE_IDS[:1])
def test_short_sequence_and_gelu_tanh(mode):
    """T < chunk (one partial chunk) with the tanh-GELU MLP; zero gates (eta = 0 exactly, as with
    momentum off) keep the log-sum gate matrices exact."""
    backend, interpret = mode
    model = MLPMemory(depth=2, expansion=2.0, activation="gelu_tanh")
    T, d, chunk = 11, 32, 16
    p0, m0, k, v, q, theta, eta, alpha = random_problem(model, T, d, seed=4)
    eta = eta.at[3].set(0.0)
    alpha = alpha.at[5].set(0.0)
    args = (p0, m0, k, v, q, theta, eta, alpha, p0)
    with jax.default_matmul_precision("highest"):
        pallas = scan_with("pallas", model, chunk, backend=backend, interpret=interpret)
        got = jax.jit(pallas)(*args)
        want = jax.jit(scan_with("chunked", model, chunk))(*args)
    assert_close(got, want, 1e-5, "outputs")


@needs_modes
@pytest.mark.parametrize("mode", MODES[:1], ids=MODE_IDS[:1])
def test_bfloat16_inputs_accumulate_in_float32(mode):
    """bf16 inputs: the kernel computes in float32 and returns bf16; it matches chunked run in
    float32 on the same (bf16-valued) inputs to bf16 rounding."""
    backend, interpret = mode
    T, d, chunk = 40, 32, 16
    args16 = random_problem(LINEAR, T, d, seed=6, dtype=jnp.bfloat16)
    reads, (P, S) = memory_scan(*args16, model=LINEAR, chunk_size=chunk, impl="pallas",
                                backend=backend, interpret=interpret)
    assert reads.dtype == P[0].dtype == S[0].dtype == jnp.bfloat16
    args32 = tuple(jax.tree.map(lambda x: x.astype(jnp.float32), a) for a in args16)
    with jax.default_matmul_precision("highest"):
        want = memory_scan(*args32, model=LINEAR, chunk_size=chunk, impl="chunked")
    assert_close((reads, P, S), jax.tree.map(lambda x: x.astype(jnp.bfloat16), want), 2e-2, "bf16")


@interpret_only
def test_float64_interpret_agrees_to_1e10():
    """In float64 (Triton kernel, interpreted) the kernel's arithmetic equals chunked's to ~1e-10:
    the dual form, the log-sum gate matrices and the partial last chunk are exact math."""
    with jax.enable_x64(True):
        for model in (LINEAR, MLP):
            args = random_problem(model, 100, 16, seed=9, dtype=jnp.float64)
            reset = jnp.zeros((100,), bool).at[32].set(True)
            got = memory_scan(*args, model=model, chunk_size=16, impl="pallas", reset=reset,
                              backend="triton", interpret=True)
            want = memory_scan(*args, model=model, chunk_size=16, impl="reference", reset=reset)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                assert g.dtype == jnp.float64
                assert float(jnp.max(jnp.abs(g - w))) < 1e-10


# ----------------------------------------------------------------------------------- fallback
@pytest.mark.parametrize("model,chunk,d,reason", [
    (MLPMemory(depth=2, bias=True), 16, 16, "not supported"),
    (LINEAR, 8, 16, "chunk_size 8"),
    (LINEAR, 16, 24, "head dims"),
])
def test_fallback_logs_once_and_equals_chunked(caplog, model, chunk, d, reason):
    args = random_problem(model, 16, d, seed=1)
    with caplog.at_level(logging.WARNING, logger="titans_lm.memory.pallas"):
        for _ in range(2):
            got = jax.jit(scan_with("pallas", model, chunk))(*args, args[0])
    want = jax.jit(scan_with("chunked", model, chunk))(*args, args[0])
    records = [r for r in caplog.records if reason in r.getMessage()]
    assert len(records) <= 1
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_surprise_clip_runs_chunked_with_the_clip():
    """The kernel does not clip: with surprise_max_norm > 0 "pallas" runs "chunked" with the
    clip (so the clip acts: the result differs from the unclipped one)."""
    args = random_problem(LINEAR, 32, 16, seed=3)
    got = jax.jit(scan_with("pallas", LINEAR, 16, surprise_max_norm=0.05))(*args, args[0])
    want = jax.jit(scan_with("chunked", LINEAR, 16, surprise_max_norm=0.05))(*args, args[0])
    free = jax.jit(scan_with("chunked", LINEAR, 16))(*args, args[0])
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert float(jnp.max(jnp.abs(got[0] - free[0]))) > 1e-4


def test_fallback_message_is_logged(caplog):
    model = MLPMemory(depth=3, expansion=2.0)  # a fresh reason, so the once-only log fires here
    args = random_problem(model, 16, 16, seed=2)
    with caplog.at_level(logging.WARNING, logger="titans_lm.memory.pallas"):
        jax.eval_shape(scan_with("pallas", model, 16), *args, args[0])
        jax.eval_shape(scan_with("pallas", model, 16), *args, args[0])
    messages = [r.getMessage() for r in caplog.records
                if "falls back to 'chunked'" in r.getMessage()]
    assert len(messages) == 1 and "depth=3" in messages[0] and "\n" not in messages[0]


def _plan(model, d, **kw):
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), d, d))
    options = dict(seq_len=100, chunk_size=16, read="after_write", chunks_per_checkpoint=1,
                   backend="triton", interpret=False)
    dtype = kw.pop("dtype", jnp.float32)
    options.update(kw)
    return make_plan(model, params, dtype, **options)


def test_plan_supported_shapes_and_block_sizes():
    plan = _plan(LINEAR, 128)
    assert isinstance(plan, KernelPlan) and plan.kind == "linear"
    assert (plan.block_v, plan.num_warps, plan.n_groups, plan.group) == (32, 8, 7, 1)
    plan = _plan(MLP, 64, chunk_size=32, chunks_per_checkpoint=8)
    assert (plan.kind, plan.hidden, plan.block_h, plan.n_groups) == ("mlp", 256, 32, 1)
    assert plan.group == 4                      # capped at the 4 chunks of T = 100
    tpu = _plan(MLP, 128, backend="tpu")
    assert (tpu.block_v, tpu.block_h) == (128, 512)
    assert _plan(LINEAR, 256).block_v == 16
    reasons = {
        "chunk_size": _plan(LINEAR, 16, chunk_size=8),
        "head dims": _plan(LINEAR, 48),
        "MLP memory": _plan(MLP, 256),
        "inner model": _plan(ResidualLN(LINEAR), 16),
        "activation": _plan(MLPMemory(depth=2, activation="gelu"), 16),
        "float64": _plan(LINEAR, 16, dtype=jnp.float64),
        "shared memory": _plan(MLP, 64, chunk_size=64),
    }
    assert isinstance(_plan(MLP, 64, chunk_size=64, backend="tpu"), KernelPlan)
    assert isinstance(_plan(MLP, 32, chunk_size=64), KernelPlan)
    for word, reason in reasons.items():
        assert isinstance(reason, str) and word in reason, (word, reason)
    with pytest.raises(ValueError, match="chunks_per_checkpoint"):
        _plan(LINEAR, 16, chunks_per_checkpoint=0)
    with pytest.raises(ValueError, match="precision"):
        _plan(LINEAR, 16, precision="tf32")
    with pytest.raises(ValueError, match="tf32x3"):
        _plan(LINEAR, 16, precision="tf32x3", backend="tpu")
    assert _plan(LINEAR, 16, precision="tf32x3").lax_precision() is not None


def test_resolve_backend_and_auto_choice():
    assert resolve_backend(None, None, "cpu") == ("triton", True)
    assert resolve_backend(None, None, "gpu") == ("triton", False)
    assert resolve_backend(None, None, "tpu") == ("tpu", False)
    assert resolve_backend("tpu", None, "cpu") == ("tpu", True)
    assert resolve_backend("tpu", None, "gpu") == ("tpu", True)
    with pytest.raises(ValueError, match="cannot be compiled"):
        resolve_backend("triton", False, "cpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", None, "gpu")
    assert [auto_choice(p) for p in ("gpu", "tpu", "cpu")] == ["pallas", "pallas", "chunked"]


def test_auto_runs_the_platform_choice():
    args = random_problem(LINEAR, 20, 16, seed=3)
    got = memory_scan(*args, model=LINEAR, chunk_size=16, impl="auto")
    want = memory_scan(*args, model=LINEAR, chunk_size=16, impl=auto_choice(PLATFORM))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_memory_config_accepts_pallas_and_auto():
    assert MemoryConfig(d_model=32, impl="pallas").impl == "pallas"
    assert MemoryConfig(d_model=32, impl="auto").impl == "auto"
    with pytest.raises(ValueError, match="impl"):
        MemoryConfig(d_model=32, impl="cuda")


# ----------------------------------------------------------------------------------- lowering
@pytest.mark.parametrize("backend,platform", [("triton", "cuda"), ("tpu", "tpu")])
@pytest.mark.parametrize("model,d,chunk", [(LINEAR, 128, 64), (MLP, 64, 16)], ids=["linear", "mlp"])
def test_kernels_lower_for_gpu_and_tpu(backend, platform, model, d, chunk):
    """Without an accelerator: the forward and backward pass, vmapped over batch and heads, lower
    to a Triton (cuda) or Mosaic (tpu) kernel call — every in-kernel op has a lowering, loads and
    stores have legal shapes. (Compiling the kernel needs the device.)"""
    T = 100
    params0 = model.init(jax.random.key(0), d, d)
    plan = make_plan(model, params0, jnp.float32, seq_len=T, chunk_size=chunk, read="after_write",
                     chunks_per_checkpoint=1, backend=backend, interpret=False)
    assert isinstance(plan, KernelPlan)

    def one(p, k, v, q, th, et, al):
        m = tuple(jnp.zeros_like(x) for x in p)
        reads, (P, S) = kernel_scan(plan, p, m, k, v, q, th, et, al, jnp.zeros((T,), bool), p)
        return jnp.sum(reads) + sum(jnp.sum(x) for x in P + S)

    axes = (None,) + (0,) * 6
    loss = lambda *a: jnp.sum(jax.vmap(jax.vmap(one, axes), axes)(*a))  # noqa: E731
    x = jnp.ones((2, 3, T, d))
    g = jnp.ones((2, 3, T)) * 0.1
    lowered = jax.jit(jax.grad(loss)).trace(params0, x, x, x, g, g, g).lower(
        lowering_platforms=(platform,))
    text = lowered.as_text()
    assert ("triton" in text) if backend == "triton" else ("tpu_custom_call" in text)


# ----------------------------------------------------------------------------------- training
def test_tiny_lmm_trains_with_the_same_losses():
    """A tiny LMM (NeuralMemory as the only token mixer; linear memory with momentum, decay,
    short conv and output gate) trains 3 AdamW steps with impl="pallas" (interpreted on CPU,
    compiled on an accelerator) with chunked's losses; the batch packs two documents."""
    optax = pytest.importorskip("optax")
    pytest.importorskip("ml_collections")          # titans_lm.models imports the config presets
    from flax import nnx

    from titans_lm.memory.layer import NeuralMemory
    from titans_lm.models.lm import LanguageModel

    B, T, V = 2, 64, 64
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(4, V, size=(B, T + 1)), jnp.int32)
    seg = np.ones((B, T + 1), np.int32)
    seg[1, 32:] = 2                                    # a second document at a chunk start
    seg = jnp.asarray(seg)

    def losses(impl):
        cfg = MemoryConfig(d_model=32, n_heads=2, head_dim=16, memory_depth=1, chunk_size=16,
                           impl=impl, theta_bias_init=-1.0)
        with nnx.use_eager_sharding(False):
            model = LanguageModel(vocab_size=V, d_model=32, n_layers=1, d_ff=64,
                                  make_mixer=lambda i, rngs: NeuralMemory(cfg, rngs=rngs),
                                  rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tx = optax.adamw(3e-3)
        opt_state = tx.init(params)

        def loss_fn(params):
            logits = nnx.merge(graphdef, params, rest)(tokens[:, :-1], seg[:, :-1])
            logp = jax.nn.log_softmax(logits)
            nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
            w = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).astype(jnp.float32)
            return jnp.sum(nll * w) / jnp.sum(w)

        @jax.jit
        def step(params, opt_state):
            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        out = []
        for _ in range(3):
            params, opt_state, loss = step(params, opt_state)
            out.append(float(loss))
        return np.array(out)

    with jax.default_matmul_precision("highest"):
        got, want = losses("pallas"), losses("chunked")
    assert want[-1] < want[0]
    np.testing.assert_allclose(got, want, rtol=2e-5)


@needs_modes
def test_documents_starting_inside_chunks_are_exact():
    """The kernel resets only at chunk starts; a document start inside a chunk runs chunked
    (exact), whether the flag comes from the caller (traced: lax.cond) or from the traced resets
    (both run, each row selects). Values and gradients, for resets inside and on the grid."""
    backend, interpret = MODES[0]
    model, args, _ = _case_problem("linear", 16, 40)
    weights = [jnp.asarray(np.random.default_rng(2).normal(size=s.shape), s.dtype)
               for s in jax.tree.leaves(jax.eval_shape(lambda *a: memory_scan(
                   *a[:8], model=model, chunk_size=16, reset_to=a[8]), *args))]

    def objective(impl, options, *a):
        reset, flag = a[9], a[10]
        if flag is not None:
            options = dict(options, inside_starts=flag)
        out = memory_scan(*a[:8], model=model, chunk_size=16, impl=impl, reset=reset,
                          reset_to=a[8], **options)
        return sum(jnp.sum(o * w) for o, w in zip(jax.tree.leaves(out), weights)), out

    def run(impl, reset, flag, **options):
        fn = jax.grad(lambda *a: objective(impl, options, *a), argnums=tuple(range(9)), has_aux=True)
        return jax.jit(fn)(*args, reset, flag)

    kernel = {"backend": backend, "interpret": interpret}
    with jax.default_matmul_precision("highest"):
        for starts in ([5, 16, 30], [16]):
            reset = jnp.zeros((40,), bool).at[jnp.asarray(starts)].set(True)
            want_grads, want = run("chunked", reset, None)
            for flag in (None, jnp.asarray(starts != [16])):
                grads, got = run("pallas", reset, flag, **kernel)
                assert_close(got, want, 1e-5, "outputs")
                assert_close(grads, want_grads, 2e-5, "gradients")
