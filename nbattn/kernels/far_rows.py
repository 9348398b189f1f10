"""The far rows of Gaussian pooling: scores relative to the nearest key.

The direct score -||z_q - z_k||^2 carries a rounding error of about
(d + 3) u |s| (u: the dtype's unit roundoff), and overflows to -inf beyond
~1.8e308. Where the best score of a row lies below ``-config.FAR_SCORE_<dtype>``
(or every admissible score overflowed), that error would decide the weights:
at 1e8 in float32 every key would look equally far and a query at 1e160 would
get 0/0. A float32 row beyond ``FAR_SCORE_FLOAT32`` is first recomputed with
float64 scores (the differences of float32 numbers are exact in float64; the
same vectorised loop, about twice the cost of a float32 row). A row beyond
``FAR_SCORE_FLOAT64`` in float64 is recomputed (``far_state``, ``far_pool``)
relative to an anchor key a, its nearest:

    s_j - s_a = (z_j - z_a) . (2 z_q - z_j - z_a)

a product of a key difference and a sum taken with TwoSum (exact where the
query sits near the midpoint of two far-apart keys), with a relative error of
a few u instead of an absolute error of u |s|. The inputs are first
multiplied by a power of two c (exact) that keeps every product finite, and
the anchor is found in two steps: the smallest scaled direct distance, then
the best relative score against that candidate (which breaks the rounding
ties of the first step). These are three passes over the keys in strict
float64 (no fast-math; measured on one thread, d = 1 and 5: about 20x the
time of a direct float64 row, 50x a float32 one); only rows whose nearest key
is more than sqrt(FAR_SCORE_FLOAT64) = 4096 scaled units (~5800 widths) away,
or whose scores overflow, take them. The
row's log normaliser is lse = s_a + log sum_j exp(s_j - s_a); it is -inf
where s_a itself overflows. The direct kernels (``nbattn.kernels.pooling``,
``loo``, ``loo_1d``) send only those rows here.

These are rare rows: plain float64 loops. ``fastmath=False`` is spelled out
because numba lets a callee without an explicit setting inherit the fast-math
flags of the kernel it is first compiled from, and reassociation would undo
both the TwoSum compensation and the order r * (1/c) * (1/c) (0 * inf = NaN).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .fastmath import fast_exp
from .softmax import exp_shift_sum, row_max

_KEY_BLOCK = config.KEY_BLOCK
# Largest scaled magnitude in the far path: differences stay below 2**502 and
# products of two below 2**1004, so a score summed over up to 2**19 features is finite.
_FAR_MAGNITUDE = 2.0**500
_FLOAT64_MAX = float(np.finfo(np.float64).max)


@njit(fastmath=False, cache=config.CACHE)
def _far_scale(query_row, keys_t):
    """A power of two c with c * max(|z_q|, |z_k|) <= 2**500 (1 when already so)."""
    big = 0.0
    for f in range(query_row.shape[0]):
        big = max(big, abs(np.float64(query_row[f])))
    for f in range(keys_t.shape[0]):
        for j in range(keys_t.shape[1]):
            big = max(big, abs(np.float64(keys_t[f, j])))
    c = 1.0
    while big * c > _FAR_MAGNITUDE:
        c *= 2.0**-64
    return c


@njit(fastmath=False, cache=config.CACHE)
def _two_sum(a, b):
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit(fastmath=False, cache=config.CACHE)
def _unscaled(r, inv_c):
    """r / c**2, at most the largest float: a rounding-level positive r of a row
    whose scores are beyond the float range must not become +inf (inf - inf).
    1/c**2 itself may overflow, so 0 is returned as 0, not 0 * inf."""
    if r == 0.0:
        return 0.0
    return min(r * inv_c * inv_c, _FLOAT64_MAX)


@njit(fastmath=False, cache=config.CACHE)
def _far_block_distances(query_row, keys_t, j0, nb, c, out):
    """out[j] = sum_f (c k_{j0+j,f} - c q_f)^2 for j < nb (finite for the scaled inputs)."""
    for j in range(nb):
        out[j] = 0.0
    for f in range(keys_t.shape[0]):
        qf = c * np.float64(query_row[f])
        keys_f = keys_t[f, j0 : j0 + nb]
        for j in range(nb):
            diff = c * np.float64(keys_f[j]) - qf
            out[j] += diff * diff


@njit(fastmath=False, cache=config.CACHE)
def _far_block_relative(query_row, keys_t, j0, nb, a, c, out):
    """out[j] = c**2 (s_{j0+j} - s_a) = sum_f (c k_jf - c k_af) (2 c q_f - c k_jf - c k_af).

    The second factor is summed with TwoSum, so it stays accurate where the
    query sits near the midpoint of two far-apart keys (it then cancels).
    """
    for j in range(nb):
        out[j] = 0.0
    for f in range(keys_t.shape[0]):
        q2 = 2.0 * (c * np.float64(query_row[f]))
        ka = c * np.float64(keys_t[f, a])
        keys_f = keys_t[f, j0 : j0 + nb]
        for j in range(nb):
            kj = c * np.float64(keys_f[j])
            s1, e1 = _two_sum(q2, -kj)
            s2, e2 = _two_sum(s1, -ka)
            out[j] += (kj - ka) * (s2 + (e1 + e2))


@njit(fastmath=False, cache=config.CACHE)
def _far_block_scores(query_row, keys_t, j0, nb, own, a, c, out):
    """out[j] = r_{j0+j} = s_{j0+j} - s_a (float64; -inf for the key ``own``)."""
    _far_block_relative(query_row, keys_t, j0, nb, a, c, out)
    inv_c = 1.0 / c
    for j in range(nb):
        out[j] = _unscaled(out[j], inv_c)
    if j0 <= own < j0 + nb:
        out[own - j0] = -np.inf


@njit(fastmath=False, cache=config.CACHE)
def far_state(query_row, keys_t, own):
    """Anchor and normaliser of a far row: ``(a, c, s_a, shift, l)``.

    ``a`` is the nearest admissible key (-1 if there is none), ``c`` the power
    of two of the scaled arithmetic, ``s_a = -||z_q - z_a||^2`` (float64, -inf
    where it overflows), and with r_j = s_j - s_a (``_far_block_scores``)

        shift = max_j r_j,   l = sum_j exp(r_j - shift),

    so that w_j = exp(r_j - shift) / l and lse = s_a + shift + log l. The
    loops run over blocks of keys, vectorised (float64, no fast-math).
    """
    n_keys = keys_t.shape[1]
    c = _far_scale(query_row, keys_t)
    buf = np.empty(_KEY_BLOCK, dtype=np.float64)
    # 1. the smallest scaled direct distance: the anchor up to rounding ties
    anchor = np.int64(-1)  # int64 from its first value: the callees compile once
    best = np.inf
    for j0 in range(0, n_keys, _KEY_BLOCK):
        nb = min(_KEY_BLOCK, n_keys - j0)
        _far_block_distances(query_row, keys_t, j0, nb, c, buf)
        for j in range(nb):
            if buf[j] < best and j0 + j != own:
                best = buf[j]
                anchor = j0 + j
    if anchor < 0:
        return -1, c, -np.inf, 0.0, 0.0
    # 2. the best relative score against that candidate breaks the ties
    best = 0.0
    candidate = anchor
    for j0 in range(0, n_keys, _KEY_BLOCK):
        nb = min(_KEY_BLOCK, n_keys - j0)
        _far_block_relative(query_row, keys_t, j0, nb, candidate, c, buf)
        for j in range(nb):
            if buf[j] > best and j0 + j != own:
                best = buf[j]
                anchor = j0 + j
    # 3. online max and sum of exp(r_j) relative to the anchor
    shift = 0.0
    total = 0.0
    for j0 in range(0, n_keys, _KEY_BLOCK):
        nb = min(_KEY_BLOCK, n_keys - j0)
        _far_block_scores(query_row, keys_t, j0, nb, own, anchor, c, buf)
        block_max = row_max(buf[:nb])
        if block_max > shift:
            total *= np.exp(shift - block_max)
            shift = block_max
        total += exp_shift_sum(buf[:nb], shift)
    inv_c = 1.0 / c
    s_a = 0.0
    for f in range(keys_t.shape[0]):
        diff = c * np.float64(keys_t[f, anchor]) - c * np.float64(query_row[f])
        s_a -= diff * diff
    s_a = s_a * inv_c * inv_c
    return anchor, c, s_a, shift, total


@njit(fastmath=False, cache=config.CACHE)
def far_block_weights(query_row, keys_t, j0, nb, own, anchor, c, shift, weights):
    """weights[j] = exp(r_{j0+j} - shift) for j < nb (0 for the key ``own``); see far_state."""
    scores = np.empty(nb, dtype=np.float64)
    _far_block_scores(query_row, keys_t, j0, nb, own, anchor, c, scores)
    for j in range(nb):
        weights[j] = fast_exp(scores[j] - shift)


@njit(fastmath=False, cache=config.CACHE)
def far_pool(query_row, keys_t, values_t, own, weights, acc):
    """``pooling.pool_row`` for a far row: acc = sum_j exp(r_j - shift) v_j; returns
    ``(s_a + shift, l)``.

    ``weights`` is a KEY_BLOCK scratch buffer. With no admissible key: (-inf, 0).
    """
    n_keys = keys_t.shape[1]
    n_outputs = values_t.shape[0]
    acc[:] = 0.0
    anchor, c, s_a, shift, total = far_state(query_row, keys_t, own)
    if anchor < 0:
        return -np.inf, 0.0
    for j0 in range(0, n_keys, _KEY_BLOCK):
        nb = min(_KEY_BLOCK, n_keys - j0)
        far_block_weights(query_row, keys_t, j0, nb, own, anchor, c, shift, weights)
        for out in range(n_outputs):
            weighted = 0.0
            for j in range(nb):
                weighted += np.float64(weights[j]) * np.float64(values_t[out, j0 + j])
            acc[out] += weighted
    return s_a + shift, total


# --------------------------------------------------------------------------- the row
