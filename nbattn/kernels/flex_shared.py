"""The compiled-once parts of the flex kernels (``nbattn.kernels.flex``, compiled anew per
user function): their work items on Python threads, the backward's row terms and dQ sum,
and :func:`tanh`, the vectorisable tanh for the user's ``score_mod``.

A ``prange`` loop costs its kernel a parallel region to compile (numba's
parfor passes and a gufunc of its own, whose LLVM module holds the whole loop
body once more): for the flex kernels (``nbattn.kernels.flex``), compiled
anew for each user function, that was a third of the compile of a new
``score_mod``. Those kernels are serial instead, compiled ``nogil``, and take
their items from a shared counter::

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
back delays only its current item.

:func:`backward_rows` (``flash_backward``'s own first pass, from
:mod:`nbattn.kernels.flash`) and :func:`sum_groups` are the backward's passes before and
after its items, parallel kernels compiled once for every user function.
"""

from __future__ import annotations

import cmath
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .. import config
from .._core.numeric import LOG2E
from .fastmath import like
from .flash import backward_rows, exp2  # backward_rows: flash's, shared

__all__ = ["backward_rows", "next_item", "run_items", "sum_groups", "tanh"]

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

    The kernel is first called once on this thread with the counter past every
    item, so that it compiles (or loads from the cache) here, and a compile
    error is raised here, before any thread starts.
    """
    kernel(np.full(1, _DONE), *args)
    counter = np.zeros(1, dtype=np.int64)
    n_threads = numba.get_num_threads()
    if n_threads == 1:
        kernel(counter, *args)
        return
    pool = _pool(n_threads - 1)
    futures = [pool.submit(kernel, counter, *args) for _ in range(n_threads - 1)]
    kernel(counter, *args)
    for future in futures:
        future.result()


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def sum_groups(part, scale):
    """``scale * part.sum(axis=0)`` for ``part`` (G, BH, L, E), the per-group dQ buffers
    of a backward pass, in ``part``'s dtype and group order (compiled once, as
    :func:`backward_rows`)."""
    n_groups, n_bh, n_q, d = part.shape
    factor = like(scale, part)
    dq = np.empty((n_bh, n_q, d), dtype=part.dtype)
    for row in prange(n_bh * n_q):
        bh = row // n_q
        i = row % n_q
        for c in range(d):
            total = part[0, bh, i, c]
            for g in range(1, n_groups):
                total += part[g, bh, i, c]
            dq[bh, i, c] = total * factor
    return dq


def tanh(x):
    """``tanh(x)`` for a ``score_mod``: inside the compiled kernel an inlined form that
    vectorises with the score loop (numba's ``np.tanh`` of a float is a call to the
    C library, one element at a time).

    For a real ``x`` (float32 or float64) it is the ``softcap=`` path's
    tanh (``nbattn.kernels.flash``): sign(x) (1 - e) / (1 + e) with
    e = 2**(-2 ``|x|`` log2(e)), within a few units in the last place of 1 of the
    true value (an absolute error: relative accuracy is lost for ``|x|`` far below 1,
    where tanh(x) ~ x). For a complex ``x`` it is ``cmath.tanh``, exact, so the
    complex-step derivative of the backward (``nbattn.kernels.flex``) works
    through it. Called from Python it is ``np.tanh`` (arrays too, as the
    reference implementations call a ``score_mod``).
    """
    return np.tanh(x)


_TWO_LOG2E = 2.0 * LOG2E


def _tanh64(x):
    e = exp2(-abs(x) * _TWO_LOG2E)
    th = (1.0 - e) / (1.0 + e)
    return -th if x < 0 else th


_TWO_LOG2E32 = np.float32(_TWO_LOG2E)
_ONE32 = np.float32(1.0)


def _tanh32(x):
    e = exp2(-abs(x) * _TWO_LOG2E32)
    th = (_ONE32 - e) / (_ONE32 + e)
    return -th if x < 0 else th


def _tanh_complex(x):
    return cmath.tanh(x)


# error_model="numpy": (1 - e) / (1 + e) without the division-by-zero check, whose
# branch (never taken: 1 + e >= 1) would keep the score loop from vectorising.
@overload(tanh, jit_options={"fastmath": config.FASTMATH, "error_model": "numpy"})
def _tanh_overload(x):
    if isinstance(x, types.Complex):
        return _tanh_complex
    if isinstance(x, types.Float):
        return _tanh32 if x.bitwidth == 32 else _tanh64
    return None
