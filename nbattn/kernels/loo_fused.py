"""The fused direct passes of the LOO tiles: two query rows at a time over L1-sized chunks.

With direct scores (few score dimensions, ``nbattn.kernels.loo_tiles``) a tile's
rows go through two passes over their keys, two rows at a time (each key loaded
once for both), the keys in chunks of ``_CHUNK`` that stay in L1 between the
steps of a pass:

  pass A (per chunk): the scores by differences, four coordinates per sweep, then
      w_ij = exp(s_ij) with the row sum l_i and the weighted sum, in one loop;
  pass B (per chunk): g_ij = (w_ij / l_i) sum_c r_ic (y_jc - f_ic), the key sums c_j,
      a_i = sum_j g_ij and b_i = sum_j g_ij x_j as d dot products (no tile GEMM).

Reference 0. Pass A (and the exp pass of the GEMM scores when they are not
refined) takes 0 as the softmax's reference instead of the row's best score: a
Gaussian score is <= 0, so exp(s_ij) cannot overflow, no pass over the row looks
for its maximum, and the weights are as accurate as exp(s_ij - best) (the same
absolute error of s_ij, one rounding fewer). A row whose weights sum to
l_i >= ``_ZERO_REF_MIN_SUM`` = e^-600 has its best score above -600 - log(n): the
keys whose exp underflows (s_ij < -708.39) weigh below e^-64 of its largest
(n < 2^63). One with l_i below 2^-64 (``_UNIT_SUM_MIN``) is divided by l_i first
(``_bounded_sums``), so that 1 / l_i <= 2^64 in every later product and cannot
overflow against a residual whatever the order fastmath picks. A row with
l_i < e^-600 is scored again by differences and takes exp(s_ij - best)
(``_shifted_row``); one whose best is below -FAR_SCORE_FLOAT64 is left to the
caller. (A running maximum in the exp loop would also stop LLVM from
vectorising it.) ``reference_zero_sums`` applies these rules to a row.

The row part of M keeps a_i x_i x_i^T although a_i is zero in exact arithmetic
(the weights sum to 1 and f_i is their mean of y): with it the expansion is
exact for the rounded g_ij, and points far from the origin lose fewer digits
(``add_row_part``, shared with the GEMM tiles).

Arguments come in the groups of ``nbattn.kernels.loo_tile_groups``; the
per-thread scratch of the passes is a :data:`PairWork`.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from .. import config
from .fastmath import fast_exp
from .softmax import row_max

_FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)

_CHUNK = 512
_ZERO_REF_MIN_SUM = float(np.exp(-600.0))
_UNIT_SUM_MIN = 2.0**-64

#: The per-thread scratch of :func:`direct_rows_pass`: ``weights`` (2, n) the pair's
#: weights, then their g; ``sums`` (2, 2) each row's (l, sum_j w_j y_j0) from pass A;
#: ``coef`` (2, 1 + p) each row's (1 / l, r); ``f_rows`` (2, p) each row's f; ``gx``
#: (2, d) each row's b = sum_j g_j x_j and ``row_g`` (2,) its a = sum_j g_j.
PairWork = namedtuple("PairWork", ("weights", "sums", "coef", "f_rows", "gx", "row_g"))


@njit(cache=config.CACHE)
def pair_work(n, p, d):
    """A :data:`PairWork` for up to ``n`` keys, ``p`` outputs and ``d`` coordinates."""
    return PairWork(
        np.empty((2, n)),
        np.empty((2, 2)),
        np.empty((2, 1 + p)),
        np.empty((2, p)),
        np.empty((2, d)),
        np.empty(2),
    )


# --------------------------------------------------------------------------- pass A


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


# --------------------------------------------------------------------------- reference 0


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


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def shifted_exp_sums(row, best, vals, width):
    """row[j] <- w_j = exp(row[j] - best) for j < ``width``; returns ``(sum_j w_j, sum_j
    w_j vals[j])``: the exp pass of a row with the weighted sum of its first output, in
    one loop."""
    total = 0.0
    weighted = 0.0
    for j in range(width):
        w = fast_exp(row[j] - best)
        row[j] = w
        total += w
        weighted += w * vals[j]
    return total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _shifted_row(z_t, own, keys, at, row):
    """Pass A for one row whose weights exp(s_j) sum below _ZERO_REF_MIN_SUM: row[j] <-
    exp(s_j - best) over the keys of ``keys`` (key ``own`` of ``z_t``, left out at
    ``at``); returns (best, l, sum_j w_j y_j0). Best below -FAR_SCORE_FLOAT64 (or no
    key): (best, 0, 0), the row's weights not set."""
    keys_z, keys_v, width = keys.z, keys.v, keys.width
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
    best = row_max(row[:width])
    if not best >= -_FAR_SCORE_FLOAT64:
        return best, 0.0, 0.0
    total, weighted = shifted_exp_sums(row, best, keys_v[0], width)
    return best, total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def reference_zero_sums(z_t, own, keys, at, row, total, weighted):
    """``(best, l, sum_j w_j y_j0)`` of a row after an exp pass with reference 0 gave
    ``row`` (its weights), ``total`` and ``weighted``: best 0 and the sums bounded by
    :func:`_bounded_sums`, or, below ``_ZERO_REF_MIN_SUM``, the row scored again with its
    best subtracted (:func:`_shifted_row`; key ``own`` of ``z_t``, left out at ``at`` of
    ``keys``). A best below -FAR_SCORE_FLOAT64 marks a row left to the caller."""
    if not total >= _ZERO_REF_MIN_SUM:  # far from its keys (or none)
        return _shifted_row(z_t, own, keys, at, row)
    total, weighted = _bounded_sums(row, keys.width, total, weighted)
    return 0.0, total, weighted


# --------------------------------------------------------------------------- pass B


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


@njit(cache=config.CACHE)
def _no_gradient(coef, f_rows, x):
    """Row ``x`` of a pair contributes nothing to pass B."""
    coef[x, :] = 0.0
    f_rows[x, :] = 0.0


# -------------------------------------------------- shared with the GEMM tiles, and the body


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def weighted_outputs(row, keys_v, width, first, f_row):
    """f_row[c] <- sum_j row[j] y_jc over the first ``width`` keys; with one output
    ``first``, that sum already taken by the exp pass."""
    p = keys_v.shape[0]
    if p == 1:
        f_row[0] = first
        return
    for c in range(p):
        vals = keys_v[c]
        weighted = 0.0
        for j in range(width):
            weighted += row[j] * vals[j]
        f_row[c] = weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def add_row_part(acc, a_r, x_r, b_r):
    """acc += a_r x_r x_r^T - x_r b_r^T - b_r x_r^T: one row's part of M (d, d)."""
    d = x_r.shape[0]
    for a in range(d):
        xa = x_r[a]
        for b in range(d):
            acc[a, b] += a_r * xa * x_r[b] - xa * b_r[b] - b_r[a] * x_r[b]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def direct_rows_pass(queries, i0, nb, keys, pair, sums):
    """The tile body on direct scores: rows ``queries.rows[i0:i0+nb]``, two at a time,
    against ``keys``; returns the squared-error sum and adds into ``sums`` as
    ``loo_tiles``' GEMM body does (:data:`TileQueries`, :data:`TileKeys`,
    :data:`TileSums` of ``loo_tile_groups``; ``pair`` the thread's :data:`PairWork`)."""
    z_t, rows, targets, points = queries.z_t, queries.rows, queries.targets, queries.points
    keys_z, keys_v, keys_x_t, width, own_at = keys.z, keys.v, keys.x_t, keys.width, keys.own_at
    weights, pair_sums, coef, f_rows, gx, row_g = pair
    key_sums, acc, far = sums.key_sums, sums.acc, sums.far
    p = keys_v.shape[0]
    sse = 0.0
    row_a = weights[0]
    row_b = weights[1]
    for r0 in range(0, nb, 2):
        second = r0 + 1 < nb
        own_a = rows[i0 + r0]
        own_b = rows[i0 + r0 + 1] if second else own_a
        at_b = own_at[r0 + 1] if second else own_at[r0]
        _pair_exp_pass(
            z_t, own_a, own_b, keys_z, keys_v, width, own_at[r0], at_b, row_a, row_b, pair_sums
        )
        for x in range(2):
            row = row_a if x == 0 else row_b
            if x == 1 and not second:  # the pair's second row repeats the first: no sums
                _no_gradient(coef, f_rows, np.int64(1))  # int64 like x: one compile
                continue
            best, total, weighted = reference_zero_sums(
                z_t, rows[i0 + r0 + x], keys, own_at[r0 + x], row, pair_sums[x, 0], pair_sums[x, 1]
            )
            if not best >= -_FAR_SCORE_FLOAT64:  # far, overflowing or no key
                far[i0 + r0 + x] = True
                row[:width] = 0.0
                _no_gradient(coef, f_rows, x)
                continue
            inv = 1.0 / total
            weighted_outputs(row, keys_v, width, weighted, f_rows[x])
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
            add_row_part(acc, row_g[x], points[rows[i0 + r0 + x]], gx[x])
    return sse
