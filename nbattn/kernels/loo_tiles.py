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
exact to (k + 3) u |s|; those tiles take their rows two at a time through two fused
passes over L1-sized chunks of keys, the softmax with reference 0 and the gradient
as dot products instead of the GEMM (section "fused direct tiles"). With more, the
block's scores are a GEMM on points shifted by the block's mean c_b:

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

``loo_tiles`` takes every key. Pruning is ``loo_tiles_boxed``'s (the tiles on
many rows): the keys in k-d order and a tile's keys chosen by leaf bounding
boxes in every score coordinate (section "boxed keys" below).

Inside ``prange``, ``np.dot`` calls BLAS: the caller (``nbattn.smoothing.learning``) holds
BLAS to one thread while the kernel runs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, fmax

_FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)


_NEIGHBOURS = 4  # keys on each side, in the sorted order, that bound a row's best score


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _block_radius2(z_t, rows, i0, nb, centre):
    """centre <- mean of the block's rows; returns max_r |z_r - centre|^2."""
    k = z_t.shape[0]
    centre[:] = 0.0
    for r in range(nb):
        for f in range(k):
            centre[f] += z_t[f, rows[i0 + r]]
    for f in range(k):
        centre[f] /= nb
    radius2 = 0.0
    for r in range(nb):
        dist = 0.0
        for f in range(k):
            diff = z_t[f, rows[i0 + r]] - centre[f]
            dist += diff * diff
        radius2 = max(radius2, dist)
    return radius2


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _gemm_scores(z_t, rows, i0, nb, keys_z, width, centre, queries_c, keys_c, key_sq, tile, finish):
    """tile[r, j] = -||z_{rows[i0+r]} - keys_z[:, j]||^2 as a GEMM on points shifted by
    ``centre`` (clamped to <= 0) when ``finish``; without, the tile keeps the products
    (z_r - c).(z_j - c), ``key_sq[j]`` = |z_j - c|^2 and ``queries_c[r]`` = z_r - c, for
    :func:`_gemm_exp_row` to finish the scores in its exp pass."""
    k = z_t.shape[0]
    keys_w = keys_c[: k * width].reshape((k, width))
    sq = key_sq[:width]
    sq[:] = 0.0
    for f in range(k):
        cf = centre[f]
        src = keys_z[f]
        dst = keys_w[f]
        for j in range(width):
            value = src[j] - cf
            dst[j] = value
            sq[j] += value * value
    for r in range(nb):
        for f in range(k):
            queries_c[r, f] = z_t[f, rows[i0 + r]] - centre[f]
    np.dot(queries_c[:nb], keys_w, tile)
    if not finish:
        return
    for r in range(nb):
        q_sq = 0.0
        for f in range(k):
            q_sq += queries_c[r, f] * queries_c[r, f]
        row = tile[r]
        for j in range(width):
            row[j] = min(2.0 * row[j] - q_sq - sq[j], 0.0)


# --------------------------------------------------------------------------- refined GEMM scores
# A block wider than ``gemm_max_radius2`` may still take the GEMM scores when each
# row's keys near its best are then scored again by differences. The GEMM score's
# absolute error is at most eps_ij = (k + 3) u (|z_i - c|^2 + |z_j - c|^2) (the
# module's first section); below ``refine_max_radius2`` and the far-row limit that
# is far below REFINE_SLACK = 1 for every key of weight that matters, so:
#
#   * every key with GEMM score >= best_gemm - REFINE_GAP - REFINE_SLACK, which
#     includes the true best key, gets its exact score, and the row's best is then
#     exact;
#   * every other key has exact score below best - REFINE_GAP, weight below
#     e^-REFINE_GAP = 2.3e-16 of the largest, and its weight's relative error
#     eps_ij e^eps_ij (k + 3) u-small: its contribution's error is below u^2 of the
#     largest weight.
#
# So the result meets the float64 contract whatever the block's radius; the
# refinement's cost is k operations per key near the best (few, when the rows
# are narrow against the block: the case where the block is wide).

_REFINE_GAP = 36.0
_REFINE_SLACK = 1.0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _refine_near_best(z_t, own, keys_z, width, row, best, near, dist):
    """Exact scores, by differences, for the keys of ``row`` (GEMM scores of key
    ``own``) within REFINE_GAP + REFINE_SLACK of ``best``; returns the exact best.
    ``near`` (int64) and ``dist`` (float64), each of at least ``width``, are scratch:
    the keys are listed first, then scored one coordinate at a time over the list."""
    k = z_t.shape[0]
    cut = best - (_REFINE_GAP + _REFINE_SLACK)
    count = 0
    for j in range(width):
        if row[j] >= cut:
            near[count] = j
            count += 1
    dist[:count] = 0.0
    for f in range(k):
        qf = z_t[f, own]
        keys_f = keys_z[f]
        for t in range(count):
            diff = keys_f[near[t]] - qf
            dist[t] += diff * diff
    exact_best = -np.inf
    for t in range(count):
        row[near[t]] = -dist[t]
        exact_best = fmax(exact_best, -dist[t])
    return exact_best


# --------------------------------------------------------------------------- fused direct tiles
# With direct scores (few score dimensions) a tile's rows go through two passes over
# their keys, two rows at a time (each key loaded once for both), the keys in chunks
# of ``_CHUNK`` that stay in L1 between the steps of a pass:
#
#   pass A (per chunk): the scores by differences, four coordinates per sweep, then
#       w_ij = exp(s_ij) with the row sum l_i and the weighted sum, in one loop;
#   pass B (per chunk): g_ij = (w_ij / l_i) sum_c r_ic (y_jc - f_ic), the key sums c_j,
#       a_i = sum_j g_ij and b_i = sum_j g_ij x_j as d dot products (no tile GEMM).
#
# Reference 0. Pass A (and the exp pass of the GEMM scores when they are not refined)
# takes 0 as the softmax's reference instead of the row's best score: a Gaussian score
# is <= 0, so exp(s_ij) cannot overflow, no pass over the row looks for its maximum, and
# the weights are as accurate as exp(s_ij - best) (the same absolute error of s_ij, one
# rounding fewer). A row whose weights sum to l_i >= ``_ZERO_REF_MIN_SUM`` = e^-600 has
# its best score above -600 - log(n): the keys whose exp underflows (s_ij < -708.39)
# weigh below e^-64 of its largest (n < 2^63). One with l_i below 2^-64 (``_UNIT_SUM_MIN``) is
# divided by l_i first (``_bounded_sums``), so that 1 / l_i <= 2^64 in every later
# product and cannot overflow against a residual whatever the order fastmath picks.
# A row with l_i < e^-600 is scored again by differences and takes exp(s_ij - best)
# (``_shifted_row``); one whose best is below -FAR_SCORE_FLOAT64 is left to the caller.
# (A running maximum in the exp loop would also stop LLVM from vectorising it.)
#
# The row part of M keeps a_i x_i x_i^T although a_i is zero in exact arithmetic (the
# weights sum to 1 and f_i is their mean of y): with it the expansion is exact for the
# rounded g_ij, and points far from the origin lose fewer digits.

_CHUNK = 512
_ZERO_REF_MIN_SUM = float(np.exp(-600.0))
_UNIT_SUM_MIN = 2.0**-64


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _pair_scores(z_t, own_a, own_b, keys_z, j0, ra, rb):
    """ra[j] <- -||z_own_a - keys_z[:, j0 + j]||^2 (rb likewise for own_b), over the
    slices' length: coordinates four, then two, then one at a time per sweep, so that
    the two score rows are loaded and stored once per group, not per coordinate."""
    k = z_t.shape[0]
    m = ra.shape[0]
    ra[:] = 0.0
    rb[:] = 0.0
    f = 0
    while f + 4 <= k:
        k0 = keys_z[f, j0 : j0 + m]
        k1 = keys_z[f + 1, j0 : j0 + m]
        k2 = keys_z[f + 2, j0 : j0 + m]
        k3 = keys_z[f + 3, j0 : j0 + m]
        a0, a1, a2, a3 = z_t[f, own_a], z_t[f + 1, own_a], z_t[f + 2, own_a], z_t[f + 3, own_a]
        b0, b1, b2, b3 = z_t[f, own_b], z_t[f + 1, own_b], z_t[f + 2, own_b], z_t[f + 3, own_b]
        for j in range(m):
            da0 = k0[j] - a0
            da1 = k1[j] - a1
            da2 = k2[j] - a2
            da3 = k3[j] - a3
            db0 = k0[j] - b0
            db1 = k1[j] - b1
            db2 = k2[j] - b2
            db3 = k3[j] - b3
            ra[j] -= (da0 * da0 + da1 * da1) + (da2 * da2 + da3 * da3)
            rb[j] -= (db0 * db0 + db1 * db1) + (db2 * db2 + db3 * db3)
        f += 4
    while f + 2 <= k:
        k0 = keys_z[f, j0 : j0 + m]
        k1 = keys_z[f + 1, j0 : j0 + m]
        a0, a1 = z_t[f, own_a], z_t[f + 1, own_a]
        b0, b1 = z_t[f, own_b], z_t[f + 1, own_b]
        for j in range(m):
            da0 = k0[j] - a0
            da1 = k1[j] - a1
            db0 = k0[j] - b0
            db1 = k1[j] - b1
            ra[j] -= da0 * da0 + da1 * da1
            rb[j] -= db0 * db0 + db1 * db1
        f += 2
    if f < k:
        k0 = keys_z[f, j0 : j0 + m]
        a0 = z_t[f, own_a]
        b0 = z_t[f, own_b]
        for j in range(m):
            da0 = k0[j] - a0
            db0 = k0[j] - b0
            ra[j] -= da0 * da0
            rb[j] -= db0 * db0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _pair_exp_pass(z_t, own_a, own_b, keys_z, keys_v, width, at_a, at_b, row_a, row_b, sums):
    """Pass A for query rows ``own_a``, ``own_b`` (key positions ``at_a``, ``at_b`` left
    out, or -1): row_x[j] <- exp(s_xj); ``sums`` (2, 2) <- (l, sum_j w_j y_j0).

    The loops run over slices (an index from a variable start keeps numba's negative-index
    check and LLVM from vectorising) and keep no running maximum (a max reduction beside
    the inlined exp stops the vectorisation too).
    """
    tot_a, tot_b = 0.0, 0.0
    wv_a, wv_b = 0.0, 0.0
    for j0 in range(0, width, _CHUNK):
        j1 = min(j0 + _CHUNK, width)
        ra = row_a[j0:j1]
        rb = row_b[j0:j1]
        m = j1 - j0
        _pair_scores(z_t, own_a, own_b, keys_z, j0, ra, rb)
        if j0 <= at_a < j1:
            row_a[at_a] = -np.inf
        if j0 <= at_b < j1:
            row_b[at_b] = -np.inf
        vals = keys_v[0, j0:j1]  # the first output's weighted sum, whatever p (one loop)
        for j in range(m):
            wa = fast_exp(ra[j])
            wb = fast_exp(rb[j])
            ra[j] = wa
            rb[j] = wb
            tot_a += wa
            tot_b += wb
            wv_a += wa * vals[j]
            wv_b += wb * vals[j]
    sums[0, 0], sums[0, 1] = tot_a, wv_a
    sums[1, 0], sums[1, 1] = tot_b, wv_b


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _shifted_row(z_t, own, keys_z, keys_v, width, at, row):
    """Pass A for one row whose weights exp(s_j) sum below _ZERO_REF_MIN_SUM: row[j] <-
    exp(s_j - best); returns (best, l, sum_j w_j y_j0). Best below -FAR_SCORE_FLOAT64
    (or no key): (best, 0, 0), the row's weights not set."""
    k = z_t.shape[0]
    q0 = z_t[0, own]
    keys0 = keys_z[0]
    for j in range(width):
        diff = keys0[j] - q0
        row[j] = -(diff * diff)
    for f in range(1, k):
        qf = z_t[f, own]
        keys_f = keys_z[f]
        for j in range(width):
            diff = keys_f[j] - qf
            row[j] -= diff * diff
    if at >= 0:
        row[at] = -np.inf
    best = -np.inf
    for j in range(width):
        best = fmax(best, row[j])
    if not best >= -_FAR_SCORE_FLOAT64:
        return best, 0.0, 0.0
    vals = keys_v[0]
    total = 0.0
    weighted = 0.0
    for j in range(width):
        w = fast_exp(row[j] - best)
        row[j] = w
        total += w
        weighted += w * vals[j]
    return best, total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _pair_gradient_pass(keys_v, keys_x_t, width, row_a, row_b, coef, f_rows, gx, row_g, key_sums):
    """Pass B for two rows of weights w (not normalised): row_x[j] <- g_xj =
    (w_xj coef[x, 0]) sum_c coef[x, 1 + c] (y_jc - f_rows[x, c]), with coef[x] =
    (1 / l_x, r_x); adds g_aj + g_bj to key_sums[j] and sets gx[x, :] = sum_j g_xj x_j
    (``keys_x_t`` (d, >= width)) and row_g[x] = sum_j g_xj. A row with coef[x] = 0 gets
    g = 0."""
    p = keys_v.shape[0]
    d = keys_x_t.shape[0]
    inv_a, inv_b = coef[0, 0], coef[1, 0]
    for a in range(d):
        gx[0, a] = 0.0
        gx[1, a] = 0.0
    row_g[0] = 0.0
    row_g[1] = 0.0
    for j0 in range(0, width, _CHUNK):
        j1 = min(j0 + _CHUNK, width)
        ra = row_a[j0:j1]
        rb = row_b[j0:j1]
        ks = key_sums[j0:j1]
        m = j1 - j0
        x0 = keys_x_t[0, j0:j1]
        sa = 0.0
        sb = 0.0
        ga_sum = 0.0
        gb_sum = 0.0
        if p == 1:
            vals = keys_v[0, j0:j1]
            ca, cb = inv_a * coef[0, 1], inv_b * coef[1, 1]  # 1 / l <= 2^64
            fa, fb = f_rows[0, 0], f_rows[1, 0]
            for j in range(m):
                ga = ra[j] * ca * (vals[j] - fa)
                gb = rb[j] * cb * (vals[j] - fb)
                ra[j] = ga
                rb[j] = gb
                ks[j] += ga + gb
                ga_sum += ga
                gb_sum += gb
                sa += ga * x0[j]
                sb += gb * x0[j]
        else:
            for j in range(m):
                inner_a = 0.0
                inner_b = 0.0
                for c in range(p):
                    inner_a += coef[0, 1 + c] * (keys_v[c, j0 + j] - f_rows[0, c])
                    inner_b += coef[1, 1 + c] * (keys_v[c, j0 + j] - f_rows[1, c])
                ga = (ra[j] * inv_a) * inner_a
                gb = (rb[j] * inv_b) * inner_b
                ra[j] = ga
                rb[j] = gb
                ks[j] += ga + gb
                ga_sum += ga
                gb_sum += gb
                sa += ga * x0[j]
                sb += gb * x0[j]
        gx[0, 0] += sa
        gx[1, 0] += sb
        row_g[0] += ga_sum
        row_g[1] += gb_sum
        # the other coordinates two at a time: each g loaded once for both
        a = 1
        while a + 2 <= d:
            x1 = keys_x_t[a, j0:j1]
            x2 = keys_x_t[a + 1, j0:j1]
            sa1, sb1, sa2, sb2 = 0.0, 0.0, 0.0, 0.0
            for j in range(m):
                sa1 += ra[j] * x1[j]
                sb1 += rb[j] * x1[j]
                sa2 += ra[j] * x2[j]
                sb2 += rb[j] * x2[j]
            gx[0, a] += sa1
            gx[1, a] += sb1
            gx[0, a + 1] += sa2
            gx[1, a + 1] += sb2
            a += 2
        if a < d:
            x1 = keys_x_t[a, j0:j1]
            sa1, sb1 = 0.0, 0.0
            for j in range(m):
                sa1 += ra[j] * x1[j]
                sb1 += rb[j] * x1[j]
            gx[0, a] += sa1
            gx[1, a] += sb1


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _bounded_sums(row, width, total, weighted):
    """(l, sum_j w_j y_j0) of a row of weights, the row divided by l first when l <
    _UNIT_SUM_MIN, so that 1 / l stays below 2^64 in every later product."""
    if total >= _UNIT_SUM_MIN:
        return total, weighted
    inv = 1.0 / total
    for j in range(width):
        row[j] *= inv
    return 1.0, weighted * inv


@njit(cache=config.CACHE)
def _no_gradient(coef, f_rows, x):
    """Row ``x`` of a pair contributes nothing to pass B."""
    coef[x, :] = 0.0
    f_rows[x, :] = 0.0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _direct_rows_pass(
    z_t,
    rows,
    i0,
    nb,
    keys_z,
    keys_v,
    keys_x_t,
    width,
    own_at,
    targets,
    points,
    pair,
    sums,
    coef,
    f_rows,
    gx,
    row_g,
    key_sums,
    acc,
    far,
):
    """The tile body on direct scores (section "fused direct tiles"): rows
    ``rows[i0:i0+nb]``, two at a time; returns the squared-error sum. ``pair`` (2, >=
    width) holds the two rows' weights; ``sums`` (2, 2), ``coef`` (2, 1 + p), ``f_rows``
    (2, p), ``gx`` (2, d), ``row_g`` (2,) are scratch. Accumulates as :func:`_tile_rows_pass`."""
    d = points.shape[1]
    p = keys_v.shape[0]
    sse = 0.0
    row_a = pair[0]
    row_b = pair[1]
    for r0 in range(0, nb, 2):
        second = r0 + 1 < nb
        own_a = rows[i0 + r0]
        own_b = rows[i0 + r0 + 1] if second else own_a
        at_b = own_at[r0 + 1] if second else own_at[r0]
        _pair_exp_pass(
            z_t, own_a, own_b, keys_z, keys_v, width, own_at[r0], at_b, row_a, row_b, sums
        )
        for x in range(2):
            row = row_a if x == 0 else row_b
            if x == 1 and not second:  # the pair's second row repeats the first: no sums
                _no_gradient(coef, f_rows, 1)
                continue
            total, weighted = sums[x, 0], sums[x, 1]
            best = 0.0
            if not total >= _ZERO_REF_MIN_SUM:  # far from its keys (or none)
                best, total, weighted = _shifted_row(
                    z_t, rows[i0 + r0 + x], keys_z, keys_v, width, own_at[r0 + x], row
                )
            else:
                total, weighted = _bounded_sums(row, width, total, weighted)
            if not best >= -_FAR_SCORE_FLOAT64:  # far, overflowing or no key
                far[i0 + r0 + x] = True
                row[:width] = 0.0
                _no_gradient(coef, f_rows, x)
                continue
            inv = 1.0 / total
            if p == 1:
                f_rows[x, 0] = weighted
            else:
                for c in range(p):
                    vals = keys_v[c]
                    weighted = 0.0
                    for j in range(width):
                        weighted += row[j] * vals[j]
                    f_rows[x, c] = weighted
            coef[x, 0] = inv
            for c in range(p):
                f_rows[x, c] *= inv
                resid = f_rows[x, c] - targets[i0 + r0 + x, c]
                coef[x, 1 + c] = resid
                sse += resid * resid
        _pair_gradient_pass(
            keys_v, keys_x_t, width, row_a, row_b, coef, f_rows, gx, row_g, key_sums
        )
        for x in range(2 if second else 1):
            x_r = points[rows[i0 + r0 + x]]
            for a in range(d):
                xa = x_r[a]
                for b in range(d):
                    acc[a, b] += row_g[x] * xa * x_r[b] - xa * gx[x, b] - gx[x, a] * x_r[b]
    return sse


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _gemm_exp_row(row, query_c, key_sq, keys_v, width):
    """The GEMM scores' exp pass with reference 0 (section "fused direct tiles"): row[j]
    <- exp(min(2 row[j] - |q|^2 - key_sq[j], 0)) from the products of
    :func:`_gemm_scores` (``finish`` False; an excluded key's product set to -inf);
    returns (l, sum_j w_j y_j0)."""
    q_sq = 0.0
    for f in range(query_c.shape[0]):
        q_sq += query_c[f] * query_c[f]
    sq = key_sq[:width]
    total = 0.0
    weighted = 0.0
    vals = keys_v[0, :width]  # the first output's weighted sum, whatever p (one loop)
    for j in range(width):
        w = fast_exp(min(2.0 * row[j] - q_sq - sq[j], 0.0))
        row[j] = w
        total += w
        weighted += w * vals[j]
    return total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _shifted_exps(row, best, keys_v, width, f_row):
    """row[j] <- exp(row[j] - best), f_row[c] <- sum_j w_j y_jc; returns l = sum_j w_j."""
    p = keys_v.shape[0]
    total = 0.0
    if p == 1:  # one fused pass: weights, their sum and the weighted sum
        vals = keys_v[0]
        weighted = 0.0
        for j in range(width):
            w = fast_exp(row[j] - best)
            row[j] = w
            total += w
            weighted += w * vals[j]
        f_row[0] = weighted
        return total
    for j in range(width):
        w = fast_exp(row[j] - best)
        row[j] = w
        total += w
    for c in range(p):
        vals = keys_v[c]
        weighted = 0.0
        for j in range(width):
            weighted += row[j] * vals[j]
        f_row[c] = weighted
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _tile_rows_pass(
    z_t,
    rows,
    i0,
    nb,
    keys_z,
    keys_v,
    keys_x,
    keys_x_t,
    width,
    own_at,
    targets,
    points,
    use_gemm,
    gemm_max_radius2,
    refine_max_radius2,
    scratch,
    tile,
    key_sums,
    acc,
    far,
):
    """The one tile body of both kernels: rows ``rows[i0:i0+nb]`` against ``width``
    gathered keys; returns the tile's squared-error sum.

    ``keys_z`` (k, >= width), ``keys_v`` (p, >= width), ``keys_x`` (>= width, d): the
    keys' scores, values and gradient coordinates (all keys themselves for
    :func:`loo_tiles`); ``own_at[r]`` the position of row r's own key among them, or
    -1. Adds g_rj to ``key_sums[j]`` (positions among the keys), the row part of M to
    ``acc`` (d, d), flags far rows in ``far`` (indexed from ``i0``). ``scratch`` is
    ``(centre, queries_c, keys_c, key_sq, f_row, resid, row_sums, gx, near, dist)``.

    Scores: GEMM when the block's squared radius is at most ``gemm_max_radius2``;
    GEMM then exact differences for the keys near each row's best (section
    "refined GEMM scores") up to ``refine_max_radius2``; direct beyond.
    """
    centre, queries_c, keys_c, key_sq, f_row, resid, row_sums, gx, near, dist = scratch[:10]
    pair, pair_sums, coef, f_rows, pair_gx, pair_g = scratch[10:]
    d = points.shape[1]
    p = keys_v.shape[0]
    sse = 0.0
    refine = False
    if use_gemm:
        radius2 = _block_radius2(z_t, rows, i0, nb, centre)
        refine = radius2 > gemm_max_radius2
        use_gemm = radius2 <= max(gemm_max_radius2, refine_max_radius2)
    if not use_gemm:
        return _direct_rows_pass(
            z_t,
            rows,
            i0,
            nb,
            keys_z,
            keys_v,
            keys_x_t,
            width,
            own_at,
            targets,
            points,
            pair,
            pair_sums,
            coef,
            f_rows,
            pair_gx,
            pair_g,
            key_sums,
            acc,
            far,
        )
    _gemm_scores(z_t, rows, i0, nb, keys_z, width, centre, queries_c, keys_c, key_sq, tile, refine)
    for r in range(nb):
        row = tile[r]
        if own_at[r] >= 0:  # the row's own key is left out
            row[own_at[r]] = -np.inf
        row_sums[r] = 0.0
        if not refine:
            # scores finished in the exp pass, reference 0 (section "fused direct tiles")
            total, weighted = _gemm_exp_row(row, queries_c[r], key_sq, keys_v, width)
            best = 0.0
            if not total >= _ZERO_REF_MIN_SUM:
                best, total, weighted = _shifted_row(
                    z_t, rows[i0 + r], keys_z, keys_v, width, own_at[r], row
                )
            else:
                total, weighted = _bounded_sums(row, width, total, weighted)
            if not best >= -_FAR_SCORE_FLOAT64:  # far, overflowing or no key
                far[i0 + r] = True
                row[:] = 0.0
                continue
            if p == 1:
                f_row[0] = weighted
            else:
                for c in range(p):
                    vals = keys_v[c]
                    weighted = 0.0
                    for j in range(width):
                        weighted += row[j] * vals[j]
                    f_row[c] = weighted
        else:
            best = -np.inf
            for j in range(width):
                best = fmax(best, row[j])
            if best >= -_FAR_SCORE_FLOAT64:
                best = _refine_near_best(z_t, rows[i0 + r], keys_z, width, row, best, near, dist)
            if not best >= -_FAR_SCORE_FLOAT64:  # far, overflowing or no key
                far[i0 + r] = True
                row[:] = 0.0
                continue
            total = _shifted_exps(row, best, keys_v, width, f_row)
        inv = 1.0 / total
        for c in range(p):
            f_row[c] *= inv
            resid[c] = f_row[c] - targets[i0 + r, c]
            sse += resid[c] * resid[c]
        # g_ij = w_ij sum_c r_ic (y_jc - f_ic), differences first (no cancellation),
        # with its row sum a_i and key sums c_j in the same pass
        a_r = 0.0
        if p == 1:
            scale = resid[0] * inv  # 1 / l <= 2^64 (section "fused direct tiles")
            f0 = f_row[0]
            vals = keys_v[0]
            for j in range(width):
                g = row[j] * scale * (vals[j] - f0)
                row[j] = g
                a_r += g
                key_sums[j] += g
        else:
            for j in range(width):
                inner = 0.0
                for c in range(p):
                    inner += resid[c] * (keys_v[c, j] - f_row[c])
                g = (row[j] * inv) * inner
                row[j] = g
                a_r += g
                key_sums[j] += g
        row_sums[r] = a_r
    np.dot(tile, keys_x[:width], gx[:nb])
    for r in range(nb):
        a_r = row_sums[r]
        x_r = points[rows[i0 + r]]
        for a in range(d):
            xa = x_r[a]
            for b in range(d):
                acc[a, b] += a_r * xa * x_r[b] - xa * gx[r, b] - gx[r, a] * x_r[b]
    return sse


@njit(cache=config.CACHE)
def _scratch(k, n, d, p, block_rows, use_gemm):
    """The per-thread buffers of :func:`_tile_rows_pass` (a tuple, see there)."""
    return (
        np.empty(k),
        np.empty((block_rows, k)),
        np.empty(k * n) if use_gemm else np.empty(0),
        np.empty(n) if use_gemm else np.empty(0),
        np.empty(p),
        np.empty(p),
        np.zeros(block_rows),
        np.empty((block_rows, d)),
        np.empty(n if use_gemm else 0, dtype=np.int64),
        np.empty(n if use_gemm else 0),
        np.empty((2, n)),
        np.empty((2, 2)),
        np.empty((2, 1 + p)),
        np.empty((2, p)),
        np.empty((2, d)),
        np.empty(2),
    )


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def loo_tiles(
    z_t,
    points,
    values_t,
    targets,
    rows,
    block_rows,
    use_gemm,
    gemm_max_radius2,
    refine_max_radius2=0.0,
):
    """``(sse, M_rows, key_sums, far)``: the LOO squared error and gradient sums of rows.

    Parameters
    ----------
    z_t : (k, n) float64, all keys in score space (s_ij = -||z_i - z_j||^2)
    points : (n, d) float64, the keys in the coordinates of the gradient
        (the centred x for the full metric, z itself for the diagonal)
    values_t : (p, n) float64, the keys' y
    targets : (n_rows, p) float64, the query rows' y
    rows : (n_rows,) int64, ascending: query r is key ``rows[r]`` (left out)
    block_rows : rows per tile; use_gemm : GEMM scores allowed (blocks whose
        squared radius exceeds ``gemm_max_radius2`` take the direct ones, or up to
        ``refine_max_radius2`` the refined GEMM scores of section "refined GEMM
        scores"; the default 0 turns those off)

    Returns
    -------
    sse : float, sum_r ||f_r - y_r||^2 over the rows not flagged
    M_rows : (d, d), sum_r [a_r x_r x_r^T - x_r b_r^T - b_r x_r^T]
    key_sums : (n,), c_j = sum_r g_rj
    far : (n_rows,) bool, rows left to the caller
    """
    k, n = z_t.shape
    n_rows = rows.shape[0]
    d = points.shape[1]
    p = values_t.shape[0]
    n_blocks = (n_rows + block_rows - 1) // block_rows
    n_groups = min(config.LOO_FULL_GROUPS, n_blocks)
    partial_m = np.zeros((n_groups, d, d))
    partial_c = np.zeros((n_groups, n))
    partial_sse = np.zeros(n_groups)
    far = np.zeros(n_rows, dtype=np.bool_)
    points_t = np.ascontiguousarray(points.T)
    for group in prange(n_groups):
        flat = np.empty(block_rows * n if use_gemm else 0)  # direct tiles: two rows
        scratch = _scratch(k, n, d, p, block_rows, use_gemm)
        own_at = np.empty(block_rows, dtype=np.int64)
        sse = 0.0
        first = group * n_blocks // n_groups
        last = (group + 1) * n_blocks // n_groups
        for blk in range(first, last):
            i0 = blk * block_rows
            nb = min(block_rows, n_rows - i0)
            for r in range(nb):
                own_at[r] = rows[i0 + r]
            sse += _tile_rows_pass(
                z_t,
                rows,
                i0,
                nb,
                z_t,
                values_t,
                points,
                points_t,
                n,
                own_at,
                targets,
                points,
                use_gemm,
                gemm_max_radius2,
                refine_max_radius2,
                scratch,
                flat[: nb * n].reshape((nb, n)) if use_gemm else flat.reshape((0, 0)),
                partial_c[group],
                partial_m[group],
                far,
            )
        partial_sse[group] = sse
    return partial_sse.sum(), partial_m.sum(axis=0), partial_c.sum(axis=0), far


# --------------------------------------------------------------------------- boxed keys
# The keys in k-d order: pruning by boxes in every score coordinate.
#
# ``loo_tiles`` bounds distances along one direction only; when several score
# coordinates are wide (a table whose widths make a category an almost exact
# match, sizes that vary together), a key can be close along that direction and
# far in another, and the window keeps it. Here the keys are ordered by a k-d
# split (halve the widest coordinate of each node at its median, down to leaves
# of ``leaf_keys`` keys), so that each leaf, a contiguous range of the order, is
# small in every coordinate, and a tile keeps only the leaves whose bounding box
# comes within reach of one of its rows:
#
#     dist^2(z_i, box) = sum_f max(lo_f - z_if, 0, z_if - hi_f)^2 <= |z_i - z_j|^2
#
# for every key j in the box, so a leaf with dist^2(z_i, box) > U_i + gap holds
# no key of row i's weight above exp(-gap) of its largest, U_i being row i's
# squared distance to the nearest of a few keys beside it in the order (so
# -max_j s_ij <= U_i). The bound is per row; a tile takes the union of its rows'
# leaves, gathered into contiguous buffers.


@njit(cache=config.CACHE)
def _select_median(order, z, a, b, mid, dim):
    """Reorder order[a:b] so that order[mid] holds the median key along ``dim``, with no
    key before it larger and none after it smaller (Hoare's selection)."""
    lo, hi = a, b - 1
    while lo < hi:
        pivot = z[order[(lo + hi) // 2], dim]
        i, j = lo, hi
        while i <= j:
            while z[order[i], dim] < pivot:
                i += 1
            while z[order[j], dim] > pivot:
                j -= 1
            if i <= j:
                order[i], order[j] = order[j], order[i]
                i += 1
                j -= 1
        if mid <= j:
            hi = j
        elif mid >= i:
            lo = i
        else:
            return


@njit(cache=config.CACHE)
def kd_order(z, leaf_keys):
    """``(order, leaf_start)``: keys in k-d order and the leaves' first positions (plus n).

    Each node [a, b) of more than ``leaf_keys`` keys is split at its median along its
    widest coordinate; leaves are ranges of ``order``, in depth-first order.
    """
    n, k = z.shape
    order = np.arange(n)
    stack_a = np.empty(64, dtype=np.int64)
    stack_b = np.empty(64, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    n_leaves = 0
    top = 0
    stack_a[0], stack_b[0] = 0, n
    top = 1
    while top > 0:
        top -= 1
        a, b = stack_a[top], stack_b[top]
        if b - a <= leaf_keys:
            starts[n_leaves] = a
            n_leaves += 1
            continue
        best_dim, best_extent = 0, -1.0
        for f in range(k):
            low, high = np.inf, -np.inf
            for t in range(a, b):
                value = z[order[t], f]
                low = min(low, value)
                high = max(high, value)
            if high - low > best_extent:
                best_dim, best_extent = f, high - low
        mid = (a + b) // 2
        _select_median(order, z, a, b, mid, best_dim)
        # the right half first on the stack, so that the left leaf comes out first
        stack_a[top], stack_b[top] = mid, b
        stack_a[top + 1], stack_b[top + 1] = a, mid
        top += 2
    starts[n_leaves] = n
    return order, starts[: n_leaves + 1].copy()


@njit(cache=config.CACHE)
def leaf_boxes(z_t, leaf_start):
    """(lo, hi), each (n_leaves, k): the bounding box of each leaf's keys (z_t in k-d order)."""
    k = z_t.shape[0]
    n_leaves = leaf_start.shape[0] - 1
    lo = np.empty((n_leaves, k))
    hi = np.empty((n_leaves, k))
    for leaf in range(n_leaves):
        for f in range(k):
            low, high = np.inf, -np.inf
            for j in range(leaf_start[leaf], leaf_start[leaf + 1]):
                low = min(low, z_t[f, j])
                high = max(high, z_t[f, j])
            lo[leaf, f] = low
            hi[leaf, f] = high
    return lo, hi


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _row_bound(z_t, own):
    """U: the squared distance from key ``own`` to the nearest of its neighbours in the
    order (an upper bound of -max_j s_own,j); inf when there is none or it overflows."""
    k, n = z_t.shape
    nearest = np.inf
    for j in range(max(own - _NEIGHBOURS, 0), min(own + _NEIGHBOURS + 1, n)):
        if j == own:
            continue
        dist = 0.0
        for f in range(k):
            diff = z_t[f, j] - z_t[f, own]
            dist += diff * diff
        nearest = min(nearest, dist)
    return nearest


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _kept_leaves(z_t, rows, i0, nb, box_lo, box_hi, prune_gap, reach, keep):
    """keep[leaf] <- whether some row of the block comes within reach of the leaf's box
    (the bound of the section above); every leaf when a row's bound is not finite.
    ``reach`` (block_rows,) is scratch: each row's U_i + gap."""
    k = z_t.shape[0]
    n_leaves = box_lo.shape[0]
    block_lo = np.full(k, np.inf)
    block_hi = np.full(k, -np.inf)
    reach_max = 0.0
    for r in range(nb):
        own = rows[i0 + r]
        bound = _row_bound(z_t, own)
        if not bound < np.inf:
            keep[:] = True
            return
        # a relative margin over the rounding of the bound and of the box distances
        reach[r] = (bound + prune_gap) * (1.0 + 1e-9)
        reach_max = max(reach_max, reach[r])
        for f in range(k):
            block_lo[f] = min(block_lo[f], z_t[f, own])
            block_hi[f] = max(block_hi[f], z_t[f, own])
    for leaf in range(n_leaves):
        keep[leaf] = False
        # the distance between the block's box and the leaf's first: a cheap filter
        total = 0.0
        for f in range(k):
            gap = max(box_lo[leaf, f] - block_hi[f], block_lo[f] - box_hi[leaf, f], 0.0)
            total += gap * gap
        if total > reach_max:
            continue
        for r in range(nb):
            own = rows[i0 + r]
            total = 0.0
            for f in range(k):
                value = z_t[f, own]
                gap = max(box_lo[leaf, f] - value, value - box_hi[leaf, f], 0.0)
                total += gap * gap
            if total <= reach[r]:
                keep[leaf] = True
                break


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def loo_tiles_boxed(
    z_t,
    points,
    values_t,
    targets,
    rows,
    block_rows,
    use_gemm,
    gemm_max_radius2,
    leaf_start,
    box_lo,
    box_hi,
    prune_gap,
    refine_max_radius2=0.0,
):
    """:func:`loo_tiles` with keys in k-d order and tiles pruned by leaf boxes.

    Parameters and returns as :func:`loo_tiles`, except that the keys (``z_t``,
    ``points``, ``values_t``) are in the order of :func:`kd_order`, ``leaf_start``
    (n_leaves + 1,) are its leaves' first positions and ``box_lo``, ``box_hi``
    their bounding boxes (:func:`leaf_boxes`). Each tile gathers the keys of the
    leaves within reach of its rows (section "boxed keys") into contiguous buffers
    and runs the one-pass softmax and GEMM gradient of :func:`loo_tiles` on them.
    """
    k, n = z_t.shape
    n_rows = rows.shape[0]
    d = points.shape[1]
    p = values_t.shape[0]
    n_leaves = box_lo.shape[0]
    n_blocks = (n_rows + block_rows - 1) // block_rows
    n_groups = min(config.LOO_FULL_GROUPS, n_blocks)
    partial_m = np.zeros((n_groups, d, d))
    partial_c = np.zeros((n_groups, n))
    partial_sse = np.zeros(n_groups)
    far = np.zeros(n_rows, dtype=np.bool_)
    for group in prange(n_groups):
        flat = np.empty(block_rows * n if use_gemm else 0)  # direct tiles: two rows
        scratch = _scratch(k, n, d, p, block_rows, use_gemm)
        own_at = np.empty(block_rows, dtype=np.int64)
        keep = np.empty(n_leaves, dtype=np.bool_)
        reach = np.empty(block_rows)
        keys_z = np.empty((k, n))  # the kept keys, gathered
        keys_v = np.empty((p, n))
        keys_x = np.empty((n, d))
        keys_x_t = np.empty((d, n))
        key_index = np.empty(n, dtype=np.int64)
        keys_c = np.empty(n)  # the tile's key sums, by position among the kept keys
        c_sum = partial_c[group]
        sse = 0.0
        first = group * n_blocks // n_groups
        last = (group + 1) * n_blocks // n_groups
        for blk in range(first, last):
            i0 = blk * block_rows
            nb = min(block_rows, n_rows - i0)
            _kept_leaves(z_t, rows, i0, nb, box_lo, box_hi, prune_gap, reach, keep)
            width = 0
            for leaf in range(n_leaves):
                if not keep[leaf]:
                    continue
                for j in range(leaf_start[leaf], leaf_start[leaf + 1]):
                    key_index[width] = j
                    width += 1
            for f in range(k):
                src = z_t[f]
                dst = keys_z[f]
                for t in range(width):
                    dst[t] = src[key_index[t]]
            for c in range(p):
                src = values_t[c]
                dst = keys_v[c]
                for t in range(width):
                    dst[t] = src[key_index[t]]
            for t in range(width):
                keys_x[t] = points[key_index[t]]
            for a in range(d):
                dst = keys_x_t[a]
                for t in range(width):
                    dst[t] = points[key_index[t], a]
            for r in range(nb):
                own = rows[i0 + r]
                at = np.searchsorted(key_index[:width], own)  # ascending: leaves in order
                own_at[r] = at if at < width and key_index[at] == own else -1
            keys_c[:width] = 0.0
            sse += _tile_rows_pass(
                z_t,
                rows,
                i0,
                nb,
                keys_z,
                keys_v,
                keys_x,
                keys_x_t,
                width,
                own_at,
                targets,
                points,
                use_gemm,
                gemm_max_radius2,
                refine_max_radius2,
                scratch,
                flat[: nb * width].reshape((nb, width)) if use_gemm else flat.reshape((0, 0)),
                keys_c,
                partial_m[group],
                far,
            )
            for t in range(width):
                c_sum[key_index[t]] += keys_c[t]
        partial_sse[group] = sse
    return partial_sse.sum(), partial_m.sum(axis=0), partial_c.sum(axis=0), far
