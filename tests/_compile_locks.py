"""One compile of a numba kernel at a time across the test processes.

scripts/test runs the suites on every core (pytest-xdist), the workers sharing
numba's on-disk cache. A kernel that is not in the cache yet is compiled by
whichever worker needs it first; without a lock, a second worker that needs it
before the first has written it compiles it again (20-40 s of CPU for the larger
kernels). Here each process takes an exclusive file lock named after the kernel
before it compiles it, so the second one waits, then finds the kernel in the
cache (numba looks there first) and loads it: no CPU spent twice, which a loaded
machine feels (on an idle one the waiting core idles instead).

Only outermost compiles take a lock (a process holds at most one, so no two
processes can wait on each other); a callee compiled inside one is not locked.
Dispatchers without an on-disk cache are left alone. The lock files live in the
system's temporary folder, one folder per checkout; an exclusive ``flock`` is
released by the system when its process ends, however it ends.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from pathlib import Path

_held = threading.local()


def install(root: Path) -> None:
    """Wrap numba's ``Dispatcher.compile`` with a per-kernel file lock (once per process;
    nothing where there is no ``fcntl``, as on Windows)."""
    try:
        import fcntl
    except ImportError:
        return
    from numba.core import dispatcher
    from numba.core.caching import NullCache

    if getattr(dispatcher.Dispatcher.compile, "_nbattn_locked", False):
        return
    checkout = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"nbattn-compile-locks-{checkout}"
    folder.mkdir(parents=True, exist_ok=True)
    original = dispatcher.Dispatcher.compile

    def compile(self, sig):
        cache = getattr(self, "_cache", None)
        if getattr(_held, "depth", 0) or cache is None or isinstance(cache, NullCache):
            return original(self, sig)
        func = self.py_func
        name = hashlib.sha1(f"{func.__module__}.{func.__qualname__}".encode()).hexdigest()
        with open(folder / name, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            _held.depth = 1
            try:
                return original(self, sig)
            finally:
                _held.depth = 0
                fcntl.flock(handle, fcntl.LOCK_UN)

    compile._nbattn_locked = True
    dispatcher.Dispatcher.compile = compile
