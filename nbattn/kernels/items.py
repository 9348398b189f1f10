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

:func:`run_items` calls such a kernel on ``numba.get_num_threads()`` threads of a
pool of Python threads at once (they run concurrently while the kernel holds no
GIL), so ``NUMBA_NUM_THREADS``, ``numba.set_num_threads`` and
``nbattn._core.threads.serial_below`` apply as to a ``prange`` (one thread: the
kernel runs on the calling thread). Items are handed out one at a time as each
thread finishes one (as under ``numba.parallel_chunksize(1)``), so a thread that
the OS holds back delays only its current item. Each item writes only its own
outputs, so the result does not depend on which thread ran which item: bit for
bit the same on every run and every thread count.

The calling thread waits for the pool rather than taking items itself, so that
it stays interruptible: on Ctrl-C (or when a worker raises) the counter is set
past every item, each worker finishes the item it holds, and the exception is
raised once no worker writes any more, within one item's time rather than after
the whole loop (a second Ctrl-C meanwhile does not cut that wait short). Several
Python threads may call :func:`run_items` at once (their items queue on the one
pool), and a process forked from one that used the pool starts a pool of its own.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import numba
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import config

__all__ = ["next_item", "run_items", "sum_in_order"]

#: A counter past every item: the call that only compiles (or loads) the kernel, and the
#: value that stops the workers of an interrupted call.
_DONE = np.int64(2**62)
#: The pool and its size, ``[(executor, n_workers)]`` once made.
_POOL: list = []
_POOL_LOCK = threading.Lock()


def _forget_pool():
    """In a forked child: the parent's pool threads do not exist here, so its executor
    would queue work that no thread runs; forget it (and a lock another thread may
    have held at the fork)."""
    global _POOL_LOCK
    _POOL.clear()
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


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


def _submit(kernel, n_workers, counter, args, futures):
    """``kernel(counter, *args)`` submitted ``n_workers`` times to a pool of at least that
    many threads, appended to ``futures``. Under the lock, so that no other thread
    replaces the pool between its lookup and the submissions."""
    with _POOL_LOCK:
        if not _POOL or _POOL[0][1] < n_workers:
            if _POOL:
                _POOL.pop()[0].shutdown(wait=False)  # its queued work still runs
            _POOL.append(
                (ThreadPoolExecutor(n_workers, thread_name_prefix="nbattn-items"), n_workers)
            )
        pool = _POOL[0][0]
        for _ in range(n_workers):
            futures.append(pool.submit(kernel, counter, *args))


def run_items(kernel, *args):
    """``kernel(counter, *args)`` on ``numba.get_num_threads()`` threads sharing one
    counter (see the module docstring); ``kernel`` must be jitted ``nogil=True``.

    On more than one thread the kernel is first called once on this thread with
    the counter past every item, so that it compiles (or loads from the cache)
    here, and a compile error is raised here, before any thread starts. The first
    exception of a worker is raised here after the others stop (each finishes
    the item it holds), as is a KeyboardInterrupt that arrives while waiting.
    """
    counter = np.zeros(1, dtype=np.int64)
    n_threads = numba.get_num_threads()
    if n_threads == 1:
        kernel(counter, *args)
        return
    kernel(np.full(1, _DONE), *args)
    futures: list = []
    try:
        _submit(kernel, n_threads, counter, args, futures)
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f.exception() for f in futures if f.done() and f.exception() is not None]
        if failed:
            raise failed[0]
    except BaseException:
        # no item is handed out any more (the workers' next fetch-and-add returns a
        # value past every item); wait for the ones in hand, so that nothing writes
        # to the outputs after this call has left
        counter[0] = _DONE
        for future in futures:
            future.cancel()
        while True:
            try:
                wait(futures)
                break
            except KeyboardInterrupt:  # a second Ctrl-C: the workers stop within an item
                continue
        raise


@njit(cache=config.CACHE)
def sum_in_order(partial):
    """The sum of the 1-D ``partial`` from first to last: the items' partial sums added in
    item order, so the total does not depend on the threads. (Inside a ``parallel=True``
    kernel numba would make ``partial.sum()`` a parallel reduction, whose order depends on
    the thread count.)"""
    total = 0.0
    for value in partial:
        total += value
    return total
