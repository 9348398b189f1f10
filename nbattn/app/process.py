"""How a command ends: exit codes, interruption by signals, errors as one line.

:func:`run_command` runs a command so that

* SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (a KeyboardInterrupt,
  so no ``except Exception`` on the way up swallows it and every ``with``
  block cleans up: temporary outputs are removed, older outputs untouched);
  the command prints ``nbattn: interrupted`` and returns 128 + the signal's
  number (130, 143, 129). A signal that arrives while numba's dispatcher or
  llvmlite has called back into Python from C is not raised there (the
  exception would escape through C code that does not expect it, or be lost in
  a ctypes callback): it is delivered again :data:`REDELIVER_AFTER_S` later;
* any other exception, whatever its type, prints one line
  ``nbattn: error: ...`` (at most :data:`MESSAGE_LIMIT` characters) and
  returns 1;
* ``SystemExit`` (argparse's usage errors, exit 2) passes through;
* a warning is printed as one line ``nbattn: warning: ...`` (its category
  and message, without Python's file and source line).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings

from .io import clip

__all__ = ["MESSAGE_LIMIT", "Interrupted", "error_line", "run_command", "signals_raise"]

MESSAGE_LIMIT = 1000
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Interrupted(KeyboardInterrupt):
    """Raised by the handler of :func:`signals_raise` for the signal ``signum``."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


@contextlib.contextmanager
def signals_raise():
    """Inside the block SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` once;
    further signals are ignored while the cleanup runs. The previous handlers are
    restored on exit. Outside the main thread (where Python cannot set handlers)
    the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if inside_numba(frame):
            # numba's dispatcher called back into Python: an exception raised here leaves
            # through C code that does not expect one ("returned a result with an
            # exception set", or a crash). Deliver the signal again once it has returned.
            threading.Timer(REDELIVER_AFTER_S, os.kill, (os.getpid(), signum)).start()
            return
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


#: How long a signal that arrived inside numba's dispatcher waits to be delivered again.
REDELIVER_AFTER_S = 0.05


def inside_numba(frame) -> bool:
    """Whether the Python frame a signal interrupted is numba's or llvmlite's own code
    (numba's dispatcher, or llvmlite's ctypes callbacks, called back from C), where an
    exception raised is lost or corrupts the caller."""
    if frame is None:
        return False
    return str(frame.f_globals.get("__name__", "")).split(".")[0] in ("numba", "llvmlite")


def error_line(exc: BaseException) -> str:
    """``nbattn: error: MESSAGE`` on one line; the type's name leads the message for
    exceptions other than ValueError, OSError and ImportError (whose messages say
    what went wrong by themselves)."""
    message = " ".join(str(exc).split())
    if isinstance(exc, MemoryError):
        message = f"out of memory {message}".strip()
    elif not message or not isinstance(exc, ValueError | OSError | ImportError):
        message = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return "nbattn: error: " + clip(message, MESSAGE_LIMIT)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = clip(" ".join(str(message).split()), MESSAGE_LIMIT)
    print(f"nbattn: warning: {category.__name__}: {text}", file=sys.stderr)


def run_command(command) -> int:
    """Call ``command()`` and return its exit code (see the module's docstring)."""
    with signals_raise(), warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return command() or 0
        except Interrupted as exc:
            print("nbattn: interrupted", file=sys.stderr)
            return 128 + exc.signum
        except KeyboardInterrupt:
            print("nbattn: interrupted", file=sys.stderr)
            return 128 + signal.SIGINT
        except Exception as exc:  # every error is one line, whatever its type
            print(error_line(exc), file=sys.stderr)
            return 1
