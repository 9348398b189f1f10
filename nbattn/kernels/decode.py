"""Split-KV decoding: a few queries against a long key/value cache, on every core.

One decoding step has L (often 1) new queries per sequence and S cached
keys; the blocked flash kernels parallelise over query tiles, so one query
over a long cache would run on one thread. Here the keys of each sequence are
cut into ``n_splits`` contiguous chunks, every (batch row, kv head, chunk)
is one work item of the parallel loop, and each item reduces its chunk to the
online-softmax state ``(out, lse)`` of every query row it serves:

    s_ij   = scale * q_i . k_j                 (softcap c: s_ij <- c tanh(s_ij / c))
    lse_i  = log sum_{j in chunk, admissible} exp(s_ij)
    out_i  = sum_{j in chunk, admissible} exp(s_ij - lse_i) v_j

The caller merges the chunk states with the one log-sum-exp merge,
``nbattn.kernels.softmax.merge_states`` (exact: the states of disjoint key
sets combine to the state of their union).

Layout (the caller validates): q (B, H, L, E); caches k (B, H_kv, S_max, E)
and v (B, H_kv, S_max, Ev), C-contiguous, one dtype; H = n_rep * H_kv and
query head h reads kv head h // n_rep (grouped-query attention; n_rep = 1 is
plain multi-head). The keys and their split (``KeySplit``) and the window
(``DecodeWindow``) are groups of ``nbattn._core.attn_groups``. ``totals[b]``
keys are valid in row b. Query i of row b sits at position
p = totals[b] - L + i (bottom-right alignment: the last query is the last
key) and admits key j iff

    lo(p) <= j <= hi(p),   lo = max(0, p - left),
    hi = min(totals[b] - 1, p if causal else totals[b] - 1, p + right)

with ``left`` / ``right`` < 0 meaning unbounded. Chunk c of row b covers keys
[starts[b] + c * chunks[b], starts[b] + (c + 1) * chunks[b]) intersected with
[starts[b], ends[b]): the caller narrows [starts, ends) to the keys some
query admits, so a windowed decode reads only the window.

Scores, the running maximum and sum follow the flash kernels' online softmax
(natural base here, with the shared ``row_max`` and ``exp_shift_sum``); the
accumulator is in the input dtype within a block of keys and float64 across
blocks, and the chunk states come back as float64. A query row with no
admissible key in a chunk gets zeros and lse = -inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import like
from .items import next_item, run_items
from .softmax import exp_shift_sum, row_max


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _admissible_range(p, total, causal, left, right):
    """[lo, hi] (inclusive) of the keys query position ``p`` admits; hi < lo when none."""
    lo = 0
    if left >= 0:
        lo = max(0, p - left)
    hi = total - 1
    if causal:
        hi = min(hi, p)
    if right >= 0:
        hi = min(hi, p + right)
    return lo, hi


def decode_partials(q, k_cache, v_cache, keys, window, scale, softcap, block_k):
    """Chunk states of split-KV decoding: ``(out, lse)``, one per chunk and query row.

    Parameters
    ----------
    q : (B, H, L, E) float32/float64, C-contiguous; the user's queries (not scaled).
    k_cache, v_cache : (B, H_kv, S_max, E), (B, H_kv, S_max, Ev), q's dtype.
        H_kv divides H: query head h reads kv head h // (H / H_kv).
    keys : KeySplit
        ``totals[b]`` valid keys per batch row (the cache length after the
        append); keys [starts[b], ends[b]) are split into ``n_splits`` chunks of
        ``chunks[b]`` keys (work items: B * H_kv * n_splits).
    window : DecodeWindow
        Bottom-right causal, and the window sides (negative = unbounded); see
        the module docstring.
    scale : float
        Multiplies q . k.
    softcap : float
        c > 0 applies c tanh(s / c) to the scaled score; 0 leaves it.
    block_k : int
        Keys per block of the online softmax (a score block per row in L1).

    Returns
    -------
    out : float64 (n_splits, B*H*L, Ev), rows ordered (b, h, i); normalised per chunk.
    lse : float64 (n_splits, B*H*L); -inf where the chunk holds no admissible key.

    The (batch row, kv head, chunk) items run on :func:`nbattn.kernels.items.run_items`.
    """
    n_rows = q.shape[0] * q.shape[1] * q.shape[2]
    n_splits = keys[4]  # KeySplit.n_splits
    part_out = np.zeros((n_splits, n_rows, v_cache.shape[3]))
    part_lse = np.full((n_splits, n_rows), -np.inf)
    run_items(
        decode_items,
        q,
        k_cache,
        v_cache,
        keys,
        window,
        float(scale),
        float(softcap),
        np.int64(block_k),
        part_out,
        part_lse,
    )
    return part_out, part_lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def decode_items(
    counter, q, k_cache, v_cache, keys, window, scale, softcap, block_k, part_out, part_lse
):
    """The (batch row, kv head, chunk) items that ``counter`` hands this thread: their
    rows of ``part_out`` and ``part_lse``."""
    totals, starts, chunks, ends, n_splits = keys
    causal, left, right = window
    n_b, n_h, n_q, d = q.shape
    n_hkv = k_cache.shape[1]
    d_v = v_cache.shape[3]
    n_rep = n_h // n_hkv
    n_rows = n_rep * n_q
    dtype = q.dtype
    while True:
        item = next_item(counter)
        if item >= n_b * n_hkv * n_splits:
            return
        split = item % n_splits
        bh_kv = item // n_splits
        b = bh_kv // n_hkv
        hk = bh_kv - b * n_hkv
        total = totals[b]
        j_begin = starts[b] + split * chunks[b]
        j_end = min(ends[b], j_begin + chunks[b])
        if j_end <= j_begin:
            continue
        # the rows this item serves: query heads hk*n_rep .. +n_rep, all L queries
        qs = np.empty((n_rows, d), dtype=dtype)
        lo = np.empty(n_rows, dtype=np.int64)
        hi = np.empty(n_rows, dtype=np.int64)
        for r in range(n_rows):
            h = hk * n_rep + r // n_q
            i = r % n_q
            for c in range(d):
                qs[r, c] = q[b, h, i, c] * like(scale, q)
            lo[r], hi[r] = _admissible_range(total - n_q + i, total, causal, left, right)
        acc = np.zeros((n_rows, d_v), dtype=dtype)
        acc64 = np.zeros((n_rows, d_v))
        m = np.full(n_rows, -np.inf)
        l_sum = np.zeros(n_rows)
        scores = np.empty(block_k, dtype=dtype)
        keys = k_cache[b, hk]
        values = v_cache[b, hk]
        for j0 in range(j_begin, j_end, block_k):
            nb = min(block_k, j_end - j0)
            for r in range(n_rows):
                a = max(lo[r], j0)
                z = min(hi[r] + 1, j0 + nb)
                if z <= a:
                    continue
                q_row = qs[r]
                row = scores[: z - a]
                for j in range(a, z):
                    k_row = keys[j]
                    s = like(0.0, q)
                    for c in range(d):
                        s += q_row[c] * k_row[c]
                    row[j - a] = s
                if softcap > 0.0:
                    cap = like(softcap, q)
                    for j in range(z - a):
                        row[j] = cap * np.tanh(row[j] / cap)
                m_new = max(m[r], np.float64(row_max(row)))
                if m_new == -np.inf:
                    continue
                rescale = np.exp(m[r] - m_new)
                l_sum[r] = l_sum[r] * rescale + exp_shift_sum(row, like(m_new, row))
                m[r] = m_new
                acc_row = acc[r]
                acc64_row = acc64[r]
                for c in range(d_v):
                    acc64_row[c] = (acc64_row[c] + acc_row[c]) * rescale
                    acc_row[c] = 0.0
                for j in range(a, z):
                    w = row[j - a]
                    v_row = values[j]
                    for c in range(d_v):
                        acc_row[c] += w * v_row[c]
        for r in range(n_rows):
            h = hk * n_rep + r // n_q
            i = r % n_q
            out_row = (b * n_h + h) * n_q + i
            # acc holds the last block, acc64 the ones before, both relative to m[r]
            if l_sum[r] > 0.0:
                inv = 1.0 / l_sum[r]
                for c in range(d_v):
                    part_out[split, out_row, c] = (acc64[r, c] + acc[r, c]) * inv
                part_lse[split, out_row] = m[r] + np.log(l_sum[r])


@njit(parallel=True, cache=config.CACHE)
def live_magnitudes(k_bits, v_bits, lengths):
    """The largest magnitude in the live rows of the caches, as bits, in one read.

    ``k_bits``, ``v_bits``: the caches (B, H_kv, S_max, E) viewed as unsigned
    integers of their float's width (no copy). For every (batch row b, kv head h),
    over the positions j < ``lengths[b]``:

        k_top[b, h] = max_j,c (k_bits[b, h, j, c] & ~sign),   v_top likewise

    The bits of |x| order as |x| does, +inf is the exponent field all ones
    (``np.finfo(dtype)``'s largest finite value plus one ulp) and every NaN lies above
    it: a slice holds NaN or inf iff its top is at least the bits of inf, and
    otherwise v_top read as a float is max |v|. An unsigned maximum vectorises
    (a float maximum or a NaN test summed over floats does not without fast-math,
    which would assume the NaN away): the check costs one read of the caches at
    memory speed.
    """
    n_b, n_h = k_bits.shape[0], k_bits.shape[1]
    sign = k_bits.dtype.type(1) << k_bits.dtype.type(8 * k_bits.itemsize - 1)
    magnitude = ~sign
    k_top = np.zeros((n_b, n_h), dtype=k_bits.dtype)
    v_top = np.zeros((n_b, n_h), dtype=v_bits.dtype)
    for item in prange(n_b * n_h):
        b = item // n_h
        h = item - b * n_h
        k_top[b, h] = _top_bits(k_bits[b, h], lengths[b], magnitude)
        v_top[b, h] = _top_bits(v_bits[b, h], lengths[b], magnitude)
    return k_top, v_top


@njit(cache=config.CACHE)
def _top_bits(rows, n, magnitude):
    """max over rows[:n] of (bits & magnitude)."""
    top = rows.dtype.type(0)
    for j in range(n):
        row = rows[j]
        for c in range(row.shape[0]):
            top = max(top, row[c] & magnitude)
    return top
