"""Thread limits around kernel calls: numba's pool for small work, BLAS inside kernels."""

from __future__ import annotations

import contextlib

_blas_libraries = None


@contextlib.contextmanager
def serial_below(work, threshold):
    """Run the kernels inside on one numba thread when ``work < threshold``.

    Waking numba's other threads costs more than it saves on small calls (a
    parallel launch and barrier are about 0.1-5 ms on a busy 2-core machine);
    the thresholds live in ``nbattn.config`` (``SERIAL_PAIRS``,
    ``FLASH_SERIAL_WORK``).
    """
    if work >= threshold:
        yield
        return
    import numba

    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(saved)


@contextlib.contextmanager
def dynamic_below(item_work, threshold):
    """Hand parallel-loop items to numba's threads one at a time when ``item_work >= threshold``.

    numba splits a ``prange`` into one equal share per thread by default; when
    the OS holds one thread back (a busy machine) the call waits for its share.
    With ``numba.parallel_chunksize(1)`` each thread takes the next item when it
    finishes one, which costs a scheduling step per item: worth it for items of
    ``item_work`` multiply-adds from ``threshold`` on (``FLASH_DYNAMIC_ITEM_WORK``
    in ``nbattn.config``). Applies to the loops started from this thread.
    """
    if item_work < threshold:
        yield
        return
    import numba

    with numba.parallel_chunksize(1):
        yield


@contextlib.contextmanager
def blas_one_thread():
    """Hold every BLAS library to one thread inside the block.

    Kernels that call BLAS on tiles from their own parallel loop (flash, the
    leave-one-out tiles) would otherwise oversubscribe the cores. The library
    controllers are found once and their thread counts set and restored
    directly: threadpoolctl's ``limit`` inspects the loaded libraries at every
    call (~10-17 ms), longer than a whole tile call at n = 1,000. Like
    threadpoolctl, this is process-global, not thread-safe.
    """
    if _blas_libraries is None:
        _find_blas_libraries()
    saved = [library.num_threads for library in _blas_libraries]
    for library in _blas_libraries:
        library.set_num_threads(1)
    try:
        yield
    finally:
        for library, threads in zip(_blas_libraries, saved):
            library.set_num_threads(threads)


def _find_blas_libraries():
    global _blas_libraries
    # numba's np.dot calls the BLAS behind scipy.linalg.cython_blas: load it first,
    # or the controller would not see it and could not limit it.
    import scipy.linalg.cython_blas  # noqa: F401
    from threadpoolctl import ThreadpoolController

    _blas_libraries = list(ThreadpoolController().select(user_api="blas").lib_controllers)
