"""The flash kernels' mask, made from the user's in one pass.

A mask reaches ``nbattn.kernels.flash`` as an additive base-2 array (the
scores are in units of log2(e)) in the computation's dtype, with a table of
the tiles it leaves open. Two kernels make both, reading each entry once:
:func:`bool_mask_base2` from a boolean mask (True = may attend: 0, else
-inf) and :func:`float_mask_base2` from a float one (``x * log2(e)``, the
product taken in the output's dtype: ``dtype(x) * dtype(log2(e))``), which
also reports what the caller must check: whether the mask holds NaN or +inf,
and its largest finite magnitude (masks beyond a few dozen are shifted per
row by the caller, which redoes them).

The table is that of :func:`mask_tile_live` (for a mask already in base 2) for the same
tile sizes: one flag per (mask slice, query tile, key tile), 1 where the
tile holds an entry > -inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .._core.numeric import LOG2E
from .fastmath import like

__all__ = ["bool_mask_base2", "float_mask_base2", "mask_tile_live"]


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def bool_mask_base2(mask, out, live, block_q, block_k):
    """Fill ``out`` (BM, LM, SM) with 0 where the boolean ``mask`` (the same shape) is
    True and -inf elsewhere, and ``live`` (BM, QT, KT), zeros on entry, with its open
    tiles (QT = 1 when LM = 1, else ceil(LM / block_q); KT likewise over the keys)."""
    n_m, n_l, n_s = mask.shape
    n_qt, n_kt = live.shape[1], live.shape[2]
    bq = block_q if n_l > 1 else 1
    bk = block_k if n_s > 1 else 1
    zero = out.dtype.type(0.0)
    neg = out.dtype.type(-np.inf)
    for item in prange(n_m * n_qt):
        mi = item // n_qt
        qt = item % n_qt
        for i in range(qt * bq, min(n_l, (qt + 1) * bq)):
            row = mask[mi, i]
            dst = out[mi, i]
            for kt in range(n_kt):
                n_open = 0
                for j in range(kt * bk, min(n_s, (kt + 1) * bk)):
                    keep = row[j]
                    dst[j] = zero if keep else neg
                    n_open += keep
                if n_open > 0:
                    live[mi, qt, kt] = 1


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _float_rows(mask, out, live, mi, qt, bq, bk):
    """Rows ``qt * bq ..`` of slice ``mi`` of :func:`float_mask_base2`: (n_bad, largest)."""
    n_l, n_s = mask.shape[1], mask.shape[2]
    n_kt = live.shape[2]
    log2e = out.dtype.type(LOG2E)
    n_bad = 0
    largest = 0.0
    for i in range(qt * bq, min(n_l, (qt + 1) * bq)):
        row = mask[mi, i]
        dst = out[mi, i]
        for kt in range(n_kt):
            n_open = 0
            for j in range(kt * bk, min(n_s, (kt + 1) * bk)):
                x = row[j]
                dst[j] = out.dtype.type(x) * log2e
                if x > -np.inf:
                    if x < np.inf:  # NaN fails both comparisons
                        n_open += 1
                        largest = max(largest, abs(float(x)))
                    else:
                        n_bad += 1
                elif x != x:
                    n_bad += 1
            if n_open > 0:
                live[mi, qt, kt] = 1
    return n_bad, largest


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def float_mask_base2(mask, out, live, block_q, block_k):
    """Fill ``out`` (BM, LM, SM) with ``dtype(x) * dtype(log2(e))`` for the float ``mask``
    (the same shape) and ``live`` (BM, QT, KT), zeros on entry, with its open tiles
    (those with an entry > -inf; QT and KT as in :func:`bool_mask_base2`).

    Returns ``(n_bad, largest)``: the number of NaN and +inf entries and the largest
    |x| over the finite ones (0 when there are none).
    """
    n_m, n_l, n_s = mask.shape
    n_qt = live.shape[1]
    bq = block_q if n_l > 1 else 1
    bk = block_k if n_s > 1 else 1
    n_items = n_m * n_qt
    bad = np.zeros(n_items, dtype=np.int64)
    top = np.zeros(n_items, dtype=np.float64)
    for item in prange(n_items):
        bad[item], top[item] = _float_rows(mask, out, live, item // n_qt, item % n_qt, bq, bk)
    return bad.sum(), top.max()


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def mask_tile_live(mask, block_q, block_k):
    """uint8 (BM, QT, KT): 1 where a (mask slice, query tile, key tile) has an entry > -inf.

    QT = 1 when the mask has one row (LM = 1, e.g. key padding), else
    ceil(LM / block_q); KT likewise over the keys. The kernels skip the
    tiles flagged 0.
    """
    n_m, n_l, n_s = mask.shape
    n_qt = (n_l + block_q - 1) // block_q if n_l > 1 else 1
    n_kt = (n_s + block_k - 1) // block_k if n_s > 1 else 1
    bq = block_q if n_l > 1 else 1
    bk = block_k if n_s > 1 else 1
    live = np.zeros((n_m, n_qt, n_kt), dtype=np.uint8)
    neg = like(-np.inf, mask)
    for item in prange(n_m * n_qt):
        mi = item // n_qt
        qt = item % n_qt
        for i in range(qt * bq, min(n_l, (qt + 1) * bq)):
            row = mask[mi, i]
            for kt in range(n_kt):
                if live[mi, qt, kt]:
                    continue
                for j in range(kt * bk, min(n_s, (kt + 1) * bk)):
                    if row[j] > neg:
                        live[mi, qt, kt] = 1
                        break
    return live
