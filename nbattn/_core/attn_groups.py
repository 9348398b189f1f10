"""The argument groups of the attention kernels: small typed namedtuples numba passes as tuples.

The flash, varlen and split-KV decoding kernels (``nbattn.kernels`` and their
CUDA twins in ``nbattn.cuda``, one contract on both sides) take their optional
terms in these groups instead of a long positional list. Each group fixes the
types of its fields when it is built (ints as int64, dropout words as uint64,
floats as float64), so one call site cannot compile a second specialisation
of a kernel by passing a Python int where another passed a float.
``nbattn.attn.flash_args`` builds them from the checked keywords; the kernels
read the fields by name, and the CPU kernels unpack the arrays before their
parallel loops. numba types a group as ``NamedTuple``/``NamedUniTuple`` of the
fields' types, and a kernel may build one (the varlen kernels build a band and
dropout counters per sequence).

Units are the flash kernels' (``nbattn.kernels.flash``): scores in base 2, so
q, the mask, the slopes and the softcap carry a factor log2(e).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

__all__ = [
    "FLEX_BACKWARD_ITEM",
    "FLEX_FORWARD_ITEM",
    "NO_DROPOUT",
    "Band",
    "Bias",
    "DecodeWindow",
    "Dropout",
    "KeySplit",
    "Packing",
    "ScoreTransform",
    "Tiles",
    "Work",
]


class Bias(namedtuple("Bias", ["mask", "mask_index", "mask_live", "slopes"])):
    """The additive terms M_ij + a (j - i) of the scores.

    mask : (BM, LM, SM) base-2 float (the CUDA twins also take bool, True = may
        attend), un-expanded: LM in {1, L}, SM in {1, S}; shape (0, 1, 1) = none.
    mask_index : int64 (BH,), the mask slice of each query slice.
    mask_live : uint8 (BM, QT, KT) from ``nbattn.kernels.masks.mask_tile_live`` with
        the kernel's own tile sizes (the CPU's; the CUDA twins ignore it).
    slopes : (BH,) base-2 ALiBi slopes a; shape (0,) = none.
    """

    __slots__ = ()


class Band(namedtuple("Band", ["offset", "left", "right"])):
    """The admissible keys of query i: i + offset - left <= j <= i + offset + right (int64).

    Causal attention is right = 0; offset = 0 aligns the band at the top left,
    S - L at the bottom right; a side of L + S or more is unbounded.
    """

    __slots__ = ()

    def __new__(cls, offset, left, right):
        return super().__new__(cls, int(offset), int(left), int(right))


class ScoreTransform(namedtuple("ScoreTransform", ["scale", "softcap"])):
    """How a score is formed: cap(scale q . k), cap(x) = c tanh(x / c) (float64).

    scale : the user's scale. The kernels take q already multiplied by
        scale * log2(e); the backward needs it for dQ = scale dS K.
    softcap : c * log2(e), base 2; 0 = none.
    """

    __slots__ = ()

    def __new__(cls, scale, softcap):
        return super().__new__(cls, float(scale), float(softcap))


class Dropout(
    namedtuple("Dropout", ["seed", "threshold", "n_rows", "n_cols", "row0", "col0", "keep_scale"])
):
    """The dropout of the weights: counter words (uint64) and the kept weights' factor.

    The weight (bh, i, j) is kept iff ``nbattn.kernels.dropout.keep(seed, counter,
    threshold)`` for counter = (bh * n_rows + row0 + i) * n_cols + col0 + j
    (n_rows = L, n_cols = S, row0 = col0 = 0 for a plain call; the packed
    totals and a sequence's offsets for varlen); threshold = 0 is no dropout.
    keep_scale (float64) is 1 / (1 - p).
    """

    __slots__ = ()

    def __new__(cls, seed, threshold, n_rows, n_cols, row0, col0, keep_scale):
        words = (np.uint64(w) for w in (seed, threshold, n_rows, n_cols, row0, col0))
        return super().__new__(cls, *words, float(keep_scale))


#: No dropout: threshold 0, keep_scale 1.
NO_DROPOUT = Dropout(0, 0, 0, 0, 0, 0, 1.0)


class Tiles(namedtuple("Tiles", ["block_q", "block_k", "n_groups"])):
    """How the CPU kernels cut the work (int64): query tiles of ``block_q`` rows, key tiles
    of ``block_k`` rows, and (backward) ``n_groups`` key-tile groups per key/value slice,
    each with a dQ buffer of its own. The CUDA twins tile by ``config`` instead."""

    __slots__ = ()

    def __new__(cls, block_q, block_k, n_groups=1):
        return super().__new__(cls, int(block_q), int(block_k), int(n_groups))


class Packing(namedtuple("Packing", ["cu_q", "cu_k", "bands"])):
    """Sequences packed along the rows (varlen): sequence s owns rows cu_q[s] .. cu_q[s+1] - 1
    of q and cu_k[s] .. cu_k[s+1] - 1 of k and v (int64 (n_seqs + 1,)), with the band
    ``bands[s]`` = (offset, left, right) (int64 (n_seqs, 3))."""

    __slots__ = ()


class Work(namedtuple("Work", ["items", "worker_start"])):
    """The CPU's work items dealt to its threads: int64 rows ``items``, worker w's being
    ``worker_start[w] .. worker_start[w + 1] - 1`` (the CUDA twins' grid deals the work
    and ignores this group)."""

    __slots__ = ()


class KeySplit(namedtuple("KeySplit", ["totals", "starts", "chunks", "ends", "n_splits"])):
    """The keys of split-KV decoding: ``totals[b]`` valid keys in batch row b, the keys
    [starts[b], ends[b]) that some query admits cut into ``n_splits`` chunks of
    ``chunks[b]`` keys (int64 (B,) arrays; n_splits an int)."""

    __slots__ = ()

    def __new__(cls, totals, starts, chunks, ends, n_splits):
        return super().__new__(cls, totals, starts, chunks, ends, int(n_splits))


class DecodeWindow(namedtuple("DecodeWindow", ["causal", "left", "right"])):
    """The keys a decoding query admits, in natural positions (query i of row b at
    p = totals[b] - L + i): j <= p when ``causal``, p - left <= j <= p + right; a
    negative side is unbounded (bool, int64, int64)."""

    __slots__ = ()

    def __new__(cls, causal, left, right):
        return super().__new__(cls, bool(causal), int(left), int(right))


def _int64_fields(*names):
    return np.dtype([(name, np.int64) for name in names])


#: A work item of the programmable (flex) forward kernel, one record per item: ``rows``
#: queries of query slice ``bh`` (rows ``row0 ..`` of q, out and lse; ``q_idx`` from
#: ``i0``) against the keys ``k_lo <= kv_idx < k_hi`` of key/value slice ``kv`` (kv_idx
#: at row ``k_row0 + kv_idx`` of k and v; key tiles start at ``k_lo``), written to slice
#: ``out`` of out and lse. ``b`` and ``h`` are the user functions' b and h, ``qt`` the
#: query tile in a block mask's table, (``offset``, ``left``, ``right``) the band in
#: q_idx / kv_idx units (see ``Band``). One table serves a padded batch (``row0`` =
#: ``i0``), packed sequences (rows and keys from each sequence's offsets, indices from
#: its start) and decoding (``i0`` the query's position, ``k_lo``..``k_hi`` a chunk of
#: the cache, ``out`` the chunk's slice).
FLEX_FORWARD_ITEM = _int64_fields(
    "bh", "kv", "out", "b", "h", "qt", "i0", "row0", "rows",
    "k_row0", "k_lo", "k_hi", "offset", "left", "right",
)  # fmt: skip

#: A work item of the programmable (flex) backward kernel: key-tile group ``group`` of
#: key/value slice ``kv`` in one sequence of ``n_q`` queries (rows ``q_row0 ..`` of q)
#: and ``n_k`` keys (rows ``k_row0 ..`` of k), indices from the sequence's start; the
#: user functions' b is ``b0 + bh // n_heads`` (``b0`` = 0 for a padded batch, the
#: sequence for packed ones); the band as in :data:`FLEX_FORWARD_ITEM`.
FLEX_BACKWARD_ITEM = _int64_fields(
    "kv", "group", "b0", "q_row0", "n_q", "k_row0", "n_k", "offset", "left", "right"
)
