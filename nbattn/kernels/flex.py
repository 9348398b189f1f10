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

This file is a template. ``nbattn.kernels.flex_build`` copies its source into a module
of its own for each (score_mod, mask_mod, score_grad) and types of ``mod_args``, and
binds ``score_mod``, ``mask_mod``, ``score_grad``, ``value_and_grad`` and ``ARGS``
there before anything compiles, so each copy's kernels have the user's functions
compiled in (numba resolves a global when it compiles) and numba's on-disk cache works
for them as for any module. The definitions below are the defaults: no modification
and no mask.

What is compiled per copy is kept small: the tile functions that call the user's
(:func:`_mod_tile`, :func:`_mod_tile_grad`), the block table's loop
(:func:`block_states`) and the checks. The forward's and backward's tile loops are
``nbattn.kernels.flex_loops``'s, compiled once per dtype and cached there:
:func:`flex_forward` and :func:`flex_backward` pass them this module's tile function
as a first-class function, and ``mod_args`` as the address of their values, which the
tile functions read back as :data:`ARGS`, the types this copy is made for
(``flex_build`` makes a copy per functions and types of ``mod_args``). The functions
that do not call the user's are ``nbattn.kernels.flex_shared``'s (``block_state``,
``band_limits``, ``backward_shifts``). ``check_forward`` / ``check_backward`` compile
the user's functions alone first, so that one of the wrong type is refused before the
tile functions compile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from nbattn import config
from nbattn._core.numeric import LOG2E
from nbattn.kernels import flex_loops as loops
from nbattn.kernels.fastmath import like
from nbattn.kernels.flex_shared import LIMIT32, LIMIT64, MAX32, band_limits, load_args
from nbattn.kernels.items import next_item, run_items

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


def score_limit(array):
    """The largest score of ``array``'s dtype that stays finite times log2(e)."""
    return LIMIT32 if array.dtype == np.float32 else LIMIT64


@overload(score_limit, inline="always")
def _score_limit_overload(array):
    if array.dtype == types.float32:
        return lambda array: np.float32(LIMIT32)
    return lambda array: np.float64(LIMIT64)


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


#: The numba type of ``(score_args, mask_args)`` that this copy's tile functions read from
#: the address the loops pass them (``nbattn.kernels.flex_shared.held_args``): bound with
#: the user's functions (a copy is made per functions and types of ``mod_args``).
ARGS = types.Tuple((types.Tuple(()), types.Tuple(())))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _mod_tile(st, b, h, i0, j0, band, masked, address, poison, status):
    """The score tile ``st`` (rows i0.., keys j0.., natural units) modified, masked and
    turned to base 2, in place (``poison`` and ``status`` as in :func:`_to_base2`);
    ``score_args`` and ``mask_args`` (of types :data:`ARGS`) are read at ``address``.

    ``score_mod`` runs on every entry inside the band, masked or not (as in
    FlexAttention, where the mask applies to the modified scores), in a loop of
    its own: the scores of a tile are then the same whether or not its mask is
    evaluated (a block mask's open tiles give bit-identical results).
    """
    score_args, mask_args = load_args(address, ARGS)
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
def _mod_tile_grad(st, gt, b, h, i0, j0, band, masked, address):
    """:func:`_mod_tile` that also writes d score_mod / d score into ``gt`` (0 where masked)."""
    score_args, mask_args = load_args(address, ARGS)
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
    """``nbattn.kernels.flex_loops.flex_forward`` with this module's :func:`_mod_tile` as its
    tile function, the arguments after that as there: ``(out, lse)`` (mod_args of other
    types than :data:`ARGS` are a TypeError there)."""
    return loops.flex_forward(
        _mod_tile, q, k, v, blocks, items, tiles, score_args, mask_args, n_out
    )


def flex_backward(*args):
    """``nbattn.kernels.flex_loops.flex_backward`` with this module's :func:`_mod_tile_grad`
    as its tile function, ``args`` its arguments after that: ``(dq, dk, dv)``."""
    return loops.flex_backward(_mod_tile_grad, *args)
