"""Work items on Python threads: the parallel loop of the kernels compiled without ``prange``.

A ``prange`` loop costs its kernel a parallel region to compile: numba's
parfor passes, and a gufunc of its own whose LLVM module links and optimises
the whole loop body once more (numba links each callee's optimised module
into its caller's and runs the full optimisation pipeline again on the
result, so every level of compiled calls above the body pays for the body
again). For the flash kernels that was more than a third of their first
compile, for the local-polynomial pass almost half. Those kernels are
serial instead, compiled ``nogil``, with the loop body written in the kernel
itself, and take their items from a shared counter::

    while True:
        item = next_item(counter)       # atomic fetch-and-add
        if item >= n_items:
            return
        ...                             # the item's work

:func:`run_items` calls such a kernel on ``numba.get_num_threads()`` threads
at once (the calling thread and a pool of Python threads, which run
concurrently while the kernel holds no GIL), so ``NUMBA_NUM_THREADS``,
``numba.set_num_threads`` and ``nbattn._core.threads.serial_below`` apply as
to a ``prange``. Items are handed out one at a time as each thread finishes
one (as under ``numba.parallel_chunksize(1)``), so a thread that the OS holds
back delays only its current item. Each item writes only its own outputs, so
the result does not depend on which thread ran which item: bit for bit the
same on every run and every thread count.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["next_item", "run_items"]

#: A counter past every item: the call that only compiles (or loads) the kernel.
_DONE = np.int64(2**62)
_POOL: list = []
_POOL_LOCK = threading.Lock()


@intrinsic
def next_item(typingctx, counter):
    """``counter[0]``, incremented by one atomically (an int64 array of one entry)."""
    if not (
        isinstance(counter, types.Array) and counter.dtype == types.int64 and counter.ndim == 1
    ):
        return None

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        pointer = cgutils.get_item_pointer(context, builder, signature.args[0], array, [zero])
        one = context.get_constant(types.int64, 1)
        return builder.atomic_rmw("add", pointer, one, "monotonic")

    return types.int64(counter), codegen


def _pool(n_workers):
    with _POOL_LOCK:
        if not _POOL or _POOL[0]._max_workers < n_workers:
            if _POOL:
                _POOL.pop().shutdown(wait=False)
            _POOL.append(ThreadPoolExecutor(n_workers, thread_name_prefix="nbattn-items"))
        return _POOL[0]


def run_items(kernel, *args):
    """``kernel(counter, *args)`` on ``numba.get_num_threads()`` threads sharing one
    counter (see the module docstring); ``kernel`` must be jitted ``nogil=True``.

    On more than one thread the kernel is first called once on this thread with
    the counter past every item, so that it compiles (or loads from the cache)
    here, and a compile error is raised here, before any thread starts.
    """
    counter = np.zeros(1, dtype=np.int64)
    n_threads = numba.get_num_threads()
    if n_threads == 1:
        kernel(counter, *args)
        return
    kernel(np.full(1, _DONE), *args)
    pool = _pool(n_threads - 1)
    futures = [pool.submit(kernel, counter, *args) for _ in range(n_threads - 1)]
    kernel(counter, *args)
    for future in futures:
        future.result()
