"""The CPU leave-one-out loss and gradient in one pass over row tiles (``kernels.loo_tiles``).

On the CPU the learned metrics' criterion and gradient take one pass over tiles of
query rows, the gradient as GEMMs (``nbattn.kernels.loo_tiles``), instead of the
two streaming passes of :mod:`nbattn.smoothing.loo_rows`. This module chooses the
keys the tiles visit and runs them over row ranges:

* **every key**, in its order (:func:`plain_keys`), below
  ``config.LOO_PRUNE_MIN_ROWS`` keys or where pruning would not pay;
* **k-d order with the leaves' bounding boxes** (:func:`boxed_keys`): each tile
  takes only the leaves whose box comes within reach of one of its rows, the
  skipped keys weighing less than exp(-gap) of their row's largest weight
  (:func:`prune_gap`: ``config.PRUNE_GAP_FLOAT64``, exact to rounding, or
  log((n - 1) / rtol) with a tolerance ``rtol``). Chosen (:func:`pruned_keys`)
  when two estimates of the share of keys the boxes keep (:func:`reach_share`,
  then :func:`boxed_share`) stay at most ``config.LOO_BOXED_MAX_SHARE``: a wide
  kernel keeps most keys, and gathering them costs more than it saves.

Rows whose scores are far from every key (``far``) are left by the tiles and
added through the anchored two-pass kernels, one by one.
"""

from __future__ import annotations

import math

import numpy as np

from .. import config
from .._core.threads import blas_one_thread
from ..dispatch.device import kernels_for
from .loo_rows import loss_grad_rows, sum_over_rows, threads_for

__all__ = [
    "boxed_keys",
    "boxed_share",
    "plain_keys",
    "prune_gap",
    "pruned_keys",
    "reach_share",
    "tile_loss_grad_rows",
    "tile_rows",
    "tiled_loss_and_grad_sums",
]


def prune_gap(n_keys, rtol=0.0) -> float:
    """The score gap beyond which the boxed tiles skip a key: it weighs less than
    exp(-gap) of its row's largest weight, so the at most n - 1 keys a row skips weigh
    less than (n - 1) exp(-gap) of its normaliser.

    ``rtol`` = 0: ``config.PRUNE_GAP_FLOAT64`` (``kernels.loo_1d.prune_gap_for``; 50,
    far below float64's rounding). ``rtol`` > 0: log((n - 1) / rtol), never above that
    default, so the skipped keys weigh less than ``rtol`` of each row's normaliser.
    """
    exact = kernels_for("loo_1d", "cpu").prune_gap_for(np.float64)
    if rtol <= 0.0 or n_keys < 2:
        return exact
    return min(exact, math.log(n_keys - 1) - math.log(rtol))


def tiled_loss_and_grad_sums(X, y2, z, z_t, v_t, dtype, diagonal, n_rows, rtol=0.0):
    """``(sum of squared errors, gradient sums)`` of rows [0, n_rows) on the tiles.

    The sums as :func:`nbattn.smoothing.loo_rows.loss_grad_rows` gives them: (k,)
    for the diagonal metric (its coordinates are the score-space points), (d, d)
    over the centred ``X`` for the full one. From ``config.LOO_PRUNE_MIN_ROWS`` keys
    the k-d order prunes the tiles, unless they would keep most keys; ``rtol``
    widens the pruning (:func:`prune_gap`).
    """
    z64 = np.ascontiguousarray(z, dtype=np.float64)
    points64 = z64 if diagonal else np.ascontiguousarray(X, dtype=np.float64)
    keys = pruned_keys(z64, points64, y2, prune_gap(z64.shape[0], rtol))
    if keys is None:
        keys = plain_keys(z64, points64, y2)
    return sum_over_rows(tile_loss_grad_rows, n_rows, keys, z, z_t, v_t, y2, dtype, diagonal)


def tile_rows(n_keys, every_key=False):
    """Rows per tile of ``loo_tiles``: config.LOO_TILE_ROWS, fewer when a tile would pass
    config.LOO_TILE_BYTES; with ``every_key`` (the plain tiles on direct scores) also at
    most what fits in config.LOO_TILE_CACHE_BYTES, but at least 8. (The fused direct
    tiles hold two rows of weights at a time: for them this only sets how many rows a
    block hands to a thread.)"""
    rows = min(config.LOO_TILE_ROWS, config.LOO_TILE_BYTES // (8 * n_keys))
    if every_key:
        rows = min(rows, max(8, config.LOO_TILE_CACHE_BYTES // (8 * n_keys)))
    return int(max(1, rows))


# --------------------------------------------------------------------------- the keys


def plain_keys(z64, points64, y2):
    """The keys for ``loo_tiles`` below ``config.LOO_PRUNE_MIN_ROWS`` rows, where pruning
    does not pay: every key in its order. See :func:`tile_loss_grad_rows` for the tuple."""
    n = z64.shape[0]
    return "loo_tiles", (), np.arange(n), np.ascontiguousarray(z64.T), points64, y2


def boxed_keys(z64, points64, y2, gap=None):
    """The keys for ``loo_tiles_boxed``: in k-d order (leaves of
    ``config.LOO_TILE_LEAF_KEYS`` keys) with the leaves' bounding boxes, pruned at
    ``gap`` (None: :func:`prune_gap` of the exact tiles). See
    :func:`tile_loss_grad_rows` for the tuple."""
    tiles = kernels_for("loo_tiles", "cpu")
    n = z64.shape[0]
    order, leaf_start = tiles.kd_order(z64, int(config.LOO_TILE_LEAF_KEYS))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    z_t = np.ascontiguousarray(z64[order].T)
    box_lo, box_hi = tiles.leaf_boxes(z_t, leaf_start)
    points = np.ascontiguousarray(points64[order])
    gap = prune_gap(n) if gap is None else float(gap)
    pruning = (leaf_start, box_lo, box_hi, gap)
    return "loo_tiles_boxed", pruning, rank, z_t, points, y2[order]


def pruned_keys(z64, points64, y2, gap=None):
    """:func:`boxed_keys` where pruning pays: from ``config.LOO_PRUNE_MIN_ROWS`` keys,
    when the boxes would keep at most ``config.LOO_BOXED_MAX_SHARE`` of them (a wide
    kernel keeps most, and gathering them costs more than it saves); else None.
    ``gap``: as in :func:`boxed_keys`."""
    if z64.shape[0] < config.LOO_PRUNE_MIN_ROWS:
        return None
    gap = prune_gap(z64.shape[0]) if gap is None else float(gap)
    if reach_share(z64, gap=gap) > config.LOO_BOXED_MAX_SHARE:  # a wide kernel: no k-d order
        return None
    keys = boxed_keys(z64, points64, y2, gap)
    return keys if boxed_share(keys) <= config.LOO_BOXED_MAX_SHARE else None


def reach_share(z64, n_sample=32, gap=None):
    """The share of keys within ``U_i + gap`` of a row i (squared distances, U_i the
    row's squared distance to its nearest other key), over ``n_sample`` rows spread
    through the rows: what the boxed tiles would keep at least (their bound takes U_i
    from a few keys beside the row in k-d order, at least the nearest, and keeps whole
    leaves), without building that order. Distances by one small GEMM: it only chooses
    between two paths of the same accuracy."""
    n = z64.shape[0]
    rows = np.unique(np.linspace(0, n - 1, min(n_sample, n)).astype(np.int64))
    sq = np.einsum("ij,ij->i", z64, z64)
    with blas_one_thread():  # BLAS threads left spinning would slow the kernels after
        dist = z64[rows] @ z64.T  # in place from here: no large temporaries
    dist *= -2.0
    dist += sq
    dist += sq[rows, None]
    dist[np.arange(rows.size), rows] = np.inf
    reach = dist.min(axis=1) + (prune_gap(n) if gap is None else gap)
    return float(np.count_nonzero(dist <= reach[:, None])) / dist.size


def boxed_share(keys, n_sample=64):
    """An estimate of the share of keys the boxed tiles would keep for a row: over
    ``n_sample`` rows spread through the k-d order, the keys of the leaves whose box
    lies within ``U + gap`` of the row (U: the squared distance to its nearest
    neighbour among the 4 on each side in that order, as the kernel bounds it).
    Only chooses between two paths of the same accuracy."""
    _, (leaf_start, box_lo, box_hi, gap), _, z_t, _, _ = keys
    n = z_t.shape[1]
    positions = np.unique(np.linspace(0, n - 1, min(n_sample, n)).astype(np.int64))
    sizes = np.diff(leaf_start).astype(np.float64)
    q = z_t[:, positions].T  # (rows, k)
    bound = np.full(positions.size, np.inf)
    for offset in (-4, -3, -2, -1, 1, 2, 3, 4):
        near = positions + offset
        inside = (near >= 0) & (near < n)
        dist = np.sum((z_t[:, np.clip(near, 0, n - 1)].T - q) ** 2, axis=1)
        bound = np.where(inside, np.minimum(bound, dist), bound)
    outside = np.maximum(np.maximum(box_lo[None] - q[:, None], q[:, None] - box_hi[None]), 0.0)
    reach = np.sum(outside**2, axis=2) <= (bound + gap)[:, None]  # (rows, leaves)
    return float(np.mean(reach @ sizes) / n)


# --------------------------------------------------------------------------- the tile pass


def tile_loss_grad_rows(a, b, keys, z, z_t, v_t, y2, dtype, diagonal):
    """Rows [a, b) of a one-pass tile kernel: ``(sse, sums)`` as
    :func:`nbattn.smoothing.loo_rows.loss_grad_rows`.

    ``keys`` is ``(kernel, pruning, rank, z_t, points, y)`` from :func:`plain_keys`
    or :func:`boxed_keys`: the kernel of ``kernels.loo_tiles``, its pruning
    arguments, each row's position in the keys' order, the score-space points
    (the ``dtype`` layout widened to float64, feature-major), the gradient's
    coordinates (those points for the diagonal, the centred x for the full
    metric) and the targets, in that order. :func:`_with_far_rows` adds the rows
    the tiles leave.
    """
    tiles = kernels_for("loo_tiles", "cpu")
    kernel, pruning, rank, keys_t, points, y_keys = keys
    k, n = keys_t.shape
    rows = np.sort(rank[a:b]).astype(np.int64)
    # tiles of every key: with direct scores blocks of the rows tile_rows gives (see there),
    # wide blocks on refined GEMM scores (the boxed tiles keep keys near their rows, where
    # refining costs more than the GEMM saves)
    every_key = kernel == "loo_tiles"
    cached_tile = every_key and k < config.LOO_TILE_GEMM_MIN_DIMS
    refine = float(config.LOO_TILE_GEMM_REFINE_MAX_RADIUS2) if every_key else 0.0
    with blas_one_thread(), threads_for((b - a) * n):
        sse, M, key_sums, far = getattr(tiles, kernel)(
            keys_t,
            points,
            np.ascontiguousarray(y_keys.T),
            np.ascontiguousarray(y_keys[rows]),
            rows,
            tile_rows(n, every_key=cached_tile),
            k >= config.LOO_TILE_GEMM_MIN_DIMS,
            float(config.LOO_TILE_GEMM_MAX_RADIUS2),
            *pruning,
            refine_max_radius2=refine,
        )
        M = M + points.T @ (key_sums[:, None] * points)
    return _with_far_rows(float(sse), M, far, rows, rank, points, z, z_t, v_t, y2, dtype, diagonal)


def _with_far_rows(sse, M, far, rows, rank, points, z, z_t, v_t, y2, dtype, diagonal):
    """``(sse, sums)`` of a tile pass with the rows it left (``far``: far rows, n = 1)
    added through the anchored two-pass kernels of :mod:`nbattn.kernels.loo`, one by
    one, on ``z``, ``z_t``, ``v_t`` (the ``dtype`` layout); ``rank`` maps a row to its
    position in the keys' order."""
    k, n = M.shape[0], z.shape[0]
    if np.any(far):
        position = np.empty(n, dtype=np.int64)
        position[rank] = np.arange(n)
        pts = None if diagonal else np.ascontiguousarray(points[rank], dtype=dtype)
        pts_t = None if diagonal else np.ascontiguousarray(pts.T)
        for i in position[rows[far]]:
            row_sse, sums = loss_grad_rows(i, i + 1, z, z_t, v_t, y2, pts, pts_t, dtype)
            sse += row_sse
            if diagonal:
                M[np.diag_indices(k)] += sums
            else:
                M += sums
    return sse, (np.diag(M).copy() if diagonal else M)
