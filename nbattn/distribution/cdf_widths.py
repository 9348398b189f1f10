"""y's width for a conditional distribution function by cross-validation of the CDF
(Li, Lin and Racine 2013, "Optimal bandwidth selection for nonparametric conditional
distribution and quantile functions", JBES; R np's ``npcdistbw``, whose ``bwmethod =
"cv_ls"`` is this criterion): ``y_bandwidth="cv_cdf"``.

A width chosen for the conditional *density* (``"cv_ml"``, ``"cv_ls"``, the rules) is of
order n^(-1/5); the smoothed CDF F(y | x) = sum_j p_j(x) G((y - y_j) / h_y) then adds h_y^2
to the conditional variance, and its quantile bands come out too wide. The CDF's own
criterion, with x's widths held at the ones given,

    CV(h_y) = sum_i u_i (1 / T) sum_t (1{y_i <= t} - F₋ᵢ(t | x_i))^2,
    F₋ᵢ(t | x_i) = sum_{j != i} p_ij G((t - y_j) / h_y),

u_i = w_i / W, p_ij the leave-one-out pooling weights of x's columns, is the mean squared
error of the leave-one-out CDF at T points t of y's range. Li, Lin and Racine sum t over
every training y (O(n^3)); here t runs over ``CDF_GRID_POINTS`` weighted quantiles of y
(the sample's values, duplicates merged), so an evaluation is O(n^2 T): the integral of
the squared error against y's distribution, by a quadrature at its quantiles. For a
categorical y the points are its codes: an ordered y's cumulative probabilities (the
ranked probability score), an unordered y's probabilities themselves (the Brier score:
an unordered y's cumulative sums would depend on the arbitrary order of its codes).

Computation: G((t - y_j) / h) does not depend on the row i, so for candidate widths
h_1 .. h_K the K T columns V[j, (k, t)] = G((t - y_j) / h_k) are pooled by the engine in
one leave-one-out pass over x's columns (:func:`nbattn.local.engine.fit_values`, degree 0,
the pair (i, i) left out): streaming, O(n K T) memory, every column kind, sample
weights, ``rtol``, on the spec's device. A row that no other row reaches takes its
nearest key's values, as the engine's fits do.

Search (h_y alone; x's widths fixed): the start (the width of the rule or criterion that
chose x's widths) and a log grid of it, half an octave apart from 1/256 to 4 times it,
extended four octaves at a time past an end that holds the best (up to 2^-24 and 2^8
times the start); then two refinements, each ``_REFINE`` points spaced evenly in log h
between the best's neighbours. A categorical y's smoothing l runs over an even grid of
[0, lambda_max] refined alike. Each round is one pass. The answer is the evaluated width
of least CV, the earliest on ties (the start first; differences below 1e-12 relative
are ties): never worse than the start, and the
same bits on every run (the engine's sums are in a fixed order). A y of one value keeps the
start (its CDF at that value is G(0) at every width).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy.special import ndtr

from ..local.engine import fit_values
from ..local.problem import LocalProblem, LocalSpec, check_widths, lambda_max
from .conditional import (
    _integrated,
    conditional_quantiles,
    interval_levels,
    marginal_problem,
)
from .density import _ordered_kernels, density_layout, density_rule_widths

__all__ = ["CDF_GRID_POINTS", "cdf_criterion", "cv_cdf_width", "quantile_interval"]

#: T, the points of y's range where the leave-one-out CDF is compared with the indicator.
CDF_GRID_POINTS = 32

#: Columns per engine pass (K T): bounds the pass's memory at this many floats per row.
_COLUMNS_PER_PASS = 1024

#: Interior points of each refinement between the best width's neighbours.
_REFINE = 7

#: Relative differences of CV below this are rounding: the earlier width is kept.
_TIE = 1e-12

#: The continuous search's range in octaves (log2), relative to the start: first grid, then
#: its limits (the grid itself is half an octave apart).
_FIRST_GRID = (-8, 2)
_LIMITS = (-24, 8)


@dataclasses.dataclass
class _Setup:
    """The checked pieces of the criterion: x's leave-one-out problem, y (scaled when
    continuous), the grid points, the indicator targets and the rows' weights."""

    x_problem: LocalProblem
    kind: str
    y: np.ndarray
    points: np.ndarray
    targets: np.ndarray  # (n, T)
    row_weights: np.ndarray  # u_i, summing to 1
    scale: float  # y's unit: widths are divided by it
    count: int  # categories of a categorical y


def _weighted_points(y, weights, count):
    """``count`` weighted quantiles of y among its own values, duplicates merged."""
    order = np.argsort(y, kind="stable")
    cumulative = np.cumsum(weights[order])
    levels = (np.arange(count) + 0.5) / count * cumulative[-1]
    picks = np.minimum(np.searchsorted(cumulative, levels), y.size - 1)
    return np.unique(y[order][picks])


def _setup(spec: LocalSpec, joint, widths, sample_weight) -> _Setup:
    n = joint.shape[0]
    weights = np.ones(n) if sample_weight is None else np.asarray(sample_weight, np.float64)
    row_weights = weights / weights.sum()
    loo = density_layout(spec, joint, joint, widths, sample_weight, exclude_self=True)
    x_problem = marginal_problem(loo, 1)
    kind = spec.var_type[0]
    y = joint[:, 0]
    if kind == "c":
        low, high = float(y.min()), float(y.max())
        centre = 0.5 * low + 0.5 * high  # no overflow near the largest floats
        scale = 0.5 * high - 0.5 * low
        scale = scale if scale > 0.0 else 1.0
        y = (y - centre) / scale
        points = _weighted_points(y, weights, CDF_GRID_POINTS)
        targets = (y[:, None] <= points[None, :]).astype(np.float64)
        count = 0
    else:
        count = int(spec.n_categories[0])
        scale = 1.0
        points = np.arange(count, dtype=np.float64)
        compare = np.less_equal if kind == "o" else np.equal
        targets = compare(y[:, None], points[None, :]).astype(np.float64)
    return _Setup(x_problem, kind, y, points, targets, row_weights, scale, count)


def _values(setup: _Setup, width: float, kernel: str) -> np.ndarray:
    """V (n, T): each key's integrated kernel at the grid points, width ``width``."""
    if setup.kind == "c":
        z = (setup.points[None, :] - setup.y[:, None]) / (width / setup.scale)
        return ndtr(z) if kernel == "gaussian" else _integrated(z, kernel)
    codes = setup.y.astype(np.int64)
    if setup.kind == "u":
        share = width / (setup.count - 1) if setup.count > 1 else 0.0
        table = np.where(np.eye(setup.count, dtype=bool), 1.0 - width, share)
    else:
        table = np.cumsum(_ordered_kernels(setup.count, width), axis=1)  # row x, column t
    return table[codes]


def _criteria(setup: _Setup, widths, kernel: str) -> np.ndarray:
    """CV at each of ``widths`` (K,), by passes of at most ``_COLUMNS_PER_PASS`` columns."""
    n, points = setup.targets.shape
    per_pass = max(1, _COLUMNS_PER_PASS // points)
    out = np.empty(len(widths))
    for first in range(0, len(widths), per_pass):
        chunk = widths[first : first + per_pass]
        values = np.concatenate([_values(setup, float(h), kernel) for h in chunk], axis=1)
        problem = dataclasses.replace(
            setup.x_problem, values_t=np.ascontiguousarray(values.T), values_1d=False
        )
        pooled = fit_values(problem).reshape(n, len(chunk), points)
        errors = np.mean((pooled - setup.targets[:, None, :]) ** 2, axis=2)
        with np.errstate(invalid="ignore"):
            out[first : first + len(chunk)] = setup.row_weights @ errors
    return np.where(np.isfinite(out), out, np.inf)


def cdf_criterion(spec: LocalSpec, joint, widths, y_widths, sample_weight=None) -> np.ndarray:
    """CV(h_y) of the module docstring at each of ``y_widths`` (K,), x's widths
    ``widths[1:]`` (checked joint data ``joint``, y's column first)."""
    setup = _setup(spec, joint, np.asarray(widths, np.float64), sample_weight)
    return _criteria(setup, np.asarray(y_widths, np.float64).reshape(-1), spec.kernel)


class _Search:
    """The evaluated widths, as multiples of a unit (the start for a continuous y, so
    that the points do not depend on y's scale; 1 for a categorical y), and their CV, in
    evaluation order."""

    def __init__(self, setup, kernel, unit):
        self.setup, self.kernel, self.unit = setup, kernel, unit
        self.ratios: list[float] = []
        self.values: list[float] = []

    def evaluate(self, ratios) -> None:
        fresh = []
        for r in ratios:
            if float(r) not in self.ratios and float(r) not in fresh:
                fresh.append(float(r))
        if fresh:
            self.ratios += fresh
            widths = self.unit * np.array(fresh)
            self.values += list(_criteria(self.setup, widths, self.kernel))

    def best(self) -> int:
        """The index of least CV; a later width replaces an earlier only where it is lower
        by more than rounding (``_TIE`` relative), so a flat criterion keeps the start."""
        k_best = 0
        for k, value in enumerate(self.values):
            if value < self.values[k_best] * (1.0 - _TIE):
                k_best = k
        return k_best

    def refine(self, spaced) -> None:
        """``_REFINE`` points between the best ratio's neighbours, ``spaced`` (geomspace or
        linspace) between each neighbour and it."""
        best = self.ratios[self.best()]
        ordered = sorted(self.ratios)
        k = ordered.index(best)
        points = []
        if k > 0:
            points += list(spaced(ordered[k - 1], best, _REFINE // 2 + 2)[1:-1])
        if k + 1 < len(ordered):
            points += list(spaced(best, ordered[k + 1], _REFINE // 2 + 2)[1:-1])
        self.evaluate(points)


def _continuous_search(search: _Search) -> None:
    def octaves(first, last):  # 2^(k/2), k = first .. last
        return [2.0 ** (k / 2.0) for k in range(first, last + 1)]

    low, high = 2 * _FIRST_GRID[0], 2 * _FIRST_GRID[1]
    search.evaluate([1.0, *octaves(low, high)])
    while True:  # an end that holds the best: four octaves further at a time
        best = search.ratios[search.best()]
        if best == min(search.ratios) and low > 2 * _LIMITS[0]:
            further = max(low - 8, 2 * _LIMITS[0])
            search.evaluate(octaves(further, low - 1)[::-1])
            low = further
        elif best == max(search.ratios) and high < 2 * _LIMITS[1]:
            further = min(high + 8, 2 * _LIMITS[1])
            search.evaluate(octaves(high + 1, further))
            high = further
        else:
            break
    for _ in range(2):
        search.refine(np.geomspace)


def _categorical_search(search: _Search, start: float, top: float) -> None:
    search.evaluate([start, *np.linspace(0.0, top, 21)])
    for _ in range(2):
        search.refine(np.linspace)


def cv_cdf_width(spec: LocalSpec, joint, widths, sample_weight=None, *, verbose=0) -> float:
    """y's width of least CV (module docstring) from the start ``widths[0]``, x's widths
    ``widths[1:]`` held; checked joint data ``joint`` (y's column first) and weights."""
    widths = np.asarray(widths, dtype=np.float64)
    setup = _setup(spec, joint, widths, sample_weight)
    start = float(widths[0])
    if setup.kind == "c":
        if np.ptp(setup.y) == 0.0 or not math.isfinite(start / setup.scale) or start <= 0.0:
            return start  # one value of y: every width gives the same CDF at it
        search = _Search(setup, spec.kernel, start)
        _continuous_search(search)
    else:
        top = float(lambda_max(spec.var_type[:1], spec.n_categories[:1])[0])
        search = _Search(setup, spec.kernel, 1.0)
        _categorical_search(search, start, top)
    k_best = search.best()
    best = search.unit * search.ratios[k_best]
    if verbose:
        print(
            f"cv_cdf: y's width {best:.6g} (start {start:.6g}), CV {search.values[k_best]:.6g} "
            f"(start {search.values[0]:.6g}), {len(search.ratios)} widths evaluated"
        )
    return best


def quantile_interval(spec, queries, keys, y, widths, alpha, sample_weight=None) -> np.ndarray:
    """The central (1 - alpha) interval of a continuous y given x, (n_q, 2): the
    conditional quantiles at alpha/2 and 1 - alpha/2, over the checked training rows
    ``keys`` (the columns of ``spec``) and targets ``y``, with x's ``widths`` as given and
    y's by the CDF's cross-validation from the normal-reference rule of the joint table
    (y's column first, as :class:`nbattn.KernelQuantileRegressor` with ``bandwidth=widths``
    fits it: :func:`cv_cdf_width`). Fixed widths only (its CDF reads one width per column)."""
    if spec.nearest_neighbour:
        raise NotImplementedError(
            f"predict_interval(kind='quantile') takes fixed widths, not {spec.bandwidth_type!r}"
        )
    levels = interval_levels(alpha)
    joint_spec = dataclasses.replace(
        spec, var_type="c" + spec.var_type, n_categories=(0, *spec.n_categories)
    )
    joint = np.column_stack([y, keys])
    joint_widths = density_rule_widths(joint_spec, joint, "normal_reference", sample_weight)
    joint_widths[1:] = widths
    joint_widths = check_widths(joint_widths, joint_spec.var_type, joint_spec.counts, "widths")
    joint_widths[0] = cv_cdf_width(joint_spec, joint, joint_widths, sample_weight)
    queries = np.column_stack([np.zeros(queries.shape[0]), queries])
    problem = density_layout(joint_spec, queries, joint, joint_widths, sample_weight)
    return conditional_quantiles(problem, levels)
