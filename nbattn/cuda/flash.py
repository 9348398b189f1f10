"""Blocked (FlashAttention-style) attention on the GPU: the twin of ``nbattn.kernels.flash``.

For one (batch, head) slice, with the softmax scale applied to the scores,

    s_ij  = scale * q_i . k_j               (j <= i only when ``causal``: top-left aligned)
    out_i = sum_j softmax_j(s_ij) v_j,      lse_i = log sum_j exp(s_ij)

and the backward pass, recomputing P = exp(S - lse) tile by tile:

    D_i = sum_c dO_ic O_ic,   dS = P o (dO V^T - D),
    dQ = scale dS K,          dK = scale dS^T Q,         dV = P^T dO

Layout: q (BH, L, D), k (BH, S, D), v (BH, S, Dv), out and dO (BH, L, Dv),
C-contiguous, one float dtype; lse (BH, L) float64. Unlike the CPU kernel the
scale is an argument (so that GPU inputs need no scaled copy); results are
device arrays.

Forward: one thread per query row, a block of ``config.CUDA_THREADS_PER_BLOCK``
rows per (batch, head) slice (grid: row blocks x BH, in launches of at most
65,535 slices; blocks are halved, down to 32 threads, while there would be
fewer than two per multiprocessor). The block walks the keys
in tiles of ``block_k`` rows of K and V that its threads load together
(coalesced) into shared memory; each thread reads them as broadcasts, keeps
its scaled query row and its output accumulator in registers (local arrays
sized by the head dimension, a compile-time constant: one kernel is compiled
per (dtype, D, Dv)), and runs the online softmax key by key: running max m,
running sum l (float64), rescaling the accumulator when m grows. Causal tiles
past the block's last row are skipped. A row without any admissible key gets
zeros and lse = -inf (with top-left causal alignment every row sees key 0, so
this happens only if S = 0).

Backward: three kernels, no atomics. ``dq`` runs one thread per query row
over key tiles (K and V in shared memory), computes D_i itself and writes it
for the others; ``dv`` and ``dk`` run one thread per key row over query
tiles (Q, dO, lse and D in shared memory) and own their rows of dV and dK.
Each recomputes the scores, so the backward does 8 dot products of length D
per (query, key) pair (dq: 3, dv: 2, dk: 3) where FlashAttention-2's single
pass with atomic dQ updates does 5. In exchange no two threads ever write the
same memory, results are deterministic, there is no atomic traffic on dQ
(float atomics on one row from every key block serialise), and each kernel's
registers fit: one kernel for dK and dV together needs K, V, dK and dV rows
per thread (4 D floats) and spilled 448 bytes per thread at D = 64 (ptxas,
sm_90), the split dv kernel spills nothing and dk 152 bytes. Rows with
lse = -inf contribute nothing.

``MAX_HEAD_DIM`` (128) bounds D and Dv: per-thread registers hold a query
row and an accumulator of that size, and a tile row of K and V must fit the
shared budget. The functional layer rejects larger heads with a clear error.
Tiles: ``block_k = min(CUDA_THREADS_PER_BLOCK, CUDA_SHARED_MEMORY_BYTES /
((D + Dv) * itemsize))`` rows.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .. import config
from ._util import exp_for, imax, imin

#: Largest head dimension (D and Dv) the kernels compile for.
MAX_HEAD_DIM = 128

_kernel_cache = {}


def _make_kernels(float_type, d, d_v):
    """Forward, dQ and dK/dV kernels for one dtype and head dimensions (compile-time sizes)."""
    zero = float_type(0.0)
    minus_inf = float_type(-np.inf)
    exp = exp_for(float_type)
    # Shared-memory reads in the hot loops index with unsigned integers: numba
    # wraps negative signed indices, which hides from NVVM that consecutive
    # reads are contiguous; unsigned, they become ld.shared.v4 (see _shared_bytes).
    U = np.uint64
    d4 = d - d % 4  # dot products of length d run as four independent sums (ILP)
    d_v4 = d_v - d_v % 4

    @cuda.jit
    def flash_forward_kernel(q, k, v, scale, causal, block_k, out, lse):
        # block_k x (d + d_v): K then V rows (16-byte aligned: see _shared_bytes)
        tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bh = cuda.blockIdx.y
        row0 = cuda.blockIdx.x * tpb
        i = row0 + tx
        n_q = q.shape[1]
        n_k = k.shape[1]
        active = i < n_q
        q_row = cuda.local.array(d, dtype=float_type)
        acc = cuda.local.array(d_v, dtype=float_type)
        factor = float_type(scale)
        for f in range(d):
            q_row[f] = q[bh, i, f] * factor if active else zero
        for c in range(d_v):
            acc[c] = zero
        m = minus_inf
        l_sum = 0.0
        kv_end = imin(n_k, row0 + tpb) if causal else n_k
        v_off = block_k * d
        for j0 in range(0, kv_end, block_k):
            nb = imin(block_k, kv_end - j0)
            for idx in range(tx, nb * d, tpb):
                tile[idx] = k[bh, j0 + idx // d, idx % d]
            for idx in range(tx, nb * d_v, tpb):
                tile[v_off + idx] = v[bh, j0 + idx // d_v, idx % d_v]
            cuda.syncthreads()
            if active:
                stop = imin(nb, i - j0 + 1) if causal else nb
                for jj in range(stop):
                    base = U(jj) * U(d)
                    s0, s1, s2, s3 = zero, zero, zero, zero
                    for f in range(0, d4, 4):
                        s0 += q_row[f] * tile[base + U(f)]
                        s1 += q_row[f + 1] * tile[base + U(f + 1)]
                        s2 += q_row[f + 2] * tile[base + U(f + 2)]
                        s3 += q_row[f + 3] * tile[base + U(f + 3)]
                    for f in range(d4, d):
                        s0 += q_row[f] * tile[base + U(f)]
                    s = (s0 + s1) + (s2 + s3)
                    if s > m:
                        rescale = exp(m - s)
                        l_sum *= rescale
                        for c in range(d_v):
                            acc[c] *= rescale
                        m = s
                    w = exp(s - m)
                    l_sum += w
                    for c in range(d_v):
                        acc[c] += w * tile[U(v_off) + U(jj) * U(d_v) + U(c)]
            cuda.syncthreads()
        if active:
            if l_sum > 0.0:
                inv = float_type(1.0 / l_sum)
                for c in range(d_v):
                    out[bh, i, c] = acc[c] * inv
                lse[bh, i] = float(m) + math.log(l_sum)
            else:
                for c in range(d_v):
                    out[bh, i, c] = zero
                lse[bh, i] = -math.inf

    @cuda.jit
    def flash_dq_kernel(q, k, v, out, lse, dout, scale, causal, block_k, dq, delta):
        # block_k x (d + d_v): K then V rows (16-byte aligned: see _shared_bytes)
        tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bh = cuda.blockIdx.y
        row0 = cuda.blockIdx.x * tpb
        i = row0 + tx
        n_q = q.shape[1]
        n_k = k.shape[1]
        active = i < n_q
        q_row = cuda.local.array(d, dtype=float_type)
        do_row = cuda.local.array(d_v, dtype=float_type)
        acc = cuda.local.array(d, dtype=float_type)
        factor = float_type(scale)
        shift = zero
        d_i = zero
        if active:
            active = lse[bh, i] != -math.inf
            shift = float_type(lse[bh, i])
            total = 0.0
            for c in range(d_v):
                total += float(dout[bh, i, c]) * float(out[bh, i, c])
            d_i = float_type(total)
            delta[bh, i] = d_i
        for f in range(d):
            q_row[f] = q[bh, i, f] * factor if active else zero
            acc[f] = zero
        for c in range(d_v):
            do_row[c] = dout[bh, i, c] if active else zero
        kv_end = imin(n_k, row0 + tpb) if causal else n_k
        v_off = block_k * d
        for j0 in range(0, kv_end, block_k):
            nb = imin(block_k, kv_end - j0)
            for idx in range(tx, nb * d, tpb):
                tile[idx] = k[bh, j0 + idx // d, idx % d]
            for idx in range(tx, nb * d_v, tpb):
                tile[v_off + idx] = v[bh, j0 + idx // d_v, idx % d_v]
            cuda.syncthreads()
            if active:
                stop = imin(nb, i - j0 + 1) if causal else nb
                for jj in range(stop):
                    base = U(jj) * U(d)
                    s0, s1, s2, s3 = zero, zero, zero, zero
                    for f in range(0, d4, 4):
                        s0 += q_row[f] * tile[base + U(f)]
                        s1 += q_row[f + 1] * tile[base + U(f + 1)]
                        s2 += q_row[f + 2] * tile[base + U(f + 2)]
                        s3 += q_row[f + 3] * tile[base + U(f + 3)]
                    for f in range(d4, d):
                        s0 += q_row[f] * tile[base + U(f)]
                    p = exp((s0 + s1) + (s2 + s3) - shift)
                    base = U(v_off) + U(jj) * U(d_v)
                    s0, s1, s2, s3 = zero, zero, zero, zero
                    for c in range(0, d_v4, 4):
                        s0 += do_row[c] * tile[base + U(c)]
                        s1 += do_row[c + 1] * tile[base + U(c + 1)]
                        s2 += do_row[c + 2] * tile[base + U(c + 2)]
                        s3 += do_row[c + 3] * tile[base + U(c + 3)]
                    for c in range(d_v4, d_v):
                        s0 += do_row[c] * tile[base + U(c)]
                    dp = (s0 + s1) + (s2 + s3)
                    ds = p * (dp - d_i)
                    for f in range(d):
                        acc[f] += ds * tile[U(jj) * U(d) + U(f)]
            cuda.syncthreads()
        if i < n_q:
            for f in range(d):
                dq[bh, i, f] = acc[f] * factor

    def make_dkdv_kernel(want_dk, want_dv):
        """One thread per key: dK (want_dk) or dV (want_dv) of its key row."""

        @cuda.jit
        def flash_dkdv_kernel(q, k, v, lse, dout, delta, scale, causal, block_q, dk, dv):
            # block_q x (d + d_v + 2): Q, dO, lse, D (16-byte aligned: see _shared_bytes)
            tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
            tx = cuda.threadIdx.x
            tpb = cuda.blockDim.x
            bh = cuda.blockIdx.y
            col0 = cuda.blockIdx.x * tpb
            j = col0 + tx
            n_q = q.shape[1]
            n_k = k.shape[1]
            active = j < n_k
            k_row = cuda.local.array(d, dtype=float_type)
            v_row = cuda.local.array(d_v if want_dk else 1, dtype=float_type)
            dk_acc = cuda.local.array(d if want_dk else 1, dtype=float_type)
            dv_acc = cuda.local.array(d_v if want_dv else 1, dtype=float_type)
            factor = float_type(scale)
            for f in range(d):
                k_row[f] = k[bh, j, f] if active else zero
            if want_dk:
                for f in range(d):
                    dk_acc[f] = zero
                for c in range(d_v):
                    v_row[c] = v[bh, j, c] if active else zero
            if want_dv:
                for c in range(d_v):
                    dv_acc[c] = zero
            do_off = block_q * d
            lse_off = block_q * (d + d_v)
            delta_off = lse_off + block_q
            i_start = col0 if causal else 0
            for i0 in range(i_start, n_q, block_q):
                mb = imin(block_q, n_q - i0)
                for idx in range(tx, mb * d, tpb):
                    tile[idx] = q[bh, i0 + idx // d, idx % d] * factor
                for idx in range(tx, mb * d_v, tpb):
                    tile[do_off + idx] = dout[bh, i0 + idx // d_v, idx % d_v]
                for idx in range(tx, mb, tpb):
                    tile[lse_off + idx] = float_type(lse[bh, i0 + idx])
                    tile[delta_off + idx] = delta[bh, i0 + idx]
                cuda.syncthreads()
                if active:
                    start = imax(0, j - i0) if causal else 0
                    for ii in range(start, mb):
                        shift = tile[lse_off + ii]
                        if shift == minus_inf:
                            continue
                        base = U(ii) * U(d)
                        s0, s1, s2, s3 = zero, zero, zero, zero
                        for f in range(0, d4, 4):
                            s0 += tile[base + U(f)] * k_row[f]
                            s1 += tile[base + U(f + 1)] * k_row[f + 1]
                            s2 += tile[base + U(f + 2)] * k_row[f + 2]
                            s3 += tile[base + U(f + 3)] * k_row[f + 3]
                        for f in range(d4, d):
                            s0 += tile[base + U(f)] * k_row[f]
                        p = exp((s0 + s1) + (s2 + s3) - shift)
                        g_base = U(do_off) + U(ii) * U(d_v)
                        if want_dv:
                            for c in range(d_v):
                                dv_acc[c] += p * tile[g_base + U(c)]
                        if want_dk:
                            s0, s1, s2, s3 = zero, zero, zero, zero
                            for c in range(0, d_v4, 4):
                                s0 += tile[g_base + U(c)] * v_row[c]
                                s1 += tile[g_base + U(c + 1)] * v_row[c + 1]
                                s2 += tile[g_base + U(c + 2)] * v_row[c + 2]
                                s3 += tile[g_base + U(c + 3)] * v_row[c + 3]
                            for c in range(d_v4, d_v):
                                s0 += tile[g_base + U(c)] * v_row[c]
                            ds = p * ((s0 + s1) + (s2 + s3) - tile[delta_off + ii])
                            for f in range(d):
                                dk_acc[f] += ds * tile[base + U(f)]
                cuda.syncthreads()
            if active and want_dk:
                for f in range(d):
                    dk[bh, j, f] = dk_acc[f]
            if active and want_dv:
                for c in range(d_v):
                    dv[bh, j, c] = dv_acc[c]

        return flash_dkdv_kernel

    dk_kernel = make_dkdv_kernel(True, False)
    dv_kernel = make_dkdv_kernel(False, True)
    return flash_forward_kernel, flash_dq_kernel, dk_kernel, dv_kernel


def flash_kernels(dtype, d, d_v):
    """The (forward, dq, dk, dv) kernels for a dtype and head sizes, compiled on first use."""
    key = (np.dtype(dtype), int(d), int(d_v))
    if key not in _kernel_cache:
        if not (1 <= d <= MAX_HEAD_DIM and 1 <= d_v <= MAX_HEAD_DIM):
            raise ValueError(
                f"the CUDA flash kernels take head dimensions up to {MAX_HEAD_DIM}, got "
                f"D={d}, Dv={d_v}"
            )
        _kernel_cache[key] = _make_kernels(np.dtype(dtype).type, int(d), int(d_v))
    return _kernel_cache[key]


def _shared_bytes(n_floats, itemsize):
    """Dynamic shared memory for a tile, in whole 16-byte units.

    The tiles are declared as complex128 (16-byte) shared arrays viewed as
    the float dtype: with the base known to be 16-byte aligned (and D a
    multiple of 4 in float32), NVVM reads each row of K, V or Q with
    ``ld.shared.v4`` -- a quarter of the shared-memory load instructions,
    which bound these one-thread-per-row kernels (checked in the PTX).
    """
    return -(-n_floats * itemsize // 16) * 16


def _tile_rows(floats_per_row, itemsize):
    tpb = config.CUDA_THREADS_PER_BLOCK
    return max(1, min(tpb, config.CUDA_SHARED_MEMORY_BYTES // (floats_per_row * itemsize)))


#: Most (batch, head) slices per launch: the grid's y dimension is capped at 65,535.
MAX_GRID_Y = 65535


def _multiprocessors():
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:  # the simulator has no such attribute
        return 1


def _threads(n_rows, n_bh):
    """Threads per block: ``config.CUDA_THREADS_PER_BLOCK``, halved (down to 32) while
    the grid would give fewer than two blocks per multiprocessor (short sequences)."""
    tpb = config.CUDA_THREADS_PER_BLOCK
    target = 2 * _multiprocessors()
    while tpb > 32 and -(-n_rows // tpb) * n_bh < target:
        tpb //= 2
    return tpb


def _launch(kernel, n_rows, n_bh, shared, args):
    """Launch over (row blocks, BH slices), in chunks of at most MAX_GRID_Y slices.

    ``args(b0, b1)`` gives the kernel's arguments for the slices b0:b1.
    """
    tpb = _threads(n_rows, n_bh)
    for b0 in range(0, n_bh, MAX_GRID_Y):
        b1 = min(n_bh, b0 + MAX_GRID_Y)
        kernel[((n_rows + tpb - 1) // tpb, b1 - b0), tpb, 0, shared](*args(b0, b1))


def flash_forward(q, k, v, scale, causal):
    """``(out, lse)`` as device arrays: out (BH, L, Dv) in the input dtype, lse (BH, L) float64.

    ``q``, ``k``, ``v``: device (or NumPy) arrays in the layout of the module docstring.
    """
    from .pooling import to_device

    q, k, v = to_device(q), to_device(k), to_device(v)
    n_bh, n_q, d = q.shape
    d_v = v.shape[2]
    dtype = np.dtype(q.dtype)
    forward = flash_kernels(dtype, d, d_v)[0]
    out = cuda.device_array((n_bh, n_q, d_v), dtype=dtype)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float64)
    block_k = _tile_rows(d + d_v, dtype.itemsize)
    shared = _shared_bytes(block_k * (d + d_v), dtype.itemsize)
    scale, causal = float(scale), bool(causal)

    def args(b0, b1):
        return (q[b0:b1], k[b0:b1], v[b0:b1], scale, causal, block_k, out[b0:b1], lse[b0:b1])

    _launch(forward, n_q, n_bh, shared, args)
    return out, lse


def flash_backward(q, k, v, out, lse, dout, scale, causal):
    """``(dq, dk, dv)`` as device arrays in the input dtype (``lse`` float64, may hold -inf)."""
    from .pooling import to_device

    q, k, v, out, lse, dout = (to_device(a) for a in (q, k, v, out, lse, dout))
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    d_v = v.shape[2]
    dtype = np.dtype(q.dtype)
    _, dq_kernel, dk_kernel, dv_kernel = flash_kernels(dtype, d, d_v)
    dq = cuda.device_array((n_bh, n_q, d), dtype=dtype)
    dk = cuda.device_array((n_bh, n_k, d), dtype=dtype)
    dv = cuda.device_array((n_bh, n_k, d_v), dtype=dtype)
    delta = cuda.device_array((n_bh, n_q), dtype=dtype)
    scale, causal = float(scale), bool(causal)
    block_k = _tile_rows(d + d_v, dtype.itemsize)

    def dq_args(b0, b1):
        inputs = (q, k, v, out, lse, dout)
        return (*(a[b0:b1] for a in inputs), scale, causal, block_k, dq[b0:b1], delta[b0:b1])

    _launch(dq_kernel, n_q, n_bh, _shared_bytes(block_k * (d + d_v), dtype.itemsize), dq_args)
    block_q = _tile_rows(d + d_v + 2, dtype.itemsize)

    def dkdv_args(b0, b1):
        inputs = (q, k, v, lse, dout, delta)
        return (*(a[b0:b1] for a in inputs), scale, causal, block_q, dk[b0:b1], dv[b0:b1])

    shared = _shared_bytes(block_q * (d + d_v + 2), dtype.itemsize)
    _launch(dv_kernel, n_k, n_bh, shared, dkdv_args)
    _launch(dk_kernel, n_k, n_bh, shared, dkdv_args)
    return dq, dk, dv
