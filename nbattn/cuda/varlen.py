"""Packed variable-length attention on the GPU: the twin of ``nbattn.kernels.varlen``.

Sequences concatenated along the sequence axis, q (BH, T_q, E), k (BKV, T_k,
E), v (BKV, T_k, Ev), sequence s owning rows ``cu_q[s] .. cu_q[s+1] - 1`` of q
and ``cu_k[s] .. cu_k[s+1] - 1`` of k and v; nothing attends across a
boundary. The flash kernels of ``nbattn.cuda.flash`` run every sequence in
one launch: grid row ``seq * BH + bh`` (``seq * BKV + kv`` for dK and dV)
reads the sequence's offsets and band from the packing (``cu_q``, ``cu_k``,
``bands``), and blocks past a sequence's rows leave at once. Arguments are
the CPU kernels' (base-2 q and softcap, the band (offset, left, right) per
sequence, the dropout words with the PACKED counter (bh * T_q + i) * T_k + j);
``work`` and ``tiles`` describe the CPU's work split and are not used here.
Results are device arrays.
"""

from __future__ import annotations

from .flash import backward_packed, forward_packed, varlen_call

__all__ = ["varlen_backward", "varlen_forward"]


def varlen_forward(q, k, v, kv_index, packing, work, score, dropout, tiles):
    """Packed forward: ``(out (BH, T_q, Ev), lse (BH, T_q) float64)`` as device arrays.

    The arguments are those of ``nbattn.kernels.varlen.varlen_forward``; ``work``
    (how the CPU deals the work to its threads) and ``tiles`` are not used: the
    grid deals the work here.
    """
    return forward_packed(varlen_call(q, kv_index, packing, score, dropout), q, k, v)


def varlen_backward(q, k, v, out, lse, dout, kv_index, packing, work, score, dropout, tiles):
    """Packed backward: ``(dq, dk, dv)`` as device arrays (shapes of q, k, v).

    The arguments are those of ``nbattn.kernels.varlen.varlen_backward`` (``work``
    and ``tiles`` not used).
    """
    call = varlen_call(q, kv_index, packing, score, dropout)
    return backward_packed(call, q, k, v, out, lse, dout, score.scale)
