"""Progress bars on stderr for the command line, drawn by tqdm.

A bar is shown only when its stream is a terminal (``stream.isatty()``) and
the caller did not ask for quiet; ``force=True`` draws it on any stream
(tests). tqdm redraws at most ten times a second here, so updating it costs
nothing measurable. Plain per-iteration lines (``nbattn fit --verbose``) are
the estimators' ``verbose=1`` and go to stderr whether or not it is a terminal.
"""

from __future__ import annotations

import sys
import threading

from tqdm import tqdm

__all__ = ["Progress", "running"]


class Progress:
    """``with Progress(total, "predict", unit="rows") as bar: bar.update(n)``.

    Parameters
    ----------
    total : float or None
        The amount of work (rows, bytes, widths); None draws a counter with
        the elapsed time and no percentage.
    desc : str
        A label in front of the bar.
    unit : str
        Shown after the counts; "bytes" is shown as B, kB, MB.
    quiet : bool
        Never draw.
    stream : file, default sys.stderr
    force : bool
        Draw even when ``stream`` is not a terminal.
    bar_format : str, optional
        tqdm's ``bar_format`` (default: tqdm's bar, or a counter without a total).
    """

    def __init__(
        self, total=None, desc="", unit="", quiet=False, stream=None, force=False, bar_format=None
    ):
        stream = sys.stderr if stream is None else stream
        isatty = getattr(stream, "isatty", lambda: False)
        self.enabled = not quiet and (force or bool(isatty()))
        in_bytes = unit == "bytes"
        unit = "B" if in_bytes else (unit or "it")
        counter = f"{{n_fmt}} {unit} " if unit != "it" else "{n_fmt} "
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=in_bytes or (total or 0) >= 10_000,
            unit_divisor=1024 if in_bytes else 1000,
            bar_format=bar_format or (None if total else "{desc}: " + counter + "[{elapsed}]"),
            file=stream,
            disable=not self.enabled,
            mininterval=0.1,
            leave=True,
        )

    @property
    def n(self):
        return self.bar.n

    def update(self, n=1, *, position=None) -> None:
        """Advance by ``n`` (or jump to ``position``)."""
        if position is not None:
            n = position - self.bar.n
        self.bar.update(n)

    def refresh(self) -> None:
        """Redraw now (the elapsed time of a bar without updates)."""
        if self.enabled:
            self.bar.refresh()

    def close(self) -> None:
        """Draw the final state and end the line."""
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False


class running:  # noqa: N801 - used like a function: ``with running("fit"):``
    """Show ``desc: <elapsed>`` ticking on stderr while a block runs (terminal only).

    For work that reports no progress of its own: a daemon thread redraws the
    elapsed time twice a second.
    """

    def __init__(self, desc, quiet=False, stream=None, force=False):
        self.bar = Progress(
            None, desc, quiet=quiet, stream=stream, force=force, bar_format="{desc}: [{elapsed}]"
        )
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.bar.enabled:
            self.bar.refresh()

            def tick():
                while not self._stop.wait(0.5):
                    self.bar.refresh()

            self._thread = threading.Thread(target=tick, daemon=True)
            self._thread.start()
        return self.bar

    def __exit__(self, exc_type, exc, tb):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.bar.__exit__(exc_type, exc, tb)
