"""Blocked (FlashAttention-style) scaled dot-product attention on the CPU.

For one (batch, head) slice with queries q_i, keys k_j and values v_j the
forward kernel computes

    s_ij   = scale q_i . k_j + b_j + a (j - i)     (b: optional key bias, a: ALiBi slope)
    out_i  = sum_j softmax_j(s_ij) v_j
    lse_i  = log sum_j exp(s_ij)

over the admissible keys (all keys, or j <= i when ``causal``: top-left
alignment, as torch's ``is_causal``). It works in base 2: the caller passes
q, b and a multiplied by log2(e) (and q by the scale), so the kernel sees
t_ij = s_ij log2(e) and uses exp(s) = 2**t, whose range reduction is exact
(``exp2`` below is 1/3 cheaper than ``fast_exp`` in the softmax loop). That
is why this module has its own exponential and its own exp-shift-sum
(``exp2_shift_sum``, the base-2 twin of ``nbattn.kernels.softmax.exp_shift_sum``)
while the row maximum is the shared ``nbattn.kernels.softmax.row_max``. The
caller (``nbattn.flash``) keeps every base-2 score within the dtype's range:
huge key biases are shifted by their maximum, and scores or ALiBi terms that
would overflow are refused there.

Queries are cut into tiles of ``block_q`` rows and keys into tiles of
``block_k``; for every pair of tiles the score tile T = Q K^T and the product
P V are BLAS GEMM calls (``np.dot`` with a preallocated output, so there is
no copy and no allocation per tile), and the online softmax between them --
row maximum ``m``, row sum ``l``, rescaling of the accumulator by
2**(m_old - m_new), deferred normalisation -- is a vectorised loop with the
inlined ``exp2``. Memory is O(threads * block_q * block_k) for scratch plus
the output: never the queries x keys matrix. Causal tiles entirely above
the diagonal are skipped; lse is returned in natural units,
lse = m ln 2 + log l.

The backward kernel recomputes P tile by tile from the saved ``lse``:

    P    = 2**(T - lse log2 e)          dV = P^T dO
    dP   = dO V^T                       D_i = sum_c dO_ic O_ic
    dS   = P o (dP - D)                 dQ = scale dS K     dK = scale dS^T Q

(dK is computed as ln 2 dS^T Q' with Q' the base-2 queries.) Five GEMMs per
tile pair (the forward has two). Work items are (batch*head, key-tile
group): each owns its dK and dV rows; dQ is accumulated per group in a
buffer of its own and the groups are summed at the end, so no two threads
write the same memory. With as many heads as threads there is one group and
no extra buffer.

Callers (``nbattn.flash``) validate and lay out the arrays: q (BH, L, D)
times scale * log2(e), k (BH, S, D), v (BH, S, Dv), all C-contiguous and of
one dtype (float32 or float64); key_bias (BH, S) and slopes (BH,) of that
dtype, times log2(e) (any shape when unused). BLAS must be held to one
thread while these kernels run (``np.dot`` inside ``prange`` otherwise starts
BLAS threads that fight the numba threads). Tiles are accumulated in the
input dtype; ``m``, ``l`` and ``lse`` are float64. A row with no admissible
key (every key biased to -inf) gets zeros and lse = -inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from .. import config
from .fastmath import (
    _bits_to_float32,
    _bits_to_float64,
    _float32_to_bits,
    _float64_to_bits,
    like,
)
from .softmax import row_max

LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


def exp2(x):
    """``2**x`` for a float scalar; inside a kernel an inlined, vectorisable form.

    The kernels work in base 2 (scores carry a factor log2(e)), which spares
    the two-step ln 2 range reduction of ``fast_exp``: with n = round(x) and
    r = x - n (exact, |r| <= 1/2), 2**x = 2**n * 2**r and 2**r is its Taylor
    polynomial in r ln 2 (degree 7 for float32, relative error < 6e-9; degree
    13 for float64, < 5e-18), 2**n built from the exponent bits. ``x`` is
    clamped to [-126, 127] (float32) or [-1022, 1023] (float64); below the
    lower end the result is 0 (so ``-inf`` gives 0).
    """
    return np.exp2(x)


def _taylor_coefficients(degree):
    """(ln 2)**k / k!, highest degree first."""
    coefficients = [1.0]
    for k in range(1, degree + 1):
        coefficients.append(coefficients[-1] * LN2 / k)
    return tuple(reversed(coefficients))


_C32 = tuple(np.float32(c) for c in _taylor_coefficients(7))
_C64 = _taylor_coefficients(13)
_MAGIC32 = np.float32(12582912.0)  # 1.5 * 2**23: adding it leaves n in the low bits
_MAGIC64 = 6755399441055744.0  # 1.5 * 2**52


def _exp2_32(x):
    xc = min(max(x, np.float32(-126.0)), np.float32(127.0))
    n = np.floor(xc + np.float32(0.5))
    r = xc - n
    p = _C32[0]
    p = p * r + _C32[1]
    p = p * r + _C32[2]
    p = p * r + _C32[3]
    p = p * r + _C32[4]
    p = p * r + _C32[5]
    p = p * r + _C32[6]
    p = p * r + _C32[7]
    n_bits = _float32_to_bits(n + _MAGIC32) - 0x4B400000 + 127
    result = p * _bits_to_float32(np.int32(n_bits << 23))
    if x < np.float32(-126.0):
        result = np.float32(0.0)
    return result


def _exp2_64(x):
    xc = min(max(x, -1022.0), 1023.0)
    n = np.floor(xc + 0.5)
    r = xc - n
    p = _C64[0]
    p = p * r + _C64[1]
    p = p * r + _C64[2]
    p = p * r + _C64[3]
    p = p * r + _C64[4]
    p = p * r + _C64[5]
    p = p * r + _C64[6]
    p = p * r + _C64[7]
    p = p * r + _C64[8]
    p = p * r + _C64[9]
    p = p * r + _C64[10]
    p = p * r + _C64[11]
    p = p * r + _C64[12]
    p = p * r + _C64[13]
    n_bits = _float64_to_bits(n + _MAGIC64) - 0x4338000000000000 + 1023
    result = p * _bits_to_float64(n_bits << 52)
    if x < -1022.0:
        result = 0.0
    return result


# Without "reassoc", as fast_exp: Horner's rule stays in order.
@overload(exp2, jit_options={"fastmath": config.FASTMATH - {"reassoc"}})
def _exp2_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return _exp2_32
    if isinstance(x, types.Float):
        return _exp2_64
    return None


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
def exp2_shift_sum(row, shift):
    """In place ``row[j] <- 2**(row[j] - shift)``; returns the sum of the new values.

    The base-2 twin of ``nbattn.kernels.softmax.exp_shift_sum``: the flash
    kernels carry a factor log2(e) in their scores, so ``exp2`` (one range
    reduction, exact) replaces ``fast_exp`` (two-step ln 2 reduction).
    """
    total = like(0.0, row)
    for j in range(row.shape[0]):
        w = exp2(row[j] - shift)
        row[j] = w
        total += w
    return total


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def flash_forward(q, k, v, key_bias, slopes, causal, use_bias, use_alibi, block_q, block_k):
    """Blocked attention forward; returns ``(out, lse)``.

    out (BH, L, Dv) in the input dtype, lse (BH, L) float64 in natural units.
    See the module docstring for the formula and the (base-2) layout of the
    arguments.
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
                m_new = max(m[r], np.float64(row_max(row)))
                if m_new == -np.inf:
                    row[:] = 0.0
                    continue
                rescale = np.exp2(m[r] - m_new)
                l[r] = l[r] * rescale + exp2_shift_sum(row, like(m_new, row))
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
                lse[bh, i0 + r] = m[r] * LN2 + np.log(l[r])
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

    ``q`` is q_user * scale * log2(e) as in the forward, so dK = ln 2 dS^T q
    and dQ = scale dS K. ``lse`` (BH, L) in natural units, any float dtype.
    ``n_groups`` key-tile groups per (batch*head) run in parallel, each with
    its own dQ buffer; see the module docstring.
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
        lse_t[bh, i] = lse[bh, i] * LOG2E
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
                        p_sum += exp2_shift_sum(row, shift)
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
            ln2 = like(LN2, q)
            for j in range(nb):
                for c in range(d):
                    dk[bh, j0 + j, c] = dk_acc[j, c] * ln2
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
