"""GEMM with an accumulating ``beta`` for the tile kernels: ``C <- op(A) op(B) + beta C``.

numba's ``np.dot(a, b, out)`` always overwrites ``out`` (beta = 0), so a
kernel that accumulates a product (the flash kernels' ``acc += P V``,
``dQ += dS K``) needs a scratch tile and an addition pass over it. ``gemm``
calls the same BLAS as ``np.dot`` -- numba's ``numba_xxgemm`` helper, which
reaches the ``?gemm`` of ``scipy.linalg.cython_blas`` -- with beta and the
transposes given by the caller, so the product lands in ``C`` directly.

Arrays are row-major with unit stride along their last axis (C-contiguous
tiles or row ranges of larger arrays; the leading dimension is the row
stride). A row-major m x n matrix is the column-major n x m matrix of the
same memory, so ``C = op(A) op(B)`` is handed to the column-major BLAS as
``C^T = op(B)^T op(A)^T``. Results are identical to ``np.dot`` (the same
library, the same call).
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from .. import config

# numba's own BLAS entry (numba/_lapack.c), exported by its helper library and
# resolved by name, so kernels that call it can be cached on disk.
_XXGEMM = types.ExternalFunction(
    "numba_xxgemm",
    types.intc(
        types.char,  # kind: 's' or 'd'
        types.char,  # transa
        types.char,  # transb
        types.intp,  # m
        types.intp,  # n
        types.intp,  # k
        types.voidptr,  # alpha
        types.voidptr,  # a
        types.intp,  # lda
        types.voidptr,  # b
        types.intp,  # ldb
        types.voidptr,  # beta
        types.voidptr,  # c
        types.intp,  # ldc
    ),
)

_N = ord("N")
_T = ord("T")


def _ensure_blas():
    # numba_xxgemm finds ?gemm in scipy.linalg.cython_blas; np.dot's typing
    # imports it, a kernel that only calls gemm must do so itself.
    import scipy.linalg.cython_blas  # noqa: F401


_ensure_blas()


def gemm(a, b, c, trans_a, trans_b, beta):
    """``c <- op(a) op(b) + beta c`` in place, op(x) = x.T when ``trans_x`` else x.

    a, b, c are 2-D float32 or float64 arrays of one dtype whose rows are
    contiguous (unit stride along the last axis); c is (m, n), op(a) (m, k),
    op(b) (k, n). With ``beta = 0`` c need not be initialised. The caller
    checks the shapes (kernels trust their callers).
    """
    raise NotImplementedError("gemm runs inside numba kernels only")


def _gemm_impl(kind):
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
        _XXGEMM(
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


_IMPLS = {32: _gemm_impl(ord("s")), 64: _gemm_impl(ord("d"))}


@overload(gemm, jit_options={"fastmath": config.FASTMATH})
def _gemm_overload(a, b, c, trans_a, trans_b, beta):
    if not all(isinstance(x, types.Array) and x.ndim == 2 for x in (a, b, c)):
        return None
    if not (isinstance(c.dtype, types.Float) and a.dtype == b.dtype == c.dtype):
        return None
    return _IMPLS[c.dtype.bitwidth]
