"""Packed variable-length attention on the GPU: the twin of ``nbattn.kernels.varlen``.

Sequences concatenated along the sequence axis, q (BH, T_q, E), k (BKV, T_k,
E), v (BKV, T_k, Ev), sequence s owning rows ``cu_q[s] .. cu_q[s+1] - 1`` of q
and ``cu_k[s] .. cu_k[s+1] - 1`` of k and v; nothing attends across a
boundary. The flash kernels of ``nbattn.cuda.flash`` run every sequence in
one launch: grid row ``seq * BH + bh`` (``seq * BKV + kv`` for dK and dV)
reads the sequence's offsets and band from ``cu_q``, ``cu_k`` and
``bands``, and blocks past a sequence's rows leave at once. Arguments are
the CPU kernels' (base-2 q and softcap, the band (offset, left, right) per
sequence, the dropout words with the PACKED counter (bh * T_q + i) * T_k + j);
``items``, ``block_q`` and ``block_k`` describe the CPU's work split and are
not used here. Results are device arrays.
"""

from __future__ import annotations

import numpy as np

from .flash import backward_packed, forward_packed, host_array, varlen_call

__all__ = ["varlen_backward", "varlen_forward"]


def varlen_forward(
    q,
    k,
    v,
    kv_index,
    cu_q,
    cu_k,
    items,
    worker_start,
    bands,
    softcap,
    dropout,
    keep_scale,
    block_q,
    block_k,
):
    """Packed forward: ``(out (BH, T_q, Ev), lse (BH, T_q) float64)`` as device arrays.

    The arguments are those of ``nbattn.kernels.varlen.varlen_forward``; ``items`` and
    ``worker_start`` (how the CPU deals the work to its threads) are not used: the
    grid deals the work here.
    """
    call = varlen_call(q, k, kv_index, cu_q, cu_k, bands, softcap, dropout, keep_scale)
    return forward_packed(call, q, k, v)


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
    worker_start,
    bands,
    softcap,
    dropout,
    keep_scale,
    scale,
    block_q,
    block_k,
):
    """Packed backward: ``(dq, dk, dv)`` as device arrays (shapes of q, k, v).

    The arguments are those of ``nbattn.kernels.varlen.varlen_backward`` (``items``
    and ``worker_start`` not used).

    ``readers[reader_start[kv] : reader_start[kv + 1]]`` are the query slices that
    read key/value slice kv (the K/V slice of each query slice is read off them).
    """
    readers = host_array(readers, np.int64)
    start = host_array(reader_start, np.int64)
    kv_index = np.repeat(np.arange(start.size - 1, dtype=np.int64), np.diff(start))
    by_query = np.empty(readers.size, dtype=np.int64)
    by_query[readers] = kv_index
    call = varlen_call(q, k, by_query, cu_q, cu_k, bands, softcap, dropout, keep_scale)
    return backward_packed(call, q, k, v, out, lse, dout, scale)
