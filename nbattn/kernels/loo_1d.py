"""The leave-one-out criterion of the 1-D width search, on sorted points.

``loo_bandwidth`` evaluates the LOO squared error of one scaled 1-D column
(``s_ij = -(zs_i - zs_j)^2``) at many widths. Three kernels serve it, each
returning ``sum_r sum_c (f_-i(zs_i)_c - targets[i, c])^2`` (i = ``rows[r]``) in
float64, as ``nbattn.kernels.loo.loo_squared_error`` would:

* ``loo_squared_error_sorted_1d``, the windowed direct kernel: per row only the
  window of keys whose weight can exceed exp(-gap) of the nearest one
  (``prune_gap_for`` gives the gap of each dtype), found by binary search;
* ``loo_squared_error_taylor_1d``, one Taylor series about the middle of the
  range, O(n) per width, for squared spans up to
  ``config.LOO_TAYLOR_MAX_SPAN_SQ`` (``taylor_terms`` picks its length);
* ``loo_squared_error_boxed_1d``, a one-dimensional fast Gauss transform: per
  box of width 1 in scaled units, a Hermite series of the keys within reach,
  with a proven error bound checked row by row (``hermite_terms``,
  ``hermite_rounding``, ``boxed_1d_plan``). ``loo_squared_error_boxed_rows_1d``
  runs it and sends the rows it cannot vouch for to the windowed kernel.

Far rows (the nearest neighbour beyond ``config.FAR_SCORE_<dtype>``) take the
path of ``pooling.pool_row``: the window in float64, or every key by the
anchored ``far_rows.far_pool``.

Tunables: ``config.KEY_BLOCK`` and ``QUERY_BLOCK`` are read when this module is
imported (compiled in as constants); ``config.PRUNE_GAP_<dtype>`` at call time
through :func:`prune_gap_for`, ``LOO_TAYLOR_MAX_SPAN_SQ`` through
:func:`taylor_terms`, and ``LOO_BOXED_HALF_WIDTH``, ``LOO_BOXED_TOL``,
``LOO_BOXED_REACH_GAP`` through :func:`boxed_1d_plan`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from .. import config
from .far_rows import far_pool
from .fastmath import fast_exp, like
from .items import next_item, run_items, sum_in_order
from .pooling import _FAR_SCORE_FLOAT64, far_score

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK


def prune_gap_for(dtype) -> float:
    """The ``prune_gap`` of ``loo_squared_error_sorted_1d`` for ``dtype``.

    ``config.PRUNE_GAP_FLOAT64`` / ``PRUNE_GAP_FLOAT32``, read at call time:
    a skipped key weighs < exp(-gap) of the nearest one, so n of them change
    the result by < n exp(-gap) relative, below each dtype's rounding.
    """
    name = np.dtype(dtype).name
    if name == "float32":
        return float(config.PRUNE_GAP_FLOAT32)
    if name == "float64":
        return float(config.PRUNE_GAP_FLOAT64)
    raise ValueError(f"dtype must be float32 or float64, got {name}")


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _window_sums(zs, values_t, zi, shift, start, stop, acc, weights):
    """Adds sum_j exp(shift - (zs_j - zi)^2) (returned) and its v-weighted sums (into acc).

    Computed in the dtype of the scratch buffer ``weights``. The loops run over slices
    from index 0: numba then knows no index is negative and drops the wraparound select
    that keeps a loop over ``zs[b0 + j]`` scalar. The loop that stores the weights sums
    nothing: a sum there would be vectorised behind a runtime check of the distance
    between ``weights`` and ``zs`` and fall back to the scalar order when they lie close,
    so its bits would depend on where the arrays were allocated. The weights' sum is
    taken in the first output's read-only loop instead.
    """
    total = 0.0
    zi = like(zi, weights)
    shift = like(shift, weights)
    for b0 in range(start, stop, _KEY_BLOCK):
        nb = min(stop - b0, _KEY_BLOCK)
        keys = zs[b0 : b0 + nb]
        for j in range(nb):
            diff = like(keys[j], weights) - zi
            weights[j] = fast_exp(shift - diff * diff)
        block = like(0.0, weights)
        values = values_t[0, b0 : b0 + nb]
        weighted = like(0.0, weights)
        for j in range(nb):
            block += weights[j]
            weighted += weights[j] * values[j]
        total += block
        acc[0] += weighted
        for c in range(1, values_t.shape[0]):
            values = values_t[c, b0 : b0 + nb]
            weighted = like(0.0, weights)
            for j in range(nb):
                weighted += weights[j] * values[j]
            acc[c] += weighted
    return total


def loo_squared_error_sorted_1d(zs, values_t, targets, rows, prune_gap):
    """The LOO squared-error sum of ``loo_squared_error`` for 1-D points, sorted.

    ``zs`` (n,) ascending, already scaled (s_ij = -(zs_i - zs_j)^2);
    ``values_t`` (p, n) and ``targets`` (n, p) in the same order; ``rows``
    the (sorted-order) rows left out and predicted, ``arange(n)`` for the
    exact LOO sum. The best score of row i is that of its nearest neighbour,
    -dmin_i^2 (an adjacent point), so only the keys with
    (zs_j - zs_i)^2 <= dmin_i^2 + prune_gap can matter: a window found by
    binary search. Weights are exp(s_ij + dmin_i^2) <= 1, so no online
    rescaling is needed. Cost: rows x (window width) instead of rows x n.
    Far rows as in ``pooling.pool_row``: dmin_i^2 beyond
    ``config.FAR_SCORE_FLOAT32`` in float32, the window in float64; beyond
    ``config.FAR_SCORE_FLOAT64`` (or overflowing), all keys by the anchored
    ``far_rows.far_pool``.
    """
    n_chunks = (rows.shape[0] + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    partial = np.zeros(n_chunks, dtype=np.float64)
    run_items(_sorted_items, zs, values_t, targets, rows, float(prune_gap), partial)
    return float(sum_in_order(partial))


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _sorted_items(counter, zs, values_t, targets, rows, prune_gap, partial):
    """The chunks of ``_QUERY_BLOCK`` rows of :func:`loo_squared_error_sorted_1d` taken
    from ``counter`` (``items.next_item``): each writes its squared-error sum into
    ``partial[chunk]``."""
    n = zs.shape[0]
    n_rows = rows.shape[0]
    n_outputs = values_t.shape[0]
    n_chunks = partial.shape[0]
    acc = np.empty(n_outputs, dtype=np.float64)
    weights = np.empty(_KEY_BLOCK, dtype=zs.dtype)
    scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        stop = min(n_rows, (chunk + 1) * _QUERY_BLOCK)
        sq = 0.0
        for r in range(chunk * _QUERY_BLOCK, stop):
            i = rows[r]
            acc[:] = 0.0
            if n == 1:  # no admissible key: predict 0
                for c in range(n_outputs):
                    sq += targets[i, c] * targets[i, c]
                continue
            zi = np.float64(zs[i])
            dmin = np.inf
            if i > 0:
                dmin = zi - zs[i - 1]
            if i + 1 < n:
                dmin = min(dmin, zs[i + 1] - zi)
            shift = dmin * dmin
            if not shift <= _FAR_SCORE_FLOAT64:  # far in float64, or overflowing
                _, total = far_pool(zs[i : i + 1], zs.reshape((1, n)), values_t, i, weights, acc)
            else:
                radius = np.sqrt(shift + prune_gap)
                lo = np.searchsorted(zs, like(zi - radius, zs), side="left")
                hi = np.searchsorted(zs, like(zi + radius, zs), side="right")
                if shift <= far_score(zs):
                    total = _window_sums(zs, values_t, zi, shift, lo, i, acc, weights)
                    total += _window_sums(zs, values_t, zi, shift, i + 1, hi, acc, weights)
                else:  # a float32 far row: the window in float64
                    total = _window_sums(zs, values_t, zi, shift, lo, i, acc, scores64)
                    total += _window_sums(zs, values_t, zi, shift, i + 1, hi, acc, scores64)
            for c in range(n_outputs):
                err = acc[c] / total - targets[i, c]
                sq += err * err
        partial[chunk] = sq


def taylor_terms(span_sq, dtype=np.float64) -> int:
    """Terms of :func:`loo_squared_error_taylor_1d` for points of squared span ``span_sq``
    (scaled), or 0 when the series is not used there (``span_sq`` above
    ``config.LOO_TAYLOR_MAX_SPAN_SQ``).

    With ``x = span_sq / 2`` bounding ``|2 u_i u_j|``, the weights' relative
    truncation error is at most ``x^p / p! * e^(2x)`` (``e^x`` for the remainder
    of the exponential series, ``e^x`` for the smallest weight relative to
    its series); p is the first to bring it below 2^-60.
    """
    limit = float(config.LOO_TAYLOR_MAX_SPAN_SQ)
    if not span_sq <= limit:
        return 0
    x = 0.5 * float(span_sq)
    bound, p = math.exp(2.0 * x), 0
    while bound > 2.0**-60:
        p += 1
        bound *= x / p
    return max(p, 1)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def loo_squared_error_taylor_1d(zs, values_t, targets, rows, n_terms):
    """The LOO squared-error sum of ``loo_squared_error`` for 1-D points of small span.

    ``zs`` (n,) already scaled (s_ij = -(zs_i - zs_j)^2; any order), ``values_t``
    (p, n), ``targets`` (n, p), ``rows`` the rows left out and predicted. With
    ``u = zs - m`` about the middle m of the range,

    .. math::

        e^{-(u_i - u_j)^2} = e^{-u_i^2} \\sum_{k \\ge 0} \\frac{(2 u_i)^k}{k!}\\,
            u_j^k e^{-u_j^2},

    so the moments ``N_k = sum_j u_j^k e^{-u_j^2}`` and
    ``M_kc = sum_j u_j^k e^{-u_j^2} v_jc`` (k < ``n_terms``), taken once, give
    every row's sums in O(n_terms) each; the row's own key (weight exactly 1)
    is taken out afterwards. Cost O(n * n_terms) instead of O(n^2): the wide
    end of the bandwidth search. The caller picks ``n_terms`` by
    :func:`taylor_terms` and uses it only where the span is small
    (``config.LOO_TAYLOR_MAX_SPAN_SQ``): then every weight is at least
    e^-span^2 and the alternating terms cancel by at most e^span^2, so the sums
    keep about 13 digits in float64. Computed in float64 whatever the dtype.
    """
    n = zs.shape[0]
    n_outputs = values_t.shape[0]
    lo, hi = np.float64(zs[0]), np.float64(zs[0])
    for j in range(n):
        lo = min(lo, np.float64(zs[j]))
        hi = max(hi, np.float64(zs[j]))
    middle = 0.5 * (lo + hi)
    den = np.zeros(n_terms, dtype=np.float64)
    num = np.zeros((n_outputs, n_terms), dtype=np.float64)
    for j in range(n):
        u = np.float64(zs[j]) - middle
        power = np.exp(-u * u)
        for k in range(n_terms):
            den[k] += power
            for c in range(n_outputs):
                num[c, k] += power * np.float64(values_t[c, j])
            power *= u
    acc = np.empty(n_outputs, dtype=np.float64)
    sq = 0.0
    for r in range(rows.shape[0]):
        i = rows[r]
        if n == 1:  # no admissible key: predict 0
            for c in range(n_outputs):
                sq += targets[i, c] * targets[i, c]
            continue
        u = np.float64(zs[i]) - middle
        coef = 1.0
        total = 0.0
        acc[:] = 0.0
        for k in range(n_terms):
            total += coef * den[k]
            for c in range(n_outputs):
                acc[c] += coef * num[c, k]
            coef *= 2.0 * u / (k + 1)
        scale = np.exp(-u * u)
        total = total * scale - 1.0  # without the row's own key, weight exp(0) = 1
        for c in range(n_outputs):
            err = (acc[c] * scale - np.float64(values_t[c, i])) / total - targets[i, c]
            sq += err * err
    return sq


# Cramér's inequality, |H_k(s)| e^{-s^2/2} <= _CRAMER * 2^{k/2} sqrt(k!) for the
# physicists' Hermite polynomials (Indritz 1961; the constant is 1.0864...).
_CRAMER = 1.0865
_HERMITE_BLOCK = 256


def hermite_terms(half_width, tolerance) -> int:
    """Terms p of :func:`loo_squared_error_boxed_1d` for boxes of half-width ``half_width``
    (scaled units), such that the truncated series of every weight is within
    ``tolerance * exp(-s^2 / 2)`` of it (s: the key's distance from the box centre).

    The remainder of ``e^{-(s - t)^2} = sum_k t^k / k! h_k(s)`` with
    ``h_k(s) = H_k(s) e^{-s^2}`` and ``|t| <= half_width = r`` is at most
    ``K e^{-s^2/2} sum_{k >= p} (sqrt(2) r)^k / sqrt(k!)`` by Cramér's inequality,
    and the sum at most its first term over ``1 - sqrt(2) r / sqrt(p + 1)``.
    """
    ratio = math.sqrt(2.0) * float(half_width)
    p = 1
    while True:
        q = ratio / math.sqrt(p + 1.0)
        if q < 1.0:
            tail = _CRAMER * math.exp(p * math.log(ratio) - 0.5 * math.lgamma(p + 1.0)) / (1 - q)
            if tail <= tolerance:
                return p
        p += 1
        if p > 200:
            raise ValueError(f"no Hermite series reaches {tolerance} at half-width {half_width}")


def hermite_rounding(half_width, n_terms) -> float:
    """An allowance for the rounding of the series of :func:`loo_squared_error_boxed_1d`,
    per unit of ``exp(-s^2 / 2)``: ``4 p eps K sum_k (sqrt(2) r)^k / sqrt(k!)``, the
    size of the terms (Cramér's bound) times 4 p roundings."""
    ratio = math.sqrt(2.0) * float(half_width)
    size = sum(
        math.exp(k * math.log(ratio) - 0.5 * math.lgamma(k + 1.0)) if ratio > 0 else float(k == 0)
        for k in range(int(n_terms))
    )
    return 4.0 * n_terms * np.finfo(np.float64).eps * _CRAMER * size


def loo_squared_error_boxed_1d(
    zs, values_t, targets, rows, half_width, n_terms, reach, bound, omitted, tolerance, expanded
):
    """The LOO squared-error sum of ``loo_squared_error_sorted_1d`` by a boxed
    Hermite series (a one-dimensional fast Gauss transform), for the rows it can
    vouch for.

    ``zs`` (n,) ascending, n >= 2, already scaled (s_ij = -(zs_i - zs_j)^2);
    ``values_t`` (p, n), ``targets`` (n, p) in the same order; ``rows`` the
    (sorted-order) rows to predict, ascending. The line is cut into boxes of
    width ``2 r`` (``r = half_width``) from ``zs[0]``; for the box of centre c,
    with ``t = zs_i - c`` (``|t| <= r``) and ``s = zs_j - c``,

    .. math::

        e^{-(zs_i - zs_j)^2} = e^{-(s - t)^2}
            = \\sum_{k \\ge 0} \\frac{t^k}{k!}\\, h_k(s), \\qquad
        h_k(s) = H_k(s)\\, e^{-s^2},

    so the local coefficients ``C_k = sum_j h_k(s_j) (1, v_j)`` over the keys
    with ``|s_j| <= reach`` (``h_k`` by the recurrence
    ``h_{k+1} = 2 s h_k - 2 k h_{k-1}``), taken once per box, give each row's
    sums by a polynomial of degree ``n_terms - 1`` in t. The row's own key
    (weight exactly 1, value v_i) is subtracted afterwards.

    Error: by Cramér's inequality each key's weight is off by at most
    ``e^{-s_j^2/2}`` times the tail of :func:`hermite_terms` plus the rounding
    allowance of :func:`hermite_rounding` (together ``bound``), so with
    ``B = sum_j e^{-s_j^2/2}`` over the box's keys the row's weight sum is off
    by at most ``bound * B``, and its value sums by ``max|v|`` times that. Keys
    beyond ``reach`` weigh at most ``e^{-(reach - r)^2}`` each, ``omitted =
    n e^{-(reach - r)^2}`` in all. The row's exact sum T_i without its own key
    is at least ``e^{-dmin_i^2}`` (its nearest neighbour, dmin_i away) and at
    least the computed sum less the error, so a row is expanded only when

        (bound * B + omitted) / tol <= max(e^{-dmin_i^2}, computed T_i / (1 + tol)),

    which keeps its weight sum within ``tol`` relative, and its prediction
    within ``2 tol max|v|``, however much the subtraction of the own key
    cancels. The others (isolated rows, far rows) get ``expanded[r] = False``
    and contribute nothing: the caller computes them directly
    (``loo_squared_error_sorted_1d`` on those rows). Computed in float64
    whatever the dtype. Cost: (keys within reach of a box) x boxes x n_terms,
    plus n_terms per row, whatever the width.
    """
    box_of, run_start, inv_factorial = _box_runs(zs, rows, 2.0 * half_width, n_terms)
    partial = np.zeros(run_start.shape[0] - 1, dtype=np.float64)
    run_items(
        _boxed_items,
        zs,
        values_t,
        targets,
        rows,
        float(half_width),
        np.int64(n_terms),
        float(reach),
        float(bound),
        float(omitted),
        float(tolerance),
        expanded,
        box_of,
        run_start,
        inv_factorial,
        partial,
    )
    return float(sum_in_order(partial))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _box_runs(zs, rows, width, n_terms):
    """``(box_of, run_start, inv_factorial)`` of :func:`loo_squared_error_boxed_1d`: each
    row's box (boxes of ``width`` from ``zs[0]``), the starts of the runs of equal box
    along the sorted rows (closed by ``n_rows``), and 1/k! for k < ``n_terms``."""
    n_rows = rows.shape[0]
    z0 = np.float64(zs[0])
    box_of = np.empty(n_rows, dtype=np.int64)
    for r in range(n_rows):
        box_of[r] = int((np.float64(zs[rows[r]]) - z0) / width)
    n_runs = 0
    run_start = np.empty(n_rows + 1, dtype=np.int64)
    for r in range(n_rows):
        if r == 0 or box_of[r] != box_of[r - 1]:
            run_start[n_runs] = r
            n_runs += 1
    run_start[n_runs] = n_rows
    inv_factorial = np.empty(n_terms, dtype=np.float64)
    inv_factorial[0] = 1.0
    for k in range(1, n_terms):
        inv_factorial[k] = inv_factorial[k - 1] / k
    return box_of, run_start[: n_runs + 1].copy(), inv_factorial


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _boxed_items(
    counter,
    zs,
    values_t,
    targets,
    rows,
    half_width,
    n_terms,
    reach,
    bound,
    omitted,
    tolerance,
    expanded,
    box_of,
    run_start,
    inv_factorial,
    partial,
):
    """The runs of rows in one box of :func:`loo_squared_error_boxed_1d` taken from
    ``counter`` (``items.next_item``): each writes its rows' ``expanded`` flags and its
    squared-error sum into ``partial[run]``."""
    n = zs.shape[0]
    n_outputs = values_t.shape[0]
    n_runs = partial.shape[0]
    width = 2.0 * half_width
    z0 = np.float64(zs[0])
    coef = np.empty((n_outputs + 1, n_terms), dtype=np.float64)
    table = np.empty((max(n_terms, 2), _HERMITE_BLOCK), dtype=np.float64)  # h_k(s_j)
    two_s = np.empty(_HERMITE_BLOCK, dtype=np.float64)
    vals = np.empty((n_outputs, _HERMITE_BLOCK), dtype=np.float64)
    while True:
        run = next_item(counter)
        if run >= n_runs:
            return
        a, e = run_start[run], run_start[run + 1]
        centre = z0 + width * (box_of[a] + 0.5)
        lo = np.searchsorted(zs, like(centre - reach, zs), side="left")
        hi = np.searchsorted(zs, like(centre + reach, zs), side="right")
        coef[:] = 0.0
        mass = 0.0  # B = sum_j exp(-s_j^2 / 2)
        for j0 in range(lo, hi, _HERMITE_BLOCK):
            nb = min(hi - j0, _HERMITE_BLOCK)
            keys = zs[j0 : j0 + nb]
            for j in range(nb):
                s = np.float64(keys[j]) - centre
                two_s[j] = 2.0 * s
                table[0, j] = fast_exp(-0.5 * s * s)
            block = 0.0
            for j in range(nb):
                block += table[0, j]
            mass += block
            for j in range(nb):
                table[0, j] *= table[0, j]
            for c in range(n_outputs):
                values = values_t[c, j0 : j0 + nb]
                for j in range(nb):
                    vals[c, j] = np.float64(values[j])
            if n_outputs == 1:  # one pass per term: the recurrence and both sums
                for j in range(nb):
                    table[1, j] = 0.0  # h_{-1}, overwritten by h_1 below
                for k in range(n_terms):
                    sum0 = 0.0
                    sum1 = 0.0
                    prev = (k + 1) % 2
                    for j in range(nb):
                        h = table[k % 2, j]
                        sum0 += h
                        sum1 += h * vals[0, j]
                        table[prev, j] = two_s[j] * h - (2.0 * k) * table[prev, j]
                    coef[0, k] += sum0
                    coef[1, k] += sum1
                continue
            if n_terms > 1:
                for j in range(nb):
                    table[1, j] = two_s[j] * table[0, j]
            for k in range(1, n_terms - 1):
                for j in range(nb):
                    table[k + 1, j] = two_s[j] * table[k, j] - (2.0 * k) * table[k - 1, j]
            for k in range(n_terms):
                block = 0.0
                for j in range(nb):
                    block += table[k, j]
                coef[0, k] += block
                for c in range(n_outputs):
                    block = 0.0
                    for j in range(nb):
                        block += table[k, j] * vals[c, j]
                    coef[c + 1, k] += block
        for c in range(n_outputs + 1):
            for k in range(n_terms):
                coef[c, k] *= inv_factorial[k]
        floor = (bound * mass + omitted) / tolerance  # the error bound / tolerance
        sq = 0.0
        for r in range(a, e):
            i = rows[r]
            zi = np.float64(zs[i])
            dmin = np.inf
            if i > 0:
                dmin = zi - np.float64(zs[i - 1])
            if i + 1 < n:
                dmin = min(dmin, np.float64(zs[i + 1]) - zi)
            t = zi - centre
            total = coef[0, n_terms - 1]
            for k in range(n_terms - 2, -1, -1):
                total = total * t + coef[0, k]
            total -= 1.0  # the row's own key, weight exp(0) = 1
            # the exact sum is at least e^{-dmin^2} and at least total - error
            if not floor <= max(np.exp(-dmin * dmin), total / (1.0 + tolerance)):
                expanded[r] = False
                continue
            expanded[r] = True
            for c in range(n_outputs):
                num = coef[c + 1, n_terms - 1]
                for k in range(n_terms - 2, -1, -1):
                    num = num * t + coef[c + 1, k]
                err = (num - np.float64(values_t[c, i])) / total - targets[i, c]
                sq += err * err
        partial[run] = sq


def boxed_1d_plan(n):
    """``(half_width, n_terms, reach, bound, omitted, tolerance)`` for
    :func:`loo_squared_error_boxed_1d` on n keys, from ``config.LOO_BOXED_HALF_WIDTH``,
    ``LOO_BOXED_TOL`` and ``LOO_BOXED_REACH_GAP`` (read at call time).

    The half-width used in the bounds is inflated by 1e-9 relative: a row's
    offset from its box centre is rounded.
    """
    half_width = float(config.LOO_BOXED_HALF_WIDTH)
    tolerance = float(config.LOO_BOXED_TOL)
    gap = float(config.LOO_BOXED_REACH_GAP)
    n_terms, bound, reach = _boxed_series(half_width, tolerance, gap)
    return half_width, n_terms, reach, bound, n * math.exp(-gap), tolerance


@functools.lru_cache(maxsize=16)
def _boxed_series(half_width, tolerance, gap):
    """(n_terms, bound per unit of mass, reach) of :func:`boxed_1d_plan`."""
    if not (half_width > 0 and 0 < tolerance < 1 and gap > 0):
        raise ValueError("LOO_BOXED_HALF_WIDTH, LOO_BOXED_TOL and LOO_BOXED_REACH_GAP must be > 0")
    r = half_width * (1.0 + 1e-9)
    # half the tolerance for the truncation, the rest for rounding and omitted keys
    n_terms = hermite_terms(r, 0.25 * tolerance)
    tail = (
        _CRAMER
        * math.exp(n_terms * math.log(math.sqrt(2.0) * r) - 0.5 * math.lgamma(n_terms + 1.0))
        / (1.0 - math.sqrt(2.0) * r / math.sqrt(n_terms + 1.0))
    )
    return n_terms, tail + hermite_rounding(r, n_terms), half_width + math.sqrt(gap)


def loo_squared_error_boxed_rows_1d(zs, values_t, targets, rows, prune_gap):
    """The LOO squared-error sum of ``loo_squared_error_sorted_1d`` (same arguments),
    by the boxed Hermite series where its bound vouches for a row and by the
    windowed kernel elsewhere. Returns ``(sum, rows computed directly)``.
    """
    n = zs.shape[0]
    if n < 2 or rows.shape[0] == 0:
        return float(loo_squared_error_sorted_1d(zs, values_t, targets, rows, prune_gap)), 0
    half_width, n_terms, reach, bound, omitted, tolerance = boxed_1d_plan(n)
    expanded = np.empty(rows.shape[0], dtype=np.bool_)
    total = float(
        loo_squared_error_boxed_1d(
            zs,
            values_t,
            targets,
            rows,
            half_width,
            n_terms,
            reach,
            bound,
            omitted,
            tolerance,
            expanded,
        )
    )
    direct = rows[~expanded]
    if direct.size:
        total += float(loo_squared_error_sorted_1d(zs, values_t, targets, direct, prune_gap))
    return total, int(direct.size)
