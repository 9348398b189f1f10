"""Progress on stderr, drawn by tqdm: the command line's bars and the fits' ``verbose=``.

* :class:`Progress` and :func:`running`: bars of the command line. A bar is
  shown only when its stream is a terminal (``stream.isatty()``) and the
  caller did not ask for quiet; ``force=True`` draws it on any stream
  (tests). tqdm redraws at most ten times a second here, so updating it costs
  nothing measurable.
* :class:`FitProgress`: ``verbose=`` of the fitting functions
  (``loo_bandwidth``, ``fit_learned_kernel``, the estimators, ``nbattn fit
  --verbose``):

  - ``verbose=False`` or 0: nothing;
  - ``verbose=True`` or 1: a tqdm bar (step count, the latest loss and its
    change) when stderr is a terminal; one plain line per step otherwise, so
    that logs of batch jobs show the progress too;
  - ``verbose=2`` (or more): plain lines always.

  Every plain line is ``<desc>: <message> [<elapsed>]``, the time since the
  progress started (:func:`format_elapsed`); a bar shows it in tqdm's own
  format and redraws it twice a second, so a long step does not look stuck.
  stderr is looked up when the progress starts, so redirecting it (pytest's
  capture, ``contextlib.redirect_stderr``) works.

Every progress line or bar of nbattn goes through this module: the command's
``cv`` (:func:`nbattn.app.batch.cross_validate`) and the Dask functions
(:mod:`nbattn.app.dask`) report through :class:`FitProgress` too.

tqdm is imported when a bar is drawn, so importing this module, and a quiet
run, cost nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from numbers import Integral

__all__ = ["FitProgress", "Progress", "check_verbose", "format_elapsed", "running"]


def format_elapsed(seconds) -> str:
    """``0.4 s``, ``12.3 s``, ``3 min 52 s``, ``1 h 05 min``: a duration for a progress line."""
    seconds = max(float(seconds), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


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
        self._count = 0
        self.bar = None
        if not self.enabled:  # counts without tqdm: quiet runs never import it
            return
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=in_bytes or (total or 0) >= 10_000,
            unit_divisor=1024 if in_bytes else 1000,
            bar_format=bar_format or (None if total else "{desc}: " + counter + "[{elapsed}]"),
            file=stream,
            mininterval=0.1,
            leave=True,
        )

    @property
    def n(self):
        return self.bar.n if self.bar is not None else self._count

    def update(self, n=1, *, position=None) -> None:
        """Advance by ``n`` (or jump to ``position``)."""
        if position is not None:
            n = position - self.n
        if self.bar is not None:
            self.bar.update(n)
        else:
            self._count += n

    def refresh(self) -> None:
        """Redraw now (the elapsed time of a bar without updates)."""
        if self.bar is not None:
            self.bar.refresh()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.bar is not None:
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


def check_verbose(verbose) -> int:
    """``verbose`` as a level 0, 1 or 2; a ValueError naming it otherwise."""
    if isinstance(verbose, (bool, Integral)) and int(verbose) >= 0:
        return min(int(verbose), 2)
    raise ValueError(f"verbose must be a bool or a non-negative integer, got {verbose!r}")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class FitProgress:
    """``with FitProgress(verbose, "fit_learned_kernel", total=200) as log: log.step("...")``.

    Parameters
    ----------
    verbose : bool or int
        See the module docstring.
    desc : str
        The name in front of every line (the function that reports).
    total : int, optional
        Expected number of steps (the bar's length); steps may exceed it.
    unit : str
        What a step is, for the bar.
    """

    def __init__(self, verbose, desc, total=None, unit="it"):
        self.level = check_verbose(verbose)
        self.desc = desc
        self.stream = sys.stderr
        self.started = time.perf_counter()
        self._bar = None
        self._stop = self._ticker = None
        if self.level == 0:
            self.mode = None
        elif self.level == 1 and _is_terminal(self.stream):
            from tqdm import tqdm

            self.mode = "bar"
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=True)
            self._start_ticking()
        else:
            self.mode = "lines"

    @property
    def enabled(self) -> bool:
        return self.mode is not None

    @property
    def elapsed(self) -> float:
        """Seconds since the progress started."""
        return time.perf_counter() - self.started

    def step(self, message, n=1):
        """One step done: the bar advances by ``n`` and shows ``message``; or a line."""
        if self.mode == "bar":
            if self._bar.total is not None and self._bar.n + n > self._bar.total:
                self._bar.total = self._bar.n + n
            self._bar.set_postfix_str(message, refresh=False)
            self._bar.update(n)
        elif self.mode == "lines":
            self._line(message)

    def status(self, message):
        """What runs now (a step under way): shown on the bar at once; no line (the
        step's own line follows when it is done)."""
        if self.mode == "bar":
            self._bar.set_postfix_str(message, refresh=True)

    def note(self, message):
        """A line of its own (above the bar on a terminal)."""
        if self.mode == "bar":
            self._bar.write(self._text(message), file=self.stream)
        elif self.mode == "lines":
            self._line(message)

    def _text(self, message):
        return f"{self.desc}: {message} [{format_elapsed(self.elapsed)}]"

    def _line(self, message):
        print(self._text(message), file=self.stream, flush=True)

    def _start_ticking(self):
        """Redraw the bar (its elapsed time) twice a second from a daemon thread."""
        self._stop = threading.Event()
        bar, stop = self._bar, self._stop

        def tick():
            while not stop.wait(0.5):
                bar.refresh()

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def close(self):
        if self._stop is not None:
            self._stop.set()
            self._ticker.join()
            self._stop = self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False
