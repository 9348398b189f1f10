"""What every CUDA kernel module shares: the decorator, device views, the kernel cache, launches.

* :func:`jit`: the one decorator of every CUDA kernel and device function
  (numba's ``cuda.jit`` with ``cache=config.CUDA_CACHE``, on by default);
* :func:`to_device`: the one way host or GPU arrays become numba device arrays;
* :func:`compiled`: the one cache of kernels built per compile-time sizes;
* :func:`launch`, :func:`threads_for`, :func:`tile_rows`, :func:`shared_bytes`:
  the one launch geometry (one thread per row, tiles in shared memory);
* ``imin``/``imax``, ``load_columns`` and :func:`exp_for`: small device functions;
  ``SHARED_ALIGNMENT_KWARG``: how a kernel declares a 16-byte aligned tile.

``imin``/``imax`` replace the builtins ``min``/``max`` inside kernels: numba's
generic overload of the builtins (``numba.cpython.builtins.ol_min``, a
``*args`` function) fails to compile as a CUDA device function with numba's
bundled ``numba.cuda`` ("Signature mismatch: 2 argument types given, but
function takes 1 arguments", seen with ``cuda.compile_ptx``), and the
simulator does not notice.

Sizes come from ``nbattn.config`` and are read at each call (threads per
block, shared-memory budget), so a test or a user may change them between
calls; a kernel compiled for given sizes stays in the cache.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .. import config


def jit(func_or_sig=None, **options):
    """numba's ``cuda.jit`` with ``cache=config.CUDA_CACHE``: the decorator of every kernel
    and device function in ``nbattn.cuda``, used as ``@jit`` or ``@jit(device=True, ...)``.

    ``config.CUDA_CACHE`` is on unless ``NBATTN_CACHE=0`` or a compiled tunable, the
    CUDA launch ones included, is overridden or patched (see ``config``; the CPU
    kernels' ``config.CACHE`` ignores the CUDA launch tunables, which they never read).

    Kernels go to numba's on-disk cache (``NUMBA_CACHE_DIR``, else the
    ``__pycache__`` beside the module or the user's cache folder), so a new
    process loads them instead of compiling them again (the first run on an
    H200 spent about two minutes compiling the kernel-twin checks alone).
    Kernels built per compile-time sizes are closures: numba keys each cache
    entry on the function's bytecode and a hash of its closure's values
    (sizes, dtypes, the device functions it calls, pickled by value), so one
    source file holds every specialisation. Device functions accept
    ``cache=True`` and are compiled into (and cached with) the kernels that
    call them. The CUDA simulator accepts and ignores it.

    What numba's cache does not see, as for CPU kernels: module globals that
    a kernel reads (frozen at compile time, so tunables reach kernels as
    closure values or arguments, never as globals) and edits of another
    module holding a device function that a kernel calls (after changing
    ``common.py``, ``far.py`` or ``dropout.py`` in a checkout, clear the cache).
    """
    options.setdefault("cache", config.CUDA_CACHE)
    if func_or_sig is None:
        return cuda.jit(**options)
    return cuda.jit(func_or_sig, **options)


#: Most (batch, head) slices per launch: the grid's y dimension is capped at
#: 65,535 by the hardware (a limit, not a tunable).
MAX_GRID_Y = 65535


@jit(device=True)
def imin(a, b):
    """The smaller of two numbers."""
    return a if a < b else b


@jit(device=True)
def imax(a, b):
    """The larger of two numbers."""
    return a if a > b else b


@jit(device=True, inline=True)
def load_columns(tile, block_k, j0, nb, first, n_first, second, n_second):
    """Columns j0:j0 + nb of two feature-major arrays into one tile of ``block_k`` columns.

    tile[f * block_k + jj] = first[f, j0 + jj] for f < n_first, then
    tile[(n_first + f) * block_k + jj] = second[f, j0 + jj] for f < n_second
    (keys and values, or keys and points; ``n_second = 0`` loads one array).
    All threads of the block load together, consecutive threads on consecutive
    columns (coalesced); the caller synchronises. Constant row counts (a
    kernel's compile-time sizes) unroll the copy.
    """
    for jj in range(cuda.threadIdx.x, nb, cuda.blockDim.x):
        for f in range(n_first):
            tile[f * block_k + jj] = first[f, j0 + jj]
        for f in range(n_second):
            tile[(n_first + f) * block_k + jj] = second[f, j0 + jj]


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
    from numba import config as numba_config

    if np.dtype(float_type) == np.float32 and not numba_config.ENABLE_CUDASIM:
        from numba.cuda import libdevice

        return libdevice.fast_expf
    return math.exp


def _shared_arrays_take_alignment():
    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:  # the simulator refuses alignment=
        return False
    import inspect

    from numba.cuda import stubs

    return "alignment" in inspect.signature(stubs.shared.array).parameters


#: Whether ``cuda.shared.array`` takes ``alignment=`` (numba-cuda does). The
#: flash kernels need their tiles' base 16-byte aligned: then, with rows a
#: multiple of 16 bytes, NVVM reads four consecutive floats with one
#: ``ld.shared.v4`` -- a quarter of the shared-memory load instructions, which
#: bound those one-thread-per-row kernels (checked in the PTX by the compile
#: test). Each kernel declares its tile as
#:
#:     if SHARED_ALIGNMENT_KWARG:
#:         tile = cuda.shared.array(0, dtype=float_type, alignment=16)
#:     else:
#:         tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
#:
#: numba prunes the branch not taken (a compile-time constant), so neither
#: numba needs the other's spelling: numba's older bundled ``numba.cuda`` has
#: no ``alignment=`` but aligns complex128 arrays to 16 bytes, while numba-cuda
#: aligns them to 8 (seen in the PTX: ``.align 8``, and ``ld.shared.v2`` only).
#: A device function cannot return the array instead: the bundled numba
#: refuses to return an array that was not passed in.
SHARED_ALIGNMENT_KWARG = _shared_arrays_take_alignment()


def to_device(array):
    """A numba device view of ``array``: host arrays are copied (C-contiguous),
    GPU arrays (``__cuda_array_interface__``: numba, CuPy, torch) are used in
    place, numba device arrays (and the simulator's) are returned as they are."""
    if isinstance(array, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(array))
    if hasattr(array, "__cuda_array_interface__"):
        return cuda.as_cuda_array(array)
    return array  # the simulator's device arrays


_KERNELS = {}


def compiled(key, make):
    """The kernel (or tuple of kernels) cached under ``key``, built by ``make()`` once.

    ``key`` names the kernel family and every compile-time size, e.g.
    ``("pool", np.float32, d, n_outputs)``. One cache for all CUDA modules.
    """
    if key not in _KERNELS:
        _KERNELS[key] = make()
    return _KERNELS[key]


def multiprocessors():
    """Streaming multiprocessors of the current GPU (1 under the simulator)."""
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:  # the simulator has no such attribute
        return 1


def threads_for(n_rows, n_slices=1):
    """Threads per block: ``config.CUDA_THREADS_PER_BLOCK``, halved (down to 32)
    while the grid would give fewer than two blocks per multiprocessor (short
    sequences, few queries)."""
    tpb = config.CUDA_THREADS_PER_BLOCK
    target = 2 * multiprocessors()
    while tpb > 32 and -(-n_rows // tpb) * n_slices < target:
        tpb //= 2
    return tpb


def tile_rows(floats_per_row, itemsize):
    """Rows per shared-memory tile: at most ``config.CUDA_THREADS_PER_BLOCK`` and
    at most ``config.CUDA_SHARED_MEMORY_BYTES`` of tile."""
    tpb = config.CUDA_THREADS_PER_BLOCK
    fit = config.CUDA_SHARED_MEMORY_BYTES // max(1, floats_per_row * itemsize)
    return max(1, min(tpb, fit))


def shared_bytes(n_floats, itemsize):
    """Dynamic shared memory for a tile of ``n_floats``, in whole 16-byte units
    (see ``SHARED_ALIGNMENT_KWARG``)."""
    return -(-n_floats * itemsize // 16) * 16


def launch(kernel, n_rows, args, *, shared=0, n_slices=None, max_blocks=None, threads=None):
    """Run ``kernel`` with one thread per row (``threads_for`` threads per block, or
    ``threads``: a kernel whose blocks read per-block tables built for that size).

    Without ``n_slices``: a 1-D grid of ``ceil(n_rows / threads)`` blocks (at
    most ``max_blocks``: kernels that loop with a grid stride) and ``args`` a
    tuple. With ``n_slices``: a (row blocks, slices) grid, in launches of at
    most ``MAX_GRID_Y`` slices, and ``args(b0, b1)`` gives the arguments for
    the slices b0:b1. ``shared``: dynamic shared memory per block, in bytes.
    """
    tpb = threads_for(n_rows, n_slices or 1) if threads is None else int(threads)
    blocks = max(1, -(-n_rows // tpb))
    if n_slices is None:
        if max_blocks is not None:
            blocks = min(blocks, max_blocks)
        kernel[blocks, tpb, 0, shared](*args)
        return
    for b0 in range(0, n_slices, MAX_GRID_Y):
        b1 = min(n_slices, b0 + MAX_GRID_Y)
        kernel[(blocks, b1 - b0), tpb, 0, shared](*args(b0, b1))
