"""Split-KV decoding on the GPU: the twin of ``nbattn.kernels.decode``.

Same contract as :func:`nbattn.kernels.decode.decode_partials`: the keys of
batch row b (those some query admits, [starts[b], ends[b]), the ``KeySplit``
group) are cut into ``n_splits`` chunks of ``chunks[b]`` keys, and each (chunk,
batch row, kv head) reduces its chunk to the online-softmax state of every query row it
serves (the ``n_rep`` query heads of the kv head, L queries each):

    s_ij   = scale * q_i . k_j                 (softcap c: s_ij <- c tanh(s_ij / c))
    lse_i  = log sum_{j in chunk, admissible} exp(s_ij)
    out_i  = sum_{j in chunk, admissible} exp(s_ij - lse_i) v_j

with query i of row b at position p = totals[b] - L + i (bottom-right)
admitting keys lo <= j <= hi, lo = max(0, p - left), hi = min(totals[b] - 1,
p if causal, p + right) (``left``/``right`` < 0: unbounded). The results
are device arrays: out float64 (n_splits, B*H*L, Ev) normalised per chunk,
lse float64 (n_splits, B*H*L), -inf where a chunk has no admissible key;
the caller merges the chunks with the log-sum-exp merge (on the host,
``nbattn.kernels.softmax.merge_states``, after ``copy_to_host``).

GPU layout: one block per (chunk, batch row * kv head), grid (n_splits,
B*H_kv) in launches of at most ``MAX_GRID_Y`` rows. A decoding step has few
query rows per block (n_rep * L, often 1 to 8), so the block splits its
chunk once more: with R rows and T threads, thread t serves row t mod R over
the t div R-th of ``n_sub = T div R`` contiguous sub-slices of the chunk
(running max, sum and accumulator in registers), writes its state to
shared memory, and the first thread of each row merges the n_sub states:

    M = max_s m_s,   l = sum_s l_s 2**(m_s - M),   acc = sum_s acc_s 2**(m_s - M)

(the same log-sum-exp merge, base 2 as the flash kernels' online softmax).
With more rows than threads (R >= T) each thread takes rows t, t + T, ...
over the whole chunk, and nothing is merged. Threads of one sub-slice read
the same key (a broadcast); keys are read from global memory (L2-cached),
not tiled: a decoding step reads each cached key once, so a shared tile
would only add a copy. Threads per block: ``config.CUDA_THREADS_PER_BLOCK``,
fewer where the shared states (T x (Ev + 2) float64) would exceed
``config.CUDA_SHARED_MEMORY_BYTES``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda, types

from .. import config
from .common import MAX_GRID_Y, compiled, imax, imin, jit, to_device
from .flash import exp2_for

__all__ = ["decode_kernel", "decode_partials"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _make_decode_kernel(float_type, d, d_v):
    zero = float_type(0.0)
    itemsize = np.dtype(float_type).itemsize
    row_type = numba.from_dtype(np.dtype(float_type))
    minus_inf = -math.inf
    exp2 = exp2_for(np.float64)  # states in float64: exp2 of float64 differences

    @jit(device=True, inline=True)
    def key_range(p, total, causal, left, right):
        """[lo, hi] (inclusive) of the keys query position ``p`` admits."""
        lo = imax(0, p - left) if left >= 0 else 0
        hi = total - 1
        if causal:
            hi = imin(hi, p)
        if right >= 0:
            hi = imin(hi, p + right)
        return lo, hi

    @jit(device=True, inline=True)
    def row_state(rows, q_base, k_cache, v_cache, b, hk, j_lo, j_hi, cap, acc):
        """(m, l) over keys j_lo..j_hi - 1 (base 2) of the scaled query row at
        rows[q_base:q_base + d] (shared memory); acc (Ev) relative to m."""
        for c in range(d_v):
            acc[c] = zero
        m = minus_inf
        l_sum = 0.0
        for j in range(j_lo, j_hi):
            s = zero
            for f in range(d):
                s += rows[q_base + f] * k_cache[b, hk, j, f]
            if cap > 0.0:  # c tanh(s / c) on the natural score, then base 2
                s = float_type(cap * math.tanh(s / cap))
            t = float(s) * LOG2E
            if t > m:
                rescale = exp2(m - t)
                l_sum *= rescale
                for c in range(d_v):
                    acc[c] *= float_type(rescale)
                m = t
            w = exp2(t - m)
            l_sum += w
            wf = float_type(w)
            for c in range(d_v):
                acc[c] += wf * v_cache[b, hk, j, c]
        return m, l_sum

    @jit(device=True, inline=True)
    def write(part_out, part_lse, split, out_row, m, l_sum, acc):
        """The chunk state of one row: out = acc / l, lse = m ln 2 + log l (zeros, -inf)."""
        if l_sum > 0.0:
            for c in range(d_v):
                part_out[split, out_row, c] = float(acc[c]) / l_sum
            part_lse[split, out_row] = m * LN2 + math.log(l_sum)
        else:
            for c in range(d_v):
                part_out[split, out_row, c] = 0.0
            part_lse[split, out_row] = minus_inf

    @jit
    def decode_kernel(
        q, k_cache, v_cache, totals, starts, chunks, ends, n_rep, scale, causal, left, right,
        softcap, n_sub, item0, part_out, part_lse,
    ):  # fmt: skip
        # shared: T sub-slice states (m, l, Ev accumulators) in float64, then up to T
        # scaled query rows in the input dtype (both views of the one dynamic array)
        states = cuda.shared.array(0, dtype=types.float64)
        rows = cuda.shared.array(0, dtype=row_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        q_off = tpb * (d_v + 2) * 8 // itemsize
        split = cuda.blockIdx.x
        item = item0 + cuda.blockIdx.y
        n_b, n_h, n_q, _ = q.shape
        n_hkv = k_cache.shape[1]
        b = item // n_hkv
        hk = item - b * n_hkv
        n_rows = n_rep * n_q
        total = totals[b]
        j_begin = starts[b] + split * chunks[b]
        j_end = imin(ends[b], j_begin + chunks[b])
        factor = float_type(scale)
        cap = float(softcap)
        acc = cuda.local.array(d_v, dtype=float_type)
        if n_sub == 1:  # at least as many rows as threads: rounds of one row per thread
            for r0 in range(0, n_rows, tpb):
                r = r0 + tx
                h = hk * n_rep + r // n_q
                i = r % n_q
                cuda.syncthreads()  # the previous round's rows are no longer read
                if r < n_rows:
                    for f in range(d):
                        rows[q_off + tx * d + f] = q[b, h, i, f] * factor
                    lo, hi = key_range(total - n_q + i, total, causal, left, right)
                    m, l_sum = row_state(
                        rows, q_off + tx * d, k_cache, v_cache, b, hk, imax(lo, j_begin),
                        imin(hi + 1, j_end), cap, acc,
                    )  # fmt: skip
                    write(part_out, part_lse, split, (b * n_h + h) * n_q + i, m, l_sum, acc)
            return
        r = tx % n_rows
        sub = tx // n_rows
        h = hk * n_rep + r // n_q
        i = r % n_q
        if tx < n_rows:  # the block's query rows, scaled, once
            for f in range(d):
                rows[q_off + tx * d + f] = q[b, h, i, f] * factor
        cuda.syncthreads()
        width = imax(1, (j_end - j_begin + n_sub - 1) // n_sub)
        s_begin = j_begin + sub * width
        s_end = imin(j_end, s_begin + width)
        if sub < n_sub:
            lo, hi = key_range(total - n_q + i, total, causal, left, right)
            m, l_sum = row_state(
                rows, q_off + r * d, k_cache, v_cache, b, hk, imax(lo, s_begin),
                imin(hi + 1, s_end), cap, acc,
            )  # fmt: skip
            base = tx * (d_v + 2)
            states[base] = m
            states[base + 1] = l_sum
            for c in range(d_v):
                states[base + 2 + c] = float(acc[c])
        cuda.syncthreads()
        if sub == 0:  # the row's first thread merges the n_sub states
            top = minus_inf
            for s in range(n_sub):
                top = imax(top, states[(r + s * n_rows) * (d_v + 2)])
            out_row = (b * n_h + h) * n_q + i
            if top == minus_inf:
                write(part_out, part_lse, split, out_row, top, 0.0, acc)
                return
            total_l = 0.0
            for c in range(d_v):
                part_out[split, out_row, c] = 0.0
            for s in range(n_sub):
                base = (r + s * n_rows) * (d_v + 2)
                if states[base] == minus_inf:
                    continue
                weight = exp2(states[base] - top)
                total_l += states[base + 1] * weight
                for c in range(d_v):
                    part_out[split, out_row, c] += states[base + 2 + c] * weight
            for c in range(d_v):
                part_out[split, out_row, c] /= total_l
            part_lse[split, out_row] = top * LN2 + math.log(total_l)

    return decode_kernel


def decode_kernel(dtype, d, d_v):
    """The split-KV kernel for a dtype and head sizes (compile-time), compiled on first use."""
    t = np.dtype(dtype).type
    return compiled(
        ("decode", t, int(d), int(d_v)), lambda: _make_decode_kernel(t, int(d), int(d_v))
    )


def _threads(n_rows, d, d_v, itemsize):
    """Threads per block and sub-slices per row (see the module docstring): each thread
    needs (Ev + 2) float64 for its state and d floats for a query row in shared memory."""
    tpb = config.CUDA_THREADS_PER_BLOCK
    fit = config.CUDA_SHARED_MEMORY_BYTES // _shared_per_thread(d, d_v, itemsize)
    tpb = max(1, min(tpb, fit))
    if n_rows >= tpb:
        return tpb, 1
    return tpb, tpb // n_rows


def _shared_per_thread(d, d_v, itemsize):
    return (d_v + 2) * 8 + d * itemsize


def decode_partials(q, k_cache, v_cache, keys, window, scale, softcap, block_k):
    """Chunk states of split-KV decoding, ``(out, lse)`` as float64 device arrays.

    The arguments are :func:`nbattn.kernels.decode.decode_partials`'s (host or
    device arrays; ``block_k``, the CPU's score block, is not used here). The
    launched kernel takes the groups flat.
    """
    q, k_cache, v_cache = to_device(q), to_device(k_cache), to_device(v_cache)
    totals, starts, chunks, ends = (
        to_device(np.asarray(a, dtype=np.int64)) if isinstance(a, np.ndarray) else to_device(a)
        for a in keys[:4]
    )
    n_b, n_h, n_q, d = q.shape
    n_hkv = k_cache.shape[1]
    n_rep = n_h // n_hkv
    d_v = v_cache.shape[3]
    n_splits = int(keys.n_splits)
    rows = n_b * n_h * n_q
    part_out = cuda.device_array((n_splits, rows, d_v), dtype=np.float64)
    part_lse = cuda.device_array((n_splits, rows), dtype=np.float64)
    if n_splits == 0 or rows == 0:
        return part_out, part_lse
    kernel = decode_kernel(np.dtype(q.dtype), d, d_v)
    itemsize = np.dtype(q.dtype).itemsize
    tpb, n_sub = _threads(n_rep * n_q, d, d_v, itemsize)
    shared = tpb * _shared_per_thread(d, d_v, itemsize)
    n_items = n_b * n_hkv
    causal, left, right = bool(window.causal), int(window.left), int(window.right)
    for item0 in range(0, n_items, MAX_GRID_Y):
        items = min(MAX_GRID_Y, n_items - item0)
        kernel[(n_splits, items), tpb, 0, shared](
            q, k_cache, v_cache, totals, starts, chunks, ends, n_rep, float(scale), causal, left,
            right, float(softcap), n_sub, item0, part_out, part_lse,
        )  # fmt: skip
    return part_out, part_lse
