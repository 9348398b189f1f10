"""Programmable flash attention: the tile loops of ``nbattn.kernels.flash`` with a
user's score and mask functions compiled into them.

Each work item of the forward kernel is a record of
``nbattn._core.attn_groups.FLEX_FORWARD_ITEM``: rows of query slice ``bh``
against a range of keys of key/value slice ``kv``, with the b and h the user
functions see and the indices i (``q_idx``) and j (``kv_idx``) counted as the
caller chose (from 0 in a padded batch, from each sequence's start in a packed
one, the positions in the sequence when decoding). For those rows and keys it
computes

    s_ij   = score_mod(q_i . k_j, b, h, i, j, *score_args)   (q arrives times scale)
    s_ij   = -inf where not mask_mod(b, h, i, j, *mask_args) or j is outside the band
    out_i  = sum_j softmax_j(s_ij) v_j,     lse_i = log sum_j exp(s_ij)

(``score_mod`` runs on every entry inside the band of a visited tile,
masked or not), the scoring function of the attention chapter's "attention scoring functions"
section as user code, in FlexAttention's convention: ``score`` is the scaled
product, before the softmax; the mask comes after ``score_mod``. The online
softmax (running maximum, sum and accumulator, rebasing by powers of two) is
that of :func:`nbattn.kernels.flash.flash_forward`, in base 2: the modified
score is multiplied by log2(e) in the tile, once per element.

``blocks`` (BB, BH, QT, KT) uint8 classifies every (query tile, key tile) of
the kernel's tile sizes for batch entry b and head h (the item's ``qt``; key
tiles counted from its ``k_lo``) (BB in {1, B}, BH in
{1, H}; QT or KT of 1 broadcast): 0 = ``mask_mod`` is False on the whole tile
(never visited), 1 = partial (``mask_mod`` evaluated per element), 2 = True
on the whole tile (no per-element mask). :func:`block_states` makes the
table; a call without a block mask passes one entry, 1 (with a mask_mod)
or 2 (without).

The backward kernel is :func:`nbattn.kernels.flash.flash_backward`'s, with
the score's derivative g = d score_mod / d score in place of the softcap's:

    dS = P o (dP - D) o g,   dQ = scale dS K,   dK = dS^T (scale Q)

g comes from ``value_and_grad``: either the complex step,
score_mod(s + i h) = score_mod(s) + i h g(s) + O(h^2) with h = 2**-64 (exact
to rounding for a function analytic in ``score``: tanh softcaps, ALiBi,
bias tables), evaluated in complex128; or the user's ``score_grad``.

This file is a template. ``nbattn.kernels.flex_build`` copies its source into
a module of its own for each (score_mod, mask_mod, score_grad) and binds
``score_mod``, ``mask_mod``, ``score_grad`` and ``value_and_grad`` there
before anything compiles, so each copy's kernels have the user's functions
compiled in (numba resolves a global when it compiles) and numba's on-disk
cache works for them as for any module. The definitions below are the
defaults: no modification and no mask.

What is compiled per copy is kept small (each level of calls that is a
function of its own re-optimises, in LLVM, everything it calls: the item
bodies are inlined into their ``_*_items`` loop): the kernels are serial and
``nogil`` (``flex_forward``, ``flex_backward`` and ``block_states`` are Python
functions that run their ``_*_items`` kernel on the threads of
:func:`nbattn.kernels.items.run_items`: a ``prange`` would add a parallel
region to compile, whose module re-optimises the whole loop body), and the
backward's row terms and dQ sum are flash's compiled-once kernels
(``nbattn.kernels.flash.backward_rows``, ``sum_groups``), as are the functions that
do not call the user's (``nbattn.kernels.flex_shared``: ``block_state``,
``band_limits``, ``backward_shifts``) and the BLAS call (``nbattn.kernels.blas.gemm``).
``check_forward`` / ``check_backward`` compile the user's functions alone first, so
that one of the wrong type is refused before the kernels compile.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from nbattn import config
from nbattn._core.numeric import LOG2E
from nbattn.kernels.base2 import exp2
from nbattn.kernels.blas import gemm
from nbattn.kernels.fastmath import like
from nbattn.kernels.flash import (
    REBASE_EXACT_SUM,
    REBASE_SUM,
    _scale_row,
    _transpose_into,
    backward_rows,
    exp2_shift_sum,
    sum_groups,
)
from nbattn.kernels.flex_shared import backward_shifts, band_limits, block_state
from nbattn.kernels.items import next_item, run_items
from nbattn.kernels.softmax import row_max

#: The complex step h: score_mod(s + i h) = score_mod(s) + i h g(s) + O(h^2).
STEP = 2.0**-64
INV_STEP = 2.0**64


@njit(fastmath=config.FASTMATH)
def score_mod(score, b, h, q_idx, kv_idx, *args):
    """The identity (no score modification)."""
    return score


@njit(fastmath=config.FASTMATH)
def mask_mod(b, h, q_idx, kv_idx, *args):
    """Every key admissible."""
    return True


@njit(fastmath=config.FASTMATH)
def score_grad(score, b, h, q_idx, kv_idx, *args):
    """d score_mod / d score of the identity."""
    return 1.0


def real_score(x):
    """``x`` unchanged; refuses (at compile time) a score that is not a real number."""
    return x


@overload(real_score, inline="always")
def _real_score_overload(x):
    if isinstance(x, (types.Float, types.Integer)):
        return lambda x: x
    raise TypingError(f"score_mod must return a real number (a float), got {x}")


def complex_score(z):
    """``z`` unchanged; refuses a ``score_mod`` whose complex-step value is not complex."""
    return z


@overload(complex_score, inline="always")
def _complex_score_overload(z):
    if isinstance(z, types.Complex):
        return lambda z: z
    raise TypingError(
        f"score_mod is not differentiable by complex step: given a complex score it returns "
        f"{z}, not a complex number"
    )


def real_grad(x):
    """``x`` unchanged; refuses (at compile time) a derivative that is not a real number."""
    return x


@overload(real_grad, inline="always")
def _real_grad_overload(x):
    if isinstance(x, (types.Float, types.Integer)):
        return lambda x: x
    raise TypingError(f"score_mod_grad must return a real number (a float), got {x}")


def keep_entry(x):
    """``x`` unchanged; refuses a mask value that is not a bool."""
    return x


@overload(keep_entry, inline="always")
def _keep_entry_overload(x):
    if isinstance(x, types.Boolean):
        return lambda x: x
    raise TypingError(f"mask_mod must return a bool, got {x}")


@njit(fastmath=config.FASTMATH)
def _complex_step(score, b, h, q_idx, kv_idx, args):
    """(score_mod(score), d score_mod / d score) by the complex step."""
    z = complex_score(score_mod(complex(np.float64(score), STEP), b, h, q_idx, kv_idx, *args))
    return z.real, z.imag * INV_STEP


@njit(fastmath=config.FASTMATH)
def _user_grad(score, b, h, q_idx, kv_idx, args):
    """(score_mod(score), score_grad(score)), the derivative supplied by the user."""
    value = real_score(score_mod(score, b, h, q_idx, kv_idx, *args))
    return value, real_grad(score_grad(score, b, h, q_idx, kv_idx, *args))


value_and_grad = _complex_step


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def check_forward(score, score_args, mask_args):
    """``score_mod`` and ``mask_mod`` as the forward kernel calls them: compiled (never run)
    before the kernel, so that a function of the wrong type is refused in a fraction
    of a second rather than after the whole kernel is typed."""
    index = np.int64(0)
    value = real_score(score_mod(score, index, index, index, index, *score_args))
    return value, keep_entry(mask_mod(index, index, index, index, *mask_args))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def check_backward(score, score_args, mask_args, probes):
    """``value_and_grad`` and ``mask_mod`` as the backward kernel calls them: the complex
    step refuses, as it compiles, a ``score_mod`` whose complex-step value is not complex.

    Run (unlike ``check_forward``) at the scores ``probes`` (b = h = q_idx = kv_idx
    = 0): rows (derivative from ``value_and_grad``, central finite difference of
    ``score_mod`` with step 1e-5 max(1, |s|), |score_mod| at the two points), from which
    ``nbattn.kernels.flex_build`` refuses a complex step that is not the derivative
    (``abs``, ``max`` or a comparison inside an expression that stays complex).
    """
    index = np.int64(0)
    value_and_grad(score, index, index, index, index, score_args)
    keep_entry(mask_mod(index, index, index, index, *mask_args))
    result = np.empty((probes.shape[0], 3))
    for n in range(probes.shape[0]):
        s = probes[n]
        step = 1e-5 * max(1.0, abs(s))
        grad = value_and_grad(s, index, index, index, index, score_args)[1]
        up = np.float64(real_score(score_mod(s + step, index, index, index, index, *score_args)))
        down = np.float64(real_score(score_mod(s - step, index, index, index, index, *score_args)))
        result[n, 0] = grad
        result[n, 1] = (up - down) / (2.0 * step)
        result[n, 2] = abs(up) + abs(down)
    return result


#: The largest score whose base-2 form (times log2(e)) is finite, per tile dtype.
LIMIT64 = float(np.finfo(np.float64).max) / LOG2E
LIMIT32 = float(np.finfo(np.float32).max) / LOG2E


def score_limit(array):
    """The largest score of ``array``'s dtype that stays finite times log2(e)."""
    return LIMIT32 if array.dtype == np.float32 else LIMIT64


@overload(score_limit, inline="always")
def _score_limit_overload(array):
    if array.dtype == types.float32:
        return lambda array: np.float32(LIMIT32)
    return lambda array: np.float64(LIMIT64)


#: The largest float32: a finite float64 score beyond it is stored as it (sign kept).
MAX32 = float(np.finfo(np.float32).max)


def tile_score(x, tile):
    """``x`` as stored in ``tile``: unchanged, but for a float32 tile a finite ``x`` beyond
    the float32 range becomes the largest float32 of its sign (rounding would make it
    inf, a NaN row; or -inf, a masked entry), so that :func:`_to_base2` refuses it as
    the overflow it is. NaN and infinities stay what they are."""
    return x


@overload(tile_score, inline="always")
def _tile_score_overload(x, tile):
    if tile.dtype == types.float32 and isinstance(x, types.Float) and x.bitwidth == 64:

        def clamp(x, tile):
            if abs(x) > MAX32 and abs(x) < np.inf:
                return np.float32(MAX32) if x > 0 else np.float32(-MAX32)
            return np.float32(x)

        return clamp
    return lambda x, tile: x


@njit(fastmath=config.FASTMATH, inline="always")
def _to_base2(band_row, limit, log2e, neg, poison, r, status):
    """The modified, masked scores of one row turned to base 2, in place.

    A NaN or +inf score (an admissible one: masked entries are -inf already)
    makes the row NaN (``poison[r]``, as torch propagates it); a finite score
    beyond ``limit``, whose base-2 form would overflow, is recorded in
    ``status[0]`` (the forward then raises). Both are rare: one read-only pass
    checks the row, and only a row that fails it is converted entry by entry.
    """
    odd = False
    for j in range(band_row.shape[0]):
        x = band_row[j]
        odd |= (x != x) | ((abs(x) > limit) & (x != neg))
    if not odd:
        for j in range(band_row.shape[0]):
            band_row[j] *= log2e
        return
    for j in range(band_row.shape[0]):
        x = band_row[j]
        if x != x or x > limit and x == -neg:
            poison[r] = True
            band_row[j] = neg
        elif x != neg and abs(x) > limit:
            status[0] = max(status[0], abs(np.float64(x)))
            band_row[j] = neg
        else:
            band_row[j] = x * log2e


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _mod_tile(st, b, h, i0, j0, band, masked, score_args, mask_args, poison, status):
    """The score tile ``st`` (rows i0.., keys j0.., natural units) modified, masked and
    turned to base 2, in place (``poison`` and ``status`` as in :func:`_to_base2`).

    ``score_mod`` runs on every entry inside the band, masked or not (as in
    FlexAttention, where the mask applies to the modified scores), in a loop of
    its own: the scores of a tile are then the same whether or not its mask is
    evaluated (a block mask's open tiles give bit-identical results).
    """
    mb, nb = st.shape
    log2e = like(LOG2E, st)
    neg = like(-np.inf, st)
    limit = score_limit(st)
    for r in range(mb):
        i = i0 + r
        row = st[r]
        lo, hi = band_limits(i, j0, nb, band)
        for j in range(lo):
            row[j] = neg
        band_row = row[lo:hi]  # indices from 0: no negative-index check, the loop vectorises
        k0 = j0 + lo
        for j in range(band_row.shape[0]):
            value = real_score(score_mod(band_row[j], b, h, i, k0 + j, *score_args))
            band_row[j] = tile_score(value, band_row)
        for j in range(hi, nb):
            row[j] = neg
        if masked:
            for j in range(band_row.shape[0]):
                if not keep_entry(mask_mod(b, h, i, k0 + j, *mask_args)):
                    band_row[j] = neg
        _to_base2(band_row, limit, log2e, neg, poison, r, status)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _mod_tile_grad(st, gt, b, h, i0, j0, band, masked, score_args, mask_args):
    """:func:`_mod_tile` that also writes d score_mod / d score into ``gt`` (0 where masked)."""
    mb, nb = st.shape
    log2e = like(LOG2E, st)
    neg = like(-np.inf, st)
    zero = like(0.0, st)
    for r in range(mb):
        i = i0 + r
        row = st[r]
        g_row = gt[r]
        lo, hi = band_limits(i, j0, nb, band)
        for j in range(lo):
            row[j] = neg
            g_row[j] = zero
        band_row = row[lo:hi]
        band_g = g_row[lo:hi]
        k0 = j0 + lo
        for j in range(band_row.shape[0]):
            value, grad = value_and_grad(band_row[j], b, h, i, k0 + j, score_args)
            # the forward's base-2 score: stored in the tile's dtype, then times log2e
            band_row[j] = like(tile_score(value, band_row), band_row) * log2e
            band_g[j] = grad
        for j in range(hi, nb):
            row[j] = neg
            g_row[j] = zero
        if masked:
            for j in range(band_row.shape[0]):
                if not keep_entry(mask_mod(b, h, i, k0 + j, *mask_args)):
                    band_row[j] = neg
                    band_g[j] = zero


def block_states(n_b, n_h, n_q, n_k, block_q, block_k, mask_args):
    """uint8 (n_b, n_h, QT, KT): 0 where ``mask_mod`` is False on a whole tile, 2 where it
    is True on a whole tile, 1 elsewhere (QT = ceil(n_q / block_q), KT likewise)."""
    n_qt = (n_q + block_q - 1) // block_q
    n_kt = (n_k + block_k - 1) // block_k
    out = np.zeros((n_b, n_h, n_qt, n_kt), dtype=np.uint8)
    run_items(_block_rows, n_q, n_k, block_q, block_k, mask_args, out)
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _block_rows(counter, n_q, n_k, block_q, block_k, mask_args, out):
    """The rows ``out[b, h, qt]`` of :func:`block_states`, one per item of ``counter``."""
    n_b, n_h, n_qt, n_kt = out.shape
    while True:
        item = next_item(counter)
        if item >= n_b * n_h * n_qt:
            return
        qt = item % n_qt
        h = (item // n_qt) % n_h
        b = item // (n_qt * n_h)
        i_end = min(n_q, (qt + 1) * block_q)
        for kt in range(n_kt):
            j_end = min(n_k, (kt + 1) * block_k)
            n_true = 0
            for i in range(qt * block_q, i_end):
                for j in range(kt * block_k, j_end):
                    if keep_entry(mask_mod(b, h, i, j, *mask_args)):
                        n_true += 1
            if n_true == (i_end - qt * block_q) * (j_end - kt * block_k):
                out[b, h, qt, kt] = 2
            elif n_true > 0:
                out[b, h, qt, kt] = 1


def flex_forward(q, k, v, blocks, items, tiles, score_args, mask_args, n_out):
    """Blocked attention forward with the module's score and mask functions; returns
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
    run_items(
        _forward_items, q, k, v, blocks, items, tiles, score_args, mask_args, out, lse, status
    )
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
def _forward_items(counter, q, k, v, blocks, items, tiles, score_args, mask_args, out, lse, status):
    """The items of :func:`flex_forward`, one per increment of ``counter``."""
    while True:
        item = next_item(counter)
        if item >= items.shape[0]:
            return
        _forward_item(q, k, v, blocks, items[item], tiles, score_args, mask_args, out, lse, status)


@njit(fastmath=config.FASTMATH, inline="always")
def _forward_item(q, k, v, blocks, item, tiles, score_args, mask_args, out, lse, status):
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
        _mod_tile(st, b, h, i0, j0, band, masked, score_args, mask_args, poison, status)
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
                _mod_tile(
                    one,
                    b,
                    h,
                    i0 + r,
                    j0,
                    band,
                    masked,
                    score_args,
                    mask_args,
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
    q, k, v, out, lse, dout, kv_index, n_heads, blocks, items, scale, tiles, score_args, mask_args
):
    """Blocked attention backward with the module's score and mask functions; returns
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
    run_items(
        _backward_items,
        q,
        k,
        v,
        dout,
        kv_index,
        n_heads,
        blocks,
        items,
        tiles,
        score_args,
        mask_args,
        delta,
        shifts,
        dq_part,
        dk,
        dv,
    )
    return sum_groups(dq_part, scale), dk, dv


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _backward_items(
    counter,
    q,
    k,
    v,
    dout,
    kv_index,
    n_heads,
    blocks,
    items,
    tiles,
    score_args,
    mask_args,
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
            q,
            k,
            v,
            dout,
            kv_index,
            n_heads,
            blocks,
            items[item],
            tiles,
            score_args,
            mask_args,
            delta,
            shifts,
            dq_part,
            dk,
            dv,
        )


@njit(fastmath=config.FASTMATH, inline="always")
def _backward_item(
    q,
    k,
    v,
    dout,
    kv_index,
    n_heads,
    blocks,
    item,
    tiles,
    score_args,
    mask_args,
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
                _mod_tile_grad(st, gt, b, h, i0, j0, band, state == 1, score_args, mask_args)
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
