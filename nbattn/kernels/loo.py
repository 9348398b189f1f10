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
linear map (see ``nbattn.smoothing.loo``). A two-pass scheme was chosen over one
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

LOO loss alone (``loo_squared_error``): the one-pass criterion of the
bandwidth search, with no output array. The 1-D search has kernels of its
own on sorted points (``nbattn.kernels.loo_1d``).

A query with lse = -inf contributes nothing and gets zeros (no admissible
key, or a row the caller leaves out), unless its scores overflow: then -inf
is the overflow of a finite log normaliser, and the row is a far row.

A far row (``nbattn.kernels.pooling``, "Far rows") takes its weights the way
the pool did: lse below ``-config.FAR_SCORE_FLOAT32`` in a float32 kernel,
from float64 scores; lse below ``-config.FAR_SCORE_FLOAT64`` (or overflowed),
from the anchored float64 form of ``far_rows.far_state`` and
``far_rows.far_block_weights``. The other rows recompute the direct scores.

Tunables: ``config.KEY_BLOCK``, ``QUERY_BLOCK`` and ``LOO_FULL_GROUPS`` are
read when this module is imported (compiled in as constants).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit

from .. import config
from .far_rows import far_block_weights, far_state
from .fastmath import fast_exp, like
from .items import next_item, run_items, sum_in_order
from .pooling import (
    _FAR_SCORE_FLOAT64,
    _block_scores,
    far_score,
    has_admissible_key,
    near_row,
    pool_row,
)

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK
_FULL_GROUPS = config.LOO_FULL_GROUPS


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _block_weights(scores, nb, shift, j0, i, exclude_self):
    """scores[j] <- exp(scores[j] - shift); the pair (i, i) gets 0 when excluded."""
    shift = like(shift, scores)
    for j in range(nb):
        scores[j] = fast_exp(scores[j] - shift)
    if exclude_self and j0 <= i < j0 + nb:
        scores[i - j0] = 0.0


#: How a second pass gets a row's weights (``_Row.mode``).
_DIRECT, _DIRECT_FLOAT64, _ANCHORED = 0, 1, 2

#: One query row of a second pass, as :func:`_row_setup` prepares it: its score-space
#: ``point``, its ``own`` key (left out; -1: none), its log normaliser ``lse`` and how
#: its weights are taken (``mode``; ``anchor``, ``c`` and ``shift`` for _ANCHORED).
_Row = namedtuple("_Row", ("point", "own", "lse", "mode", "anchor", "c", "shift"))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _row_setup(query_row, keys_t, own, lse_i, weights):
    """``(skip, row)``: whether the row contributes nothing, and its :data:`_Row`.

    ``skip``: no admissible key. ``mode``: _DIRECT, exp(s_ij - lse_i) with the
    scores in the dtype of ``weights``; _DIRECT_FLOAT64, the same with float64
    scores (a float32 far row); _ANCHORED, ``far_block_weights(..., anchor, c,
    shift)`` with shift including log l. The same thresholds as ``pool_row``,
    applied to lse_i (>= the row's best score).
    """
    n_keys = keys_t.shape[1]
    limit = far_score(weights)
    if lse_i >= -limit:
        return False, _Row(query_row, own, lse_i, _DIRECT, -1, 1.0, 0.0)
    if lse_i == -np.inf and not has_admissible_key(n_keys, own):
        return True, _Row(query_row, own, lse_i, _DIRECT, -1, 1.0, 0.0)
    if lse_i >= -_FAR_SCORE_FLOAT64:
        return False, _Row(query_row, own, lse_i, _DIRECT_FLOAT64, -1, 1.0, 0.0)
    anchor, c, s_a, shift, total = far_state(query_row, keys_t, own)
    if lse_i == -np.inf and s_a > -np.inf:
        # not an overflow: a row the caller gave lse = -inf contributes nothing
        return True, _Row(query_row, own, lse_i, _DIRECT, -1, 1.0, 0.0)
    return anchor < 0, _Row(query_row, own, lse_i, _ANCHORED, anchor, c, shift + np.log(total))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _row_block_weights(row, keys_t, j0, nb, weights, scores64):
    """weights[:nb] <- w_ij of :data:`_Row` ``row`` for the keys j0 .. j0 + nb (0 for
    its own key). ``scores64`` is a float64 KEY_BLOCK scratch buffer for _DIRECT_FLOAT64.
    """
    if row.mode == _ANCHORED:
        far_block_weights(row.point, keys_t, j0, nb, row.own, row.anchor, row.c, row.shift, weights)
    elif row.mode == _DIRECT_FLOAT64:
        _block_scores(row.point, keys_t, j0, nb, scores64)
        _block_weights(scores64, nb, row.lse, j0, row.own, True)
        for j in range(nb):
            weights[j] = scores64[j]
    else:
        _block_scores(row.point, keys_t, j0, nb, weights)
        _block_weights(weights, nb, row.lse, j0, row.own, True)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _block_coef(weights, values_t, resid, centers, i, j0, nb, coef):
    """coef[j] = weights[j] * sum_c resid[i, c] * (values_t[c, j0 + j] - centers[i, c]).

    The key loops of this module run over slices from index 0: numba then knows no
    index is negative and drops the wraparound select that keeps a loop over
    ``values_t[c, j0 + j]`` scalar."""
    for j in range(nb):
        coef[j] = 0.0
    for c in range(values_t.shape[0]):
        r = resid[i, c]
        fc = centers[i, c]
        values = values_t[c, j0 : j0 + nb]
        for j in range(nb):
            coef[j] += r * (values[j] - fc)
    for j in range(nb):
        coef[j] *= weights[j]


def loo_grad_diag(queries, keys_t, values_t, resid, centers, lse, self_offset=0):
    """G_f = sum_i sum_{j != i} g_ij (z_if - z_jf)^2, float64 (k,); see the module docstring.

    Query i is key ``i + self_offset`` (a block of rows for partitioned sums). The chunks
    of queries are the work items of :func:`nbattn.kernels.items.run_items`, their sums
    added in chunk order.
    """
    n_queries, k = queries.shape
    n_chunks = (n_queries + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    partial = np.zeros((n_chunks, k), dtype=np.float64)
    run_items(
        _grad_diag_items,
        queries,
        keys_t,
        values_t,
        resid,
        centers,
        lse,
        np.int64(self_offset),
        partial,
    )
    return _rows_in_order(partial)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _rows_in_order(partial):
    """The rows of ``partial`` (n, k) added from first to last, float64 (k,)."""
    out = np.zeros(partial.shape[1], dtype=np.float64)
    for chunk in range(partial.shape[0]):
        for f in range(partial.shape[1]):
            out[f] += partial[chunk, f]
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _grad_diag_items(counter, queries, keys_t, values_t, resid, centers, lse, self_offset, partial):
    """The chunks of queries that ``counter`` hands this thread (:func:`_grad_diag_chunk`)."""
    while True:
        chunk = next_item(counter)
        if chunk >= partial.shape[0]:
            return
        _grad_diag_chunk(
            queries, keys_t, values_t, resid, centers, lse, self_offset, chunk, partial
        )


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _grad_diag_chunk(queries, keys_t, values_t, resid, centers, lse, self_offset, chunk, partial):
    """The queries of chunk ``chunk`` into ``partial[chunk]``."""
    n_queries, k = queries.shape
    n_keys = keys_t.shape[1]
    dtype = queries.dtype
    weights = np.empty(_KEY_BLOCK, dtype=dtype)
    scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
    coef = np.empty(_KEY_BLOCK, dtype=dtype)
    acc = partial[chunk]
    stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
    for i in range(chunk * _QUERY_BLOCK, stop):
        query_row = queries[i]
        own = np.int64(i) + np.int64(self_offset)
        skip, row = _row_setup(query_row, keys_t, own, lse[i], weights)
        if skip:
            continue
        for j0 in range(0, n_keys, _KEY_BLOCK):
            nb = min(_KEY_BLOCK, n_keys - j0)
            _row_block_weights(row, keys_t, j0, nb, weights, scores64)
            _block_coef(weights, values_t, resid, centers, i, j0, nb, coef)
            zero = like(0.0, weights)
            for f in range(k):
                qf = query_row[f]
                keys_f = keys_t[f, j0 : j0 + nb]
                total = like(0.0, weights)
                for j in range(nb):
                    diff = keys_f[j] - qf
                    term = coef[j] * diff * diff
                    # a zero weight times an overflowing square is 0, not NaN
                    total += term if coef[j] != 0.0 else zero
                acc[f] += total


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
    caller centres the points to keep |x| small. The groups of query rows are the work
    items of :func:`nbattn.kernels.items.run_items`.
    """
    n_queries = queries.shape[0]
    n_keys = keys_t.shape[1]
    d = points.shape[1]
    # Query rows are split into a few groups, each with its own key sums c
    # (groups x n_keys floats), run in parallel.
    n_groups = min(_FULL_GROUPS, n_queries)
    partial = np.zeros((n_groups, d, d), dtype=np.float64)
    key_sums = np.zeros((n_groups, n_keys), dtype=np.float64)
    run_items(
        _grad_full_items,
        queries,
        keys_t,
        points,
        points_t,
        values_t,
        resid,
        centers,
        lse,
        np.int64(self_offset),
        np.int64(n_groups),
        partial,
        key_sums,
    )
    return _full_in_order(partial, key_sums, points_t)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _grad_full_items(
    counter,
    queries,
    keys_t,
    points,
    points_t,
    values_t,
    resid,
    centers,
    lse,
    self_offset,
    n_groups,
    partial,
    key_sums,
):
    """The groups of query rows that ``counter`` hands this thread (:func:`_grad_full_group`)."""
    while True:
        group = next_item(counter)
        if group >= n_groups:
            return
        _grad_full_group(
            queries,
            keys_t,
            points,
            points_t,
            values_t,
            resid,
            centers,
            lse,
            self_offset,
            group,
            n_groups,
            partial,
            key_sums,
        )


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _full_in_order(partial, key_sums, points_t):
    """M from the groups' sums in group order and the keys' c_j (:func:`loo_grad_full`)."""
    d = partial.shape[1]
    n_keys = key_sums.shape[1]
    out = np.zeros((d, d), dtype=np.float64)
    for group in range(partial.shape[0]):
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


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _grad_full_group(
    queries,
    keys_t,
    points,
    points_t,
    values_t,
    resid,
    centers,
    lse,
    self_offset,
    group,
    n_groups,
    partial,
    key_sums,
):
    """The query rows of group ``group``: ``partial[group]`` and ``key_sums[group]``."""
    n_queries = queries.shape[0]
    n_keys = keys_t.shape[1]
    d = points.shape[1]
    dtype = queries.dtype
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
        skip, row = _row_setup(query_row, keys_t, own, lse[i], weights)
        if skip:
            continue
        a_i = 0.0
        b_i[:] = 0.0
        for j0 in range(0, n_keys, _KEY_BLOCK):
            nb = min(_KEY_BLOCK, n_keys - j0)
            _row_block_weights(row, keys_t, j0, nb, weights, scores64)
            _block_coef(weights, values_t, resid, centers, i, j0, nb, coef)
            block_total = 0.0
            sums = c_sum[j0 : j0 + nb]
            for j in range(nb):
                g = np.float64(coef[j])
                block_total += g
                sums[j] += g
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


@njit(fastmath=False, cache=config.CACHE)
def _power_of_two_near(x):
    """2**(e - 1) for x = m 2**e, 1/2 <= m < 1: x / 2 < result <= x, exact to divide by; 1 for 0."""
    if x == 0.0:
        return 1.0
    _, e = math.frexp(x)
    return math.ldexp(1.0, e - 1)


def gaussian_spread(queries, keys_t, values_t, centers, lse, exclude_self):
    """``(std, sum_w2)``: the weighted std (n_queries, n_outputs) and sum_j w_ij^2 (n_queries,).

    std_ic = S_c sqrt(sum_j w_ij ((v_jc - c_ic) / S_c)^2 / sum_j w_ij) with S_c a
    power of two near max_j |v_jc| (module docstring) and w_ij = exp(s_ij - lse_i);
    sum_w2 = sum_j w_ij^2 / (sum_j w_ij)^2. Dividing by this pass's own sum of the
    weights (1 up to the error of lse_i) keeps 1 / sum_w2 within [1, n_keys]: in
    float32 an lse_i of |s| ~ 500 is good to one ulp, 3e-5, which would otherwise
    scale sum_w2 by exp(-2 * 3e-5). Both float64. A query with no admissible key
    gets std = 0 and sum_w2 = 0.
    The chunks of queries are the work items of :func:`nbattn.kernels.items.run_items`.
    """
    inv_scale, std, sum_w2 = _spread_outputs(queries, values_t)
    run_items(
        _spread_items,
        queries,
        keys_t,
        values_t,
        centers,
        lse,
        bool(exclude_self),
        inv_scale,
        std,
        sum_w2,
    )
    return std, sum_w2


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _spread_outputs(queries, values_t):
    """``(inv_scale, std, sum_w2)``: 1 / S_c per output and the zeroed outputs."""
    n_queries = queries.shape[0]
    n_keys = values_t.shape[1]
    n_outputs = values_t.shape[0]
    inv_scale = np.empty(n_outputs, dtype=np.float64)
    for c in range(n_outputs):
        big = 0.0
        for j in range(n_keys):
            big = max(big, abs(np.float64(values_t[c, j])))
        inv_scale[c] = 1.0 / _power_of_two_near(big)
    std = np.zeros((n_queries, n_outputs), dtype=np.float64)
    sum_w2 = np.zeros(n_queries, dtype=np.float64)
    return inv_scale, std, sum_w2


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _spread_items(
    counter, queries, keys_t, values_t, centers, lse, exclude_self, inv_scale, std, sum_w2
):
    """The chunks of queries that ``counter`` hands this thread (:func:`_spread_chunk`)."""
    n_chunks = (queries.shape[0] + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        _spread_chunk(
            queries, keys_t, values_t, centers, lse, exclude_self, inv_scale, chunk, std, sum_w2
        )


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _spread_chunk(
    queries, keys_t, values_t, centers, lse, exclude_self, inv_scale, chunk, std, sum_w2
):
    """The queries of chunk ``chunk``: their rows of ``std`` and ``sum_w2``."""
    n_queries = queries.shape[0]
    n_keys = keys_t.shape[1]
    n_outputs = values_t.shape[0]
    dtype = queries.dtype
    weights = np.empty(_KEY_BLOCK, dtype=dtype)
    scores64 = np.empty(_KEY_BLOCK, dtype=np.float64)
    var = np.empty(n_outputs, dtype=np.float64)
    stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
    for i in range(chunk * _QUERY_BLOCK, stop):
        query_row = queries[i]
        own = np.int64(-1)
        if exclude_self:
            own = np.int64(i)
        skip, row = _row_setup(query_row, keys_t, own, lse[i], weights)
        if skip:
            continue
        var[:] = 0.0
        w1 = 0.0
        w2 = 0.0
        for j0 in range(0, n_keys, _KEY_BLOCK):
            nb = min(_KEY_BLOCK, n_keys - j0)
            _row_block_weights(row, keys_t, j0, nb, weights, scores64)
            block_w1 = like(0.0, weights)
            block_w2 = like(0.0, weights)
            for j in range(nb):
                block_w1 += weights[j]
                block_w2 += weights[j] * weights[j]
            w1 += block_w1
            w2 += block_w2
            for out in range(n_outputs):
                inv = inv_scale[out]
                center = np.float64(centers[i, out]) * inv
                values = values_t[out, j0 : j0 + nb]
                total = 0.0
                for j in range(nb):
                    diff = np.float64(values[j]) * inv - center
                    total += np.float64(weights[j]) * diff * diff
                var[out] += total
        if w1 > 0.0:  # renormalised: the error of lse_i (an ulp of |s| in float32) cancels
            for out in range(n_outputs):
                std[i, out] = np.sqrt(var[out] / w1) / inv_scale[out]
            sum_w2[i] = w2 / (w1 * w1)


def loo_squared_error(queries, keys_t, values_t, targets, self_index):
    """sum_i sum_c (f_-i(q_i)_c - targets[i, c])^2 in float64: the LOO loss in one pass.

    The streaming pool of ``pooling.gaussian_pool`` with the key
    ``self_index[i]`` excluded for query i, reduced to the squared error on
    the fly (no output array): the cheap criterion evaluated many times by
    the bandwidth search. With queries = keys and ``self_index = arange(n)``
    it is the exact LOO sum; with a subset of the rows as queries (and their
    row numbers as ``self_index``) an unbiased estimate of it. A query with
    no admissible key (n = 1) predicts 0.
    The chunks of queries are the work items of :func:`nbattn.kernels.items.run_items`,
    each with its own partial sum, added in chunk order. The far rows
    (``pooling.near_row``) are left to a second kernel, compiled only when a call has
    one, and their errors are added to their chunks' sums in row order.
    """
    partial = np.zeros((queries.shape[0] + _QUERY_BLOCK - 1) // _QUERY_BLOCK)
    far = np.zeros(queries.shape[0], dtype=np.bool_)
    args = (queries, keys_t, values_t, targets, self_index)
    run_items(_squared_error_items, *args, partial, far)
    if far.any():
        rows = np.flatnonzero(far)
        errors = np.zeros(rows.shape[0])
        run_items(_far_errors_items, *args, rows, errors)
        for row, error in zip(rows, errors):
            partial[row // _QUERY_BLOCK] += error
    return sum_in_order(partial)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _squared_error_items(counter, queries, keys_t, values_t, targets, self_index, partial, far):
    """The chunks of queries that ``counter`` hands this thread (:func:`_squared_error_chunk`)."""
    while True:
        chunk = next_item(counter)
        if chunk >= partial.shape[0]:
            return
        _squared_error_chunk(queries, keys_t, values_t, targets, self_index, chunk, partial, far)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _squared_error_chunk(queries, keys_t, values_t, targets, self_index, chunk, partial, far):
    """The squared errors of the queries of chunk ``chunk`` into ``partial[chunk]``, but
    for its far rows, marked in ``far``."""
    n_queries = queries.shape[0]
    n_outputs = values_t.shape[0]
    dtype = queries.dtype
    scores = np.empty(_KEY_BLOCK, dtype=dtype)
    acc = np.empty(n_outputs, dtype=np.float64)
    stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
    sq = 0.0
    for i in range(chunk * _QUERY_BLOCK, stop):
        _, running_sum, is_far = near_row(queries[i], keys_t, values_t, self_index[i], scores, acc)
        if is_far:
            far[i] = True
            continue
        sq = _add_row_error(sq, acc, running_sum, targets[i])
    partial[chunk] = sq


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _add_row_error(sq, acc, running_sum, target):
    """sq + sum_c (acc[c] / running_sum - target[c])^2, added term by term (a row without
    weight predicts 0)."""
    inv = 1.0 / running_sum if running_sum > 0.0 else 0.0
    for c in range(acc.shape[0]):
        err = acc[c] * inv - target[c]
        sq += err * err
    return sq


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _far_errors_items(counter, queries, keys_t, values_t, targets, self_index, rows, errors):
    """The squared errors of the far rows ``rows`` (one per item), by ``pool_row``."""
    scores = np.empty(_KEY_BLOCK, dtype=queries.dtype)
    acc = np.empty(values_t.shape[0], dtype=np.float64)
    while True:
        t = next_item(counter)
        if t >= rows.shape[0]:
            return
        i = rows[t]
        _, running_sum = pool_row(queries[i], keys_t, values_t, self_index[i], scores, acc)
        errors[t] = _add_row_error(0.0, acc, running_sum, targets[i])
