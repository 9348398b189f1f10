"""Programmable attention on the GPU: the twin of ``nbattn.kernels.flex``.

The user's ``score_mod`` and ``mask_mod`` (FlexAttention's convention) are
compiled with ``cuda.jit(device=True)`` into kernels of the shape of
``nbattn.cuda.flash``'s. For query slice bh (b = bh // n_heads, h = bh % n_heads),
its key/value slice ``kv = kv_index[bh]`` and q arriving times ``scale``:

    s_ij   = score_mod(q_i . k_j, b, h, i, j, *score_args)
    s_ij   = -inf where not mask_mod(b, h, i, j, *mask_args), or j is outside the band
    out_i  = sum_j softmax_j(s_ij) v_j,     lse_i = log sum_j exp(s_ij)

in base 2 as the CPU (the modified score times log2(e), an online softmax:
running maximum, float64 sum, rescaled accumulator), and the backward

    g = d score_mod / d score,  dS = P o (dP - D) o g,
    dQ = scale dS K,  dK = dS^T (scale Q),  dV = P^T dO

with g by the complex step (score_mod(s + i h) in complex128, h = 2**-64: g =
Im / h, the value its real part) or from the user's ``score_grad``. P is
2**min(t - lse log2(e), 0), t the forward's base-2 score (rounded as there), and
the shift lse log2(e) taken in float64: float32 kernels split it into top =
float32(shift) and the float32 rest (t - top is exact near the row's maximum);
float64 kernels take an exponent within the shift's rounding error (4 ulp) of 0
as 0. Either way the rounding of lse can neither make P overflow nor make the
largest score of a row lose its weight at huge scores.

``score_mod`` runs only on the entries the mask admits (the CPU runs it on every
entry of a visited tile and masks after: the same results, as ``score_mod`` has no
effects). NaN or +inf from ``score_mod`` on an admissible entry makes the row NaN (out
and lse), -inf masks the entry, and a finite score whose base-2 form would
overflow is recorded and refused by :func:`flex_forward` (the CPU kernel's
message), as on the CPU.

Geometry: the forward and dQ kernels run one thread per query row, a block
per (row block, slice), key tiles of K and V in shared memory; dK and dV one
thread per key row over tiles of Q and dO of the slices that read its key/value
slice (two kernels, as ``flash``: no atomics, deterministic). The tile
functions (``load_rows``, ``dot``, ``axpy``), the exp2 and the band offsets are
``nbattn.cuda.flash``'s.

Tile classes: ``blocks`` (BB, BH, QT, KT) uint8, the table of a
``BlockMask`` (0 = mask_mod False on the whole tile, 1 = partial, 2 = True
on the whole tile) for tiles of ``cells = (cell_q, cell_k)`` rows and keys,
whatever they are (the CPU kernels' tiles: the table the block mask already
holds). A block of threads skips a key tile when every cell it touches is 0
(a decision all its threads take alike), and each entry reads its own cell:
0 skips it, 2 skips the per-element ``mask_mod``. A call without a block mask
passes one cell (1 with a mask_mod, 2 without) as large as the problem.

Kernels are built per (dtype, D, Dv, the user functions) and kept in the
process (``common.compiled``, keyed by the callers' fingerprints of the
functions, ``nbattn.kernels.flex_build.fingerprint``): numba's CUDA disk cache
would key a kernel on a pickle of the user functions in its closure, which
names a function by module and name, not by what it computes, so a changed
function of the same name could load a stale kernel; they are therefore
compiled once per process (``cache=False``).
"""

from __future__ import annotations

import cmath
import math

import numpy as np
from numba import cuda, types
from numba.core.errors import NumbaError
from numba.extending import overload

from .. import config
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
from .flash import aligned, band_offsets, exp2_for, host_array, tile_functions

__all__ = [
    "adopt_tanh",
    "device_function",
    "flex_backward",
    "flex_forward",
    "flex_kernels",
    "no_blocks",
]

LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634
#: The complex step h, as the CPU kernels' (``nbattn.kernels.flex.STEP``).
STEP = 2.0**-64
INV_STEP = 2.0**64
#: The largest float32, and the largest score whose base-2 form is finite per dtype.
MAX32 = float(np.finfo(np.float32).max)
LIMIT32 = MAX32 / LOG2E
LIMIT64 = float(np.finfo(np.float64).max) / LOG2E
#: A bound on the relative rounding error of lse log2(e) (lse from the forward's m ln 2 +
#: log l): 4 ulp, twice what the three roundings can make.
NOISE = 2.0**-50
U = np.uint64

#: The tanh functions given a CUDA form (:func:`adopt_tanh`).
_ADOPTED = set()


def _tanh_real(x):
    return math.tanh(x)


def _tanh_complex(x):
    return cmath.tanh(x)


def adopt_tanh(fn):
    """Give ``fn`` (``nbattn.flex_tanh``, whose CPU form is bit arithmetic that does not
    compile for CUDA) a CUDA form: ``math.tanh`` of a real score (the softcap path's
    ``tanh.approx``-free libdevice tanh) and ``cmath.tanh`` of a complex one (the
    complex step). Registered once per function."""
    if id(fn) in _ADOPTED:
        return

    @overload(fn, target="cuda")
    def _tanh_cuda(x):
        if isinstance(x, types.Complex):
            return _tanh_complex
        if isinstance(x, (types.Float, types.Integer)):
            return _tanh_real
        return None

    _ADOPTED.add(id(fn))


def device_function(fn):
    """``fn`` (a plain function, or numba-jitted: its ``py_func``) as a CUDA device
    function, compiled into the kernels that call it (not cached on disk)."""
    return jit(device=True, cache=False)(getattr(fn, "py_func", fn))


def _identity_score(score, b, h, q_idx, kv_idx, *args):
    return score


def _always(b, h, q_idx, kv_idx, *args):
    return True


def _make_kernels(float_type, d, d_v, score_mod, mask_mod, score_grad):
    """Forward, dQ, dK and dV kernels for one dtype, head sizes and user functions
    (None: the identity, no mask, the complex step)."""
    zero = float_type(0.0)
    minus_inf = float_type(-np.inf)
    log2e = float_type(LOG2E)
    is32 = float_type == np.float32
    limit = LIMIT32 if is32 else LIMIT64
    # the CPU stores a float32 score beyond the float32 range as the largest float32
    status_cap = MAX32 if float_type == np.float32 else math.inf
    exp2 = exp2_for(float_type)
    load_d, dot_d, axpy_d = tile_functions(float_type, d)
    load_v, dot_v, axpy_v = tile_functions(float_type, d_v)
    has_score = score_mod is not None
    has_mask = mask_mod is not None
    user_grad = score_grad is not None
    score_dev = device_function(score_mod if has_score else _identity_score)
    mask_dev = device_function(mask_mod if has_mask else _always)
    grad_dev = device_function(score_grad if user_grad else _identity_score)

    @jit(device=True, inline=True, cache=False)
    def cell(blocks, b, h, qc, kc):
        """The class of tile (qc, kc) of ``blocks`` for batch entry b, head h."""
        return blocks[
            b if blocks.shape[0] > 1 else 0,
            h if blocks.shape[1] > 1 else 0,
            qc if blocks.shape[2] > 1 else 0,
            kc if blocks.shape[3] > 1 else 0,
        ]

    @jit(device=True, inline=True, cache=False)
    def any_open(blocks, cell_q, cell_k, b, h, i_lo, i_hi, j_lo, j_hi):
        """Whether some cell meeting rows [i_lo, i_hi) and keys [j_lo, j_hi) is not closed."""
        if i_hi <= i_lo or j_hi <= j_lo:
            return False
        for qc in range(i_lo // cell_q, (i_hi - 1) // cell_q + 1):
            for kc in range(j_lo // cell_k, (j_hi - 1) // cell_k + 1):
                if cell(blocks, b, h, qc, kc) != 0:
                    return True
        return False

    @jit(device=True, inline=True, cache=False)
    def admitted(state, b, h, i, j, mask_args):
        """Whether entry (i, j), in a cell of class ``state``, is admissible: never in a
        closed cell, always in an open one, by ``mask_mod`` in a partial one."""
        if state == 0:
            return False
        if has_mask and state == 1:
            return bool(mask_dev(b, h, i, j, *mask_args))
        return True

    @jit(device=True, inline=True, cache=False)
    def modified(s, b, h, i, j, score_args):
        """score_mod of the product, as a float64 (the CPU's value before its tile cast)."""
        if has_score:
            return float(score_dev(s, b, h, i, j, *score_args))
        return float(s)

    @jit(device=True, inline=True, cache=False)
    def value_and_grad(s, b, h, i, j, score_args):
        """(score_mod(s), d score_mod / d s): the complex step or the user's derivative."""
        if not has_score:
            return float(s), 1.0
        if user_grad:
            return float(score_dev(s, b, h, i, j, *score_args)), float(
                grad_dev(s, b, h, i, j, *score_args)
            )
        z = score_dev(complex(float(s), STEP), b, h, i, j, *score_args)
        return z.real, z.imag * INV_STEP

    @jit(device=True, inline=True, cache=False)
    def row_shift(lse_value):
        """(top, second) of a row's shift lse log2(e) (module docstring: the backward's
        P): float32(shift) and the float32 rest (beyond its rounding error, else 0) in
        float32 kernels; the shift and its rounding error in float64 kernels."""
        shift = lse_value * LOG2E
        noise = abs(shift) * NOISE
        top = float_type(shift)
        if is32:
            rest = shift - float(top)
            return top, float_type(rest) if abs(rest) > noise else zero
        return top, float_type(noise)

    @jit(device=True, inline=True, cache=False)
    def weight(x, top, second):
        """P of a modified score ``x`` (float64) against a row's (top, second): 2 to the
        forward's base-2 score less the shift, never above 0."""
        t = float_type(x) * log2e
        if is32:
            e = (t - top) - second
            return exp2(zero if e > zero else e)
        e = t - top
        return exp2(zero if e > -second else e)

    @jit(cache=False)
    def flex_forward_kernel(
        q, k, v, kv_index, offsets, blocks, cell_q, cell_k, n_heads, score_args, mask_args,
        block_k, bh0, out, lse, status,
    ):  # fmt: skip
        if SHARED_ALIGNMENT_KWARG:  # one spelling per numba; the other is pruned
            tile = cuda.shared.array(0, dtype=float_type, alignment=16)
        else:
            tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bh = bh0 + cuda.blockIdx.y
        n_q = q.shape[1]
        n_k = k.shape[1]
        kv = kv_index[bh]
        b = np.int64(bh // n_heads)
        h = np.int64(bh % n_heads)
        lo_off = offsets[0, 0]
        hi_off = offsets[0, 1]
        first = cuda.blockIdx.x * tpb
        if first >= n_q:
            return
        i = first + tx
        active = i < n_q
        last = imin(first + tpb, n_q)
        row = np.int64(i)
        qc = row // cell_q  # the thread's row of the table
        q_row = cuda.local.array(d, dtype=float_type)
        acc = cuda.local.array(d_v, dtype=float_type)
        for f in range(d):
            q_row[f] = q[bh, i, f] if active else zero
        for c in range(d_v):
            acc[c] = zero
        m = minus_inf  # base 2
        l_sum = 0.0
        poison = False
        j_begin = imax(0, first + lo_off)
        j_end = imin(n_k, last + hi_off)
        v_off = aligned(block_k * d)
        for j0 in range(j_begin, j_end, block_k):
            nb = imin(block_k, j_end - j0)
            # every thread of the block takes the same decision: no barrier needed
            if not any_open(blocks, cell_q, cell_k, b, h, first, last, j0, j0 + nb):
                continue
            load_d(tile, 0, k, kv, j0, nb, float_type(1.0))
            load_v(tile, v_off, v, kv, j0, nb, float_type(1.0))
            cuda.syncthreads()
            if active:
                lo = imax(0, i + lo_off - j0)
                hi = imin(nb, i + hi_off + 1 - j0)
                edge = np.int64(-1)  # the first key of the next cell of the table
                state = np.uint8(0)
                for jj in range(lo, hi):
                    j = np.int64(j0 + jj)
                    if j >= edge:  # a division per cell, not per key
                        kc = j // cell_k
                        edge = (kc + 1) * cell_k
                        state = cell(blocks, b, h, qc, kc)
                    if not admitted(state, b, h, row, j, mask_args):
                        continue
                    x = modified(dot_d(q_row, tile, U(jj) * U(d)), b, h, row, j, score_args)
                    if x != x or x == math.inf:
                        poison = True
                        continue
                    if x == -math.inf:
                        continue
                    if abs(x) > limit:
                        cuda.atomic.max(status, 0, imin(abs(x), status_cap))
                        continue
                    s = float_type(x) * log2e
                    if s > m:
                        rescale = exp2(m - s)
                        l_sum *= rescale
                        for c in range(d_v):
                            acc[c] *= rescale
                        m = s
                    w = exp2(s - m)
                    l_sum += w
                    axpy_v(acc, w, tile, U(v_off) + U(jj) * U(d_v))
            cuda.syncthreads()
        if active:
            if poison:
                for c in range(d_v):
                    out[bh, i, c] = math.nan
                lse[bh, i] = math.nan
            elif l_sum > 0.0:
                inv = float_type(1.0 / l_sum)
                for c in range(d_v):
                    out[bh, i, c] = acc[c] * inv
                lse[bh, i] = float(m) * LN2 + math.log(l_sum)
            else:
                for c in range(d_v):
                    out[bh, i, c] = zero
                lse[bh, i] = -math.inf

    @jit(cache=False)
    def flex_dq_kernel(
        q, k, v, out, lse, dout, kv_index, offsets, blocks, cell_q, cell_k, n_heads,
        score_args, mask_args, scale, block_k, bh0, dq, delta,
    ):  # fmt: skip
        if SHARED_ALIGNMENT_KWARG:
            tile = cuda.shared.array(0, dtype=float_type, alignment=16)
        else:
            tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bh = bh0 + cuda.blockIdx.y
        n_q = q.shape[1]
        n_k = k.shape[1]
        kv = kv_index[bh]
        b = np.int64(bh // n_heads)
        h = np.int64(bh % n_heads)
        lo_off = offsets[0, 0]
        hi_off = offsets[0, 1]
        first = cuda.blockIdx.x * tpb
        if first >= n_q:
            return
        i = first + tx
        active = i < n_q
        last = imin(first + tpb, n_q)
        row = np.int64(i)
        qc = row // cell_q
        q_row = cuda.local.array(d, dtype=float_type)
        do_row = cuda.local.array(d_v, dtype=float_type)
        acc = cuda.local.array(d, dtype=float_type)
        top = zero
        second = zero
        d_i = zero
        if active:
            active = lse[bh, i] != -math.inf
            top, second = row_shift(lse[bh, i])
            total = 0.0
            for c in range(d_v):
                total += float(dout[bh, i, c]) * float(out[bh, i, c])
            d_i = float_type(total)
            delta[bh, i] = d_i
        for f in range(d):
            q_row[f] = q[bh, i, f] if active else zero
            acc[f] = zero
        for c in range(d_v):
            do_row[c] = dout[bh, i, c] if active else zero
        j_begin = imax(0, first + lo_off)
        j_end = imin(n_k, last + hi_off)
        v_off = aligned(block_k * d)
        for j0 in range(j_begin, j_end, block_k):
            nb = imin(block_k, j_end - j0)
            if not any_open(blocks, cell_q, cell_k, b, h, first, last, j0, j0 + nb):
                continue
            load_d(tile, 0, k, kv, j0, nb, float_type(1.0))
            load_v(tile, v_off, v, kv, j0, nb, float_type(1.0))
            cuda.syncthreads()
            if active:
                lo = imax(0, i + lo_off - j0)
                hi = imin(nb, i + hi_off + 1 - j0)
                edge = np.int64(-1)
                state = np.uint8(0)
                for jj in range(lo, hi):
                    j = np.int64(j0 + jj)
                    if j >= edge:
                        kc = j // cell_k
                        edge = (kc + 1) * cell_k
                        state = cell(blocks, b, h, qc, kc)
                    if not admitted(state, b, h, row, j, mask_args):
                        continue
                    s = dot_d(q_row, tile, U(jj) * U(d))
                    x, g = value_and_grad(s, b, h, row, j, score_args)
                    if x == -math.inf:
                        continue
                    p = weight(x, top, second)
                    dp = dot_v(do_row, tile, U(v_off) + U(jj) * U(d_v))
                    ds = p * (dp - d_i) * float_type(g)
                    axpy_d(acc, ds, tile, U(jj) * U(d))
            cuda.syncthreads()
        if i < n_q:
            factor = float_type(scale)
            for f in range(d):
                dq[bh, i, f] = acc[f] * factor

    def make_dkdv_kernel(want_dk, want_dv):
        """One thread per key: dK (want_dk) or dV (want_dv) of its key row, summed over
        the query slices that read its key/value slice."""

        @jit(cache=False)
        def flex_dkdv_kernel(
            q, k, v, lse, dout, delta, readers, reader_start, offsets, blocks, cell_q,
            cell_k, n_heads, score_args, mask_args, block_q, kv0, dk, dv,
        ):  # fmt: skip
            if SHARED_ALIGNMENT_KWARG:
                tile = cuda.shared.array(0, dtype=float_type, alignment=16)
            else:
                tile = cuda.shared.array(0, dtype=types.complex128).view(float_type)
            tx = cuda.threadIdx.x
            tpb = cuda.blockDim.x
            kv = kv0 + cuda.blockIdx.y
            n_q = q.shape[1]
            n_k = k.shape[1]
            lo_off = offsets[0, 0]
            hi_off = offsets[0, 1]
            first = cuda.blockIdx.x * tpb
            if first >= n_k:
                return
            j = first + tx
            active = j < n_k
            last = imin(first + tpb, n_k)
            col = np.int64(j)
            kc = col // cell_k  # the thread's column of the table
            k_row = cuda.local.array(d, dtype=float_type)
            v_row = cuda.local.array(d_v if want_dk else 1, dtype=float_type)
            dk_acc = cuda.local.array(d if want_dk else 1, dtype=float_type)
            dv_acc = cuda.local.array(d_v if want_dv else 1, dtype=float_type)
            for f in range(d):
                k_row[f] = k[kv, j, f] if active else zero
            if want_dk:
                for f in range(d):
                    dk_acc[f] = zero
                for c in range(d_v):
                    v_row[c] = v[kv, j, c] if active else zero
            if want_dv:
                for c in range(d_v):
                    dv_acc[c] = zero
            do_off = aligned(block_q * d)
            lse_off = do_off + block_q * d_v  # the rows' (top, second): row_shift
            second_off = lse_off + block_q
            delta_off = second_off + block_q
            i_begin = imax(0, first - hi_off)
            i_end = imin(n_q, last - lo_off)
            n_tiles = imax(0, (i_end - i_begin + block_q - 1) // block_q)
            first_reader = reader_start[kv]
            for item in range((reader_start[kv + 1] - first_reader) * n_tiles):
                bh = readers[first_reader + item // n_tiles]
                b = np.int64(bh // n_heads)
                h = np.int64(bh % n_heads)
                i0 = i_begin + (item % n_tiles) * block_q
                mb = imin(block_q, i_end - i0)
                if not any_open(blocks, cell_q, cell_k, b, h, i0, i0 + mb, first, last):
                    continue
                load_d(tile, 0, q, bh, i0, mb, float_type(1.0))
                load_v(tile, do_off, dout, bh, i0, mb, float_type(1.0))
                for idx in range(tx, mb, tpb):
                    top, second = row_shift(lse[bh, i0 + idx])
                    tile[lse_off + idx] = top
                    tile[second_off + idx] = second
                    tile[delta_off + idx] = delta[bh, i0 + idx]
                cuda.syncthreads()
                if active:
                    lo = imax(0, j - hi_off - i0)
                    hi = imin(mb, j - lo_off + 1 - i0)
                    edge = np.int64(-1)  # the first row of the next cell of the table
                    state = np.uint8(0)
                    for ii in range(lo, hi):
                        i = np.int64(i0 + ii)
                        if i >= edge:  # a division per cell, not per row
                            qc = i // cell_q
                            edge = (qc + 1) * cell_q
                            state = cell(blocks, b, h, qc, kc)
                        top = tile[lse_off + ii]
                        if top == minus_inf:
                            continue
                        if not admitted(state, b, h, i, col, mask_args):
                            continue
                        base = U(ii) * U(d)
                        s = dot_d(k_row, tile, base)
                        x, g = value_and_grad(s, b, h, i, col, score_args)
                        if x == -math.inf:
                            continue
                        p = weight(x, top, tile[second_off + ii])
                        g_base = U(do_off) + U(ii) * U(d_v)
                        if want_dv:
                            axpy_v(dv_acc, p, tile, g_base)
                        if want_dk:
                            dp = dot_v(v_row, tile, g_base)
                            ds = p * (dp - tile[delta_off + ii]) * float_type(g)
                            axpy_d(dk_acc, ds, tile, base)
                cuda.syncthreads()
            if active and want_dk:
                for f in range(d):
                    dk[kv, j, f] = dk_acc[f]
            if active and want_dv:
                for c in range(d_v):
                    dv[kv, j, c] = dv_acc[c]

        return flex_dkdv_kernel

    dk_kernel = make_dkdv_kernel(True, False)
    dv_kernel = make_dkdv_kernel(False, True)
    return flex_forward_kernel, flex_dq_kernel, dk_kernel, dv_kernel


def flex_kernels(dtype, d, d_v, functions, prints):
    """The (forward, dq, dk, dv) kernels for a dtype, head sizes and the user functions
    ``functions = (score_mod, mask_mod, score_grad)`` (None for each one absent),
    whose fingerprints ``prints`` (strings: what determines each function's code) key
    the in-process cache; compiled on first launch."""
    limit = config.CUDA_MAX_HEAD_DIM
    if not (1 <= d <= limit and 1 <= d_v <= limit):
        raise ValueError(
            f"the CUDA flex kernels take head dimensions up to {limit} "
            f"(config.CUDA_MAX_HEAD_DIM), got E={d}, Ev={d_v}; use device='cpu'"
        )
    t = np.dtype(dtype).type
    key = ("flex", t, int(d), int(d_v), *prints)
    return compiled(key, lambda: _make_kernels(t, int(d), int(d_v), *functions))


def no_blocks(n_q, n_k, has_mask):
    """The one-cell table of a call without a block mask: ``(blocks, cells)``."""
    blocks = np.full((1, 1, 1, 1), 1 if has_mask else 2, dtype=np.uint8)
    return blocks, (max(1, n_q), max(1, n_k))


def _compiling(run, what):
    """``run()``, with a ValueError naming the user functions when numba cannot compile
    them for the GPU."""
    try:
        return run()
    except (NumbaError, NotImplementedError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = next(
            (line for line in lines if not line.startswith(("During:", "File", "Failed in"))),
            type(exc).__name__,
        )
        raise ValueError(
            f"score_mod / mask_mod could not be compiled for the GPU ({what}): {reason}"
        ) from None


def _overflow(status, dtype):
    """The CPU kernels' refusal of a score whose base-2 form overflows."""
    limit = LIMIT32 if dtype == np.float32 else LIMIT64
    size = f"{status:.4g}"
    if dtype == np.float32 and status >= MAX32:
        size = f"at least {MAX32:.4g} (beyond the float32 range)"
    return ValueError(
        f"score_mod returned a score of magnitude {size}, beyond {limit:.4g} "
        f"(the largest {np.dtype(dtype).name} / log2(e)): the kernel's base-2 scores would "
        "overflow; keep scores below that (-inf masks an entry)"
    )


def flex_forward(q, k, v, kv_index, n_heads, band, blocks, cells, functions, prints, score_args,
                 mask_args):  # fmt: skip
    """``(out, lse)`` as device arrays: out (BH, L, Dv) in the input dtype, lse (BH, L)
    float64 -- the twin of ``nbattn.kernels.flex.flex_forward`` for a padded batch.

    q (BH, L, E) is the user's q times scale; k, v (BKV, S, .); ``kv_index`` (BH,)
    the key/value slice of each query slice; ``n_heads`` (b = bh // n_heads, h = bh %
    n_heads); ``band`` (offset, left, right); ``blocks`` and ``cells`` the tile
    classes (module docstring; :func:`no_blocks` without a block mask);
    ``functions``, ``prints`` as :func:`flex_kernels`; ``score_args``, ``mask_args``
    tuples of host or device arrays and numbers.
    """
    q, k, v = to_device(q), to_device(k), to_device(v)
    n_bh, n_q, d = q.shape
    n_k, d_v = k.shape[1], v.shape[2]
    dtype = np.dtype(q.dtype)
    forward = flex_kernels(dtype, d, d_v, functions, prints)[0]
    out = cuda.device_array((n_bh, n_q, d_v), dtype=dtype)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float64)
    status = to_device(np.zeros(1))
    block_k = tile_rows(d + d_v, dtype.itemsize)
    shared = shared_bytes(block_k * (d + d_v) + 3, dtype.itemsize)
    head = (q, k, v, to_device(host_array(kv_index, np.int64)), _offsets(band, n_q, n_k))
    tables = (to_device(np.ascontiguousarray(blocks, dtype=np.uint8)), *map(int, cells))
    args = (int(n_heads), _on_device(score_args), _on_device(mask_args))

    def args_for(b0, b1):
        return (*head, *tables, *args, block_k, b0, out, lse, status)

    _compiling(lambda: launch(forward, n_q, args_for, shared=shared, n_slices=n_bh), "forward")
    worst = float(status.copy_to_host()[0])
    if worst > 0.0:
        raise _overflow(worst, dtype.type)
    return out, lse


def flex_backward(q, k, v, out, lse, dout, kv_index, n_heads, band, blocks, cells, functions,
                  prints, score_args, mask_args, scale):  # fmt: skip
    """``(dq, dk, dv)`` as device arrays in the input dtype -- the twin of
    ``nbattn.kernels.flex.flex_backward`` for a padded batch (dk, dv summed over the
    query slices that read each key/value slice). Arguments as :func:`flex_forward`,
    with ``out``, ``dout`` (BH, L, Dv), ``lse`` (BH, L) float64 from the forward and the
    user's ``scale`` (dQ = scale dS K)."""
    q, k, v, out, lse, dout = (to_device(a) for a in (q, k, v, out, lse, dout))
    n_bh, n_q, d = q.shape
    n_kv, n_k = k.shape[0], k.shape[1]
    d_v = v.shape[2]
    dtype = np.dtype(q.dtype)
    _, dq_kernel, dk_kernel, dv_kernel = flex_kernels(dtype, d, d_v, functions, prints)
    dq = cuda.device_array((n_bh, n_q, d), dtype=dtype)
    dk = cuda.device_array((n_kv, n_k, d), dtype=dtype)
    dv = cuda.device_array((n_kv, n_k, d_v), dtype=dtype)
    delta = cuda.device_array((n_bh, n_q), dtype=dtype)
    index = host_array(kv_index, np.int64)
    offsets = _offsets(band, n_q, n_k)
    tables = (to_device(np.ascontiguousarray(blocks, dtype=np.uint8)), *map(int, cells))
    words = (int(n_heads), _on_device(score_args), _on_device(mask_args))
    block_k = tile_rows(d + d_v, dtype.itemsize)

    def dq_args(b0, b1):
        inputs = (q, k, v, out, lse, dout, to_device(index), offsets, *tables, *words)
        return (*inputs, float(scale), block_k, b0, dq, delta)

    shared = shared_bytes(block_k * (d + d_v) + 3, dtype.itemsize)
    _compiling(lambda: launch(dq_kernel, n_q, dq_args, shared=shared, n_slices=n_bh), "dq")
    block_q = tile_rows(d + d_v + 3, dtype.itemsize)
    order = np.argsort(index, kind="stable").astype(np.int64)
    start = np.concatenate(([0], np.cumsum(np.bincount(index, minlength=n_kv)[:n_kv])))
    readers, reader_start = to_device(order), to_device(start.astype(np.int64))

    def dkdv_args(b0, b1):
        inputs = (q, k, v, lse, dout, delta, readers, reader_start, offsets, *tables, *words)
        return (*inputs, block_q, b0, dk, dv)

    shared = shared_bytes(block_q * (d + d_v + 3) + 3, dtype.itemsize)
    for kernel, what in ((dv_kernel, "dv"), (dk_kernel, "dk")):
        _compiling(
            lambda kernel=kernel: launch(kernel, n_k, dkdv_args, shared=shared, n_slices=n_kv),
            what,
        )
    return dq, dk, dv


def _offsets(band, n_q, n_k):
    """The band as the kernels' (1, 2) int64 device array (lo_off, hi_off)."""
    return to_device(band_offsets(np.asarray(band, dtype=np.int64), n_q, n_k))


def _on_device(args):
    """``mod_args`` with its arrays on the device (0-d ones kept 0-d; numbers as they are)."""
    return tuple(
        (cuda.to_device(a) if a.ndim == 0 else to_device(a)) if isinstance(a, np.ndarray) else a
        for a in args
    )
