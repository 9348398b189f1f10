"""Stable softmax kernels and the online-softmax state merge.

Every kernel works on the last axis of a C-contiguous 2-D (rows, n) or 3-D
(batch, rows, n) float32/float64 array; the functional layer
(``nbattn.attn.softmax``) moves the axis, broadcasts and validates.

    softmax(x)_j     = exp(x_j - m) / sum_k exp(x_k - m),      m = max_k x_k
    log_softmax(x)_j = x_j - m - log sum_k exp(x_k - m)

A row whose entries are all ``-inf`` (every position masked) has no
admissible entry: softmax gives an all-zero row and log_softmax an all
``-inf`` row, never NaN. Exponentials use the inlined, vectorisable
``fast_exp``; sums are accumulated in the input dtype per row and the
normaliser is inverted once per row.

``row_max`` and ``exp_shift_sum`` are the one row maximum and the one
exp-shift-sum of the CPU kernels (``nbattn.kernels.flash`` has a base-2
twin of the latter, ``exp2_shift_sum``, documented there).

The online-softmax state of a query over a set of keys is ``(out, lse)``
with ``out = sum_j softmax_j(s_j) v_j`` and ``lse = log sum_j exp(s_j)``;
``merge_states`` combines the states of two disjoint key sets exactly:

    m   = max(lse_a, lse_b)
    w_a = exp(lse_a - m),  w_b = exp(lse_b - m)
    out = (w_a out_a + w_b out_b) / (w_a + w_b),   lse = m + log(w_a + w_b)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, fmax, like


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def row_max(row):
    """max_j row[j] of a 1-D float array (a view such as ``tile[r, :nb]``); -inf when empty.

    The one row maximum of the CPU kernels (softmax, streaming attention,
    flash). Entries are finite or -inf, never NaN (the functional layer
    refuses NaN), so the NaN-ignoring ``fmax`` vectorises safely.
    """
    best = like(-np.inf, row)
    for j in range(row.shape[0]):
        best = fmax(best, row[j])
    return best


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def exp_shift_sum(row, shift):
    """In place ``row[j] <- exp(row[j] - shift)``; returns the sum of the new values.

    The one exp-shift-sum of the natural-base kernels (the flash kernels work
    in base 2 and have the twin ``nbattn.kernels.flash.exp2_shift_sum``).
    The sum is accumulated in the row's dtype (callers add it into float64
    per block); ``shift`` is cast to that dtype. -inf entries become 0.
    """
    total = like(0.0, row)
    s = like(shift, row)
    for j in range(row.shape[0]):
        w = fast_exp(row[j] - s)
        row[j] = w
        total += w
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _softmax_inplace(row):
    """row <- softmax(row) (all -inf -> zeros); returns log-sum-exp (float64)."""
    m = row_max(row)
    if m == -np.inf:
        for j in range(row.shape[0]):
            row[j] = 0.0
        return -np.inf
    total = exp_shift_sum(row, m)
    inv = like(1.0, row) / total
    for j in range(row.shape[0]):
        row[j] *= inv
    return np.float64(m) + np.log(np.float64(total))


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def softmax_rows(x):
    """Row-wise stable softmax of a 2-D array; returns a new array."""
    n_rows, n = x.shape
    out = np.empty_like(x)
    for i in prange(n_rows):
        row = out[i]
        for j in range(n):
            row[j] = x[i, j]
        _softmax_inplace(row)
    return out


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def log_softmax_rows(x):
    """Row-wise stable log-softmax of a 2-D array; an all -inf row stays -inf."""
    n_rows, n = x.shape
    out = np.empty_like(x)
    for i in prange(n_rows):
        xr = x[i]
        row = out[i]
        m = row_max(xr)
        if m == -np.inf:
            for j in range(n):
                row[j] = -np.inf
            continue
        for j in range(n):
            row[j] = xr[j]
        total = exp_shift_sum(row, m)
        shift = like(np.float64(m) + np.log(np.float64(total)), x)
        for j in range(n):
            row[j] = xr[j] - shift
    return out


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def masked_softmax_rows(x, valid_lens):
    """Softmax of ``x[i, :valid_lens[i]]``; positions at or past the length get 0.

    ``valid_lens`` is int64 (n_rows,) with values in [0, n]; a length of 0
    gives an all-zero row.
    """
    n_rows, n = x.shape
    out = np.zeros_like(x)
    for i in prange(n_rows):
        n_valid = valid_lens[i]
        row = out[i]
        for j in range(n_valid):
            row[j] = x[i, j]
        _softmax_inplace(row[:n_valid])
    return out


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def attention_weights(scores, bias, has_bias, causal, row_offset):
    """In place: scores (B, L, S) <- softmax_j(scores + bias, causal); returns lse (B, L).

    ``bias`` is (Bb, Lb, Sb) with Bb in {1, B}, Lb in {1, L}, Sb in {1, S}
    (size-1 axes broadcast); it holds 0 / -inf for boolean masks. ``causal``
    admits key j for query i only when j <= i + row_offset (torch's top-left
    alignment; ``row_offset`` is the global index of row 0 when the caller
    works on a slice of the query rows). Rows with no admissible key become
    zeros with lse = -inf.
    """
    n_batch, n_rows, n_keys = scores.shape
    lse = np.empty((n_batch, n_rows), dtype=np.float64)
    for t in prange(n_batch * n_rows):
        b = t // n_rows
        i = t - b * n_rows
        row = scores[b, i]
        if has_bias:
            bb = b if bias.shape[0] > 1 else 0
            bi = i if bias.shape[1] > 1 else 0
            if bias.shape[2] > 1:
                for j in range(n_keys):
                    row[j] += bias[bb, bi, j]
            else:
                for j in range(n_keys):
                    row[j] += bias[bb, bi, 0]
        n_adm = n_keys
        if causal:
            n_adm = min(n_keys, max(0, i + row_offset + 1))
            for j in range(n_adm, n_keys):
                row[j] = 0.0
        lse[b, i] = _softmax_inplace(row[:n_adm])
    return scores, lse


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def merge_states(out_a, lse_a, out_b, lse_b):
    """Merge two online-softmax states over disjoint key sets; returns (out, lse).

    The one log-sum-exp merge of nbattn (``nbattn.attn.softmax.merge_attention_states``,
    split-KV decoding and the Dask shard merge call it). Contract, NumPy arrays in and out:

    * ``out_a``, ``out_b``: (n, d), one dtype (float32 or float64), any layout;
    * ``lse_a``, ``lse_b``: (n,) float64, finite or -inf (never NaN or +inf);
    * returns ``out`` (n, d) in the dtype of ``out_a`` and ``lse`` (n,) float64.

    A side with lse = -inf (no admissible key) contributes nothing; both -inf
    gives zeros and -inf. The weights ``exp(lse - max)`` are at most 1, so
    nothing overflows whatever the magnitude of the lse values.
    """
    n, d = out_a.shape
    out = np.zeros_like(out_a)
    lse = np.empty(n, dtype=np.float64)
    for i in prange(n):
        la = lse_a[i]
        lb = lse_b[i]
        m = max(la, lb)
        if m == -np.inf:
            lse[i] = -np.inf
            continue
        wa = np.exp(la - m)
        wb = np.exp(lb - m)
        total = wa + wb
        ca = wa / total
        cb = wb / total
        for c in range(d):
            out[i, c] = ca * out_a[i, c] + cb * out_b[i, c]
        lse[i] = m + np.log(total)
    return out, lse
