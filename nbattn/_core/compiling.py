"""What happens when numba compiles an nbattn kernel: a one-line notice, once per process.

The first call of a kernel in a fresh installation compiles it (seconds to tens
of seconds each; numba then keeps it in its on-disk cache, so later processes
load it in milliseconds). So that a first call does not look hung, the first
compile of an nbattn kernel in a process prints one line on stderr::

    nbattn: compiling kernels for first use; cached afterwards

(``nbattn warmup`` compiles the common kernels ahead of time). It is printed
from a listener on numba's ``numba:compile`` event, which numba raises only
when it really compiles: a call that finds its kernel compiled in the process,
or loads it from the on-disk cache, never reaches the listener, so warm calls
cost nothing more. Compiles of numba functions outside nbattn are ignored.

Silence it with ``NBATTN_QUIET=1`` (``config.QUIET``, read when the notice would
print), or for the rest of the process with :func:`silence` (the command line's
``--quiet``). The estimators' ``verbose=0`` does not silence it: that is their
default, and the notice is for people who never asked for progress.
"""

from __future__ import annotations

import sys
import threading

from .. import config

__all__ = ["NOTICE", "install", "notice_printed", "silence"]

NOTICE = "nbattn: compiling kernels for first use; cached afterwards"
#: The line when the on-disk cache is off (``NBATTN_CACHE=0``, or an ``NBATTN_*`` override of
#: a compiled tunable): every process compiles again.
NOTICE_UNCACHED = (
    "nbattn: compiling kernels for first use (the on-disk cache is off: every process compiles)"
)

_state = {"installed": False, "printed": False, "silenced": False}
_lock = threading.Lock()


def silence() -> None:
    """No notice from now on in this process."""
    _state["silenced"] = True


def notice_printed() -> bool:
    """Whether this process has printed the notice."""
    return _state["printed"]


def _is_nbattn(dispatcher) -> bool:
    module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
    return module == "nbattn" or module.startswith("nbattn.")


def _on_compile(event) -> None:
    if _state["printed"] or _state["silenced"]:
        return
    if config.QUIET or not _is_nbattn(event.data.get("dispatcher")):
        return
    with _lock:
        if _state["printed"]:
            return
        _state["printed"] = True
    stream = sys.stderr
    if stream is None:  # pythonw: nowhere to print
        return
    try:
        print(NOTICE if config.CACHE else NOTICE_UNCACHED, file=stream, flush=True)
    except (OSError, ValueError):  # a closed or broken stderr never fails a computation
        pass


def install() -> None:
    """Register the listener with numba (once per process; the kernel packages call it
    when they are imported)."""
    if _state["installed"]:
        return
    with _lock:
        if _state["installed"]:
            return
        from numba.core import event

        class _Listener(event.Listener):
            def on_start(self, ev):
                _on_compile(ev)

            def on_end(self, ev):
                pass

        event.register("numba:compile", _Listener())
        _state["installed"] = True
