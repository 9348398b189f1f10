"""Blocked (FlashAttention-style) attention on the GPU: the twin of ``nbattn.kernels.flash``.

For query slice bh (a flattened batch*head index) and its key/value slice
``kv = kv_index[bh]`` (grouped-query attention and broadcast leading
dimensions share K/V slices without copies), in base 2 as the CPU kernels:

    t_ij  = cap(q'_i . k_j) + M_ij + a (j - i)    over i + offset - left <= j <= i + offset + right
    out_i = sum_j Z_ij 2**(t_ij - m_i) v_j / l_i,   lse_i = (m_i + log2 l_i) ln 2

with q' = q * scale * log2(e), cap(x) = c' tanh(x / c') (softcap c' = c log2 e,
on the scaled score, before the mask), M the un-expanded mask (BM, 1 or L,
1 or S) at slice ``mask_index[bh]`` (float, base 2, -inf = excluded; or
boolean, True = may attend), a the ALiBi slope, Z the dropout factors (0 or
1 / (1 - p), ``nbattn.cuda.dropout.keep`` from the seed and the weight's
counter, the same bits as the CPU; lse is taken before dropout). The
backward recomputes P = 2**min(T - lse log2 e, 0) tile by tile (the exponent is
<= 0 but for the rounding of lse, which at huge scores could overflow 2**):

    D_i = sum_c dO_ic O_ic,   dS = P o ((dO V^T) o Z - D) o (1 - tanh^2),
    dQ = scale dS K,          dK = ln 2 dS^T Q',        dV = (P o Z)^T dO

(dK, dV summed over the query slices that read a K/V slice). The entry
points take the CPU kernel's arguments (see :func:`flash_forward`) and give
device arrays; they also take the short form ``(q, k, v, scale, causal)``
(plain attention, the user's q) that ``nbattn.flash``'s GPU path passes.
Layout: q (BH, L, D), k (BKV, S, D), v (BKV, S, Dv), out and dO (BH, L, Dv),
C-contiguous, one float dtype; lse (BH, L) float64.

The optional terms are compile-time features (``flash_kernels``: mask kind,
ALiBi, softcap, dropout), so plain attention compiles to the lean loop; the
band is two integers, lo_off = offset - left and hi_off = offset + right
(``band_offsets``), that bound each row's and each block's key loop: tiles
outside the band are never loaded (a window costs O(L * window)). A block
skips a key tile that its mask closes for every row (a block-wide OR,
``block_any``, before the tile is loaded): a key-padding mask costs nothing
for padded tiles, and no host pass over the mask is needed (the CPU's
``mask_live`` is accepted and not used).

Forward: one thread per query row, a block of ``config.CUDA_THREADS_PER_BLOCK``
rows per (batch, head) slice (grid: row blocks x BH, in launches of at most
65,535 slices; blocks are halved, down to 32 threads, while there would be
fewer than two per multiprocessor: ``common.launch``). The block walks the keys
in tiles of ``block_k`` rows of K and V that its threads load together
(coalesced) into shared memory; each thread reads them as broadcasts, keeps
its scaled query row and its output accumulator in registers (local arrays
sized by the head dimension, a compile-time constant: one kernel is compiled
per (dtype, D, Dv) and feature set), and runs the online softmax key by key: running max m,
running sum l (float64), rescaling the accumulator when m grows. Key tiles
outside the block's band are skipped. A row without any admissible key gets
zeros and lse = -inf (a mask, a band or S = 0 can leave one).

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
sm_90), the split dv kernel spills nothing and dk 148 bytes. dK and dV loop
over (reader, query tile) in one flat loop, the readers of a K/V slice
grouped on the host (``_Terms.readers``); a nested loop spilled 208 bytes.
Rows with lse = -inf contribute nothing.

The four kernels share their tile work as device functions, built per
(dtype, row length) by :func:`tile_functions`: ``load_rows`` (a block's
cooperative, coalesced copy of rows of Q, K, V or dO into shared memory),
``dot`` (a row in registers times a tile row, as four independent sums for
instruction-level parallelism) and ``axpy`` (acc += w * tile row). Launch
geometry, tile sizes and the kernel cache are ``nbattn.cuda.common``'s.

``config.CUDA_MAX_HEAD_DIM`` (128; also readable as ``MAX_HEAD_DIM`` here,
at call time) bounds D and Dv: per-thread registers hold a query row and an
accumulator of that size, and a tile row of K and V must fit the shared
budget. The functional layer rejects larger heads with a clear error.
Tiles: ``block_k = min(CUDA_THREADS_PER_BLOCK, CUDA_SHARED_MEMORY_BYTES /
((D + Dv) * itemsize))`` rows; the second array of a tile (V, dO) starts at a
multiple of 4 floats (``aligned``) so that every tile read is a vector load.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .. import config
from .._core.attn_groups import NO_DROPOUT, Band, Dropout, Packing, ScoreTransform
from .common import (
    SHARED_ALIGNMENT_KWARG,
    compiled,
    imax,
    imin,
    jit,
    launch,
    shared_bytes,
    tile_rows,
    to_device,
)
from .dropout import counter, keep

__all__ = [
    "BOOL_MASK",
    "FLOAT_MASK",
    "NO_MASK",
    "backward_packed",
    "band_offsets",
    "flash_backward",
    "flash_forward",
    "flash_kernels",
    "forward_packed",
    "host_array",
    "tile_functions",
    "varlen_call",
]

LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634

# Shared-memory reads in the hot loops index with unsigned integers: numba
# wraps negative signed indices, which hides from NVVM that consecutive reads
# are contiguous; unsigned, they become ld.shared.v4 (see common.SHARED_ALIGNMENT_KWARG).
U = np.uint64


def __getattr__(name):
    if name == "MAX_HEAD_DIM":  # read at each access, so that config changes count
        return config.CUDA_MAX_HEAD_DIM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@jit(device=True, inline=True)
def aligned(n):
    """``n`` rounded up to a multiple of 4: a tile offset whose 4-byte floats start
    16-byte aligned, which the compiler can see (vector loads from there)."""
    return (n + 3) // 4 * 4


@jit(device=True, inline=True)
def block_any(flag):
    """Whether ``flag`` holds for some thread of the block (a barrier: every thread calls it).

    ``syncthreads_or`` takes an integer predicate: the CUDA compiler refuses a bool."""
    return cuda.syncthreads_or(np.int32(1) if flag else np.int32(0)) != 0


def _make_tile_functions(float_type, n):
    zero = float_type(0.0)
    n4 = n - n % 4  # dot products of length n run as four independent sums (ILP)

    @jit(device=True, inline=True)
    def load_rows(tile, offset, src, bh, r0, nb, factor):
        """tile[offset + r * n + c] = src[bh, r0 + r, c] * factor for r < nb, c < n.

        All threads of the block together, consecutive threads on consecutive
        floats (coalesced); the caller synchronises."""
        for idx in range(cuda.threadIdx.x, nb * n, cuda.blockDim.x):
            tile[offset + idx] = src[bh, r0 + idx // n, idx % n] * factor

    @jit(device=True, inline=True)
    def dot(row, tile, base):
        """sum_f row[f] * tile[base + f] over the n floats of a register row."""
        s0, s1, s2, s3 = zero, zero, zero, zero
        for f in range(0, n4, 4):
            s0 += row[f] * tile[base + U(f)]
            s1 += row[f + 1] * tile[base + U(f + 1)]
            s2 += row[f + 2] * tile[base + U(f + 2)]
            s3 += row[f + 3] * tile[base + U(f + 3)]
        for f in range(n4, n):
            s0 += row[f] * tile[base + U(f)]
        return (s0 + s1) + (s2 + s3)

    @jit(device=True, inline=True)
    def axpy(acc, w, tile, base):
        """acc[f] += w * tile[base + f] for the n floats of a register row."""
        for f in range(n):
            acc[f] += w * tile[base + U(f)]

    return load_rows, dot, axpy


def tile_functions(dtype, n):
    """The device functions ``(load_rows, dot, axpy)`` for rows of ``n`` floats of ``dtype``."""
    t = np.dtype(dtype).type
    return compiled(("flash_tile", t, int(n)), lambda: _make_tile_functions(t, int(n)))


#: Mask kinds, compile-time constants of the kernels: none, boolean (True = may
#: attend), float (added to the score; -inf closes an entry).
NO_MASK, BOOL_MASK, FLOAT_MASK = 0, 1, 2


def exp2_for(float_type):
    """The 2**x of the kernels: libdevice's exp2f (``ex2.approx``: a few ulp, exp2(-inf)
    = 0) for float32, the accurate exp2 for float64; the simulator's ``math.pow``."""
    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:

        def exp2(x):
            return math.pow(2.0, x)

        return exp2
    from numba.cuda import libdevice

    return libdevice.exp2f if np.dtype(float_type) == np.float32 else libdevice.exp2


def _make_kernels(float_type, d, d_v, mask_kind, use_alibi, use_softcap, use_dropout, packed):
    """Forward, dQ, dK and dV kernels for one dtype, head dimensions and feature set.

    ``mask_kind``, ``use_alibi``, ``use_softcap``, ``use_dropout`` and
    ``packed`` (sequences packed along the rows, ``cu_q``/``cu_k``) are
    compile-time constants: the branches of features not used are pruned, so
    plain attention compiles to the lean loop of the module docstring (the
    sequence offsets alone cost dQ and dK some 70 bytes more of spills).
    """
    zero = float_type(0.0)
    one = float_type(1.0)
    ln2 = float_type(LN2)
    minus_inf = float_type(-np.inf)
    exp2 = exp2_for(float_type)
    load_d, dot_d, axpy_d = tile_functions(float_type, d)  # rows of Q, K, dQ, dK
    load_v, dot_v, axpy_v = tile_functions(float_type, d_v)  # rows of V, O, dO, dV
    has_mask = mask_kind != NO_MASK

    @jit(device=True, inline=True)
    def mask_term(mask, m_bh, i, j):
        """The mask's term for (row i, key j): 0 or -inf (boolean), the entry (float).
        A mask with one row (key padding) serves every row."""
        row = i if mask.shape[1] > 1 else 0
        col = j if mask.shape[2] > 1 else 0
        if mask_kind == BOOL_MASK:
            return zero if mask[m_bh, row, col] else minus_inf
        return float_type(mask[m_bh, row, col])

    @jit(device=True, inline=True)
    def any_admissible(mask, m_bh, i, j_lo, j_hi):
        """Whether the mask admits (row i, key j) for some j in j_lo:j_hi."""
        for j in range(j_lo, j_hi):
            if mask_term(mask, m_bh, i, j) != minus_inf:
                return True
        return False

    @jit(device=True, inline=True)
    def terms(s, mask, m_bh, slope, i, j):
        """The score plus the mask's and ALiBi's terms for (row i, key j)."""
        if has_mask:
            s += mask_term(mask, m_bh, i, j)
        if use_alibi:
            s += slope * float_type(j - i)
        return s

    @jit(device=True, inline=True)
    def sequence(item, n_slices, cu_q, cu_k, offsets):
        """(seq, slice, first row, rows, first key, keys, lo_off, hi_off) of grid row
        ``item`` = seq * n_slices + slice: the packed sequence's place in q and k
        (unpacked: one sequence of all rows and keys, cu_q = [0, L], cu_k = [0, S])."""
        if not packed:
            return 0, item, 0, cu_q[1], 0, cu_k[1], offsets[0, 0], offsets[0, 1]
        seq = item // n_slices
        a_q = cu_q[seq]
        a_k = cu_k[seq]
        n_q = cu_q[seq + 1] - a_q
        n_k = cu_k[seq + 1] - a_k
        return seq, item - seq * n_slices, a_q, n_q, a_k, n_k, offsets[seq, 0], offsets[seq, 1]

    @jit(device=True, inline=True)
    def capped(s, cap, inv_cap):
        """(cap tanh(s / cap), tanh(s / cap)) with a softcap, else (s, 0)."""
        if use_softcap:
            t = math.tanh(s * inv_cap)
            return cap * t, t
        return s, zero

    @jit
    def flash_forward_kernel(
        q, k, v, kv_index, cu_q, cu_k, offsets, mask, mask_index, slopes, q_factor, softcap,
        seed, threshold, n_rows, n_cols, row0, col0, keep_scale, block_k, bh0, out, lse,
    ):  # fmt: skip
        # block_k x (d + d_v): K then V rows (16-byte aligned base)
        if SHARED_ALIGNMENT_KWARG:  # one spelling per numba; the other is pruned
            tile = cuda.shared.array(0, dtype=float_type, alignment=16)
        else:
            tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        seq, bh, a_q, n_q, a_k, n_k, lo_off, hi_off = sequence(
            bh0 + cuda.blockIdx.y, q.shape[0], cu_q, cu_k, offsets
        )
        kv = kv_index[bh]
        first = cuda.blockIdx.x * tpb
        if first >= n_q:  # past this sequence's rows: the whole block leaves
            return
        i = first + tx
        active = i < n_q
        m_bh = mask_index[bh] if has_mask else 0
        slope = slopes[bh] if use_alibi else zero
        cap = float_type(softcap)
        inv_cap = float_type(1.0 / softcap) if use_softcap else zero
        drop_scale = float_type(keep_scale)
        q_row = cuda.local.array(d, dtype=float_type)
        acc = cuda.local.array(d_v, dtype=float_type)
        factor = float_type(q_factor)
        for f in range(d):
            q_row[f] = q[bh, a_q + i, f] * factor if active else zero
        for c in range(d_v):
            acc[c] = zero
        m = minus_inf  # base 2
        l_sum = 0.0
        # row i sees keys i + lo_off <= j <= i + hi_off; the block walks their union
        j_begin = imax(0, first + lo_off)
        j_end = imin(n_k, imin(first + tpb, n_q) + hi_off)
        v_off = aligned(block_k * d)  # V rows start 16-byte aligned (ld.shared.v4)
        for j0 in range(j_begin, j_end, block_k):
            nb = imin(block_k, j_end - j0)
            a = imax(0, i + lo_off - j0)
            b = imin(nb, i + hi_off + 1 - j0)
            if has_mask:  # skip a tile that the mask closes for every row of the block
                seen = active and any_admissible(mask, m_bh, i, j0 + a, j0 + b)
                if not block_any(seen):
                    continue
            load_d(tile, 0, k, kv, a_k + j0, nb, one)
            load_v(tile, v_off, v, kv, a_k + j0, nb, one)
            cuda.syncthreads()
            if active:
                for jj in range(a, b):
                    s, _ = capped(dot_d(q_row, tile, U(jj) * U(d)), cap, inv_cap)
                    s = terms(s, mask, m_bh, slope, i, j0 + jj)
                    if has_mask and s == minus_inf:  # only a mask gives -inf
                        continue
                    if s > m:
                        rescale = exp2(m - s)
                        l_sum *= rescale
                        for c in range(d_v):
                            acc[c] *= rescale
                        m = s
                    w = exp2(s - m)
                    l_sum += w
                    if use_dropout:  # the normaliser counts every weight, acc the kept
                        count = counter(bh, row0 + a_q + i, col0 + a_k + j0 + jj, n_rows, n_cols)
                        if not keep(seed, count, threshold):
                            continue
                        w *= drop_scale
                    axpy_v(acc, w, tile, U(v_off) + U(jj) * U(d_v))
            cuda.syncthreads()
        if active:
            if l_sum > 0.0:
                inv = float_type(1.0 / l_sum)
                for c in range(d_v):
                    out[bh, a_q + i, c] = acc[c] * inv
                lse[bh, a_q + i] = float(m) * LN2 + math.log(l_sum)
            else:
                for c in range(d_v):
                    out[bh, a_q + i, c] = zero
                lse[bh, a_q + i] = -math.inf

    @jit
    def flash_dq_kernel(
        q, k, v, out, lse, dout, kv_index, cu_q, cu_k, offsets, mask, mask_index, slopes,
        q_factor, scale, softcap, seed, threshold, n_rows, n_cols, row0, col0, keep_scale,
        block_k, bh0, dq, delta,
    ):  # fmt: skip
        # block_k x (d + d_v): K then V rows (16-byte aligned base)
        if SHARED_ALIGNMENT_KWARG:  # one spelling per numba; the other is pruned
            tile = cuda.shared.array(0, dtype=float_type, alignment=16)
        else:
            tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        seq, bh, a_q, n_q, a_k, n_k, lo_off, hi_off = sequence(
            bh0 + cuda.blockIdx.y, q.shape[0], cu_q, cu_k, offsets
        )
        kv = kv_index[bh]
        first = cuda.blockIdx.x * tpb
        if first >= n_q:
            return
        i = first + tx
        active = i < n_q
        row = a_q + i  # in the packed arrays
        m_bh = mask_index[bh] if has_mask else 0
        slope = slopes[bh] if use_alibi else zero
        cap = float_type(softcap)
        inv_cap = float_type(1.0 / softcap) if use_softcap else zero
        drop_scale = float_type(keep_scale)
        q_row = cuda.local.array(d, dtype=float_type)
        do_row = cuda.local.array(d_v, dtype=float_type)
        acc = cuda.local.array(d, dtype=float_type)
        factor = float_type(q_factor)
        shift = zero
        d_i = zero
        if active:
            active = lse[bh, row] != -math.inf
            shift = float_type(lse[bh, row] * LOG2E)
            total = 0.0
            for c in range(d_v):
                total += float(dout[bh, row, c]) * float(out[bh, row, c])
            d_i = float_type(total)
            delta[bh, row] = d_i
        for f in range(d):
            q_row[f] = q[bh, row, f] * factor if active else zero
            acc[f] = zero
        for c in range(d_v):
            do_row[c] = dout[bh, row, c] if active else zero
        j_begin = imax(0, first + lo_off)
        j_end = imin(n_k, imin(first + tpb, n_q) + hi_off)
        v_off = aligned(block_k * d)  # V rows start 16-byte aligned (ld.shared.v4)
        for j0 in range(j_begin, j_end, block_k):
            nb = imin(block_k, j_end - j0)
            a = imax(0, i + lo_off - j0)
            b = imin(nb, i + hi_off + 1 - j0)
            if has_mask:
                seen = active and any_admissible(mask, m_bh, i, j0 + a, j0 + b)
                if not block_any(seen):
                    continue
            load_d(tile, 0, k, kv, a_k + j0, nb, one)
            load_v(tile, v_off, v, kv, a_k + j0, nb, one)
            cuda.syncthreads()
            if active:
                for jj in range(a, b):
                    s, t = capped(dot_d(q_row, tile, U(jj) * U(d)), cap, inv_cap)
                    s = terms(s, mask, m_bh, slope, i, j0 + jj)
                    if has_mask and s == minus_inf:  # only a mask gives -inf
                        continue
                    e = s - shift  # <= 0 but for rounding: never above 0 (no overflow)
                    p = exp2(zero if e > zero else e)
                    dp = dot_v(do_row, tile, U(v_off) + U(jj) * U(d_v))
                    if use_dropout:  # dP of the weights before dropout: (dO V^T) o Z
                        count = counter(bh, row0 + a_q + i, col0 + a_k + j0 + jj, n_rows, n_cols)
                        dp = dp * drop_scale if keep(seed, count, threshold) else zero
                    ds = p * (dp - d_i)
                    if use_softcap:
                        ds *= one - t * t
                    axpy_d(acc, ds, tile, U(jj) * U(d))
            cuda.syncthreads()
        if i < n_q:
            factor = float_type(scale)
            for f in range(d):
                dq[bh, row, f] = acc[f] * factor

    def make_dkdv_kernel(want_dk, want_dv):
        """One thread per key: dK (want_dk) or dV (want_dv) of its key row, summed over
        the query slices that read its key/value slice."""

        @jit
        def flash_dkdv_kernel(
            q, k, v, lse, dout, delta, readers, reader_start, cu_q, cu_k, offsets, mask,
            mask_index, slopes, q_factor, softcap, seed, threshold, n_rows, n_cols, row0, col0,
            keep_scale, block_q, kv0, dk, dv,
        ):  # fmt: skip
            # block_q x (d + d_v + 2): Q, dO, lse, D (16-byte aligned base)
            if SHARED_ALIGNMENT_KWARG:  # one spelling per numba; the other is pruned
                tile = cuda.shared.array(0, dtype=float_type, alignment=16)
            else:
                tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
            tx = cuda.threadIdx.x
            tpb = cuda.blockDim.x
            seq, kv, a_q, n_q, a_k, n_k, lo_off, hi_off = sequence(
                kv0 + cuda.blockIdx.y, k.shape[0], cu_q, cu_k, offsets
            )
            first = cuda.blockIdx.x * tpb
            if first >= n_k:
                return
            j = first + tx
            active = j < n_k
            cap = float_type(softcap)
            inv_cap = float_type(1.0 / softcap) if use_softcap else zero
            drop_scale = float_type(keep_scale)
            factor = float_type(q_factor)
            k_row = cuda.local.array(d, dtype=float_type)
            v_row = cuda.local.array(d_v if want_dk else 1, dtype=float_type)
            dk_acc = cuda.local.array(d if want_dk else 1, dtype=float_type)
            dv_acc = cuda.local.array(d_v if want_dv else 1, dtype=float_type)
            for f in range(d):
                k_row[f] = k[kv, a_k + j, f] if active else zero
            if want_dk:
                for f in range(d):
                    dk_acc[f] = zero
                for c in range(d_v):
                    v_row[c] = v[kv, a_k + j, c] if active else zero
            if want_dv:
                for c in range(d_v):
                    dv_acc[c] = zero
            do_off = aligned(block_q * d)  # dO rows start 16-byte aligned
            lse_off = do_off + block_q * d_v
            delta_off = lse_off + block_q
            # key j is seen by rows j - hi_off <= i <= j - lo_off; the block walks their union
            i_begin = imax(0, first - hi_off)
            i_end = imin(n_q, imin(first + tpb, n_k) - lo_off)
            # one flat loop over (reader, query tile): one loop level fewer keeps registers
            n_tiles = imax(0, (i_end - i_begin + block_q - 1) // block_q)
            first_reader = reader_start[kv]
            for item in range((reader_start[kv + 1] - first_reader) * n_tiles):
                bh = readers[first_reader + item // n_tiles]
                m_bh = mask_index[bh] if has_mask else 0
                slope = slopes[bh] if use_alibi else zero
                i0 = i_begin + (item % n_tiles) * block_q
                mb = imin(block_q, i_end - i0)
                a = imax(0, j - hi_off - i0)
                b = imin(mb, j - lo_off + 1 - i0)
                if has_mask:  # skip a tile that the mask closes for every key of the block
                    seen = False
                    if active:
                        for ii in range(a, b):
                            if mask_term(mask, m_bh, i0 + ii, j) != minus_inf:
                                seen = True
                                break
                    if not block_any(seen):
                        continue
                load_d(tile, 0, q, bh, a_q + i0, mb, factor)
                load_v(tile, do_off, dout, bh, a_q + i0, mb, one)
                for idx in range(tx, mb, tpb):
                    tile[lse_off + idx] = float_type(lse[bh, a_q + i0 + idx] * LOG2E)
                    tile[delta_off + idx] = delta[bh, a_q + i0 + idx]
                cuda.syncthreads()
                if active:
                    for ii in range(a, b):
                        shift = tile[lse_off + ii]
                        if shift == minus_inf:
                            continue
                        base = U(ii) * U(d)
                        s, t = capped(dot_d(k_row, tile, base), cap, inv_cap)
                        s = terms(s, mask, m_bh, slope, i0 + ii, j)
                        if has_mask and s == minus_inf:
                            continue
                        e = s - shift  # <= 0 but for rounding: never above 0
                        p = exp2(zero if e > zero else e)
                        pz = p  # P o Z: the weight after dropout
                        if use_dropout:
                            count = counter(
                                bh, row0 + a_q + i0 + ii, col0 + a_k + j, n_rows, n_cols
                            )
                            pz = p * drop_scale if keep(seed, count, threshold) else zero
                        g_base = U(do_off) + U(ii) * U(d_v)
                        if want_dv:
                            axpy_v(dv_acc, pz, tile, g_base)
                        if want_dk:  # dS = P o ((dO V^T) o Z - D)
                            dp = dot_v(v_row, tile, g_base)
                            ds = pz * dp - p * tile[delta_off + ii]
                            if use_softcap:
                                ds *= one - t * t
                            axpy_d(dk_acc, ds, tile, base)
                cuda.syncthreads()
            if active and want_dk:  # dK = ln 2 dS^T Q' (Q' = the base-2 queries in the tile)
                for f in range(d):
                    dk[kv, a_k + j, f] = dk_acc[f] * ln2
            if active and want_dv:
                for c in range(d_v):
                    dv[kv, a_k + j, c] = dv_acc[c]

        return flash_dkdv_kernel

    dk_kernel = make_dkdv_kernel(True, False)
    dv_kernel = make_dkdv_kernel(False, True)
    return flash_forward_kernel, flash_dq_kernel, dk_kernel, dv_kernel


def flash_kernels(
    dtype, d, d_v, mask_kind=NO_MASK, alibi=False, softcap=False, dropout=False, packed=False
):  # fmt: skip
    """The (forward, dq, dk, dv) kernels for a dtype, head sizes and feature set
    (``mask_kind``: NO_MASK, BOOL_MASK or FLOAT_MASK; ``alibi``, ``softcap``,
    ``dropout``, ``packed``: whether those terms are compiled in), compiled on first use."""
    limit = config.CUDA_MAX_HEAD_DIM
    if not (1 <= d <= limit and 1 <= d_v <= limit):
        raise ValueError(
            f"the CUDA flash kernels take head dimensions up to {limit} "
            f"(config.CUDA_MAX_HEAD_DIM), got D={d}, Dv={d_v}"
        )
    t = np.dtype(dtype).type
    features = (int(mask_kind), bool(alibi), bool(softcap), bool(dropout), bool(packed))
    return compiled(
        ("flash", t, int(d), int(d_v), *features),
        lambda: _make_kernels(t, int(d), int(d_v), *features),
    )


def band_offsets(bands, n_q, n_k):
    """``(lo_off, hi_off)`` per band ``(offset, left, right)`` (rows of ``bands``, with
    the lengths ``n_q``, ``n_k`` of their sequences): row i sees the keys
    i + lo_off <= j <= i + hi_off, lo_off = offset - left, hi_off = offset + right,
    clamped to +-(n_q + n_k + 1) (a side that large is unbounded; the kernels'
    integer bounds then never overflow). Returns int64 (n, 2)."""
    bands = np.asarray(bands, dtype=np.int64).reshape(-1, 3)
    far = np.asarray(n_q, dtype=np.int64) + np.asarray(n_k, dtype=np.int64) + 1
    offset, left, right = bands[:, 0], bands[:, 1], bands[:, 2]
    lo = np.maximum(offset - np.minimum(left, far), -far)
    hi = np.minimum(offset + np.minimum(right, far), far)
    return np.ascontiguousarray(np.stack([lo, hi], axis=1))


def host_array(array, dtype=None):
    """A host copy of a small argument array (device arrays are copied back)."""
    if hasattr(array, "copy_to_host"):
        array = array.copy_to_host()
    elif not isinstance(array, np.ndarray) and hasattr(array, "__cuda_array_interface__"):
        array = cuda.as_cuda_array(array).copy_to_host()
    return np.asarray(array, dtype=dtype)


class _Call:
    """One call's optional terms and packing as the launched kernels take them:
    compile-time flags, device arrays (placeholders where unused) and scalars.

    ``packing`` holds cu_q, cu_k and one band (offset, left, right) per packed
    sequence; ``bias`` (None for none) the mask, its slice index and the ALiBi
    slopes (its ``mask_live`` is the CPU's and not used)."""

    def __init__(self, q, kv_index, packing: Packing, bias, score: ScoreTransform, dropout: Dropout,
                 packed=False):  # fmt: skip
        self.packed = packed
        self.kv_index = host_array(kv_index, np.int64)
        cu_q, cu_k = host_array(packing.cu_q, np.int64), host_array(packing.cu_k, np.int64)
        self.n_seqs = cu_q.size - 1
        self.longest_q = int(np.diff(cu_q).max(initial=0))
        self.longest_k = int(np.diff(cu_k).max(initial=0))
        self.cu_q, self.cu_k = to_device(cu_q), to_device(cu_k)
        bands = host_array(packing.bands)
        self.offsets = to_device(band_offsets(bands, np.diff(cu_q), np.diff(cu_k)))
        mask, mask_index, _, slopes = (None,) * 4 if bias is None else bias
        if mask is None or mask.shape[0] == 0:
            self.mask_kind = NO_MASK
            mask = np.zeros((1, 1, 1), dtype=q.dtype)
            mask_index = np.zeros(1, dtype=np.int64)
        else:
            self.mask_kind = BOOL_MASK if np.dtype(mask.dtype) == np.bool_ else FLOAT_MASK
        self.mask = to_device(mask)
        self.mask_index = to_device(host_array(mask_index, np.int64))
        self.alibi = slopes is not None and slopes.shape[0] > 0
        if not self.alibi:
            slopes = np.zeros(1, dtype=q.dtype)
        self.slopes = to_device(slopes)
        self.softcap = float(score.softcap)
        # a p whose threshold rounds to 0 drops nothing but still scales by 1 / (1 - p)
        self.dropout = bool(dropout.threshold > 0 or dropout.keep_scale != 1.0)
        self.scalars = (  # the launched kernels take the dropout group flat
            np.uint64(dropout.seed),
            np.uint64(dropout.threshold),
            int(dropout.n_rows),  # counter rows, columns, first row, first column
            int(dropout.n_cols),
            int(dropout.row0),
            int(dropout.col0),
            float(dropout.keep_scale),
        )

    def kernels(self, dtype, d, d_v):
        flags = (self.mask_kind, self.alibi, self.softcap > 0.0, self.dropout, self.packed)
        return flash_kernels(dtype, d, d_v, *flags)

    def packing(self):
        return (self.cu_q, self.cu_k, self.offsets)

    def readers(self, n_kv):
        """The query slices that read each K/V slice, grouped: (readers, start (n_kv + 1,))."""
        order = np.argsort(self.kv_index, kind="stable").astype(np.int64)
        counts = np.bincount(self.kv_index, minlength=n_kv)[:n_kv]
        start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return to_device(order), to_device(start)


# The launched @cuda.jit kernels keep flat arguments: the groups of the CPU contract are
# unpacked into _Call here, so the kernels' PTX and register counts (scripts/ptx.py)
# do not depend on how the host wrappers take their arguments.
def forward_packed(call: _Call, q, k, v, q_factor=1.0):
    """The forward launch of one call over its packed sequences: ``(out, lse)``."""
    q, k, v = to_device(q), to_device(k), to_device(v)
    n_bh, n_rows, d = q.shape
    d_v = v.shape[2]
    dtype = np.dtype(q.dtype)
    forward = call.kernels(dtype, d, d_v)[0]
    out = cuda.device_array((n_bh, n_rows, d_v), dtype=dtype)
    lse = cuda.device_array((n_bh, n_rows), dtype=np.float64)
    block_k = tile_rows(d + d_v, dtype.itemsize)
    shared = shared_bytes(block_k * (d + d_v) + 3, dtype.itemsize)  # + 3: V aligned
    head = (q, k, v, to_device(call.kv_index), *call.packing(), call.mask, call.mask_index)
    terms = (call.slopes, float(q_factor), call.softcap, *call.scalars)

    def args_for(b0, b1):
        return (*head, *terms, block_k, b0, out, lse)

    n_items = call.n_seqs * n_bh
    launch(forward, call.longest_q, args_for, shared=shared, n_slices=n_items)
    return out, lse


def backward_packed(call: _Call, q, k, v, out, lse, dout, scale, q_factor=1.0):
    """The backward launches of one call over its packed sequences: ``(dq, dk, dv)``."""
    q, k, v, out, lse, dout = (to_device(a) for a in (q, k, v, out, lse, dout))
    n_bh, n_rows, d = q.shape
    n_kv, n_keys = k.shape[0], k.shape[1]
    d_v = v.shape[2]
    dtype = np.dtype(q.dtype)
    _, dq_kernel, dk_kernel, dv_kernel = call.kernels(dtype, d, d_v)
    dq = cuda.device_array((n_bh, n_rows, d), dtype=dtype)
    dk = cuda.device_array((n_kv, n_keys, d), dtype=dtype)
    dv = cuda.device_array((n_kv, n_keys, d_v), dtype=dtype)
    delta = cuda.device_array((n_bh, n_rows), dtype=dtype)
    masks = (*call.packing(), call.mask, call.mask_index, call.slopes)
    words = (call.softcap, *call.scalars)
    block_k = tile_rows(d + d_v, dtype.itemsize)
    kv_index = to_device(call.kv_index)

    def dq_args(b0, b1):
        inputs = (q, k, v, out, lse, dout, kv_index, *masks, float(q_factor), float(scale))
        return (*inputs, *words, block_k, b0, dq, delta)

    shared = shared_bytes(block_k * (d + d_v) + 3, dtype.itemsize)
    launch(dq_kernel, call.longest_q, dq_args, shared=shared, n_slices=call.n_seqs * n_bh)
    block_q = tile_rows(d + d_v + 2, dtype.itemsize)
    readers, reader_start = call.readers(n_kv)

    def dkdv_args(b0, b1):
        inputs = (q, k, v, lse, dout, delta, readers, reader_start, *masks, float(q_factor))
        return (*inputs, *words, block_q, b0, dk, dv)

    shared = shared_bytes(block_q * (d + d_v + 2) + 3, dtype.itemsize)
    n_items = call.n_seqs * n_kv
    launch(dv_kernel, call.longest_k, dkdv_args, shared=shared, n_slices=n_items)
    launch(dk_kernel, call.longest_k, dkdv_args, shared=shared, n_slices=n_items)
    return dq, dk, dv


def _one_sequence(q, k, band: Band):
    """The packing of an unpacked call: one sequence of all rows and keys, with ``band``."""
    cu_q = np.array([0, q.shape[1]], np.int64)
    cu_k = np.array([0, k.shape[1]], np.int64)
    return Packing(cu_q, cu_k, np.array([band], dtype=np.int64))


def _short_form(q, k, scale, causal):
    """The call of the short form ``(q, k, v, scale, causal)``: the user's q, top-left
    causal or nothing, no mask, ALiBi, softcap or dropout; and the q factor."""
    far = q.shape[1] + k.shape[1] + 1
    band = Band(0, far, 0 if causal else far)
    kv_index = np.arange(q.shape[0], dtype=np.int64)  # one K/V slice per query slice
    call = _Call(
        q, kv_index, _one_sequence(q, k, band), None, ScoreTransform(scale, 0.0), NO_DROPOUT
    )
    return call, float(scale) * LOG2E


def _full_form(q, k, kv_index, bias, band, score, dropout, tiles):
    """The call of the CPU contract's arguments (``tiles`` is the CPU's and not used)."""
    return _Call(q, kv_index, _one_sequence(q, k, band), bias, score, dropout)


def flash_forward(q, k, v, *args):
    """``(out, lse)`` as device arrays: out (BH, L, Dv) in the input dtype, lse (BH, L)
    float64 in natural units -- the twin of ``nbattn.kernels.flash.flash_forward``.

    The full form takes the CPU kernel's arguments (see its module docstring and
    ``nbattn._core.attn_groups``)::

        flash_forward(q, k, v, kv_index, bias, band, score, dropout, tiles)

    q is the user's q times scale * log2(e), the mask, slopes and softcap are
    base 2; ``bias.mask_live`` and ``tiles`` are the CPU's and are not used
    here (the GPU's tiles follow ``config``, and a block skips a key tile that
    the mask closes for all its rows by itself). A boolean mask (True = may
    attend) is accepted besides the float one. The short form
    ``flash_forward(q, k, v, scale, causal)`` takes the user's q and plain
    (top-left causal) attention. Arrays may be host or device arrays.
    """
    q, k = to_device(q), to_device(k)
    if len(args) == 2:
        call, q_factor = _short_form(q, k, *args)
        return forward_packed(call, q, k, v, q_factor)
    return forward_packed(_full_form(q, k, *args), q, k, v)


def flash_backward(q, k, v, out, lse, dout, *args):
    """``(dq, dk, dv)`` as device arrays in the input dtype -- the twin of
    ``nbattn.kernels.flash.flash_backward``.

    The full form takes the CPU kernel's arguments::

        flash_backward(q, k, v, out, lse, dout, kv_index, bias, band, score, dropout, tiles)

    (base-2 q as in the forward; dq is the gradient for the user's q, dk and
    dv have k's and v's slices, summed over the query slices that read them;
    ``bias.mask_live`` and ``tiles`` are the CPU's and unused). The short form
    ``flash_backward(q, k, v, out, lse, dout, scale, causal)`` takes the
    user's q. ``lse`` is float64 and may hold -inf (rows without keys: zero
    gradients).
    """
    q, k = to_device(q), to_device(k)
    if len(args) == 2:
        call, q_factor = _short_form(q, k, *args)
        return backward_packed(call, q, k, v, out, lse, dout, float(args[0]), q_factor)
    score = args[3]
    return backward_packed(_full_form(q, k, *args), q, k, v, out, lse, dout, score.scale)


def varlen_call(q, kv_index, packing: Packing, score: ScoreTransform, dropout: Dropout):
    """The call of packed sequences (no mask, no ALiBi: ``nbattn.kernels.varlen``'s terms)."""
    return _Call(q, kv_index, packing, None, score, dropout, packed=True)
