"""Where the CPU-only custom gradients apply, and ``forward_mode()`` to turn them off.

Two functions carry a custom VJP that only fixes XLA:CPU's layout or fusion of a backward pass:
:func:`titans_lm.nn.project.project` and :func:`titans_lm.nn.channel_scale.channel_scale`. Each
uses it when :func:`uses_custom_gradient` is True at trace time (JAX's default backend is the CPU
and no :func:`forward_mode` block is active) and is otherwise the plain expression, which JAX
differentiates in both modes. A ``jax.custom_vjp`` function has no forward mode, so ``jax.jvp``,
``jax.linearize``, ``jax.jacfwd`` or a forward-over-reverse Hessian product through a model on the
CPU must be traced inside ``with forward_mode():`` (the values are the same; only the CPU
backward's layout differs). On GPU and TPU the plain expressions are always used.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax

_setting = threading.local()


@contextlib.contextmanager
def forward_mode() -> Iterator[None]:
    """Within the block the CPU-only custom gradients are off (the plain expressions are traced
    on every backend), so that ``jax.jvp`` / ``jax.linearize`` work (module docstring).

    A trace-time setting of the current thread, like ``nnx.use_eager_sharding``: it must
    enclose the tracing (the ``jax.jvp`` call, or the first call of a jitted function); JAX
    caches traces per function, not per this setting, so a function traced outside the block
    keeps its custom gradient."""
    previous = getattr(_setting, "plain", False)
    _setting.plain = True
    try:
        yield
    finally:
        _setting.plain = previous


def uses_custom_gradient() -> bool:
    """Whether a function traced now uses its CPU custom gradient: the default backend is the
    CPU and no :func:`forward_mode` block is active."""
    return jax.default_backend() == "cpu" and not getattr(_setting, "plain", False)


__all__ = ["forward_mode", "uses_custom_gradient"]
