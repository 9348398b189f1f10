"""Thread limits around kernel calls: numba's pool for small work, BLAS inside kernels."""

from __future__ import annotations

import contextlib

_controller = None


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


def blas_one_thread():
    """A context manager holding every BLAS library to one thread.

    Kernels that call BLAS on tiles from their own parallel loop (the flash
    kernels) would otherwise oversubscribe the cores.
    """
    global _controller
    if _controller is None:
        # numba's np.dot calls the BLAS behind scipy.linalg.cython_blas; load it
        # first, or the controller would not see it and could not limit it.
        import scipy.linalg.cython_blas  # noqa: F401
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
