"""The mixer protocol: what a block's token mixer provides (``titans_lm.models.blocks.Block``).

A backbone is a choice of mixer per block (``LanguageModel``'s ``make_mixer``). Every mixer
(attention, a test-time-learning memory, a hybrid) satisfies :class:`Mixer`:

    state = mixer.init_state(B)                      # the state of a stream that has seen nothing
    y_BTD, state = mixer(x_BTD, stream, state)       # one call of the stream
    state = mixer.reset_memory(state, rows_B)        # rows' neural memories back to a doc start
    norms = mixer.memory_norms(state)                # one scalar per neural memory it holds

``stream`` is the call's :class:`titans_lm.nn.stream.Stream`; ``state`` a pytree of arrays whose
batch-row leaves have leading axis B. A mixer without a neural memory returns the state unchanged
from ``reset_memory`` and () from ``memory_norms``. The protocol is structural
(``typing.Protocol``): a mixer does not inherit from it; ``isinstance(m, Mixer)`` checks that
the four methods exist.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from titans_lm.nn.stream import Stream


@runtime_checkable
class Mixer(Protocol):
    """A block's token mixer (module docstring)."""

    def init_state(self, batch_size: int) -> Any:
        """The state of a stream of ``batch_size`` rows that has seen no token."""
        ...

    def __call__(self, x_BTD: jax.Array, stream: Stream, state: Any) -> tuple[jax.Array, Any]:
        """``(y_BTD, state after the call)`` for input ``x_BTD`` [B, T, D]."""
        ...

    def reset_memory(self, state: Any, rows_B: jax.Array) -> Any:
        """``state`` with the neural memory of the rows ``rows_B`` (bool [B]) back to what a
        document start restores (with the current parameters); everything else unchanged."""
        ...

    def memory_norms(self, state: Any) -> tuple[jax.Array, ...]:
        """Per neural memory held in ``state``: ``||P|| / ||W0||`` (``titans_lm.memory.stats``)."""
        ...


__all__ = ["Mixer"]
