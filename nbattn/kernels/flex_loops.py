"""The flex kernels' tile loops, compiled once for all user functions.

``nbattn.kernels.flex`` is a template: ``nbattn.kernels.flex_build`` copies it
into a module of its own per (score_mod, mask_mod, score_grad), so that the
user's functions are compiled into its kernels. Only its tile functions call
them: ``_mod_tile`` (a tile of scaled products q_i . k_j modified, masked and
turned to base 2, in place) and ``_mod_tile_grad`` (the same with
d score_mod / d score). The loops around them (the forward's online softmax
over key tiles, the backward's dS = P o (dP - D) o g and its products) do not
depend on the user's functions, and are here: each takes the tile function as
a first-class function argument (``numba.types.FunctionType``), called once per
tile through its address. ``mod_args`` reach them as one int64, the address of
their native values (``nbattn.kernels.flex_shared.held_args``), which the tile
function, compiled for their types, reads back: so the loops compile, and are
cached on disk, once per dtype whatever the types of ``mod_args`` (17 forward and
10 backward compiles of about 2 CPU s each in the test suite when they were part
of the loops' signature), and a new ``score_mod`` compiles its tile
functions alone (about 1 CPU s for both; 2 with the module's checks of the user's
functions) instead of the whole forward and backward again (6). The formulas are
those of ``nbattn.kernels.flex``'s docstring.

The loops run on the threads of :func:`nbattn.kernels.items.run_items`
(``nogil`` item loops, no ``prange``), the backward's row terms and dQ sum are
flash's compiled-once kernels (``nbattn.kernels.flash.backward_rows``,
``sum_groups``), as are ``nbattn.kernels.flex_shared``'s helpers.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, typeof, types

from .. import config
from .base2 import exp2
from .blas import gemm
from .fastmath import like
from .flash import (
    REBASE_EXACT_SUM,
    REBASE_SUM,
    _scale_row,
    _transpose_into,
    backward_rows,
    exp2_shift_sum,
    sum_groups,
)
from .flex_shared import (
    LIMIT32,
    LIMIT64,
    MAX32,
    backward_shifts,
    block_state,
    compiled_entry,
    held_args,
)
from .items import next_item, run_items
from .softmax import row_max

__all__ = ["flex_backward", "flex_forward", "tile_function_type"]

_INDEX = types.int64
_COUNTER = types.Array(types.int64, 1, "C")
_FLAGS = types.Array(types.boolean, 1, "C")
_STATUS = types.Array(types.float64, 1, "C")
#: The address of the held ``(score_args, mask_args)`` (``flex_shared.held_args``).
_ADDRESS = types.int64


def tile_function_type(q, backward):
    """The ``FunctionType`` of a generated module's ``_mod_tile`` (``backward``: its
    ``_mod_tile_grad``) as the loops call it: tiles (m, n) C-contiguous of ``q``'s dtype,
    b, h, i0, j0 int64, the band (offset, left, right), whether the tile is masked, and
    the address of ``(score_args, mask_args)`` (``nbattn.kernels.flex_shared.held_args``;
    then, forward, the rows' NaN flags and the overflow status). The types of
    ``mod_args`` are not part of it: the generated module's tile function, compiled for
    them, reads them back from the address, and the loops compile once per dtype."""
    tile = types.Array(typeof(q).dtype, 2, "C")
    head = (tile, tile) if backward else (tile,)
    common = (
        _INDEX,
        _INDEX,
        _INDEX,
        _INDEX,
        types.UniTuple(_INDEX, 3),
        types.boolean,
        _ADDRESS,
    )
    tail = () if backward else (_FLAGS, _STATUS)
    return types.FunctionType(types.void(*head, *common, *tail))


def _entry(kernel, function_type, args):
    """``kernel``'s compiled entry for ``(counter, tile function, *args)``: compiled (or
    loaded from the cache) for the tile function's type, so that a call with any
    function of that type runs the same machine code (a jitted function passed to a
    kernel otherwise types as itself, and the kernel would compile again for each)."""
    return compiled_entry(kernel, (_COUNTER, function_type) + tuple(typeof(a) for a in args))


def _reads(tile_function):
    """The types of ``(score_args, mask_args)`` a generated module's tile function reads at
    the address it is given: its module's ``ARGS`` (``nbattn.kernels.flex``)."""
    return tile_function.py_func.__globals__["ARGS"]


def flex_forward(mod_tile, q, k, v, blocks, items, tiles, score_args, mask_args, n_out):
    """Blocked attention forward with the tile function ``mod_tile`` (a generated module's
    ``_mod_tile``, the user's functions compiled in: ``nbattn.kernels.flex``); returns
    ``(out, lse)``: out (n_out, L, Ev) in the input dtype, lse (n_out, L) float64
    (natural units); rows no item writes are zeros and -inf.

    A row where ``score_mod`` gives NaN or +inf on an admissible entry is NaN (out and
    lse, as in torch); -inf is a masked entry; a finite score whose base-2 form
    overflows (beyond ``LIMIT64`` or ``LIMIT32``) is a ValueError.

    ``q`` (BH, L, E) is the user's q times ``scale``; ``items`` (records of
    ``nbattn._core.attn_groups.FLEX_FORWARD_ITEM``) say which rows meet which keys
    with which b, h and band: a padded batch, packed sequences and decoding chunks
    are tables of the same kind. ``tiles`` as in ``nbattn.kernels.flash``. The items
    run, in table order, on the threads of :func:`nbattn.kernels.items.run_items`.
    """
    out = np.zeros((n_out, q.shape[1], v.shape[2]), dtype=q.dtype)
    lse = np.full((n_out, q.shape[1]), -np.inf)
    status = np.zeros(1)
    with held_args((score_args, mask_args), _reads(mod_tile)) as address:
        args = (q, k, v, blocks, items, tiles, address, out, lse, status)
        kernel = _entry(_forward_items, tile_function_type(q, False), args)
        run_items(kernel, mod_tile, *args)
    if status[0] > 0.0:
        limit = LIMIT32 if q.dtype == np.float32 else LIMIT64
        size = f"{status[0]:.4g}"
        if q.dtype == np.float32 and status[0] >= MAX32:
            size = f"at least {MAX32:.4g} (beyond the float32 range)"
        raise ValueError(
            f"score_mod returned a score of magnitude {size}, beyond {limit:.4g} "
            f"(the largest {q.dtype} / log2(e)): the kernel's base-2 scores would overflow; "
            "keep scores below that (-inf masks an entry)"
        )
    return out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _forward_items(counter, mod_tile, q, k, v, blocks, items, tiles, address, out, lse, status):
    """The items of :func:`flex_forward`, one per increment of ``counter``."""
    while True:
        item = next_item(counter)
        if item >= items.shape[0]:
            return
        _forward_item(mod_tile, q, k, v, blocks, items[item], tiles, address, out, lse, status)


@njit(fastmath=config.FASTMATH, inline="always")
def _forward_item(mod_tile, q, k, v, blocks, item, tiles, address, out, lse, status):
    """One item (see ``FLEX_FORWARD_ITEM``): its rows of ``out`` and ``lse``."""
    block_k = tiles.block_k
    d_v = v.shape[2]
    bh, kv, b, h = item.bh, item.kv, item.b, item.h
    i0, row0, mb = item.i0, item.row0, item.rows
    k_row0, k_lo, k_hi = item.k_row0, item.k_lo, item.k_hi
    offset, left, right = item.offset, item.left, item.right
    band = (offset, left, right)
    s_flat = np.empty(mb * block_k, dtype=q.dtype)
    acc = np.zeros((mb, d_v), dtype=q.dtype)
    m = np.full(mb, -np.inf)
    l = np.zeros(mb)
    poison = np.zeros(mb, dtype=np.bool_)
    # rows whose scores climbed past their reference in the last tile: their next tile
    # takes its maximum first instead of scoring a saturated row a second time
    climbing = np.zeros(mb, dtype=np.bool_)
    q_tile = q[bh, row0 : row0 + mb]
    j_first = max(i0 + offset - left, k_lo)
    j_last = min(i0 + mb - 1 + offset + right, k_hi - 1)
    kt_first = (j_first - k_lo) // block_k
    kt_last = (j_last - k_lo) // block_k if j_last >= j_first else kt_first - 1
    for kt in range(kt_first, kt_last + 1):
        state = block_state(blocks, b, h, item.qt, kt)
        if state == 0:
            continue
        masked = state == 1
        j0 = k_lo + kt * block_k
        nb = min(block_k, k_hi - j0)
        k_tile = k[kv, k_row0 + j0 : k_row0 + j0 + nb]
        st = s_flat[: mb * nb].reshape((mb, nb))
        gemm(q_tile, k_tile, st, False, True, 0.0)
        mod_tile(st, b, h, i0, j0, band, masked, address, poison, status)
        for r in range(mb):
            row = st[r]
            shift = m[r]
            if shift != -np.inf and not climbing[r]:
                total = exp2_shift_sum(row, like(shift, row))
                if total <= REBASE_SUM:
                    l[r] += total
                    continue
                if total <= REBASE_EXACT_SUM:
                    e = math.frexp(total)[1]
                    _scale_row(row, acc[r], math.ldexp(1.0, -e))
                    l[r] = math.ldexp(l[r] + total, -e)
                    m[r] = shift + e
                    continue
                # weights may have saturated: score the row again, rebase on its maximum
                one = st[r : r + 1]
                gemm(q_tile[r : r + 1], k_tile, one, False, True, 0.0)
                mod_tile(
                    one,
                    b,
                    h,
                    i0 + r,
                    j0,
                    band,
                    masked,
                    address,
                    poison[r : r + 1],
                    status,
                )
                climbing[r] = True
            top = np.float64(row_max(row))
            if top == -np.inf:  # nothing admissible in this tile (nor yet, if shift is -inf)
                row[:] = 0.0
                continue
            if climbing[r] and top <= shift:  # the climb stopped: keep the reference
                climbing[r] = False
                top = shift
            rescale = np.exp2(shift - top)
            l[r] = l[r] * rescale + exp2_shift_sum(row, like(top, row))
            if rescale != 1.0:
                factor = like(rescale, acc)
                acc_row = acc[r]
                for c in range(d_v):
                    acc_row[c] *= factor
            m[r] = top
        gemm(st, v[kv, k_row0 + j0 : k_row0 + j0 + nb], acc, False, False, 1.0)
    ln2 = math.log(2.0)
    o = item.out
    for r in range(mb):
        if poison[r]:  # NaN or +inf from score_mod: NaN, as torch gives
            for c in range(d_v):
                out[o, row0 + r, c] = np.nan
            lse[o, row0 + r] = np.nan
        elif l[r] > 0.0:
            inv = like(1.0 / l[r], acc)
            for c in range(d_v):
                out[o, row0 + r, c] = acc[r, c] * inv
            lse[o, row0 + r] = m[r] * ln2 + np.log(l[r])


@njit(fastmath=config.FASTMATH, inline="always")
def _weights(row, top, rest, margin):
    """In place ``row[j] <- 2**min(row[j] - shift, 0)`` for a row's shift (top, rest,
    margin) of :func:`backward_shifts`: ``row - top`` first, in a loop of its own (exact
    near the row's maximum, and kept apart from ``- rest`` under reassociation), an
    exponent above ``-margin`` taken as 0 (never above 0: no overflow from the rounding
    of lse). Returns the sum of the new values."""
    for j in range(row.shape[0]):
        row[j] -= top
    total = like(0.0, row)
    zero = like(0.0, row)
    for j in range(row.shape[0]):
        e = row[j] - rest
        w = exp2(zero if e > -margin else e)
        row[j] = w
        total += w
    return total


def flex_backward(
    mod_tile_grad,
    q,
    k,
    v,
    out,
    lse,
    dout,
    kv_index,
    n_heads,
    blocks,
    items,
    scale,
    tiles,
    score_args,
    mask_args,
):
    """Blocked attention backward with the tile function ``mod_tile_grad`` (a generated
    module's ``_mod_tile_grad``); returns
    ``(dq, dk, dv)`` in the input dtype (dq (BH, L, E), dk and dv (BKV, S, .) summed
    over the query slices that share them). ``q`` is the user's q times ``scale``,
    ``lse`` (BH, L) float64 natural units from :func:`flex_forward`; ``blocks`` for
    the backward's tile sizes. Work items (records of
    ``nbattn._core.attn_groups.FLEX_BACKWARD_ITEM``) are (key/value slice, key-tile
    group) of one sequence, as in ``nbattn.kernels.flash.flash_backward``; each runs
    every query slice ``bh`` with ``kv_index[bh]`` its slice (b = b0 + bh //
    ``n_heads``, h = bh % ``n_heads``), on the threads of
    :func:`nbattn.kernels.items.run_items`; the row terms before and the sum of the
    groups' dQ after are flash's compiled-once kernels (``backward_rows``, ``sum_groups``)."""
    n_bh, n_q, d = q.shape
    n_kv, n_k, _ = k.shape
    delta, _ = backward_rows(out, dout, lse)
    shifts = backward_shifts(lse, q)
    dq_part = np.zeros((tiles.n_groups, n_bh, n_q, d), dtype=q.dtype)
    dk = np.zeros((n_kv, n_k, d), dtype=q.dtype)
    dv = np.zeros((n_kv, n_k, v.shape[2]), dtype=q.dtype)
    with held_args((score_args, mask_args), _reads(mod_tile_grad)) as address:
        args = (
            q,
            k,
            v,
            dout,
            kv_index,
            n_heads,
            blocks,
            items,
            tiles,
            address,
            delta,
            shifts,
            dq_part,
            dk,
            dv,
        )
        kernel = _entry(_backward_items, tile_function_type(q, True), args)
        run_items(kernel, mod_tile_grad, *args)
    return sum_groups(dq_part, scale), dk, dv


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _backward_items(
    counter,
    mod_tile_grad,
    q,
    k,
    v,
    dout,
    kv_index,
    n_heads,
    blocks,
    items,
    tiles,
    address,
    delta,
    shifts,
    dq_part,
    dk,
    dv,
):
    """The items of :func:`flex_backward`, one per increment of ``counter``."""
    while True:
        item = next_item(counter)
        if item >= items.shape[0]:
            return
        _backward_item(
            mod_tile_grad,
            q,
            k,
            v,
            dout,
            kv_index,
            n_heads,
            blocks,
            items[item],
            tiles,
            address,
            delta,
            shifts,
            dq_part,
            dk,
            dv,
        )


@njit(fastmath=config.FASTMATH, inline="always")
def _backward_item(
    mod_tile_grad,
    q,
    k,
    v,
    dout,
    kv_index,
    n_heads,
    blocks,
    item,
    tiles,
    address,
    delta,
    shifts,
    dq_part,
    dk,
    dv,
):
    """One item (see ``FLEX_BACKWARD_ITEM``): the rows of dk and dv of its key tiles, its
    part of the dq buffer ``dq_part[group]``."""
    block_q, block_k, n_groups = tiles
    n_bh, _, d = q.shape
    d_v = v.shape[2]
    dtype = q.dtype
    kv, group = item.kv, item.group
    q_row0, n_q, k_row0, n_k = item.q_row0, item.n_q, item.k_row0, item.n_k
    offset, left, right = item.offset, item.left, item.right
    band = (offset, left, right)
    n_kt = (n_k + block_k - 1) // block_k
    s_flat = np.empty(block_q * block_k, dtype=dtype)
    dp_flat = np.empty(block_q * block_k, dtype=dtype)
    g_flat = np.empty(block_q * block_k, dtype=dtype)
    dk_acc = np.empty((block_k, d), dtype=dtype)
    dv_acc = np.empty((block_k, d_v), dtype=dtype)
    kt_flat = np.empty(d * block_k, dtype=dtype)
    vt_flat = np.empty(d_v * block_k, dtype=dtype)
    neg_inf = like(-np.inf, q)
    sink = np.zeros(1, dtype=dtype)
    for kt in range(group, n_kt, n_groups):
        j0 = kt * block_k
        nb = min(block_k, n_k - j0)
        dk_acc[:nb] = 0.0
        dv_acc[:nb] = 0.0
        k_tile = k[kv, k_row0 + j0 : k_row0 + j0 + nb]
        v_tile = v[kv, k_row0 + j0 : k_row0 + j0 + nb]
        k_tile_t = _transpose_into(k_tile, kt_flat)
        v_tile_t = _transpose_into(v_tile, vt_flat)
        i_first = max(j0 - offset - right, 0)
        i_last = min(j0 + nb - 1 - offset + left, n_q - 1)
        qt_first = i_first // block_q
        qt_last = i_last // block_q if i_last >= i_first else qt_first - 1
        for bh in range(n_bh):
            if kv_index[bh] != kv:
                continue
            b = item.b0 + bh // n_heads
            h = bh % n_heads
            for qt in range(qt_first, qt_last + 1):
                state = block_state(blocks, b, h, qt, kt)
                if state == 0:
                    continue
                i0 = qt * block_q
                mb = min(block_q, n_q - i0)
                r0 = q_row0 + i0
                q_tile = q[bh, r0 : r0 + mb]
                do_tile = dout[bh, r0 : r0 + mb]
                st = s_flat[: mb * nb].reshape((mb, nb))
                dpt = dp_flat[: mb * nb].reshape((mb, nb))
                gt = g_flat[: mb * nb].reshape((mb, nb))
                gemm(q_tile, k_tile_t, st, False, False, 0.0)
                mod_tile_grad(st, gt, b, h, i0, j0, band, state == 1, address)
                p_sum = like(0.0, q)
                for r in range(mb):
                    row = st[r]
                    top = shifts[0, bh, r0 + r]
                    if top == neg_inf:
                        row[:] = 0.0
                    else:
                        p_sum += _weights(row, top, shifts[1, bh, r0 + r], shifts[2, bh, r0 + r])
                sink[0] += p_sum
                gemm(do_tile, v_tile_t, dpt, False, False, 0.0)
                for r in range(mb):
                    row = st[r]
                    dp_row = dpt[r]
                    g_row = gt[r]
                    di = delta[bh, r0 + r]
                    for j in range(nb):
                        dp_row[j] = row[j] * (dp_row[j] - di) * g_row[j]
                gemm(st, do_tile, dv_acc[:nb], True, False, 1.0)
                gemm(dpt, k_tile, dq_part[group, bh, r0 : r0 + mb], False, False, 1.0)
                gemm(dpt, q_tile, dk_acc[:nb], True, False, 1.0)
        for j in range(nb):
            for c in range(d):
                dk[kv, k_row0 + j0 + j, c] = dk_acc[j, c]
        for j in range(nb):
            for c in range(d_v):
                dv[kv, k_row0 + j0 + j, c] = dv_acc[j, c]
