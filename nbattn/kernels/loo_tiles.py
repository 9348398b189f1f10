"""Leave-one-out loss and gradient sums in one pass over row tiles, with BLAS.

The two-pass kernels of ``nbattn.kernels.loo`` stream one key at a time and
spend O(d) scalar work per pair on the gradient. Here a block of B query rows
holds its whole row of scores against all n keys (B x n float64, B chosen by
the caller so that the tile stays a few MB: memory O(B n + n d), never n x n),
so the softmax of each row is exact in one pass (max, exp, sum) and the
gradient of the block is one GEMM:

    s_ij = -|| z_i - z_j ||^2,  w_ij = exp(s_ij - max_j s_ij) / l_i   (j != i)
    f_i = sum_j w_ij y_j,  r_i = f_i - y_i,  g_ij = w_ij sum_c r_ic (y_jc - f_ic)

    M = sum_i sum_{j != i} g_ij (x_i - x_j)(x_i - x_j)^T
      = sum_i [ a_i x_i x_i^T - x_i b_i^T - b_i x_i^T ] + sum_j c_j x_j x_j^T
    a_i = sum_j g_ij,  b_i = sum_j g_ij x_j  (b = G X: the GEMM),  c_j = sum_i g_ij

(the same sums as ``loo.loo_grad_full``; with ``points = z`` the diagonal of M
is ``loo.loo_grad_diag``'s). The kernel returns the squared-error sum, the
row part of M, the key sums c (the caller adds X^T diag(c) X, one more GEMM)
and a flag per row that it left to the caller.

Scores. With few score dimensions k the direct difference is cheapest and
exact to (k + 3) u |s|; those tiles take their rows two at a time through two fused
passes over L1-sized chunks of keys, the softmax with reference 0 and the gradient
as dot products instead of the GEMM (``nbattn.kernels.loo_fused``). With more, the
block's scores are a GEMM on points shifted by the block's mean c_b:

    s_ij = 2 (z_i - c_b).(z_j - c_b) - |z_i - c_b|^2 - |z_j - c_b|^2   (clamped to <= 0)

whose rounding error is about (k + 3) u (|z_i - c_b|^2 + |z_j - c_b|^2). As
|z_j - c_b|^2 <= 2 |z_i - z_j|^2 + 2 |z_i - c_b|^2, and the weight carries
exp(-|z_i - z_j|^2), the error relative to the row's largest weight stays
below (k + 3) u (3 R_b^2 + 2) with R_b the block's radius; a block with
R_b^2 > ``gemm_max_radius2`` takes the direct scores. Both are float64 (float32
inputs are widened: their differences are then exact).

R_b^2 up to ``refine_max_radius2`` (the plain tiles) may still take the GEMM scores,
each row's keys near its best then scored again by differences (section "refined
GEMM scores" below).

Rows left to the caller (``far[i]``): the row's best score is below
``-config.FAR_SCORE_FLOAT64`` (or no key is admissible, n = 1): the direct
score's rounding would show, and ``loo``'s anchored two-pass kernels handle
them. Their sums here are zero.

``loo_tiles`` takes every key. Pruning is ``loo_tiles_boxed``'s (the tiles on
many rows): the keys in k-d order and a tile's keys chosen by leaf bounding
boxes in every score coordinate (``nbattn.kernels.kd_order``, whose ``kd_order``
and ``leaf_boxes`` this op module also provides, for the caller to build them).

Both entries hand each block of rows to one tile body, :func:`_tile_rows_pass`,
with arguments in the groups of ``nbattn.kernels.loo_tile_groups`` (the query
rows, the keys the block sees, the sums it adds to), the score choice
(:data:`ScoreChoice`) and the thread's scratch (:data:`GemmWork`,
``loo_fused.PairWork``).

Inside the work items, ``np.dot`` calls BLAS: the caller (``nbattn.smoothing.tiled_loo``) holds
BLAS to one thread while the kernel runs.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from .. import config
from .fastmath import fast_exp, fmax
from .items import next_item, run_items
from .kd_order import kd_order, kept_keys, kept_leaves, leaf_boxes
from .loo_fused import (
    add_row_part,
    direct_rows_pass,
    pair_work,
    reference_zero_sums,
    shifted_exp_sums,
    weighted_outputs,
)
from .loo_tile_groups import TileKeys, TileQueries, TileSums
from .softmax import exp_shift_sum, row_max

__all__ = ["kd_order", "leaf_boxes", "loo_tiles", "loo_tiles_boxed"]

_FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)

#: How a tile scores its block: GEMM scores allowed (``use_gemm``), plain up to the
#: block's squared radius ``gemm_max_radius2``, refined up to ``refine_max_radius2``;
#: direct differences beyond (or without ``use_gemm``).
ScoreChoice = namedtuple("ScoreChoice", ("use_gemm", "gemm_max_radius2", "refine_max_radius2"))

#: The per-thread scratch of the GEMM tiles: ``centre`` (k,) the block's mean,
#: ``queries_c`` (block_rows, k) its rows about it, ``keys_c`` (k n,) and ``key_sq``
#: (n,) the keys about it and their squared norms, ``tile`` (block_rows n,) the
#: block's scores, then weights, then g; ``f_row`` and ``resid`` (p,) a row's f and r,
#: ``row_sums`` (block_rows,) its a, ``gx`` (block_rows, d) b = G X, and ``near`` (n,)
#: int64 and ``dist`` (n,) the refinement's list. Without GEMM scores only ``centre``,
#: ``queries_c``, ``f_row``, ``resid``, ``row_sums`` and ``gx`` have their sizes.
GemmWork = namedtuple(
    "GemmWork", "centre queries_c keys_c key_sq tile f_row resid row_sums gx near dist"
)


@njit(cache=config.CACHE)
def _workspace(k, n, d, p, block_rows, use_gemm):
    """``(GemmWork, PairWork)``: one thread's scratch for blocks of ``block_rows`` rows."""
    gemm = GemmWork(
        np.empty(k),
        np.empty((block_rows, k)),
        np.empty(k * n) if use_gemm else np.empty(0),
        np.empty(n) if use_gemm else np.empty(0),
        np.empty(block_rows * n) if use_gemm else np.empty(0),
        np.empty(p),
        np.empty(p),
        np.zeros(block_rows),
        np.empty((block_rows, d)),
        np.empty(n if use_gemm else 0, dtype=np.int64),
        np.empty(n if use_gemm else 0),
    )
    return gemm, pair_work(n, p, d)


# --------------------------------------------------------------------------- GEMM scores


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _block_radius2(z_t, rows, i0, nb, centre):
    """centre <- mean of the block's rows; returns max_r |z_r - centre|^2."""
    k = z_t.shape[0]
    centre[:] = 0.0
    for r in range(nb):
        for f in range(k):
            centre[f] += z_t[f, rows[i0 + r]]
    for f in range(k):
        centre[f] /= nb
    radius2 = 0.0
    for r in range(nb):
        dist = 0.0
        for f in range(k):
            diff = z_t[f, rows[i0 + r]] - centre[f]
            dist += diff * diff
        radius2 = max(radius2, dist)
    return radius2


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _gemm_scores(queries, i0, nb, keys, work, tile, finish):
    """tile[r, j] = -||z_{rows[i0+r]} - keys.z[:, j]||^2 as a GEMM on points shifted by
    ``work.centre`` (clamped to <= 0) when ``finish``; without, the tile keeps the
    products (z_r - c).(z_j - c), ``work.key_sq[j]`` = |z_j - c|^2 and
    ``work.queries_c[r]`` = z_r - c, for :func:`_gemm_exp_row` to finish the scores in
    its exp pass."""
    z_t, rows, keys_z, width = queries.z_t, queries.rows, keys.z, keys.width
    centre, queries_c, keys_c, key_sq = work.centre, work.queries_c, work.keys_c, work.key_sq
    k = z_t.shape[0]
    keys_w = keys_c[: k * width].reshape((k, width))
    sq = key_sq[:width]
    sq[:] = 0.0
    for f in range(k):
        cf = centre[f]
        src = keys_z[f]
        dst = keys_w[f]
        for j in range(width):
            value = src[j] - cf
            dst[j] = value
            sq[j] += value * value
    for r in range(nb):
        for f in range(k):
            queries_c[r, f] = z_t[f, rows[i0 + r]] - centre[f]
    np.dot(queries_c[:nb], keys_w, tile)
    if not finish:
        return
    for r in range(nb):
        q_sq = 0.0
        for f in range(k):
            q_sq += queries_c[r, f] * queries_c[r, f]
        row = tile[r]
        for j in range(width):
            row[j] = min(2.0 * row[j] - q_sq - sq[j], 0.0)


# --------------------------------------------------------------------------- refined GEMM scores
# A block wider than ``gemm_max_radius2`` may still take the GEMM scores when each
# row's keys near its best are then scored again by differences. The GEMM score's
# absolute error is at most eps_ij = (k + 3) u (|z_i - c|^2 + |z_j - c|^2) (the
# module's first section); below ``refine_max_radius2`` and the far-row limit that
# is far below REFINE_SLACK = 1 for every key of weight that matters, so:
#
#   * every key with GEMM score >= best_gemm - REFINE_GAP - REFINE_SLACK, which
#     includes the true best key, gets its exact score, and the row's best is then
#     exact;
#   * every other key has exact score below best - REFINE_GAP, weight below
#     e^-REFINE_GAP = 2.3e-16 of the largest, and its weight's relative error
#     eps_ij e^eps_ij (k + 3) u-small: its contribution's error is below u^2 of the
#     largest weight.
#
# So the result meets the float64 contract whatever the block's radius; the
# refinement's cost is k operations per key near the best (few, when the rows
# are narrow against the block: the case where the block is wide).

_REFINE_GAP = 36.0
_REFINE_SLACK = 1.0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _refine_near_best(z_t, own, keys_z, width, row, best, near, dist):
    """Exact scores, by differences, for the keys of ``row`` (GEMM scores of key
    ``own``) within REFINE_GAP + REFINE_SLACK of ``best``; returns the exact best.
    ``near`` (int64) and ``dist`` (float64), each of at least ``width``, are scratch:
    the keys are listed first, then scored one coordinate at a time over the list."""
    k = z_t.shape[0]
    cut = best - (_REFINE_GAP + _REFINE_SLACK)
    count = 0
    for j in range(width):
        if row[j] >= cut:
            near[count] = j
            count += 1
    dist[:count] = 0.0
    for f in range(k):
        qf = z_t[f, own]
        keys_f = keys_z[f]
        for t in range(count):
            diff = keys_f[near[t]] - qf
            dist[t] += diff * diff
    exact_best = -np.inf
    for t in range(count):
        row[near[t]] = -dist[t]
        exact_best = fmax(exact_best, -dist[t])
    return exact_best


# --------------------------------------------------------------------------- exp passes


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _gemm_exp_row(row, query_c, key_sq, keys_v, width):
    """The GEMM scores' exp pass with reference 0 (``loo_fused``, "Reference 0"): row[j]
    <- exp(min(2 row[j] - |q|^2 - key_sq[j], 0)) from the products of
    :func:`_gemm_scores` (``finish`` False; an excluded key's product set to -inf);
    returns (l, sum_j w_j y_j0)."""
    q_sq = 0.0
    for f in range(query_c.shape[0]):
        q_sq += query_c[f] * query_c[f]
    sq = key_sq[:width]
    total = 0.0
    weighted = 0.0
    vals = keys_v[0, :width]  # the first output's weighted sum, whatever p (one loop)
    for j in range(width):
        w = fast_exp(min(2.0 * row[j] - q_sq - sq[j], 0.0))
        row[j] = w
        total += w
        weighted += w * vals[j]
    return total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _shifted_exps(row, best, keys_v, width, f_row):
    """row[j] <- exp(row[j] - best), f_row[c] <- sum_j w_j y_jc; returns l = sum_j w_j."""
    if keys_v.shape[0] == 1:  # one fused pass: weights, their sum and the weighted sum
        total, weighted = shifted_exp_sums(row, best, keys_v[0], width)
        f_row[0] = weighted
        return total
    total = exp_shift_sum(row[:width], best)
    weighted_outputs(row, keys_v, width, 0.0, f_row)
    return total


# ---------------------------------------------------------------- the tile body and the entries


def _choice(use_gemm, gemm_max_radius2, refine_max_radius2):
    """The kernels' :data:`ScoreChoice`, or None without GEMM scores."""
    if not use_gemm:
        return None
    return ScoreChoice(True, float(gemm_max_radius2), float(refine_max_radius2))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _tile_rows_pass(queries, i0, nb, keys, choice, work, pair, sums):
    """The one tile body of both kernels: rows ``queries.rows[i0:i0+nb]`` against the
    ``keys.width`` keys of ``keys``; returns the tile's squared-error sum.

    ``queries``, ``keys``, ``sums``: the groups of ``loo_tile_groups`` (the keys are all
    keys themselves for :func:`loo_tiles`). Adds g_rj to ``sums.key_sums[j]`` (positions
    among the keys), the row part of M to ``sums.acc`` (d, d), flags far rows in
    ``sums.far``. ``work`` and ``pair`` are the thread's :data:`GemmWork` and
    ``loo_fused.PairWork``.

    Scores (``choice``, a :data:`ScoreChoice`, or None: direct scores only, and the
    GEMM code is not compiled): GEMM when the block's squared radius is
    at most ``gemm_max_radius2``; GEMM then exact differences for the keys near each
    row's best (section "refined GEMM scores") up to ``refine_max_radius2``; direct
    beyond (``loo_fused.direct_rows_pass``).
    """
    z_t, rows, targets, points = queries.z_t, queries.rows, queries.targets, queries.points
    keys_z, keys_v, keys_x, width, own_at = keys.z, keys.v, keys.x, keys.width, keys.own_at
    key_sums, acc, far = sums.key_sums, sums.acc, sums.far
    queries_c, key_sq, f_row, resid = work.queries_c, work.key_sq, work.f_row, work.resid
    row_sums, gx, near, dist = work.row_sums, work.gx, work.near, work.dist
    p = keys_v.shape[0]
    sse = 0.0
    if choice is None:  # decided when the kernel compiles: no GEMM code without GEMMs
        return direct_rows_pass(queries, i0, nb, keys, pair, sums)
    radius2 = _block_radius2(z_t, rows, i0, nb, work.centre)
    refine = radius2 > choice.gemm_max_radius2
    if not radius2 <= max(choice.gemm_max_radius2, choice.refine_max_radius2):
        return direct_rows_pass(queries, i0, nb, keys, pair, sums)
    tile = work.tile[: nb * width].reshape((nb, width))
    _gemm_scores(queries, i0, nb, keys, work, tile, refine)
    for r in range(nb):
        row = tile[r]
        if own_at[r] >= 0:  # the row's own key is left out
            row[own_at[r]] = -np.inf
        row_sums[r] = 0.0
        total, weighted = 0.0, 0.0
        if refine:
            best = row_max(row)
            if best >= -_FAR_SCORE_FLOAT64:
                best = _refine_near_best(z_t, rows[i0 + r], keys_z, width, row, best, near, dist)
        else:
            # scores finished in the exp pass, reference 0 (``loo_fused``, "Reference 0")
            total, weighted = _gemm_exp_row(row, queries_c[r], key_sq, keys_v, width)
            best, total, weighted = reference_zero_sums(
                z_t, rows[i0 + r], keys, own_at[r], row, total, weighted
            )
        if not best >= -_FAR_SCORE_FLOAT64:  # far, overflowing or no key
            far[i0 + r] = True
            row[:] = 0.0
            continue
        if refine:
            total = _shifted_exps(row, best, keys_v, width, f_row)
        else:
            weighted_outputs(row, keys_v, width, weighted, f_row)
        inv = 1.0 / total
        for c in range(p):
            f_row[c] *= inv
            resid[c] = f_row[c] - targets[i0 + r, c]
            sse += resid[c] * resid[c]
        # g_ij = w_ij sum_c r_ic (y_jc - f_ic), differences first (no cancellation),
        # with its row sum a_i and key sums c_j in the same pass
        a_r = 0.0
        if p == 1:
            scale = resid[0] * inv  # 1 / l <= 2^64 (``loo_fused``, "Reference 0")
            f0 = f_row[0]
            vals = keys_v[0]
            for j in range(width):
                g = row[j] * scale * (vals[j] - f0)
                row[j] = g
                a_r += g
                key_sums[j] += g
        else:
            for j in range(width):
                inner = 0.0
                for c in range(p):
                    inner += resid[c] * (keys_v[c, j] - f_row[c])
                g = (row[j] * inv) * inner
                row[j] = g
                a_r += g
                key_sums[j] += g
        row_sums[r] = a_r
    np.dot(tile, keys_x[:width], gx[:nb])
    for r in range(nb):
        add_row_part(acc, row_sums[r], points[rows[i0 + r]], gx[r])
    return sse


@njit(cache=config.CACHE)
def _groups(n_rows, block_rows, n, d):
    """``(n_blocks, n_groups, sse, m, c, far)``: the blocks of ``block_rows`` rows, the
    groups of blocks run in parallel (at most ``config.LOO_FULL_GROUPS``), each group's
    zeroed partial sums (``sse`` (n_groups,), ``m`` (n_groups, d, d), ``c`` (n_groups,
    n)) and the far-row flags (n_rows,)."""
    n_blocks = (n_rows + block_rows - 1) // block_rows
    n_groups = min(config.LOO_FULL_GROUPS, n_blocks)
    far = np.zeros(n_rows, dtype=np.bool_)
    return (
        n_blocks,
        n_groups,
        np.zeros(n_groups),
        np.zeros((n_groups, d, d)),
        np.zeros((n_groups, n)),
        far,
    )


@njit(cache=config.CACHE)
def _group_totals(sse, m, c):
    """``(sse, m, c)`` summed over their groups (axis 0), in group order."""
    n_groups, d, _ = m.shape
    total = 0.0
    m_total = np.zeros((d, d))
    c_total = np.zeros(c.shape[1])
    for g in range(n_groups):
        total += sse[g]
        for a in range(d):
            for b in range(d):
                m_total[a, b] += m[g, a, b]
        for j in range(c.shape[1]):
            c_total[j] += c[g, j]
    return total, m_total, c_total


@njit(cache=config.CACHE)
def _group_blocks(group, n_groups, n_blocks):
    """``(first, last)``: the blocks of group ``group``, an even share of ``n_blocks``."""
    return group * n_blocks // n_groups, (group + 1) * n_blocks // n_groups


def loo_tiles(
    z_t,
    points,
    values_t,
    targets,
    rows,
    block_rows,
    use_gemm,
    gemm_max_radius2,
    refine_max_radius2=0.0,
):
    """``(sse, M_rows, key_sums, far)``: the LOO squared error and gradient sums of rows.

    Parameters
    ----------
    z_t : (k, n) float64, all keys in score space (s_ij = -||z_i - z_j||^2)
    points : (n, d) float64, the keys in the coordinates of the gradient
        (the centred x for the full metric, z itself for the diagonal)
    values_t : (p, n) float64, the keys' y
    targets : (n_rows, p) float64, the query rows' y
    rows : (n_rows,) int64, ascending: query r is key ``rows[r]`` (left out)
    block_rows : rows per tile; use_gemm : GEMM scores allowed (blocks whose
        squared radius exceeds ``gemm_max_radius2`` take the direct ones, or up to
        ``refine_max_radius2`` the refined GEMM scores of section "refined GEMM
        scores"; the default 0 turns those off)

    Returns
    -------
    sse : float, sum_r ||f_r - y_r||^2 over the rows not flagged
    M_rows : (d, d), sum_r [a_r x_r x_r^T - x_r b_r^T - b_r x_r^T]
    key_sums : (n,), c_j = sum_r g_rj
    far : (n_rows,) bool, rows left to the caller

    The groups of row blocks are the work items of
    :func:`nbattn.kernels.items.run_items` (each with its own partial sums, added in
    group order: the same bits on any number of threads).
    """
    n_blocks, n_groups, partial_sse, partial_m, partial_c, far = _groups(
        rows.shape[0], block_rows, z_t.shape[1], points.shape[1]
    )
    run_items(
        _tiles_items,
        z_t,
        points,
        np.ascontiguousarray(points.T),
        values_t,
        targets,
        rows,
        np.int64(block_rows),
        _choice(use_gemm, gemm_max_radius2, refine_max_radius2),
        np.int64(n_blocks),
        partial_sse,
        partial_m,
        partial_c,
        far,
    )
    return (*_group_totals(partial_sse, partial_m, partial_c), far)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _tiles_items(
    counter,
    z_t,
    points,
    points_t,
    values_t,
    targets,
    rows,
    block_rows,
    choice,
    n_blocks,
    partial_sse,
    partial_m,
    partial_c,
    far,
):
    """The groups of row blocks that ``counter`` hands this thread: their partial sums."""
    k, n = z_t.shape
    n_rows = rows.shape[0]
    d = points.shape[1]
    p = values_t.shape[0]
    n_groups = partial_sse.shape[0]
    while True:
        group = next_item(counter)
        if group >= n_groups:
            return
        work, pair = _workspace(k, n, d, p, block_rows, choice is not None)
        queries = TileQueries(z_t, points, targets, rows)
        own_at = np.empty(block_rows, dtype=np.int64)
        keys = TileKeys(z_t, values_t, points, points_t, n, own_at)
        sums = TileSums(partial_c[group], partial_m[group], far)
        sse = 0.0
        first, last = _group_blocks(group, n_groups, n_blocks)
        for blk in range(first, last):
            i0 = blk * block_rows
            nb = min(block_rows, n_rows - i0)
            for r in range(nb):  # not a slice assignment: see kernels/flash.py
                own_at[r] = rows[i0 + r]
            sse += _tile_rows_pass(queries, i0, nb, keys, choice, work, pair, sums)
        partial_sse[group] = sse


def loo_tiles_boxed(
    z_t,
    points,
    values_t,
    targets,
    rows,
    block_rows,
    use_gemm,
    gemm_max_radius2,
    leaf_start,
    box_lo,
    box_hi,
    prune_gap,
    refine_max_radius2=0.0,
):
    """:func:`loo_tiles` with keys in k-d order and tiles pruned by leaf boxes.

    Parameters and returns as :func:`loo_tiles`, except that the keys (``z_t``,
    ``points``, ``values_t``) are in the order of :func:`kd_order`, ``leaf_start``
    (n_leaves + 1,) are its leaves' first positions and ``box_lo``, ``box_hi``
    their bounding boxes (:func:`leaf_boxes`). Each tile gathers the keys of the
    leaves within reach of its rows (``nbattn.kernels.kd_order``) into contiguous buffers
    and runs the one-pass softmax and GEMM gradient of :func:`loo_tiles` on them.

    The groups of row blocks are the work items of
    :func:`nbattn.kernels.items.run_items` (each with its own partial sums, added in
    group order: the same bits on any number of threads).
    """
    n_blocks, n_groups, partial_sse, partial_m, partial_c, far = _groups(
        rows.shape[0], block_rows, z_t.shape[1], points.shape[1]
    )
    run_items(
        _boxed_items,
        z_t,
        points,
        np.ascontiguousarray(points.T),
        values_t,
        targets,
        rows,
        np.int64(block_rows),
        _choice(use_gemm, gemm_max_radius2, refine_max_radius2),
        leaf_start,
        box_lo,
        box_hi,
        float(prune_gap),
        np.int64(n_blocks),
        partial_sse,
        partial_m,
        partial_c,
        far,
    )
    return (*_group_totals(partial_sse, partial_m, partial_c), far)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _boxed_items(
    counter,
    z_t,
    points,
    points_t,
    values_t,
    targets,
    rows,
    block_rows,
    choice,
    leaf_start,
    box_lo,
    box_hi,
    prune_gap,
    n_blocks,
    partial_sse,
    partial_m,
    partial_c,
    far,
):
    """The groups of row blocks that ``counter`` hands this thread: their partial sums."""
    k, n = z_t.shape
    n_rows = rows.shape[0]
    d = points.shape[1]
    p = values_t.shape[0]
    n_leaves = box_lo.shape[0]
    n_groups = partial_sse.shape[0]
    while True:
        group = next_item(counter)
        if group >= n_groups:
            return
        work, pair = _workspace(k, n, d, p, block_rows, choice is not None)
        queries = TileQueries(z_t, points, targets, rows)
        keep = np.empty(n_leaves, dtype=np.bool_)
        reach = np.empty(block_rows)
        key_index = np.empty(n, dtype=np.int64)
        # the kept keys, gathered (allocated here: the copies below then vectorise)
        keys_z = np.empty((k, n))
        keys_v = np.empty((p, n))
        keys_x = np.empty((n, d))
        keys_x_t = np.empty((d, n))
        own_at = np.empty(block_rows, dtype=np.int64)
        keys_c = np.empty(n)  # the tile's key sums, by position among the kept keys
        sums = TileSums(keys_c, partial_m[group], far)
        c_sum = partial_c[group]
        sse = 0.0
        first, last = _group_blocks(group, n_groups, n_blocks)
        for blk in range(first, last):
            i0 = blk * block_rows
            nb = min(block_rows, n_rows - i0)
            kept_leaves(z_t, rows, i0, nb, box_lo, box_hi, prune_gap, reach, keep)
            width = kept_keys(leaf_start, keep, key_index)
            for f in range(k):
                src = z_t[f]
                dst = keys_z[f]
                for t in range(width):
                    dst[t] = src[key_index[t]]
            for c in range(p):
                src = values_t[c]
                dst = keys_v[c]
                for t in range(width):
                    dst[t] = src[key_index[t]]
            for t in range(width):  # not a row assignment: see kernels/flash.py
                for a in range(d):
                    keys_x[t, a] = points[key_index[t], a]
            for a in range(d):
                dst = keys_x_t[a]
                for t in range(width):
                    dst[t] = points[key_index[t], a]
            for r in range(nb):
                own = rows[i0 + r]
                at = np.searchsorted(key_index[:width], own)  # ascending: leaves in order
                own_at[r] = at if at < width and key_index[at] == own else -1
            keys = TileKeys(keys_z, keys_v, keys_x, keys_x_t, width, own_at)
            keys_c[:width] = 0.0
            sse += _tile_rows_pass(queries, i0, nb, keys, choice, work, pair, sums)
            for t in range(width):
                c_sum[key_index[t]] += keys_c[t]
        partial_sse[group] = sse
