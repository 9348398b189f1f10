"""Small device functions shared by the CUDA kernels.

``imin``/``imax`` replace the builtins ``min``/``max`` inside kernels: numba's
generic overload of the builtins (``numba.cpython.builtins.ol_min``, a
``*args`` function) fails to compile as a CUDA device function with numba's
bundled ``numba.cuda`` ("Signature mismatch: 2 argument types given, but
function takes 1 arguments", seen with ``cuda.compile_ptx``), and the
simulator does not notice.
"""

from numba import cuda


@cuda.jit(device=True)
def imin(a, b):
    """The smaller of two numbers."""
    return a if a < b else b


@cuda.jit(device=True)
def imax(a, b):
    """The larger of two numbers."""
    return a if a > b else b


def exp_for(float_type):
    """The exp that kernels of ``float_type`` use for their weights.

    The kernels compile without ``fastmath``: numba's CUDA ``fastmath=True``
    is all or nothing and sets LLVM's full ``fast`` flags, whose
    ``ninf``/``nnan`` make every -inf sentinel of these kernels (running
    maxima, ``lse = -inf`` rows, exp(-inf) = 0) undefined behaviour -- the
    design's rule "fastmath without nnan/ninf" cannot be expressed for CUDA.
    (NVVM happened to keep the -inf tests when tried; nothing guarantees it.)
    The speed that matters is kept explicitly: float32 weights use
    libdevice's ``fast_expf`` (``ex2.approx``: a few ulp near 0, relative
    error ~1e-7 |x|, exp(-inf) = 0), float64 the accurate ``exp``. The
    simulator has no libdevice, so it uses ``math.exp``.
    """
    import math

    import numpy as np
    from numba import config as numba_config

    if np.dtype(float_type) == np.float32 and not numba_config.ENABLE_CUDASIM:
        from numba.cuda import libdevice

        return libdevice.fast_expf
    return math.exp
