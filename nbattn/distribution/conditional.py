"""The conditional distribution of y given mixed x: density, CDF and quantiles
(statsmodels' ``KDEMultivariateConditional``, R np's ``npcdens``, ``npcdist``, ``npqreg``).

With the pooling weights of x alone, p_j(x) = w_j K_x(x, x_j) / sum_l w_l K_x(x, x_l)
(the product kernel of x's columns: :mod:`nbattn.distribution.density`), the estimates are
Nadaraya-Watson averages of y's kernel and of its integral,

    f(y | x) = sum_j p_j(x) K_y(y, y_j) = f(x, y) / f(x),
    F(y | x) = sum_j p_j(x) G_y(y, y_j),

so the density is the ratio of two normalisers of the engine (the joint one over
(y, x), y's column first as in statsmodels, and x's), and the CDF the pooling of the
smoothed indicator G((y - y_j) / h_y), computed in log space by
:mod:`nbattn.kernels.density` (numerator: y's column integrated; denominator: x's
kernels alone). A query x that no key reaches (compact kernels, exact matching of an
unseen cell) takes its nearest key's y alone (p = 1 there), as the regressors do.

Quantiles (Li and Racine's ``npqreg``): q_tau(x) solves F(q | x) = tau for a continuous y.
Per row the weights p_j(x) are computed once (keys below 1e-20 of the largest weight left
out), and F is a convex combination of G((y - y_j) / h), so the root lies in
[min_j y_j + h G^-1(tau), max_j y_j + h G^-1(tau)]; a safeguarded regula falsi (Illinois,
a bisection every fourth step) narrows it until it is within ``QUANTILE_XTOL`` h of the
root. The levels are solved in increasing order, each bracket starting at the previous
root, so a row's quantiles never decrease in the level: they never cross.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from .._core.local_groups import KERNEL_CODES
from .._core.threads import serial_below
from ..dispatch.device import kernels_for
from ..local.engine import fit_problem
from ..local.neighbours import refuse_stretched
from ..local.problem import LocalProblem
from .density import log_density_of, log_kernel_sums_of

__all__ = [
    "QUANTILE_XTOL",
    "check_levels",
    "conditional_log_cdf",
    "conditional_log_density",
    "conditional_quantiles",
    "interval_levels",
    "marginal_problem",
]

#: The quantiles' tolerance: each within this many widths h_y of the root of F(q | x) = tau.
QUANTILE_XTOL = 1e-10


def _columns_problem(joint: LocalProblem, n_response: int, keep_response: bool):
    """The joint problem of (y, x), y's ``n_response`` columns first, cut to y's columns
    (``keep_response``) or to x's: the same layout, the other columns left out."""
    spec = joint.spec
    n_cont = sum(kind == "c" for kind in spec.var_type[:n_response])
    n_cat = n_response - n_cont

    def cut(first):  # a slice of y's part or of x's part of a run of columns
        return slice(None, first) if keep_response else slice(first, None)

    cont, cat, columns = cut(n_cont), cut(n_cat), cut(n_response)
    q_stretch, keys_stretch_t = joint.q_stretch, joint.keys_stretch_t
    if q_stretch.shape[0]:  # nearest-neighbour widths: each column's stretch with it
        q_stretch = np.ascontiguousarray(q_stretch[:, cont])
    if keys_stretch_t.shape[1]:
        keys_stretch_t = np.ascontiguousarray(keys_stretch_t[cont])
    return dataclasses.replace(
        joint,
        spec=dataclasses.replace(
            spec,
            var_type=spec.var_type[columns],
            n_categories=tuple(spec.n_categories[columns]),
        ),
        q_cont=np.ascontiguousarray(joint.q_cont[:, cont]),
        keys_cont_t=np.ascontiguousarray(joint.keys_cont_t[cont]),
        q_cat=np.ascontiguousarray(joint.q_cat[:, cat]),
        keys_cat_t=np.ascontiguousarray(joint.keys_cat_t[cat]),
        cat_params=np.ascontiguousarray(joint.cat_params[cat]),
        h=joint.h[cont],
        widths=joint.widths[columns],
        centre=None if joint.centre is None else joint.centre[cont],
        q_stretch=q_stretch,
        keys_stretch_t=keys_stretch_t,
    )


def marginal_problem(joint: LocalProblem, n_response: int = 1) -> LocalProblem:
    """x's problem from the joint problem of (y, x), y's ``n_response`` columns first."""
    return _columns_problem(joint, n_response, keep_response=False)


def marginal_complement(joint: LocalProblem, n_response: int = 1) -> LocalProblem:
    """y's problem from the joint problem of (y, x): y's columns alone."""
    return _columns_problem(joint, n_response, keep_response=True)


def _flags(joint: LocalProblem, n_response: int):
    """The integration flags of y's columns in the joint problem (continuous, categorical)."""
    response = joint.spec.var_type[:n_response]
    n_cont = sum(kind == "c" for kind in response)
    cont = np.zeros(joint.keys_cont_t.shape[0], dtype=bool)
    cat = np.zeros(joint.keys_cat_t.shape[0], dtype=bool)
    cont[:n_cont] = True
    cat[: n_response - n_cont] = True
    return cont, cat


def _distance_gaps(marginal: LocalProblem, row: int, ref: int) -> np.ndarray:
    """|k_j - x|^2 / 2 - |k_ref - x|^2 / 2 for every key j (n_k,) at query ``row`` of x's
    problem (scaled continuous columns), as (k_j - k_ref) . ((k_j + k_ref) / 2 - x): the
    difference of two squares without their cancellation, so keys stay told apart at
    queries 1e15 widths away and beyond (the squares alone round to one value there)."""
    keys = marginal.keys_cont_t
    centre = 0.5 * keys + 0.5 * keys[:, ref : ref + 1] - marginal.q_cont[row][:, None]
    return np.einsum("cj,cj->j", keys - keys[:, ref : ref + 1], centre)


def _closest_key(marginal: LocalProblem, row: int) -> int:
    """The engine's fallback key of query ``row`` of x's problem: of the keys of positive
    weight, fewest unequal categories, then the smallest distance (through
    :func:`_distance_gaps`), the first on ties; -1 when no key has weight."""
    admissible = marginal.log_weights > -np.inf
    if not admissible.any():
        return -1
    unequal = np.sum(marginal.keys_cat_t != marginal.q_cat[row][:, None], axis=0)
    candidates = admissible & (unequal == unequal[admissible].min())
    ref = int(np.argmax(candidates))
    for _ in range(2):  # the second pass measures from a key near the closest
        gaps = np.where(candidates, _distance_gaps(marginal, row, ref), np.inf)
        ref = int(np.argmin(gaps))
    return ref


def _nearest_keys(marginal: LocalProblem, rows) -> np.ndarray:
    """The nearest key of x (the engine's fallback, :func:`_closest_key`) of each of
    ``rows``, queries that no key of x reaches (-1 where no key is admissible at all)."""
    return np.array([_closest_key(marginal, int(row)) for row in rows], dtype=np.int64)


def _single_key(problem: LocalProblem, rows, keys) -> LocalProblem:
    """The problem of ``rows`` (queries) against one key each (their nearest): the keys'
    columns repeated, each query its own key (exclude_self off); nearest-neighbour
    stretches follow their queries and keys."""
    q_stretch, keys_stretch_t = problem.q_stretch, problem.keys_stretch_t
    if q_stretch.shape[0]:
        q_stretch = np.ascontiguousarray(q_stretch[rows])
    if keys_stretch_t.shape[1]:
        keys_stretch_t = np.ascontiguousarray(keys_stretch_t[:, keys])
    return dataclasses.replace(
        problem,
        q_cont=np.ascontiguousarray(problem.q_cont[rows]),
        keys_cont_t=np.ascontiguousarray(problem.keys_cont_t[:, keys]),
        q_cat=np.ascontiguousarray(problem.q_cat[rows]),
        keys_cat_t=np.ascontiguousarray(problem.keys_cat_t[:, keys]),
        log_weights=np.zeros(len(keys)),
        sample_weight=None,
        values_t=np.zeros((1, len(keys))),
        exclude_self=False,
        q_stretch=q_stretch,
        keys_stretch_t=keys_stretch_t,
    )


def _fallback(joint, marginal, n_response, compute, lost):
    """``compute(problem)`` for the rows ``lost`` (bool, n_q) that no key of x reaches,
    on y's column(s) against their nearest key alone; (rows, values)."""
    rows = np.flatnonzero(lost)
    if rows.size == 0:
        return rows, np.zeros(0)
    nearest = _nearest_keys(marginal, rows)
    rows, nearest = rows[nearest >= 0], nearest[nearest >= 0]
    response = marginal_complement(joint, n_response)
    out = np.empty(rows.size)
    for k, (row, key) in enumerate(zip(rows, nearest)):  # rare rows: one small problem each
        single = _single_key(response, [row], [int(key)])
        out[k] = compute(single)[0]
    return rows, out


#: A row whose log normaliser of x is below this is pooled about its nearest key
#: (:func:`_about_nearest`): summed in one float with x's score there (about
#: -(distance / h)^2 / 2 for the Gaussian kernel), y's term keeps only 1e-16 of that
#: magnitude as its absolute precision, and would be rounded away far enough.
FAR_SCORE = -1e4


def _about_nearest(joint: LocalProblem, n_response: int, row: int, key: int) -> LocalProblem:
    """Row ``row`` of the joint problem (Gaussian kernel), its x moved to the key r = x_key
    and each key's log weight less (k_j - r) . (r - x). Since

        -|k_j - x|^2 / 2 = -|k_j - r|^2 / 2 - (k_j - r) . (r - x) - |r - x|^2 / 2,

    whose last term is the same for every key (it cancels in f(y | x) and F(y | x)), the
    scores are x's up to that constant, and small for the keys near r that weigh."""
    n_cont_y = sum(kind == "c" for kind in joint.spec.var_type[:n_response])
    keys_x = joint.keys_cont_t[n_cont_y:]
    r = keys_x[:, key]
    query = joint.q_cont[row].copy()
    log_weights = joint.log_weights - (keys_x - r[:, None]).T @ (r - query[n_cont_y:])
    query[n_cont_y:] = r
    return dataclasses.replace(
        joint,
        q_cont=query[None, :],
        q_cat=np.ascontiguousarray(joint.q_cat[row : row + 1]),
        log_weights=np.ascontiguousarray(log_weights),
    )


def _pooled_far(joint, marginal, n_response, compute, log_normaliser, out) -> None:
    """``compute(problem, row)`` for the rows of a Gaussian joint problem whose x's log
    normaliser ``log_normaliser`` is finite but below :data:`FAR_SCORE`, each on its
    one-row problem about its best key (:func:`_about_nearest`), into ``out[row]``."""
    if joint.spec.kernel != "gaussian" or joint.exclude_self or joint.stretched:
        return  # (nearest-neighbour widths: the shift below assumes one width per column)
    rows = np.flatnonzero((log_normaliser < FAR_SCORE) & (log_normaliser > -np.inf))
    for row in rows:  # rare rows: one problem each
        row = int(row)
        out[row] = compute(_about_nearest(joint, n_response, row, _best_key(marginal, row)), row)


def _best_key(marginal: LocalProblem, row: int) -> int:
    """The key of largest score for query ``row`` of x's problem (Gaussian kernel), log w_j
    - |k_j - x|^2 / 2 + the categorical terms, the squares compared through
    :func:`_distance_gaps` (twice: from the heaviest key, then from the best found)."""
    log_w = marginal.log_weights
    category = np.zeros(log_w.shape[0])
    for k in range(marginal.keys_cat_t.shape[0]):
        a, b, t = marginal.cat_params[k]
        gap = np.abs(marginal.keys_cat_t[k] - marginal.q_cat[row, k])
        with np.errstate(invalid="ignore"):  # t = -inf (l = 0) meets no gap of 0 here
            category += np.where(gap == 0.0, a, b + t * np.maximum(gap, 1.0))
    ref = int(np.argmax(log_w))
    for _ in range(2):
        ref = int(np.argmax(log_w + category - _distance_gaps(marginal, row, ref)))
    return ref


def conditional_log_density(joint: LocalProblem, n_response: int = 1) -> np.ndarray:
    """log f(y | x) at the joint problem's queries (n_q,) (leave-one-out when it excludes
    self): log f(x, y) - log f(x); a row no key of x reaches takes its nearest key's y, a
    row far from every key is pooled about its nearest key (:func:`_about_nearest`)."""
    marginal = marginal_problem(joint, n_response)
    marginal_fit = fit_problem(marginal)
    with np.errstate(invalid="ignore"):
        out = log_density_of(joint) - log_density_of(marginal, marginal_fit)
    if not joint.exclude_self:
        lost = ~(marginal_fit.log_norm > -np.inf)
        rows, values = _fallback(joint, marginal, n_response, log_density_of, lost)
        out[rows] = values
        log_normaliser = np.where(lost, -np.inf, marginal_fit.shift + marginal_fit.log_norm)

        def near(problem, row):
            return conditional_log_density(problem, n_response)[0]

        _pooled_far(joint, marginal, n_response, near, log_normaliser, out)
    return np.where(np.isnan(out), -np.inf, out)


def conditional_log_cdf(joint: LocalProblem, n_response: int = 1) -> np.ndarray:
    """log F(y | x) at the joint problem's queries (n_q,): the pooling of y's integrated
    kernel over x's weights (module docstring). Exact, on the spec's device."""
    marginal = marginal_problem(joint, n_response)
    cont, cat = _flags(joint, n_response)
    numerator = log_kernel_sums_of(joint, cont, cat)
    denominator = log_kernel_sums_of(
        marginal,
        np.zeros(marginal.keys_cont_t.shape[0], bool),
        np.zeros(marginal.keys_cat_t.shape[0], bool),
    )
    with np.errstate(invalid="ignore"):
        out = np.minimum(numerator - denominator, 0.0)

    def single_cdf(problem):
        flags = (
            np.ones(problem.keys_cont_t.shape[0], bool),
            np.ones(problem.keys_cat_t.shape[0], bool),
        )
        return log_kernel_sums_of(problem, *flags)

    lost = ~(denominator > -np.inf)
    rows, values = _fallback(joint, marginal, n_response, single_cdf, lost)
    out[rows] = np.minimum(values, 0.0)

    def near(problem, row):
        return conditional_log_cdf(problem, n_response)[0]

    _pooled_far(joint, marginal, n_response, near, denominator, out)
    return np.where(np.isnan(out), -np.inf, out)


def _inverse_integrated_kernel(tau, kernel):
    """G^-1(tau) of the continuous kernel (tau in (0, 1))."""
    from scipy.special import ndtri

    tau = np.asarray(tau, dtype=np.float64)
    if kernel == "gaussian":
        return ndtri(tau)
    # the compact kernels: G is increasing on [-1, 1]; bisection to the last bit
    lo, hi = np.full(tau.shape, -1.0), np.full(tau.shape, 1.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = _integrated(mid, kernel) < tau
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _integrated(z, kernel):
    z = np.clip(z, -1.0, 1.0)
    if kernel == "epanechnikov":
        return (1.0 + z) ** 2 * (2.0 - z) / 4.0
    a = np.abs(z)
    a3 = a**3
    half = (70.0 / 81.0) * a * (1.0 - a3 * (0.75 - a3 * (3.0 / 7.0 - 0.1 * a3)))
    return np.where(z >= 0, 0.5 + half, 0.5 - half)


def conditional_quantiles(joint: LocalProblem, levels) -> np.ndarray:
    """q_tau(x) (n_q, n_levels) for a continuous y (the joint problem's first column, its
    queries' y ignored) at the levels ``levels`` in (0, 1): (n_levels,) for every row or
    (n_q, n_levels) per row; by the module docstring's root-finder
    (:func:`nbattn.kernels.density.conditional_quantile_roots`, on the CPU), non-decreasing
    along increasing levels; its GPU twin on the spec's device."""
    refuse_stretched(joint, "conditional quantiles")
    n_q = joint.q_cont.shape[0]
    levels = np.asarray(levels, dtype=np.float64)
    if levels.ndim < 2:
        levels = np.broadcast_to(levels.reshape(1, -1), (n_q, levels.size))
    order = np.argsort(levels, axis=1, kind="stable")
    ascending = np.ascontiguousarray(np.take_along_axis(levels, order, axis=1))
    z = np.ascontiguousarray(_inverse_integrated_kernel(ascending, joint.spec.kernel))
    marginal = marginal_problem(joint, 1)
    keys_y = np.ascontiguousarray(joint.keys_cont_t[0])
    module = kernels_for("density", joint.spec.device)
    with serial_below(n_q * keys_y.size, 20_000):
        roots = module.conditional_quantile_roots(
            marginal.q_cont,
            marginal.keys_cont_t,
            marginal.q_cat,
            marginal.keys_cat_t,
            marginal.cat_params,
            marginal.log_weights,
            keys_y,
            ascending,
            z,
            KERNEL_CODES[joint.spec.kernel],
            QUANTILE_XTOL,
        )
    lost = np.flatnonzero(np.isnan(roots[:, 0]))
    if lost.size:  # no key of x within reach: the nearest key's y alone
        nearest = _nearest_keys(marginal, lost)
        roots[lost] = keys_y[nearest][:, None] + z[lost]
    out = np.empty_like(roots)
    np.put_along_axis(out, order, roots, axis=1)
    out = out * float(joint.h[0]) + float(joint.centre[0])
    if joint.spec.kernel == "gaussian":  # rows far from every key, about their best key
        log_normaliser = log_kernel_sums_of(
            marginal,
            np.zeros(marginal.keys_cont_t.shape[0], bool),
            np.zeros(marginal.keys_cat_t.shape[0], bool),
        )

        def near(problem, row):
            return conditional_quantiles(problem, levels[row : row + 1])[0]

        _pooled_far(joint, marginal, 1, near, log_normaliser, out)
    return out


def check_levels(q, name="q") -> tuple[np.ndarray, bool]:
    """Levels in (0, 1) as a 1-D float64 array, and whether one number was given. Text,
    booleans and levels that round to 0 or 1 are refused, naming ``name``."""
    scalar = isinstance(q, numbers.Real) and not isinstance(q, (bool, np.bool_))
    try:
        arr = np.asarray(q)
    except (TypeError, ValueError):
        arr = None
    numeric = arr is not None and arr.dtype.kind in "iuf"
    arr = arr.astype(np.float64).reshape(-1) if numeric else None
    if arr is None or arr.size == 0 or not np.all((arr > 0.0) & (arr < 1.0)):
        raise ValueError(
            f"{name} must be a level or a list of levels in (0, 1) (numbers, not text); got {q!r}"
        )
    return arr, scalar


def interval_levels(alpha) -> np.ndarray:
    """(alpha/2, 1 - alpha/2) of a central (1 - alpha) interval, alpha a number in (0, 1)
    (refused where 1 - alpha/2 rounds to 1, whose quantile is infinite)."""
    if (
        isinstance(alpha, (bool, np.bool_))
        or not isinstance(alpha, numbers.Real)
        or not 0.0 < alpha < 1.0
    ):
        raise ValueError(f"alpha must be a float in (0, 1); got {alpha!r}")
    return check_levels([alpha / 2.0, 1.0 - alpha / 2.0], "alpha/2 and 1 - alpha/2")[0]
