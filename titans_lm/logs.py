"""Warnings logged once per process: :func:`warn_once`.

Code that runs at every trace (a fallback of the memory engine, a dimension a mesh axis cannot
split) would repeat its warning at every compile; it calls :func:`warn_once` instead, which logs a
message the first time its text is seen for that logger and stays silent after.
"""

from __future__ import annotations

import logging

_seen: set[tuple[str, str]] = set()  # (logger name, message text) already logged


def warn_once(logger: logging.Logger, msg: str, *args) -> bool:
    """``logger.warning(msg, *args)`` unless the same text went to ``logger`` before.

    Returns:
      True when the message was logged now.
    """
    key = (logger.name, msg % args if args else msg)
    if key in _seen:
        return False
    _seen.add(key)
    logger.warning(msg, *args)
    return True


def forget_warnings() -> None:
    """Let every message of :func:`warn_once` be logged again (for tests)."""
    _seen.clear()


__all__ = ["forget_warnings", "warn_once"]
