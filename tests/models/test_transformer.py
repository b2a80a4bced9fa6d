import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from titans_lm.models import build_model, count_params
from titans_lm.models.lm import LanguageModel
from titans_lm.models.remat import compiler_options
from titans_lm.nn.attention import Attention
from titans_lm.nn.init import AXIS_NAMES


def _cfg(**kw):
    c = ml_collections.ConfigDict(dict(
        name="transformer", vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64,
        rope_theta=10000.0, tie_embeddings=True, dtype="float32", param_dtype="float32",
        remat="none", norm_eps=1e-6, init_std=0.02, window=0))
    c.update(kw)
    return c


def _tokens(key, B, T, V=64):
    return jax.random.randint(jax.random.key(key), (B, T), 4, V, jnp.int32)


def _jit(m):
    """Jitted forward over the split state (eager op-by-op dispatch is slow)."""
    gdef, state = nnx.split(m)
    f = jax.jit(lambda st, t, s: nnx.merge(gdef, st)(t, s))
    return lambda t, s: f(state, t, s)


@pytest.fixture(scope="module")
def model():
    return build_model(_cfg(init_std=0.2), rngs=nnx.Rngs(0))


def test_logits_shape_dtype(model):
    tok = _tokens(0, 2, 16)
    logits = model(tok, jnp.ones_like(tok))
    assert logits.shape == (2, 16, 64) and logits.dtype == jnp.float32


def test_causality_exact_float32(model):
    T = 24
    tok = _tokens(1, 2, T)
    seg = jnp.ones_like(tok)
    f = _jit(model)
    fwd = lambda t: f(t, seg)
    base = fwd(tok)
    for j in (0, 5, 13, 23):
        out = fwd(tok.at[:, j].set((tok[:, j] + 7) % 60 + 4))
        np.testing.assert_array_equal(np.asarray(out[:, :j]), np.asarray(base[:, :j]))
        assert not np.array_equal(np.asarray(out[:, j]), np.asarray(base[:, j]))


def test_causality_exact_float64():
    with jax.enable_x64(True):
        m = build_model(_cfg(dtype="float64", param_dtype="float64", init_std=0.2), rngs=nnx.Rngs(1))
        assert m.embed.embedding[...].dtype == jnp.float64
        tok = _tokens(2, 1, 16)
        seg = jnp.ones_like(tok)
        fwd = _jit(m)
        base = fwd(tok, seg)
        assert base.dtype == jnp.float64
        for j in (3, 11):
            out = fwd(tok.at[:, j].set(tok[:, j] % 60 + 5), seg)
            np.testing.assert_array_equal(np.asarray(out[:, :j]), np.asarray(base[:, :j]))
            assert not np.array_equal(np.asarray(out[:, j]), np.asarray(base[:, j]))


def _packed_vs_alone(m):
    m = _jit(m)
    doc1, doc2 = _tokens(3, 1, 64), _tokens(4, 1, 64)
    packed = m(jnp.concatenate([doc1, doc2], 1),
               jnp.concatenate([jnp.full((1, 64), 1), jnp.full((1, 64), 2)], 1).astype(jnp.int32))
    alone1 = m(doc1, jnp.ones((1, 64), jnp.int32))
    alone2 = m(doc2, jnp.full((1, 64), 7, jnp.int32))
    np.testing.assert_allclose(packed[:, :64], alone1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed[:, 64:], alone2, rtol=1e-5, atol=1e-5)


def test_packed_documents_equal_documents_alone(model):
    _packed_vs_alone(model)


def test_packed_documents_with_persistent_tokens_and_window():
    cfg = _cfg(init_std=0.2, window=16)
    out_std = 0.2 / 2.0
    with nnx.use_eager_sharding(False):
        m = LanguageModel.from_config(
            cfg, lambda i, rngs: Attention(32, 4, window=16, init_std=0.2, out_init_std=out_std, rngs=rngs),
            rngs=nnx.Rngs(5), n_persistent=3)
    assert m.persistent.tokens[...].shape == (3, 32)
    _packed_vs_alone(m)
    logits = _jit(m)(_tokens(6, 1, 8), jnp.ones((1, 8), jnp.int32))
    assert logits.shape == (1, 8, 64)


def test_padding_positions_finite(model):
    tok = jnp.concatenate([_tokens(7, 2, 40), jnp.zeros((2, 24), jnp.int32), _tokens(8, 2, 64)], 1)
    seg = jnp.concatenate([jnp.full((2, 40), 1), jnp.zeros((2, 24)), jnp.full((2, 64), 2)], 1).astype(jnp.int32)
    seg = seg.at[1].set(0)  # a row of padding only
    logits = _jit(model)(tok, seg)
    assert np.all(np.isfinite(np.asarray(logits)))


def test_overfits_repeated_batch():
    m = build_model(_cfg(), rngs=nnx.Rngs(0))
    gdef, params, rest = nnx.split(m, nnx.Param, ...)
    tok = _tokens(9, 4, 33)
    seg = jnp.ones_like(tok)
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    def loss_fn(params):
        logits = nnx.merge(gdef, params, rest)(tok[:, :-1], seg[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tok[:, 1:]).mean()

    @jax.jit
    def step(params, opt):
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    first = None
    for _ in range(150):
        params, opt, loss = step(params, opt)
        first = loss if first is None else first
    assert float(first) > 3.5 and float(loss) < 0.5, (float(first), float(loss))


def test_remat_block_matches_no_remat():
    tok = _tokens(10, 2, 16)
    seg = jnp.ones_like(tok)
    grads = []
    for remat in ("none", "block"):
        m = build_model(_cfg(remat=remat), rngs=nnx.Rngs(3))
        gdef, params, rest = nnx.split(m, nnx.Param, ...)
        f = lambda p: nnx.merge(gdef, p, rest)(tok, seg).sum()
        # the recomputation kept in the compiled program (remat's CPU compiler options)
        grads.append(jax.jit(jax.grad(f), compiler_options=compiler_options(remat, "cpu"))(params))
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bfloat16_compute_gives_float32_logits():
    m32 = build_model(_cfg(init_std=0.2), rngs=nnx.Rngs(4))
    m16 = build_model(_cfg(init_std=0.2, dtype="bfloat16"), rngs=nnx.Rngs(4))
    tok = _tokens(11, 1, 16)
    l32, l16 = _jit(m32)(tok, jnp.ones_like(tok)), _jit(m16)(tok, jnp.ones_like(tok))
    assert l16.dtype == jnp.float32 and m16.embed.embedding[...].dtype == jnp.float32
    np.testing.assert_allclose(l16, l32, atol=0.15)


def test_tied_vs_untied_parameters():
    tied = build_model(_cfg(), rngs=nnx.Rngs(0))
    untied = build_model(_cfg(tie_embeddings=False), rngs=nnx.Rngs(0))
    tied_keys = {p for p, _ in nnx.to_flat_state(nnx.state(tied, nnx.Param))}
    untied_keys = {p for p, _ in nnx.to_flat_state(nnx.state(untied, nnx.Param))}
    assert untied_keys - tied_keys == {("head",)} and tied_keys <= untied_keys
    assert untied.head[...].shape == (32, 64)
    assert count_params(untied) - count_params(tied) == 32 * 64
    # analytic count: embedding + layers (4 D^2 attention, 3 D F SwiGLU, 2 norms) + final norm
    D, F, V, L = 32, 64, 64, 2
    assert count_params(tied) == V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D


def test_every_parameter_has_logical_axis_names():
    m = build_model(_cfg(tie_embeddings=False), rngs=nnx.Rngs(0))
    for path, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
        names = var.get_metadata().get("out_sharding")
        assert names is not None and len(names) == var[...].ndim, path
        assert all(n is None or n in AXIS_NAMES for n in names), (path, names)
    specs = nnx.get_partition_spec(nnx.state(m, nnx.Param))
    assert tuple(specs["embed"]["embedding"].get_value()) == ("vocab", "embed")
    assert tuple(specs["head"].get_value()) == ("embed", "vocab")


def test_scaled_init_of_output_projections():
    m = build_model(_cfg(d_model=128, n_heads=4, d_ff=256, n_layers=2, init_std=0.02), rngs=nnx.Rngs(0))
    blk = m.blocks[1]
    assert abs(float(jnp.std(m.embed.embedding[...])) - 0.02) < 0.002
    assert abs(float(jnp.std(blk.mixer.w_q[...])) - 0.02) < 0.002
    assert abs(float(jnp.std(blk.mixer.w_o[...])) - 0.02 / 2) < 0.001  # 0.02 / sqrt(2 * 2)
    assert abs(float(jnp.std(blk.mlp.w_down[...])) - 0.02 / 2) < 0.001


def test_bad_inputs_raise(model):
    with pytest.raises(ValueError, match="segment_ids shape"):
        model(jnp.ones((1, 4), jnp.int32), jnp.ones((1, 5), jnp.int32))
    with pytest.raises(ValueError, match="integer"):
        model(jnp.ones((1, 4)), jnp.ones((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="remat"):
        build_model(_cfg(remat="everything"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="missing field"):
        cfg = _cfg()
        del cfg["d_ff"]
        build_model(cfg, rngs=nnx.Rngs(0))
