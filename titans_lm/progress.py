"""Progress of a long phase (training, an evaluation set, data preparation, generation).

:class:`Progress` draws a tqdm bar when its stream is a terminal; otherwise (a log file, a pipe,
a terminal of zero width) it writes timestamped lines: the first once the phase has run
``quiet_s`` seconds (5 by default; a shorter phase writes none), then every ``every_s`` seconds (30
by default), and one when the phase ends, e.g.

    2026-12-04 12:01:33 books-test reset: 120/480 batches (25%), 2.10 batches/s, 0:00:57 so far, ETA 0:02:51

The rate and the ETA are measured from the end of the first unit on (the first often includes a
compile), so a line shows them once a second unit is done. A phase whose total is unknown
(``total=None``) gets the same lines without a percentage or ETA.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

Log = Callable[[str], None]


def hms(seconds: float) -> str:
    """``H:MM:SS`` of a duration in seconds (negative -> 0)."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def timestamp() -> str:
    """The local time, ``YYYY-MM-DD HH:MM:SS``: the prefix of every progress line."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


def terminal_columns(stream) -> int:
    """The width of the terminal ``stream`` writes to; 0 when it is not a terminal (or has none)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else 0
    except (OSError, ValueError, AttributeError):
        return 0


def eta_seconds(done: float, total: float | None, elapsed: float) -> float | None:
    """Seconds left at the rate so far (``elapsed / done`` a unit), or None when unknown."""
    if total is None or done <= 0:
        return None
    return elapsed / done * max(total - done, 0)


class Progress:
    """A bar on a terminal, timestamped lines elsewhere (module docstring).

    Args:
      total: units of work in the phase (None: unknown).
      desc: what is being done, e.g. ``"books-test reset"``.
      unit: the unit's name (``"batch"`` -> "batches").
      enabled: False shows nothing.
      stream: where the bar goes (stderr); decides bar or lines.
      log: where the lines go (default: printed to ``stream``).
      every_s: the most seconds between two lines.
      quiet_s: no line before the phase has run this long.
      initial: units already done (a resumed phase).
    """

    def __init__(self, total: int | None, desc: str, unit: str = "it", *, enabled: bool = True,
                 stream: TextIO | None = None, log: Log | None = None, every_s: float = 30.0,
                 quiet_s: float = 5.0, initial: int = 0):
        self.stream = stream or sys.stderr
        self.total, self.desc, self.unit = total, desc, unit
        self.enabled = enabled
        self.bar_mode = enabled and terminal_columns(self.stream) > 0
        self._log = log or (lambda m: print(m, file=self.stream, flush=True))
        self.every_s, self.quiet_s = every_s, quiet_s
        self.n = self.initial = initial
        self._t0 = time.perf_counter()
        self._last_line: float | None = None
        self._first: tuple[float, int] | None = None  # (time, units) at the end of the first unit
        self._closed = False
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False,
                        disable=not self.bar_mode, dynamic_ncols=True, mininterval=1.0,
                        file=self.stream)

    def _units(self) -> str:
        u = self.unit
        return u if u.endswith("s") else (u + "es" if u.endswith(("ch", "sh", "x")) else u + "s")

    def line(self) -> str:
        """The progress line of now (without the timestamp)."""
        now = time.perf_counter()
        elapsed = now - self._t0
        count = f"{self.n:,}/{self.total:,}" if self.total is not None else f"{self.n:,}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = left = ""
        if self._first is not None and self.n > self._first[1]:
            t_from, n_from = self._first
            done, took = self.n - n_from, now - t_from
            if took > 0:
                rate = f", {done / took:,.2f} {self._units()}/s"
            eta = eta_seconds(done, None if self.total is None else self.total - n_from, took)
            if eta is not None and self.n < (self.total or 0):
                left = f", ETA {hms(eta)}"
        return f"{self.desc}: {count} {self._units()}{pct}{rate}, {hms(elapsed)} so far{left}"

    def update(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.n += n
        if self._first is None:
            self._first = (time.perf_counter(), self.n)
        if not self.enabled:
            return
        if self.bar_mode:
            self.bar.update(n)
            return
        now = time.perf_counter()
        finished = self.total is not None and self.n >= self.total
        if now - self._t0 < self.quiet_s:
            return
        if self._last_line is None or now - self._last_line >= self.every_s or finished:
            self._last_line = now
            self._log(f"{timestamp()} {self.line()}")

    def close(self) -> None:
        """End the phase (the bar is removed; the final line is written if not yet)."""
        if self._closed:
            return
        self._closed = True
        self.bar.close()
        if self.enabled and not self.bar_mode and self._last_line is not None and (
                self.total is None or self.n < self.total):
            self._log(f"{timestamp()} {self.line()}")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Progress", "eta_seconds", "hms", "terminal_columns", "timestamp"]
