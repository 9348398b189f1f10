"""Packed variable-length attention: the flash kernels per sequence, on the work-item threads.

Sequences of different lengths are concatenated along the sequence axis:
q (BH, T_q, E), k (BKV, T_k, E), v (BKV, T_k, Ev), sequence s owning rows
``cu_q[s] .. cu_q[s+1] - 1`` of q and ``cu_k[s] .. cu_k[s+1] - 1`` of k and v.
Nothing attends across a sequence boundary. Each work item runs the blocked
flash kernels of ``nbattn.kernels.flash`` on its own slices (views, no copy):

* forward, item (sequence, query slice bh, query tile): rows
  ``[i0, i1)`` of the sequence against all its keys (within the band);
* backward, item (sequence, key/value slice): every query slice reading
  that key/value slice (the head group of grouped-query attention), so the
  item owns its dK and dV rows and nothing is written twice.

The caller deals the items out to the threads beforehand, largest first in
a back-and-forth order (``worker_start[w] .. worker_start[w + 1] - 1`` are
worker w's items), and each worker's list is one work item of
``nbattn.kernels.items.run_items``: the threads get about equal work
whatever the mix of lengths, with one counter step per worker.

Within a worker each call runs all of a flash kernel's work items
(``nbattn.kernels.flash.forward_items``, ``backward_items``) on the
worker's thread, from a counter of its own. (numba's cache does not notice
when ``kernels/flash.py`` changes under a cached caller here: delete
``nbattn/kernels/__pycache__`` after editing it.)

Argument conventions are the flash kernels' (see ``nbattn.kernels.flash``
and the groups of ``nbattn._core.attn_groups``): q times scale * log2(e),
the base-2 softcap of ``score``, the ``dropout`` counter words. The packing
(cu_q, cu_k and the band of every sequence) and the CPU's work split are
groups of their own. Per sequence the band is (offset_s, left, right) =
``packing.bands[s]``; for a slice of rows starting at local row i0 the
kernels get offset_s + i0. The dropout counter of weight (bh, i, j) uses the
PACKED indices, (bh * T_q + i) * T_k + j with i, j counted from the start of
the packed arrays: each call gets row0 = bh * T_q + cu_q[s] + i0 and col0 =
cu_k[s] on a slice of one query slice. There is no mask and no ALiBi.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .._core.attn_groups import Band, Bias, Dropout
from .flash import backward_items, backward_rows, forward_items, sum_groups
from .items import next_item, run_items


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _forward_on_one_thread(q, k, v, kv_index, bias, band, score, dropout, tiles):
    """``flash_forward`` on the calling thread: all of its work items, from a counter of
    this call's own (inside the parallel loop over workers)."""
    n_bh, n_q, _ = q.shape
    out = np.empty((n_bh, n_q, v.shape[2]), dtype=q.dtype)
    lse = np.empty((n_bh, n_q))
    counter = np.zeros(1, dtype=np.int64)
    forward_items(counter, q, k, v, kv_index, bias, band, score, dropout, tiles, out, lse)
    return out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _backward_on_one_thread(q, k, v, out, lse, dout, kv_index, bias, band, score, dropout, tiles):
    """``flash_backward`` on the calling thread: all of its work items, from a counter of
    this call's own, between its serial row pass and group sum."""
    n_bh, n_q, d = q.shape
    n_kv, n_k, _ = k.shape
    delta, lse_t = backward_rows(out, dout, lse)
    dq_part = np.zeros((tiles.n_groups, n_bh, n_q, d), dtype=q.dtype)
    dk = np.empty((n_kv, n_k, d), dtype=q.dtype)
    dv = np.empty((n_kv, n_k, v.shape[2]), dtype=q.dtype)
    counter = np.zeros(1, dtype=np.int64)
    backward_items(
        counter,
        q,
        k,
        v,
        dout,
        kv_index,
        bias,
        band,
        score,
        dropout,
        tiles,
        delta,
        lse_t,
        dq_part,
        dk,
        dv,
    )
    return sum_groups(dq_part, score.scale), dk, dv


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _counters_from(dropout, row0, col0):
    """``dropout`` with the counter offsets of a slice starting at packed (row0, col0)."""
    row0, col0 = np.uint64(row0), np.uint64(col0)
    return Dropout(
        dropout.seed,
        dropout.threshold,
        dropout.n_rows,
        dropout.n_cols,
        row0,
        col0,
        dropout.keep_scale,
    )


def varlen_forward(q, k, v, kv_index, packing, work, score, dropout, tiles):
    """Packed forward; returns ``(out (BH, T_q, Ev), lse (BH, T_q) float64)``.

    Parameters
    ----------
    q, k, v : (BH, T_q, E) base-2 scaled queries, (BKV, T_k, E), (BKV, T_k, Ev)
    kv_index : int64 (BH,), the key/value slice of each query slice
    packing : Packing, the offsets cu_q, cu_k and the band of each sequence
    work : Work, the items (sequence, bh, i0, i1) grouped by worker, and
        worker_start (n_workers + 1,), the first item of each worker
    score : ScoreTransform, the base-2 softcap (the scale is unused: q is scaled)
    dropout : Dropout, with n_rows = T_q, n_cols = T_k, row0 = col0 = 0
    tiles : Tiles, the flash tile sizes

    Rows of empty sequences do not exist; a query of a sequence without keys
    gets zeros and lse = -inf.

    Each worker's list of items is a work item of :func:`nbattn.kernels.items.run_items`.
    """
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype)
    lse = np.full((q.shape[0], q.shape[1]), -np.inf)
    run_items(
        _varlen_forward_items, q, k, v, kv_index, packing, work, score, dropout, tiles, out, lse
    )
    return out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _varlen_forward_items(
    counter, q, k, v, kv_index, packing, work, score, dropout, tiles, out, lse
):
    """The workers' lists of items that ``counter`` hands this thread."""
    cu_q, cu_k, bands = packing
    items, worker_start = work
    n_bh, t_q, d = q.shape
    d_v = v.shape[2]
    no_mask = np.zeros((0, 1, 1), dtype=q.dtype)
    live = np.ones((1, 1, 1), dtype=np.uint8)
    no_slopes = np.zeros(0, dtype=q.dtype)
    while True:
        w = next_item(counter)
        if w >= worker_start.shape[0] - 1:
            return
        zero = np.zeros(1, dtype=np.int64)
        no_bias = Bias(no_mask, zero, live, no_slopes)
        for t in range(worker_start[w], worker_start[w + 1]):
            s, bh, i0, i1 = items[t, 0], items[t, 1], items[t, 2], items[t, 3]
            a_q, a_k, b_k = cu_q[s], cu_k[s], cu_k[s + 1]
            kv = kv_index[bh]
            o, l_ = _forward_on_one_thread(
                q[bh, a_q + i0 : a_q + i1].reshape((1, i1 - i0, d)),
                k[kv, a_k:b_k].reshape((1, b_k - a_k, d)),
                v[kv, a_k:b_k].reshape((1, b_k - a_k, d_v)),
                zero,
                no_bias,
                Band(bands[s, 0] + i0, bands[s, 1], bands[s, 2]),
                score,
                _counters_from(dropout, bh * t_q + a_q + i0, a_k),
                tiles,
            )
            # element by element: an array-to-slice assignment compiles numba's
            # shape-mismatch message (string formatting, ~6 s of each kernel's compile)
            for i in range(i1 - i0):
                lse[bh, a_q + i0 + i] = l_[0, i]
                for c in range(d_v):
                    out[bh, a_q + i0 + i, c] = o[0, i, c]


def varlen_backward(q, k, v, out, lse, dout, kv_index, packing, work, score, dropout, tiles):
    """Packed backward; returns ``(dq, dk, dv)`` of the shapes of q, k, v.

    ``out``, ``dout`` (BH, T_q, Ev) and ``lse`` (BH, T_q) as the forward gave
    them; ``work.items`` (n_items, 2) int64 rows (sequence, kv), grouped by
    worker as in :func:`varlen_forward`: the item runs every query slice that
    reads key/value slice kv (in order), so it owns its rows of dK and dV.
    ``score.scale`` is the user's scale (the kernels' dQ factor). Other
    arguments as :func:`varlen_forward`.

    Each worker's list of items is a work item of :func:`nbattn.kernels.items.run_items`.
    """
    dq = np.zeros(q.shape, dtype=q.dtype)
    dk = np.zeros(k.shape, dtype=q.dtype)
    dv = np.zeros(v.shape, dtype=q.dtype)
    run_items(
        _varlen_backward_items,
        q,
        k,
        v,
        out,
        lse,
        dout,
        kv_index,
        packing,
        work,
        score,
        dropout,
        tiles,
        dq,
        dk,
        dv,
    )
    return dq, dk, dv


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _varlen_backward_items(
    counter, q, k, v, out, lse, dout, kv_index, packing, work, score, dropout, tiles, dq, dk, dv
):
    """The workers' lists of items that ``counter`` hands this thread."""
    cu_q, cu_k, bands = packing
    items, worker_start = work
    n_bh, t_q, d = q.shape
    n_kv, t_k, d_v = v.shape
    no_mask = np.zeros((0, 1, 1), dtype=q.dtype)
    live = np.ones((1, 1, 1), dtype=np.uint8)
    no_slopes = np.zeros(0, dtype=q.dtype)
    while True:
        w = next_item(counter)
        if w >= worker_start.shape[0] - 1:
            return
        for t in range(worker_start[w], worker_start[w + 1]):
            s, kv = items[t, 0], items[t, 1]
            a_q, b_q, a_k, b_k = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
            n_q, n_k = b_q - a_q, b_k - a_k
            zero = np.zeros(1, dtype=np.int64)
            no_bias = Bias(no_mask, zero, live, no_slopes)
            band = Band(bands[s, 0], bands[s, 1], bands[s, 2])
            ks = k[kv, a_k:b_k].reshape((1, n_k, d))
            vs = v[kv, a_k:b_k].reshape((1, n_k, d_v))
            for bh in range(n_bh):
                if kv_index[bh] != kv:
                    continue
                g_q, g_k, g_v = _backward_on_one_thread(
                    q[bh, a_q:b_q].reshape((1, n_q, d)),
                    ks,
                    vs,
                    out[bh, a_q:b_q].reshape((1, n_q, d_v)),
                    lse[bh, a_q:b_q].reshape((1, n_q)),
                    dout[bh, a_q:b_q].reshape((1, n_q, d_v)),
                    zero,
                    no_bias,
                    band,
                    score,
                    _counters_from(dropout, bh * t_q + a_q, a_k),
                    tiles,
                )
                # element by element (see varlen_forward)
                for i in range(b_q - a_q):
                    for c in range(d):
                        dq[bh, a_q + i, c] = g_q[0, i, c]
                for j in range(b_k - a_k):
                    for c in range(d):
                        dk[kv, a_k + j, c] += g_k[0, j, c]
                    for c in range(d_v):
                        dv[kv, a_k + j, c] += g_v[0, j, c]
