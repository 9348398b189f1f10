"""The search over the widths' parameters theta of the local fits, on any criterion of
theta (``nbattn.local.widths`` holds the leave-one-out one).

theta = (log h_c for each 'c' column, t_k for each 'u'/'o' column), with the bounded
smoothing l_k = lambda_max_k sigmoid(t_k) (lambda_max = (c-1)/c for 'u', 1 for 'o').

:func:`search_widths`: the start (the rule), a one-dimensional search over a common
factor of every h (``nbattn.smoothing.search``, the safeguard that finds the right scale
when the rule is far off), then scipy's L-BFGS-B over all of theta from each of the two
(they can start in different basins). Then a joint (h, l) stage: every h by a common
factor with the categorical smoothing at exactly 0 (exact matching; all categorical
columns, and each alone that the descent left below half its range), the corner of a
valley in (log h, t) that no move of one parameter follows (tied x). Then sweeps of each
parameter alone over a grid (plateaus, flat ends), each sweep that gains more than
``config.LOO_RTOL`` followed by another descent and, over the columns where one grid
step of one parameter still gains or whose last sweep started more than a grid step
from the best point, another sweep. The best point ever evaluated is
returned, so the answer is never worse than the start or the best common scale.
:func:`polish_without_gradient`: a Nelder-Mead pass from there for a criterion without a
gradient, whose sweeps move one width at a time (a valley across two widths).
A :class:`SearchPolicy` sets how each stage spends its evaluations: the default one is
the search above; :data:`SMOOTH_POLICY`, for a smooth criterion with an exact gradient
(a density's leave-one-out likelihood under the Gaussian kernel), takes the common
factor on a coarse grid refined by the descent alone, descends from its best only,
walks each corner of exact matching a step at a time, and sweeps only the columns where
one grid step of one parameter gains: about a fifth of the default's evaluations.

The search that starts on a subsample and carries its widths to all rows is
``nbattn.local.staged`` (``staged_search``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import config
from .._core.threads import blas_one_thread
from .problem import lambda_max

__all__ = [
    "SMOOTH_POLICY",
    "SearchPolicy",
    "polish_without_gradient",
    "search_bounds",
    "search_widths",
    "theta_to_widths",
    "widths_to_theta",
]


#: Bound on the categorical parameter t (l = lambda_max sigmoid(t)): sigmoid(30) is 1 - 1e-13,
#: so l reaches its ends to 13 digits while log(1 - l) stays finite.
_T_BOUND = 30.0


#: The largest log h a search tries: h below the largest float64 by a factor of e, so that
#: exp(theta) never overflows (data whose spread is near 1e308 has its start near it).
_LOG_H_MAX = math.log(np.finfo(np.float64).max) - 1.0


def sigmoid(t):
    return 1.0 / (1.0 + math.exp(-t)) if t >= 0 else math.exp(t) / (1.0 + math.exp(t))


def share_theta(share) -> float:
    """t of the categorical smoothing l = ``share`` lambda_max, the inverse of
    :func:`sigmoid` (share clipped to (0, 1], t to +-30)."""
    share = min(max(share, 1e-300), 1.0)
    t = math.log(share) - math.log1p(-share) if share < 1.0 else _T_BOUND
    return min(max(t, -_T_BOUND), _T_BOUND)


def theta_to_widths(theta, var_type, n_categories) -> np.ndarray:
    """Per-column widths from theta: h = exp(theta) for 'c', l = lambda_max sigmoid(theta)."""
    top = lambda_max(var_type, n_categories)
    out = np.empty(len(var_type))
    for position, kind in enumerate(var_type):
        if kind == "c":
            out[position] = math.exp(theta[position])
        else:
            out[position] = top[position] * sigmoid(float(theta[position]))
    return out


def widths_to_theta(widths, var_type, n_categories) -> np.ndarray:
    """The inverse of :func:`theta_to_widths` (t clipped to +-30)."""
    top = lambda_max(var_type, n_categories)
    out = np.empty(len(var_type))
    for position, kind in enumerate(var_type):
        if kind == "c":
            out[position] = math.log(widths[position])
        elif top[position] == 0:
            out[position] = 0.0
        else:
            out[position] = share_theta(widths[position] / top[position])
    return out


@dataclasses.dataclass(frozen=True)
class SearchPolicy:
    """How :func:`search_widths` spends its evaluations. The defaults are the search for
    criteria that may hold plateaus and kinks (the regressions' squared error, a
    classifier's log-loss); :data:`SMOOTH_POLICY` is the one for a smooth criterion with
    an exact gradient (a density's leave-one-out likelihood).

    Attributes
    ----------
    common_stride : int
        The common factor's coarse stride over ``config.LOO_GRID`` (1: every factor).
    common_fill : float
        Its fill margin (``minimize_log_scale``'s ``fill_margin``).
    common_basins : int
        Its Brent refinements (0: none, the descents refine).
    rule_descent : bool
        Descend from the rule as well as from the best common factor (1-D: the rule is
        on the common factor's line, and its descent follows that line).
    corner_walk : bool
        At each corner of exact matching, walk the common factor a step at a time
        (:func:`_walk_common_factor`, then a descent when the corner gained) instead of
        a common-factor search.
    verify : bool
        Before each round of sweeps, evaluate each parameter alone one grid step either
        side of the best point (h by one factor of ``config.LOO_GRID``, l at the
        neighbouring shares of ``_LAMBDA_SHARES`` or decades and at both ends of its
        range) and sweep only the columns where that gained more than
        ``config.LOO_RTOL``: on a smooth criterion a descent's end that no step of one
        parameter improves is the sweeps' answer too. (A well in l several decades
        below the point is then not sought: ``tests/local/test_search_small_l_review.py``.)
    verify_repeats : bool
        Before the second and later rounds of sweeps only (the first sweeps every column):
        skip a column whose one step either side gains nothing (as ``verify``) *and* whose
        last sweep started within one grid step of the best point in every parameter,
        on the same side of exact matching (``_moved_since_swept``), so that the sweep
        would start from nearly where it did. What a skipped column can still miss is a
        gain finer than one grid step that the sweep's refinement would find again.
    descent_rtol : float or None
        L-BFGS-B's relative stopping tolerance (:func:`_descend`; None: scipy's default).
    """

    common_stride: int = 1
    common_fill: float = 0.1
    common_basins: int = 3
    rule_descent: bool = True
    corner_walk: bool = False
    verify: bool = False
    verify_repeats: bool = True
    descent_rtol: float | None = None


#: The search for a smooth criterion with an exact gradient (a density's leave-one-out
#: likelihood): the common factor on every third factor of ``config.LOO_GRID`` (then the
#: grid around its best), refined by the descent alone; corners walked; sweeps only where
#: a step of one parameter gains.
SMOOTH_POLICY = SearchPolicy(
    common_stride=3,
    common_fill=0.0,
    common_basins=0,
    rule_descent=False,
    corner_walk=True,
    verify=True,
    descent_rtol=None,
)


def search_widths(
    criterion, start, *, maxiter=200, per_column=True, policy: SearchPolicy | None = None
) -> np.ndarray:
    """The search of :func:`loo_widths` on any criterion of theta (an object with ``loss``,
    ``loss_and_grad`` and ``best``, like ``LooCriterion``) from the widths ``start``; returns
    the best theta evaluated. ``per_column=False`` stops after the common factor of
    every h (the categorical parameters stay at the start's). A criterion whose
    ``has_gradient`` is False is searched without the descents (the common factor,
    exact matching and the column sweeps alone). ``policy``: :class:`SearchPolicy`
    (None: the default one, the module docstring's search)."""
    return _policy_search(criterion, start, maxiter, per_column, policy or SearchPolicy())


def search_bounds(theta0, cont):
    """L-BFGS-B's bounds around the start ``theta0``: log h within ``config.WIDTH_BOUNDS``
    of the start's (and below ``_LOG_H_MAX``), t within +-30; ``(bounds, lower, upper)``."""
    low, high = config.WIDTH_BOUNDS
    bounds = [
        (t + math.log(low), min(t + math.log(high), _LOG_H_MAX)) if c else (-_T_BOUND, _T_BOUND)
        for t, c in zip(theta0, cont)
    ]
    return bounds, np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])


_POLISH_STEP = math.log(10.0) / 12.0  # the polish's first simplex: half a LOO_GRID factor


def polish_without_gradient(
    criterion, theta0, evaluations_per_entry=60, xatol=1e-4, rtol=0.0, start=None
) -> np.ndarray:
    """Nelder and Mead (1965), "A simplex method for function minimization", after a
    gradient-free :func:`search_widths` (its sweeps, one width at a time, stall in a valley
    across two): from the criterion's best theta (after evaluating ``start``, the search's
    answer), over its finite entries (t = -inf held), a first simplex z0, z0 + s e_k (s =
    log 10 / 12, away from the nearer bound), trials clipped into :func:`search_bounds`
    about ``theta0``; ``evaluations_per_entry`` at most, fewer once the simplex spans less
    than ``xatol`` per entry and ``rtol`` of the best value. Returns the best point ever
    evaluated, or ``start`` where none is finite (a fenced criterion)."""
    from scipy.optimize import minimize

    if start is not None:
        criterion.loss(start)
    if criterion.best[1] is None or not math.isfinite(criterion.best[0]):
        return start if start is not None else criterion.best[1]
    best, free = criterion.best[1].copy(), np.isfinite(criterion.best[1])
    if not free.any():
        return best
    _, lower, upper = search_bounds(theta0, criterion.base.spec.continuous)
    lower, upper = lower[free], upper[free]
    z0 = np.clip(best[free], lower, upper)
    steps = np.where(z0 + _POLISH_STEP <= upper, _POLISH_STEP, -_POLISH_STEP)

    def loss(z):
        theta = best.copy()
        theta[free] = np.clip(z, lower, upper)
        return criterion.loss(theta)

    options = {"initial_simplex": np.vstack([z0, z0 + np.diag(steps)]), "xatol": xatol}
    fatol = rtol * abs(criterion.best[0])
    options.update(fatol=fatol, maxfev=evaluations_per_entry * int(free.sum()))
    minimize(loss, z0, method="Nelder-Mead", options=options)
    return criterion.best[1]


def _policy_search(criterion, start, maxiter, per_column, policy):
    """:func:`search_widths` under ``policy`` (:class:`SearchPolicy`): each stage as the
    policy says, and with ``policy.verify`` the check before each sweep."""
    spec = criterion.base.spec
    var_type, counts = spec.var_type, spec.n_categories
    theta0 = widths_to_theta(start, var_type, counts)
    cont = spec.continuous
    bounds, lower, upper = search_bounds(theta0, cont)
    options = {
        "stride": policy.common_stride,
        "fill_margin": policy.common_fill,
        "basins": policy.common_basins,
    }
    criterion.loss(theta0)
    if cont.any():
        # the safeguard: one common factor of every h, categorical parameters at the start
        _common_scale_search(criterion, theta0, cont, lower, upper, **options)
    if criterion.best[1] is None:
        raise ValueError(
            "the leave-one-out criterion is not finite at any width tried "
            f"({criterion.targets.shape[0]} rows)"
        )
    if not per_column:
        return criterion.best[1]

    def descend(start=None):
        start = criterion.best[1] if start is None else start
        _descend(criterion, start, bounds, maxiter, rtol=policy.descent_rtol)

    # two starts: the rule itself and the best common scale. They can lie in different
    # basins, and the common scale's (better at the start) is not always the deeper one:
    # on the benchmark's mixed data (n = 500, cccuo) the rule's basin is 5% lower
    scaled = criterion.best[1].copy()
    if policy.rule_descent:
        descend(theta0)
    if not policy.rule_descent or not np.array_equal(scaled, theta0):
        descend(scaled)
    if cont.any():
        # the joint (h, lambda) stage: exact matching in categorical columns, every h by a
        # common factor from the descent's point (a corner no one-parameter move reaches)
        descended = criterion.best[1]
        # l / lambda_max (a one-level column, lambda_max = 0, counts as fully smoothed)
        top = lambda_max(var_type, counts)
        widths = theta_to_widths(descended, var_type, counts)
        shares = np.where(cont, 0.0, np.divide(widths, top, out=np.ones_like(top), where=top > 0))
        idle = ~cont & (top == 0)  # _one_category: no corner of exact matching to seek
        for columns in _exact_match_subsets(cont | idle, shares):
            corner = descended.copy()
            corner[columns] = -math.inf
            if not policy.corner_walk:
                _common_scale_search(criterion, corner, cont, lower, upper, **options)
                continue
            before = criterion.best[0]
            _walk_common_factor(criterion, corner, criterion.loss(corner), cont, lower, upper)
            if _lower_by_rtol(criterion.best[0], before):
                descend()  # the corner's valley: its h and the other columns' parameters
    # without a gradient the sweeps do all the work: every third grid factor, then the
    # fill around the best (nbattn.smoothing.search), a fifth fewer evaluations for the
    # same widths on the tables tried
    has_gradient = getattr(criterion, "has_gradient", True)
    stride = policy.common_stride if has_gradient else _SWEEP_STRIDE_WITHOUT_GRADIENT
    sweep = {"fill_margin": policy.common_fill, "basins": policy.common_basins}
    swept_from = {}  # column -> the point its last sweep started from
    for sweep_round in range(_SWEEPS):
        before = criterion.best[0]
        columns = None
        if policy.verify:
            columns = _steps_that_gain(criterion, cont, lower, upper)
        elif policy.verify_repeats and sweep_round > 0:
            moved = _moved_since_swept(criterion.best[1], swept_from, cont)
            gained = _steps_that_gain(criterion, cont, lower, upper, skip=moved)
            columns = sorted(set(gained) | set(moved))
        if columns is not None and not columns:
            break  # no step of one parameter gains: the sweeps would find nothing
        _sweep_columns(
            criterion, cont, lower, upper, stride, columns=columns, swept_from=swept_from, **sweep
        )
        if not _lower_by_rtol(criterion.best[0], before):
            break  # nothing gained beyond the tolerance: another descent would not move
        descend()  # the sweep left a local minimum: descend from there
    return criterion.best[1]


def _one_category(cont, spec) -> np.ndarray:
    """The categorical columns with one category: lambda_max is 0, so l is 0 whatever t
    (nothing to sweep, probe or set to exact matching)."""
    return ~cont & (lambda_max(spec.var_type, spec.n_categories) == 0)


def _steps_that_gain(criterion, cont, lower, upper, skip=()) -> list:
    """The columns where one parameter moved alone from the best point gains more than
    ``config.LOO_RTOL``: h by one factor of ``config.LOO_GRID`` either way (within
    ``lower``, ``upper``), l at 0, at its top, at the shares of ``_LAMBDA_SHARES`` on
    either side of its own and, from a share below the first of them, a decade either
    side (columns of one category, whose l is 0 whatever t, left out; ``skip``: columns
    not probed, already chosen for a sweep)."""
    idle = _one_category(cont, criterion.base.spec)
    base, value = criterion.best[1].copy(), criterion.best[0]
    step = math.log(config.LOO_GRID[1] / config.LOO_GRID[0])
    spacing = 1.0 / (_LAMBDA_SHARES.size - 1)
    gained = []
    for column in range(cont.size):
        if column in skip:
            continue
        if cont[column]:
            moves = [
                min(max(base[column] + sign * step, lower[column]), upper[column])
                for sign in (-1.0, 1.0)
            ]
        elif idle[column]:
            continue
        else:
            share = 0.0 if base[column] == -math.inf else sigmoid(float(base[column]))
            moves = [-math.inf, _T_BOUND]
            moves += [share_theta(s) for s in (share - spacing, share + spacing) if 0 < s < 1]
            if 0 < share < spacing:  # among the decades: a decade either side
                moves += [share_theta(s) for s in (share / 10.0, share * 10.0)]
        for move in moves:
            theta = base.copy()
            theta[column] = move
            if _lower_by_rtol(criterion.loss(theta), value):
                gained.append(column)
                break
    return gained


def _moved_since_swept(best, swept_from, cont) -> list:
    """The columns whose last sweep started from a point that differs from ``best`` by more
    than one grid step in any parameter, its own included (log h by a factor of
    ``config.LOO_GRID``; a categorical one by a step of ``_LAMBDA_SHARES`` in
    l / lambda_max, or below the first of those shares by a decade, as its sweep's
    ``_LAMBDA_DECADES`` are spaced; or between exact matching, l = 0, and any l > 0): that
    sweep's line is not this one. Another parameter's move can open a well in the column
    far from one step either side; the column's own move shifts the two decades its sweep
    reaches; exact matching is a floor that no finite t reaches
    (``_exact_match_subsets``)."""
    step = math.log(config.LOO_GRID[1] / config.LOO_GRID[0])
    spacing = 1.0 / (_LAMBDA_SHARES.size - 1)
    smallest = sigmoid(-_T_BOUND)

    def steps(share):  # linear steps of the shares above the first, a step per decade below
        if share >= spacing:
            return share / spacing
        return 1.0 + math.log10(max(share, smallest) / spacing)

    def position(theta):  # log h, or l / lambda_max in steps scaled to the h step
        return np.array([t if c else steps(sigmoid(float(t))) * step for t, c in zip(theta, cont)])

    here, exact_here = position(best), ~cont & (best == -math.inf)
    moved = []
    for column, origin in swept_from.items():
        far = np.abs(here - position(origin)) > step * (1 + 1e-9)
        if np.any(far | (exact_here != (~cont & (origin == -math.inf)))):
            moved.append(column)
    return moved


def _descend(criterion, start, bounds, maxiter, rtol=None, patient=True):
    """L-BFGS-B on the criterion from ``start`` (clipped into ``bounds``); nothing for a
    criterion without a gradient. The criterion records the best point it evaluates.

    ``rtol``: stop once two iterations in a row, the first excepted, each gain less than
    that share of the criterion; None keeps scipy's default (a gain below 2.2e-9,
    absolute for a criterion below 1), which on a criterion of many rows spends many
    iterations on the last digits. The first iteration is a steepest-descent step of
    arbitrary length (no curvature pairs yet), so its gain says nothing of how far the
    minimum is, and one later iteration can gain little while the pairs are few. (scipy's
    relative ``ftol``, one iteration including the first, stopped a short search's
    descent on CPS1988's 10,000 rows after that first step, 3.4e-5 above the minimum;
    on ill-scaled quadratics started 2 to 40 rtol above their minimum, one small gain
    after the first ended above rtol on 13 % of draws, two in a row on 1.5 %, never
    above 2 rtol: ``tests/local/test_descent_stop.py``. A gain is not a distance: on
    curved valleys started hundreds of rtol above, it stops up to a few tens of rtol
    above: ``tests/local/test_descent_stop_review.py``.) ``patient`` False: scipy's own
    test instead, cheaper where the point is only a start for another descent (the
    staged search's stages between the first and the last).

    The end appended to ``criterion.basins`` is scipy's point with the criterion's own
    value there (scipy's ``fun`` can be a later trial point's, after a line search that
    failed, and carries the scaling's rounding).
    """
    from scipy.optimize import minimize

    if not getattr(criterion, "has_gradient", True):
        return
    lower, upper = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    start = np.clip(start, lower, upper)
    options, callback = {"maxiter": int(maxiter)}, None
    values, scale, reached = {}, {}, []  # theta's bytes -> value; the first value; iterates

    def objective(theta):
        value, grad = criterion.loss_and_grad(theta)
        values[np.asarray(theta, dtype=np.float64).tobytes()] = value
        if rtol is None:
            return value, grad
        # divided by the first value: scipy's gradient test is then relative
        by = scale.setdefault("first", value if 0.0 < value < math.inf else 1.0)
        return value / by, grad / by

    def value_at(theta):
        return values.get(np.asarray(theta, dtype=np.float64).tobytes(), math.inf)

    if rtol is not None and patient:
        options["ftol"] = 0.0  # the callback's test replaces scipy's

        def callback(theta):
            reached.append((value_at(theta), np.array(theta, dtype=np.float64)))
            if len(reached) >= 3 and not any(
                _lower_by(reached[k][0], reached[k - 1][0], rtol) for k in (-1, -2)
            ):
                raise _Converged

    elif rtol is not None:
        options["ftol"] = float(rtol)
    with blas_one_thread():  # L-BFGS-B's BLAS calls on 5 numbers: threads only contend
        try:
            result = minimize(
                objective,
                start,
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options=options,
                callback=callback,
            )
            theta = np.array(result.x, dtype=np.float64)
            end = (value_at(theta), theta)
        except _Converged:  # scipy < 1.11 lets a callback's StopIteration through
            end = reached[-1]
    ends = getattr(criterion, "basins", None)
    if ends is not None and math.isfinite(end[0]):
        ends.append(end)


class _Converged(StopIteration):
    """The patient rule's stop (:func:`_descend`), raised by its callback: scipy ends the
    run on a callback's StopIteration; its own class here, so that a StopIteration from
    the criterion itself is not taken for it and reaches the caller."""


#: Most column sweeps after L-BFGS-B (each one that improves is followed by another descent).
_SWEEPS = 3
#: The coarse stride of a sweep's grid for a criterion without a gradient.
_SWEEP_STRIDE_WITHOUT_GRADIENT = config.LOO_GRID_STRIDE

#: Shares of lambda_max that the column sweep tries for a categorical column (both ends
#: included: an irrelevant category sits at lambda_max, an exact-match one at 0).
_LAMBDA_SHARES = np.linspace(0.0, 1.0, 13)

#: And the decades below the first of those shares: a criterion can hold a well at
#: l > 0 far below it, between the linear shares and exact matching, that no descent
#: from either reaches (the flat sigmoid, a barrier between). On 10,000 rows of ggplot2's
#: diamonds, clarity's l: 0.01301 at 5e-5, 0.01302 at 1e-5, 0.01299 at 3e-7, 0.0147 at 0.
#: Down to 1e-12, the last decade above the smallest share a finite t reaches
#: (sigmoid(-30), 9e-14): tied x put such wells near exp(-1 / (2 h^2)), 2e-10 at h a
#: seventh of the spacing.
_LAMBDA_DECADES = 10.0 ** np.arange(-12.0, -1.0)


def _lower_by_rtol(value, reference):
    """``value`` below ``reference`` by more than ``config.LOO_RTOL`` (relative)."""
    return _lower_by(value, reference, config.LOO_RTOL)


def _lower_by(value, reference, rtol):
    """``value`` below ``reference`` by more than ``rtol`` (relative)."""
    return value < reference - rtol * abs(reference)


def _common_scale_search(criterion, theta, cont, lower, upper, **options):
    """Search one common factor of every h (``nbattn.search`` over ``config.LOO_GRID``)
    from ``theta``, the other parameters held; each log h stays within its bounds
    (``lower``, ``upper``: arrays over theta). ``options``: ``minimize_log_scale``'s
    (``stride``, ``fill_margin``, ``basins``; its defaults when absent)."""
    from ..smoothing.search import minimize_log_scale

    best = [math.inf, None]

    def along(log_factor):
        moved = theta.copy()
        moved[cont] = np.clip(theta[cont] + log_factor, lower[cont], upper[cont])
        value = criterion.loss(moved)
        if value < best[0]:
            best[:] = value, moved
        return value

    grid = np.log(np.asarray(config.LOO_GRID))
    room_low = float(np.max(lower[cont] - theta[cont]))  # <= 0 inside the bounds
    room_high = float(np.min(upper[cont] - theta[cont]))
    inside = grid[(grid >= room_low) & (grid <= room_high)]
    if inside.size >= 3:
        minimize_log_scale(along, inside, rtol=config.LOO_RTOL, **options)
    basins = getattr(criterion, "basins", None)
    if basins is not None and best[1] is not None:
        basins.append(tuple(best))


def _exact_match_subsets(cont, shares):
    """Sets of categorical columns whose smoothing the joint stage sets to exactly 0: all of
    them, and when there are several, each alone whose smoothing after the descent is below
    half its range (``shares``: l / lambda_max per column; a column smoothed beyond that
    is weak, and exact matching in it alone would only split the data).

    Why a joint stage: with l_k = 0 only keys of the query's category count, and a small h
    can then fit each cell of tied x on its own; with l_k > 0 the other categories' keys
    weigh l_k / (c - 1) against exp(-1/(2 h^2)) for the nearest distinct x, so the basin is
    the valley t_k < -1/(2 h^2) + const in (log h, t_k), narrower the smaller h. L-BFGS-B
    and the one-parameter sweep cannot follow it, and t within +-30 cannot even reach it
    for h below about 0.13 times the spacing of x; l_k = 0 exactly is its floor.
    """
    cat = np.flatnonzero(~cont)
    if cat.size == 0:
        return []
    subsets = [cat]
    if cat.size > 1:
        subsets += [cat[k : k + 1] for k in range(cat.size) if shares[cat[k]] < 0.5]
    return subsets


def _sweep_columns(
    criterion, cont, lower, upper, stride=1, columns=None, swept_from=None, **options
):
    """One pass over the columns from the best point so far, each parameter alone: h by the
    log-scale search over ``config.LOO_GRID`` factors, lambda over ``_LAMBDA_SHARES`` of its
    range and the ``_LAMBDA_DECADES`` below them. L-BFGS-B stops in a local minimum of a
    criterion with plateaus (tied values) and flat ends (lambda near its bounds, where the
    sigmoid's slope vanishes); the sweep sees past both at a cost of about 30 evaluations
    per continuous and 24 per categorical column (none for a column of one category).
    ``stride``: the log-scale search's coarse stride; ``columns``: the columns to sweep
    (None: all); ``swept_from``: a dict that records, per column, the point its sweep
    started from; ``options``: the log-scale search's others (``fill_margin``, ``basins``).
    """
    from ..smoothing.search import minimize_log_scale

    idle = _one_category(cont, criterion.base.spec)
    log_factors = np.log(np.asarray(config.LOO_GRID))
    for column in range(cont.size) if columns is None else columns:
        if idle[column]:
            continue
        base = criterion.best[1].copy()
        if swept_from is not None:
            swept_from[column] = base
        if cont[column]:

            def along(log_factor, base=base, column=column):
                theta = base.copy()
                theta[column] = min(max(base[column] + log_factor, lower[column]), upper[column])
                return criterion.loss(theta)

            inside = (base[column] + log_factors >= lower[column]) & (
                base[column] + log_factors <= upper[column]
            )
            if inside.sum() >= 3:
                minimize_log_scale(along, log_factors[inside], stride=stride, **options)
        else:
            for share in np.concatenate([_LAMBDA_SHARES, _LAMBDA_DECADES]):
                theta = base.copy()
                if share <= 0.0:
                    theta[column] = -math.inf  # l = 0 exactly: exact matching
                elif share >= 1.0:
                    theta[column] = _T_BOUND
                else:
                    theta[column] = math.log(share) - math.log1p(-share)
                criterion.loss(theta)


def _walk_common_factor(criterion, theta, value, cont, lower, upper):
    """Every h of ``theta`` (criterion ``value``) by one factor of ``config.LOO_GRID``'s
    step at a time, down first, while a step gains more than ``config.LOO_RTOL``; up
    only when down gained nothing. The cheap common factor of the staged search's later
    stages (a few evaluations, where :func:`_common_scale_search` takes about 30)."""
    if not cont.any():
        return
    step = math.log(config.LOO_GRID[1] / config.LOO_GRID[0])
    for sign in (-1.0, 1.0):
        moved, gained = theta, False
        while True:
            moved = np.where(cont, np.clip(moved + sign * step, lower, upper), moved)
            moved_value = criterion.loss(moved)
            if not _lower_by_rtol(moved_value, value):
                break
            theta, value, gained = moved, moved_value, True
        if gained:
            break  # the factor gained one way: the other way starts uphill
