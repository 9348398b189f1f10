"""Attention over packed variable-length batches (FlashAttention's ``varlen`` form).

Instead of padding a batch of sequences to one length, concatenate them
along the sequence axis and say where each starts:

    q (..., T_q, E),  k (..., T_k, E),  v (..., T_k, Ev)
    cu_seqlens_q = [0, n_1, n_1 + n_2, ..., T_q]   (int, n_seqs + 1 entries)
    cu_seqlens_k = [0, m_1, m_1 + m_2, ..., T_k]

Sequence s is q rows ``cu_seqlens_q[s] .. cu_seqlens_q[s+1] - 1`` against k/v
rows ``cu_seqlens_k[s] .. cu_seqlens_k[s+1] - 1``; nothing attends across a
boundary, and the result is what :func:`nbattn.flash_attention` gives on
each sequence alone (same keywords), packed the same way. The leading
dimensions are the heads (and anything else that broadcasts, as in
:func:`nbattn.flash_attention`); ``enable_gqa`` lets k and v have fewer heads.
Empty sequences (equal consecutive offsets) are allowed.

The work runs in one parallel loop over (sequence, head, query tile) items
that call the flash kernels on views of the packed arrays
(``nbattn.kernels.varlen``): no padding, no per-sequence copies, and no
Python loop over the sequences. The items are dealt to the threads by cost
beforehand (largest first, back and forth), so a mix of long and short
sequences keeps every thread busy.

Masks: there is no ``mask`` keyword (FlashAttention's varlen has none
either). A mask per sequence would be a ragged array; causal attention,
windows and the alignment cover the usual packed-batch cases, and
``mask_mod`` (programmable attention, below) any other.

Programmable attention: ``score_mod``, ``mask_mod`` and ``mod_args`` as in
:func:`nbattn.flash_attention`, with b the sequence's index in the pack, h
the query head, and q_idx / kv_idx counted from the sequence's start
(FlexAttention's convention for jagged batches), so that a function means
the same on a packed batch as on a padded one. The work items (sequence,
head, query tile) are records of the flex kernels' item table
(``nbattn.attn.flex.item_table``), the same kernels as a padded batch's.

Dropout: the weight of (query slice bh, packed row i, packed column j) is
kept or dropped by the counter (bh * T_q + i) * T_k + j of
``nbattn.kernels.dropout``, with the packed indices; so the packed call and
one :func:`nbattn.flash_attention` call over the full (T_q, T_k) problem with
the same seed drop the same weights inside the sequences' diagonal blocks.
"""

from __future__ import annotations

import numpy as np

from .. import config
from .._core.attn_groups import FLEX_BACKWARD_ITEM, FLEX_FORWARD_ITEM, Packing, Work
from .._core.layout import flat_batch, unbroadcast
from .._core.numeric import LOG2E
from .._core.threads import blas_one_thread, serial_below
from .._core.validation import check_bool, check_dot_range, check_scale
from ..dispatch.device import device_for, kernels_for
from ..dispatch.transfer import to_host
from .flash_args import (
    backward_groups,
    band,
    check_forward_results,
    check_keywords,
    check_qkv,
    dropout_words,
    flash_tiles,
    kv_layout,
    scale_values,
    score_transform,
    unscale_output,
    value_scales,
    varlen_tiles,
)
from .flex import (
    check_mods,
    check_on_cpu,
    item_table,
    run_args_backward,
    run_backward,
    run_forward,
    uses_flex,
)
from .lengths import as_cu_seqlens, check_max_seqlen

__all__ = ["flash_attention_varlen", "flash_attention_varlen_backward"]


class _Packed:
    """Checked, laid-out arrays and per-sequence data of one varlen call."""

    def __init__(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        kw,
        scale,
        others,
        base2=True,
    ):
        q, k, v, dtype = check_qkv(q, k, v, kw.enable_gqa, others, keys=("T_k", "packed keys"))
        t_q, t_k = q.shape[-2], k.shape[-2]
        self.cu_q = as_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", t_q)
        self.cu_k = as_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", t_k)
        if self.cu_q.shape != self.cu_k.shape:
            raise ValueError(
                f"cu_seqlens_q describes {self.cu_q.size - 1} sequences but cu_seqlens_k "
                f"{self.cu_k.size - 1}; they must describe the same sequences"
            )
        self.len_q = np.diff(self.cu_q)
        self.len_k = np.diff(self.cu_k)
        check_max_seqlen(max_seqlen_q, "max_seqlen_q", self.len_q)
        check_max_seqlen(max_seqlen_k, "max_seqlen_k", self.len_k)
        scale = check_scale(scale, q.shape[-1])
        check_dot_range(q, k, scale * LOG2E, dtype)
        self.lead, self.kv_lead, self.kv_index = kv_layout(q.shape, k.shape, v.shape, kw.enable_gqa)
        self.dtype = dtype
        self.shapes = (q.shape, k.shape, v.shape)
        self.qf = flat_batch(q, self.lead, dtype)
        # the flash kernels take q in base 2, the programmable ones in natural units
        self.qf *= dtype(scale * LOG2E if base2 else scale)
        self.kf = flat_batch(k, self.kv_lead, dtype)
        self.vf = flat_batch(v, self.kv_lead, dtype)
        # One band for all: its unbounded sides (T_q + T_k + 1) exceed every
        # sequence's; only the bottom-right offset is per sequence.
        base = self.band = band(kw, t_q, t_k)
        bands = np.empty((self.len_q.size, 3), dtype=np.int64)
        bands[:, 0] = self.len_k - self.len_q if kw.causal_alignment == "bottom_right" else 0
        bands[:, 1:] = base.left, base.right
        self.packing = Packing(self.cu_q, self.cu_k, bands)
        self.score = score_transform(scale, kw)

    @property
    def work(self):
        """Multiply-adds over all sequences (without the band), for the thread rule."""
        n_bh = self.qf.shape[0]
        return n_bh * int(self.len_q @ self.len_k) * (self.qf.shape[2] + self.vf.shape[2])

    def forward_items(self, block_q):
        """(sequence, bh, i0, i1) per query tile of every sequence and slice; their costs."""
        n_bh = self.qf.shape[0]
        tiles = -(-self.len_q // block_q)
        seq = np.repeat(np.arange(self.len_q.size), tiles)
        first = np.arange(seq.size) - np.repeat(np.cumsum(tiles) - tiles, tiles)
        i0 = first * block_q
        i1 = np.minimum(i0 + block_q, self.len_q[seq])
        items = np.empty((seq.size * n_bh, 4), dtype=np.int64)
        items[:, 0] = np.repeat(seq, n_bh)
        items[:, 1] = np.tile(np.arange(n_bh), seq.size)
        items[:, 2] = np.repeat(i0, n_bh)
        items[:, 3] = np.repeat(i1, n_bh)
        cost = (items[:, 3] - items[:, 2]) * self.len_k[items[:, 0]]
        return items, cost

    def backward_items(self):
        """(sequence, kv slice) of every non-empty sequence and their costs (an item
        runs every query slice that reads its kv slice)."""
        n_kv = self.kf.shape[0]
        busy = np.flatnonzero((self.len_q > 0) | (self.len_k > 0))
        items = np.empty((busy.size * n_kv, 2), dtype=np.int64)
        items[:, 0] = np.repeat(busy, n_kv)
        items[:, 1] = np.tile(np.arange(n_kv), busy.size)
        counts = np.bincount(self.kv_index, minlength=n_kv)
        cost = (self.len_q * self.len_k)[items[:, 0]] * counts[items[:, 1]]
        return items, cost


def _deal(cost, n_workers):
    """Items largest first, dealt back and forth (0, 1, .., n-1, n-1, .., 0, 0, ..) to the
    workers: (the item order grouped by worker, int64 start of each worker's items)."""
    order = np.argsort(-cost, kind="stable")
    position = np.arange(order.size)
    column = position % n_workers
    worker = np.where((position // n_workers) % 2 == 0, column, n_workers - 1 - column)
    by_worker = np.argsort(worker, kind="stable")
    counts = np.bincount(worker, minlength=n_workers)
    return order[by_worker], np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _mod_heads(packed):
    """H, the number of query slices: the user functions' b is the sequence, h the slice."""
    if len(packed.lead) > 1:
        raise ValueError(
            "score_mod and mask_mod take packed q of shape (H, T_q, E) or (T_q, E) (b is "
            f"the sequence, h the head), got leading dimensions {packed.lead}"
        )
    return packed.qf.shape[0]


def _bands(packed, seq):
    """The band fields of the items of sequences ``seq``."""
    bands = packed.packing.bands[seq]
    return dict(offset=bands[:, 0], left=bands[:, 1], right=bands[:, 2])


def _flex_forward(packed, mods):
    """The forward of :func:`flash_attention_varlen` with score_mod / mask_mod: one item per
    (sequence, query slice, query tile), largest first, indices from the sequence's start."""
    n_heads = _mod_heads(packed)
    tiles = flash_tiles(int(packed.len_k.max(initial=0)), packed.band, backward=False)
    items, cost = packed.forward_items(tiles.block_q)
    seq, bh, i0, i1 = items[np.argsort(-cost, kind="stable")].T
    table = item_table(
        FLEX_FORWARD_ITEM,
        bh=bh,
        kv=packed.kv_index[bh],
        out=bh,
        b=seq,
        h=bh % n_heads,
        qt=i0 // tiles.block_q,
        i0=i0,
        row0=packed.cu_q[seq] + i0,
        rows=i1 - i0,
        k_row0=packed.cu_k[seq],
        k_lo=0,
        k_hi=packed.len_k[seq],
        **_bands(packed, seq),
    )
    n_bh = packed.qf.shape[0]
    with blas_one_thread(), serial_below(packed.work, config.FLASH_SERIAL_WORK):
        return run_forward(packed.qf, packed.kf, packed.vf, table, n_bh, tiles, mods, packed.dtype)


def _flex_backward(packed, of, lf, gf, mods):
    """The backward of :func:`flash_attention_varlen` with score_mod / mask_mod: one item per
    (sequence, key/value slice, key-tile group), largest first."""
    n_heads = _mod_heads(packed)
    longest = int(packed.len_k.max(initial=0))
    pairs, cost = packed.backward_items()
    block_k = flash_tiles(longest, packed.band, backward=True).block_k
    n_groups = backward_groups(pairs.shape[0], -(-longest // block_k), packed.qf.nbytes)
    tiles = flash_tiles(longest, packed.band, backward=True, n_groups=n_groups)
    seq, kv = np.repeat(pairs[np.argsort(-cost, kind="stable")], n_groups, axis=0).T
    table = item_table(
        FLEX_BACKWARD_ITEM,
        kv=kv,
        group=np.tile(np.arange(n_groups), pairs.shape[0]),
        b0=seq,
        q_row0=packed.cu_q[seq],
        n_q=packed.len_q[seq],
        k_row0=packed.cu_k[seq],
        n_k=packed.len_k[seq],
        **_bands(packed, seq),
    )
    scale = packed.score.scale
    arrays = (packed.qf, packed.kf, packed.vf, of, lf, gf, packed.kv_index, n_heads, table, scale)
    with blas_one_thread(), serial_below(packed.work, config.FLASH_SERIAL_WORK):
        grads = run_backward(*arrays, tiles, mods, packed.dtype)
        if mods.args_grad is None:
            return grads, None
        return grads, run_args_backward(*arrays[:-1], tiles, mods, packed.dtype)


def _run(kernel, device, packed, items, cost, arrays, dropout, tiles):
    """``kernel(*arrays, packing, work, score, dropout, tiles)`` with the items dealt to the
    threads, BLAS on one thread and one numba thread for small work; the results on
    the host.

    The GPU twin takes the same arguments (its grid deals the work, so it ignores
    ``work``) and gives device arrays, which are copied back.
    """
    if device != "cpu":
        results = kernel(*arrays, packed.packing, Work(items, None), packed.score, dropout, tiles)
        return tuple(to_host(a) for a in results)
    import numba

    with blas_one_thread(), serial_below(packed.work, config.FLASH_SERIAL_WORK):
        order, worker_start = _deal(cost, numba.get_num_threads())
        work = Work(np.ascontiguousarray(items[order]), worker_start)
        return kernel(*arrays, packed.packing, work, packed.score, dropout, tiles)


def flash_attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    causal=False,
    scale=None,
    return_lse=False,
    enable_gqa=False,
    window=None,
    causal_alignment="top_left",
    softcap=None,
    dropout_p=0.0,
    random_state=None,
    device="cpu",
    *,
    score_mod=None,
    mask_mod=None,
    block_mask=None,
    mod_args=(),
):
    """Blocked attention over sequences packed along the sequence axis.

    For sequence s with queries Q_s (rows cu_seqlens_q[s] .. cu_seqlens_q[s+1] - 1)
    and keys/values K_s, V_s (rows cu_seqlens_k[s] ..):

        out[Q_s] = flash_attention(Q_s, K_s, V_s, <the same keywords>)

    With ``score_mod`` / ``mask_mod`` (programmable attention, as in
    :func:`nbattn.flash_attention` and PyTorch's FlexAttention on a jagged batch),
    for query i and key j of sequence s, both counted from the sequence's start::

        s_ij = score_mod(scale q_i . k_j, s, h, i, j, *mod_args)
        s_ij = -inf  where not mask_mod(s, h, i, j, *mod_args)

    so b is the sequence's index in the pack and h the query head, and a causal,
    ALiBi or sliding-window function means what it means on a padded batch:
    sequence s gives ``flash_attention(Q_s[None], K_s[None], V_s[None],
    score_mod=..., mask_mod=...)`` with b = s in place of 0.

    Parameters
    ----------
    q, k, v : array_like (..., T_q, E), (..., T_k, E), (..., T_k, Ev)
        The packed sequences; the leading dimensions (heads) broadcast.
        float32 stays float32 when all three are float32, else float64.
    cu_seqlens_q, cu_seqlens_k : int arrays (n_seqs + 1,)
        Offsets of the sequences: start at 0, non-decreasing, end at T_q
        (T_k). Equal neighbours are empty sequences.
    max_seqlen_q, max_seqlen_k : int, optional
        The longest sequence (FlashAttention's arguments): checked to be at
        least that, otherwise unused (the lengths come from the offsets).
    causal, scale, return_lse, enable_gqa, window, causal_alignment, softcap
        As in :func:`nbattn.flash_attention`, per sequence (a bottom-right
        alignment aligns each sequence's last query with its last key).
    dropout_p, random_state
        As in :func:`nbattn.flash_attention`, with the packed indices in the
        dropout counter (see the module notes).
    device : "cpu", "cuda" or "auto"
        Where the varlen kernels run (``kernels_for("varlen", device)``; "auto"
        picks a CUDA GPU when numba sees one). Inputs and results are host
        arrays on either device.
    score_mod : function ``score_mod(score, b, h, q_idx, kv_idx, *mod_args) -> float``, optional
        As in :func:`nbattn.flash_attention`, with b the sequence and q_idx,
        kv_idx counted from the sequence's start (above); q must then be
        (H, T_q, E) or (T_q, E) (h = 0). An array indexed by b has a row per
        sequence (``n_seqs``); one indexed by position needs the longest
        sequence's length. CPU only; not with ``softcap`` or ``dropout_p``.
    mask_mod : function ``mask_mod(b, h, q_idx, kv_idx, *mod_args) -> bool``, optional
        True where query q_idx of sequence b may attend to key kv_idx (both from
        the sequence's start); nothing attends across sequences in any case.
    block_mask : None
        Refused: a block mask classifies the tiles of one (B, H, L, S) rectangle,
        while packed sequences have lengths, and tiles, of their own; it would be
        a table over the longest sequence's square for every sequence, evaluated
        mostly where no sequence has entries. ``mask_mod`` is evaluated per element
        on the tiles visited, and ``causal`` / ``window`` skip the tiles outside
        each sequence's band; for tile skipping by an arbitrary mask, pad the
        batch and use :func:`nbattn.flash_attention` with a block mask.
    mod_args : tuple of arrays and numbers
        The trailing arguments of ``score_mod`` and ``mask_mod``, as in
        :func:`nbattn.flash_attention`.

    Returns
    -------
    out : ndarray (..., T_q, Ev), or ``(out, lse)`` with lse (..., T_q) float64.
        Queries of a sequence without keys get zeros and lse = -inf.
    """
    return_lse = check_bool(return_lse, "return_lse")
    kw = check_keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p)
    mods = None
    if uses_flex(score_mod, mask_mod, block_mask, mod_args=mod_args):
        entry = "flash_attention_varlen"
        mods = check_mods(score_mod, mask_mod, block_mask, mod_args, None, kw, None, entry)
        check_on_cpu(device, q, k, v)
    else:
        device = device_for(device, q, k, v)
    packed = _Packed(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        kw,
        scale,
        (),
        base2=mods is None,
    )
    t_q, t_k = packed.qf.shape[1], packed.kf.shape[1]
    # values near the top of the range: scaled per slice as in flash_attention
    scales = value_scales(packed.vf, int(packed.len_k.max(initial=0)))
    scale_values(packed.vf, scales)
    if mods is not None:
        out, lse = _flex_forward(packed, mods)
    else:
        dropout = dropout_words(kw.dropout_p, random_state, t_q, t_k)
        tiles = varlen_tiles(backward=False)
        items, cost = packed.forward_items(tiles.block_q)
        arrays = (packed.qf, packed.kf, packed.vf, packed.kv_index)
        kernel = kernels_for("varlen", device).varlen_forward
        out, lse = _run(kernel, device, packed, items, cost, arrays, dropout, tiles)
    unscale_output(out, scales, packed.kv_index)
    out = out.reshape(packed.lead + (t_q, packed.vf.shape[2]))
    return (out, lse.reshape(packed.lead + (t_q,))) if return_lse else out


def flash_attention_varlen_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    causal=False,
    scale=None,
    enable_gqa=False,
    window=None,
    causal_alignment="top_left",
    softcap=None,
    dropout_p=0.0,
    random_state=None,
    device="cpu",
    *,
    score_mod=None,
    mask_mod=None,
    block_mask=None,
    mod_args=(),
    score_mod_grad=None,
    score_mod_args_grad=None,
):
    """Gradients of :func:`flash_attention_varlen`: ``(dq, dk, dv)``, and ``(dq, dk, dv,
    dmod_args)`` when ``score_mod_args_grad`` is given.

    Per sequence the gradients of :func:`nbattn.flash_attention_backward`
    (see there for the formulas), packed as the inputs are. ``out`` and
    ``lse`` are the forward's (``return_lse=True``); with ``dropout_p > 0``
    ``random_state`` must be the int seed the forward used (the mask is
    regenerated from it). Gradients are summed over broadcast leading
    dimensions, and over the query heads sharing a key/value head under
    ``enable_gqa``. ``score_mod``, ``mask_mod``, ``mod_args`` (and the refused
    ``block_mask``) as in the forward call, with the index convention there;
    the derivative of ``score_mod`` is taken by the complex step, or given as
    ``score_mod_grad``, as in :func:`nbattn.flash_attention_backward`; so are the
    gradients of the ``mod_args`` arrays with ``score_mod_args_grad`` (``b`` the
    sequence, ``q_idx`` and ``kv_idx`` counted from its start, sums over all
    sequences).
    """
    kw = check_keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p)
    mods = None
    if uses_flex(score_mod, mask_mod, block_mask, score_mod_grad, mod_args, score_mod_args_grad):
        entry = "flash_attention_varlen"
        mods = check_mods(
            score_mod,
            mask_mod,
            block_mask,
            mod_args,
            score_mod_grad,
            kw,
            None,
            entry,
            score_mod_args_grad=score_mod_args_grad,
        )
        check_on_cpu(device, q, k, v, out, lse, grad_out)
    else:
        device = device_for(device, q, k, v, out, lse, grad_out)
    packed = _Packed(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        kw,
        scale,
        (out, grad_out),
        base2=mods is None,
    )
    t_q, t_k = packed.qf.shape[1], packed.kf.shape[1]
    out, lse, grad_out = check_forward_results(
        out, lse, grad_out, packed.lead, t_q, packed.vf.shape[2], packed.dtype
    )
    of = flat_batch(out, packed.lead, packed.dtype)
    lf = np.ascontiguousarray(lse.reshape(-1, t_q), dtype=np.float64)
    gf = flat_batch(grad_out, packed.lead, packed.dtype)
    d_args = None
    if mods is not None:
        (dq, dk, dv), d_args = _flex_backward(packed, of, lf, gf, mods)
    else:
        dropout = dropout_words(kw.dropout_p, random_state, t_q, t_k, for_backward=True)
        items, cost = packed.backward_items()
        arrays = (packed.qf, packed.kf, packed.vf, of, lf, gf, packed.kv_index)
        tiles = varlen_tiles(backward=True)
        kernel = kernels_for("varlen", device).varlen_backward
        dq, dk, dv = _run(kernel, device, packed, items, cost, arrays, dropout, tiles)
    q_shape, k_shape, v_shape = packed.shapes
    grads = (
        unbroadcast(dq.reshape(packed.lead + dq.shape[1:]), q_shape),
        unbroadcast(dk.reshape(packed.kv_lead + dk.shape[1:]), k_shape),
        unbroadcast(dv.reshape(packed.kv_lead + dv.shape[1:]), v_shape),
    )
    return grads if d_args is None else grads + (d_args,)
