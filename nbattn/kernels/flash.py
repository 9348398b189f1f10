"""Blocked (FlashAttention-style) scaled dot-product attention on the CPU.

For query slice ``bh`` (a flattened batch*head index) and its key/value
slice ``kv = kv_index[bh]`` (grouped-query attention and broadcast leading
dimensions share key/value slices without copies), the forward kernel
computes

    s_ij   = cap(scale q_i . k_j) + M_ij + a (j - i)
    out_i  = sum_j drop_ij softmax_j(s_ij) v_j,     lse_i = log sum_j exp(s_ij)

over the admissible keys  i + offset - left <= j <= i + offset + right
(the band; causal attention is right = 0, torch's top-left ``is_causal`` is
offset = 0, FlashAttention-2's bottom-right alignment offset = S - L), where

* cap(x) = c tanh(x / c) when a softcap c > 0 is given (FlashAttention-2's
  order: on the scaled score, before the mask), else x;
* M is an additive mask (``-inf`` = excluded) held un-expanded as
  (BM, LM, SM) with LM in {1, L}, SM in {1, S} and ``mask_index[bh]`` its
  slice: a key-padding mask is (B, 1, S) and costs nothing per query;
* a is an optional ALiBi slope per query slice;
* drop_ij is 0 for dropped weights and 1 / (1 - p) for kept ones, decided
  by ``nbattn.kernels.dropout.keep`` from the seed and the weight's position
  (no stored mask; the softmax normaliser and lse are taken BEFORE dropout).

It works in base 2: the caller passes q, M, a and c multiplied by log2(e)
(and q by the scale), so the kernel sees t_ij = s_ij log2(e) and uses
exp(s) = 2**t, whose range reduction is exact (``exp2`` below is 1/3
cheaper than ``fast_exp`` in the softmax loop). The caller
(``nbattn.flash``) keeps every base-2 score within the dtype's range.

Queries are cut into tiles of ``block_q`` rows and keys into tiles of
``block_k`` (tile t covers [t*block, (t+1)*block)); for every pair of tiles
the score tile Q K^T and the product P V are BLAS GEMM calls
(``nbattn.kernels.blas.gemm``; P V accumulates into ``acc`` with beta = 1),
and the online softmax between them -- row maximum ``m``, row sum ``l``,
rescaling of the accumulator by 2**(m_old - m_new), deferred normalisation
-- is a vectorised loop with the inlined ``exp2`` that overwrites the scores
with the weights (one tile of scratch per thread, which stays in L2 with the
K and V tiles). A row keeps its reference maximum while a tile's weights sum
to at most ``REBASE_SUM``; a larger sum up to ``REBASE_EXACT_SUM`` raises the
reference by a power of two (weights, sum and accumulator scaled exactly),
and beyond it the row is scored again and rebased on its maximum; such a row
then takes each next tile's maximum first (no second scoring) until a tile
stays at or below its reference (scores that climb along the keys, an ALiBi
bias towards later keys, would otherwise be scored twice in every tile).
Memory is O(threads * block_q * block_k) for scratch plus the output. Tiles
outside the band are never visited (a window costs O(L * window) work), and
tiles whose mask entries are all ``-inf`` are skipped through ``mask_live``,
one flag per (mask slice, query tile, key tile) precomputed by
:func:`mask_tile_live` (one query tile when LM = 1, one key tile when SM = 1).
lse is returned in natural units, lse = m ln 2 + log l.

The backward kernel recomputes P tile by tile from the saved ``lse``:

    P    = 2**(T - lse log2 e)          Z = drop (0 or 1 / (1 - p))
    dV   = (P o Z)^T dO                 dP = (dO V^T) o Z
    D_i  = sum_c dO_ic O_ic             dS = P o (dP - D) o cap'
    dQ   = scale dS K                   dK = scale dS^T Q

with cap' = 1 - tanh^2(x / c) under a softcap, else 1. (dK is computed as
ln 2 dS^T Q' with Q' the base-2 queries.) Five GEMMs per tile pair (the
forward has two): S = Q (K^T) and dP = dO (V^T) as A B products on K^T and
V^T written once per key tile, dV += P^T dO and dK += dS^T Q as A^T B, and
dQ += dS K, the three accumulating in place (beta = 1). Work items are
(key/value slice, key-tile group): each owns its dK and dV rows and loops
over every query slice that reads it (the head group of grouped-query
attention), so dK and dV are summed over the group without atomics; dQ is
accumulated per group in a buffer of its own and the groups are summed at
the end.

Arguments shared by both kernels (the varlen entries call them per
sequence with slices of shape (1, n, E), and the CUDA twins take the same),
the optional terms in the typed groups of ``nbattn._core.attn_groups``:

    q          (BH, L, E)   user q * scale * log2(e), C-contiguous
    k, v       (BKV, S, E), (BKV, S, Ev)
    kv_index   (BH,) int64  key/value slice of each query slice
    bias       Bias         mask (BM, LM, SM) base-2 additive, shape (0, 1, 1)
                            = none; mask_index (BH,) its slice per query
                            slice; mask_live (BM, QT, KT) uint8 from
                            :func:`mask_tile_live` with the kernel's own tile
                            sizes (ignored without mask); slopes (BH,) base-2
                            ALiBi slopes, shape (0,) = none
    band       Band         offset, left, right (a side >= L + S is unbounded)
    score      ScoreTransform
                            scale (the backward's dQ factor), softcap
                            c * log2(e) (0 = none)
    dropout    Dropout      seed, threshold (0 = none), n_rows, n_cols, row0,
                            col0: the counter of weight (bh, i, j) is
                            (bh * n_rows + row0 + i) * n_cols + col0 + j
                            (n_rows = L, n_cols = S, row0 = col0 = 0 for a
                            plain call; packed totals and offsets for varlen);
                            keep_scale 1 / (1 - p)
    tiles      Tiles        block_q, block_k; n_groups key-tile groups per
                            key/value slice (backward)

The public entries :func:`flash_forward` and :func:`flash_backward` hand the
item kernels ``None`` for a group that does nothing (no mask and no ALiBi,
no softcap, no dropout), and every use of a group sits under an ``is None``
test of the argument, which numba decides when it compiles: a plain call
compiles none of the mask, softcap and dropout code (about a third of the
forward's first compile).

All floating arrays share one dtype (float32 or float64); tiles are
accumulated in it, ``m``, ``l`` and ``lse`` are float64. BLAS must be held
to one thread while these kernels run (a GEMM on the work items' threads otherwise
starts BLAS threads that fight the numba threads). A row with no admissible
key gets zeros and lse = -inf, and zero gradients.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config
from .._core.numeric import LOG2E
from .base2 import LN2, exp2, tanh_real
from .blas import gemm
from .dropout import keep
from .fastmath import like
from .items import next_item, run_items
from .masks import mask_tile_live  # noqa: F401 (attn.flash calls it through the "flash" op)
from .softmax import row_max


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def exp2_shift_sum(row, shift):
    """In place ``row[j] <- 2**(row[j] - shift)``; returns the sum of the new values.

    The base-2 twin of ``nbattn.kernels.softmax.exp_shift_sum``: the flash
    kernels carry a factor log2(e) in their scores, so ``exp2`` (one range
    reduction, exact) replaces ``fast_exp`` (two-step ln 2 reduction).
    """
    total = like(0.0, row)
    for j in range(row.shape[0]):
        w = exp2(row[j] - shift)
        row[j] = w
        total += w
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _weights_from_lse(row, bias, shift):
    """The backward's weights, in place: ``row[j] <- 2**min(row[j] + bias[j] - shift, 0)``
    (``bias`` None: no term); returns their sum. A weight is at most 1: a positive
    exponent is the rounding of a huge score against its row's lse (float32 scores
    beyond ~1e7, float64 beyond ~1e15), where 2**x would give inf or a value above 1."""
    total = like(0.0, row)
    zero = like(0.0, row)
    for j in range(row.shape[0]):
        x = row[j]
        if bias is not None:
            x += bias[j]
        w = exp2(min(x - shift, zero))
        row[j] = w
        total += w
    return total


#: A row's reference maximum m (base 2) is kept while the weights 2**(t - m) of
#: a new tile sum to at most REBASE_SUM (so none exceeds it): the exponentials
#: then need no maximum pass of their own (the one-pass path of the forward;
#: LLVM does not vectorise a loop that keeps a maximum and a sum together).
#: Beyond it the reference is raised: by a power of two up to REBASE_EXACT_SUM,
#: else by scoring the row again against its new maximum.
REBASE_SUM = 2.0**20


#: Up to this sum the weights of a tile computed against a too-low reference
#: maximum are rebased exactly, by a power of two, instead of being scored again:
#: no weight can have saturated (``exp2`` clamps at 2**127 in float32).
REBASE_EXACT_SUM = 2.0**100


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _scale_row(row, acc_row, factor):
    """``row *= factor``, ``acc_row *= factor`` (a power of two: exact)."""
    f_row = like(factor, row)
    for j in range(row.shape[0]):
        row[j] *= f_row
    f_acc = like(factor, acc_row)
    for c in range(acc_row.shape[0]):
        acc_row[c] *= f_acc


#: need_band for one row: a bool, not the literal True (numba compiles a function once
#: more for a literal argument)
_ALWAYS = np.bool_(True)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _score_row(q_tile, k_tile, st, r, bh, i0, j0, bias, band, score):
    """Row r of the score tile ``st`` again: q_r K^T with its softcap, mask, ALiBi and band
    (a mask with one entry per key excepted, as in the tile pass)."""
    # row r as a C-contiguous (1, nb) tile, the type of ``st``: ``st[r : r + 1]`` would
    # compile gemm and _tile_terms once more for another layout
    nb = st.shape[1]
    one = st.reshape(st.size)[r * nb : (r + 1) * nb].reshape((1, nb))
    gemm(q_tile[r : r + 1], k_tile, one, False, True, 0.0)
    _tile_terms(one, one, bh, i0 + r, j0, bias, band, score, _ALWAYS, False, False)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _add_row(row, bias):
    """``row[j] += bias[j]``."""
    for j in range(row.shape[0]):
        row[j] += bias[j]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _exp2_shift_sum_masked(row, bias, shift):
    """In place ``row[j] <- 2**(row[j] + bias[j] - shift)``; returns the sum."""
    total = like(0.0, row)
    for j in range(row.shape[0]):
        w = exp2(row[j] + bias[j] - shift)
        row[j] = w
        total += w
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _tile_order(t, n):
    """Interleave heavy and light causal tiles: 0, n-1, 1, n-2, ..."""
    half = t // 2
    if t % 2 == 0:
        return half
    return n - 1 - half


@njit(fastmath=config.FASTMATH, cache=config.CACHE, error_model="numpy")
def _tanh_in_place(row, inv_cap, cap, saved, save):
    """``row[j] <- cap * tanh(row[j] * inv_cap)``; ``saved[j] <- tanh(...)`` when ``save``,
    by :func:`tanh_real` (vectorised: numba's ``np.tanh`` is a scalar libm call)."""
    for j in range(row.shape[0]):
        th = tanh_real(row[j] * inv_cap)
        row[j] = cap * th
        if save:
            saved[j] = th


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _bias_terms(st, bh, i0, j0, bias, add_keys):
    """The mask (per-key masks only with ``add_keys``) and ALiBi terms of a score tile."""
    mb, nb = st.shape
    mask, mask_index, _, slopes = bias
    if mask.shape[0] > 0 and (add_keys or mask.shape[2] == 1):
        mi = mask_index[bh]
        per_row = mask.shape[1] > 1
        per_key = mask.shape[2] > 1
        for r in range(mb):
            m_row = mask[mi, i0 + r if per_row else 0]
            row = st[r]
            if per_key:
                keys_mask = m_row[j0 : j0 + nb]  # a slice: m_row[j0 + j] would not vectorise
                for j in range(nb):
                    row[j] += keys_mask[j]
            else:
                b = m_row[0]
                for j in range(nb):
                    row[j] += b
    if slopes.shape[0] > 0:
        slope = slopes[bh]
        for r in range(mb):
            row = st[r]
            base = slope * like(j0 - (i0 + r), st)
            for j in range(nb):
                row[j] += base + slope * like(j, st)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _tile_terms(st, th, bh, i0, j0, bias, band, score, need_band, save_th, add_keys):
    """Softcap, mask, ALiBi and band of one score tile ``st`` (rows i0.., keys j0..), in place.

    ``th`` receives tanh of the capped scores when ``save_th`` (the backward's
    cap' = 1 - th**2). A mask with one entry per key (SM = S) is added only
    when ``add_keys``; otherwise the caller fuses it into its exponential pass.
    ``bias`` or ``score`` None: no such terms (their code is not compiled).
    """
    mb, nb = st.shape
    if score is not None:
        softcap = score.softcap
        if softcap > 0.0:
            cap = like(softcap, st)
            inv_cap = like(1.0 / softcap, st)
            for r in range(mb):
                _tanh_in_place(st[r], inv_cap, cap, th[r], save_th)
    if bias is not None:
        _bias_terms(st, bh, i0, j0, bias, add_keys)
    if need_band:
        neg = like(-np.inf, st)
        offset, left, right = band
        for r in range(mb):
            row = st[r]
            centre = i0 + r + offset - j0
            lo = min(max(centre - left, 0), nb)
            hi = min(max(centre + right + 1, 0), nb)
            for j in range(lo):
                row[j] = neg
            for j in range(hi, nb):
                row[j] = neg


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _needs_band(i0, mb, j0, nb, band):
    """Whether some entry of the tile (rows i0..i0+mb-1, keys j0..j0+nb-1) is outside the band."""
    offset, left, right = band
    return j0 < i0 + mb - 1 + offset - left or j0 + nb - 1 > i0 + offset + right


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _tile_is_live(bias, bh, qt, kt):
    """False when the mask excludes every entry of tile (qt, kt) of query slice bh."""
    if bias is None:
        return True
    mask, mask_index, mask_live, _ = bias
    if mask.shape[0] == 0:
        return True
    mq = qt if mask.shape[1] > 1 else 0
    mk = kt if mask.shape[2] > 1 else 0
    return mask_live[mask_index[bh], mq, mk] != 0


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _key_row(bias, bh, i, j0, nb):
    """The per-key mask entries of row i for the keys j0 .. j0 + nb - 1."""
    mask, mask_index, _, _ = bias
    return mask[mask_index[bh], i if mask.shape[1] > 1 else 0, j0 : j0 + nb]


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _key_mask(bias):
    """Whether ``bias`` holds a mask with an entry per key (fused into the exponentials)."""
    if bias is None:
        return False
    mask = bias.mask
    return mask.shape[0] > 0 and mask.shape[2] > 1


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _drop_row(row, dropout, bh, i, j0):
    """``row[j] <- row[j] * keep`` (1 or 0) with the counters of entries (bh, i, j0 + j):
    the forward's weights stay unscaled (1 / (1 - p) is applied with the normaliser)."""
    seed, threshold = dropout.seed, dropout.threshold
    counter0 = _row_counter(dropout, bh, i, j0)
    zero = like(0.0, row)
    for j in range(row.shape[0]):
        if not keep(seed, counter0 + np.uint64(j), threshold):
            row[j] = zero


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _row_counter(dropout, bh, i, j0):
    """The dropout counter of entry (bh, i, j0): (bh n_rows + row0 + i) n_cols + col0 + j0."""
    row = np.uint64(bh) * dropout.n_rows + dropout.row0 + np.uint64(i)
    return row * dropout.n_cols + dropout.col0 + np.uint64(j0)


def flash_forward(q, k, v, kv_index, bias, band, score, dropout, tiles):
    """Blocked attention forward; returns ``(out, lse)``.

    out (BH, L, Ev) in the input dtype, lse (BH, L) float64 in natural units.
    See the module docstring for the formula and the (base-2) arguments. The
    work items (a query tile of one slice) run on :func:`nbattn.kernels.items.run_items`.
    """
    n_bh, n_q, _ = q.shape
    out = np.empty((n_bh, n_q, v.shape[2]), dtype=q.dtype)
    lse = np.empty((n_bh, n_q), dtype=np.float64)
    bias, score, dropout = used_terms(bias, score, dropout)
    run_items(forward_items, q, k, v, kv_index, bias, band, score, dropout, tiles, out, lse)
    return out, lse


def used_terms(bias, score, dropout):
    """``(bias, score, dropout)`` with None for each group that does nothing: no mask
    and no slopes, softcap 0, no drop and no scale (the module docstring: their code
    then does not compile)."""
    if bias is not None and bias.mask.shape[0] == 0 and bias.slopes.shape[0] == 0:
        bias = None
    if score is not None and not score.softcap > 0.0:
        score = None
    # a p whose threshold rounds to 0 drops nothing but still scales by 1 / (1 - p)
    if dropout is not None and not dropout.threshold > 0 and dropout.keep_scale == 1.0:
        dropout = None
    return bias, score, dropout


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def forward_items(counter, q, k, v, kv_index, bias, band, score, dropout, tiles, out, lse):
    """The work items that ``counter`` hands this thread (query tile outer, slice inner:
    consecutive items read one mask block, shared by the heads of a batch entry, while
    it is still in cache): their rows of ``out`` and ``lse``."""
    n_bh, n_q, _ = q.shape
    n_qt = (n_q + tiles.block_q - 1) // tiles.block_q
    while True:
        item = next_item(counter)
        if item >= n_bh * n_qt:
            return
        bh = np.int64(item % n_bh)
        qt = np.int64(_tile_order(item // n_bh, n_qt))
        keep_scale = 1.0 if dropout is None else dropout.keep_scale
        block_q, block_k = tiles.block_q, tiles.block_k
        n_q = q.shape[1]
        n_k = k.shape[1]
        d_v = v.shape[2]
        offset, left, right = band
        key_mask = _key_mask(bias)  # fused into the exponential pass
        i0 = qt * block_q
        mb = min(block_q, n_q - i0)
        kv = kv_index[bh]
        s_flat = np.empty(mb * block_k, dtype=q.dtype)
        acc = np.zeros((mb, d_v), dtype=q.dtype)
        m = np.full(mb, -np.inf)
        l = np.zeros(mb)
        # rows whose scores climbed past their reference in the last tile: their next tile
        # takes its maximum first instead of scoring a saturated row a second time
        climbing = np.zeros(mb, dtype=np.bool_)
        q_tile = q[bh, i0 : i0 + mb]
        j_first = max(i0 + offset - left, 0)
        j_last = min(i0 + mb - 1 + offset + right, n_k - 1)
        kt_first = j_first // block_k
        kt_last = j_last // block_k if j_last >= j_first else kt_first - 1
        for kt in range(kt_first, kt_last + 1):
            if not _tile_is_live(bias, bh, qt, kt):
                continue
            j0 = kt * block_k
            nb = min(block_k, n_k - j0)
            k_tile = k[kv, j0 : j0 + nb]
            # the weights P overwrite the scores S in place: one tile of scratch, which
            # stays in the core's L2 cache with the K and V tiles
            st = s_flat[: mb * nb].reshape((mb, nb))
            gemm(q_tile, k_tile, st, False, True, 0.0)
            need_band = _needs_band(i0, mb, j0, nb, band)
            _tile_terms(st, st, bh, i0, j0, bias, band, score, need_band, False, False)
            for r in range(mb):
                row = st[r]
                shift = m[r]
                if shift != -np.inf and not climbing[r]:
                    # one pass: the exponentials against the kept reference maximum
                    if bias is None:
                        total = exp2_shift_sum(row, like(shift, row))
                    elif key_mask:
                        key_bias = _key_row(bias, bh, i0 + r, j0, nb)
                        total = _exp2_shift_sum_masked(row, key_bias, like(shift, row))
                    else:
                        total = exp2_shift_sum(row, like(shift, row))
                    if total <= REBASE_SUM:
                        l[r] += total
                        rebased = True
                    elif total <= REBASE_EXACT_SUM:
                        # the reference maximum is e bits too low: scale the new weights,
                        # the sum and the accumulator by 2**-e (exact, no weight saturated)
                        e = math.frexp(total)[1]
                        _scale_row(row, acc[r], math.ldexp(1.0, -e))
                        l[r] = math.ldexp(l[r] + total, -e)
                        m[r] = shift + e
                        rebased = True
                    else:
                        # weights may have saturated at 2**127 (2**1023): score the row
                        # again and rebase it on its maximum below
                        _score_row(q_tile, k_tile, st, r, bh, i0, j0, bias, band, score)
                        climbing[r] = True
                        rebased = False
                    if rebased:
                        if dropout is not None:
                            _drop_row(row, dropout, bh, i0 + r, j0)
                        continue
                # the row's first admissible tile, or a saturated jump: rebase on the maximum
                if bias is not None:
                    if key_mask:
                        _add_row(row, _key_row(bias, bh, i0 + r, j0, nb))
                top = np.float64(row_max(row))
                if top == -np.inf:  # nothing admissible in this tile (nor yet, if shift is -inf)
                    row[:] = 0.0
                    continue
                if climbing[r] and top <= shift:  # the climb stopped: keep the reference
                    climbing[r] = False
                    top = shift
                rescale = np.exp2(shift - top)
                l[r] = l[r] * rescale + exp2_shift_sum(row, like(top, row))
                if rescale != 1.0:
                    factor = like(rescale, acc)
                    acc_row = acc[r]
                    for c in range(d_v):
                        acc_row[c] *= factor
                m[r] = top
                if dropout is not None:
                    _drop_row(row, dropout, bh, i0 + r, j0)
            gemm(st, v[kv, j0 : j0 + nb], acc, False, False, 1.0)
        for r in range(mb):
            if l[r] > 0.0:
                inv = like(keep_scale / l[r], acc)
                for c in range(d_v):
                    out[bh, i0 + r, c] = acc[r, c] * inv
                lse[bh, i0 + r] = m[r] * LN2 + np.log(l[r])
            else:
                out[bh, i0 + r, :] = 0.0
                lse[bh, i0 + r] = -np.inf


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _transpose_into(tile, flat):
    """``tile.T`` (c, r) written into the front of ``flat`` and returned as a C-contiguous view."""
    rows, cols = tile.shape
    out = flat[: rows * cols].reshape((cols, rows))
    for r in range(rows):
        row = tile[r]
        for c in range(cols):
            out[c, r] = row[c]
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def backward_rows(out, dout, lse):
    """``(delta, lse_t)`` of a backward pass, both (BH, L) in ``out``'s dtype:
    delta_i = dO_i . O_i (summed in float64) and lse_t = lse * log2(e) (``lse``
    float64, natural units).
    The first pass of :func:`flash_backward` and of the programmable kernels'
    backward (``nbattn.kernels.flex``). Serial, as :func:`sum_groups`: a pass over
    the rows, small beside the backward's, and safe to call from any thread and from
    inside a parallel loop (varlen's), whatever numba's threading layer.
    """
    n_bh, n_q, d_v = out.shape
    delta = np.empty((n_bh, n_q), dtype=out.dtype)
    lse_t = np.empty((n_bh, n_q), dtype=out.dtype)
    for row in range(n_bh * n_q):
        bh = row // n_q
        i = row % n_q
        total = 0.0
        for c in range(d_v):
            total += np.float64(dout[bh, i, c]) * np.float64(out[bh, i, c])
        delta[bh, i] = total
        lse_t[bh, i] = lse[bh, i] * LOG2E
    return delta, lse_t


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def sum_groups(part, scale):
    """``scale * part.sum(axis=0)`` for ``part`` (G, BH, L, E), the per-group dQ buffers
    of a backward pass, in ``part``'s dtype and group order: the last pass of
    :func:`flash_backward` and of the programmable kernels' backward."""
    n_groups, n_bh, n_q, d = part.shape
    factor = like(scale, part)
    dq = np.empty((n_bh, n_q, d), dtype=part.dtype)
    for row in range(n_bh * n_q):
        bh = row // n_q
        i = row % n_q
        for c in range(d):
            total = part[0, bh, i, c]
            for g in range(1, n_groups):
                total += part[g, bh, i, c]
            dq[bh, i, c] = total * factor
    return dq


def flash_backward(q, k, v, out, lse, dout, kv_index, bias, band, score, dropout, tiles):
    """Blocked attention backward; returns ``(dq, dk, dv)`` in the input dtype.

    dq has q's shape (BH, L, E); dk and dv have k's and v's (BKV, S, .),
    summed over the query slices that share them. ``q`` is q_user * scale *
    log2(e) as in the forward, so dK = ln 2 dS^T q and dQ = scale dS K
    (``score.scale``). ``lse`` (BH, L) in natural units (float64).
    ``tiles.n_groups`` key-tile groups per key/value slice are the work items
    (:func:`nbattn.kernels.items.run_items`), each with its own dQ buffer
    (summed in group order by :func:`sum_groups`); ``bias.mask_live`` must come
    from the backward's tile sizes. See the module docstring for the other arguments.
    """
    n_bh, n_q, d = q.shape
    n_kv, n_k, _ = k.shape
    delta, lse_t = backward_rows(out, dout, lse)
    dq_part = np.zeros((tiles.n_groups, n_bh, n_q, d), dtype=q.dtype)
    dk = np.empty((n_kv, n_k, d), dtype=q.dtype)
    dv = np.empty((n_kv, n_k, v.shape[2]), dtype=q.dtype)
    scale = score.scale
    bias, score, dropout = used_terms(bias, score, dropout)
    run_items(
        backward_items,
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
    return sum_groups(dq_part, scale), dk, dv


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def backward_items(
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
):
    """The work items that ``counter`` hands this thread (key-tile group ``group`` of
    key/value slice ``kv``): their rows of dk and dv, and the group's dq buffer
    ``dq_part[group]``; ``score.scale`` is not read (the caller scales dQ)."""
    use_cap = False if score is None else score.softcap > 0.0
    block_q, block_k, n_groups = tiles
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    d_v = v.shape[2]
    dtype = q.dtype
    offset, left, right = band
    key_mask = _key_mask(bias)  # fused into the exponential pass
    n_kt = (n_k + block_k - 1) // block_k
    s_flat = np.empty(block_q * block_k, dtype=dtype)
    dp_flat = np.empty(block_q * block_k, dtype=dtype)
    th_flat = np.empty(block_q * block_k if use_cap else 1, dtype=dtype)
    dk_acc = np.empty((block_k, d), dtype=dtype)
    dv_acc = np.empty((block_k, d_v), dtype=dtype)
    kt_flat = np.empty(d * block_k, dtype=dtype)
    vt_flat = np.empty(d_v * block_k, dtype=dtype)
    neg_inf = like(-np.inf, q)
    one = like(1.0, q)
    sink = np.zeros(1, dtype=dtype)
    n_items = dk.shape[0] * n_groups
    while True:
        item = next_item(counter)
        if item >= n_items:
            return
        kv = np.int64(item // n_groups)
        group = np.int64(item % n_groups)
        for kt in range(group, n_kt, n_groups):
            j0 = kt * block_k
            nb = min(block_k, n_k - j0)
            dk_acc[:nb] = 0.0
            dv_acc[:nb] = 0.0
            k_tile = k[kv, j0 : j0 + nb]
            v_tile = v[kv, j0 : j0 + nb]
            # K^T and V^T of the tile, once for every query tile that reads it: the score
            # products Q K^T and dO V^T then run as A B (3 % faster than A B^T here)
            k_tile_t = _transpose_into(k_tile, kt_flat)
            v_tile_t = _transpose_into(v_tile, vt_flat)
            i_first = max(j0 - offset - right, 0)
            i_last = min(j0 + nb - 1 - offset + left, n_q - 1)
            qt_first = i_first // block_q
            qt_last = i_last // block_q if i_last >= i_first else qt_first - 1
            for bh in range(n_bh):
                if kv_index[bh] != kv:
                    continue
                for qt in range(qt_first, qt_last + 1):
                    if not _tile_is_live(bias, bh, qt, kt):
                        continue
                    i0 = qt * block_q
                    mb = min(block_q, n_q - i0)
                    q_tile = q[bh, i0 : i0 + mb]
                    do_tile = dout[bh, i0 : i0 + mb]
                    st = s_flat[: mb * nb].reshape((mb, nb))
                    dpt = dp_flat[: mb * nb].reshape((mb, nb))
                    tht = th_flat[: mb * nb].reshape((mb, nb)) if use_cap else st
                    gemm(q_tile, k_tile_t, st, False, False, 0.0)
                    need_band = _needs_band(i0, mb, j0, nb, band)
                    _tile_terms(st, tht, bh, i0, j0, bias, band, score, need_band, True, False)
                    p_sum = like(0.0, q)
                    for r in range(mb):
                        row = st[r]
                        shift = lse_t[bh, i0 + r]
                        if shift == neg_inf:
                            row[:] = 0.0
                        elif bias is not None and key_mask:
                            key_bias = _key_row(bias, bh, i0 + r, j0, nb)
                            p_sum += _weights_from_lse(row, key_bias, shift)
                        else:
                            # LLVM vectorises this loop only if its sum is used: kept in sink
                            p_sum += _weights_from_lse(row, None, shift)
                    sink[0] += p_sum
                    gemm(do_tile, v_tile_t, dpt, False, False, 0.0)
                    for r in range(mb):
                        row = st[r]
                        dp_row = dpt[r]
                        di = delta[bh, i0 + r]
                        if dropout is not None:
                            seed, threshold = dropout.seed, dropout.threshold
                            drop_scale = like(dropout.keep_scale, q)
                            counter0 = _row_counter(dropout, bh, i0 + r, j0)
                            for j in range(nb):
                                if keep(seed, counter0 + np.uint64(j), threshold):
                                    dp_row[j] = row[j] * (dp_row[j] * drop_scale - di)
                                    row[j] = row[j] * drop_scale
                                else:
                                    dp_row[j] = -row[j] * di
                                    row[j] = 0.0
                        else:
                            for j in range(nb):
                                dp_row[j] = row[j] * (dp_row[j] - di)
                        if use_cap:
                            th_row = tht[r]
                            for j in range(nb):
                                dp_row[j] *= one - th_row[j] * th_row[j]
                    # the three products accumulate in place (beta = 1)
                    gemm(st, do_tile, dv_acc[:nb], True, False, 1.0)
                    gemm(dpt, k_tile, dq_part[group, bh, i0 : i0 + mb], False, False, 1.0)
                    gemm(dpt, q_tile, dk_acc[:nb], True, False, 1.0)
            ln2 = like(LN2, q)
            for j in range(nb):
                for c in range(d):
                    dk[kv, j0 + j, c] = dk_acc[j, c] * ln2
            # element by element, as everywhere in the kernels: an array-to-slice assignment
            # compiles numba's shape-mismatch message (string formatting, ~6 s per kernel)
            for j in range(nb):
                for c in range(dv.shape[2]):
                    dv[kv, j0 + j, c] = dv_acc[j, c]
