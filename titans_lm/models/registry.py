"""Backbone registry: ``@register("name")`` on a builder ``f(model_cfg, *, rngs) -> nnx.Module`` and
``build_model(model_cfg, *, rngs)`` to construct the one named by ``model_cfg.name``."""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

from titans_lm.config.fields import check_model_fields

_BUILDERS: dict[str, Callable[..., nnx.Module]] = {}


def register(name: str):
    """Decorator registering a model builder under ``name``.

    Raises:
      ValueError: if ``name`` is empty or already registered.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name must be a non-empty string, got {name!r}")

    def deco(builder: Callable[..., nnx.Module]):
        if name in _BUILDERS:
            raise ValueError(f"model name {name!r} is already registered (by {_BUILDERS[name]!r})")
        _BUILDERS[name] = builder
        return builder

    return deco


def registered_names() -> list[str]:
    """Sorted names of the registered backbones."""
    return sorted(_BUILDERS)


def build_model(model_cfg, *, rngs: nnx.Rngs) -> nnx.Module:
    """Build the backbone named ``model_cfg.name``.

    The model is created inside ``nnx.use_eager_sharding(False)``, so the parameters' logical axis
    names stay metadata (the trainer maps them onto a mesh). Works under ``nnx.eval_shape`` too.

    Args:
      model_cfg: the ``model`` section of the config (ml_collections.ConfigDict).
      rngs: nnx.Rngs with a ``params`` stream.

    Raises:
      ValueError: if ``model_cfg`` has no ``name`` or names an unregistered backbone (the message
        lists the registered names), has a field the backbone does not read or a value out of
        range (``titans_lm.config.fields``: nothing is silently ignored), or if the builder
        rejects the config.
    """
    name = model_cfg.get("name") if hasattr(model_cfg, "get") else getattr(model_cfg, "name", None)
    if not name:
        raise ValueError(f"model config has no 'name'; registered models: {registered_names()}")
    if name not in _BUILDERS:
        raise ValueError(f"unknown model name {name!r}; registered models: {registered_names()}")
    check_model_fields(model_cfg)
    with nnx.use_eager_sharding(False):
        return _BUILDERS[name](model_cfg, rngs=rngs)
