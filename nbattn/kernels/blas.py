"""GEMM with an accumulating ``beta`` for the tile kernels: ``C <- op(A) op(B) + beta C``.

numba's ``np.dot(a, b, out)`` always overwrites ``out`` (beta = 0), so a
kernel that accumulates a product (the flash kernels' ``acc += P V``,
``dQ += dS K``) needs a scratch tile and an addition pass over it. ``gemm``
calls a BLAS ``?gemm`` with beta and the transposes given by the caller, so
the product lands in ``C`` directly.

Which BLAS. ``np.dot`` in numba reaches the ``?gemm`` of
``scipy.linalg.cython_blas`` through numba's ``numba_xxgemm`` helper. Here
only the products ``A B^T`` (``trans_b``: the flash score tiles Q K^T and
dO V^T) take that road; ``A B`` and ``A^T B`` go to the OpenBLAS that
NumPy's wheels carry (``scipy_?gemm_64_``, the 64-bit-integer build), found
through NumPy's own extension module when it is there. Measured on the
development machine (OpenBLAS 0.3.30 in SciPy's wheel, 0.3.31 in NumPy's,
SkylakeX kernels; one thread, CPU time, 256 x 256 tiles, 64 features):
``A^T B`` (the flash backward's dV += P^T dO, dK += dS^T Q) 84 GFLOP/s
through SciPy's library against 95-97 through NumPy's, ``A B`` (acc += P V,
dQ += dS K) 96.6 against 99.3, ``A B^T`` 93 against 90
(``scripts/bench_attention.py --profile`` shows the stages). Without such a
library the symbols point at a compiled shim onto ``numba_xxgemm``, so the
kernels are the same either way and cache on disk (they name the symbols,
never an address). Both libraries are held to one thread by
``nbattn._core.threads.blas_one_thread`` like every BLAS in the process.

Arrays are row-major with unit stride along their last axis (C-contiguous
tiles or row ranges of larger arrays; the leading dimension is the row
stride). A row-major m x n matrix is the column-major n x m matrix of the
same memory, so ``C = op(A) op(B)`` is handed to the column-major BLAS as
``C^T = op(B)^T op(A)^T``.
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
from numba import cfunc, njit, types
from numba.extending import overload

from .. import config


def _xxgemm(dtype):
    """numba's BLAS entry (numba/_lapack.c), exported by its helper library and resolved
    by name, so kernels that call it can be cached on disk."""
    ptr = types.CPointer(dtype)
    return types.ExternalFunction(
        "numba_xxgemm",
        types.intc(
            types.char,  # kind: 's' or 'd'
            types.char,  # transa
            types.char,  # transb
            types.intp,  # m
            types.intp,  # n
            types.intp,  # k
            ptr,  # alpha
            ptr,  # a
            types.intp,  # lda
            ptr,  # b
            types.intp,  # ldb
            ptr,  # beta
            ptr,  # c
            types.intp,  # ldc
        ),
    )


def _ilp64_signature(dtype):
    """The Fortran ``?gemm`` of a 64-bit-integer BLAS: every argument by pointer."""
    ptr, chars, ints = (
        types.CPointer(dtype),
        types.CPointer(types.uint8),
        types.CPointer(types.int64),
    )
    return types.void(chars, chars, ints, ints, ints, ptr, ptr, ints, ptr, ints, ptr, ptr, ints)


_XXGEMM = {32: _xxgemm(types.float32), 64: _xxgemm(types.float64)}
_SIGNATURES = {32: _ilp64_signature(types.float32), 64: _ilp64_signature(types.float64)}
#: The symbols the kernels call for ``A B`` and ``A^T B``; bound at import (see the module
#: docstring).
_ILP64_SYMBOLS = {32: "nbattn_sgemm64", 64: "nbattn_dgemm64"}
_ILP64 = {
    bits: types.ExternalFunction(name, _SIGNATURES[bits]) for bits, name in _ILP64_SYMBOLS.items()
}
_N = ord("N")
_T = ord("T")


def _shim(bits, kind):
    """A compiled function with the 64-bit-integer ``?gemm`` ABI that calls ``numba_xxgemm``."""
    xxgemm = _XXGEMM[bits]

    def shim(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        xxgemm(
            kind,
            np.int8(transa[0]),
            np.int8(transb[0]),
            m[0],
            n[0],
            k[0],
            alpha,
            a,
            lda[0],
            b,
            ldb[0],
            beta,
            c,
            ldc[0],
        )

    return cfunc(_SIGNATURES[bits], cache=config.CACHE)(shim)


def _numpy_openblas():
    """Addresses of ``scipy_sgemm_64_`` and ``scipy_dgemm_64_`` of NumPy's bundled OpenBLAS,
    or None (another NumPy build: MKL, Accelerate, a system BLAS)."""
    try:
        from numpy._core import _multiarray_umath as extension
    except ImportError:  # NumPy 1.x
        try:
            from numpy.core import _multiarray_umath as extension
        except ImportError:
            return None
    try:
        library = ctypes.CDLL(extension.__file__)
        functions = library.scipy_sgemm_64_, library.scipy_dgemm_64_
    except (OSError, AttributeError):
        return None
    return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in functions)


def _bind_symbols():
    # numba_xxgemm finds ?gemm in scipy.linalg.cython_blas; np.dot's typing
    # imports it, kernels that only call gemm need it imported here.
    import scipy.linalg.cython_blas  # noqa: F401

    found = _numpy_openblas() if config.GEMM_ON_NUMPY_BLAS else None
    for i, (bits, kind) in enumerate(((32, ord("s")), (64, ord("d")))):
        address = found[i] if found else _shim(bits, kind).address
        llvm.add_symbol(_ILP64_SYMBOLS[bits], address)
    return found is not None


#: Whether ``A B`` and ``A^T B`` products run on NumPy's bundled OpenBLAS (else numba's BLAS).
ON_NUMPY_BLAS = _bind_symbols()


def _gemm(a, b, c, trans_a, trans_b, beta):
    """:func:`gemm`'s body, an overload per dtype (an overload is compiled anew in each
    process that compiles a caller: :func:`gemm` wraps it to be cached on disk)."""
    raise NotImplementedError("_gemm runs inside numba kernels only")


def _gemm_impl(bits, kind):
    xxgemm = _XXGEMM[bits]
    ilp64 = _ILP64[bits]

    def impl(a, b, c, trans_a, trans_b, beta):
        m, n = c.shape
        k = a.shape[0] if trans_a else a.shape[1]
        item = c.itemsize
        scalars = np.empty(2, dtype=c.dtype)
        scalars[0] = 1.0
        scalars[1] = beta
        # column-major: C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m)
        flag_a = _N + (_T - _N) * trans_a
        flag_b = _N + (_T - _N) * trans_b
        if not trans_b:
            words = np.empty(8, dtype=np.int64)
            words[0] = n
            words[1] = m
            words[2] = k
            words[3] = b.strides[0] // item
            words[4] = a.strides[0] // item
            words[5] = c.strides[0] // item
            flags = np.empty(2, dtype=np.uint8)
            flags[0] = flag_b
            flags[1] = flag_a
            ilp64(
                flags[0:].ctypes,
                flags[1:].ctypes,
                words[0:].ctypes,
                words[1:].ctypes,
                words[2:].ctypes,
                scalars[0:].ctypes,
                b.ctypes,
                words[3:].ctypes,
                a.ctypes,
                words[4:].ctypes,
                scalars[1:].ctypes,
                c.ctypes,
                words[5:].ctypes,
            )
            return
        xxgemm(
            kind,
            flag_b,
            flag_a,
            n,
            m,
            k,
            scalars[0:].ctypes,
            b.ctypes,
            b.strides[0] // item,
            a.ctypes,
            a.strides[0] // item,
            scalars[1:].ctypes,
            c.ctypes,
            c.strides[0] // item,
        )

    return impl


_IMPLS = {32: _gemm_impl(32, ord("s")), 64: _gemm_impl(64, ord("d"))}


@overload(_gemm, jit_options={"fastmath": config.FASTMATH})
def _gemm_overload(a, b, c, trans_a, trans_b, beta):
    if not all(isinstance(x, types.Array) and x.ndim == 2 for x in (a, b, c)):
        return None
    if not (isinstance(c.dtype, types.Float) and a.dtype == b.dtype == c.dtype):
        return None
    return _IMPLS[c.dtype.bitwidth]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def gemm(a, b, c, trans_a, trans_b, beta):
    """``c <- op(a) op(b) + beta c`` in place, op(x) = x.T when ``trans_x`` else x.

    a, b, c are 2-D float32 or float64 arrays of one dtype whose rows are
    contiguous (unit stride along the last axis); c is (m, n), op(a) (m, k),
    op(b) (k, n). With ``beta = 0`` c need not be initialised. The caller
    checks the shapes (kernels trust their callers). A compiled function of its own,
    cached on disk, so that the kernels that call it (flash, each flex module) link it
    instead of compiling the BLAS call again.
    """
    _gemm(a, b, c, trans_a, trans_b, beta)
