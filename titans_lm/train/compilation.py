"""Compiling: JAX's persistent compilation cache, and compiles that say what they do.

The cache (:func:`use_compile_cache`): XLA's executables are kept on disk, keyed by the program
and the compile options, so a command that compiles a program already compiled once (a resumed
run, a second ``eval`` or ``generate`` of a run) loads it instead of compiling it again. Where it
lives, first match wins:

1. the setting passed (``titans-lm ... --compile_cache=DIR|off``);
2. the environment variable ``TITANS_LM_COMPILE_CACHE`` (``off`` or a folder);
3. JAX's own setting, ``JAX_COMPILATION_CACHE_DIR``, when set;
4. ``$XDG_CACHE_HOME/titans_lm/jax`` (``~/.cache/titans_lm/jax``).

JAX caches only programs that took at least ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` (1 s by
default) to compile; the folder may be deleted at any time.

The compiles (:func:`compile_announced`): a line before (``compiling the eval step ...``) and one
after with the seconds it took, whether it came from the cache, and the program's size: the
FLOPs of one call as XLA counts them and its temporary memory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

ENV = "TITANS_LM_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "none")

Log = Callable[[str], None]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/titans_lm/jax``, ``~/.cache/titans_lm/jax`` without that variable."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "titans_lm" / "jax"


def compile_cache_dir(setting: str | None = None) -> Path | None:
    """The cache folder for ``setting`` (module docstring: the setting, ``TITANS_LM_COMPILE_CACHE``,
    ``JAX_COMPILATION_CACHE_DIR``, the default), or None when it is turned off."""
    for value in (setting, os.environ.get(ENV), os.environ.get("JAX_COMPILATION_CACHE_DIR")):
        if value is not None and value.strip():
            value = value.strip()
            return None if value.lower() in OFF else Path(value).expanduser()
    return default_cache_dir()


def use_compile_cache(setting: str | None = None, log: Log | None = None) -> Path | None:
    """Turn JAX's persistent compilation cache on in the folder of :func:`compile_cache_dir` (or
    leave it off) for this process; call it before the first compile. Returns the folder.

    Raises:
      ValueError: the folder cannot be created (naming it and the way to move or turn it off).
    """
    path = compile_cache_dir(setting)
    if path is None:
        jax.config.update("jax_compilation_cache_dir", None)
        if log:
            log(f"compilation cache: off (unset {ENV} or set it to a folder to keep compiled "
                f"programs)")
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the compilation cache folder {path} ({e.strerror}); "
                         f"move it with --compile_cache=DIR or {ENV}=DIR, or turn it off with "
                         f"{ENV}=off") from None
    jax.config.update("jax_compilation_cache_dir", str(path))
    if log:
        log(f"compilation cache: {path} ({ENV}=off or --compile_cache=off turns it off)")
    return path


class _CacheHits:
    """Counts JAX's ``/jax/compilation_cache/cache_hits`` events of the current thread."""

    _lock = threading.Lock()
    _registered = False
    _local = threading.local()

    @classmethod
    def _listen(cls, event: str, **kwargs) -> None:
        del kwargs
        if event == "/jax/compilation_cache/cache_hits":
            cls._local.hits = getattr(cls._local, "hits", 0) + 1

    @classmethod
    def count(cls) -> int:
        with cls._lock:
            if not cls._registered:
                jax.monitoring.register_event_listener(cls._listen)
                cls._registered = True
        return getattr(cls._local, "hits", 0)


def program_size(compiled: Any) -> str:
    """``"2.1 GFLOP a call, 35 MiB of temporaries"`` from XLA's cost and memory analyses of a
    compiled program (the parts a backend does not report are left out; "" when none is)."""
    parts = []
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        flops = float(cost.get("flops", 0.0))
        if flops > 0:
            parts.append(f"{flops / 1e9:,.3g} GFLOP a call")
    except Exception:  # noqa: BLE001 (a backend without the analysis: the size is left out)
        pass
    try:
        temp = compiled.memory_analysis().temp_size_in_bytes
        parts.append(f"{temp / 2**20:,.0f} MiB of temporaries")
    except Exception:  # noqa: BLE001 (as above)
        pass
    return ", ".join(parts)


def compile_announced(jitted: Any, *args, what: str, log: Log | None = None, **kwargs) -> Any:
    """``jitted.lower(*args, **kwargs).compile()`` between two lines on ``log``: ``compiling the
    <what> ...`` and ``compiled the <what> in 12.3 s (from the compilation cache; 2.1 GFLOP a
    call, 35 MiB of temporaries)``. Returns the compiled program."""
    if log:
        log(f"compiling the {what} ...")
    hits = _CacheHits.count()
    t0 = time.perf_counter()
    compiled = jitted.lower(*args, **kwargs).compile()
    sec = time.perf_counter() - t0
    if log:
        notes = [n for n in ("from the compilation cache" if _CacheHits.count() > hits else "",
                             program_size(compiled)) if n]
        log(f"compiled the {what} in {sec:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""))
    return compiled


class Announced:
    """A jitted function whose compiles are announced (:func:`compile_announced`): a call runs
    the program compiled for its arguments' shapes, dtypes and shardings, compiled at the first
    call that has them.

    Args:
      jitted: a ``jax.jit`` function (no static or donated arguments).
      what: what the program is, e.g. ``"eval step"``.
      log: where the two lines go (None: silent).
    """

    def __init__(self, jitted: Any, what: str, log: Log | None = None):
        self.jitted, self.what, self.log = jitted, what, log
        self._compiled: dict[Any, Any] = {}

    @staticmethod
    def _key(args) -> tuple:
        leaves, tree = jax.tree.flatten(args)
        return (tree,) + tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x))),
                                getattr(x, "sharding", None)) for x in leaves)

    def __call__(self, *args):
        key = self._key(args)
        if key not in self._compiled:
            self._compiled[key] = compile_announced(self.jitted, *args, what=self.what,
                                                    log=self.log)
        return self._compiled[key](*args)


__all__ = ["Announced", "compile_announced", "compile_cache_dir", "default_cache_dir", "program_size",
           "use_compile_cache"]
