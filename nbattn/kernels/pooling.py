"""Streaming Nadaraya-Watson (Gaussian attention pooling) on the CPU.

For queries q_i, keys k_j and values v_j the kernels compute

    s_ij   = -|| q_i - k_j ||^2                       (inputs pre-scaled by 1/(h sqrt 2))
    out_i  = sum_j softmax_j(s_ij) v_j
    lse_i  = log sum_j exp(s_ij)

with the online softmax: keys are visited in blocks of ``config.KEY_BLOCK``;
per query a running maximum ``m``, a running sum ``l`` and a running weighted
sum ``acc`` are kept and rescaled by ``exp(m_old - m_new)`` when a block raises
the maximum. The queries x keys matrix is never held, so memory is
O((n_queries + n_keys) * (d + n_outputs)), and a query far from every key
gets the value of its nearest key instead of 0/0.

One pass. A Gaussian score is never positive (it is minus a sum of squares,
and rounding keeps the sign), so exp(s) <= 1 never overflows and
``gaussian_pool`` first tries each row without a running maximum: one fused
loop per key block computes the score, exp(s), their sum l = sum_j exp(s_j)
and the weighted sums acc = sum_j exp(s_j) v_j (``one_pass_row``; the
squared distances of all features but the last two are summed in a buffer, the
last two are fused into the exponential). The driver first divides each
column of values by a power of two (exact) so that |v| <= 2, and multiplies
the outputs back. What the missing shift can cost is underflow: ``fast_exp``
flushes weights below the smallest normal number T (2**-126 float32,
2**-1022 float64) to zero, and a product w v below T is rounded to a
multiple of T u (u the unit roundoff). Over n keys they change l by less
than n T and acc by less than n T (2 + u), so out = acc / l moves by less
than about 4 n T / l, relative to the values' scale (max |v| in (1, 2]). So
a row is accepted when

    l >= one_pass_min_sum = n 2**-80 (float32),  n 2**-950 (float64),

which bounds that error by 2**-44 (float32) and 2**-70 (float64), far below
the unit roundoff (2**-24, 2**-53); a subnormal or zero l fails. Such a row
(a query whose best score is below about -55 in float32 or -650 in float64)
is redone by ``pool_row``, the max-shifted online softmax described next,
which also holds every far-row path below; and since neighbouring queries
tend to be alike, the next row then starts there too. For the same reason,
once the first row of a chunk of ``config.QUERY_BLOCK`` queries passes, the
others take the one pass together (``one_pass_rows``): each key block is read
once for the chunk, not once per row (a key set beyond the caches was
otherwise streamed from memory per row), and each row keeps the order of its
sums, so its bits are those of the row alone. An accepted row has
m = 0, l its unshifted sum and lse = log l, so callers see one contract.

Callers (``nbattn.smoothing.regression``, with the one-pass ``centred_scaled`` at the
end of this module) validate and lay out the arrays:

* ``queries``  (n_queries, d), C-contiguous, already divided by h * sqrt(2);
* ``keys_t``   (d, n_keys), C-contiguous (feature-major, so the inner loop
  over keys is unit-stride and vectorises), scaled the same way;
* ``values_t`` (n_outputs, n_keys), C-contiguous;
* all three of one dtype, float32 or float64. Scores, weights and per-block
  sums are computed in that dtype; the running sums ``l`` and ``acc`` are
  float64 so that a million float32 weights add up without loss.

``exclude_self`` drops the pair (i, i): leave-one-out when queries are keys.
A query with no admissible key (one key, excluded) gets zeros and lse = -inf.

Far rows. Where the best score of a row lies below ``-config.FAR_SCORE_<dtype>``
(or every admissible score overflowed), the rounding of the direct scores would
decide the weights. A float32 row is then first recomputed with float64 scores
(the differences of float32 numbers are exact in float64); a float64 one
relative to its nearest key (``nbattn.kernels.far_rows``: ``far_state``,
``far_pool``). The second-pass kernels of ``nbattn.kernels.loo`` find the far
rows again from lse (lse >= m, so lse < -FAR_SCORE implies m < -FAR_SCORE; -inf
with an admissible key is an overflowed row). The direct path costs one
comparison per row for all this.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.core import types
from numba.extending import overload

from .. import config
from .far_rows import far_block_weights, far_pool, far_state
from .fastmath import exp_within, fast_exp, like
from .items import next_item, run_items
from .layout_pass import centred_scaled  # noqa: F401 - the op module's layout pass
from .softmax import exp_shift_sum, row_max

# Compile-time constants (read from config when this module is imported).
_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK
_FAR_SCORE_FLOAT32 = float(config.FAR_SCORE_FLOAT32)
_FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)
# Per key, the smallest one-pass sum accepted (module docstring, "One pass").
_ONE_PASS_MIN_SUM_FLOAT32 = 2.0**-80
_ONE_PASS_MIN_SUM_FLOAT64 = 2.0**-950


def far_score(array):
    """The score magnitude beyond which a row of ``array``'s dtype is far (see module doc)."""
    return _FAR_SCORE_FLOAT32 if array.dtype == np.float32 else _FAR_SCORE_FLOAT64


@overload(far_score, inline="always")
def _far_score_overload(array):
    if array.dtype == types.float32:
        return lambda array: _FAR_SCORE_FLOAT32
    return lambda array: _FAR_SCORE_FLOAT64


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def has_admissible_key(n_keys, own):
    """Whether a row over ``n_keys`` keys with key ``own`` skipped (-1: none) has any key."""
    return n_keys - (1 if 0 <= own < n_keys else 0) > 0


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _block_scores(query_row, keys_t, j0, nb, scores):
    """scores[j] = -sum_f (keys_t[f, j0 + j] - query_row[f])**2 for j < nb.

    In the dtype of ``scores``: a float64 buffer with float32 inputs takes the
    differences exactly (the float32 far rows, module docstring).
    """
    keys_f = keys_t[0, j0 : j0 + nb]
    q0 = like(query_row[0], scores)
    for j in range(nb):
        diff = like(keys_f[j], scores) - q0
        scores[j] = -(diff * diff)
    for f in range(1, keys_t.shape[0]):
        keys_f = keys_t[f, j0 : j0 + nb]
        qf = like(query_row[f], scores)
        for j in range(nb):
            diff = like(keys_f[j], scores) - qf
            scores[j] -= diff * diff


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _exp_shift_sum_dot(scores, nb, shift, values_row):
    """exp_shift_sum without the store, and also sum_j exp(scores[j] - shift) * values_row[j]."""
    total = like(0.0, scores)
    weighted = like(0.0, scores)
    shift = like(shift, scores)
    for j in range(nb):
        w = fast_exp(scores[j] - shift)
        total += w
        weighted += w * values_row[j]
    return total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _online_row(query_row, keys_t, values_t, own, scores, acc):
    """The direct online softmax of ``pool_row``, scores in the dtype of ``scores``."""
    n_keys = keys_t.shape[1]
    n_outputs = values_t.shape[0]
    running_max = -np.inf
    running_sum = 0.0
    acc[:] = 0.0
    for j0 in range(0, n_keys, _KEY_BLOCK):
        nb = min(_KEY_BLOCK, n_keys - j0)
        _block_scores(query_row, keys_t, j0, nb, scores)
        if j0 <= own < j0 + nb:
            scores[own - j0] = -np.inf
        block_max = row_max(scores[:nb])
        if block_max == -np.inf:
            continue
        if block_max > running_max:
            rescale = np.exp(running_max - block_max)
            running_sum *= rescale
            for c in range(n_outputs):
                acc[c] *= rescale
            running_max = block_max
        if n_outputs == 1:  # one fused pass: exp, sum and weighted sum
            total, weighted = _exp_shift_sum_dot(scores, nb, running_max, values_t[0, j0 : j0 + nb])
            running_sum += total
            acc[0] += weighted
            continue
        running_sum += exp_shift_sum(scores[:nb], running_max)
        for c in range(n_outputs):
            values_c = values_t[c, j0 : j0 + nb]
            weighted = like(0.0, scores)
            for j in range(nb):
                weighted += scores[j] * values_c[j]
            acc[c] += weighted
    return running_max, running_sum


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _online_row_float64(query_row, keys_t, values_t, own, acc):
    """_online_row with float64 scores (a float32 far row; not inlined: it is rare)."""
    return _online_row(query_row, keys_t, values_t, own, np.empty(_KEY_BLOCK, np.float64), acc)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def pool_row(query_row, keys_t, values_t, own, scores, acc):
    """The online softmax of one query over all keys; key ``own`` is skipped (-1: none).

    Leaves the unnormalised weighted sums sum_j exp(s_j - m) v_j in ``acc``
    (float64, n_outputs) and returns ``(m, l)``: the reference score and
    l = sum_j exp(s_j - m), so that out = acc / l and lse = m + log l.
    ``scores`` is a KEY_BLOCK scratch buffer. With no admissible key, l = 0
    and m = -inf.

    Far rows (module docstring): a float32 row whose best score lies beyond
    ``FAR_SCORE_FLOAT32`` is recomputed with float64 scores (differences of
    float32 numbers are exact there); a row beyond ``FAR_SCORE_FLOAT64``, or
    whose scores all overflowed, by the anchored ``far_pool``.
    """
    running_max, running_sum = _online_row(query_row, keys_t, values_t, own, scores, acc)
    limit = far_score(scores)
    if limit < _FAR_SCORE_FLOAT64 and not running_max >= -limit:  # float32, far
        running_max, running_sum = _online_row_float64(query_row, keys_t, values_t, own, acc)
    if running_max < -_FAR_SCORE_FLOAT64 or (
        running_max == -np.inf and has_admissible_key(keys_t.shape[1], own)
    ):
        return far_pool(query_row, keys_t, values_t, own, scores, acc)
    return running_max, running_sum


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def near_row(query_row, keys_t, values_t, own, scores, acc):
    """:func:`pool_row` without its far paths: ``(m, l, far)``, where ``far`` says that
    the row is one of the far rows (module docstring), for which ``pool_row`` gives the
    answer instead. The streaming pass leaves the far rows to a second kernel, compiled
    only when a call has one (their paths cost the first compile about 4 s)."""
    running_max, running_sum = _online_row(query_row, keys_t, values_t, own, scores, acc)
    limit = far_score(scores)
    far = (
        (limit < _FAR_SCORE_FLOAT64 and not running_max >= -limit)
        or running_max < -_FAR_SCORE_FLOAT64
        or (running_max == -np.inf and has_admissible_key(keys_t.shape[1], own))
    )
    return running_max, running_sum, far


# --------------------------------------------------------------------------- one pass
# A Gaussian score is never positive, so exp(s) <= 1 cannot overflow and the
# first attempt at a row needs no running maximum: one fused pass per key
# (score, exp, sum, weighted sum). See "One pass" in the module docstring for
# when a row must be redone with the max-shifted online softmax.


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def fused_range(query_row, keys_t, values_t, a, b, shift, buf, acc, coarse):
    """Keys a <= j < b of the one-pass row: returns sum_j exp(s_j - shift) (input dtype)
    and adds sum_j exp(s_j - shift) v_j into ``acc`` (float64). ``buf`` holds at least
    b - a floats. ``shift`` (0 here; a bound on the scores in ``nbattn.kernels.tree_pool``)
    is rounded to the input dtype. ``coarse``: None (here) for ``fast_exp``, a bool for
    ``coarse_exp`` (``fastmath.exp_within``; the tree's sums within a tolerance).

    The squared distance over the features but the last two is accumulated in
    ``buf``; the last two features, the exponential and the sums are one loop (with one
    output; with several the weights go through ``buf``). One pass through ``buf`` fewer
    than with the last feature alone in the loop: about 9 % less time a pair at two
    features and 5 % at three (none measurable at four), exact streaming on one thread of
    an AMD EPYC (Zen 4), best of three interleaved runs; one more compiled copy of the
    loop (about 1 CPU s on the first call).
    """
    n = b - a
    d = keys_t.shape[0]
    n_outputs = values_t.shape[0]
    last = keys_t[d - 1, a:b]
    q_last = query_row[d - 1]
    before = keys_t[max(d - 2, 0), a:b]
    q_before = query_row[max(d - 2, 0)]
    if d > 2:
        keys_f = keys_t[0, a:b]
        q0 = query_row[0]
        for j in range(n):
            diff = keys_f[j] - q0
            buf[j] = diff * diff
        for f in range(1, d - 2):
            keys_f = keys_t[f, a:b]
            qf = query_row[f]
            for j in range(n):
                diff = keys_f[j] - qf
                buf[j] += diff * diff
    s = like(shift, buf)
    total = like(0.0, buf)
    if n_outputs == 1:
        values_row = values_t[0, a:b]
        weighted = like(0.0, buf)
        if d == 1:
            for j in range(n):
                diff = last[j] - q_last
                w = exp_within(-(diff * diff) - s, coarse)
                total += w
                weighted += w * values_row[j]
        elif d == 2:
            for j in range(n):
                gap = before[j] - q_before
                diff = last[j] - q_last
                w = exp_within(-(gap * gap + diff * diff) - s, coarse)
                total += w
                weighted += w * values_row[j]
        else:
            for j in range(n):
                gap = before[j] - q_before
                diff = last[j] - q_last
                w = exp_within(-((buf[j] + gap * gap) + diff * diff) - s, coarse)
                total += w
                weighted += w * values_row[j]
        acc[0] += weighted
        return total
    if d == 2:  # the multi-output path keeps the distances in buf
        for j in range(n):
            gap = before[j] - q_before
            buf[j] = gap * gap
    elif d > 2:
        for j in range(n):
            gap = before[j] - q_before
            buf[j] += gap * gap
    for j in range(n):
        diff = last[j] - q_last
        dist = diff * diff
        if d > 1:
            dist += buf[j]
        w = exp_within(-dist - s, coarse)
        buf[j] = w
        total += w
    for c in range(n_outputs):
        values_c = values_t[c, a:b]
        weighted = like(0.0, buf)
        for j in range(n):
            weighted += buf[j] * values_c[j]
        acc[c] += weighted
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def one_pass_row(query_row, keys_t, values_t, own, buf, acc):
    """l = sum_j exp(s_j) over all keys but ``own`` (float64); acc = sum_j exp(s_j) v_j.

    No shift: valid where l passes :func:`one_pass_min_sum` (module docstring,
    "One pass"); the key ``own`` is skipped, not subtracted (its weight may
    dominate the row).
    """
    n_keys = keys_t.shape[1]
    acc[:] = 0.0
    total = 0.0
    for j0 in range(0, n_keys, _KEY_BLOCK):
        j1 = min(n_keys, j0 + _KEY_BLOCK)
        # the parts before and after ``own``: one call site of the long fused pass
        lead_end = own if j0 <= own < j1 else j1
        a, b = j0, lead_end
        for _ in range(2):
            if b > a:
                total += fused_range(query_row, keys_t, values_t, a, b, 0.0, buf, acc, None)
            a, b = lead_end + 1, j1
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def one_pass_rows(
    queries, first, stop, keys_t, values_t, exclude_self, self_offset, buf, totals, accs
):
    """:func:`one_pass_row` of the rows first <= i < stop together, into ``totals[i - first]``
    and ``accs[i - first]``: each row summed in the same order as alone (to the same bits),
    but each block of keys read once for all of them, so that a key set larger than the
    caches is streamed from memory once per chunk of queries, not once per query. The key
    ``own`` is skipped by a loop over the parts before and after it: one call site of the
    long fused pass (each inlined copy costs compile time)."""
    n_keys = keys_t.shape[1]
    for r in range(stop - first):
        totals[r] = 0.0
        for c in range(accs.shape[1]):
            accs[r, c] = 0.0
    for j0 in range(0, n_keys, _KEY_BLOCK):
        j1 = min(n_keys, j0 + _KEY_BLOCK)
        for r in range(stop - first):
            i = first + r
            own = i + self_offset if exclude_self else -1
            lead_end = own if j0 <= own < j1 else j1
            a, b = j0, lead_end
            for _ in range(2):
                if b > a:
                    totals[r] += fused_range(
                        queries[i], keys_t, values_t, a, b, 0.0, buf, accs[r], None
                    )
                a, b = lead_end + 1, j1


def one_pass_min_sum(n_keys, array):
    """The smallest l = sum_j exp(s_j) a one-pass row of ``array``'s dtype may have
    (module docstring, "One pass").

    ``n_keys * 2**-80`` in float32 and ``n_keys * 2**-950`` in float64: with
    values scaled to |v| <= 2, the weights flushed to zero and the products
    that underflow then change the output by less than 2**-44 (float32) and
    2**-70 (float64) of the values' scale.
    """
    per_key = _ONE_PASS_MIN_SUM_FLOAT32 if array.dtype == np.float32 else _ONE_PASS_MIN_SUM_FLOAT64
    return n_keys * per_key


@overload(one_pass_min_sum, inline="always")
def _one_pass_min_sum_overload(n_keys, array):
    if array.dtype == types.float32:
        return lambda n_keys, array: n_keys * _ONE_PASS_MIN_SUM_FLOAT32
    return lambda n_keys, array: n_keys * _ONE_PASS_MIN_SUM_FLOAT64


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def pool_row_one_pass(query_row, keys_t, values_t, own, scores, acc):
    """``pool_row`` that tries the one fused pass first; same contract, returns ``(m, l)``.

    Values must be scaled to |v| <= 2 (as :func:`gaussian_pool` does): the
    acceptance bound of the one pass assumes it. A row whose sum falls below
    :func:`one_pass_min_sum` (a query far from its keys, whose weights
    underflow) is redone by ``pool_row``, which also handles the far rows.
    """
    total = one_pass_row(query_row, keys_t, values_t, own, scores, acc)
    if total >= one_pass_min_sum(keys_t.shape[1], scores):
        return 0.0, total
    return pool_row(query_row, keys_t, values_t, own, scores, acc)


@njit(fastmath=False, cache=config.CACHE)
def value_scales(values_t):
    """Per output c the exponent e_c with max_j |v_cj| < 2**e_c <= 2 max_j |v_cj| (0 for zeros).

    Dividing a column by 2**(e_c - 1) (``math.ldexp``, exact) leaves it in
    [-2, 2]: the range the one-pass bound assumes, and sums of n such values
    cannot overflow where values near the largest float would.
    """
    n_outputs = values_t.shape[0]
    exponents = np.zeros(n_outputs, dtype=np.int64)
    for c in range(n_outputs):
        big = 0.0
        for j in range(values_t.shape[1]):
            big = max(big, abs(np.float64(values_t[c, j])))
        if big > 0.0:
            exponents[c] = math.frexp(big)[1]
    return exponents


@njit(fastmath=False, cache=config.CACHE)
def scaled_values(values_t, exponents):
    """values_t[c] * 2**(1 - exponents[c]) in values_t's dtype (exact where it stays normal)."""
    out = np.empty_like(values_t)
    for c in range(values_t.shape[0]):
        shift = 1 - exponents[c]
        for j in range(values_t.shape[1]):
            out[c, j] = math.ldexp(np.float64(values_t[c, j]), shift)
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def store_row(out, lse, i, running_max, running_sum, acc, exponents):
    """out[i, c] = acc[c] / l * 2**(e_c - 1), lse[i] = m + log l (zeros and -inf when l = 0)."""
    if running_sum > 0.0:
        for c in range(out.shape[1]):
            out[i, c] = math.ldexp(acc[c] / running_sum, exponents[c] - 1)
        lse[i] = running_max + np.log(running_sum)
    else:
        out[i, :] = 0.0
        lse[i] = -np.inf


def gaussian_pool(queries, keys_t, values_t, exclude_self, self_offset=0):
    """Streaming Gaussian attention pooling; returns ``(out, lse)``.

    out (n_queries, n_outputs) in the input dtype, lse (n_queries,) float64.
    See the module docstring for the layout of the arguments. With
    ``exclude_self``, query i skips key ``i + self_offset`` (the offset places
    a block of query rows inside the keys, for leave-one-out over partitions).
    Each row is one fused pass where its weights allow it (``one_pass_row``),
    else the max-shifted online softmax (``near_row``); a row after one that failed
    the one-pass bound goes to ``near_row`` directly. The far rows (module docstring)
    are then computed by ``pool_row`` in a second kernel, :func:`_far_items`.
    The chunks of queries, then the far rows, are the work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    exponents, values_s, log_min_sum, out, lse = _pool_setup(queries, keys_t, values_t)
    rows = (queries, keys_t, values_s, bool(exclude_self), np.int64(self_offset), exponents)
    far = np.zeros(queries.shape[0], dtype=np.bool_)
    run_items(_pool_items, *rows, log_min_sum, out, lse, far)
    if far.any():
        run_items(_far_items, *rows, np.flatnonzero(far), out, lse)
    return out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _pool_setup(queries, keys_t, values_t):
    """``(exponents, values_s, log_min_sum, out, lse)``: the values' power-of-two scales
    and the scaled values, the one-pass bound, and the outputs that :func:`_pool_items`
    fills."""
    exponents = value_scales(values_t)
    values_s = scaled_values(values_t, exponents)
    n_queries = queries.shape[0]
    out = np.zeros((n_queries, values_t.shape[0]), dtype=queries.dtype)
    lse = np.empty(n_queries, dtype=np.float64)
    log_min_sum = np.log(one_pass_min_sum(keys_t.shape[1], queries))
    return exponents, values_s, log_min_sum, out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _pool_items(
    counter,
    queries,
    keys_t,
    values_s,
    exclude_self,
    self_offset,
    exponents,
    log_min_sum,
    out,
    lse,
    far,
):
    """The chunks of queries that ``counter`` hands this thread: their rows of ``out`` and
    ``lse``, except the far rows, marked in ``far`` (and left to :func:`_far_items`)."""
    n_queries = queries.shape[0]
    n_outputs = values_s.shape[0]
    dtype = queries.dtype
    n_chunks = (n_queries + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        scores = np.empty(_KEY_BLOCK, dtype=dtype)
        acc = np.empty(n_outputs, dtype=np.float64)
        totals = np.empty(_QUERY_BLOCK, dtype=np.float64)
        accs = np.empty((_QUERY_BLOCK, n_outputs), dtype=np.float64)
        first = chunk * _QUERY_BLOCK
        stop = min(n_queries, first + _QUERY_BLOCK)
        try_one_pass = True
        together = False  # the rows after the first summed by one_pass_rows
        for i in range(first, stop):
            own = i + self_offset if exclude_self else -1
            total = 0.0
            if together:
                total = totals[i - first - 1]
                for c in range(n_outputs):
                    acc[c] = accs[i - first - 1, c]
            elif try_one_pass:
                total = one_pass_row(queries[i], keys_t, values_s, own, scores, acc)
            if (together or try_one_pass) and total >= one_pass_min_sum(keys_t.shape[1], scores):
                # the first row passed: the others (neighbouring queries tend to be
                # alike) take the one pass together, each key block read once for them
                if i == first and stop > first + 1:
                    one_pass_rows(
                        queries, first + 1, stop, keys_t, values_s, exclude_self,
                        self_offset, scores, totals, accs,
                    )  # fmt: skip
                    together = True
                running_max, running_sum, is_far = 0.0, total, False
            else:
                running_max, running_sum, is_far = near_row(
                    queries[i], keys_t, values_s, own, scores, acc
                )
            # Neighbouring queries tend to be alike: after a row whose unshifted sum
            # would have failed the bound (a far row always would), the next row starts
            # with the shifted path.
            try_one_pass = running_sum > 0.0 and running_max + np.log(running_sum) >= log_min_sum
            if is_far:
                far[i] = True
                try_one_pass = False
            else:
                store_row(out, lse, i, running_max, running_sum, acc, exponents)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _far_items(
    counter, queries, keys_t, values_s, exclude_self, self_offset, exponents, rows, out, lse
):
    """The far rows ``rows`` (one per item) of :func:`gaussian_pool`, by ``pool_row``."""
    scores = np.empty(_KEY_BLOCK, dtype=queries.dtype)
    acc = np.empty(values_s.shape[0], dtype=np.float64)
    while True:
        t = next_item(counter)
        if t >= rows.shape[0]:
            return
        i = rows[t]
        own = i + self_offset if exclude_self else -1
        running_max, running_sum = pool_row(queries[i], keys_t, values_s, own, scores, acc)
        store_row(out, lse, i, running_max, running_sum, acc, exponents)


def gaussian_weights(queries, keys_t, exclude_self):
    """Full attention-weight matrix (n_queries, n_keys) of the Gaussian score.

    Row i is softmax_j(-||q_i - k_j||^2); a row with no admissible key is 0.
    For small inputs only (plots, diagnostics): memory is n_queries x n_keys.
    A row whose best score lies beyond ``FAR_SCORE_<dtype>`` (or overflowed)
    takes the anchored weights of ``far_state`` (module docstring). The rows are
    the work items of :func:`nbattn.kernels.items.run_items`.
    """
    weights = np.zeros((queries.shape[0], keys_t.shape[1]), dtype=queries.dtype)
    far = np.zeros(queries.shape[0], dtype=np.bool_)
    run_items(_weights_items, queries, keys_t, bool(exclude_self), weights, far)
    if far.any():  # their own kernel, compiled only when a call has one
        run_items(
            _far_weights_items, queries, keys_t, bool(exclude_self), np.flatnonzero(far), weights
        )
    return weights


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _weights_items(counter, queries, keys_t, exclude_self, weights, far):
    """The rows of ``weights`` that ``counter`` hands this thread, but the far ones,
    marked in ``far``."""
    while True:
        i = next_item(counter)
        if i >= queries.shape[0]:
            return
        far[i] = not _weights_row(queries, keys_t, exclude_self, i, weights)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _far_weights_items(counter, queries, keys_t, exclude_self, rows, weights):
    """The far rows ``rows`` of ``weights`` (one per item): the anchored weights of
    ``far_state`` (module docstring)."""
    n_keys = keys_t.shape[1]
    while True:
        t = next_item(counter)
        if t >= rows.shape[0]:
            return
        i = rows[t]
        row = weights[i]
        row[:] = 0.0
        own = np.int64(i) if exclude_self else np.int64(-1)
        anchor, c, _, shift, total = far_state(queries[i], keys_t, own)
        if anchor >= 0:
            far_block_weights(queries[i], keys_t, 0, n_keys, own, anchor, c, shift, row)
            inv_total = like(1.0 / total, row)
            for j in range(n_keys):
                row[j] *= inv_total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _weights_row(queries, keys_t, exclude_self, i, weights):
    """Row ``i`` of ``weights`` and True; for a far row False, its scores left in the row."""
    n_keys = keys_t.shape[1]
    row = weights[i]
    _block_scores(queries[i], keys_t, 0, n_keys, row)
    if exclude_self and i < n_keys:
        row[i] = -np.inf
    best = row_max(row)
    if best < -far_score(row) or best == -np.inf:
        return False
    total = exp_shift_sum(row, best)
    inv_total = 1.0 / total
    for j in range(n_keys):
        row[j] *= inv_total
    return True
