"""A small progress bar on stderr (no dependency).

Shown only when the stream is a terminal (``stream.isatty()``) and the
caller did not ask for quiet; ``force=True`` draws it on any stream (tests).
Redraws at most ten times a second, so updating it costs nothing measurable.
"""

from __future__ import annotations

import sys
import time


def _fmt_time(seconds: float) -> str:
    seconds = max(0, int(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """``with Progress(total, "predict", unit="rows") as bar: bar.update(n)``.

    Parameters
    ----------
    total : float or None
        The amount of work (rows, bytes, folds); None draws a counter without
        a percentage.
    desc : str
        A label in front of the bar.
    unit : str
        Shown after the counts.
    quiet : bool
        Never draw.
    stream : file, default sys.stderr
    force : bool
        Draw even when ``stream`` is not a terminal.
    """

    width = 24
    interval = 0.1

    def __init__(self, total=None, desc="", unit="", quiet=False, stream=None, force=False):
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = not quiet and (force or bool(isatty()))
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = 0
        self.start = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, n=1, *, position=None) -> None:
        """Advance by ``n`` (or jump to ``position``) and redraw if due."""
        self.n = position if position is not None else self.n + n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._draw(now)

    def message(self) -> str:
        """The current line (without the carriage return)."""
        elapsed = time.monotonic() - self.start
        head = f"{self.desc}: " if self.desc else ""
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            frac = min(max(self.n / self.total, 0.0), 1.0)
            filled = int(round(frac * self.width))
            bar = "#" * filled + " " * (self.width - filled)
            eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
            return (
                f"{head}{frac * 100:3.0f}% |{bar}| {_count(self.n)}/{_count(self.total)}{unit}"
                f" [{_fmt_time(elapsed)}<{_fmt_time(eta)}]"
            )
        count = f"{_count(self.n)}{unit} " if (self.n or self.unit) else ""
        return f"{head}{count}[{_fmt_time(elapsed)}]"

    def _draw(self, now=None) -> None:
        self.stream.write("\r" + self.message() + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False
        return False


def _count(x) -> str:
    x = float(x)
    if x >= 1e9:
        return f"{x / 1e9:.2f}G"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


class running:  # noqa: N801 - used like a function: ``with running("fit"):``
    """Show ``desc: mm:ss`` ticking on stderr while a block runs (terminal only).

    For work that reports no progress of its own (an estimator's ``fit``):
    a daemon thread redraws the elapsed time twice a second.
    """

    def __init__(self, desc, quiet=False, stream=None, force=False):
        self.bar = Progress(None, desc, quiet=quiet, stream=stream, force=force)
        self._stop = None
        self._thread = None

    def __enter__(self):
        if self.bar.enabled:
            import threading

            self._stop = threading.Event()

            def tick():
                while not self._stop.wait(0.5):
                    self.bar._draw()

            self.bar._draw()
            self._thread = threading.Thread(target=tick, daemon=True)
            self._thread.start()
        return self.bar

    def __exit__(self, exc_type, exc, tb):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        return self.bar.__exit__(exc_type, exc, tb)
