"""The leave-one-out width search: the one scale factor c of the base widths, ``c* h0``.

:func:`loo_bandwidth` minimises the LOO MSE (:mod:`nbattn.smoothing.loo`) of
Nadaraya-Watson regression with widths ``c h0`` (h0 Scott's rule by default) over
``t = log c``, by the bounded search of :func:`nbattn.search.minimize_log_scale`:

1. **the grid**: every ``config.LOO_GRID_STRIDE``-th factor of ``config.LOO_GRID``
   (from 1, with both ends), estimated on a subset of the rows when there are many;
2. **the fill**: every factor between coarse points that come within
   ``config.LOO_FILL_MARGIN`` of the best value;
3. **the extension**: the grid grows at an end while the criterion still falls
   there, up to ``config.LOO_EXTEND_DECADES`` decades; a minimum still at the end
   then gives a :class:`BandwidthRangeWarning`;
4. **the refinement**: bounded Brent on t around the best grid factors.

This module sets the search up: the targets scaled to O(1), the grid, the subset
of the rows for the grid stage, the criterion at a factor (in 1-D on the CPU, on
sorted points: :mod:`nbattn.smoothing.loo_1d`), the progress lines and the
warning. The tunables live in :mod:`nbattn.config` and are read at call time.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .. import config
from .._core.numeric import power_of_two_scale
from .._core.progress import FitProgress
from .._core.validation import plural, resolve_dtype
from ..dispatch.device import resolve_device
from .loo import centred_xy, check_xy
from .loo_1d import SortedCriterion1D
from .loo_rows import loss_from_layout
from .regression import resolve_bandwidth, scaled_layout
from .search import BandwidthRangeWarning, minimize_log_scale

__all__ = [
    "LOO_GRID",  # noqa: F822 - provided by the module __getattr__ (config at call time)
    "loo_bandwidth",
    "loo_scale",
]


def __getattr__(name):
    # the grid as an array, always the one in config (tests patch config.LOO_GRID)
    if name == "LOO_GRID":
        return np.asarray(config.LOO_GRID, dtype=np.float64)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    boxed Hermite series (:func:`nbattn.kernels.loo_1d.loo_squared_error_boxed_1d`,
    a one-dimensional fast Gauss transform: O(n) whatever the width, each
    prediction within ``2 config.LOO_BOXED_TOL max|y|`` of the exact one by a
    proven bound checked row by row, the rows it cannot vouch for computed by
    the windowed kernel). On fewer points than that window, widths at which
    the scaled points span at most 2 (squared span
    ``config.LOO_TAYLOR_MAX_SPAN_SQ``) take one Taylor series about the middle
    of the range (:func:`nbattn.kernels.loo_1d.loo_squared_error_taylor_1d`).
    At n = 2,000 the evaluations run on one thread: each takes about 0.2 ms,
    less than a parallel launch can cost on a busy machine.

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
    X, y2 = check_xy(X, y)
    return loo_scale(
        X,
        y2,
        base=base,
        grid=grid,
        xatol=xatol,
        grid_queries=grid_queries,
        random_state=random_state,
        dtype=dtype,
        return_curve=return_curve,
        device=device,
        verbose=verbose,
        name=name,
    )


def loo_scale(
    X,
    y2,
    *,
    base="scott",
    grid=None,
    xatol=None,
    grid_queries=4096,
    random_state=0,
    dtype=np.float64,
    return_curve=False,
    device="cpu",
    verbose=False,
    name=None,
):
    """:func:`loo_bandwidth` on checked float64 X (n, d) and y (n, p) (an estimator's
    training data, or :func:`nbattn.smoothing.loo.check_xy`'s); ``dtype`` resolved."""
    X, y2 = centred_xy(X, y2)
    n, d = X.shape
    what = name if name is not None else f"X ({plural(n, 'row')}, {plural(d, 'feature')})"
    # a power of two near max |y| (exact to divide by) keeps the criterion O(1)
    unit = float(power_of_two_scale(np.max(np.abs(y2))))
    y2 = y2 / unit
    loss_unit = unit * unit  # the criterion of the original y = loss_unit * the computed one
    h0 = resolve_bandwidth(base, X, "X")
    base_name = base if isinstance(base, str) else "base"
    log_grid = _log_grid(grid)
    rows = _grid_stage_rows(n, d, grid_queries, random_state)
    if xatol is None:
        xatol = 1e-2 if rows is not None else 3e-4
    criterion = _ScaleCriterion(X, y2, h0, dtype, resolve_device(device))
    with FitProgress(verbose, "loo_bandwidth", total=log_grid.size, unit="width") as log:
        result = minimize_log_scale(
            criterion,
            log_grid,
            rtol=config.LOO_RTOL,
            xatol=xatol,
            extend=config.LOO_EXTEND_DECADES * math.log(10.0),
            anchor=0.0,
            coarse=None if rows is None else (lambda t: criterion(t, rows)),
            report=_SearchLog(log, base_name, loss_unit, rows is not None) if log.enabled else None,
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
        _warn_at_the_edge(result.edge, what, factor, base_name)
    bandwidth = factor * h0
    if not return_curve:
        return bandwidth
    ts = np.array(list(result.exact))
    losses = np.array([result.exact[t] for t in ts]) * loss_unit
    return bandwidth, (np.exp(ts), losses)


def _log_grid(grid):
    """The sorted log-factors of ``grid`` (default ``config.LOO_GRID``), checked."""
    grid = (
        np.asarray(config.LOO_GRID, dtype=np.float64)
        if grid is None
        else np.asarray(grid, dtype=np.float64).reshape(-1)
    )
    if grid.size < 1 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise ValueError("grid must hold positive finite factors")
    return np.log(np.sort(grid))


def _grid_stage_rows(n, d, grid_queries, random_state):
    """The sorted random rows the grid stage leaves out and predicts when n is larger than
    ``grid_queries`` (in 1-D at most ``config.LOO_GRID_QUERIES_1D``), else None (all)."""
    if grid_queries is None or n <= int(grid_queries):
        return None
    # 1-D: fewer rows, for the windowed kernel's wide widths cost rows x n each
    size = int(grid_queries) if d > 1 else min(int(grid_queries), config.LOO_GRID_QUERIES_1D)
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)


class _ScaleCriterion:
    """The LOO MSE at ``t = log c``, widths ``exp(t) h0``: of every row, or an estimate
    from ``rows`` only (each left out and predicted against every key)."""

    def __init__(self, X, y2, h0, dtype, device):
        self.X, self.y2, self.h0, self.dtype, self.device = X, y2, h0, dtype, device
        # sorted 1-D points: the windowed kernel skips negligible keys (CPU only)
        sorted_1d = X.shape[1] == 1 and device == "cpu"
        self.sorted_1d = SortedCriterion1D(X[:, 0], y2, dtype) if sorted_1d else None

    def __call__(self, t, rows=None):
        if self.sorted_1d is not None:
            return self.sorted_1d.loss(np.exp(t) * self.h0[0], rows)
        widths = np.exp(t) * self.h0
        z, z_t = scaled_layout(self.X, 1.0 / widths, self.dtype, widths=widths)
        return loss_from_layout(z, z_t, self.y2, self.dtype, rows, self.device)


class _SearchLog:
    """The search's ``report``: a progress line per evaluation, with the best so far."""

    _LABELS = {"grid": "grid", "extend": "extended grid", "exact": "exact"}

    def __init__(self, log, base_name, loss_unit, estimated):
        self.log, self.base_name, self.loss_unit = log, base_name, loss_unit
        self.estimated = estimated  # the grid stage runs on a subset of the rows
        self.best_value, self.best_t = math.inf, None

    def __call__(self, stage, t, value):
        if value < self.best_value:
            self.best_value, self.best_t = value, t
        on_grid = stage in ("grid", "extend")
        estimate = " (estimate)" if self.estimated and on_grid else ""
        self.log.step(
            f"{self._LABELS.get(stage, 'refine')}: {math.exp(t):.4g} x {self.base_name}: "
            f"LOO criterion {value * self.loss_unit:.6g}{estimate}; best "
            f"{self.best_value * self.loss_unit:.6g} at {math.exp(self.best_t):.4g} x",
            n=1 if on_grid else 0,
        )


def _warn_at_the_edge(edge, what, factor, base_name):
    """The :class:`BandwidthRangeWarning` of a minimum at an end of the extended range,
    attributed to the caller of :func:`loo_bandwidth`."""
    direction = "narrower" if edge == "low" else "wider"
    warnings.warn(
        f"loo_bandwidth: on {what} the leave-one-out criterion still falls towards "
        f"{direction} widths at the end of the search range ({factor:.3g} x the "
        f"{base_name} widths, {config.LOO_EXTEND_DECADES:g} decades beyond the grid); "
        "the width returned is that end, not a minimum",
        BandwidthRangeWarning,
        stacklevel=3,
    )
