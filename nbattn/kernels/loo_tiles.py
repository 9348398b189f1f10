"""Leave-one-out loss and gradient sums in one pass over row tiles, with BLAS.

The two-pass kernels of ``nbattn.kernels.loo`` stream one key at a time and
spend O(d) scalar work per pair on the gradient. Here a block of B query rows
holds its whole row of scores against all n keys (B x n float64, B chosen by
the caller so that the tile stays a few MB: memory O(B n + n d), never n x n),
so the softmax of each row is exact in one pass (max, exp, sum) and the
gradient of the block is one GEMM:

    s_ij = -|| z_i - z_j ||^2,  w_ij = exp(s_ij - max_j s_ij) / l_i   (j != i)
    f_i = sum_j w_ij y_j,  r_i = f_i - y_i,  g_ij = w_ij sum_c r_ic (y_jc - f_ic)

    M = sum_i sum_{j != i} g_ij (x_i - x_j)(x_i - x_j)^T
      = sum_i [ a_i x_i x_i^T - x_i b_i^T - b_i x_i^T ] + sum_j c_j x_j x_j^T
    a_i = sum_j g_ij,  b_i = sum_j g_ij x_j  (b = G X: the GEMM),  c_j = sum_i g_ij

(the same sums as ``loo.loo_grad_full``; with ``points = z`` the diagonal of M
is ``loo.loo_grad_diag``'s). The kernel returns the squared-error sum, the
row part of M, the key sums c (the caller adds X^T diag(c) X, one more GEMM)
and a flag per row that it left to the caller.

Scores. With few score dimensions k the direct difference is cheapest and
exact to (k + 3) u |s|. With more, the block's scores are a GEMM on points
shifted by the block's mean c_b:

    s_ij = 2 (z_i - c_b).(z_j - c_b) - |z_i - c_b|^2 - |z_j - c_b|^2   (clamped to <= 0)

whose rounding error is about (k + 3) u (|z_i - c_b|^2 + |z_j - c_b|^2). As
|z_j - c_b|^2 <= 2 |z_i - z_j|^2 + 2 |z_i - c_b|^2, and the weight carries
exp(-|z_i - z_j|^2), the error relative to the row's largest weight stays
below (k + 3) u (3 R_b^2 + 2) with R_b the block's radius; a block with
R_b^2 > ``gemm_max_radius2`` takes the direct scores. Both are float64 (float32
inputs are widened: their differences are then exact).

Rows left to the caller (``far[i]``): the row's best score is below
``-config.FAR_SCORE_FLOAT64`` (or no key is admissible, n = 1): the direct
score's rounding would show, and ``loo``'s anchored two-pass kernels handle
them. Their sums here are zero.

Inside ``prange``, ``np.dot`` calls BLAS: the caller holds BLAS to one thread
(``nbattn._threads.blas_one_thread``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, fmax

_FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _direct_scores(z, z_t, i0, nb, tile):
    """tile[r, j] = -||z_{i0+r} - z_j||^2 by differences."""
    k = z_t.shape[0]
    for r in range(nb):
        row = tile[r]
        q0 = z[i0 + r, 0]
        keys0 = z_t[0]
        for j in range(row.shape[0]):
            diff = keys0[j] - q0
            row[j] = -(diff * diff)
        for f in range(1, k):
            qf = z[i0 + r, f]
            keys_f = z_t[f]
            for j in range(row.shape[0]):
                diff = keys_f[j] - qf
                row[j] -= diff * diff


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _block_radius2(z, i0, nb, centre):
    """centre <- mean of rows i0 .. i0 + nb of z; returns max_r |z_r - centre|^2."""
    k = z.shape[1]
    centre[:] = 0.0
    for r in range(nb):
        for f in range(k):
            centre[f] += z[i0 + r, f]
    for f in range(k):
        centre[f] /= nb
    radius2 = 0.0
    for r in range(nb):
        dist = 0.0
        for f in range(k):
            diff = z[i0 + r, f] - centre[f]
            dist += diff * diff
        radius2 = max(radius2, dist)
    return radius2


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _gemm_scores(z, z_t, i0, nb, centre, queries_c, keys_c, key_sq, tile):
    """tile[r, j] = -||z_{i0+r} - z_j||^2 as a GEMM on points shifted by ``centre``."""
    k, n = z_t.shape
    key_sq[:] = 0.0
    for f in range(k):
        cf = centre[f]
        src = z_t[f]
        dst = keys_c[f]
        for j in range(n):
            value = src[j] - cf
            dst[j] = value
            key_sq[j] += value * value
    for r in range(nb):
        for f in range(k):
            queries_c[r, f] = z[i0 + r, f] - centre[f]
    np.dot(queries_c[:nb], keys_c, tile[:nb])
    for r in range(nb):
        q_sq = 0.0
        for f in range(k):
            q_sq += queries_c[r, f] * queries_c[r, f]
        row = tile[r]
        for j in range(n):
            row[j] = min(2.0 * row[j] - q_sq - key_sq[j], 0.0)


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def loo_tiles(
    z, z_t, points, values_t, targets, self_offset, block_rows, use_gemm, gemm_max_radius2
):
    """``(sse, M_rows, key_sums, far)``: the LOO squared error and gradient sums of rows.

    Parameters
    ----------
    z : (n_rows, k) float64, the query rows in score space (s_ij = -||z_i - z_j||^2)
    z_t : (k, n) float64, all keys in score space; query r is key ``r + self_offset``
    points : (n, d) float64, the keys in the coordinates of the gradient
        (the centred x for the full metric, z itself for the diagonal)
    values_t : (p, n) float64; targets : (n_rows, p) float64 (the queries' y)
    block_rows : rows per tile; use_gemm : GEMM scores allowed (blocks whose
        squared radius exceeds ``gemm_max_radius2`` take the direct ones)

    Returns
    -------
    sse : float, sum_i ||f_i - y_i||^2 over the rows not flagged
    M_rows : (d, d), sum_i [a_i x_i x_i^T - x_i b_i^T - b_i x_i^T]
    key_sums : (n,), c_j = sum_i g_ij
    far : (n_rows,) bool, rows left to the caller
    """
    n_rows, k = z.shape
    n = z_t.shape[1]
    d = points.shape[1]
    p = values_t.shape[0]
    n_blocks = (n_rows + block_rows - 1) // block_rows
    n_groups = min(config.LOO_FULL_GROUPS, n_blocks)
    partial_m = np.zeros((n_groups, d, d))
    partial_c = np.zeros((n_groups, n))
    partial_sse = np.zeros(n_groups)
    far = np.zeros(n_rows, dtype=np.bool_)
    for group in prange(n_groups):
        tile = np.empty((block_rows, n))
        gx = np.empty((block_rows, d))
        centre = np.empty(k)
        queries_c = np.empty((block_rows, k))
        keys_c = np.empty((k, n)) if use_gemm else np.empty((k, 0))
        key_sq = np.empty(n) if use_gemm else np.empty(0)
        f_row = np.empty(p)
        resid = np.empty(p)
        row_sums = np.zeros(block_rows)
        acc = partial_m[group]
        c_sum = partial_c[group]
        sse = 0.0
        first = group * n_blocks // n_groups
        last = (group + 1) * n_blocks // n_groups
        for blk in range(first, last):
            i0 = blk * block_rows
            nb = min(block_rows, n_rows - i0)
            gemm = use_gemm and _block_radius2(z, i0, nb, centre) <= gemm_max_radius2
            if gemm:
                _gemm_scores(z, z_t, i0, nb, centre, queries_c, keys_c, key_sq, tile)
            else:
                _direct_scores(z, z_t, i0, nb, tile)
            for r in range(nb):
                row = tile[r]
                own = i0 + r + self_offset
                if 0 <= own < n:
                    row[own] = -np.inf
                best = -np.inf
                for j in range(n):
                    best = fmax(best, row[j])
                row_sums[r] = 0.0
                if not best >= -_FAR_SCORE_FLOAT64:  # far, overflowing or no key
                    far[i0 + r] = True
                    row[:] = 0.0
                    continue
                total = 0.0
                if p == 1:  # one fused pass: weights, their sum and the weighted sum
                    vals = values_t[0]
                    weighted = 0.0
                    for j in range(n):
                        w = fast_exp(row[j] - best)
                        row[j] = w
                        total += w
                        weighted += w * vals[j]
                    f_row[0] = weighted
                else:
                    for j in range(n):
                        w = fast_exp(row[j] - best)
                        row[j] = w
                        total += w
                    for c in range(p):
                        vals = values_t[c]
                        weighted = 0.0
                        for j in range(n):
                            weighted += row[j] * vals[j]
                        f_row[c] = weighted
                inv = 1.0 / total
                for c in range(p):
                    f_row[c] *= inv
                    resid[c] = f_row[c] - targets[i0 + r, c]
                    sse += resid[c] * resid[c]
                # g_ij = w_ij sum_c r_ic (y_jc - f_ic), differences first (no cancellation)
                if p == 1:
                    scale = resid[0] * inv
                    f0 = f_row[0]
                    vals = values_t[0]
                    for j in range(n):
                        row[j] = row[j] * scale * (vals[j] - f0)
                else:
                    for j in range(n):
                        inner = 0.0
                        for c in range(p):
                            inner += resid[c] * (values_t[c, j] - f_row[c])
                        row[j] = row[j] * inv * inner
                a_r = 0.0
                for j in range(n):
                    a_r += row[j]
                    c_sum[j] += row[j]
                row_sums[r] = a_r
            np.dot(tile[:nb], points, gx[:nb])
            for r in range(nb):
                a_r = row_sums[r]
                x_r = points[i0 + r + self_offset]
                for a in range(d):
                    xa = x_r[a]
                    for b in range(d):
                        acc[a, b] += a_r * xa * x_r[b] - xa * gx[r, b] - gx[r, a] * x_r[b]
        partial_sse[group] = sse
    return partial_sse.sum(), partial_m.sum(axis=0), partial_c.sum(axis=0), far
