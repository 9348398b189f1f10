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

Callers (``nbattn.regression``) validate and lay out the arrays:

* ``queries``  (n_queries, d), C-contiguous, already divided by h * sqrt(2);
* ``keys_t``   (d, n_keys), C-contiguous (feature-major, so the inner loop
  over keys is unit-stride and vectorises), scaled the same way;
* ``values_t`` (n_outputs, n_keys), C-contiguous;
* all three of one dtype, float32 or float64. Scores, weights and per-block
  sums are computed in that dtype; the running sums ``l`` and ``acc`` are
  float64 so that a million float32 weights add up without loss.

``exclude_self`` drops the pair (i, i): leave-one-out when queries are keys.
A query with no admissible key (one key, excluded) gets zeros and lse = -inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, fmax, like

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _block_scores(query_row, keys_t, j0, nb, scores):
    """scores[j] = -sum_f (keys_t[f, j0 + j] - query_row[f])**2 for j < nb."""
    keys_f = keys_t[0, j0 : j0 + nb]
    q0 = query_row[0]
    for j in range(nb):
        diff = keys_f[j] - q0
        scores[j] = -(diff * diff)
    for f in range(1, keys_t.shape[0]):
        keys_f = keys_t[f, j0 : j0 + nb]
        qf = query_row[f]
        for j in range(nb):
            diff = keys_f[j] - qf
            scores[j] -= diff * diff


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _block_max(scores, nb):
    """max(scores[:nb]); the scores are finite or -inf, never NaN."""
    best = like(-np.inf, scores)
    for j in range(nb):
        best = fmax(best, scores[j])
    return best


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _exp_shift_sum(scores, nb, shift):
    """scores[j] <- exp(scores[j] - shift); returns the sum of the new values."""
    total = like(0.0, scores)
    shift = like(shift, scores)
    for j in range(nb):
        w = fast_exp(scores[j] - shift)
        scores[j] = w
        total += w
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _exp_shift_sum_dot(scores, nb, shift, values_row):
    """Like _exp_shift_sum, and also returns sum_j exp(scores[j] - shift) * values_row[j]."""
    total = like(0.0, scores)
    weighted = like(0.0, scores)
    shift = like(shift, scores)
    for j in range(nb):
        w = fast_exp(scores[j] - shift)
        total += w
        weighted += w * values_row[j]
    return total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def pool_row(query_row, keys_t, values_t, own, scores, acc):
    """The online softmax of one query over all keys; key ``own`` is skipped (-1: none).

    Leaves the unnormalised weighted sums sum_j exp(s_j - m) v_j in ``acc``
    (float64, n_outputs) and returns ``(m, l)``: the running maximum and
    l = sum_j exp(s_j - m). ``scores`` is a KEY_BLOCK scratch buffer. With no
    admissible key, l = 0 and m = -inf.
    """
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
        block_max = _block_max(scores, nb)
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
        running_sum += _exp_shift_sum(scores, nb, running_max)
        for c in range(n_outputs):
            values_c = values_t[c, j0 : j0 + nb]
            weighted = like(0.0, scores)
            for j in range(nb):
                weighted += scores[j] * values_c[j]
            acc[c] += weighted
    return running_max, running_sum


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def gaussian_pool(queries, keys_t, values_t, exclude_self, self_offset=0):
    """Streaming Gaussian attention pooling; returns ``(out, lse)``.

    out (n_queries, n_outputs) in the input dtype, lse (n_queries,) float64.
    See the module docstring for the layout of the arguments. With
    ``exclude_self``, query i skips key ``i + self_offset`` (the offset places
    a block of query rows inside the keys, for leave-one-out over partitions).
    """
    n_queries = queries.shape[0]
    n_outputs = values_t.shape[0]
    dtype = queries.dtype
    out = np.zeros((n_queries, n_outputs), dtype=dtype)
    lse = np.empty(n_queries, dtype=np.float64)
    n_chunks = (n_queries + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for chunk in prange(n_chunks):
        scores = np.empty(_KEY_BLOCK, dtype=dtype)
        acc = np.empty(n_outputs, dtype=np.float64)
        stop = min(n_queries, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            own = i + self_offset if exclude_self else -1
            running_max, running_sum = pool_row(queries[i], keys_t, values_t, own, scores, acc)
            if running_sum > 0.0:
                for c in range(n_outputs):
                    out[i, c] = acc[c] / running_sum
                lse[i] = running_max + np.log(running_sum)
            else:
                lse[i] = -np.inf
    return out, lse


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def gaussian_weights(queries, keys_t, exclude_self):
    """Full attention-weight matrix (n_queries, n_keys) of the Gaussian score.

    Row i is softmax_j(-||q_i - k_j||^2); a row with no admissible key is 0.
    For small inputs only (plots, diagnostics): memory is n_queries x n_keys.
    """
    n_queries = queries.shape[0]
    n_keys = keys_t.shape[1]
    weights = np.zeros((n_queries, n_keys), dtype=queries.dtype)
    for i in prange(n_queries):
        row = weights[i]
        _block_scores(queries[i], keys_t, 0, n_keys, row)
        if exclude_self and i < n_keys:
            row[i] = -np.inf
        row_max = _block_max(row, n_keys)
        if row_max == -np.inf:
            row[:] = 0.0
            continue
        total = _exp_shift_sum(row, n_keys, row_max)
        inv_total = 1.0 / total
        for j in range(n_keys):
            row[j] *= inv_total
    return weights
