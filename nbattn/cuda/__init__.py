"""CUDA twins of nbattn.kernels: the same contracts, as @cuda.jit kernels.

Importing this package needs numba only; launching a kernel needs a CUDA GPU
(numba-cuda, the ``[cuda]`` extra) or the simulator (``NUMBA_ENABLE_CUDASIM=1``
set before numba is imported).
"""
