"""The analytic FLOP counts against the matmuls JAX actually traces, and against hand counts."""


import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from _tiny_run import REPO

from titans_lm.config import load
from titans_lm.memory import MLPMemory, memory_scan
from titans_lm.memory.config import MemoryConfig
from titans_lm.models import build_model
from titans_lm.models.flops import (_coefficient_flops, count_flops, jaxpr_matmul_flops,
                                   memory_chunk_flops, traced_forward_flops)
from titans_lm.models.memory_mixer import memory_config, memory_layer_indices


def small_config(name, persistent=False, **memory):
    m = load(REPO / "configs" / f"{name}.py", "tiny").model
    m.d_model, m.n_layers, m.d_ff, m.vocab_size = 128, 2, 96, 300
    if "n_persistent" in m and not persistent:
        m.n_persistent = 0
    if "n_heads" in m:
        m.n_heads = 2
    if "memory" in m:
        m.memory.chunk_size = 16
        m.memory.update(memory)
    if name == "mac":
        m.memory_layers = "0"   # one layer with memory, one without
    return m


@pytest.mark.parametrize("name,T,memory", [
    ("transformer", 96, {}), ("ttt_linear", 72, {}), ("ttt_mlp", 64, {}), ("lmm", 100, {}),
    ("lmm", 64, {"read": "chunk_start", "use_momentum": False}), ("lmm", 48, {"use_decay": False}),
    ("mag", 80, {}),
    ("mal", 64, {}), ("linear_attention", 72, {}), ("deltanet", 72, {}),
    ("gated_deltanet", 64, {}), ("gated_deltanet", 72, {"chunk_size": 12}),
])
def test_executed_count_equals_traced_matmuls(name, T, memory):
    m = small_config(name, **memory)
    model = build_model(m, rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, T), jnp.int32)
    traced = traced_forward_flops(lambda t: model(t, jnp.ones_like(t)), tokens)
    count = count_flops(m, T)
    assert count.executed_total == traced
    assert 0 < count.model_total <= count.executed_total


@pytest.mark.parametrize("name", ["lact", "ttt_linear"])
def test_constant_gate_coefficients_cost_no_matmul(name):
    """Without momentum and decay the [b, b] gate coefficients are the gates, masked, and the
    engine forms them so: no coefficient product in either count (the executed one is checked
    against the traced matmuls above); a decaying memory still counts its products."""
    m = small_config(name)
    m.memory.chunk_size, T = 32, 128
    m.memory.use_decay, m.memory.decay_target = False, "zero"   # TTT as published
    mcfg = memory_config(m)
    assert _coefficient_flops(32, log_keep=True, reset_row=True, newton_schulz=False,
                              momentum=False, decay=False) == 0
    assert memory_chunk_flops(mcfg) == memory_chunk_flops(mcfg, executed=False)
    count = count_flops(m, T)
    assert count.executed["memory_dual"] == count.model["memory_dual"]
    m.memory.use_decay = True
    decaying = count_flops(m, T)
    per_chunk = _coefficient_flops(32, log_keep=True, reset_row=True, newton_schulz=False,
                                   momentum=False)
    n_layers = len(memory_layer_indices(m.get("memory_layers", "all"), m.n_layers))
    assert per_chunk > 0
    assert (decaying.executed["memory_dual"] - count.executed["memory_dual"]
            == n_layers * mcfg.n_heads * (T // 32) * per_chunk)


RULES = {"omega3": {"omega_window": 3}, "omega6": {"omega_window": 6}, "ns2": {"ns_steps": 2},
         "omega3_ns2": {"omega_window": 3, "ns_steps": 2}}


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_omega_and_newton_schulz_counts_equal_traced_matmuls(rule, depth):
    """Atlas' Omega rule (window 3, and 6 > the chunk of 4: it reaches two chunks back) and
    Newton-Schulz momentum, alone and together, through the LMM (T not a multiple of the chunk):
    the executed count is the traced matmuls exactly, and the model count grows by the rule."""
    shape = dict(chunk_size=4, head_dim=8, memory_depth=depth)
    m = small_config("lmm", **shape, **rule)
    T = 62
    model = build_model(m, rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, T), jnp.int32)
    traced = traced_forward_flops(lambda t: model(t, jnp.ones_like(t)), tokens)
    count = count_flops(m, T)
    assert count.executed_total == traced
    plain = count_flops(small_config("lmm", **shape), T)
    assert plain.model_total < count.model_total <= count.executed_total


@pytest.mark.parametrize("name,T", [("lmm", 64), ("mag", 80), ("mal", 64), ("mac", 100)])
def test_count_close_with_persistent_tokens_and_mac(name, T):
    """Persistent tokens run through the memory as a call of their own (``LanguageModel
    .init_state``) that also keeps its end state, and MAC's segment loop carries its state: the
    analytic count leaves that bookkeeping out and stays within 5% of the traced matmuls."""
    m = small_config(name, persistent=True)
    model = build_model(m, rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, T), jnp.int32)
    traced = traced_forward_flops(lambda t: model(t, jnp.ones_like(t)), tokens)
    executed = count_flops(m, T).executed_total
    assert abs(executed - traced) <= 0.05 * traced, (executed, traced)


def test_transformer_hand_count():
    m = small_config("transformer")
    T, D, L, F, V = 96, 128, 2, 96, 300
    per_layer = 4 * 2 * T * D * D + 2 * 2 * T * T * D + 3 * 2 * T * D * F
    c = count_flops(m, T)
    assert c.executed_total == L * per_layer + 2 * T * D * V
    # Causal: the scores and values over (T + 1) / 2 keys on average.
    assert c.model["attention_core"] == L * 2 * 2 * T * D * (T + 1) / 2
    pt = c.per_token()
    assert pt["train_model"] == 3 * pt["fwd_model"]


@pytest.mark.parametrize("b,read", [(8, "after_write"), (16, "chunk_start")])
def test_chunk_count_equals_traced_engine(b, read):
    """One head, one chunk of the engine alone, against the memory_chunk_flops formula."""
    model = MLPMemory(depth=2, expansion=2.0)
    cfg = MemoryConfig(d_model=32, n_heads=1, head_dim=32, memory_expansion=2.0, chunk_size=b,
                       read=read)
    P0 = model.init(jax.random.key(0), 32, 32)
    S0 = tuple(jnp.zeros_like(p) for p in P0)
    x = jnp.ones((b, 32))
    g = jnp.full((b,), 0.5)

    def f(x):
        return memory_scan(P0, S0, x, x, x, g, g, g * 0.01, model=model, chunk_size=b,
                           impl="chunked", read=read)

    closed = jax.make_jaxpr(f)(x)
    assert jaxpr_matmul_flops(closed) == memory_chunk_flops(cfg, log_keep=False, traced_resets=False)


@pytest.mark.parametrize("b,width,read,omega,ns", [
    (8, 32, "after_write", 3, 0), (8, 32, "chunk_start", 6, 0), (16, 4, "after_write", 3, 2),
    (16, 4, "chunk_start", 20, 2), (8, 8, "after_write", 1, 3)])
def test_rule_chunk_count_equals_traced_engine(b, width, read, omega, ns):
    """One head, one chunk of the engine alone under the Omega rule and Newton-Schulz momentum
    (gates from alpha, no traced document starts; width 4 at chunk 16: the momentum's einsum
    takes u d first), dead code removed, against the memory_chunk_flops formula."""
    model = MLPMemory(depth=2, expansion=2.0)
    cfg = MemoryConfig(d_model=width, n_heads=1, head_dim=width, memory_expansion=2.0,
                       chunk_size=b, read=read, omega_window=omega, ns_steps=ns)
    P0 = model.init(jax.random.key(0), width, width)
    S0 = tuple(jnp.zeros_like(p) for p in P0)
    x = jnp.ones((b, width))
    g = jnp.full((b,), 0.5)
    window = {"omega_window": omega, "gamma": g} if omega > 1 else {}

    def f(x):
        return memory_scan(P0, S0, x, x, x, g, g, g * 0.01, model=model, chunk_size=b,
                           impl="chunked", read=read, ns_steps=ns, **window)

    assert traced_forward_flops(f, x) == memory_chunk_flops(cfg, log_keep=False,
                                                            traced_resets=False)


def test_unknown_backbone():
    m = small_config("transformer")
    m.name = "nope"
    with pytest.raises(ValueError, match="no FLOP count for backbone 'nope'"):
        count_flops(m, 64)


def test_banded_window_attention_counts_two_windows_of_keys():
    """A sliding window W over T = 4W tokens runs in bands: each query over 2W keys."""
    m = small_config("swa")
    m.window = 16
    T, D, L = 64, 128, 2
    c = count_flops(m, T)
    assert c.executed["attention_core"] == L * T * 4 * D * 2 * 16
    assert count_flops(m, 24).executed["attention_core"] == L * 24 * 4 * D * 24   # 24 % W: dense


def test_traced_flops_fall_back_to_no_dead_code_elimination(monkeypatch):
    """Without the private JAX module the count keeps the dead matmuls (an upper bound) and
    warns; with it the dead one is removed."""
    import sys
    w = jnp.ones((8, 8))

    def f(x):
        _ = x @ w            # dead
        return x @ w @ w
    x = jnp.ones((4, 8))
    exact = traced_forward_flops(f, x)
    assert exact == 2 * (2 * 4 * 8 * 8)
    # the private module as this JAX has it, without its DCE function (a changed JAX)
    monkeypatch.delattr(sys.modules["jax._src.interpreters.partial_eval"], "dce_jaxpr")
    with pytest.warns(RuntimeWarning, match="no dead-code elimination"):
        assert traced_forward_flops(f, x) == 3 * (2 * 4 * 8 * 8)
