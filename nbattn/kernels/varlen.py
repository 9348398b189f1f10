"""Packed variable-length attention: the flash kernels per sequence, inside one parallel loop.

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

The items are sorted by cost, largest first, and handed out one at a time
(``numba.parallel_chunksize(1)`` around the call), so one long sequence
among many short ones does not leave a thread idle at the end.

The flash kernels are ``parallel=True``; nested inside this loop they would
launch a parallel region per item. ``flash_forward_serial`` and
``flash_backward_serial`` are the same Python functions compiled without
``parallel`` (their ``prange`` runs as ``range``), under their own names so
that numba's on-disk cache keeps them apart from the parallel ones. (numba's
cache does not notice when ``kernels/flash.py`` changes under a cached caller
here: delete ``nbattn/kernels/__pycache__`` after editing it.)

Argument conventions are the flash kernels' (see ``nbattn.kernels.flash``):
q times scale * log2(e), a base-2 softcap, the dropout words (seed,
threshold, n_rows, n_cols, row0, col0). Per sequence the band is
(offset_s, left, right) with ``bands[s]``; for a slice of rows starting at
local row i0 the kernels get offset_s + i0. The dropout counter of weight
(bh, i, j) uses the PACKED indices, (bh * T_q + i) * T_k + j with i, j
counted from the start of the packed arrays: each call gets row0 =
bh * T_q + cu_q[s] + i0 and col0 = cu_k[s] on a slice of one query slice.
"""

from __future__ import annotations

import types

import numpy as np
from numba import njit, prange

from .. import config
from .flash import flash_backward, flash_forward


def _serial_twin(kernel, name):
    """``kernel``'s Python function compiled without ``parallel``, cached under ``name``."""
    py = kernel.py_func
    twin = types.FunctionType(py.__code__, py.__globals__, name, py.__defaults__, py.__closure__)
    twin.__qualname__ = name
    twin.__doc__ = f"``{py.__name__}`` on one thread (to be called from a parallel loop)."
    return njit(fastmath=config.FASTMATH, cache=config.CACHE)(twin)


flash_forward_serial = _serial_twin(flash_forward, "flash_forward_serial")
flash_backward_serial = _serial_twin(flash_backward, "flash_backward_serial")


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _band_from(bands, s, i0):
    band = np.empty(3, dtype=np.int64)
    band[0] = bands[s, 0] + i0
    band[1] = bands[s, 1]
    band[2] = bands[s, 2]
    return band


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _words_from(dropout, row0, col0):
    words = dropout.copy()
    words[4] = np.uint64(row0)
    words[5] = np.uint64(col0)
    return words


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def varlen_forward(
    q, k, v, kv_index, cu_q, cu_k, items, bands, softcap, dropout, keep_scale, block_q, block_k
):
    """Packed forward; returns ``(out (BH, T_q, Ev), lse (BH, T_q) float64)``.

    Parameters
    ----------
    q, k, v : (BH, T_q, E) base-2 scaled queries, (BKV, T_k, E), (BKV, T_k, Ev)
    kv_index : int64 (BH,), the key/value slice of each query slice
    cu_q, cu_k : int64 (n_seqs + 1,), the packed offsets
    items : int64 (n_items, 4), rows (sequence, bh, i0, i1), largest first
    bands : int64 (n_seqs, 3), (offset, left, right) of each sequence
    softcap : float, base 2 (0 = none)
    dropout : uint64 (6,), seed, threshold, T_q, T_k, 0, 0
    keep_scale : float, 1 / (1 - p)
    block_q, block_k : the flash tile sizes

    Rows of empty sequences do not exist; a query of a sequence without keys
    gets zeros and lse = -inf.
    """
    n_bh, t_q, d = q.shape
    d_v = v.shape[2]
    out = np.zeros((n_bh, t_q, d_v), dtype=q.dtype)
    lse = np.full((n_bh, t_q), -np.inf)
    no_mask = np.zeros((0, 1, 1), dtype=q.dtype)
    live = np.ones((1, 1, 1), dtype=np.uint8)
    no_slopes = np.zeros(0, dtype=q.dtype)
    for t in prange(items.shape[0]):
        s, bh, i0, i1 = items[t, 0], items[t, 1], items[t, 2], items[t, 3]
        a_q, a_k, b_k = cu_q[s], cu_k[s], cu_k[s + 1]
        kv = kv_index[bh]
        zero = np.zeros(1, dtype=np.int64)
        o, l_ = flash_forward_serial(
            q[bh, a_q + i0 : a_q + i1].reshape((1, i1 - i0, d)),
            k[kv, a_k:b_k].reshape((1, b_k - a_k, d)),
            v[kv, a_k:b_k].reshape((1, b_k - a_k, d_v)),
            zero,
            no_mask,
            zero,
            live,
            no_slopes,
            _band_from(bands, s, i0),
            softcap,
            _words_from(dropout, bh * t_q + a_q + i0, a_k),
            keep_scale,
            block_q,
            block_k,
        )
        out[bh, a_q + i0 : a_q + i1] = o[0]
        lse[bh, a_q + i0 : a_q + i1] = l_[0]
    return out, lse


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def varlen_backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    readers,
    reader_start,
    cu_q,
    cu_k,
    items,
    bands,
    softcap,
    dropout,
    keep_scale,
    scale,
    block_q,
    block_k,
):
    """Packed backward; returns ``(dq, dk, dv)`` of the shapes of q, k, v.

    ``out``, ``dout`` (BH, T_q, Ev) and ``lse`` (BH, T_q) as the forward gave
    them; ``readers[reader_start[kv] : reader_start[kv + 1]]`` are the query
    slices that read key/value slice kv; ``items`` (n_items, 2) int64 rows
    (sequence, kv), largest first; ``scale`` the user's scale (the kernels'
    dQ factor). Other arguments as :func:`varlen_forward`.
    """
    n_bh, t_q, d = q.shape
    n_kv, t_k, d_v = v.shape
    dq = np.zeros((n_bh, t_q, d), dtype=q.dtype)
    dk = np.zeros((n_kv, t_k, d), dtype=q.dtype)
    dv = np.zeros((n_kv, t_k, d_v), dtype=q.dtype)
    no_mask = np.zeros((0, 1, 1), dtype=q.dtype)
    live = np.ones((1, 1, 1), dtype=np.uint8)
    no_slopes = np.zeros(0, dtype=q.dtype)
    for t in prange(items.shape[0]):
        s, kv = items[t, 0], items[t, 1]
        a_q, b_q, a_k, b_k = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        n_q, n_k = b_q - a_q, b_k - a_k
        zero = np.zeros(1, dtype=np.int64)
        band = _band_from(bands, s, 0)
        ks = k[kv, a_k:b_k].reshape((1, n_k, d))
        vs = v[kv, a_k:b_k].reshape((1, n_k, d_v))
        for r in range(reader_start[kv], reader_start[kv + 1]):
            bh = readers[r]
            g_q, g_k, g_v = flash_backward_serial(
                q[bh, a_q:b_q].reshape((1, n_q, d)),
                ks,
                vs,
                out[bh, a_q:b_q].reshape((1, n_q, d_v)),
                lse[bh, a_q:b_q].reshape((1, n_q)),
                dout[bh, a_q:b_q].reshape((1, n_q, d_v)),
                zero,
                no_mask,
                zero,
                live,
                no_slopes,
                band,
                softcap,
                _words_from(dropout, bh * t_q + a_q, a_k),
                keep_scale,
                scale,
                1,
                block_q,
                block_k,
            )
            dq[bh, a_q:b_q] = g_q[0]
            dk[kv, a_k:b_k] += g_k[0]
            dv[kv, a_k:b_k] += g_v[0]
    return dq, dk, dv
