"""How a command ends: exit codes, interruption by signals, errors as one line.

:func:`run_command` runs a command so that

* SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (a KeyboardInterrupt,
  so no ``except Exception`` on the way up swallows it and every ``with``
  block cleans up: temporary outputs are removed, older outputs untouched);
  the command prints ``nbattn: interrupted`` and returns 128 + the signal's
  number (130, 143, 129). A signal that arrives while numba's or llvmlite's
  code is running (a callback from compiled code or from C, or a frame that
  one of them called) is not raised there (the exception would escape through
  C code that does not expect it, or be lost in a ctypes callback): it is
  raised as soon as Python runs outside their code again (a trace function
  watches for it: :func:`raise_outside_numba`);
* any other exception, whatever its type, prints one line
  ``nbattn: error: ...`` (at most :data:`MESSAGE_LIMIT` characters) and
  returns 1;
* ``SystemExit`` (argparse's usage errors, exit 2) passes through;
* a warning is printed as one line ``nbattn: warning: ...`` (its category
  and message, without Python's file and source line).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import warnings

from .io import clip

__all__ = [
    "MESSAGE_LIMIT",
    "Interrupted",
    "error_line",
    "inside_numba",
    "raise_outside_numba",
    "run_command",
    "signals_raise",
]

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
            # numba's dispatcher or compiled code called back into Python: an exception
            # raised here leaves through C code that does not expect one ("returned a
            # result with an exception set", or a crash). Raise it once Python runs
            # outside their code again (delivering the signal again later is not enough:
            # a long kernel that calls back at its end catches every delivery there).
            raise_outside_numba(signum, frame)
            return
        _stop_watching()
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        _stop_watching()
        for s, h in previous.items():
            signal.signal(s, h)


_OWN_CODE = ("numba", "llvmlite")


def inside_numba(frame) -> bool:
    """Whether the Python frame a signal interrupted is numba's or llvmlite's own code, or
    was called (directly or not) by it: numba's dispatcher and compiled code and
    llvmlite's ctypes callbacks call Python from C, where an exception raised is lost or
    corrupts the caller."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".")[0] in _OWN_CODE:
            return True
        frame = getattr(frame, "f_back", None)
    return False


#: the trace function that raises a deferred signal, and the trace function it replaced
_watching: dict = {}


def raise_outside_numba(signum, frame) -> None:
    """Raise :class:`Interrupted` ``signum`` at the first call or return of a Python
    function outside numba's and llvmlite's code (where Python itself raises a
    KeyboardInterrupt: at a function's start), with a trace function on this thread and
    on every frame of the stack. :func:`signals_raise` removes it when its block ends."""

    def tracer(f, event, arg):
        if event in ("call", "return") and not inside_numba(f):
            _unwatch_frames()
            for s in _SIGNALS:
                signal.signal(s, signal.SIG_IGN)
            raise Interrupted(signum)  # Python then removes the trace function itself
        return None if event == "call" else tracer

    if "previous" not in _watching:
        _watching["previous"] = sys.gettrace()
    _watching["tracer"] = tracer
    f = frame
    while f is not None:
        f.f_trace = tracer
        f.f_trace_lines = False
        f = f.f_back
    sys.settrace(tracer)


def _unwatch_frames() -> None:
    tracer = _watching.pop("tracer", None)
    frame = sys._getframe()
    while frame is not None and tracer is not None:
        if frame.f_trace is tracer:
            frame.f_trace = None
            frame.f_trace_lines = True
        frame = frame.f_back


def _stop_watching() -> None:
    """Remove the trace function of :func:`raise_outside_numba`, restoring the one it
    replaced (a debugger's, a coverage tool's)."""
    if _watching:
        _unwatch_frames()
        sys.settrace(_watching.pop("previous"))


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
