"""Backbone registry: ``@register("name")`` on a builder ``f(model_cfg, *, rngs) -> nnx.Module`` and
``build_model(model_cfg, *, rngs)`` to construct the one named by ``model_cfg.name``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from flax import nnx

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
        lists the registered names), or if the builder rejects the config.
    """
    name = model_cfg.get("name") if hasattr(model_cfg, "get") else getattr(model_cfg, "name", None)
    if not name:
        raise ValueError(f"model config has no 'name'; registered models: {registered_names()}")
    if name not in _BUILDERS:
        raise ValueError(f"unknown model name {name!r}; registered models: {registered_names()}")
    with nnx.use_eager_sharding(False), _tracer_origins_off():
        return _BUILDERS[name](model_cfg, rngs=rngs)


@contextlib.contextmanager
def _tracer_origins_off() -> Iterator[None]:
    """Building a model under tracing (``nnx.eval_shape``, a jitted init) without JAX's tracer
    "origin" messages.

    Every random draw updates its ``nnx.Rngs`` counter through ``Variable.set_value``, which
    compares ``getattr(value, "sharding", None)`` of the old and new values; on a tracer that
    attribute raises an AttributeError whose message (``DynamicJaxprTracer._origin_msg``) searches
    the whole jaxpr traced so far for the value's origin. That makes an abstract build quadratic in
    model size: 38 s for ``lmm:760m`` on this project's 2-core CPU, 80% of it composing messages
    that are caught and dropped. Within this block the message is left empty; the values built
    are unchanged. (A no-op if this JAX has no such method.)
    """
    try:
        from jax._src.interpreters import partial_eval as pe  # deliberate: private, may be absent
        cls = pe.DynamicJaxprTracer
        original = cls.__dict__["_origin_msg"]
    except (ImportError, AttributeError, KeyError):
        yield
        return
    cls._origin_msg = lambda self: ""
    try:
        yield
    finally:
        cls._origin_msg = original
