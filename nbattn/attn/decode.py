"""Decoding with a key/value cache: :func:`flash_decode` and :class:`KVCache`.

Autoregressive generation attends each new token to every token before it.
The keys and values of the past are kept in a preallocated cache, laid out
as torch's ``scaled_dot_product_attention`` lays out keys, heads before the
sequence:

    k_cache (B, H_kv, S_max, E),   v_cache (B, H_kv, S_max, Ev)

with ``cache_seqlens[b]`` valid positions in batch row b (rows may differ).
A decoding step appends the new keys and values at each row's length and
attends the new queries over the first ``cache_seqlens[b] + L_new`` keys,
causal aligned at the bottom right (the last query is the last key), as
FlashAttention's ``flash_attn_with_kvcache`` does. The keys are split across
threads (split-KV, ``nbattn.kernels.decode``) and the chunk results merged
with the one log-sum-exp merge (``nbattn.kernels.softmax.merge_states``), so
one query over a long cache uses every core.

With ``score_mod`` / ``mask_mod`` (programmable attention, as in
:func:`nbattn.flash_attention`) a query's ``q_idx`` is its position in its
sequence and ``kv_idx`` the cache position, so a step gives the last rows of
:func:`nbattn.flash_attention` with the same functions over the whole
sequence. The flex kernels then run over (query head, query tile, chunk of
keys) items of the same item table as a padded batch, and the chunks are
merged as above.

:func:`flash_decode` is the functional form (it writes into the caches you
pass and leaves ``cache_seqlens`` to you); :class:`KVCache` owns the arrays
and the lengths, grows when full, and is what
:meth:`nbattn.MultiHeadAttention.forward` takes as ``cache=``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import config
from .._core.attn_groups import FLEX_FORWARD_ITEM, DecodeWindow, KeySplit
from .._core.threads import blas_one_thread, serial_below
from .._core.validation import (
    as_float_array,
    check_bool,
    check_dtype,
    check_positive_int,
    check_scale,
    resolve_dtype,
)
from ..dispatch.device import device_for, kernels_for
from ..dispatch.transfer import multiprocessors, to_host
from .flash_args import (
    FLASH_WEIGHT_BOUND,
    band,
    check_keywords,
    decode_window,
    flash_tiles,
    scales_for,
)
from .flex import check_mods, check_on_cpu, item_table, run_forward, uses_flex
from .lengths import as_lengths

__all__ = ["KVCache", "flash_decode"]


# --------------------------------------------------------------------------- checks
def _check_cache(cache, name, dtype):
    """A cache must be a writable, C-contiguous 4-D NumPy array of the computation dtype."""
    if not isinstance(cache, np.ndarray):
        raise ValueError(
            f"{name} must be a NumPy array (it is written in place), got {type(cache).__name__}"
        )
    if cache.ndim != 4:
        raise ValueError(f"{name} must be 4-D (B, H_kv, S_max, E), got shape {cache.shape}")
    if cache.dtype != np.dtype(dtype):
        raise ValueError(
            f"{name} has dtype {cache.dtype}, but q (with k_new, v_new) computes in "
            f"{np.dtype(dtype).name}; give them one dtype"
        )
    if not cache.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if not cache.flags.writeable:
        raise ValueError(f"{name} must be writable (new keys and values are appended in place)")
    return cache


def _check_new(k_new, v_new, dtype, shape_k, shape_v):
    """k_new (B, H_kv, n, E) and v_new (B, H_kv, n, Ev), both or neither; returns them and n."""
    if (k_new is None) != (v_new is None):
        raise ValueError("give both k_new and v_new, or neither")
    if k_new is None:
        return None, None, 0
    k_new = as_float_array(k_new, "k_new", ndim=(4,), dtype=dtype, allow_bool=False)
    v_new = as_float_array(v_new, "v_new", ndim=(4,), dtype=dtype, allow_bool=False)
    n_new = k_new.shape[2]
    for name, arr, want in (("k_new", k_new, shape_k), ("v_new", v_new, shape_v)):
        expected = (want[0], want[1], n_new, want[3])
        if arr.shape != expected:
            raise ValueError(
                f"{name} must have shape (B, H_kv, n_new, E) = {expected}, got {arr.shape}"
            )
    return k_new, v_new, n_new


def _check_heads(n_heads, n_kv_heads, enable_gqa):
    """The kv heads divide the query heads under ``enable_gqa``, else they are as many."""
    if enable_gqa:
        if n_heads % n_kv_heads:
            raise ValueError(
                f"enable_gqa: the kv heads ({n_kv_heads}) must divide the query heads ({n_heads})"
            )
    elif n_heads != n_kv_heads:
        raise ValueError(
            f"q has {n_heads} heads but the caches have {n_kv_heads}; pass enable_gqa=True for "
            "grouped-query attention"
        )


# --------------------------------------------------------------------------- the split
def _key_ranges(totals, n_q, admits: DecodeWindow):
    """Per batch row, the keys [start, end) that some query admits (bottom-right positions)."""
    causal, left, right = admits
    first = totals - n_q  # position of query 0; the last query sits at totals - 1
    last = totals - 1
    starts = np.zeros_like(totals) if left < 0 else np.maximum(first - left, 0)
    ends = totals.copy()
    if causal:
        ends = np.minimum(ends, last + 1)
    if right >= 0:
        ends = np.minimum(ends, last + right + 1)
    ends = np.maximum(np.minimum(ends, totals), 0)
    starts = np.minimum(starts, ends)
    return starts, ends


def _n_splits(n_items, longest, threads):
    """Chunks per batch row: enough work items for every thread, chunks of a useful size."""
    if longest <= 0:
        return 1
    want = -(-threads * config.DECODE_ITEMS_PER_THREAD // n_items)
    useful = -(-longest // config.DECODE_MIN_SPLIT_KEYS)
    return max(1, min(want, useful))


def _workers(device, numba):
    """What the chunks are dealt to: numba's threads, or on the GPU its multiprocessors."""
    if device == "cpu":
        return numba.get_num_threads()
    return multiprocessors()


def _merge_chunks(part_out, part_lse):
    """Merge the chunk states (n_splits, rows, Ev) pairwise with the one LSE merge."""
    merge_states = kernels_for("softmax", "cpu").merge_states
    outs, lses = part_out, part_lse
    while outs.shape[0] > 1:
        half = outs.shape[0] // 2
        rows, d_v = outs.shape[1], outs.shape[2]
        out, lse = merge_states(
            outs[:half].reshape(half * rows, d_v),
            lses[:half].reshape(half * rows),
            outs[half : 2 * half].reshape(half * rows, d_v),
            lses[half : 2 * half].reshape(half * rows),
        )
        out = out.reshape(half, rows, d_v)
        lse = lse.reshape(half, rows)
        if outs.shape[0] % 2:
            out = np.concatenate([out, outs[-1:]])
            lse = np.concatenate([lse, lses[-1:]])
        outs, lses = out, lse
    return outs[0], lses[0]


# --------------------------------------------------------------------------- programmable
def _flex_step(q, k_cache, v_read, key_range, kw, scale, mods, dtype):
    """``(out, lse)`` of a step with score_mod / mask_mod, rows (b, h, i) as the split-KV
    kernel's: the flex kernels over (query slice, query tile, chunk of keys) items, with
    q_idx = totals[b] - L + i (the query's position) and kv_idx the cache position, so
    that the band is the top-left one of positions; the chunk states merged as above.
    A chunk state that is NaN (score_mod's NaN or +inf) makes its row NaN."""
    import numba

    totals, starts, ends = key_range
    n_b, n_h, n_q, d = q.shape
    n_hkv, s_max, d_v = k_cache.shape[1], k_cache.shape[2], v_read.shape[3]
    n_bh = n_b * n_h
    qf = (q * dtype(scale)).reshape(n_bh, n_q, d)
    kf = k_cache.reshape(n_b * n_hkv, s_max, d)
    vf = v_read.reshape(n_b * n_hkv, s_max, d_v)
    offset, left, right = positions = band(replace(kw, causal_alignment="top_left"), s_max, s_max)
    spans = ends - starts
    longest = int(spans.max())
    tiles = flash_tiles(longest, positions, backward=False)
    n_qt = -(-n_q // tiles.block_q)
    work = n_bh * n_q * longest * (d + d_v)
    with blas_one_thread(), serial_below(work, config.FLASH_SERIAL_WORK):
        n_splits = _n_splits(n_bh * n_qt, longest, numba.get_num_threads())
        chunks = np.maximum(-(-spans // n_splits), 1)
        grid = np.meshgrid(np.arange(n_bh), np.arange(n_qt), np.arange(n_splits), indexing="ij")
        bh, qt, split = (axis.ravel() for axis in grid)
        b = bh // n_h
        k_lo = starts[b] + split * chunks[b]
        k_hi = np.minimum(ends[b], k_lo + chunks[b])
        busy = k_hi > k_lo
        bh, qt, split, b, k_lo, k_hi = (a[busy] for a in (bh, qt, split, b, k_lo, k_hi))
        row0 = qt * tiles.block_q
        table = item_table(
            FLEX_FORWARD_ITEM,
            bh=bh,
            kv=b * n_hkv + (bh % n_h) // (n_h // n_hkv),
            out=split * n_bh + bh,
            b=b,
            h=bh % n_h,
            qt=qt,
            i0=totals[b] - n_q + row0,
            row0=row0,
            rows=np.minimum(tiles.block_q, n_q - row0),
            k_row0=0,
            k_lo=k_lo,
            k_hi=k_hi,
            offset=offset,
            left=left,
            right=right,
        )
        part_out, part_lse = run_forward(qf, kf, vf, table, n_splits * n_bh, tiles, mods, dtype)
    part_out = part_out.reshape(n_splits, n_bh * n_q, d_v).astype(np.float64)
    part_lse = part_lse.reshape(n_splits, n_bh * n_q)
    poisoned = np.isnan(part_lse).any(axis=0)
    out, lse = _merge_chunks(part_out, np.where(np.isnan(part_lse), -np.inf, part_lse))
    out[poisoned] = np.nan
    lse[poisoned] = np.nan
    return out, lse


def _check_query_positions(mods, kw, totals, n_q):
    """A query before its sequence's first position (possible when L exceeds
    cache_seqlens + n_new) has no q_idx: refused unless causal, which gives it no key."""
    if mods is None or kw.causal:
        return
    short = np.flatnonzero((totals > 0) & (totals < n_q))
    if short.size:
        b = int(short[0])
        raise ValueError(
            f"score_mod and mask_mod with causal=False need at least L = {n_q} keys in every "
            f"batch row that has keys: batch row {b} has {totals[b]} (cache_seqlens + n_new), "
            "so its first queries would come before the sequence's first position"
        )


# --------------------------------------------------------------------------- functional
def flash_decode(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    k_new=None,
    v_new=None,
    causal=True,
    scale=None,
    return_lse=False,
    window=None,
    softcap=None,
    enable_gqa=False,
    device="cpu",
    *,
    score_mod=None,
    mask_mod=None,
    block_mask=None,
    mod_args=(),
):
    """One decoding step: append new keys/values to the caches in place, then attend.

    For batch row b with n_b = ``cache_seqlens[b]`` cached keys and n_new new
    ones, the keys are the cache rows 0 .. T_b - 1, T_b = n_b + n_new, and
    query i (of L) sits at position p = T_b - L + i (bottom-right alignment):

        s_ij  = scale * q_i . k_j                 (softcap c: c tanh(s_ij / c))
        out_i = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

    over the keys j <= p (``causal``) and p - left <= j <= p + right
    (``window``). A query with no admissible key (an empty row, or a query
    before the first key) gets zeros and lse = -inf.

    With ``score_mod`` / ``mask_mod`` (programmable attention, as in
    :func:`nbattn.flash_attention`) the indices they see are positions in the
    sequence: q_idx = p, the position the query has in a full causal forward,
    and kv_idx = j, the cache position::

        s_ij = score_mod(scale * q_i . k_j, b, h, p, j, *mod_args)
        s_ij = -inf  where not mask_mod(b, h, p, j, *mod_args)

    (b the batch row, h the query head), so the step equals the last L rows of
    ``flash_attention(q_full, k[:T_b], v[:T_b], causal=causal,
    causal_alignment="bottom_right", score_mod=..., mask_mod=...)`` over the
    whole sequence.

    Parameters
    ----------
    q : array_like (B, H, L, E)
        The new queries (often L = 1). Not modified.
    k_cache, v_cache : ndarray (B, H_kv, S_max, E), (B, H_kv, S_max, Ev)
        Writable, C-contiguous NumPy arrays of the computation dtype (float32
        when q, k_new and v_new are all float32, else float64). Rows
        ``n_b .. n_b + n_new - 1`` of batch row b are overwritten with
        ``k_new[b]`` / ``v_new[b]``; nothing else is written. The live
        rows (positions below ``cache_seqlens[b]``) must be finite: NaN or
        inf there is a ValueError naming the batch row, kv head and
        position, raised before anything is written (one parallel read of
        the live rows; rows beyond ``cache_seqlens`` are never read). Values
        near the top of the range are exact (the step then reads a copy of
        ``v_cache`` divided by a power of two per head).
    cache_seqlens : int array (B,)
        Valid cache positions per batch row before this step. Not modified:
        add n_new yourself after the call (:class:`KVCache` does).
    k_new, v_new : array_like (B, H_kv, n_new, E), (B, H_kv, n_new, Ev), optional
        Keys and values of the new tokens. A ValueError names the batch row
        whose cache would overflow S_max, before anything is written.
    causal : bool, default True
        Bottom-right causal; False lets every query see all T_b keys.
    scale : float, optional
        Default 1 / sqrt(E).
    return_lse : bool
        Also return lse (B, H, L), float64.
    window : (left, right), optional
        Sliding window, each side an int >= 0 or None (unbounded); with
        ``causal`` the right side is 0 in effect. Only the keys of the window
        are read.
    softcap : float, optional
        c > 0: scores become c tanh(s / c) (Gemma-2 style).
    enable_gqa : bool
        Grouped-query attention: H_kv divides H and query head h reads kv
        head h // (H / H_kv), as torch's ``enable_gqa``. Without it, H_kv = H.
    device : "cpu", "cuda" or "auto"
        Where the split-KV kernel runs (``kernels_for("decode", device)``;
        "auto" picks a CUDA GPU when numba sees one). The caches are host
        arrays, written in place, and the results come back to the host on
        either device.
    score_mod : function ``score_mod(score, b, h, q_idx, kv_idx, *mod_args) -> float``, optional
        As in :func:`nbattn.flash_attention`, with q_idx the query's position
        and kv_idx the cache position (above). It runs on the keys inside the
        causal band and window only, so an array indexed by position needs
        ``S_max`` entries. With ``causal=False`` every batch row that has keys
        needs at least L of them (a query placed before the sequence's start
        has no position). CPU only; not with ``softcap`` (express it in
        ``score_mod``).
    mask_mod : function ``mask_mod(b, h, q_idx, kv_idx, *mod_args) -> bool``, optional
        True where the query at position q_idx may attend to cache position
        kv_idx, applied after ``score_mod``.
    block_mask : None
        Refused: a block mask classifies tiles of a (B, H, L, S) rectangle from
        position 0, while a step's queries sit at each row's own end of the
        cache. Pass ``mask_mod``; ``causal`` and ``window`` already limit the
        keys read.
    mod_args : tuple of arrays and numbers
        The trailing arguments of ``score_mod`` and ``mask_mod``.

    Returns
    -------
    out : ndarray (B, H, L, Ev), or ``(out, lse)``.
    """
    kw = check_keywords(causal, enable_gqa, window, "bottom_right", softcap, 0.0)
    enable_gqa = kw.enable_gqa
    return_lse = check_bool(return_lse, "return_lse")
    mods = None
    if uses_flex(score_mod, mask_mod, block_mask, mod_args=mod_args):
        mods = check_mods(score_mod, mask_mod, block_mask, mod_args, None, kw, None, "flash_decode")
        check_on_cpu(device, q, k_cache, v_cache, k_new, v_new)
        device = "cpu"
    else:
        device = device_for(device, q, k_cache, v_cache, k_new, v_new)
    dtype = resolve_dtype(None, q, k_new, v_new)
    q = as_float_array(q, "q", ndim=(4,), dtype=dtype, allow_bool=False)
    n_b, n_h, n_q, d = q.shape
    k_cache = _check_cache(k_cache, "k_cache", dtype)
    v_cache = _check_cache(v_cache, "v_cache", dtype)
    if k_cache.shape[0] != n_b or k_cache.shape[3] != d:
        raise ValueError(
            f"k_cache must have shape (B, H_kv, S_max, E) with B={n_b}, E={d} (from q), "
            f"got {k_cache.shape}"
        )
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(
            f"v_cache must have shape (B, H_kv, S_max, Ev) = {k_cache.shape[:3] + ('Ev',)}, "
            f"got {v_cache.shape}"
        )
    _check_heads(n_h, k_cache.shape[1], enable_gqa)
    s_max = k_cache.shape[2]
    lengths = as_lengths(cache_seqlens, "cache_seqlens", n_b)
    k_new, v_new, n_new = _check_new(k_new, v_new, dtype, k_cache.shape, v_cache.shape)
    full = np.flatnonzero(lengths + n_new > s_max)
    if full.size:
        b = int(full[0])
        raise ValueError(
            f"cache overflow in batch row {b}: cache_seqlens[{b}] = {lengths[b]} plus "
            f"{n_new} new tokens exceeds the cache length S_max = {s_max}"
        )
    _check_query_positions(mods, kw, lengths + n_new, n_q)
    scale = check_scale(scale, d)
    admits = decode_window(kw)
    softcap = 0.0 if kw.softcap is None else kw.softcap
    top = _check_live(k_cache, v_cache, lengths)
    if n_new:
        np.maximum(top, np.abs(v_new).max(axis=(2, 3), initial=0.0), out=top)
        for b in range(n_b):
            k_cache[b, :, lengths[b] : lengths[b] + n_new] = k_new[b]
            v_cache[b, :, lengths[b] : lengths[b] + n_new] = v_new[b]
    totals = lengths + n_new
    starts, ends = _key_ranges(totals, n_q, admits)
    spans = ends - starts
    longest = int(spans.max())
    # values near the top of the range: the kernel's sum_j p_j v_j (weights <= 1; the flex
    # kernels' up to FLASH_WEIGHT_BOUND) before normalising would overflow; such a step
    # reads a copy of v divided by a power of two per (batch row, kv head) and multiplies
    # the output back (exact)
    scales = scales_for(top, dtype, longest, 2.0 if mods is None else FLASH_WEIGHT_BOUND)
    v_read = v_cache
    if scales is not None:
        v_read = v_cache / scales.astype(dtype)[:, :, None, None]
    key_range = (totals, starts, ends)
    if mods is not None:
        out, lse = _flex_step(q, k_cache, v_read, key_range, kw, scale, mods, dtype)
    else:
        window = (admits, scale, softcap)
        out, lse = _split_kv_step(q, k_cache, v_read, key_range, window, device)
    out = out.reshape(n_b, n_h, n_q, -1)
    lse = lse.reshape(n_b, n_h, n_q)
    if scales is not None:
        heads = np.arange(n_h) // (n_h // k_cache.shape[1])
        out *= scales[:, heads, None, None]
    if mods is None:
        _check_finite_result(out, lse, totals)
    else:
        _refuse_overflowing_scores(q, k_cache, totals, scale, lse)
    out = out.astype(dtype, copy=False)
    return (out, lse) if return_lse else out


def _split_kv_step(q, k_cache, v_read, key_range, window, device):
    """``(out, lse)`` of a plain step, rows (b, h, i): the split-KV kernel, chunks merged."""
    import numba

    totals, starts, ends = key_range
    admits, scale, softcap = window
    n_b, n_h, n_q, d = q.shape
    spans = ends - starts
    longest = int(spans.max())
    work = n_b * n_h * n_q * longest * (d + v_read.shape[3])
    with serial_below(work, config.FLASH_SERIAL_WORK):
        n_splits = _n_splits(n_b * k_cache.shape[1], longest, _workers(device, numba))
        chunks = np.maximum(-(-spans // n_splits), 1)
        keys = KeySplit(totals, starts, chunks, ends, n_splits)
        part_out, part_lse = kernels_for("decode", device).decode_partials(
            q, k_cache, v_read, keys, admits, scale, softcap, config.DECODE_BLOCK_K
        )
        part_out, part_lse = to_host(part_out, part_lse)
        return _merge_chunks(part_out, part_lse)


def _check_live(k_cache, v_cache, lengths):
    """Refuse NaN or inf in the live cache rows (j < ``lengths[b]``), naming the batch
    row, kv head and position; return max |v| per (batch row, kv head), float64.

    One parallel read of the live rows as unsigned bits
    (``nbattn.kernels.decode.live_magnitudes``), no copy; the position of a bad
    entry is looked up only when there is one.
    """
    bits = np.dtype(f"u{k_cache.dtype.itemsize}")
    k_top, v_top = kernels_for("decode", "cpu").live_magnitudes(
        k_cache.view(bits), v_cache.view(bits), lengths
    )
    inf_bits = np.array(np.inf, dtype=k_cache.dtype).view(bits)
    hits = np.argwhere((k_top >= inf_bits) | (v_top >= inf_bits))
    if hits.size:
        b, h = (int(x) for x in hits[0])
        live = slice(0, int(lengths[b]))
        finite_rows = np.isfinite(k_cache[b, h, live]).all(axis=1)
        finite_rows &= np.isfinite(v_cache[b, h, live]).all(axis=1)
        j = int(np.flatnonzero(~finite_rows)[0])
        which = [
            name
            for name, cache in (("k_cache", k_cache), ("v_cache", v_cache))
            if not np.isfinite(cache[b, h, j]).all()
        ]
        verb = "hold" if len(which) > 1 else "holds"
        raise ValueError(
            f"{' and '.join(which)} {verb} NaN or inf in batch row {b}, head {h}, position {j} "
            f"(within cache_seqlens[{b}] = {lengths[b]}); every cached key and value must be "
            "finite"
        )
    return v_top.view(v_cache.dtype).astype(np.float64)


def _check_finite_result(out, lse, totals):
    """The caches are finite (checked): NaN/inf here means scores that overflow."""
    bad = ~np.isfinite(out).all(axis=(1, 2, 3)) | (np.isnan(lse) | (lse == np.inf)).any(axis=(1, 2))
    rows = np.flatnonzero(bad)
    if rows.size:
        b = int(rows[0])
        raise ValueError(
            f"the scores q . k of batch row {b} (over its first {totals[b]} keys) overflow; "
            "rescale q or the cached keys"
        )


def _refuse_overflowing_scores(q, k_cache, totals, scale, lse):
    """NaN rows of a programmable step come from score_mod (NaN or +inf on an admissible
    key: kept, as :func:`nbattn.flash_attention` keeps them) or from scores scale q . k
    beyond the dtype: those are refused as in a plain step (checked on NaN rows only)."""
    n_h = q.shape[1]
    n_rep = n_h // k_cache.shape[1]
    limit = float(np.finfo(q.dtype).max)
    for b in np.flatnonzero(np.isnan(lse).any(axis=(1, 2))):
        keys = np.repeat(k_cache[b, :, : totals[b]].astype(np.float64), n_rep, axis=0)
        with np.errstate(over="ignore", invalid="ignore"):
            scores = scale * (q[b].astype(np.float64) @ np.swapaxes(keys, -1, -2))
        if not np.all(np.abs(scores) <= limit):
            raise ValueError(
                f"the scores q . k of batch row {b} (over its first {totals[b]} keys) overflow; "
                "rescale q or the cached keys"
            )


# --------------------------------------------------------------------------- the cache object
class KVCache:
    """Preallocated key/value caches and their lengths, for step-by-step decoding.

    ``k`` (B, H_kv, capacity, E) and ``v`` (B, H_kv, capacity, Ev) hold the
    keys and values of every batch row's past tokens, ``lengths`` (B,) how many
    are valid per row. :meth:`attend` runs one decoding step
    (:func:`flash_decode`) and advances the lengths; :meth:`append` only
    stores. When a step would not fit, the cache doubles its capacity (copying
    the valid part) or, with ``grow=False``, raises a ValueError naming the
    full batch row.

    Parameters
    ----------
    batch_size, num_kv_heads, head_dim : int
    capacity : int, default 256
        Positions preallocated per batch row.
    value_dim : int, optional
        Ev, default ``head_dim``.
    dtype : "float64" (default) or "float32"
    grow : bool, default True
    """

    def __init__(
        self,
        batch_size,
        num_kv_heads,
        head_dim,
        capacity=256,
        value_dim=None,
        dtype="float64",
        grow=True,
    ):
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.value_dim = check_positive_int(
            head_dim if value_dim is None else value_dim, "value_dim"
        )
        capacity = check_positive_int(capacity, "capacity")
        self.dtype = check_dtype(dtype)
        self.grow = check_bool(grow, "grow")
        shape = (self.batch_size, self.num_kv_heads, capacity)
        self.k = np.zeros(shape + (self.head_dim,), dtype=self.dtype)
        self.v = np.zeros(shape + (self.value_dim,), dtype=self.dtype)
        self.lengths = np.zeros(self.batch_size, dtype=np.int64)

    @property
    def capacity(self):
        """Positions per batch row currently allocated."""
        return self.k.shape[2]

    def reset(self, rows=None):
        """Forget the past of every batch row, or of ``rows`` (indices or a boolean mask)."""
        if rows is None:
            self.lengths[:] = 0
        else:
            picked = np.zeros(self.batch_size, dtype=bool)
            try:
                picked[rows] = True
            except (IndexError, ValueError, TypeError) as exc:
                raise ValueError(
                    f"rows must index the {self.batch_size} batch rows, got {rows!r}"
                ) from exc
            self.lengths[picked] = 0
        return self

    def _reserve(self, n_new):
        """Make room for ``n_new`` more positions in every row (grow, or raise naming the row)."""
        needed = int(self.lengths.max()) + n_new
        if needed <= self.capacity:
            return
        if not self.grow:
            b = int(np.argmax(self.lengths))
            raise ValueError(
                f"KVCache is full: batch row {b} holds {self.lengths[b]} of {self.capacity} "
                f"positions and {n_new} more do not fit (grow=False)"
            )
        capacity = max(2 * self.capacity, needed)
        used = int(self.lengths.max())
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.zeros(old.shape[:2] + (capacity,) + old.shape[3:], dtype=self.dtype)
            new[:, :, :used] = old[:, :, :used]
            setattr(self, name, new)

    def append(self, k_new, v_new):
        """Store new keys (B, H_kv, n, E) and values (B, H_kv, n, Ev) at each row's end."""
        k_new, v_new, n_new = _check_new(k_new, v_new, self.dtype, self.k.shape, self.v.shape)
        if n_new == 0:
            return self
        self._reserve(n_new)
        for b in range(self.batch_size):
            start = self.lengths[b]
            self.k[b, :, start : start + n_new] = k_new[b]
            self.v[b, :, start : start + n_new] = v_new[b]
        self.lengths += n_new
        return self

    def attend(
        self,
        q,
        k_new=None,
        v_new=None,
        causal=True,
        scale=None,
        return_lse=False,
        window=None,
        softcap=None,
        *,
        score_mod=None,
        mask_mod=None,
        mod_args=(),
    ):
        """One decoding step: :func:`flash_decode` on this cache, then advance the lengths.

        ``q`` (B, H, L, E) with H a multiple of ``num_kv_heads`` (grouped-query
        attention when larger); ``k_new`` / ``v_new`` (B, H_kv, n_new, E/Ev) as
        in :func:`flash_decode`, converted to the cache's dtype; ``score_mod``,
        ``mask_mod`` and ``mod_args`` as there (q_idx the query's position in its
        sequence). Returns what :func:`flash_decode` returns.
        """
        q = as_float_array(q, "q", ndim=(4,), dtype=self.dtype, allow_bool=False)
        k_new, v_new, n_new = _check_new(k_new, v_new, self.dtype, self.k.shape, self.v.shape)
        self._reserve(n_new)
        result = flash_decode(
            q,
            self.k,
            self.v,
            self.lengths,
            k_new,
            v_new,
            causal=causal,
            scale=scale,
            return_lse=return_lse,
            window=window,
            softcap=softcap,
            enable_gqa=q.shape[1] != self.num_kv_heads,
            score_mod=score_mod,
            mask_mod=mask_mod,
            mod_args=mod_args,
        )
        self.lengths += n_new
        return result

    def __repr__(self):
        return (
            f"KVCache(batch_size={self.batch_size}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, capacity={self.capacity}, "
            f"lengths={self.lengths.tolist()})"
        )
