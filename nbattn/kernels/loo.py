"""Second-pass kernels of Gaussian attention pooling: leave-one-out gradients and spread.

Every kernel here runs *after* the streaming pool of ``nbattn.kernels.pooling``
has produced, per query i, the pooled output ``f_i`` and the log normaliser
``lse_i = log sum_j exp(s_ij)``. With ``lse_i`` known, the exact weights are
available pair by pair, ``w_ij = exp(s_ij - lse_i)``, without an online
rescaling, so a second streaming pass can accumulate any weighted sum of the
pairs in O(n * d) memory. Layout and scaling are those of ``pooling``:

* ``queries`` (n_queries, k) C-contiguous and ``keys_t`` (k, n_keys), already
  multiplied by the metric and divided by sqrt(2), so that
  ``s_ij = -|| queries_i - keys_t[:, j] ||^2``;
* ``values_t`` (n_outputs, n_keys), ``centers`` (n_queries, n_outputs);
* one dtype, float32 or float64; ``lse`` float64. Per-block partial sums are
  taken in the input dtype and added into float64 accumulators.

Leave-one-out gradient (``loo_grad_diag``, ``loo_grad_full``). With
``f_i = sum_{j != i} w_ij y_j`` and the loss ``L = 1/(n p) sum_i ||f_i - y_i||^2``,
``d f_ic / d s_ij = w_ij (y_jc - f_ic)``, so

    dL/ds_ij = 2/(n p) * g_ij,   g_ij = w_ij * sum_c r_ic (y_jc - f_ic),   r_i = f_i - y_i

(the caller passes ``resid = r`` and ``centers = f``). The kernels return the
unnormalised sums

    diag:  G_f  = sum_i sum_{j != i} g_ij (z_if - z_jf)^2          (k,)
    full:  M_ab = sum_i sum_{j != i} g_ij (x_ia - x_ja)(x_ib - x_jb)   (d, d)

from which the caller builds the gradient with respect to log-widths or to a
linear map (see ``nbattn.smoothing.learning``). A two-pass scheme was chosen over one
online pass: the online form would carry n_outputs x k running sums per query
(n_outputs x d x d for the full metric) and rescale all of them whenever the
running maximum grows; the second pass needs only k (or d x d) accumulators
per thread whatever the number of outputs, and its weights are exact.

Spread (``gaussian_spread``): for centers c_i (the pooled output f_i),

    std_ic = S_c sqrt( sum_j w_ij ((v_jc - c_ic) / S_c)^2 ),   sum_w2_i = sum_j w_ij^2

the attention-weighted standard deviation about the pooled mean (two-pass, so
no cancellation between E[v^2] and E[v]^2) and the sum of squared weights (the
effective number of neighbours is 1 / sum_w2_i). S_c is a power of two near
max_j |v_jc| (exact to divide by): the squares neither overflow for values
near 1e200 nor underflow for values near 1e-200.

LOO loss alone (``loo_squared_error``, ``loo_squared_error_sorted_1d``): the
one-pass criterion of the bandwidth search, with no output array; the 1-D
variant works on sorted points and visits, per row, only the window of keys
whose weight can exceed exp(-PRUNE_GAP) of the nearest one. Two series serve
the wider 1-D widths in O(n) per width: ``loo_squared_error_boxed_1d`` (a
one-dimensional fast Gauss transform: per box of width 1 in scaled units, a
Hermite series of the keys within reach, with a proven error bound checked
row by row; rows it cannot vouch for go to the windowed kernel,
``loo_squared_error_boxed_rows_1d``) and ``loo_squared_error_taylor_1d`` (one
Taylor series about the middle of the range, for spans up to 2).

A query with lse = -inf contributes nothing and gets zeros (no admissible
key, or a row the caller leaves out), unless its scores overflow: then -inf
is the overflow of a finite log normaliser, and the row is a far row.

A far row (``nbattn.kernels.pooling``, "Far rows") takes its weights the way
the pool did: lse below ``-config.FAR_SCORE_FLOAT32`` in a float32 kernel,
from float64 scores; lse below ``-config.FAR_SCORE_FLOAT64`` (or overflowed),
from the anchored float64 form of ``pooling.far_state`` and
``pooling.far_block_weights``. The other rows recompute the direct scores.

Tunables: ``config.KEY_BLOCK``, ``QUERY_BLOCK`` and ``LOO_FULL_GROUPS`` are
read when this module is imported (compiled in as constants);
``config.PRUNE_GAP_<dtype>`` at call time through :func:`prune_gap_for`, and
``LOO_BOXED_HALF_WIDTH``, ``LOO_BOXED_TOL``, ``LOO_BOXED_REACH_GAP`` through
:func:`boxed_1d_plan`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, like
from .pooling import (
    _FAR_SCORE_FLOAT64,
    _block_scores,
    far_block_weights,
    far_pool,
    far_score,
    far_state,
    has_admissible_key,
    pool_row,
)

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK
_FULL_GROUPS = config.LOO_FULL_GROUPS


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _block_weights(scores, nb, shift, j0, i, exclude_self):
    """scores[j] <- exp(scores[j] - shift); the pair (i, i) gets 0 when excluded."""
    shift = like(shift, scores)
    for j in range(nb):
        scores[j] = fast_exp(scores[j] - shift)
    if exclude_self and j0 <= i < j0 + nb:
        scores[i - j0] = 0.0


#: How a second pass gets a row's weights (``_row_setup``).
_DIRECT, _DIRECT_FLOAT64, _ANCHORED = 0, 1, 2


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _row_setup(query_row, keys_t, own, lse_i, weights):
    """``(skip, mode, anchor, c, shift)`` of one row of a second pass.

    ``skip``: no admissible key. ``mode``: _DIRECT, exp(s_ij - lse_i) with the
    scores in the dtype of ``weights``; _DIRECT_FLOAT64, the same with float64
    scores (a float32 far row); _ANCHORED, ``far_block_weights(..., anchor, c,
    shift)`` with shift including log l. The same thresholds as ``pool_row``,
    applied to lse_i (>= the row's best score).
    """
    n_keys = keys_t.shape[1]
    limit = far_score(weights)
    if lse_i >= -limit:
        return False, _DIRECT, -1, 1.0, 0.0
    if lse_i == -np.inf and not has_admissible_key(n_keys, own):
        return True, _DIRECT, -1, 1.0, 0.0
    if lse_i >= -_FAR_SCORE_FLOAT64:
        return False, _DIRECT_FLOAT64, -1, 1.0, 0.0
    anchor, c, s_a, shift, total = far_state(query_row, keys_t, own)
    if lse_i == -np.inf and s_a > -np.inf:
        # not an overflow: a row the caller gave lse = -inf contributes nothing
        return True, _DIRECT, -1, 1.0, 0.0
    return anchor < 0, _ANCHORED, anchor, c, shift + np.log(total)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _row_block_weights(
    query_row, keys_t, j0, nb, own, lse_i, mode, anchor, c, shift, weights, scores64
):
    """weights[:nb] <- w_ij for the keys j0 .. j0 + nb (0 for the key ``own``).

    ``scores64`` is a float64 KEY_BLOCK scratch buffer for _DIRECT_FLOAT64.
    """
    if mode == _ANCHORED:
        far_block_weights(query_row, keys_t, j0, nb, own, anchor, c, shift, weights)
    elif mode == _DIRECT_FLOAT64:
        _block_scores(query_row, keys_t, j0, nb, scores64)
        _block_weights(scores64, nb, lse_i, j0, own, True)
        for j in range(nb):
            weights[j] = scores64[j]
    else:
        _block_scores(query_row, keys_t, j0, nb, weights)
        _block_weights(weights, nb, lse_i, j0, own, True)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _block_coef(weights, values_t, resid, centers, i, j0, nb, coef):
    """coef[j] = weights[j] * sum_c resid[i, c] * (values_t[c, j0 + j] - centers[i, c])."""
    for j in range(nb):
        coef[j] = 0.0
    for c in range(values_t.shape[0]):
        r = resid[i, c]
        fc = centers[i, c]
        for j in range(nb):
            coef[j] += r * (values_t[c, j0 + j] - fc)
    for j in range(nb):
        coef[j] *= weights[j]


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def loo_grad_diag(queries, keys_t, values_t, resid, centers, lse, self_offset=0):
    """G_f = sum_i sum_{j != i} g_ij (z_if - z_jf)^2, float64 (k,); see the module docstring.

    Query i is key ``i + self_offset`` (a block of rows for partitioned sums).
    """
    n_queries, k = queries.shape
    n_keys = keys_t.shape[1]
    dtype = queries.dtype
    n_chunks = (n_queries + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    partial = np.zeros((n_chunks, k), dtype=np.float64)
    for chunk in prange(n_chunks):
        weights = np.empty(_KEY_BLOCK, dtype=dtype)
        scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
        coef = np.empty(_KEY_BLOCK, dtype=dtype)
        acc = partial[chunk]
        stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            query_row = queries[i]
            own = np.int64(i) + np.int64(self_offset)
            skip, mode, anchor, c, shift = _row_setup(query_row, keys_t, own, lse[i], weights)
            if skip:
                continue
            for j0 in range(0, n_keys, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_keys - j0)
                _row_block_weights(
                    query_row,
                    keys_t,
                    j0,
                    nb,
                    own,
                    lse[i],
                    mode,
                    anchor,
                    c,
                    shift,
                    weights,
                    scores64,
                )
                _block_coef(weights, values_t, resid, centers, i, j0, nb, coef)
                zero = like(0.0, weights)
                for f in range(k):
                    qf = query_row[f]
                    total = like(0.0, weights)
                    for j in range(nb):
                        diff = keys_t[f, j0 + j] - qf
                        term = coef[j] * diff * diff
                        # a zero weight times an overflowing square is 0, not NaN
                        total += term if coef[j] != 0.0 else zero
                    acc[f] += total
    out = np.zeros(k, dtype=np.float64)
    for chunk in range(n_chunks):
        for f in range(k):
            out[f] += partial[chunk, f]
    return out


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def loo_grad_full(queries, keys_t, points, points_t, values_t, resid, centers, lse, self_offset=0):
    """M_ab = sum_i sum_{j != i} g_ij (x_ia - x_ja)(x_ib - x_jb), float64 (d, d).

    ``queries``/``keys_t`` are the projected points (score space), ``points``
    (n_queries, d) the original query rows and ``points_t`` (d, n_keys) the
    original keys (centred by the caller). Query i is key ``i + self_offset``.

    O(d) work per pair instead of O(d^2), by expanding the outer product:

        M = sum_i [ a_i x_i x_i^T - x_i b_i^T - b_i x_i^T ] + sum_j c_j x_j x_j^T
        a_i = sum_j g_ij,   b_i = sum_j g_ij x_j,   c_j = sum_i g_ij

    The sums a, b, c are float64 (c per thread), so the cancellation between
    the terms costs float64 rounding only, scaled by (|x| / |x_i - x_j|)^2; the
    caller centres the points to keep |x| small.
    """
    n_queries = queries.shape[0]
    n_keys = keys_t.shape[1]
    d = points.shape[1]
    dtype = queries.dtype
    # Query rows are split into a few groups, each with its own key sums c
    # (groups x n_keys floats), run in parallel.
    n_groups = min(_FULL_GROUPS, n_queries)
    partial = np.zeros((n_groups, d, d), dtype=np.float64)
    key_sums = np.zeros((n_groups, n_keys), dtype=np.float64)
    for group in prange(n_groups):
        weights = np.empty(_KEY_BLOCK, dtype=dtype)
        scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
        coef = np.empty(_KEY_BLOCK, dtype=dtype)
        b_i = np.empty(d, dtype=np.float64)
        acc = partial[group]
        c_sum = key_sums[group]
        start = group * n_queries // n_groups
        stop = (group + 1) * n_queries // n_groups
        for i in range(start, stop):
            query_row = queries[i]
            own = np.int64(i) + np.int64(self_offset)
            skip, mode, anchor, c, shift = _row_setup(query_row, keys_t, own, lse[i], weights)
            if skip:
                continue
            a_i = 0.0
            b_i[:] = 0.0
            for j0 in range(0, n_keys, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_keys - j0)
                _row_block_weights(
                    query_row,
                    keys_t,
                    j0,
                    nb,
                    own,
                    lse[i],
                    mode,
                    anchor,
                    c,
                    shift,
                    weights,
                    scores64,
                )
                _block_coef(weights, values_t, resid, centers, i, j0, nb, coef)
                block_total = 0.0
                for j in range(nb):
                    g = np.float64(coef[j])
                    block_total += g
                    c_sum[j0 + j] += g
                a_i += block_total
                for a in range(d):
                    keys_a = points_t[a, j0 : j0 + nb]
                    total = 0.0
                    for j in range(nb):
                        total += np.float64(coef[j]) * np.float64(keys_a[j])
                    b_i[a] += total
            for a in range(d):
                xa = np.float64(points[i, a])
                for b in range(d):
                    xb = np.float64(points[i, b])
                    acc[a, b] += a_i * xa * xb - xa * b_i[b] - b_i[a] * xb
    out = np.zeros((d, d), dtype=np.float64)
    for group in range(n_groups):
        out += partial[group]
    for j in range(n_keys):
        c_j = 0.0
        for t in range(key_sums.shape[0]):
            c_j += key_sums[t, j]
        for a in range(d):
            xa = np.float64(points_t[a, j])
            for b in range(d):
                out[a, b] += c_j * xa * np.float64(points_t[b, j])
    return out


@njit(fastmath=False, cache=config.CACHE)
def _power_of_two_near(x):
    """2**(e - 1) for x = m 2**e, 1/2 <= m < 1: x / 2 < result <= x, exact to divide by; 1 for 0."""
    if x == 0.0:
        return 1.0
    _, e = math.frexp(x)
    return math.ldexp(1.0, e - 1)


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def gaussian_spread(queries, keys_t, values_t, centers, lse, exclude_self):
    """``(std, sum_w2)``: the weighted std (n_queries, n_outputs) and sum_j w_ij^2 (n_queries,).

    std_ic = S_c sqrt(sum_j w_ij ((v_jc - c_ic) / S_c)^2) with S_c a power of
    two near max_j |v_jc| (module docstring); both float64. A query with no
    admissible key gets std = 0 and sum_w2 = 0.
    """
    n_queries = queries.shape[0]
    n_keys = keys_t.shape[1]
    n_outputs = values_t.shape[0]
    dtype = queries.dtype
    inv_scale = np.empty(n_outputs, dtype=np.float64)
    for c in range(n_outputs):
        big = 0.0
        for j in range(n_keys):
            big = max(big, abs(np.float64(values_t[c, j])))
        inv_scale[c] = 1.0 / _power_of_two_near(big)
    std = np.zeros((n_queries, n_outputs), dtype=np.float64)
    sum_w2 = np.zeros(n_queries, dtype=np.float64)
    n_chunks = (n_queries + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for chunk in prange(n_chunks):
        weights = np.empty(_KEY_BLOCK, dtype=dtype)
        scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
        var = np.empty(n_outputs, dtype=np.float64)
        stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            query_row = queries[i]
            own = np.int64(-1)
            if exclude_self:
                own = np.int64(i)
            skip, mode, anchor, c, shift = _row_setup(query_row, keys_t, own, lse[i], weights)
            if skip:
                continue
            var[:] = 0.0
            w2 = 0.0
            for j0 in range(0, n_keys, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_keys - j0)
                _row_block_weights(
                    query_row,
                    keys_t,
                    j0,
                    nb,
                    own,
                    lse[i],
                    mode,
                    anchor,
                    c,
                    shift,
                    weights,
                    scores64,
                )
                block_w2 = like(0.0, weights)
                for j in range(nb):
                    block_w2 += weights[j] * weights[j]
                w2 += block_w2
                for out in range(n_outputs):
                    inv = inv_scale[out]
                    center = np.float64(centers[i, out]) * inv
                    total = 0.0
                    for j in range(nb):
                        diff = np.float64(values_t[out, j0 + j]) * inv - center
                        total += np.float64(weights[j]) * diff * diff
                    var[out] += total
            for out in range(n_outputs):
                std[i, out] = np.sqrt(var[out]) / inv_scale[out]
            sum_w2[i] = w2
    return std, sum_w2


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def loo_squared_error(queries, keys_t, values_t, targets, self_index):
    """sum_i sum_c (f_-i(q_i)_c - targets[i, c])^2 in float64: the LOO loss in one pass.

    The streaming pool of ``pooling.gaussian_pool`` with the key
    ``self_index[i]`` excluded for query i, reduced to the squared error on
    the fly (no output array): the cheap criterion evaluated many times by
    the bandwidth search. With queries = keys and ``self_index = arange(n)``
    it is the exact LOO sum; with a subset of the rows as queries (and their
    row numbers as ``self_index``) an unbiased estimate of it. A query with
    no admissible key (n = 1) predicts 0.
    """
    n_queries = queries.shape[0]
    n_outputs = values_t.shape[0]
    dtype = queries.dtype
    n_chunks = (n_queries + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    partial = np.zeros(n_chunks, dtype=np.float64)
    for chunk in prange(n_chunks):
        scores = np.empty(_KEY_BLOCK, dtype=dtype)
        acc = np.empty(n_outputs, dtype=np.float64)
        stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
        sq = 0.0
        for i in range(chunk * _QUERY_BLOCK, stop):
            _, running_sum = pool_row(queries[i], keys_t, values_t, self_index[i], scores, acc)
            inv = 1.0 / running_sum if running_sum > 0.0 else 0.0
            for c in range(n_outputs):
                err = acc[c] * inv - targets[i, c]
                sq += err * err
        partial[chunk] = sq
    return partial.sum()


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


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _window_sums(zs, values_t, zi, shift, start, stop, acc, weights):
    """Adds sum_j exp(shift - (zs_j - zi)^2) (returned) and its v-weighted sums (into acc).

    Computed in the dtype of the scratch buffer ``weights``.
    """
    total = 0.0
    zi = like(zi, weights)
    shift = like(shift, weights)
    for b0 in range(start, stop, _KEY_BLOCK):
        nb = min(stop - b0, _KEY_BLOCK)
        block = like(0.0, weights)
        for j in range(nb):
            diff = like(zs[b0 + j], weights) - zi
            w = fast_exp(shift - diff * diff)
            weights[j] = w
            block += w
        total += block
        for c in range(values_t.shape[0]):
            weighted = like(0.0, weights)
            for j in range(nb):
                weighted += weights[j] * values_t[c, b0 + j]
            acc[c] += weighted
    return total


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
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
    ``pooling.far_pool``.
    """
    n = zs.shape[0]
    n_rows = rows.shape[0]
    n_outputs = values_t.shape[0]
    n_chunks = (n_rows + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    partial = np.zeros(n_chunks, dtype=np.float64)
    for chunk in prange(n_chunks):
        acc = np.empty(n_outputs, dtype=np.float64)
        weights = np.empty(_KEY_BLOCK, dtype=zs.dtype)
        scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
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
    return partial.sum()


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


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
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
    n = zs.shape[0]
    n_outputs = values_t.shape[0]
    n_rows = rows.shape[0]
    width = 2.0 * half_width
    z0 = np.float64(zs[0])
    # boxes holding rows: runs of equal box index along the sorted rows
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
    partial = np.zeros(n_runs, dtype=np.float64)
    inv_factorial = np.empty(n_terms, dtype=np.float64)
    inv_factorial[0] = 1.0
    for k in range(1, n_terms):
        inv_factorial[k] = inv_factorial[k - 1] / k
    for run in prange(n_runs):
        a, e = run_start[run], run_start[run + 1]
        centre = z0 + width * (box_of[a] + 0.5)
        lo = np.searchsorted(zs, like(centre - reach, zs), side="left")
        hi = np.searchsorted(zs, like(centre + reach, zs), side="right")
        coef = np.zeros((n_outputs + 1, n_terms), dtype=np.float64)
        table = np.empty((max(n_terms, 2), _HERMITE_BLOCK), dtype=np.float64)  # h_k(s_j)
        two_s = np.empty(_HERMITE_BLOCK, dtype=np.float64)
        vals = np.empty((n_outputs, _HERMITE_BLOCK), dtype=np.float64)
        mass = 0.0  # B = sum_j exp(-s_j^2 / 2)
        for j0 in range(lo, hi, _HERMITE_BLOCK):
            nb = min(hi - j0, _HERMITE_BLOCK)
            for j in range(nb):
                s = np.float64(zs[j0 + j]) - centre
                two_s[j] = 2.0 * s
                table[0, j] = fast_exp(-0.5 * s * s)
            block = 0.0
            for j in range(nb):
                block += table[0, j]
            mass += block
            for j in range(nb):
                table[0, j] *= table[0, j]
            for c in range(n_outputs):
                for j in range(nb):
                    vals[c, j] = np.float64(values_t[c, j0 + j])
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
    return partial.sum()


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
