"""Score kernels: the (B, L, S) matrix s(q_i, k_j) of the attention scoring functions.

Callers (``nbattn.scores``) validate, broadcast the batch dimensions and lay
the arrays out; every array is C-contiguous and of one dtype (float32 or
float64). Keys come feature-major, ``k_t`` (B, E, S), so that the inner loop
runs over keys with unit stride and LLVM vectorises it; each (query row,
feature) pair is one ``axpy`` over a row of scores, which is the blocked
product ``Q K^T`` without a BLAS call inside ``prange`` (OpenBLAS threads and
numba threads would fight over the cores).

* ``dot_scores``       s_ij = scale * sum_e q_ie k_je   (dot, scaled dot, bilinear
  and low-rank bilinear once the caller has applied W, U, V to q or k)
* ``gaussian_scores``  s_ij = -1/2 sum_e (q_ie - k_je)^2  (inputs pre-divided by h)
* ``additive_scores``  s_ij = sum_h v_h tanh(uq_ih + wk_hj), with uq = U q and
  wk = W k computed by the caller: the (L, S, hidden) tensor is never held;
  one row of S scores is the accumulator while the hidden index runs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, like


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def dot_scores(q, k_t, scale):
    """scores[b, i, j] = scale * sum_e q[b, i, e] * k_t[b, e, j]."""
    n_batch, n_rows, n_feat = q.shape
    n_keys = k_t.shape[2]
    out = np.empty((n_batch, n_rows, n_keys), dtype=q.dtype)
    for t in prange(n_batch * n_rows):
        b = t // n_rows
        i = t - b * n_rows
        row = out[b, i]
        for j in range(n_keys):
            row[j] = 0.0
        qr = q[b, i]
        kb = k_t[b]
        for e in range(n_feat):
            qe = qr[e]
            kr = kb[e]
            for j in range(n_keys):
                row[j] += qe * kr[j]
        sc = like(scale, row)
        for j in range(n_keys):
            row[j] *= sc
    return out


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def gaussian_scores(q, k_t):
    """scores[b, i, j] = -1/2 sum_e (q[b, i, e] - k_t[b, e, j])^2 (direct differences)."""
    n_batch, n_rows, n_feat = q.shape
    n_keys = k_t.shape[2]
    out = np.empty((n_batch, n_rows, n_keys), dtype=q.dtype)
    for t in prange(n_batch * n_rows):
        b = t // n_rows
        i = t - b * n_rows
        row = out[b, i]
        for j in range(n_keys):
            row[j] = 0.0
        qr = q[b, i]
        kb = k_t[b]
        for e in range(n_feat):
            qe = qr[e]
            kr = kb[e]
            for j in range(n_keys):
                diff = kr[j] - qe
                row[j] += diff * diff
        half = like(-0.5, row)
        for j in range(n_keys):
            row[j] *= half
    return out


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def additive_scores(uq, wk_t, v):
    """scores[b, i, j] = sum_h v[h] tanh(uq[b, i, h] + wk_t[b, h, j]).

    ``uq`` (B, L, H) = U q, ``wk_t`` (B, H, S) = (W k) transposed, ``v`` (H,).
    Memory is O(B L S + (L + S) H): one score row accumulates over h.
    """
    n_batch, n_rows, n_hidden = uq.shape
    n_keys = wk_t.shape[2]
    out = np.empty((n_batch, n_rows, n_keys), dtype=uq.dtype)
    for t in prange(n_batch * n_rows):
        b = t // n_rows
        i = t - b * n_rows
        row = out[b, i]
        for j in range(n_keys):
            row[j] = 0.0
        ur = uq[b, i]
        wb = wk_t[b]
        for h in range(n_hidden):
            a = ur[h]
            vh = v[h]
            wr = wb[h]
            for j in range(n_keys):
                x = a + wr[j]
                # tanh(x) = sign(x) (1 - t) / (1 + t), t = exp(-2|x|): vectorisable,
                # absolute error ~1 ulp of 1 (np.tanh would be a scalar libm call)
                tt = fast_exp(like(-2.0, row) * abs(x))
                r = (like(1.0, row) - tt) / (like(1.0, row) + tt)
                if x < 0:
                    r = -r
                row[j] += vh * r
    return out
