"""Gradients with respect to the arrays of ``mod_args``: the programmable backward's own pass.

For a ``score_mod`` that reads learned arrays T (a relative-position bias
table, per-head slopes, a softcap), the loss L depends on T through every
modified score s'_e = score_mod(s_e, b, h, i, j, *T) the kernels evaluate:

    dL/dT[k] = sum_e dL/ds'_e * d score_mod_e / dT[k],
    dL/ds'_ij = P_ij (dP_ij - D_i)     (zero where the entry is masked)

with P = exp(s' - lse), dP = dO V^T and D_i = dO_i . O_i as in the backward of
``nbattn.kernels.flex``. nbattn cannot see which entries of T a numba function
reads, so the user supplies the chain rule as ``score_mod_args_grad(grad_score,
score, b, h, q_idx, kv_idx, *mod_args, *mod_args_grads)``, called once per
admissible entry (modified score above -inf) with grad_score = dL/ds'_ij
(float64) and score = s_ij, the unmodified scaled product (the value ``score_mod``
was given): it adds its terms into the float64 gradient arrays (``grads[0][h,
q_idx - kv_idx + off] += grad_score`` for a bias table).

Each work item is a record of ``FLEX_BACKWARD_ITEM`` (one key/value slice of
one sequence; its ``group`` is ignored: every key tile of the slice is run).
The items are dealt to ``n_slots`` slots, item n to slot n % n_slots, and each
slot is one unit of work that runs its items in table order into a private
set of gradient buffers (``grads[m][slot]``): the slots, summed in slot order
by the caller, give sums that do not depend on the threads. An entry that is
not a float array (int or bool arrays, numbers: a float number has no place to
learn in, pass a 0-d or 1-element array) has no gradient; the function still gets
an array in its place, of the entry's shape ((1,) for a number), every element of
which is one scratch value per slot (stride 0), where writes go unseen.

This file is a template, as ``nbattn.kernels.flex`` is: ``nbattn.kernels.flex_build``
copies it into a module of its own per (score_mod, mask_mod, score_mod_args_grad)
and binds the three there before anything compiles. It is built only when a
call asks for these gradients: the ordinary backward compiles none of it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from nbattn import config
from nbattn.kernels.blas import gemm
from nbattn.kernels.flash import _transpose_into, backward_rows
from nbattn.kernels.flex import keep_entry, real_score, tile_score
from nbattn.kernels.flex_shared import band_limits, block_state
from nbattn.kernels.items import next_item, run_items


@njit(fastmath=config.FASTMATH)
def score_mod(score, b, h, q_idx, kv_idx, *args):
    """The identity (no score modification)."""
    return score


@njit(fastmath=config.FASTMATH)
def mask_mod(b, h, q_idx, kv_idx, *args):
    """Every key admissible."""
    return True


@njit(fastmath=config.FASTMATH)
def score_mod_args_grad(grad_score, score, b, h, q_idx, kv_idx, *args):
    """Nothing to add (the template's default; a user's function is bound in its place)."""
    return None


def slot_views(grads, slot):
    """``(grads[0][slot], grads[1][slot], ...)``: a slot's gradient arrays (a 0-d one for a
    1-d buffer, the gradient of a 0-d ``mod_args`` array)."""
    return tuple(g[slot] if g.ndim > 1 else g[slot : slot + 1].reshape(()) for g in grads)


@overload(slot_views)
def _slot_views_overload(grads, slot):
    terms = "".join(
        f"grads[{n}][slot], " if g.ndim > 1 else f"grads[{n}][slot : slot + 1].reshape(()), "
        for n, g in enumerate(grads)
    )
    space: dict = {}
    exec(f"def views(grads, slot):\n    return ({terms})\n", space)  # noqa: S102 - fixed text
    return space["views"]


def returns_nothing(x):
    """Refuses (at compile time) a ``score_mod_args_grad`` that returns a value: it must
    add into its gradient arrays, and a returned gradient would be lost."""
    return x


@overload(returns_nothing, inline="always")
def _returns_nothing_overload(x):
    if isinstance(x, (types.NoneType, types.Omitted)) or x == types.none:
        return lambda x: None
    raise TypingError(
        f"score_mod_args_grad must add into its gradient arrays and return nothing; it returns {x}"
    )


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def check_args_grad(grad_score, score, score_args, grads):
    """``score_mod_args_grad`` as the kernel calls it: compiled (never run, it would write
    into ``grads``) before the kernel, so that a function of the wrong type, or one that
    returns a value, is refused before the kernel is typed."""
    index = np.int64(0)
    arguments = score_args + slot_views(grads, index)
    returns_nothing(score_mod_args_grad(grad_score, score, index, index, index, index, *arguments))


def flex_args_backward(
    q, k, v, out, lse, dout, kv_index, n_heads, blocks, items, tiles, score_args, mask_args, grads
):
    """Adds the gradients of ``score_args`` into the float64 slot buffers ``grads`` (one per
    ``score_args`` entry, shape (n_slots,) + the entry's shape); arguments as in
    ``nbattn.kernels.flex.flex_backward`` (q the user's q times the scale, lse (BH, L)
    float64 natural units, ``tiles`` the backward's)."""
    delta = backward_rows(out, dout, lse)[0]
    n_slots = grads[0].shape[0] if grads else 1
    run_items(
        _args_slots,
        q,
        k,
        v,
        dout,
        kv_index,
        n_heads,
        blocks,
        items,
        tiles,
        n_slots,
        score_args,
        mask_args,
        delta,
        lse,
        grads,
    )


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _args_slots(
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
    n_slots,
    score_args,
    mask_args,
    delta,
    lse,
    grads,
):
    """The slots of :func:`flex_args_backward`, one per increment of ``counter``."""
    while True:
        slot = next_item(counter)
        if slot >= n_slots:
            return
        arguments = score_args + slot_views(grads, slot)
        for item in range(slot, items.shape[0], n_slots):
            _args_item(
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
                lse,
                arguments,
            )


@njit(fastmath=config.FASTMATH, inline="always")
def _args_item(
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
    lse,
    arguments,
):
    """One item: ``score_mod_args_grad`` on every admissible entry of its key/value slice,
    key tile by key tile, query slice by query slice, row by row (a fixed order)."""
    block_q, block_k, _ = tiles
    n_bh, _, d = q.shape
    d_v = v.shape[2]
    dtype = q.dtype
    kv = item.kv
    q_row0, n_q, k_row0, n_k = item.q_row0, item.n_q, item.k_row0, item.n_k
    offset, left, right = item.offset, item.left, item.right
    band = (offset, left, right)
    n_kt = (n_k + block_k - 1) // block_k
    s_flat = np.empty(block_q * block_k, dtype=dtype)
    dp_flat = np.empty(block_q * block_k, dtype=dtype)
    kt_flat = np.empty(d * block_k, dtype=dtype)
    vt_flat = np.empty(d_v * block_k, dtype=dtype)
    for kt in range(n_kt):
        j0 = kt * block_k
        nb = min(block_k, n_k - j0)
        k_tile_t = _transpose_into(k[kv, k_row0 + j0 : k_row0 + j0 + nb], kt_flat)
        v_tile_t = _transpose_into(v[kv, k_row0 + j0 : k_row0 + j0 + nb], vt_flat)
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
                st = s_flat[: mb * nb].reshape((mb, nb))
                dpt = dp_flat[: mb * nb].reshape((mb, nb))
                gemm(q[bh, r0 : r0 + mb], k_tile_t, st, False, False, 0.0)
                gemm(dout[bh, r0 : r0 + mb], v_tile_t, dpt, False, False, 0.0)
                for r in range(mb):
                    shift = lse[bh, r0 + r]
                    if shift == -np.inf:  # a row without keys: no gradient
                        continue
                    i = i0 + r
                    di = np.float64(delta[bh, r0 + r])
                    lo, hi = band_limits(i, j0, nb, band)
                    for j in range(lo, hi):
                        kv_idx = j0 + j
                        if state == 1 and not keep_entry(mask_mod(b, h, i, kv_idx, *mask_args)):
                            continue
                        score = st[r, j]
                        # rounded to the tiles' dtype, as the forward stored it (lse is
                        # of that value: a float64 value of a float32 call is not)
                        value = np.float64(
                            tile_score(
                                real_score(score_mod(score, b, h, i, kv_idx, *score_args)), st
                            )
                        )
                        if value == -np.inf:
                            continue
                        p = np.exp(value - shift)
                        grad_score = p * (np.float64(dpt[r, j]) - di)
                        score_mod_args_grad(grad_score, score, b, h, i, kv_idx, *arguments)
