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
F is a convex combination of G((y - y_j) / h), so the root lies in
[min_j y_j + h G^-1(tau), max_j y_j + h G^-1(tau)] for every row; a safeguarded
regula falsi (Illinois, with a bisection every third step) narrows each row's bracket
until it is within ``QUANTILE_XTOL`` h of the root, all rows and levels in one kernel
pass per step. The levels are solved in increasing order and the quantiles of a row
made non-decreasing in the level (a running maximum), so they never cross.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..local.engine import fit_problem
from ..local.problem import LocalProblem
from .density import log_density_of, log_kernel_sums_of

__all__ = [
    "QUANTILE_XTOL",
    "conditional_log_cdf",
    "conditional_log_density",
    "conditional_quantiles",
    "marginal_problem",
]

#: The quantiles' tolerance: each within this many widths h_y of the root of F(q | x) = tau.
QUANTILE_XTOL = 1e-10
#: Most steps of the root-finder (each at least a third of them a bisection: far more than
#: the 3 * log2(range / (h QUANTILE_XTOL)) steps any bracket needs).
_QUANTILE_STEPS = 400


def marginal_problem(joint: LocalProblem, n_response: int = 1) -> LocalProblem:
    """x's problem from the joint problem of (y, x), y's ``n_response`` columns first:
    the same layout without them."""
    spec = joint.spec
    response = spec.var_type[:n_response]
    n_cont = sum(kind == "c" for kind in response)
    n_cat = n_response - n_cont
    return dataclasses.replace(
        joint,
        spec=dataclasses.replace(
            spec,
            var_type=spec.var_type[n_response:],
            n_categories=tuple(spec.n_categories[n_response:]),
        ),
        q_cont=np.ascontiguousarray(joint.q_cont[:, n_cont:]),
        keys_cont_t=np.ascontiguousarray(joint.keys_cont_t[n_cont:]),
        q_cat=np.ascontiguousarray(joint.q_cat[:, n_cat:]),
        keys_cat_t=np.ascontiguousarray(joint.keys_cat_t[n_cat:]),
        cat_params=np.ascontiguousarray(joint.cat_params[n_cat:]),
        h=joint.h[n_cont:],
        widths=joint.widths[n_response:],
        centre=None if joint.centre is None else joint.centre[n_cont:],
    )


def _flags(joint: LocalProblem, n_response: int):
    """The integration flags of y's columns in the joint problem (continuous, categorical)."""
    response = joint.spec.var_type[:n_response]
    n_cont = sum(kind == "c" for kind in response)
    cont = np.zeros(joint.keys_cont_t.shape[0], dtype=bool)
    cat = np.zeros(joint.keys_cat_t.shape[0], dtype=bool)
    cont[:n_cont] = True
    cat[: n_response - n_cont] = True
    return cont, cat


def _unreached(marginal: LocalProblem):
    """(rows no key of x reaches, their nearest key): the fallback of the module docstring."""
    fit = fit_problem(marginal)
    lost = ~(fit.log_norm > -np.inf)
    return lost, fit.nearest


def _single_key(problem: LocalProblem, rows, keys) -> LocalProblem:
    """The problem of ``rows`` (queries) against one key each (their nearest): the keys'
    columns repeated, each query its own key (exclude_self off)."""
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
    )


def _fallback(joint, marginal, n_response, compute):
    """``compute(problem)`` for the rows no key of x reaches, on y's column(s) against
    their nearest key alone; (rows, values)."""
    lost, nearest = _unreached(marginal)
    rows = np.flatnonzero(lost & (nearest >= 0))
    if rows.size == 0:
        return rows, np.zeros(0)
    response = marginal_complement(joint, n_response)
    out = np.empty(rows.size)
    for k, row in enumerate(rows):  # rare rows: one small problem each
        single = _single_key(response, [row], [int(nearest[row])])
        out[k] = compute(single)[0]
    return rows, out


def marginal_complement(joint: LocalProblem, n_response: int = 1) -> LocalProblem:
    """y's problem from the joint problem of (y, x): y's columns alone."""
    spec = joint.spec
    response = spec.var_type[:n_response]
    n_cont = sum(kind == "c" for kind in response)
    n_cat = n_response - n_cont
    return dataclasses.replace(
        joint,
        spec=dataclasses.replace(
            spec, var_type=response, n_categories=tuple(spec.n_categories[:n_response])
        ),
        q_cont=np.ascontiguousarray(joint.q_cont[:, :n_cont]),
        keys_cont_t=np.ascontiguousarray(joint.keys_cont_t[:n_cont]),
        q_cat=np.ascontiguousarray(joint.q_cat[:, :n_cat]),
        keys_cat_t=np.ascontiguousarray(joint.keys_cat_t[:n_cat]),
        cat_params=np.ascontiguousarray(joint.cat_params[:n_cat]),
        h=joint.h[:n_cont],
        widths=joint.widths[:n_response],
        centre=None if joint.centre is None else joint.centre[:n_cont],
    )


def conditional_log_density(joint: LocalProblem, n_response: int = 1) -> np.ndarray:
    """log f(y | x) at the joint problem's queries (n_q,) (leave-one-out when it excludes
    self): log f(x, y) - log f(x); a row no key of x reaches takes its nearest key's y."""
    marginal = marginal_problem(joint, n_response)
    with np.errstate(invalid="ignore"):
        out = log_density_of(joint) - log_density_of(marginal)
    if not joint.exclude_self:
        rows, values = _fallback(joint, marginal, n_response, log_density_of)
        out[rows] = values
    return np.where(np.isnan(out), -np.inf, out)


def conditional_log_cdf(joint: LocalProblem, n_response: int = 1) -> np.ndarray:
    """log F(y | x) at the joint problem's queries (n_q,): the pooling of y's integrated
    kernel over x's weights (module docstring). Exact, on the CPU."""
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

    rows, values = _fallback(joint, marginal, n_response, single_cdf)
    out[rows] = np.minimum(values, 0.0)
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
    (n_q, n_levels) per row; by the safeguarded regula falsi of the module docstring,
    non-decreasing along increasing levels."""
    n_q = joint.q_cont.shape[0]
    levels = np.asarray(levels, dtype=np.float64)
    if levels.ndim < 2:
        levels = np.broadcast_to(levels.reshape(1, -1), (n_q, levels.size))
    order = np.argsort(levels, axis=1, kind="stable")
    h = float(joint.h[0])
    keys_y = joint.keys_cont_t[0]
    live = joint.log_weights > -np.inf
    low_key, high_key = float(keys_y[live].min()), float(keys_y[live].max())
    marginal = marginal_problem(joint, 1)
    zero_c = np.zeros(marginal.keys_cont_t.shape[0], bool)
    zero_k = np.zeros(marginal.keys_cat_t.shape[0], bool)
    denominator = log_kernel_sums_of(marginal, zero_c, zero_k)
    lost, nearest = _unreached(marginal)
    cont, cat = _flags(joint, 1)
    # the rows repeated once per level: (n_q * n_levels) root-finding problems
    n_levels = levels.shape[1]
    rows = np.repeat(np.arange(n_q), n_levels)
    tau = levels.reshape(-1).copy()
    z = _inverse_integrated_kernel(tau, joint.spec.kernel)
    lo, hi = low_key + z, high_key + z  # scaled units: F(lo) <= tau <= F(hi)

    def cdf_at(which, u):
        q_cont = joint.q_cont[rows[which]].copy()
        q_cont[:, 0] = u
        problem = dataclasses.replace(
            joint,
            q_cont=np.ascontiguousarray(q_cont),
            q_cat=np.ascontiguousarray(joint.q_cat[rows[which]]),
        )
        log_f = log_kernel_sums_of(problem, cont, cat) - denominator[rows[which]]
        value = np.exp(np.minimum(log_f, 0.0))
        gone = lost[rows[which]] & (nearest[rows[which]] >= 0)
        if gone.any():  # the nearest key's y alone: G(u - y_nearest)
            near = keys_y[nearest[rows[which]][gone]]
            value[gone] = _integrated_any(u[gone] - near, joint.spec.kernel)
        return value

    f_lo, f_hi = cdf_at(np.arange(rows.size), lo) - tau, cdf_at(np.arange(rows.size), hi) - tau
    side = np.zeros(rows.size, dtype=np.int8)
    active = np.flatnonzero(hi - lo > QUANTILE_XTOL)
    for step in range(_QUANTILE_STEPS):
        if active.size == 0:
            break
        a, b, fa, fb = lo[active], hi[active], f_lo[active], f_hi[active]
        with np.errstate(divide="ignore", invalid="ignore"):
            guess = b - fb * (b - a) / (fb - fa)
        middle = 0.5 * (a + b)
        bisect = (step % 3 == 2) | ~((guess > a) & (guess < b))
        u = np.where(bisect, middle, guess)
        fu = cdf_at(active, u) - tau[active]
        left = fu < 0.0
        # Illinois: halve the value kept at the end that did not move twice running
        fb = np.where(left & (side[active] == -1), 0.5 * fb, fb)
        fa = np.where(~left & (side[active] == 1), 0.5 * fa, fa)
        lo[active] = np.where(left, u, a)
        f_lo[active] = np.where(left, fu, fa)
        hi[active] = np.where(left, b, u)
        f_hi[active] = np.where(left, fb, fu)
        side[active] = np.where(left, -1, 1)
        done = (hi[active] - lo[active] <= QUANTILE_XTOL) | (fu == 0.0)
        exact = fu == 0.0
        lo[active[exact]] = u[exact]
        hi[active[exact]] = u[exact]
        active = active[~done]
    scaled = (0.5 * (lo + hi)).reshape(n_q, n_levels)
    ascending = np.maximum.accumulate(np.take_along_axis(scaled, order, axis=1), axis=1)
    out = np.empty_like(scaled)
    np.put_along_axis(out, order, ascending, axis=1)
    return out * h + _centre(joint)


def _integrated_any(z, kernel):
    if kernel == "gaussian":
        from scipy.special import ndtr

        return ndtr(z)
    return _integrated(z, kernel)


def _centre(joint: LocalProblem) -> float:
    """The centre the layout subtracted from y's column."""
    return float(joint.centre[0])
