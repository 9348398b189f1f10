"""What a long fit is doing, on stderr: ``verbose=`` of the fitting functions.

* ``verbose=False`` or 0: nothing.
* ``verbose=True`` or 1: a tqdm bar (step count, the latest loss and its
  change) when stderr is a terminal; one plain line per step otherwise, so
  that logs of batch jobs show the progress too.
* ``verbose=2`` (or more): plain lines always.

stderr is looked up when the progress starts, so redirecting it (pytest's
capture, ``contextlib.redirect_stderr``) works.
"""

from __future__ import annotations

import sys
from numbers import Integral

__all__ = ["FitProgress", "check_verbose"]


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
        level = check_verbose(verbose)
        self.desc = desc
        self.stream = sys.stderr
        self._bar = None
        if level == 0:
            self.mode = None
        elif level == 1 and _is_terminal(self.stream):
            from tqdm import tqdm

            self.mode = "bar"
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=True)
        else:
            self.mode = "lines"

    @property
    def enabled(self) -> bool:
        return self.mode is not None

    def step(self, message, n=1):
        """One step done: the bar advances by ``n`` and shows ``message``; or a line."""
        if self.mode == "bar":
            if self._bar.total is not None and self._bar.n + n > self._bar.total:
                self._bar.total = self._bar.n + n
            self._bar.set_postfix_str(message, refresh=False)
            self._bar.update(n)
        elif self.mode == "lines":
            self._line(message)

    def note(self, message):
        """A line of its own (above the bar on a terminal)."""
        if self.mode == "bar":
            self._bar.write(f"{self.desc}: {message}", file=self.stream)
        elif self.mode == "lines":
            self._line(message)

    def _line(self, message):
        print(f"{self.desc}: {message}", file=self.stream, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False
