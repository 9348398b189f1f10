"""A bounded search for the minimum of a criterion over one log-scale parameter.

The search behind ``nbattn.smoothing.width_search.loo_bandwidth``, kept apart from the
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
    """a < b by more than the relative tolerance (a finite a is lower than b = inf; two
    infinite values tie, where the tolerance would give inf - inf)."""
    if math.isinf(a) or math.isinf(b):
        return a < b
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
    if not rtol >= 0 or not xatol > 0 or not extend >= 0 or not fill_margin >= 0:
        raise ValueError("rtol, extend and fill_margin must be >= 0 and xatol > 0")
    if int(stride) != stride or stride < 1:
        raise ValueError(f"stride must be a positive integer, got {stride!r}")
    search = _LogScaleSearch(
        criterion,
        grid,
        rtol=rtol,
        extend=extend,
        anchor=anchor,
        coarse=coarse,
        report=report,
        stride=int(stride),
        fill_margin=fill_margin,
    )
    search.coarse_stage()
    edge = search.extend_at_the_ends()
    search.refine(xatol, basins, basin_margin)
    return search.result(edge)


class _LogScaleSearch:
    """One run of :func:`minimize_log_scale`: its evaluations and its stages, in order.

    The grid is indexed by k: ``0 ... k_last`` are the sorted grid points (with the
    anchor), k < 0 and k > k_last the extension by the end steps of the grid, at most
    to ``[k_min, k_max]``. ``known`` maps each visited k to its coarse value, ``exact``
    each exactly evaluated t to its value; ``[lo_k, hi_k]`` is the range the coarse
    stage covers (the grid, grown by the extension).
    """

    def __init__(
        self, criterion, grid, *, rtol, extend, anchor, coarse, report, stride, fill_margin
    ):
        ts = np.unique(np.append(np.asarray(grid, dtype=np.float64).reshape(-1), float(anchor)))
        if not np.all(np.isfinite(ts)):
            raise ValueError("grid must be finite")
        self.criterion, self.coarse, self.report = criterion, coarse, report
        self.rtol, self.anchor = rtol, anchor
        self.stride, self.fill_margin = stride, fill_margin
        self.exact: dict[float, float] = {}
        self.n_coarse = self.n_exact = 0
        self.fine = list(ts)
        self.k_last = len(ts) - 1
        if self.k_last > 0:
            self.step_low, self.step_high = ts[1] - ts[0], ts[-1] - ts[-2]
            slack = 1e-9 * max(self.step_low, self.step_high)
            self.k_min = -int(math.floor((extend + slack) / self.step_low))
            self.k_max = self.k_last + int(math.floor((extend + slack) / self.step_high))
        else:
            self.step_low = self.step_high = 0.0
            self.k_min = self.k_max = 0
        self.k_anchor = self.fine.index(float(anchor))
        self.known: dict[int, float] = {}
        self.lo_k, self.hi_k = 0, self.k_last

    # ---- evaluations

    def exact_at(self, t, stage=None) -> float:
        """The exact criterion at t, evaluated once (reported with ``stage`` when given)."""
        t = float(t)
        if t not in self.exact:
            self.exact[t] = _finite_or_inf(self.criterion(t))
            self.n_exact += 1
            if stage is not None and self.report is not None:
                self.report(stage, t, self.exact[t])
        return self.exact[t]

    def coarse_at(self, t, stage) -> float:
        """The coarse criterion at t: the estimate when there is one, else the exact one."""
        if self.coarse is None:
            before = self.n_exact
            value = self.exact_at(t)
            self.n_coarse += self.n_exact - before
        else:
            value = _finite_or_inf(self.coarse(t))
            self.n_coarse += 1
        if self.report is not None:
            self.report(stage, float(t), value)
        return value

    def t_of(self, k) -> float:
        if k < 0:
            return self.fine[0] + k * self.step_low
        if k > self.k_last:
            return self.fine[-1] + (k - self.k_last) * self.step_high
        return self.fine[k]

    def visit(self, k):
        if k not in self.known:
            stage = "grid" if 0 <= k <= self.k_last else "extend"
            self.known[k] = self.coarse_at(self.t_of(k), stage)

    # ---- 1. the coarse stage and the fill

    def coarse_stage(self):
        """Every ``stride``-th point of ``[lo_k, hi_k]`` counted from the anchor, and both
        ends, then the fill."""
        for k in range(self.lo_k, self.hi_k + 1):
            if (k - self.k_anchor) % self.stride == 0 or k in (self.lo_k, self.hi_k):
                self.visit(k)
        self.fill()

    def fill(self):
        """Every grid point in a coarse interval that touches a point within
        ``fill_margin`` of the best value so far, until none is added."""
        while True:
            keys = sorted(self.known)
            v_min = min(self.known.values())
            ceiling = v_min + self.fill_margin * abs(v_min) if math.isfinite(v_min) else math.inf
            todo = []
            for pos, k in enumerate(keys):
                if self.known[k] <= ceiling:
                    for a, b in ((pos - 1, pos), (pos, pos + 1)):
                        if 0 <= a and b < len(keys):
                            todo.extend(range(keys[a] + 1, keys[b]))
            if not todo:
                return
            for k in sorted(set(todo)):
                self.visit(k)

    # ---- 2. the extension

    def extend_at_the_ends(self):
        """While the best coarse point is an end of the range, grow the range by ``stride``
        steps that way (up to ``[k_min, k_max]``) and run the coarse stage on it.

        Returns the edge: "low" / "high" when the best point is still an end at the
        limit with the criterion falling towards it, else None.
        """
        while True:
            keys = sorted(self.known)
            values = [self.known[k] for k in keys]
            best = keys[_best_index([self.t_of(k) for k in keys], values, self.rtol, self.anchor)]
            if len(keys) < 2 or 0 < keys.index(best) < len(keys) - 1:
                return None
            if best == keys[0]:
                if self.lo_k == self.k_min:
                    return "low" if _lower(values[0], values[1], self.rtol) else None
                self.lo_k = max(self.lo_k - self.stride, self.k_min)
            else:
                if self.hi_k == self.k_max:
                    return "high" if _lower(values[-1], values[-2], self.rtol) else None
                self.hi_k = min(self.hi_k + self.stride, self.k_max)
            self.coarse_stage()

    def coarse_curve(self):
        """The visited grid points and their coarse values, sorted: ``(ts, values)``."""
        keys = sorted(self.known)
        return np.array([self.t_of(k) for k in keys]), np.array([self.known[k] for k in keys])

    # ---- 3. the refinement

    def refine(self, xatol, basins, basin_margin):
        """The anchor and the best grid point exactly, then Brent in the best basin and
        the next deepest ones (after a walk on exact values when the grid was estimated)."""
        grid_ts, grid_values = self.coarse_curve()
        best = _best_index(grid_ts, grid_values, self.rtol, self.anchor)
        self.exact_at(self.anchor, "exact")
        self.exact_at(grid_ts[best], "exact")
        for centre in _basins(grid_values, best, self.rtol, basins, basin_margin):
            if self.coarse is not None:
                centre = self._walk_to_exact_minimum(grid_ts, centre)
                if self._is_exact_plateau(grid_ts, centre):
                    continue  # nothing to gain beyond rtol
            self._brent_around(grid_ts, centre, xatol)

    def _exact_on_grid(self, grid_ts, k) -> float:
        return self.exact_at(grid_ts[k], "exact")

    def _walk_to_exact_minimum(self, grid_ts, centre) -> int:
        """The estimate may be a step or two off: walk the grid on exact values to a
        local minimum, which brackets the exact minimum."""
        last = grid_ts.size - 1
        for _ in range(last + 1):
            here = self._exact_on_grid(grid_ts, centre)
            side = {
                k: self._exact_on_grid(grid_ts, k)
                for k in (centre - 1, centre + 1)
                if 0 <= k <= last
            }
            k_low = min(side, key=side.get)
            if not _lower(side[k_low], here, self.rtol):
                break
            centre = k_low
        return centre

    def _is_exact_plateau(self, grid_ts, centre) -> bool:
        """No grid neighbour of ``centre`` is higher than it beyond rtol (exact values)."""
        around = range(max(centre - 1, 0), min(centre + 2, grid_ts.size))
        here = self._exact_on_grid
        return not any(_lower(here(grid_ts, centre), here(grid_ts, k), self.rtol) for k in around)

    def _brent(self, lo, hi, xatol):
        from scipy.optimize import minimize_scalar

        refine = lambda t: self.exact_at(t, "refine")  # noqa: E731
        # an infinite value inside the bracket (a criterion's fence, an overflow) makes
        # Brent's parabola inf - inf: it then steps by golden section, and says nothing
        with np.errstate(invalid="ignore", over="ignore"):
            minimize_scalar(refine, bounds=(lo, hi), method="bounded", options={"xatol": xatol})

    def _brent_around(self, grid_ts, centre, xatol):
        """Bounded Brent between the grid neighbours of ``centre``.

        Brent can settle on a flat stretch of the bracket and miss a dip on the other
        side of the grid point. When it found nothing lower than the grid point (and the
        neighbours are not level with it: a plateau), each side is probed at its
        quarters and searched on its own when it holds a lower value.
        """
        last = grid_ts.size - 1
        lo, hi = grid_ts[max(centre - 1, 0)], grid_ts[min(centre + 1, last)]
        self._brent(lo, hi, xatol)
        if not 0 < centre < last:
            return
        here = self._exact_on_grid(grid_ts, centre)
        if _lower(min(v for t, v in self.exact.items() if lo <= t <= hi), here, self.rtol):
            return
        neighbours = (centre - 1, centre + 1)
        if all(not _lower(here, self._exact_on_grid(grid_ts, k), self.rtol) for k in neighbours):
            return
        for a, b in ((lo, grid_ts[centre]), (grid_ts[centre], hi)):
            probes = [self.exact_at(a + f * (b - a), "refine") for f in (0.25, 0.5, 0.75)]
            if _lower(min(probes), here, self.rtol):
                self._brent(a, b, xatol)

    # ---- 4. the choice

    def result(self, edge) -> ScaleSearchResult:
        """A grid point within rtol of the exact minimum (the one nearest the anchor),
        else the exact minimum; ``edge`` kept only when the choice is that end."""
        grid_ts, grid_values = self.coarse_curve()
        ex_t = np.array(list(self.exact))
        ex_v = np.array([self.exact[t] for t in ex_t])
        v_min = float(np.min(ex_v))
        near = ex_v <= v_min + self.rtol * abs(v_min) if math.isfinite(v_min) else np.isinf(ex_v)
        on_grid = near & np.isin(ex_t, grid_ts)
        if np.any(on_grid):
            candidates = ex_t[on_grid]
            t_best = float(candidates[np.argmin(np.abs(candidates - self.anchor))])
        else:
            t_best = float(ex_t[np.argmin(ex_v)])
        if edge is not None and t_best != (grid_ts[0] if edge == "low" else grid_ts[-1]):
            edge = None  # the refinement moved away from the end
        return ScaleSearchResult(
            t=t_best,
            value=self.exact[t_best],
            edge=edge,
            grid=grid_ts,
            grid_values=grid_values,
            exact=dict(sorted(self.exact.items())),
            n_coarse=self.n_coarse,
            n_exact=self.n_exact,
        )
