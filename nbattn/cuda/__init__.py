"""CUDA twins of nbattn.kernels: the same contracts, as @cuda.jit kernels.

Importing this package needs numba only; launching a kernel needs a CUDA GPU
(numba-cuda, the ``[cuda]`` extra) or the simulator (``NUMBA_ENABLE_CUDASIM=1``
set before numba is imported). Importing it registers the one-line notice printed
when a kernel first compiles in a process (``nbattn._core.compiling``).
"""

from .._core import compiling

compiling.install()
