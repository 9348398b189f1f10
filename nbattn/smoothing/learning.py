"""Learned kernels: leave-one-out loss and gradients, LOO bandwidths, learned metrics, spread.

The attention-pooling walk-through, section 1.3.3, makes the kernel width a
parameter learned from the data. The criterion is the leave-one-out (LOO)
mean squared error of Nadaraya-Watson regression,

.. math::

    L = \\frac{1}{n p} \\sum_i \\| f_{-i}(x_i) - y_i \\|^2, \\qquad
    f_{-i}(x_i) = \\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij})\\, y_j

(p outputs), with one of three scores:

* ``scalar``:   ``s_ij = -1/2 sum_d ((x_id - x_jd) / (c h_d))^2``, one factor c
  on fixed base widths h (Scott's rule by default); the text's single w is 1/(c h).
* ``diagonal``: ``s_ij = -1/2 sum_d ((x_id - x_jd) / h_d)^2``, one width per feature.
* ``full``:     ``s_ij = -1/2 || L (x_i - x_j) ||^2`` with L (n_components, d):
  metric learning for kernel regression (MLKR, Weinberger & Tesauro 2007).

The gradient is exact and streamed (``nbattn.kernels.loo``): with
``g_ij = w_ij sum_c r_ic (y_jc - f_ic)`` and ``r_i = f_i - y_i``,

.. math::

    \\frac{\\partial L}{\\partial \\log h_d} = \\frac{2}{n p} \\sum_{i, j \\ne i}
        g_{ij} \\Big(\\frac{x_{id} - x_{jd}}{h_d}\\Big)^2, \\qquad
    \\frac{\\partial L}{\\partial L} = -\\frac{2}{n p}\\, L \\sum_{i, j \\ne i}
        g_{ij} (x_i - x_j)(x_i - x_j)^T .

Memory is O(n (d + p)) throughout: no n x n matrix is formed. The tunables
(``LOO_GRID``, ``LOO_EXTEND_DECADES``, ``LOO_RTOL``, ``WIDTH_BOUNDS``) live in
:mod:`nbattn.config` and are read at call time.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from .. import config
from .._core.numeric import power_of_two_scale
from .._core.progress import FitProgress, check_verbose
from .._core.threads import blas_one_thread, serial_below
from .._core.validation import as_columns, as_float_array, check_pooling_inputs, resolve_dtype
from ..dispatch.device import kernels_for, resolve_device
from ..dispatch.transfer import to_host
from .regression import bandwidth_rule, feature_spread, resolve_bandwidth
from .search import BandwidthRangeWarning, minimize_log_scale

__all__ = [
    "LOO_GRID",  # noqa: F822 - provided by the module __getattr__ (config at call time)
    "BandwidthRangeWarning",
    "fit_learned_kernel",
    "loo_bandwidth",
    "loo_loss",
    "loo_loss_and_grad",
    "nadaraya_watson_spread",
    "row_runner",
]


def _cpu_loo():
    """The CPU-only LOO kernels: the windowed, boxed and Taylor 1-D kernels of the width
    search (no GPU twin) and the pruning gap of the k-d tiles."""
    return kernels_for("loo_1d", "cpu")


def __getattr__(name):
    # the grid as an array, always the one in config (tests patch config.LOO_GRID)
    if name == "LOO_GRID":
        return np.asarray(config.LOO_GRID, dtype=np.float64)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- inputs


def _threads_for(pairs):
    """Run the kernels inside on one thread when the call has few pairs (config.SERIAL_PAIRS)."""
    return serial_below(pairs, config.SERIAL_PAIRS)


def _prepare_xy(X, y, dtype):
    """X (n, d) and y (n, p) as float64, each column centred on the middle of its range.

    Scores depend on differences of X and the LOO errors on differences of y
    (the weights sum to 1), so the centring changes nothing but float32
    rounding: a column far from 0 (temperatures in kelvin, incomes) keeps its
    digits.
    """
    X = as_columns(X, "X", np.float64)
    y2 = as_columns(y, "y", np.float64)
    if y2.shape[0] != X.shape[0]:
        raise ValueError(f"y has {y2.shape[0]} rows but X has {X.shape[0]}")
    if X.shape[0] < 2:
        raise ValueError(f"leave-one-out needs at least 2 samples, got n_samples={X.shape[0]}")
    return X - np.median(X, axis=0), y2 - np.median(y2, axis=0)


def _scaled(points, scale, dtype):
    """points * scale / sqrt(2) as (rows, transposed) in ``dtype``: the kernels' layout."""
    z = np.ascontiguousarray(points * (scale / np.sqrt(2.0)), dtype=dtype)
    return z, np.ascontiguousarray(z.T)


def _projected(points, components, dtype):
    z = np.ascontiguousarray(points @ (np.asarray(components).T / np.sqrt(2.0)), dtype=dtype)
    return z, np.ascontiguousarray(z.T)


def _check_components(components, d):
    L = as_float_array(components, "components", ndim=(2,), dtype=np.float64)
    if L.shape[1] != d:
        raise ValueError(f"components has {L.shape[1]} columns but X has {d} features")
    return L


# --------------------------------------------------------------------------- loss, gradient


def _kernels(device):
    """(loo, pooling) kernel modules for ``device``, from the one dispatch table."""
    return kernels_for("loo", device), kernels_for("pooling", device)


def _loss_from_layout(z, z_t, y2, dtype, rows=None, device="cpu"):
    """LOO MSE; with ``rows`` only those rows are left out and predicted (an estimate)."""
    v_t = np.ascontiguousarray(y2.T, dtype=dtype)
    if rows is None:
        return _sum_over_rows(_sse_rows, z.shape[0], z, z_t, v_t, y2, device) / y2.size
    with _threads_for(rows.size * z.shape[0]):
        total = _kernels(device)[0].loo_squared_error(
            np.ascontiguousarray(z[rows]), z_t, v_t, y2[rows], rows
        )
    return float(total) / (rows.size * y2.shape[1])


# --------------------------------------------------------------------------- row partitions

#: How sums over query rows run: None = here, one call over all rows; set by
#: :func:`row_runner`.
_ROW_RUNNER = ContextVar("nbattn_row_runner", default=None)


@contextmanager
def row_runner(runner):
    """Run the LOO passes' sums over query rows through ``runner`` inside the block.

    ``runner(task, n_rows, args)`` must return the sum, over row ranges
    ``[a, b)`` that cover ``range(n_rows)``, of ``task(a, b, *args)`` (a float,
    or a tuple of floats and arrays, added elementwise). Each range is left
    out and predicted against all keys, so the ranges are independent:
    ``nbattn.dask.sharded_training`` maps them onto a Dask cluster. ``None``
    runs them here, as one call. Contexts nest and are per thread / task
    (a ``ContextVar``).

    Examples
    --------
    >>> def serial(task, n_rows, args):
    ...     return task(0, n_rows, *args)
    >>> with row_runner(serial):
    ...     loss = loo_loss(X, y)  # doctest: +SKIP
    """
    if runner is not None and not callable(runner):
        raise ValueError(f"runner must be callable or None, got {runner!r}")
    token = _ROW_RUNNER.set(runner)
    try:
        yield runner
    finally:
        _ROW_RUNNER.reset(token)


def _sum_over_rows(task, n_rows, *args):
    """``sum_r task(a_r, b_r, *args)`` over row ranges [a_r, b_r) that cover range(n_rows).

    ``task`` returns a float or a tuple of floats and arrays, summed elementwise.
    """
    runner = _ROW_RUNNER.get()
    if runner is None:
        return task(0, n_rows, *args)
    return runner(task, n_rows, args)


def _sse_rows(a, b, z, z_t, v_t, y2, device="cpu"):
    """Sum of squared LOO errors of rows [a, b) (each left out) against all keys."""
    rows = np.arange(a, b, dtype=np.int64)
    with _threads_for((b - a) * z.shape[0]):
        kernels = _kernels(device)[0]
        total = kernels.loo_squared_error(np.ascontiguousarray(z[a:b]), z_t, v_t, y2[a:b], rows)
    return float(total)


def _sse_rows_sorted_1d(a, b, zs, v_sorted, y_sorted, gap, window):
    """_sse_rows for sorted 1-D points with the windowed kernel (rows in sorted order)."""
    rows = np.arange(a, b, dtype=np.int64)
    with _threads_for((b - a) * window):
        total = _cpu_loo().loo_squared_error_sorted_1d(zs, v_sorted, y_sorted, rows, gap)
    return float(total)


#: One row of the boxed series costs about as much as this many pairs of the windowed
#: kernel (0.24 ms for 2,000 rows at any width, the window of about 32 keys per row):
#: the work that ``_threads_for`` weighs against ``config.SERIAL_PAIRS``.
_BOXED_PAIRS_PER_ROW = 32


def _boxed_1d_pays(n, span, window):
    """Whether the boxed Hermite series beats the windowed kernel on n sorted 1-D points of
    scaled span ``span`` whose direct window holds ``window`` keys per row."""
    n_boxes = span / (2.0 * config.LOO_BOXED_HALF_WIDTH)
    return window >= config.LOO_BOXED_MIN_WINDOW and n_boxes <= 4.0 * n


def _sse_rows_boxed_1d(a, b, zs, v_sorted, y_sorted, gap):
    """_sse_rows for sorted 1-D points by the boxed Hermite series (exact to
    ``config.LOO_BOXED_TOL``; rows it cannot vouch for directly)."""
    rows = np.arange(a, b, dtype=np.int64)
    with _threads_for(rows.size * _BOXED_PAIRS_PER_ROW):
        total, _ = _cpu_loo().loo_squared_error_boxed_rows_1d(zs, v_sorted, y_sorted, rows, gap)
    return total


def _sse_rows_taylor_1d(a, b, zs, v_sorted, y_sorted, n_terms):
    """_sse_rows for 1-D points of small span by the Taylor series (O(n) per width)."""
    rows = np.arange(a, b, dtype=np.int64)
    return float(_cpu_loo().loo_squared_error_taylor_1d(zs, v_sorted, y_sorted, rows, n_terms))


def _loss_grad_rows(a, b, z, z_t, v_t, y2, points, points_t, dtype, device="cpu"):
    """Rows [a, b) of the two LOO passes: ``(sum of squared errors, gradient sums)``.

    Gradient sums are ``loo_grad_diag``'s (k,) when ``points`` is None, else
    ``loo_grad_full``'s (d, d) over the original (centred) points.
    """
    zq = np.ascontiguousarray(z[a:b])
    loo_k, pool_k = _kernels(device)
    with _threads_for((b - a) * z.shape[0]):
        f, lse = pool_k.gaussian_pool(zq, z_t, v_t, True, a)
        if not isinstance(f, np.ndarray):  # the CUDA pool returns device arrays
            f, lse = to_host(f, lse)
        f = f.astype(np.float64)
        resid = f - y2[a:b]
        resid_k = np.ascontiguousarray(resid, dtype=dtype)
        f_k = np.ascontiguousarray(f, dtype=dtype)
        if points is None:
            sums = loo_k.loo_grad_diag(zq, z_t, v_t, resid_k, f_k, lse, a)
        else:
            pts = np.ascontiguousarray(points[a:b])
            sums = loo_k.loo_grad_full(zq, z_t, pts, points_t, v_t, resid_k, f_k, lse, a)
    return float(np.sum(resid**2)), sums


def loo_loss(X, y, bandwidth="scott", *, components=None, dtype=None, device="cpu"):
    """Leave-one-out mean squared error of Nadaraya-Watson regression.

    .. math::

        L = \\frac{1}{n p} \\sum_{i=1}^n \\sum_{c=1}^p
            \\Big(\\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij}) y_{jc}
            - y_{ic}\\Big)^2

    with ``s_ij = -1/2 sum_d ((x_id - x_jd)/h_d)^2``, or ``-1/2 ||L(x_i - x_j)||^2``
    when ``components`` (L, shape (k, d)) is given (then ``bandwidth`` is ignored).

    Parameters
    ----------
    X : array-like (n, d) or (n,)
    y : array-like (n,) or (n, p); with p outputs the mean runs over outputs too
    bandwidth : "scott", "silverman", float or array (d,)
    components : array-like (k, d), optional
    dtype : "float64" or "float32"; the sum is accumulated in float64 either way
    device : "cpu", "cuda" or "auto" (the CUDA twin ``nbattn.cuda.loo``)

    Raises
    ------
    ValueError
        fewer than 2 samples, NaN/inf, mismatched shapes.
    """
    dtype = resolve_dtype(dtype, X, y)
    X, y2 = _prepare_xy(X, y, dtype)
    if components is not None:
        z, z_t = _projected(X - X.mean(axis=0), _check_components(components, X.shape[1]), dtype)
    else:
        h = resolve_bandwidth(bandwidth, X)
        z, z_t = _scaled(X, 1.0 / h, dtype)
    return _loss_from_layout(z, z_t, y2, dtype, device=device)


def loo_loss_and_grad(X, y, bandwidth=None, *, components=None, dtype=None, device="cpu"):
    """The LOO MSE and its exact gradient (two streaming passes).

    Parameters
    ----------
    X, y : as in :func:`loo_loss`
    bandwidth : "scott", "silverman", float or array (d,)
        Score ``-1/2 sum_d ((x_id - x_jd)/h_d)^2``; the gradient is with respect
        to the log-widths ``log h_d``, shape (d,). For one shared width scale
        (``h = c * h0``) the derivative with respect to ``log c`` is its sum.
    components : array-like (k, d)
        Score ``-1/2 ||L (x_i - x_j)||^2``; the gradient is with respect to L,
        shape (k, d). Give exactly one of ``bandwidth`` and ``components``.
    dtype : "float64" or "float32"
    device : "cpu", "cuda" or "auto"
        Both passes run on the GPU with "cuda"; only the n x (d + p) inputs
        and the pass-1 outputs cross to and from the host.

    Returns
    -------
    loss : float
    grad : ndarray (d,) or (k, d), float64

    Notes
    -----
    Pass 1 is the streaming pool with the pair (i, i) excluded, giving
    ``f_i = f_{-i}(x_i)`` and ``lse_i``; pass 2 recomputes each score, takes the
    exact weight ``w_ij = exp(s_ij - lse_i)`` and accumulates
    ``g_ij = w_ij sum_c r_ic (y_jc - f_ic)`` times the squared (scaled)
    differences (diagonal) or the outer products ``(x_i - x_j)(x_i - x_j)^T``
    (full; a d x d accumulator per thread). Then

        dL/dlog h_d = 2/(n p) sum_ij g_ij ((x_id - x_jd)/h_d)^2
        dL/dL       = -2/(n p) L sum_ij g_ij (x_i - x_j)(x_i - x_j)^T
    """
    if (bandwidth is None) == (components is None):
        raise ValueError("give exactly one of bandwidth and components")
    dtype = resolve_dtype(dtype, X, y)
    device = resolve_device(device)
    X, y2 = _prepare_xy(X, y, dtype)
    if components is None:
        h = resolve_bandwidth(bandwidth, X)
        return _prepared_loss_and_grad(X, y2, h, dtype=dtype, device=device)
    L = _check_components(components, X.shape[1])
    return _prepared_loss_and_grad(X, y2, components=L, dtype=dtype, device=device)


def _tile_rows(n_keys, every_key=False):
    """Rows per tile of ``loo_tiles``: config.LOO_TILE_ROWS, fewer when a tile would pass
    config.LOO_TILE_BYTES; with ``every_key`` (the plain tiles on direct scores) also at
    most what fits in config.LOO_TILE_CACHE_BYTES, but at least 8. (The fused direct
    tiles hold two rows of weights at a time: for them this only sets how many rows a
    block hands to a thread.)"""
    rows = min(config.LOO_TILE_ROWS, config.LOO_TILE_BYTES // (8 * n_keys))
    if every_key:
        rows = min(rows, max(8, config.LOO_TILE_CACHE_BYTES // (8 * n_keys)))
    return int(max(1, rows))


def _plain_keys(z64, points64, y2):
    """The keys for ``loo_tiles`` below ``config.LOO_PRUNE_MIN_ROWS`` rows, where pruning
    does not pay: every key in its order. See :func:`_tile_loss_grad_rows` for the tuple."""
    n = z64.shape[0]
    return "loo_tiles", (), np.arange(n), np.ascontiguousarray(z64.T), points64, y2


def _boxed_keys(z64, points64, y2):
    """The keys for ``loo_tiles_boxed``: in k-d order (leaves of
    ``config.LOO_TILE_LEAF_KEYS`` keys) with the leaves' bounding boxes. See
    :func:`_tile_loss_grad_rows` for the tuple."""
    tiles = kernels_for("loo_tiles", "cpu")
    n = z64.shape[0]
    order, leaf_start = tiles.kd_order(z64, int(config.LOO_TILE_LEAF_KEYS))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    z_t = np.ascontiguousarray(z64[order].T)
    box_lo, box_hi = tiles.leaf_boxes(z_t, leaf_start)
    points = np.ascontiguousarray(points64[order])
    pruning = (leaf_start, box_lo, box_hi, _cpu_loo().prune_gap_for(np.float64))
    return "loo_tiles_boxed", pruning, rank, z_t, points, y2[order]


def _pruned_keys(z64, points64, y2):
    """:func:`_boxed_keys` where pruning pays: from ``config.LOO_PRUNE_MIN_ROWS`` keys,
    when the boxes would keep at most ``config.LOO_BOXED_MAX_SHARE`` of them (a wide
    kernel keeps most, and gathering them costs more than it saves); else None."""
    if z64.shape[0] < config.LOO_PRUNE_MIN_ROWS:
        return None
    if _reach_share(z64) > config.LOO_BOXED_MAX_SHARE:  # a wide kernel: no k-d order
        return None
    keys = _boxed_keys(z64, points64, y2)
    return keys if _boxed_share(keys) <= config.LOO_BOXED_MAX_SHARE else None


def _reach_share(z64, n_sample=32):
    """The share of keys within ``U_i + gap`` of a row i (squared distances, U_i the
    row's squared distance to its nearest other key), over ``n_sample`` rows spread
    through the rows: what the boxed tiles would keep at least (their bound takes U_i
    from a few keys beside the row in k-d order, at least the nearest, and keeps whole
    leaves), without building that order. Distances by one small GEMM: it only chooses
    between two exact paths."""
    n = z64.shape[0]
    rows = np.unique(np.linspace(0, n - 1, min(n_sample, n)).astype(np.int64))
    sq = np.einsum("ij,ij->i", z64, z64)
    with blas_one_thread():  # BLAS threads left spinning would slow the kernels after
        dist = z64[rows] @ z64.T  # in place from here: no large temporaries
    dist *= -2.0
    dist += sq
    dist += sq[rows, None]
    dist[np.arange(rows.size), rows] = np.inf
    reach = dist.min(axis=1) + _cpu_loo().prune_gap_for(np.float64)
    return float(np.count_nonzero(dist <= reach[:, None])) / dist.size


def _boxed_share(keys, n_sample=64):
    """An estimate of the share of keys the boxed tiles would keep for a row: over
    ``n_sample`` rows spread through the k-d order, the keys of the leaves whose box
    lies within ``U + gap`` of the row (U: the squared distance to its nearest
    neighbour among the 4 on each side in that order, as the kernel bounds it).
    Only chooses between two exact paths."""
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


def _tile_loss_grad_rows(a, b, keys, z, z_t, v_t, y2, dtype, diagonal):
    """Rows [a, b) of a one-pass tile kernel: ``(sse, sums)`` as :func:`_loss_grad_rows`.

    ``keys`` is ``(kernel, pruning, rank, z_t, points, y)`` from :func:`_plain_keys`
    or :func:`_boxed_keys`: the kernel of ``kernels.loo_tiles``, its pruning
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
    # tiles of every key: with direct scores blocks of the rows _tile_rows gives (see there),
    # wide blocks on refined GEMM scores (the boxed tiles keep keys near their rows, where
    # refining costs more than the GEMM saves)
    every_key = kernel == "loo_tiles"
    cached_tile = every_key and k < config.LOO_TILE_GEMM_MIN_DIMS
    refine = float(config.LOO_TILE_GEMM_REFINE_MAX_RADIUS2) if every_key else 0.0
    with blas_one_thread(), _threads_for((b - a) * n):
        sse, M, key_sums, far = getattr(tiles, kernel)(
            keys_t,
            points,
            np.ascontiguousarray(y_keys.T),
            np.ascontiguousarray(y_keys[rows]),
            rows,
            _tile_rows(n, every_key=cached_tile),
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
            row_sse, sums = _loss_grad_rows(i, i + 1, z, z_t, v_t, y2, pts, pts_t, dtype)
            sse += row_sse
            if diagonal:
                M[np.diag_indices(k)] += sums
            else:
                M += sums
    return sse, (np.diag(M).copy() if diagonal else M)


def _loss_and_grad_passes(X, y2, z, z_t, v_t, dtype, diagonal, L, device="cpu", n_rows=None):
    """LOO MSE and gradient of rows [0, n_rows) (all rows by default), each left out and
    predicted against all keys: the full criterion, or an estimate of it on the first
    n_rows rows (a random subsample when the rows were shuffled)."""
    n = z.shape[0] if n_rows is None else int(n_rows)
    size = n * y2.shape[1]
    scale = 2.0 / size
    if device == "cpu":
        # one pass over row tiles, the gradient as GEMMs (kernels.loo_tiles)
        z64 = np.ascontiguousarray(z, dtype=np.float64)
        points64 = z64 if diagonal else np.ascontiguousarray(X, dtype=np.float64)
        # from LOO_PRUNE_MIN_ROWS keys: k-d order, tiles pruned by the leaves' boxes,
        # unless they would keep most keys (a wide kernel), where gathering costs more
        keys = _pruned_keys(z64, points64, y2)
        if keys is None:
            keys = _plain_keys(z64, points64, y2)
        sse, sums = _sum_over_rows(_tile_loss_grad_rows, n, keys, z, z_t, v_t, y2, dtype, diagonal)
        if diagonal:
            return sse / size, 2.0 * scale * sums
        return sse / size, -scale * (L @ sums)
    if diagonal:
        # (x_id - x_jd)^2 / h_d^2 = 2 (z_id - z_jd)^2 with the sqrt(2) of the layout
        sse, sums = _sum_over_rows(_loss_grad_rows, n, z, z_t, v_t, y2, None, None, dtype, device)
        return sse / size, 2.0 * scale * sums
    pts = np.ascontiguousarray(X, dtype=dtype)
    sse, M = _sum_over_rows(
        _loss_grad_rows, n, z, z_t, v_t, y2, pts, np.ascontiguousarray(pts.T), dtype, device
    )
    return sse / size, -scale * (L @ M)


def _prepared_loss_and_grad(X, y2, widths=None, components=None, *, dtype, device, n_rows=None):
    """:func:`loo_loss_and_grad` on inputs already checked and centred by ``_prepare_xy``."""
    v_t = np.ascontiguousarray(y2.T, dtype=dtype)
    if components is None:
        z, z_t = _scaled(X, 1.0 / widths, dtype)
    else:
        # scores on the mean-centred points (the layout of the loss-only kernels); the
        # gradient's coordinates keep _prepare_xy's median centring: M depends on
        # differences only, and an outlying row pulls the mean away from the bulk, where
        # the expanded sums of kernels.loo_tiles (x x^T terms) would then lose digits
        z, z_t = _projected(X - X.mean(axis=0), components, dtype)
    n_queries = X.shape[0] if n_rows is None else n_rows
    with _threads_for(n_queries * X.shape[0]):
        return _loss_and_grad_passes(
            X, y2, z, z_t, v_t, dtype, components is None, components, device, n_rows
        )


# --------------------------------------------------------------------------- bandwidth search


def loo_bandwidth(
    X,
    y,
    *,
    base="scott",
    grid=None,
    xatol=None,
    grid_queries=4096,
    early_stop=None,
    random_state=0,
    dtype=None,
    return_curve=False,
    device="cpu",
    verbose=False,
    name=None,
):
    """Per-feature widths ``c* h0`` minimising the LOO MSE over one scale factor c.

    A bounded search on the log scale (:func:`nbattn.search.minimize_log_scale`):

    1. **Grid.** The LOO MSE at every ``config.LOO_GRID_STRIDE``-th factor of
       ``grid`` (default ``config.LOO_GRID``: 0.01 to 100, six per decade, with
       1, the base rule itself; every third factor from 1, and both ends),
       then at every factor of ``grid`` inside a coarse interval that touches
       a value within ``config.LOO_FILL_MARGIN`` (10 %) of the best so far,
       until none is added: near the minimum the search sees the whole grid,
       and the wide, costly widths far above it are skipped. The whole range,
       whatever the curve does on the way: LOO curves have flat stretches (at
       small widths every row is predicted by its nearest neighbour, and the
       curve is flat to 1e-10) and several local minima. A dip lying wholly
       inside a coarse interval whose two ends are more than the margin above
       the best value is not sought (``config.LOO_GRID_STRIDE = 1`` evaluates
       the whole grid; on 300 random data sets the two gave the same LOO MSE
       to 1e-6).
    2. **Ends.** If the best factor is an end of the grid, the grid grows a
       coarse step at a time in that direction while the criterion still falls, up
       to ``config.LOO_EXTEND_DECADES`` decades; a minimum still at the end
       there gives a :class:`BandwidthRangeWarning` naming the data and the
       direction, never a silent edge.
    3. **Refinement.** Bounded Brent on log c between the grid neighbours of
       the best factor, and of up to two other local minima of the grid
       within 2 % of it (the minimum can hide in a dip narrower than the
       grid spacing), to ``xatol`` in log c (default 3e-4, 0.03 % in the
       width; 1e-2 when n > ``grid_queries``, where each evaluation is
       costly and 1 % far below the statistical spread of the width).

    Values of the criterion are compared in float64 with the relative
    tolerance ``config.LOO_RTOL`` (1e-5): values that close are equal. On a
    plateau the factor nearest 1 wins; a refined factor replaces the best
    grid factor only when it is better by more than the tolerance. So the
    float32 search makes the float64 search's choices, and the answer is
    never worse than the base rule (factor 1, always evaluated exactly).
    The criterion is computed on y centred and divided by a power of two
    (the LOO MSE changes by that exact factor only), so targets far from 0
    or of extreme magnitude keep their float32 digits and do not overflow.

    For n > ``grid_queries`` the grid stage leaves out and predicts only a
    fixed random subset of ``grid_queries`` rows (in 1-D at most
    ``config.LOO_GRID_QUERIES_1D`` = 1024; every row stays a key): an
    unbiased estimate of the LOO MSE that only picks the bracket; the base
    rule and the best grid factor are then evaluated exactly, and the
    refinement first walks the grid on exact values to a local minimum
    (the estimate may be a step or two off). Pass
    ``grid_queries=None`` for an exact grid stage (n^2 work per factor).
    1-D data are sorted once. Narrow widths are evaluated by a windowed kernel
    that skips keys whose weight is below exp(-50) of the nearest one (exact to
    float64 rounding), at a cost of n x (window) that grows with the width;
    from a window of ``config.LOO_BOXED_MIN_WINDOW`` keys per row on, by a
    boxed Hermite series (:func:`nbattn.kernels.loo.loo_squared_error_boxed_1d`,
    a one-dimensional fast Gauss transform: O(n) whatever the width, each
    prediction within ``2 config.LOO_BOXED_TOL max|y|`` of the exact one by a
    proven bound checked row by row, the rows it cannot vouch for computed by
    the windowed kernel). On fewer points than that window, widths at which
    the scaled points span at most 2 (squared span
    ``config.LOO_TAYLOR_MAX_SPAN_SQ``) take one Taylor series about the middle
    of the range (:func:`nbattn.kernels.loo.loo_squared_error_taylor_1d`).
    At n = 2,000 the evaluations run on one thread: each takes about 0.2 ms,
    less than a parallel launch can cost on a busy machine.

    The classifier's Brier criterion is this one on one-hot targets.

    Parameters
    ----------
    X : array-like (n, d) or (n,), n >= 2
    y : array-like (n,) or (n, p)
    base : "scott", "silverman", float or array (d,)
        Base widths h0 (a constant feature gets the rule's unit spread, see
        :func:`nbattn.smoothing.regression.bandwidth_rule`: it adds nothing to the
        score whatever its width).
    grid : array of positive factors, optional
        The factor 1 is always added.
    xatol : float, the Brent tolerance in log c (default: see above)
    grid_queries : int or None, rows left out in the grid stage when n is larger
    early_stop : deprecated, ignored
        The grid stage no longer stops early (a rise of 4e-10 on a flat
        stretch stopped it at the narrow edge); giving it warns.
    random_state : seed of that subset
    dtype : "float64" or "float32"
    return_curve : bool
        Also return ``(factors, losses)`` of every exact evaluation, sorted by
        factor (with the grid stage subsampled, only the exact ones).
    device : "cpu", "cuda" or "auto"
        On the GPU every evaluation uses the full (unsorted) kernel
        ``nbattn.cuda.loo.loo_squared_error``, also in 1-D.
    verbose : bool or int
        Progress on stderr (:mod:`nbattn._core.progress`): each factor tried
        and its criterion, and the choice.
    name : str, optional
        How warnings and progress lines name the data (a file name, say);
        default "X (n rows, d features)".

    Returns
    -------
    bandwidth : ndarray (d,)
    curve : tuple of two arrays, only with ``return_curve=True``

    Warns
    -----
    BandwidthRangeWarning
        The criterion still falls at an end of the extended range.
    """
    if early_stop is not None:
        warnings.warn(
            "loo_bandwidth(early_stop=...) is deprecated and ignored: the grid stage always "
            "scans the whole grid",
            DeprecationWarning,
            stacklevel=2,
        )
    dtype = resolve_dtype(dtype, X, y)
    X, y2 = _prepare_xy(X, y, dtype)
    n, d = X.shape
    what = name if name is not None else f"X ({n} rows, {d} feature{'s' if d > 1 else ''})"
    # a power of two near max |y| (exact to divide by) keeps the criterion O(1)
    unit = float(power_of_two_scale(np.max(np.abs(y2))))
    y2 = y2 / unit
    loss_unit = unit * unit  # the criterion of the original y = loss_unit * the computed one
    h0 = resolve_bandwidth(base, X)
    base_name = base if isinstance(base, str) else "base"
    grid = (
        np.asarray(config.LOO_GRID, dtype=np.float64)
        if grid is None
        else np.asarray(grid, dtype=np.float64).reshape(-1)
    )
    if grid.size < 1 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise ValueError("grid must hold positive finite factors")
    log_grid = np.log(np.sort(grid))
    rows = None
    if grid_queries is not None and n > int(grid_queries):
        # 1-D: fewer rows, for the windowed kernel's wide widths cost rows x n each
        size = int(grid_queries) if d > 1 else min(int(grid_queries), config.LOO_GRID_QUERIES_1D)
        rng = np.random.default_rng(random_state)
        rows = np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)
    if xatol is None:
        xatol = 1e-2 if rows is not None else 3e-4
    device = resolve_device(device)
    # sorted 1-D points: the windowed kernel skips negligible keys (CPU only)
    sorted_1d = d == 1 and device == "cpu"
    if sorted_1d:
        order = np.argsort(X[:, 0], kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        x_sorted = X[order, 0]
        y_sorted = np.ascontiguousarray(y2[order])
        v_sorted = np.ascontiguousarray(y_sorted.T, dtype=dtype)
        gap = _cpu_loo().prune_gap_for(dtype)

    def loss_at(t, subset):
        if sorted_1d:
            zs = np.ascontiguousarray(x_sorted / (np.exp(t) * h0[0] * np.sqrt(2.0)), dtype=dtype)
            span = max(float(zs[-1]) - float(zs[0]), 1e-300)
            window = min(n, n * 2.0 * np.sqrt(gap) / span + 2.0)  # typical keys per row
            # medium and wide widths: the boxed series costs O(n) whatever the width
            # (measured faster than the one-centre Taylor series at every width too)
            if _boxed_1d_pays(n, span, window):
                if subset is None:
                    args = (zs, v_sorted, y_sorted, gap)
                    return _sum_over_rows(_sse_rows_boxed_1d, n, *args) / y2.size
                sub = np.sort(rank[subset])
                with _threads_for(sub.size * _BOXED_PAIRS_PER_ROW):
                    total, _ = _cpu_loo().loo_squared_error_boxed_rows_1d(
                        zs, v_sorted, y_sorted, sub, gap
                    )
                return total / (sub.size * y2.shape[1])
            n_terms = _cpu_loo().taylor_terms(span * span)
            if n_terms:  # wide on few points: every key counts, and the series costs O(n)
                if subset is None:
                    args = (zs, v_sorted, y_sorted, n_terms)
                    return _sum_over_rows(_sse_rows_taylor_1d, n, *args) / y2.size
                sub = np.sort(rank[subset])
                total = _cpu_loo().loo_squared_error_taylor_1d(zs, v_sorted, y_sorted, sub, n_terms)
                return float(total) / (sub.size * y2.shape[1])
            if subset is None:
                args = (zs, v_sorted, y_sorted, gap, window)
                return _sum_over_rows(_sse_rows_sorted_1d, n, *args) / y2.size
            sub = rank[subset]
            sub.sort()
            with _threads_for(sub.size * window):
                total = _cpu_loo().loo_squared_error_sorted_1d(zs, v_sorted, y_sorted, sub, gap)
            return float(total) / (sub.size * y2.shape[1])
        z, z_t = _scaled(X, 1.0 / (np.exp(t) * h0), dtype)
        return _loss_from_layout(z, z_t, y2, dtype, subset, device)

    with FitProgress(verbose, "loo_bandwidth", total=log_grid.size, unit="width") as log:
        best = [math.inf, None]

        def report(stage, t, value):
            if value < best[0]:
                best[0], best[1] = value, t
            label = {"grid": "grid", "extend": "extended grid", "exact": "exact"}.get(
                stage, "refine"
            )
            estimate = " (estimate)" if rows is not None and stage in ("grid", "extend") else ""
            log.step(
                f"{label}: {math.exp(t):.4g} x {base_name}: LOO criterion "
                f"{value * loss_unit:.6g}{estimate}; best {best[0] * loss_unit:.6g} at "
                f"{math.exp(best[1]):.4g} x",
                n=1 if stage in ("grid", "extend") else 0,
            )

        result = minimize_log_scale(
            lambda t: loss_at(t, None),
            log_grid,
            rtol=config.LOO_RTOL,
            xatol=xatol,
            extend=config.LOO_EXTEND_DECADES * math.log(10.0),
            anchor=0.0,
            coarse=None if rows is None else (lambda t: loss_at(t, rows)),
            report=report if log.enabled else None,
            stride=config.LOO_GRID_STRIDE,
            fill_margin=config.LOO_FILL_MARGIN,
        )
        factor = math.exp(result.t)
        log.note(
            f"{what}: {factor:.4g} x {base_name} widths, LOO criterion "
            f"{result.value * loss_unit:.7g} ({base_name}: {result.exact[0.0] * loss_unit:.7g}); "
            f"{result.n_coarse} grid and {result.n_exact} exact evaluations"
        )
    if result.edge is not None:
        direction = "narrower" if result.edge == "low" else "wider"
        warnings.warn(
            f"loo_bandwidth: on {what} the leave-one-out criterion still falls towards "
            f"{direction} widths at the end of the search range ({factor:.3g} x the "
            f"{base_name} widths, {config.LOO_EXTEND_DECADES:g} decades beyond the grid); "
            "the width returned is that end, not a minimum",
            BandwidthRangeWarning,
            stacklevel=2,
        )
    bandwidth = factor * h0
    if not return_curve:
        return bandwidth
    ts = np.array(list(result.exact))
    losses = np.array([result.exact[t] for t in ts]) * loss_unit
    return bandwidth, (np.exp(ts), losses)


# --------------------------------------------------------------------------- learned metrics


def _standardise(X):
    """(X - median) / spread per column, with the spread computed at any magnitude."""
    sigma = feature_spread(X)
    sigma = np.where(sigma > 0, sigma, 1.0)
    return (X - np.median(X, axis=0)) / sigma, sigma


def _initial_components(Xs, h_std, n_components, init, rng):
    d = Xs.shape[1]
    if isinstance(init, str) and init == "scott":
        if n_components == d:
            return np.diag(1.0 / h_std)
        # the leading principal directions of the standardised data, scaled like Scott
        _, _, vt = np.linalg.svd(Xs, full_matrices=False)
        return vt[:n_components] / h_std[:n_components].mean()
    if isinstance(init, str) and init == "random":
        return rng.standard_normal((n_components, d)) / (np.sqrt(d) * h_std.mean())
    raise ValueError(f"init must be 'scott', 'random' or an array, got {init!r}")


def fit_learned_kernel(
    X,
    y,
    metric="diagonal",
    *,
    n_components=None,
    init="scott",
    max_iter=200,
    tol=1e-6,
    random_state=None,
    dtype=None,
    device="cpu",
    verbose=False,
):
    """Minimise the LOO MSE over the kernel's metric with L-BFGS-B and the exact gradient.

    Parameters
    ----------
    X : array-like (n, d), n >= 2
    y : array-like (n,) or (n, p)
    metric : "scalar", "diagonal" or "full"
        * "scalar": widths ``c * h_scott``, c learned (the seed's single w);
        * "diagonal": one width per feature, learned on the log scale;
        * "full": a linear map L (n_components, d), score ``-1/2 ||L(x - x')||^2``.
        Scalar and diagonal log-widths are bounded to ``config.WIDTH_BOUNDS``
        times the Scott widths (1e-3 ... 1e4), so an irrelevant feature's width
        grows until the bound instead of overflowing.
    n_components : int, only for "full" (default d)
    init : "scott", "random" (full only) or an array
        "scott" starts from Scott's widths (full: ``L = diag(1/h_scott)``, or
        the leading principal directions when n_components < d). An array
        gives the initial widths (d,) or factor (scalar), or L (full).
    max_iter, tol : L-BFGS-B's ``maxiter`` and ``tol`` (on the loss divided
        by the variance of y, so that ``tol`` does not depend on y's units).
    random_state : seed for init="random" and for the subsamples of the ladder
    dtype : "float64" or "float32"
    device : "cpu", "cuda" or "auto": where the LOO loss and gradient run
    verbose : bool or int
        Progress on stderr (:mod:`nbattn._core.progress`): the iteration, the
        LOO MSE and its change; a tqdm bar on a terminal, plain lines
        otherwise or with ``verbose=2``.

    Returns
    -------
    dict with ``bandwidth`` (d,) or ``components`` (k, d), ``loss`` (final LOO
    MSE, on all rows), ``loss_curve`` (the criterion at the start and after each
    iteration: the subsample estimates during the early stages), ``n_iter`` (all
    stages), ``converged`` and ``message`` (of the last stage) and ``stages``
    (the query rows of each stage, the last one n).

    Notes
    -----
    Many rows (the ladder). One evaluation costs n^2 pairs. With
    n >= 2 m, m = max(``config.LEARN_SUBSAMPLE_ROWS``,
    ``config.LEARN_ROWS_PER_PARAMETER`` x parameters), the rows are shuffled and
    L-BFGS-B first minimises the criterion of the first m rows, each left out and
    predicted against all n keys (an unbiased estimate of the LOO MSE, with its
    exact gradient; m n pairs), then of ``LEARN_SUBSAMPLE_GROWTH`` times more rows
    while that is at most n / 2, each stage starting where the last one ended,
    and finishes on the full criterion. A stage whose criterion is lower at the
    initial point than at the previous stage's result (the subsample was
    overfitted) starts afresh from the initial point, so the result is never
    worse than the start. In the ladder, ``tol`` is relative to each stage's
    starting loss (not to the variance of y: a warm start is near a minimum),
    and the last stage minimises the full criterion.

    Many keys (on the CPU, n >= ``config.LOO_PRUNE_MIN_ROWS``): each evaluation
    orders the keys by a k-d split of the current score space and each tile of
    query rows takes only the leaves whose bounding box comes within reach of
    one of its rows (``kernels.loo_tiles.loo_tiles_boxed``): the skipped keys
    weigh less than exp(-``config.PRUNE_GAP_FLOAT64``) of their row's largest
    weight, so the loss and gradient are those of all keys to rounding.

    Warns
    -----
    sklearn.exceptions.ConvergenceWarning
        when L-BFGS-B stops without meeting its tolerance (e.g. ``max_iter``).

    Raises
    ------
    FloatingPointError
        if the loss or gradient ever becomes non-finite (never returned silently).
    """
    from scipy.optimize import minimize

    if metric not in ("scalar", "diagonal", "full"):
        raise ValueError(f"metric must be 'scalar', 'diagonal' or 'full', got {metric!r}")
    check_verbose(verbose)
    dtype = resolve_dtype(dtype, X, y)
    device = resolve_device(device)
    X, y2 = _prepare_xy(X, y, dtype)
    n, d = X.shape
    Xs, sigma = _standardise(X)
    h_std = bandwidth_rule(Xs, "scott")  # Scott widths of the standardised data
    y_var = float(np.mean(np.var(y2, axis=0)))
    norm = y_var if y_var > 0 else 1.0
    rng = np.random.default_rng(random_state)
    is_array_init = not isinstance(init, str)

    if metric in ("scalar", "diagonal"):
        if is_array_init:
            h_init = np.broadcast_to(np.asarray(init, dtype=np.float64).reshape(-1), (d,)) / sigma
            if metric == "scalar":
                h_init = np.full(d, float(np.mean(h_init / h_std))) * h_std
        elif init == "scott":
            h_init = h_std.copy()
        else:
            raise ValueError(f"init must be 'scott' or an array for metric={metric!r}")
        if not np.all(np.isfinite(h_init)) or np.any(h_init <= 0):
            raise ValueError("init widths must be positive and finite")
        lo, hi = np.log(config.WIDTH_BOUNDS[0]), np.log(config.WIDTH_BOUNDS[1])
        if metric == "scalar":
            x0 = np.array([np.log(h_init[0] / h_std[0])])
            bounds = [(lo, hi)]

            def widths(p):
                return np.exp(p[0]) * h_std

            def fun(p, n_rows):
                loss, g = _prepared_loss_and_grad(
                    Xs, y2, widths(p), dtype=dtype, device=device, n_rows=n_rows
                )
                return loss, np.array([g.sum()])
        else:
            x0 = np.log(h_init)
            log_h = np.log(h_std)
            bounds = list(zip(log_h + lo, log_h + hi))

            def widths(p):
                return np.exp(p)

            def fun(p, n_rows):
                return _prepared_loss_and_grad(
                    Xs, y2, widths(p), dtype=dtype, device=device, n_rows=n_rows
                )

        def layout(p):
            return _scaled(Xs, 1.0 / widths(p), dtype)

        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
    else:
        k = d if n_components is None else int(n_components)
        if not 1 <= k <= d:
            raise ValueError(f"n_components must be in [1, {d}], got {n_components!r}")
        if is_array_init:
            L0 = _check_components(init, d) * sigma  # to standardised coordinates
            if L0.shape[0] != k:
                raise ValueError(f"init has {L0.shape[0]} rows but n_components is {k}")
        else:
            L0 = _initial_components(Xs, h_std, k, init, rng)
        x0 = L0.ravel()
        bounds = None

        def fun(p, n_rows):
            return _prepared_loss_and_grad(
                Xs, y2, components=p.reshape(k, d), dtype=dtype, device=device, n_rows=n_rows
            )

        def layout(p):
            return _projected(Xs - Xs.mean(axis=0), p.reshape(k, d), dtype)

    stages = _subsample_ladder(n, x0.size)
    if len(stages) > 1:
        # the rows in a random order: rows [0, m) are a random subsample of m rows
        order = rng.permutation(n)
        Xs, y2 = np.ascontiguousarray(Xs[order]), np.ascontiguousarray(y2[order])
    curve = []
    stage_rows = [None]
    scale = [norm]  # the objective is loss / scale: tol is relative to it
    last = {}  # the last evaluation, so that a stage's start check costs L-BFGS-B nothing

    def raw(p):
        key = (stage_rows[0], p.tobytes())
        if key not in last:
            last.clear()
            last[key] = fun(p, stage_rows[0])
        loss, grad = last[key]
        if not np.isfinite(loss) or not np.all(np.isfinite(grad)):
            raise FloatingPointError(
                f"the LOO loss or its gradient became non-finite (loss={loss!r})"
            )
        if not curve:  # L-BFGS-B evaluates x0 first: the start of the loss curve
            curve.append(float(loss))
        return loss, grad

    def objective(p):
        loss, grad = raw(p)
        return loss / scale[0], np.ravel(grad) / scale[0]

    def start_loss():
        """The criterion of this stage at x0. Where the tiles would not prune (the
        start's widths are often wide), without its gradient: the loss-only kernel
        costs a third of the tile pass (diamonds, all rows at Scott's widths: 1.8 s
        against 6.6 s); where they would, by the pruned tile pass."""
        rows = stage_rows[0]
        z, z_t = layout(x0)
        if device == "cpu":
            z64 = np.ascontiguousarray(z, dtype=np.float64)
            if _pruned_keys(z64, z64, y2) is not None:
                return raw(x0)[0]
        return _loss_from_layout(
            z, z_t, y2, dtype, rows=None if rows is None else np.arange(rows), device=device
        )

    n_iter, x = 0, x0
    with FitProgress(verbose, "fit_learned_kernel", total=int(max_iter), unit="iter") as log:

        def callback(intermediate_result):
            curve.append(float(intermediate_result.fun) * scale[0])
            estimate = "" if stage_rows[0] is None else f" (estimate on {stage_rows[0]} rows)"
            log.step(
                f"iteration {len(curve) - 1}: LOO MSE {curve[-1]:.6g}{estimate} "
                f"(change {curve[-1] - curve[-2]:+.3g})"
            )

        if log.enabled:
            log.note(f"{metric} metric, {n} rows, {d} features")
        for rows in stages:
            stage_rows[0] = None if rows == n else rows
            if log.enabled and len(stages) > 1:
                what = "all rows" if rows == n else f"a random subsample of {rows} query rows"
                log.note(f"stage: the LOO criterion of {what} against all {n} keys")
            if rows != stages[0] and start_loss() < raw(x)[0]:
                # the subsample led somewhere worse than the start on this stage's
                # criterion (it was overfitted): start this stage afresh
                if log.enabled:
                    log.note("the previous stage's result is worse than the start here: restart")
                x = x0
            if len(stages) > 1:
                # relative to the stage's starting loss, not var(y): a warm start is
                # near a minimum, and a tolerance on loss / var(y) (LOO MSE << var(y))
                # would end the stage after a step or two
                start = float(raw(x)[0])
                scale[0] = start if start > 0 else norm
            restarts = int(config.LEARN_FINAL_RESTARTS) if len(stages) > 1 and rows == n else 0
            res = None
            for _ in range(1 + restarts):
                # On the last stage of the ladder, L-BFGS-B starts again from where it
                # stopped, with fresh curvature pairs, while that gains more than tol: a
                # warm start in a long flat valley (a width that barely matters) stops on
                # a short step far from the minimum.
                again = minimize(
                    objective,
                    x,
                    jac=True,
                    method="L-BFGS-B",
                    bounds=bounds,
                    tol=tol,
                    callback=callback,
                    options={"maxiter": max(int(max_iter) - n_iter, 1)},
                )
                n_iter += int(again.nit)
                gained = res is None or res.fun - again.fun > tol * abs(res.fun)
                if res is None or again.fun <= res.fun:
                    res, x = again, again.x
                if not gained or n_iter >= int(max_iter):
                    break
        converged = bool(res.success)
        if log.enabled:
            log.note(
                f"{'converged' if converged else 'stopped'} after {n_iter} iterations: "
                f"LOO MSE {float(res.fun) * scale[0]:.6g} (start {curve[0]:.6g}); {res.message}"
            )
    if not converged:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(
            f"L-BFGS-B did not converge in {n_iter} iterations ({res.message}); "
            "increase max_iter or loosen tol",
            ConvergenceWarning,
            stacklevel=2,
        )
    result = {
        "loss": float(res.fun) * scale[0],
        "loss_curve": np.array(curve),
        "n_iter": n_iter,
        "converged": converged,
        "message": str(res.message),
        "stages": stages,
    }
    if metric == "full":
        result["components"] = res.x.reshape(-1, d) / sigma
    else:
        result["bandwidth"] = widths(res.x) * sigma
    return result


def _subsample_ladder(n, n_params):
    """Query rows of each fitting stage: ``[m, g m, g^2 m, ..., n]`` with m the larger of
    ``config.LEARN_SUBSAMPLE_ROWS`` and ``config.LEARN_ROWS_PER_PARAMETER * n_params``
    and g = ``config.LEARN_SUBSAMPLE_GROWTH``, every subsample at most half of the
    rows; ``[n]`` when n < 2 m (or LEARN_SUBSAMPLE_ROWS = 0)."""
    if int(config.LEARN_SUBSAMPLE_ROWS) <= 0:
        return [n]
    first = max(int(config.LEARN_SUBSAMPLE_ROWS), int(config.LEARN_ROWS_PER_PARAMETER) * n_params)
    growth = max(int(config.LEARN_SUBSAMPLE_GROWTH), 2)
    stages = []
    rows = first
    while 0 < rows and 2 * rows <= n:
        stages.append(rows)
        rows *= growth
    return stages + [n]


# --------------------------------------------------------------------------- spread


def nadaraya_watson_spread(queries, keys, values, bandwidth="scott", *, dtype=None, device="cpu"):
    """Pooled mean, attention-weighted standard deviation and effective number of neighbours.

    .. math::

        f_i = \\sum_j w_{ij} v_j, \\qquad
        \\sigma_{ic} = \\sqrt{\\sum_j w_{ij} (v_{jc} - f_{ic})^2}, \\qquad
        n^{\\mathrm{eff}}_i = 1 / \\sum_j w_{ij}^2

    with ``w_ij = softmax_j(-1/2 sum_d ((q_id - k_jd)/h_d)^2)``. Two streaming
    passes: the pool gives f and lse, the second pass sums the squared
    deviations about f (no cancellation, unlike E[v^2] - E[v]^2) and the
    squared weights. n_eff runs from 1 (one key holds all the weight) to
    n_keys (uniform weights). The deviations are divided by a power of two
    near max |v| before squaring, so values near 1e200 or 1e-200 keep their
    spread; a query far from every key gets its nearest key's value, std 0
    (or the spread of tied nearest keys) and n_eff 1. ``device`` ("cpu",
    "cuda" or "auto") picks the kernels of both passes; the results are NumPy
    arrays either way.

    Returns
    -------
    mean, std : ndarray (n_queries,) or (n_queries, n_outputs) like ``values``
    n_eff : ndarray (n_queries,)
    """
    dtype = resolve_dtype(dtype, queries, keys, values)
    queries, keys, v2, values_1d = check_pooling_inputs(queries, keys, values)
    h = resolve_bandwidth(bandwidth, keys)
    q, _ = _scaled(queries, 1.0 / h, dtype)
    _, k_t = _scaled(keys, 1.0 / h, dtype)
    v_t = np.ascontiguousarray(v2.T, dtype=dtype)
    with _threads_for(q.shape[0] * k_t.shape[1]):
        mean, lse = kernels_for("pooling", device).gaussian_pool(q, k_t, v_t, False, 0)
        std, sum_w2 = kernels_for("loo", device).gaussian_spread(q, k_t, v_t, mean, lse, False)
    if not isinstance(mean, np.ndarray):  # the CUDA pool returns device arrays
        mean = to_host(mean)
    n_eff = 1.0 / sum_w2
    mean = mean.astype(np.float64)
    if values_1d:
        return mean[:, 0], std[:, 0], n_eff
    return mean, std, n_eff
