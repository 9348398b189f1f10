"""Blocked (FlashAttention-style) scaled dot-product attention on the CPU.

For one (batch, head) slice with queries q_i (already multiplied by the
softmax scale), keys k_j and values v_j the forward kernel computes

    s_ij   = q_i . k_j + b_j + a (j - i)        (b: optional key bias, a: ALiBi slope)
    out_i  = sum_j softmax_j(s_ij) v_j
    lse_i  = log sum_j exp(s_ij)

over the admissible keys (all keys, or j <= i when ``causal``: top-left
alignment, as torch's ``is_causal``). Queries are cut into tiles of
``block_q`` rows and keys into tiles of ``block_k``; for every pair of tiles
the score tile S = Q K^T and the product P V are BLAS GEMM calls (``np.dot``
with a preallocated output, so there is no copy and no allocation per tile),
and the online softmax between them -- row maximum ``m``, row sum ``l``,
rescaling of the accumulator by exp(m_old - m_new), deferred normalisation --
is a vectorised loop with the inlined ``fast_exp``. Memory is
O(threads * block_q * block_k) for scratch plus the output: never the
queries x keys matrix. Causal tiles entirely above the diagonal are skipped.

The backward kernel recomputes P tile by tile from the saved ``lse``:

    P    = exp(S - lse)                 dV = P^T dO
    dP   = dO V^T                       D_i = sum_c dO_ic O_ic
    dS   = P o (dP - D)                 dQ = dS K (times the scale)   dK = dS^T Q

Five GEMMs per tile pair (the forward has two). Work items are
(batch*head, key-tile group): each owns its dK and dV rows; dQ is accumulated
per group in a buffer of its own and the groups are summed at the end, so
no two threads write the same memory. With as many heads as threads there is
one group and no extra buffer.

Callers (``nbattn.flash``) validate and lay out the arrays: q (BH, L, D) with
the scale applied, k (BH, S, D), v (BH, S, Dv), all C-contiguous and of one
dtype (float32 or float64); key_bias (BH, S) and slopes (BH,) of that dtype
(any shape when unused). BLAS must be held to one thread while these kernels
run (``np.dot`` inside ``prange`` otherwise starts BLAS threads that fight the
numba threads). Tiles are accumulated in the input dtype; ``m``, ``l`` and
``lse`` are float64. A row with no admissible key (every key biased to -inf)
gets zeros and lse = -inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, fmax, like


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _tile_order(t, n):
    """Interleave heavy and light causal tiles: 0, n-1, 1, n-2, ..."""
    half = t // 2
    if t % 2 == 0:
        return half
    return n - 1 - half


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _bias_and_mask(st, bias, slope, i0, j0, causal, use_bias, use_alibi):
    """Add the key bias and the ALiBi term to a score tile; mask j > i when causal."""
    mb, nb = st.shape
    if use_bias:
        for r in range(mb):
            row = st[r]
            for j in range(nb):
                row[j] += bias[j0 + j]
    if use_alibi:
        for r in range(mb):
            row = st[r]
            base = slope * like(j0 - (i0 + r), st)
            for j in range(nb):
                row[j] += base + slope * like(j, st)
    if causal:
        neg = like(-np.inf, st)
        for r in range(mb):
            first_masked = i0 + r - j0 + 1
            if first_masked < nb:
                row = st[r]
                for j in range(max(first_masked, 0), nb):
                    row[j] = neg


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _row_max(row):
    best = like(-np.inf, row)
    for j in range(row.shape[0]):
        best = fmax(best, row[j])
    return best


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _exp_shift_sum(row, shift):
    """row[j] <- exp(row[j] - shift); returns the sum of the new values."""
    total = like(0.0, row)
    for j in range(row.shape[0]):
        w = fast_exp(row[j] - shift)
        row[j] = w
        total += w
    return total


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def flash_forward(q, k, v, key_bias, slopes, causal, use_bias, use_alibi, block_q, block_k):
    """Blocked attention forward; returns ``(out, lse)``.

    out (BH, L, Dv) in the input dtype, lse (BH, L) float64. See the module
    docstring for the formula and the layout of the arguments.
    """
    n_bh, n_q, _ = q.shape
    n_k = k.shape[1]
    d_v = v.shape[2]
    out = np.empty((n_bh, n_q, d_v), dtype=q.dtype)
    lse = np.empty((n_bh, n_q), dtype=np.float64)
    n_qt = (n_q + block_q - 1) // block_q
    for item in prange(n_bh * n_qt):
        bh = item // n_qt
        i0 = _tile_order(item % n_qt, n_qt) * block_q
        mb = min(block_q, n_q - i0)
        s_flat = np.empty(mb * block_k, dtype=q.dtype)
        pv_flat = np.empty(mb * d_v, dtype=q.dtype)
        pv = pv_flat.reshape((mb, d_v))
        acc = np.zeros((mb, d_v), dtype=q.dtype)
        m = np.full(mb, -np.inf)
        l = np.zeros(mb)
        q_tile = q[bh, i0 : i0 + mb]
        bias = key_bias[bh] if use_bias else key_bias[0]
        slope = slopes[bh] if use_alibi else like(0.0, q)
        kv_end = min(n_k, i0 + mb) if causal else n_k
        for j0 in range(0, kv_end, block_k):
            nb = min(block_k, kv_end - j0)
            st = s_flat[: mb * nb].reshape((mb, nb))
            np.dot(q_tile, k[bh, j0 : j0 + nb].T, st)
            _bias_and_mask(st, bias, slope, i0, j0, causal, use_bias, use_alibi)
            for r in range(mb):
                row = st[r]
                m_new = max(m[r], np.float64(_row_max(row)))
                if m_new == -np.inf:
                    row[:] = 0.0
                    continue
                rescale = np.exp(m[r] - m_new)
                l[r] = l[r] * rescale + _exp_shift_sum(row, like(m_new, row))
                if rescale != 1.0:
                    factor = like(rescale, acc)
                    acc_row = acc[r]
                    for c in range(d_v):
                        acc_row[c] *= factor
                m[r] = m_new
            np.dot(st, v[bh, j0 : j0 + nb], pv)
            for r in range(mb):
                acc_row = acc[r]
                pv_row = pv[r]
                for c in range(d_v):
                    acc_row[c] += pv_row[c]
        for r in range(mb):
            if l[r] > 0.0:
                inv = like(1.0 / l[r], acc)
                for c in range(d_v):
                    out[bh, i0 + r, c] = acc[r, c] * inv
                lse[bh, i0 + r] = m[r] + np.log(l[r])
            else:
                out[bh, i0 + r, :] = 0.0
                lse[bh, i0 + r] = -np.inf
    return out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _add_into(dst, src):
    """dst += src for two 2-D arrays of one shape (dst may be a strided view)."""
    for r in range(src.shape[0]):
        d_row = dst[r]
        s_row = src[r]
        for c in range(src.shape[1]):
            d_row[c] += s_row[c]


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def flash_backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    key_bias,
    slopes,
    scale,
    causal,
    use_bias,
    use_alibi,
    n_groups,
    block_q,
    block_k,
):
    """Blocked attention backward; returns ``(dq, dk, dv)`` in the input dtype.

    ``q`` carries the softmax scale (q = scale * q_user), so dK = dS^T q needs
    no further factor and dQ_user = scale * dS K. ``lse`` (BH, L) in any float
    dtype. ``n_groups`` key-tile groups per (batch*head) run in parallel, each
    with its own dQ buffer; see the module docstring.
    """
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    d_v = v.shape[2]
    dtype = q.dtype
    delta = np.empty((n_bh, n_q), dtype=dtype)
    for row in prange(n_bh * n_q):
        bh = row // n_q
        i = row % n_q
        total = 0.0
        for c in range(d_v):
            total += np.float64(dout[bh, i, c]) * np.float64(out[bh, i, c])
        delta[bh, i] = total
    lse_t = np.empty((n_bh, n_q), dtype=dtype)
    for row in prange(n_bh * n_q):
        bh = row // n_q
        i = row % n_q
        lse_t[bh, i] = lse[bh, i]
    dq_part = np.zeros((n_groups, n_bh, n_q, d), dtype=dtype)
    dk = np.empty((n_bh, n_k, d), dtype=dtype)
    dv = np.empty((n_bh, n_k, d_v), dtype=dtype)
    n_kt = (n_k + block_k - 1) // block_k
    for item in prange(n_bh * n_groups):
        bh = item // n_groups
        group = item % n_groups
        s_flat = np.empty(block_q * block_k, dtype=dtype)
        dp_flat = np.empty(block_q * block_k, dtype=dtype)
        tk_flat = np.empty(block_k * max(d, d_v), dtype=dtype)
        tq_flat = np.empty(block_q * d, dtype=dtype)
        dk_acc = np.empty((block_k, d), dtype=dtype)
        dv_acc = np.empty((block_k, d_v), dtype=dtype)
        bias = key_bias[bh] if use_bias else key_bias[0]
        slope = slopes[bh] if use_alibi else like(0.0, q)
        neg_inf = like(-np.inf, q)
        sink = np.zeros(1, dtype=dtype)
        for kt in range(group, n_kt, n_groups):
            j0 = kt * block_k
            nb = min(block_k, n_k - j0)
            dk_acc[:nb] = 0.0
            dv_acc[:nb] = 0.0
            k_tile = k[bh, j0 : j0 + nb]
            v_tile = v[bh, j0 : j0 + nb]
            i_start = j0 if causal else 0
            for i0 in range(i_start, n_q, block_q):
                mb = min(block_q, n_q - i0)
                q_tile = q[bh, i0 : i0 + mb]
                do_tile = dout[bh, i0 : i0 + mb]
                st = s_flat[: mb * nb].reshape((mb, nb))
                dpt = dp_flat[: mb * nb].reshape((mb, nb))
                np.dot(q_tile, k_tile.T, st)
                _bias_and_mask(st, bias, slope, i0, j0, causal, use_bias, use_alibi)
                p_sum = like(0.0, q)
                for r in range(mb):
                    row = st[r]
                    shift = lse_t[bh, i0 + r]
                    if shift == neg_inf:
                        row[:] = 0.0
                    else:
                        # LLVM vectorises this loop only if its sum is used: kept in sink
                        p_sum += _exp_shift_sum(row, shift)
                sink[0] += p_sum
                tv = tk_flat[: nb * d_v].reshape((nb, d_v))
                np.dot(st.T, do_tile, tv)
                _add_into(dv_acc[:nb], tv)
                np.dot(do_tile, v_tile.T, dpt)
                for r in range(mb):
                    row = st[r]
                    dp_row = dpt[r]
                    di = delta[bh, i0 + r]
                    for j in range(nb):
                        row[j] = row[j] * (dp_row[j] - di)
                tq = tq_flat[: mb * d].reshape((mb, d))
                np.dot(st, k_tile, tq)
                _add_into(dq_part[group, bh, i0 : i0 + mb], tq)
                tk = tk_flat[: nb * d].reshape((nb, d))
                np.dot(st.T, q_tile, tk)
                _add_into(dk_acc[:nb], tk)
            dk[bh, j0 : j0 + nb] = dk_acc[:nb]
            dv[bh, j0 : j0 + nb] = dv_acc[:nb]
    factor = like(scale, q)
    if n_groups == 1:
        dq = dq_part[0]
        for row in prange(n_bh * n_q):
            bh = row // n_q
            i = row % n_q
            for c in range(d):
                dq[bh, i, c] *= factor
        return dq, dk, dv
    dq = np.empty((n_bh, n_q, d), dtype=dtype)
    for row in prange(n_bh * n_q):
        bh = row // n_q
        i = row % n_q
        for c in range(d):
            total = dq_part[0, bh, i, c]
            for g in range(1, n_groups):
                total += dq_part[g, bh, i, c]
            dq[bh, i, c] = total * factor
    return dq, dk, dv
