"""Streaming local-polynomial regression with a mixed-type product kernel (CPU).

For a query q and keys k_j with values y_j the score of a pair is the log of
a product kernel (statsmodels ``KernelReg`` / R ``np`` conventions)

    s_j = sum_c log K(d_jc) + sum_k log L_k(q_k, k_jk) + log w_j

over the continuous columns c (``d_jc = (k_jc - q_c) / h_c``, already scaled
by the caller) and the categorical columns k, with ``log w_j`` the key's
log sample weight (-inf excludes it). Continuous kernels (``kernel``):

    0 gaussian      log K(d) = -d^2 / 2
    1 epanechnikov  log K(d) = log(1 - d^2)           (|d| < 1, else -inf)
    2 tricube       log K(d) = 3 log(1 - |d|^3)       (|d| < 1, else -inf)

(constant factors cancel in the softmax). Categorical columns carry three
numbers per column, ``cat_params[k] = (a, b, t)``: the term is ``a`` when the
codes are equal and ``b + t |q_k - k_jk|`` otherwise, which covers
Aitchison-Aitken (a = log(1-l), b = log(l/(c-1)), t = 0) and Wang-van Ryzin
(a = log(1-l), b = log((1-l)/2), t = log l). A missing entry (NaN, on either
side) leaves its column's term out.

Per query one streaming pass over blocks of ``config.KEY_BLOCK`` keys keeps
the online-softmax state (running maximum ``m``, rescaled sums) of the
weighted moments of the local design x_j = (1, d_j, [d_jc d_jc' for c <= c'])
(degree 0, 1 or 2; ``p`` terms):

    M = sum_j w_j x_j x_j^T,    V = sum_j w_j x_j y_j^T,     w_j = exp(s_j - m)

and at the end solves the small system, normalised by l = sum_j w_j,

    (M/l + R) beta = V/l,       R = ridge * diag(0, M_11/l, ..., M_pp/l)

by a Cholesky factorisation; a term whose pivot is below
``config.LOCAL_PIVOT_TOL`` times its diagonal entry (its column within that
relative distance of the span of the earlier ones: a zero or constant column,
fewer distinct neighbours than terms) is dropped (coefficient 0), like a
truncated pseudo-inverse, so a singular design shrinks towards the local
constant and never gives NaN. ``beta`` holds the fit (beta[0]) and the local
slopes in scaled units (divide by h). The relative ridge is invariant to the
units of every column.

A query with no key of positive weight (compact kernels outside the support,
categorical exact matching, all keys excluded or of weight 0) gets its
nearest admissible key's value (fewest unequal categories, then smallest
sum of d^2; the first on ties); ``nearest`` reports that key (else -1) and
``log_norm`` is -inf there. A query with no admissible key at all gets 0.

All arithmetic is float64 (the local solve needs it); callers cast outputs.
Layouts (C-contiguous, float64): ``q_cont`` (n_q, dc), ``keys_cont_t``
(dc, n_k), ``q_cat`` (n_q, dk), ``keys_cat_t`` (dk, n_k), ``cat_params``
(dk, 3), ``log_weights`` (n_k,), ``values_t`` (n_out, n_k).

The second-pass kernels (``local_loo_gradient``, ``local_interval_sums``)
recompute the weights p_j = exp(s_j - shift - log_norm) from the first pass's
state and the equivalent-kernel weights l_j = p_j (g . x_j), g = (M/l + R)^-1 e_1.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, fmax

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK
_PIVOT_TOL = config.LOCAL_PIVOT_TOL

GAUSSIAN, EPANECHNIKOV, TRICUBE = 0, 1, 2
#: Continuous kernels by name -> the code the kernels take.
KERNEL_CODES = {"gaussian": GAUSSIAN, "epanechnikov": EPANECHNIKOV, "tricube": TRICUBE}


def n_terms(dc: int, degree: int) -> int:
    """Number of terms of the local design: 1, 1 + dc, or 1 + dc + dc (dc + 1) / 2."""
    if degree == 0 or dc == 0:
        return 1
    if degree == 1:
        return 1 + dc
    return 1 + dc + dc * (dc + 1) // 2


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _n_terms(dc, degree):
    if degree == 0 or dc == 0:
        return 1
    if degree == 1:
        return 1 + dc
    return 1 + dc + dc * (dc + 1) // 2


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _dlog_kernel(d, kernel):
    """s'(d), the derivative of log K(d) (0 outside a compact support)."""
    if kernel == GAUSSIAN:
        return -d
    if kernel == EPANECHNIKOV:
        d2 = d * d
        if d2 >= 1.0:
            return 0.0
        return -2.0 * d / (1.0 - d2)
    a = abs(d)
    a3 = a * a * a
    if a3 >= 1.0:
        return 0.0
    return -9.0 * d * a / (1.0 - a3)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _block(
    i,
    j0,
    nb,
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    weighted,
    kernel,
    degree,
    exclude_self,
    missing,
    scores,
    design,
    store_design=True,
):
    """Scores of keys j0 .. j0+nb-1 for query i into ``scores``, the scaled differences
    into ``design[1 : 1 + dc]`` (0 where missing) and the quadratic terms after them
    (``design[0]`` is scratch: the constant term is implicit). ``weighted``: whether
    ``log_weights`` holds anything but zeros. With ``store_design`` False (only without
    missing values) the design rows are left unwritten: the caller reads the differences
    from the keys itself. Returns the block's maximum score (-inf when no key is
    admissible)."""
    dc = keys_cont_t.shape[0]
    dk = keys_cat_t.shape[0]
    if weighted:
        for j in range(nb):
            scores[j] = log_weights[j0 + j]
    else:
        for j in range(nb):
            scores[j] = 0.0
    if kernel == GAUSSIAN:
        for c in range(dc):
            qc = q_cont[i, c]
            kc = keys_cont_t[c, j0 : j0 + nb]
            row = design[1 + c]
            if missing:
                if qc != qc:
                    for j in range(nb):
                        row[j] = 0.0
                    continue
                for j in range(nb):
                    d = kc[j] - qc
                    if d != d:
                        d = 0.0
                    row[j] = d
                    scores[j] -= 0.5 * d * d
            elif store_design:
                for j in range(nb):
                    d = kc[j] - qc
                    row[j] = d
                    scores[j] -= 0.5 * d * d
            else:
                for j in range(nb):
                    d = kc[j] - qc
                    scores[j] -= 0.5 * d * d
    elif dc > 0:
        # Compact kernels: the product in the linear domain, one log per pair.
        prod = design[0]
        for j in range(nb):
            prod[j] = 1.0
        for c in range(dc):
            qc = q_cont[i, c]
            kc = keys_cont_t[c, j0 : j0 + nb]
            row = design[1 + c]
            if missing and qc != qc:
                for j in range(nb):
                    row[j] = 0.0
                continue
            for j in range(nb):
                d = kc[j] - qc
                if missing and d != d:
                    d = 0.0
                if store_design:
                    row[j] = d
                if kernel == EPANECHNIKOV:
                    f = 1.0 - d * d
                else:
                    a = abs(d)
                    f = 1.0 - a * a * a
                    f = f * f * f
                prod[j] *= f if f > 0.0 else 0.0
        for j in range(nb):
            scores[j] += np.log(prod[j]) if prod[j] > 0.0 else -np.inf
    for k in range(dk):
        qk = q_cat[i, k]
        if missing and qk != qk:
            continue
        a_eq = cat_params[k, 0]
        b_ne = cat_params[k, 1]
        t_step = cat_params[k, 2]
        kk = keys_cat_t[k, j0 : j0 + nb]
        if missing:
            for j in range(nb):
                x = kk[j]
                if x == qk:
                    scores[j] += a_eq
                elif x == x:  # not missing
                    scores[j] += b_ne + t_step * fmax(abs(x - qk), 1.0)
        elif t_step == 0.0:
            for j in range(nb):
                scores[j] += a_eq if kk[j] == qk else b_ne
        else:
            # |x - q| >= 1 where the codes differ, so t = -inf (l = 0) never meets 0 there
            for j in range(nb):
                x = kk[j]
                scores[j] += a_eq if x == qk else b_ne + t_step * fmax(abs(x - qk), 1.0)
    if exclude_self and j0 <= i < j0 + nb:
        scores[i - j0] = -np.inf
    p = design.shape[0]
    if degree >= 2 and p > 1:
        t = 1 + dc
        for c in range(dc):
            for c2 in range(c, dc):
                for j in range(nb):
                    design[t, j] = design[1 + c, j] * design[1 + c2, j]
                t += 1
    best = -np.inf
    for j in range(nb):
        best = fmax(best, scores[j])  # maxnum vectorises; scores are never NaN
    return best


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _any_weight(log_weights):
    """Whether any key has a log weight other than 0 (the unweighted case skips them)."""
    for j in range(log_weights.shape[0]):
        if log_weights[j] != 0.0:
            return True
    return False


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _solve(moments, rhs, ridge, g, beta, a, keep, z):
    """Solve (M + ridge diag(0, M_11, ...)) [g, beta] = [e_1, rhs] by Cholesky; non-positive
    pivots drop their term (coefficient 0). ``a`` (p, p), ``keep`` (p,) and ``z`` (p,) are
    scratch (the caller's, so that a query allocates nothing). The factor's diagonal is
    stored as its reciprocal: one division per term instead of one per entry (the solve is
    a chain of dependent operations, so its latency, not its flops, is what a query pays)."""
    p = moments.shape[0]
    n_out = rhs.shape[1]
    for t in range(p):  # explicit loops: numba's slice assignment costs more at p <= 10
        for u in range(p):
            a[t, u] = moments[t, u]
        keep[t] = True
    for t in range(1, p):
        a[t, t] += ridge * a[t, t]
    for t in range(p):
        for u in range(t):
            if not keep[u]:
                continue
            a[t, t] -= a[t, u] * a[t, u]
        diag_scale = moments[t, t] * (1.0 + ridge)
        if not (a[t, t] > _PIVOT_TOL * diag_scale) or not (diag_scale > 0.0):
            keep[t] = False
            for v in range(t, p):
                a[v, t] = 0.0
            continue
        a[t, t] = 1.0 / np.sqrt(a[t, t])
        for v in range(t + 1, p):
            acc = a[v, t]
            for u in range(t):
                acc -= a[v, u] * a[t, u]
            a[v, t] = acc * a[t, t]
    # forward and back substitution for e_1 and each output
    for col in range(n_out + 1):
        for t in range(p):
            z[t] = 0.0
        for t in range(p):
            if not keep[t]:
                continue
            acc = (1.0 if t == 0 else 0.0) if col == 0 else rhs[t, col - 1]
            for u in range(t):
                acc -= a[t, u] * z[u]
            z[t] = acc * a[t, t]
        for t in range(p - 1, -1, -1):
            if not keep[t]:
                z[t] = 0.0
                continue
            acc = z[t]
            for u in range(t + 1, p):
                acc -= a[u, t] * z[u]
            z[t] = acc * a[t, t]
        if col == 0:
            for t in range(p):
                g[t] = z[t]
        else:
            for t in range(p):
                beta[t, col - 1] = z[t]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _nearest(i, q_cont, keys_cont_t, q_cat, keys_cat_t, log_weights, exclude_self, missing):
    """The admissible key nearest query i: fewest unequal categories, then smallest
    sum of squared scaled differences; -1 when no key is admissible."""
    n_k = log_weights.shape[0]
    best = -1
    best_mis = np.inf
    best_dist = np.inf
    for j in range(n_k):
        if log_weights[j] == -np.inf or (exclude_self and j == i):
            continue
        mis = 0.0
        for k in range(keys_cat_t.shape[0]):
            x = keys_cat_t[k, j]
            qk = q_cat[i, k]
            if x == x and qk == qk and x != qk:
                mis += 1.0
        dist = 0.0
        for c in range(keys_cont_t.shape[0]):
            d = keys_cont_t[c, j] - q_cont[i, c]
            if d == d:
                dist += d * d
        if mis < best_mis or (mis == best_mis and dist < best_dist):
            best, best_mis, best_dist = j, mis, dist
    return best


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _fused_moments(scores, rows, offsets, y, nb, m, p, moments, rhs):
    """All moments of a block in one pass with register accumulators, for one output and
    p = 2 to 5 terms (local-linear in 1-4 columns, local-quadratic in one): the
    general path makes one pass per moment. Term t >= 1 of key j is
    ``rows[t - 1][j] - offsets[t - 1]``: the key rows and the query's coordinates (the
    differences computed here, never stored), or the design rows and zeros."""
    if p == 2:
        s00 = s01 = s11 = v0 = v1 = 0.0
        x1 = rows[0]
        o1 = offsets[0]
        for j in range(nb):
            w = fast_exp(scores[j] - m)
            a = x1[j] - o1
            wa = w * a
            s00 += w
            s01 += wa
            s11 += wa * a
            v0 += w * y[j]
            v1 += wa * y[j]
        moments[0, 0] += s00
        moments[0, 1] += s01
        moments[1, 1] += s11
        rhs[0, 0] += v0
        rhs[1, 0] += v1
    elif p == 3:
        s00 = s01 = s02 = s11 = s12 = s22 = v0 = v1 = v2 = 0.0
        x1 = rows[0]
        o1 = offsets[0]
        x2 = rows[1]
        o2 = offsets[1]
        for j in range(nb):
            w = fast_exp(scores[j] - m)
            a = x1[j] - o1
            b = x2[j] - o2
            wa = w * a
            wb = w * b
            wy = w * y[j]
            s00 += w
            s01 += wa
            s02 += wb
            s11 += wa * a
            s12 += wa * b
            s22 += wb * b
            v0 += wy
            v1 += wy * a
            v2 += wy * b
        moments[0, 0] += s00
        moments[0, 1] += s01
        moments[0, 2] += s02
        moments[1, 1] += s11
        moments[1, 2] += s12
        moments[2, 2] += s22
        rhs[0, 0] += v0
        rhs[1, 0] += v1
        rhs[2, 0] += v2
    elif p == 4:
        s00 = s01 = s02 = s03 = s11 = s12 = s13 = s22 = s23 = s33 = 0.0
        v0 = v1 = v2 = v3 = 0.0
        x1 = rows[0]
        o1 = offsets[0]
        x2 = rows[1]
        o2 = offsets[1]
        x3 = rows[2]
        o3 = offsets[2]
        for j in range(nb):
            w = fast_exp(scores[j] - m)
            a = x1[j] - o1
            b = x2[j] - o2
            c = x3[j] - o3
            wa = w * a
            wb = w * b
            wc = w * c
            wy = w * y[j]
            s00 += w
            s01 += wa
            s02 += wb
            s03 += wc
            s11 += wa * a
            s12 += wa * b
            s13 += wa * c
            s22 += wb * b
            s23 += wb * c
            s33 += wc * c
            v0 += wy
            v1 += wy * a
            v2 += wy * b
            v3 += wy * c
        moments[0, 0] += s00
        moments[0, 1] += s01
        moments[0, 2] += s02
        moments[0, 3] += s03
        moments[1, 1] += s11
        moments[1, 2] += s12
        moments[1, 3] += s13
        moments[2, 2] += s22
        moments[2, 3] += s23
        moments[3, 3] += s33
        rhs[0, 0] += v0
        rhs[1, 0] += v1
        rhs[2, 0] += v2
        rhs[3, 0] += v3
    else:
        s00 = s01 = s02 = s03 = s04 = s11 = s12 = s13 = s14 = 0.0
        s22 = s23 = s24 = s33 = s34 = s44 = 0.0
        v0 = v1 = v2 = v3 = v4 = 0.0
        x1 = rows[0]
        o1 = offsets[0]
        x2 = rows[1]
        o2 = offsets[1]
        x3 = rows[2]
        o3 = offsets[2]
        x4 = rows[3]
        o4 = offsets[3]
        for j in range(nb):
            w = fast_exp(scores[j] - m)
            a = x1[j] - o1
            b = x2[j] - o2
            c = x3[j] - o3
            e = x4[j] - o4
            wa = w * a
            wb = w * b
            wc = w * c
            we = w * e
            wy = w * y[j]
            s00 += w
            s01 += wa
            s02 += wb
            s03 += wc
            s04 += we
            s11 += wa * a
            s12 += wa * b
            s13 += wa * c
            s14 += wa * e
            s22 += wb * b
            s23 += wb * c
            s24 += wb * e
            s33 += wc * c
            s34 += wc * e
            s44 += we * e
            v0 += wy
            v1 += wy * a
            v2 += wy * b
            v3 += wy * c
            v4 += wy * e
        moments[0, 0] += s00
        moments[0, 1] += s01
        moments[0, 2] += s02
        moments[0, 3] += s03
        moments[0, 4] += s04
        moments[1, 1] += s11
        moments[1, 2] += s12
        moments[1, 3] += s13
        moments[1, 4] += s14
        moments[2, 2] += s22
        moments[2, 3] += s23
        moments[2, 4] += s24
        moments[3, 3] += s33
        moments[3, 4] += s34
        moments[4, 4] += s44
        rhs[0, 0] += v0
        rhs[1, 0] += v1
        rhs[2, 0] += v2
        rhs[3, 0] += v3
        rhs[4, 0] += v4


@njit(fastmath=config.FASTMATH, cache=config.CACHE, parallel=True)
def local_fit(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    values_t,
    kernel,
    degree,
    exclude_self,
    missing,
    ridge,
    want_mfx,
):
    """The first pass: per query the local fit, its coefficients and the softmax state.

    Returns
    -------
    beta : (n_q, p, n_out)   coefficients in scaled units (beta[:, 0] is the fit)
    g : (n_q, p)             (M/l + R)^-1 e_1, the equivalent-kernel vector
    shift : (n_q,)           the running maximum m of the scores
    log_norm : (n_q,)        log l = log sum_j exp(s_j - m); -inf when the fit fell back
    nearest : (n_q,) int64   the fallback key (module docstring), else -1
    mfx : (n_q, dc, n_out)   with ``want_mfx`` and degree 0: d fit / d q (scaled units),
                             sum_j p_j (y_j - fit) ds_j/dq; zeros otherwise
    """
    n_q = q_cont.shape[0]
    dc = keys_cont_t.shape[0]
    n_k = log_weights.shape[0]
    weighted = _any_weight(log_weights)
    n_out = values_t.shape[0]
    p = _n_terms(dc, degree)
    beta = np.zeros((n_q, p, n_out))
    g = np.zeros((n_q, p))
    shift = np.full(n_q, -np.inf)
    log_norm = np.full(n_q, -np.inf)
    nearest = np.full(n_q, -1, dtype=np.int64)
    mfx = np.zeros((n_q, dc, n_out))
    do_mfx = want_mfx and p == 1 and dc > 0
    fused = n_out == 1 and 2 <= p <= 5
    # without missing values the local-linear moments and the local constant read the
    # differences from the keys: the design rows are never written (one pass less)
    store_design = missing or do_mfx or (p > 1 and degree >= 2) or (p > 1 and not fused)
    n_chunks = (n_q + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for chunk in prange(n_chunks):
        scores = np.empty(_KEY_BLOCK)
        wx = np.empty(_KEY_BLOCK)
        design = np.empty((max(p, 1 + dc), _KEY_BLOCK))
        moments = np.empty((p, p))
        rhs = np.empty((p, n_out))
        scratch = np.empty((p, p))
        keep = np.empty(p, dtype=np.bool_)
        z = np.empty(p)
        dsum = np.empty(dc)
        dysum = np.empty((dc, n_out))
        stop = min(n_q, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            for a in range(p):  # explicit loops: slice assignment costs more per query
                for b in range(p):
                    moments[a, b] = 0.0
                for o in range(n_out):
                    rhs[a, o] = 0.0
            for c in range(dc):
                dsum[c] = 0.0
                for o in range(n_out):
                    dysum[c, o] = 0.0
            m = -np.inf
            for j0 in range(0, n_k, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_k - j0)
                block_max = _block(
                    i,
                    j0,
                    nb,
                    q_cont,
                    keys_cont_t,
                    q_cat,
                    keys_cat_t,
                    cat_params,
                    log_weights,
                    weighted,
                    kernel,
                    degree,
                    exclude_self,
                    missing,
                    scores,
                    design,
                    store_design,
                )
                if block_max == -np.inf:
                    continue
                if block_max > m:
                    if m > -np.inf:
                        factor = np.exp(m - block_max)
                        moments *= factor
                        rhs *= factor
                        dsum *= factor
                        dysum *= factor
                    m = block_max
                if fused:
                    y = values_t[0, j0 : j0 + nb]
                    if store_design:  # rows past the last term repeat it (never read)
                        rows = (
                            design[1, 0:nb],
                            design[min(2, p - 1), 0:nb],
                            design[min(3, p - 1), 0:nb],
                            design[min(4, p - 1), 0:nb],
                        )
                        offsets = (0.0, 0.0, 0.0, 0.0)
                    else:  # rows past the last column repeat it (never read)
                        c1, c2, c3 = min(1, dc - 1), min(2, dc - 1), min(3, dc - 1)
                        rows = (
                            keys_cont_t[0, j0 : j0 + nb],
                            keys_cont_t[c1, j0 : j0 + nb],
                            keys_cont_t[c2, j0 : j0 + nb],
                            keys_cont_t[c3, j0 : j0 + nb],
                        )
                        offsets = (q_cont[i, 0], q_cont[i, c1], q_cont[i, c2], q_cont[i, c3])
                    _fused_moments(scores, rows, offsets, y, nb, m, p, moments, rhs)
                    continue
                if p == 1 and n_out == 1 and not do_mfx:
                    # local constant, one output: the sum and the weighted sum in one pass
                    y = values_t[0, j0 : j0 + nb]
                    total = 0.0
                    acc = 0.0
                    for j in range(nb):
                        w = fast_exp(scores[j] - m)
                        total += w
                        acc += w * y[j]
                    moments[0, 0] += total
                    rhs[0, 0] += acc
                    continue
                total = 0.0
                for j in range(nb):
                    w = fast_exp(scores[j] - m)
                    scores[j] = w
                    total += w
                moments[0, 0] += total
                for o in range(n_out):
                    yo = values_t[o, j0 : j0 + nb]
                    acc = 0.0
                    for j in range(nb):
                        acc += scores[j] * yo[j]
                    rhs[0, o] += acc
                for a in range(1, p):
                    # wx[j] = w_j x_ja, then one dot product per moment
                    xa = design[a]
                    for j in range(nb):
                        wx[j] = scores[j] * xa[j]
                    acc = 0.0
                    for j in range(nb):
                        acc += wx[j]
                    moments[0, a] += acc
                    for b in range(a, p):
                        xb = design[b]
                        acc = 0.0
                        for j in range(nb):
                            acc += wx[j] * xb[j]
                        moments[a, b] += acc
                    for o in range(n_out):
                        yo = values_t[o, j0 : j0 + nb]
                        acc = 0.0
                        for j in range(nb):
                            acc += wx[j] * yo[j]
                        rhs[a, o] += acc
                if do_mfx:
                    for c in range(dc):
                        row = design[1 + c]
                        acc = 0.0
                        for j in range(nb):
                            ds = -_dlog_kernel(row[j], kernel)
                            row[j] = ds * scores[j]
                            acc += row[j]
                        dsum[c] += acc
                        for o in range(n_out):
                            yo = values_t[o, j0 : j0 + nb]
                            acc = 0.0
                            for j in range(nb):
                                acc += row[j] * yo[j]
                            dysum[c, o] += acc
            total = moments[0, 0]
            if not (total > 0.0):
                near = _nearest(
                    i, q_cont, keys_cont_t, q_cat, keys_cat_t, log_weights, exclude_self, missing
                )
                nearest[i] = near
                if near >= 0:
                    g[i, 0] = 1.0
                    for o in range(n_out):
                        beta[i, 0, o] = values_t[o, near]
                continue
            inv = 1.0 / total
            for a in range(p):
                for b in range(a, p):
                    moments[b, a] = moments[a, b] * inv
                    moments[a, b] = moments[b, a]
                for o in range(n_out):
                    rhs[a, o] *= inv
            if p == 1:  # the local constant: M/l = 1, nothing to factorise
                g[i, 0] = 1.0
                for o in range(n_out):
                    beta[i, 0, o] = rhs[0, o]
            else:
                _solve(moments, rhs, ridge, g[i], beta[i], scratch, keep, z)
            shift[i] = m
            log_norm[i] = np.log(total)
            if do_mfx:
                for c in range(dc):
                    for o in range(n_out):
                        mfx[i, c, o] = (dysum[c, o] - beta[i, 0, o] * dsum[c]) * inv
    return beta, g, shift, log_norm, nearest, mfx


@njit(fastmath=config.FASTMATH, cache=config.CACHE, parallel=True)
def local_loo_gradient(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    values_t,
    cat_dparams,
    kernel,
    degree,
    exclude_self,
    missing,
    ridge,
    beta,
    g,
    shift,
    log_norm,
    out_weights,
):
    """The second pass: per query sum_o e_o d fit_o / d theta for every width parameter.

    theta = (log h_1 .. log h_dc, t_1 .. t_dk): log widths of the continuous
    columns, then one parameter per categorical column whose score terms have
    the derivatives ``cat_dparams[k] = (da, db, dt)`` (see module docstring for
    a, b, t). With p_j the normalised weights, x_j the design, c_j = g . x_j,
    r_jo = y_jo - beta_o . x_j and ds_j the score's derivative,

        d fit_o = sum_j dp_j [c_j r_jo - ridge sum_{t>=1} g_t beta_to x_jt^2],
        dp_j    = p_j (ds_j - sum_k p_k ds_k)

    (the derivative of (M/l + R)^-1 V/l, R the relative ridge). Queries that fell
    back to their nearest key (log_norm = -inf) have zero derivative.
    Returns (n_q, dc + dk).
    """
    n_q = q_cont.shape[0]
    dc = keys_cont_t.shape[0]
    dk = keys_cat_t.shape[0]
    n_k = log_weights.shape[0]
    weighted = _any_weight(log_weights)
    n_out = values_t.shape[0]
    p = beta.shape[1]
    n_par = dc + dk
    out = np.zeros((n_q, n_par))
    n_chunks = (n_q + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for chunk in prange(n_chunks):
        scores = np.empty(_KEY_BLOCK)
        design = np.empty((max(p, 1 + dc), _KEY_BLOCK))
        coef = np.empty(_KEY_BLOCK)
        cvec = np.empty(_KEY_BLOCK)
        fit = np.empty(_KEY_BLOCK)
        pen = np.empty(_KEY_BLOCK)
        a_sum = np.empty(n_par)
        s_sum = np.empty(n_par)
        stop = min(n_q, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            if log_norm[i] == -np.inf:
                continue
            a_sum[:] = 0.0
            s_sum[:] = 0.0
            a_total = 0.0
            offset = shift[i] + log_norm[i]
            for j0 in range(0, n_k, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_k - j0)
                block_max = _block(
                    i,
                    j0,
                    nb,
                    q_cont,
                    keys_cont_t,
                    q_cat,
                    keys_cat_t,
                    cat_params,
                    log_weights,
                    weighted,
                    kernel,
                    degree,
                    exclude_self,
                    missing,
                    scores,
                    design,
                )
                if block_max == -np.inf:
                    continue
                for j in range(nb):
                    scores[j] = fast_exp(scores[j] - offset)
                # coef_j = p_j sum_o e_o [c_j r_jo - ridge sum_t g_t beta_to x_jt^2]
                for j in range(nb):
                    cvec[j] = g[i, 0]
                    coef[j] = 0.0
                for t in range(1, p):
                    gt = g[i, t]
                    xt = design[t]
                    for j in range(nb):
                        cvec[j] += gt * xt[j]
                for o in range(n_out):
                    e = out_weights[i, o]
                    if e == 0.0:
                        continue
                    y = values_t[o, j0 : j0 + nb]
                    b0 = beta[i, 0, o]
                    for j in range(nb):
                        fit[j] = b0
                        pen[j] = 0.0
                    for t in range(1, p):
                        bt = beta[i, t, o]
                        gbt = g[i, t] * bt
                        xt = design[t]
                        for j in range(nb):
                            fit[j] += bt * xt[j]
                            pen[j] += gbt * xt[j] * xt[j]
                    for j in range(nb):
                        coef[j] += e * (cvec[j] * (y[j] - fit[j]) - ridge * pen[j])
                for j in range(nb):
                    coef[j] *= scores[j]
                    a_total += coef[j]
                for c in range(dc):
                    qc = q_cont[i, c]
                    if missing and qc != qc:
                        continue
                    row = design[1 + c]
                    acc_a = 0.0
                    acc_s = 0.0
                    for j in range(nb):
                        d = row[j]
                        ds = -d * _dlog_kernel(d, kernel)
                        acc_a += coef[j] * ds
                        acc_s += scores[j] * ds
                    a_sum[c] += acc_a
                    s_sum[c] += acc_s
                for k in range(dk):
                    qk = q_cat[i, k]
                    if missing and qk != qk:
                        continue
                    da = cat_dparams[k, 0]
                    db = cat_dparams[k, 1]
                    dt = cat_dparams[k, 2]
                    acc_a = 0.0
                    acc_s = 0.0
                    for j in range(nb):
                        x = keys_cat_t[k, j0 + j]
                        if x == qk:
                            ds = da
                        elif x == x:
                            ds = db + dt * abs(x - qk)
                        else:
                            ds = 0.0
                        acc_a += coef[j] * ds
                        acc_s += scores[j] * ds
                    a_sum[dc + k] += acc_a
                    s_sum[dc + k] += acc_s
            for t in range(n_par):
                out[i, t] = a_sum[t] - a_total * s_sum[t]
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, parallel=True)
def local_interval_sums(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    residuals_t,
    kernel,
    degree,
    exclude_self,
    missing,
    g,
    shift,
    log_norm,
    nearest,
):
    """Per query and output sum_j l_j^2 r_jo^2, with l_j = p_j (g . x_j) the
    equivalent-kernel weights of the first pass (the nearest key's weight is 1
    for a query that fell back). ``residuals_t`` (n_out, n_k). Returns (n_q, n_out).
    """
    n_q = q_cont.shape[0]
    dc = keys_cont_t.shape[0]
    n_k = log_weights.shape[0]
    weighted = _any_weight(log_weights)
    n_out = residuals_t.shape[0]
    p = g.shape[1]
    out = np.zeros((n_q, n_out))
    n_chunks = (n_q + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for chunk in prange(n_chunks):
        scores = np.empty(_KEY_BLOCK)
        design = np.empty((max(p, 1 + dc), _KEY_BLOCK))
        stop = min(n_q, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            if log_norm[i] == -np.inf:
                near = nearest[i]
                if near >= 0:
                    for o in range(n_out):
                        out[i, o] = residuals_t[o, near] ** 2
                continue
            offset = shift[i] + log_norm[i]
            for j0 in range(0, n_k, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_k - j0)
                block_max = _block(
                    i,
                    j0,
                    nb,
                    q_cont,
                    keys_cont_t,
                    q_cat,
                    keys_cat_t,
                    cat_params,
                    log_weights,
                    weighted,
                    kernel,
                    degree,
                    exclude_self,
                    missing,
                    scores,
                    design,
                )
                if block_max == -np.inf:
                    continue
                for j in range(nb):
                    cj = g[i, 0]
                    for t in range(1, p):
                        cj += g[i, t] * design[t, j]
                    lj = fast_exp(scores[j] - offset) * cj
                    scores[j] = lj * lj
                for o in range(n_out):
                    r = residuals_t[o, j0 : j0 + nb]
                    acc = 0.0
                    for j in range(nb):
                        acc += scores[j] * r[j] * r[j]
                    out[i, o] += acc
    return out
