import jax.numpy as jnp
import ml_collections
import pytest
from flax import nnx

from titans_lm.models import build_model, register, registered_names
from titans_lm.models import registry


def test_transformer_is_registered():
    assert "transformer" in registered_names()


def test_unknown_name_lists_registered():
    cfg = ml_collections.ConfigDict({"name": "no_such_backbone"})
    with pytest.raises(ValueError, match=r"unknown model name 'no_such_backbone'.*transformer"):
        build_model(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="no 'name'"):
        build_model(ml_collections.ConfigDict({"d_model": 4}), rngs=nnx.Rngs(0))


def test_register_builds_without_mesh_and_rejects_duplicates():
    name = "test_registry_dummy"

    @register(name)
    def build(cfg, *, rngs):
        class Dummy(nnx.Module):
            def __init__(self):
                init = nnx.with_partitioning(nnx.initializers.ones, ("embed",))
                self.w = nnx.Param(init(rngs.params(), (cfg.d,), jnp.float32))
        return Dummy()

    try:
        # annotated parameters outside a mesh would raise without use_eager_sharding(False)
        m = build_model(ml_collections.ConfigDict({"name": name, "d": 3}), rngs=nnx.Rngs(0))
        assert m.w[...].shape == (3,)
        assert m.w.get_metadata()["out_sharding"] == ("embed",)
        with pytest.raises(ValueError, match="already registered"):
            register(name)(build)
    finally:
        registry._BUILDERS.pop(name, None)
    with pytest.raises(ValueError, match="non-empty"):
        register("")


def test_an_abstract_build_has_the_shapes_of_a_concrete_one():
    """``nnx.eval_shape`` of a build (how ``titans_lm.train.state.model_fns`` describes a model
    without allocating it) gives the parameters of the concrete build."""
    import jax
    from _backbones import load_config
    cfg = load_config("lmm").model
    cfg.update(d_model=32, n_layers=2, d_ff=64, vocab_size=64)
    cfg.memory.head_dim = 16
    traced = nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0)))
    concrete = build_model(cfg, rngs=nnx.Rngs(0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(traced, nnx.Param)) == \
        jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(concrete, nnx.Param))
