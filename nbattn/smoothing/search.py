"""A bounded search for the minimum of a criterion over one log-scale parameter.

The search behind ``nbattn.smoothing.learning.loo_bandwidth``, kept apart from the
leave-one-out machinery so that it can be tested on curves built to break it
(plateaus, flat stretches, minima at the ends of the range, several local
minima, float32 noise) against brute force.

It minimises ``criterion(t)`` over ``t = log c``:

1. **Coarse stage.** Evaluate every ``stride``-th point of the grid, counted
   from ``anchor``, and both ends (``stride=1``: every point); no early stop:
   a curve may fall again after rising. Values are compared with a relative
   tolerance ``rtol``: ``a`` and ``b`` are equal when
   ``|a - b| <= rtol * max(|a|, |b|)``, so a flat stretch is a plateau, not a
   rise or a fall, and noise below ``rtol`` (float32 sums) changes no choice.
   **Fill**: every grid point inside a coarse interval that touches a point
   within ``fill_margin`` (relative) of the smallest value so far is evaluated
   too, repeatedly, until none is added. So near the best value, and near every
   point within ``fill_margin`` of it, the search sees the whole grid; what a
   coarser stage can miss is a dip lying wholly inside a coarse interval whose
   two ends are both more than ``fill_margin`` above the best value (with
   ``stride=1`` nothing is skipped). The best grid point is the one nearest
   ``anchor`` among those within ``rtol`` of the smallest value (on a
   plateau: the end nearest the anchor, Scott's rule for the bandwidth search).
2. **Extension.** While the best point is an end of the evaluated range, the
   range grows by ``stride`` grid steps (the end steps of ``grid``) in that
   direction, up to ``extend`` beyond the original end, and is filled as above;
   it stops as soon as the criterion no longer falls by more than ``rtol``.
   A best point still at the end there is reported in ``edge``. (Only the
   best point's end is extended: a deeper minimum beyond an end whose
   approach stays above an interior minimum is not sought.)
3. **Refinement.** Bounded Brent (``scipy.optimize.minimize_scalar``) between
   the grid neighbours of the best point, to ``xatol`` in t, with the exact
   criterion; likewise around the next deepest local minima of the grid (up
   to ``basins`` in all, within ``basin_margin`` of the best): a dip narrower
   than the grid spacing can hold the minimum while a grid point beside it is
   only a local minimum of the grid. When the coarse stage ran on an
   estimate, each refinement first walks the grid on exact values to a local
   minimum (the estimate may be a step or two off), which then brackets
   Brent. A point inside a plateau (both neighbours tie it) is not refined.
   Brent can settle on a flat stretch of its bracket and miss a dip on the
   other side of the grid point: when it finds nothing below the grid point,
   each side is probed at its quarters and searched on its own if a probe is
   lower.
4. **Choice.** Among the exactly evaluated points within ``rtol`` of the
   smallest exact value, a grid point (the one nearest the anchor) is
   preferred; otherwise the refined minimum. So the answer is never worse
   than the anchor's value, which is always evaluated exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ScaleSearchResult", "minimize_log_scale"]


@dataclass
class ScaleSearchResult:
    """What :func:`minimize_log_scale` found.

    Attributes
    ----------
    t : float
        The chosen log-scale parameter.
    value : float
        ``criterion(t)`` (exact).
    edge : {None, "low", "high"}
        "low" / "high" when ``t`` is the low / high end of the extended range and
        the criterion was still falling there (the minimum may lie beyond).
    grid : ndarray
        The grid points evaluated by the coarse stage (after the fill and the
        extension), sorted.
    grid_values : ndarray
        The coarse criterion on it (the estimate, when one was given).
    exact : dict
        Every exact evaluation, ``{t: value}``.
    n_coarse, n_exact : int
        Numbers of evaluations of the coarse criterion and of the exact one
        (an exact coarse stage counts in both; cached values are not counted twice).
    """

    t: float
    value: float
    edge: str | None
    grid: np.ndarray
    grid_values: np.ndarray
    exact: dict = field(default_factory=dict)
    n_coarse: int = 0
    n_exact: int = 0


class BandwidthRangeWarning(UserWarning):
    """The leave-one-out criterion still falls at an end of the bandwidth search range."""


def _finite_or_inf(value) -> float:
    value = float(value)
    return value if math.isfinite(value) else math.inf


def _lower(a: float, b: float, rtol: float) -> bool:
    """a < b by more than the relative tolerance."""
    return a < b - rtol * max(abs(a), abs(b))


def _best_index(ts, values, rtol: float, anchor: float) -> int:
    """Index of the point nearest ``anchor`` among those within ``rtol`` of the minimum."""
    values = np.asarray(values, dtype=np.float64)
    v_min = float(np.min(values))
    if not math.isfinite(v_min):
        return int(np.argmin(np.abs(np.asarray(ts) - anchor)))
    tied = np.flatnonzero(values <= v_min + rtol * abs(v_min))
    return int(tied[np.argmin(np.abs(np.asarray(ts)[tied] - anchor))])


def _basins(values, best, rtol, count, margin):
    """Grid indices to refine: ``best`` and the next deepest coarse local minima, at most
    ``count`` in all; none inside a plateau (both neighbours tie it: nothing to gain).

    A dip narrower than the grid spacing can make a local minimum of the grid that is not
    its lowest point while the true minimum lies in that dip: hence several basins.
    """
    last = len(values) - 1

    def is_dip(k):
        # no neighbour lower, at least one higher (beyond rtol); a flat side may hide a dip
        neighbours = [values[j] for j in (k - 1, k + 1) if 0 <= j <= last]
        return not any(_lower(v, values[k], rtol) for v in neighbours) and any(
            _lower(values[k], v, rtol) for v in neighbours
        )

    ceiling = values[best] + margin * abs(values[best])
    others = [  # the ends are the extension's business
        k for k in range(1, last) if k != best and is_dip(k) and values[k] <= ceiling
    ]
    others.sort(key=lambda k: values[k])
    chosen = ([best] if is_dip(best) else []) + others
    return chosen[: max(int(count), 0)]


def minimize_log_scale(
    criterion,
    grid,
    *,
    rtol=1e-5,
    xatol=1e-3,
    extend=0.0,
    anchor=0.0,
    coarse=None,
    report=None,
    basins=3,
    basin_margin=0.02,
    stride=1,
    fill_margin=0.1,
):
    """Minimise ``criterion(t)`` over a log-scale parameter t; see the module docstring.

    Parameters
    ----------
    criterion : callable float -> float
        The exact criterion. Non-finite values count as +inf.
    grid : array of float
        Coarse points in t (sorted and made unique here; ``anchor`` is added).
        Its end steps set the extension step.
    rtol : float
        Relative tolerance under which two values are equal.
    xatol : float
        Brent's absolute tolerance in t.
    extend : float
        How far beyond each end of ``grid`` (in t) the coarse stage may go.
    anchor : float
        Always evaluated; ties resolve towards it.
    coarse : callable float -> float, optional
        A cheaper estimate of the criterion for the coarse stage; then the
        anchor and the best coarse point are also evaluated exactly.
    report : callable, optional
        ``report(stage, t, value)`` after each evaluation, with stage
        "grid", "extend", "exact" or "refine".
    basins : int
        How many coarse local minima (the best one first, then the lowest
        others) are refined.
    basin_margin : float
        Only local minima within this relative margin of the best grid value
        are refined besides it.
    stride : int
        The coarse stage evaluates every ``stride``-th grid point (from the
        anchor) and the ends, then fills; 1 evaluates the whole grid.
    fill_margin : float
        Coarse intervals touching a point within this relative margin of the
        best value are filled with every grid point inside them. Keep it
        at least ``basin_margin``, so that every refined basin sees the whole grid.

    Returns
    -------
    ScaleSearchResult
    """
    from scipy.optimize import minimize_scalar

    if not rtol >= 0 or not xatol > 0 or not extend >= 0 or not fill_margin >= 0:
        raise ValueError("rtol, extend and fill_margin must be >= 0 and xatol > 0")
    if int(stride) != stride or stride < 1:
        raise ValueError(f"stride must be a positive integer, got {stride!r}")
    ts = np.unique(np.append(np.asarray(grid, dtype=np.float64).reshape(-1), float(anchor)))
    if not np.all(np.isfinite(ts)):
        raise ValueError("grid must be finite")
    exact: dict[float, float] = {}
    counts = {"coarse": 0, "exact": 0}

    def exact_at(t, stage=None):
        t = float(t)
        if t not in exact:
            exact[t] = _finite_or_inf(criterion(t))
            counts["exact"] += 1
            if stage is not None and report is not None:
                report(stage, t, exact[t])
        return exact[t]

    def coarse_at(t, stage):
        if coarse is None:
            before = counts["exact"]
            value = exact_at(t)
            counts["coarse"] += counts["exact"] - before
        else:
            value = _finite_or_inf(coarse(t))
            counts["coarse"] += 1
        if report is not None:
            report(stage, float(t), value)
        return value

    # the fine grid, extended by whole end steps up to ``extend``: indices k of
    # ``t_of``; k < 0 and k > k_last are the extension
    k_last = len(ts) - 1
    if k_last > 0:
        step_low, step_high = ts[1] - ts[0], ts[-1] - ts[-2]
        slack = 1e-9 * max(step_low, step_high)
        k_min = -int(math.floor((extend + slack) / step_low))
        k_max = k_last + int(math.floor((extend + slack) / step_high))
    else:
        step_low = step_high = 0.0
        k_min = k_max = 0
    fine = list(ts)

    def t_of(k):
        if k < 0:
            return fine[0] + k * step_low
        if k > k_last:
            return fine[-1] + (k - k_last) * step_high
        return fine[k]

    stride = int(stride)
    k_anchor = fine.index(float(anchor))
    known: dict[int, float] = {}  # fine-grid index -> coarse value

    def visit(k):
        if k not in known:
            known[k] = coarse_at(t_of(k), "grid" if 0 <= k <= k_last else "extend")

    def fill():
        # every fine point in a coarse interval that touches a point within
        # ``fill_margin`` of the best value found so far, until none is added
        while True:
            keys = sorted(known)
            v_min = min(known.values())
            ceiling = v_min + fill_margin * abs(v_min) if math.isfinite(v_min) else math.inf
            todo = []
            for pos, k in enumerate(keys):
                if known[k] <= ceiling:
                    for a, b in ((pos - 1, pos), (pos, pos + 1)):
                        if 0 <= a and b < len(keys):
                            todo.extend(range(keys[a] + 1, keys[b]))
            if not todo:
                return
            for k in sorted(set(todo)):
                visit(k)

    # coarse stage (every ``stride``-th point from the anchor, and the ends), the
    # fill, then the extension: while the best point is an end and the criterion
    # still falls there, the range grows by ``stride`` steps in that direction
    lo_k, hi_k = 0, k_last
    edge = None
    while True:
        for k in range(lo_k, hi_k + 1):
            if (k - k_anchor) % stride == 0 or k in (lo_k, hi_k):
                visit(k)
        fill()
        keys = sorted(known)
        best = keys[_best_index([t_of(k) for k in keys], [known[k] for k in keys], rtol, anchor)]
        if len(keys) < 2 or 0 < keys.index(best) < len(keys) - 1:
            break
        if best == keys[0]:
            if lo_k == k_min:
                edge = "low" if _lower(known[keys[0]], known[keys[1]], rtol) else None
                break
            lo_k = max(lo_k - stride, k_min)
        else:
            if hi_k == k_max:
                edge = "high" if _lower(known[keys[-1]], known[keys[-2]], rtol) else None
                break
            hi_k = min(hi_k + stride, k_max)
    keys = sorted(known)
    ts = [t_of(k) for k in keys]
    values = [known[k] for k in keys]
    grid_ts = np.array(ts)
    grid_values = np.array(values)
    best = _best_index(grid_ts, grid_values, rtol, anchor)

    # refinement with the exact criterion, in the best basin and the next deepest ones
    exact_at(anchor, "exact")
    exact_at(grid_ts[best], "exact")
    last = grid_ts.size - 1

    def exact_on_grid(k):
        return exact_at(grid_ts[k], "exact")

    for centre in _basins(grid_values, best, rtol, basins, basin_margin):
        if coarse is not None:
            # the estimate may be a step or two off: walk the grid on exact values
            # to a local minimum, which brackets the exact minimum
            for _ in range(last + 1):
                here = exact_on_grid(centre)
                side = {k: exact_on_grid(k) for k in (centre - 1, centre + 1) if 0 <= k <= last}
                k_low = min(side, key=side.get)
                if not _lower(side[k_low], here, rtol):
                    break
                centre = k_low
            around = range(max(centre - 1, 0), min(centre + 2, last + 1))
            if not any(_lower(exact_on_grid(centre), exact_on_grid(k), rtol) for k in around):
                continue  # a plateau: nothing to gain beyond rtol
        lo, hi = grid_ts[max(centre - 1, 0)], grid_ts[min(centre + 1, last)]
        refine = lambda t: exact_at(t, "refine")  # noqa: E731
        options = {"xatol": xatol}
        minimize_scalar(refine, bounds=(lo, hi), method="bounded", options=options)
        if not 0 < centre < last:
            continue
        # Brent can settle on a flat stretch of the bracket and miss a dip on the
        # other side of the grid point. When it found nothing lower than the grid
        # point (and the neighbours are not level with it: a plateau), probe each
        # side at its quarters and search on its own a side that holds a lower value.
        here = exact_on_grid(centre)
        if _lower(min(v for t, v in exact.items() if lo <= t <= hi), here, rtol):
            continue
        if all(not _lower(here, exact_on_grid(k), rtol) for k in (centre - 1, centre + 1)):
            continue
        for a, b in ((lo, grid_ts[centre]), (grid_ts[centre], hi)):
            probes = [refine(a + f * (b - a)) for f in (0.25, 0.5, 0.75)]
            if _lower(min(probes), here, rtol):
                minimize_scalar(refine, bounds=(a, b), method="bounded", options=options)

    # the choice: a grid point within rtol of the exact minimum, else the exact minimum
    ex_t = np.array(list(exact))
    ex_v = np.array([exact[t] for t in ex_t])
    v_min = float(np.min(ex_v))
    near = ex_v <= v_min + rtol * abs(v_min) if math.isfinite(v_min) else np.isinf(ex_v)
    on_grid = near & np.isin(ex_t, grid_ts)
    if np.any(on_grid):
        candidates = ex_t[on_grid]
        t_best = float(candidates[np.argmin(np.abs(candidates - anchor))])
    else:
        t_best = float(ex_t[np.argmin(ex_v)])
    if edge is not None and t_best != (grid_ts[0] if edge == "low" else grid_ts[-1]):
        edge = None  # the refinement moved away from the end
    return ScaleSearchResult(
        t=t_best,
        value=exact[t_best],
        edge=edge,
        grid=grid_ts,
        grid_values=grid_values,
        exact=dict(sorted(exact.items())),
        n_coarse=counts["coarse"],
        n_exact=counts["exact"],
    )
