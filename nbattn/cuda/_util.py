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
