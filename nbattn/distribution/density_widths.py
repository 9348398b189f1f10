"""A density's widths by leave-one-out likelihood (statsmodels' and np's ``cv_ml``), for
the joint density of x and the conditional density of y given x.

The criterion of widths theta (log h per continuous column, the categorical smoothing
through its sigmoid, :mod:`nbattn.local.search`) is the weighted mean negative
log-likelihood of each training row under the density of the others,

    CV(theta) = -sum_i u_i log f₋ᵢ(x_i),    u_i = w_i / W,

f₋ᵢ the density of the other rows (the pooling's normaliser on the leave-one-out
problem, the pair (i, i) left out, W₋ᵢ its total weight: one pass of
:func:`nbattn.distribution.density.score_means` gives it with its gradient, or the
engine's pruned :func:`~nbattn.distribution.density.log_density_of` with ``rtol > 0``),
or for a conditional density -sum_i u_i log f₋ᵢ(y_i | x_i), the ratio of the joint and
the marginal leave-one-out densities (statsmodels' ``KDEMultivariateConditional``
``loo_likelihood`` is n times it exactly: the totals cancel in the ratio).
Without weights n CV is statsmodels' ``loo_likelihood`` at the same widths plus
n log(n - 1) (statsmodels sums the other rows' kernels without dividing by their number;
:func:`loo_log_likelihood` returns n CV); with weights CV does not depend on their total.
It is +inf where a row has no other row within reach (exact matching of a category cell
seen once, a compact kernel narrower than the gaps).

The search is the regression's (:func:`nbattn.local.search.search_widths`: the rule's
widths, a common factor of every h, L-BFGS-B with the criterion's exact gradient
(:meth:`LikelihoodCriterion.loss_and_grad`), exact matching in the categorical columns,
sweeps of each width over a grid), under the smooth criterion's policy
(:data:`nbattn.local.search.SMOOTH_POLICY`: a coarse common factor, one descent, sweeps
only where one grid step of one parameter gains) for the Gaussian kernel, and returns the
best point it evaluated: never worse than the rule. The categorical
smoothing stays inside its kernel's range (l in [0, lambda_max]; statsmodels'
optimiser can leave it). With ``rtol > 0`` the search runs on the pruned criterion and
its answer is compared with the rule's widths exactly.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

from .. import config
from .._core.numeric import power_of_two_scale
from .._core.progress import FitProgress
from ..local.engine import loo_term_weights
from ..local.neighbour_search import search_neighbour_widths
from ..local.problem import (
    LocalProblem,
    LocalSpec,
    categorical_terms,
    check_columns,
    check_sample_weight,
    lambda_max,
    rule_lambdas,
)
from ..local.search import SMOOTH_POLICY, search_widths, theta_to_widths, widths_to_theta
from ..local.widths import LooCriterion, categorical_derivatives
from ..smoothing.search import BandwidthRangeWarning
from .conditional import conditional_log_density
from .density import (
    KERNEL_LOG_CONSTANTS,
    density_layout,
    density_rule_widths,
    log_density_of,
    log_weight_sums,
    resolve_density_widths,
    score_means,
)

__all__ = [
    "LikelihoodCriterion",
    "cv_ml_widths",
    "loo_log_likelihood",
    "neighbour_cv_ml_widths",
    "warn_at_the_floor",
]


class LikelihoodCriterion(LooCriterion):
    """CV(theta) of the module docstring on a density's leave-one-out problem, and its
    gradient.
    With ``n_response`` > 0 the problem is the joint one of (y, x), y's columns first, and
    the density the conditional f₋ᵢ(y_i | x_i) (:mod:`nbattn.distribution.conditional`)."""

    pools_ties = False  # a density's criterion: no local fits

    def __init__(self, problem: LocalProblem, n_response: int = 0):
        super().__init__(problem)
        self.positive = self.loo_weights > 0.0
        self.n_response = n_response
        response = problem.spec.var_type[:n_response]
        self._response_cont = sum(kind == "c" for kind in response)
        self._response_cat = n_response - self._response_cont
        n = problem.q_cont.shape[0]
        self._log_total = log_weight_sums(problem.sample_weight, n, exclude_self=True)
        self._marginal_q_cat = np.ascontiguousarray(problem.q_cat[:, self._response_cat :])
        self._marginal_keys_cat_t = np.ascontiguousarray(problem.keys_cat_t[self._response_cat :])

    def row_log_densities(self, theta) -> np.ndarray:
        """log f₋ᵢ(x_i) (or log f₋ᵢ(y_i | x_i)) per row (n,) at theta: by the gradient's
        pass when the criterion is exact (one computation of the value, with or without
        the gradient), by the engine's pruned one with ``rtol > 0``."""
        if self.base.spec.rtol == 0.0:
            return self._logs_and_slopes(np.asarray(theta, dtype=np.float64), False)[0]
        problem = self.problem_at(theta)
        if self.n_response:
            return conditional_log_density(problem, self.n_response)
        return log_density_of(problem)

    def _value(self, theta) -> float:
        logs = self.row_log_densities(theta)[self.positive]
        if not np.all(logs > -np.inf):
            return math.inf
        return -float(self.loo_weights[self.positive] @ logs)

    def loss_and_grad(self, theta):
        """CV(theta) and its exact gradient: d log f₋ᵢ / dtheta is the softmax mean of the
        score's derivatives less 1 per continuous column (the 1 / h of its kernel); for a
        conditional density the joint's less the marginal's."""
        self.n_grad += 1
        theta = np.asarray(theta, dtype=np.float64)
        logs, slopes = self._logs_and_slopes(theta, True)
        u, keep = self.loo_weights, self.positive
        if not np.all(logs[keep] > -np.inf):
            return math.inf, np.zeros(theta.size)
        value = -float(u[keep] @ logs[keep])
        grad = np.empty(theta.size)
        grad[self.order] = -(u[keep] @ slopes[keep])
        if not math.isfinite(value) or not np.isfinite(grad).all():
            return math.inf, np.zeros(theta.size)
        self.cache[theta.tobytes()] = value
        self._record(value, theta)
        return value, grad

    def _logs_and_slopes(self, theta, gradient: bool):
        """log f₋ᵢ per row (n,) and, with ``gradient``, d log f₋ᵢ / dtheta (n, d) (else
        None), by one pass of :func:`nbattn.distribution.density.score_means` (two for a
        conditional density: the joint's and x's): the log of the pooling's normaliser
        less log W₋ᵢ and the kernels' constants, and the softmax mean of the score's
        derivatives less 1 per continuous column (the joint's less x's). The layout's
        arrays at theta are the base problem's (:meth:`_scaled`), the categorical codes
        and weights shared."""
        spec, base = self.base.spec, self.base
        widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
        h = widths[self.cont]
        q_cont, keys_cont_t = self._scaled(theta, h)
        cat_params = categorical_terms(spec.var_type, spec.n_categories, widths)
        if gradient:
            dparams = categorical_derivatives(theta, spec.var_type, spec.n_categories)
        else:
            dparams = np.zeros((cat_params.shape[0], 3))
        common = (base.log_weights, spec.kernel, base.exclude_self, gradient)
        log_sums, means = score_means(
            q_cont, keys_cont_t, base.q_cat, base.keys_cat_t, cat_params, dparams, *common
        )
        dc = keys_cont_t.shape[0]
        log_constant = KERNEL_LOG_CONSTANTS[spec.kernel]
        constant = float(np.sum(np.log(h))) + dc * log_constant
        if not self.n_response:
            with np.errstate(invalid="ignore"):  # -inf - -inf: no other row has weight
                logs = log_sums - self._log_total - constant
            logs[np.isnan(logs)] = -math.inf
            if not gradient:
                return logs, None
            slopes = means.copy()
            slopes[:, :dc] -= 1.0
            return logs, slopes
        rc, rk = self._response_cont, self._response_cat
        m_log_sums, m_means = score_means(
            np.ascontiguousarray(q_cont[:, rc:]),
            np.ascontiguousarray(keys_cont_t[rc:]),
            self._marginal_q_cat,
            self._marginal_keys_cat_t,
            np.ascontiguousarray(cat_params[rk:]),
            dparams[rk:],
            *common,
        )
        m_constant = float(np.sum(np.log(h[rc:]))) + (dc - rc) * log_constant
        with np.errstate(invalid="ignore"):  # -inf - -inf: no key reaches the row
            logs = log_sums - m_log_sums - (constant - m_constant)
        if not gradient:
            return logs, None
        slopes = means.copy()
        slopes[:, :rc] -= 1.0
        slopes[:, rc:dc] -= m_means[:, : dc - rc]
        slopes[:, dc + rk :] -= m_means[:, dc - rc :]
        return logs, slopes

    def _scaled(self, theta, h):
        """The continuous columns divided by h: queries (n, dc) and keys (dc, n), those of
        :meth:`problem_at` (the same divisions), which words the error where a column
        overflows (it is asked only then)."""
        with np.errstate(all="ignore"):
            q_cont = self.q_unit / h
            keys_cont_t = self.k_unit / h[:, None]
        if np.isfinite(q_cont).all() and np.isfinite(keys_cont_t).all():
            return q_cont, keys_cont_t
        problem = self.problem_at(theta)
        return problem.q_cont, problem.keys_cont_t


def _loo_problem(spec: LocalSpec, X, widths, sample_weight) -> LocalProblem:
    return density_layout(spec, X, X, widths, sample_weight, exclude_self=True)


def _policy(spec: LocalSpec):
    """The search's policy: :data:`~nbattn.local.search.SMOOTH_POLICY` for the Gaussian
    kernel, whose criterion is smooth in theta; the default search for a compact kernel,
    whose criterion is kinked where a pair enters the kernel's support (a descent stops
    at a kink that only the common factor's refinement and the sweeps see past)."""
    return SMOOTH_POLICY if spec.kernel == "gaussian" else None


def cv_ml_widths(
    spec: LocalSpec, X, sample_weight=None, *, start=None, n_response=0, verbose=0
) -> np.ndarray:
    """The widths (d,) of least CV on checked data X (n, d) (module docstring), searched
    from ``start`` (the normal reference rule's by default). ``n_response`` > 0: X holds
    (y, x), y's columns first, and CV is the conditional likelihood of y given x."""
    if X.shape[0] < 2:
        raise ValueError(
            "bandwidth='cv_ml' leaves each row out: it needs at least 2 rows "
            f"(n_samples = {X.shape[0]})"
        )
    if sample_weight is not None:  # exact: weights times a power of two search to the bit
        sample_weight = sample_weight / power_of_two_scale(float(np.max(sample_weight)))
    if start is None:
        start = density_rule_widths(spec, X, "normal_reference", sample_weight)
    criterion = LikelihoodCriterion(_loo_problem(spec, X, start, sample_weight), n_response)
    policy = _policy(spec)
    with FitProgress(verbose, "cv_ml_widths", unit="evaluation") as criterion.log:
        theta = search_widths(criterion, start, per_column=True, policy=policy)
        if policy is not None and _at_the_floor(spec, start, theta):
            # a plateau at the floor (the criterion flat as h shrinks past the pairs'
            # gaps) stops the smooth policy's descent there; the full search's sweeps
            # see past it: the better of the two, the smooth one's on a tie
            full = search_widths(criterion, start, per_column=True)
            theta = full if criterion.loss(full) < criterion.loss(theta) else theta
    if spec.rtol > 0.0:
        exact = LikelihoodCriterion(
            dataclasses.replace(criterion.base, spec=dataclasses.replace(spec, rtol=0.0)),
            n_response,
        )
        rule = widths_to_theta(start, spec.var_type, spec.n_categories)
        theta = theta if exact.loss(theta) < exact.loss(rule) else rule
    widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
    warn_at_the_floor(spec, start, widths, n_response=n_response)
    return widths


def neighbour_cv_ml_widths(spec: LocalSpec, X, sample_weight=None, n_response=0) -> np.ndarray:
    """The nearest-neighbour widths (d,) of least CV (module docstring) on checked data X
    (n, d) (``n_response`` > 0: X holds (y, x), y's columns first, and CV is the
    conditional likelihood): counts k per continuous column, l per categorical one, by
    :func:`nbattn.local.neighbour_search.search_neighbour_widths` (every k evaluated where
    n - 1 holds few of them, else narrowing grids; never a k worse than those the grids
    held), the criterion computed by the engine at each candidate."""
    n = X.shape[0]
    if n < 2:
        raise ValueError(
            f"bandwidth='cv_ml' leaves each row out: it needs at least 2 rows (n_samples = {n})"
        )
    terms = loo_term_weights(sample_weight, n)
    keep = terms > 0.0

    def criterion(widths):
        problem = _loo_problem(spec, X, widths, sample_weight)
        if n_response:
            logs = conditional_log_density(problem, n_response)
        else:
            logs = log_density_of(problem)
        if not np.all(logs[keep] > -np.inf):
            return math.inf
        return -float(terms[keep] @ logs[keep])

    start = rule_lambdas(spec.var_type, spec.counts, n)
    top = lambda_max(spec.var_type, spec.counts)
    return search_neighbour_widths(criterion, spec.var_type, start, top, n - 1)[0]


def _at_the_floor(spec: LocalSpec, start, theta) -> bool:
    """Whether a continuous width of theta is at the search's lower bound."""
    widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
    floor = start * config.WIDTH_BOUNDS[0] * (1.0 + 1e-9)
    return bool(np.any(spec.continuous & (widths <= floor)))


def warn_at_the_floor(
    spec: LocalSpec, start, widths, name: str = "cv_ml", n_response: int = 0
) -> None:
    """Warn where a continuous h ended at the search's lower bound: the criterion
    ``bandwidth=name`` still improved as h shrank (ties: values repeated within the
    column, whose density grows without bound as h goes to 0). The first ``n_response``
    columns are a conditional model's y."""
    floor = config.WIDTH_BOUNDS[0]
    for column in np.flatnonzero(spec.continuous):
        if widths[column] <= start[column] * floor * (1.0 + 1e-9):
            which = "y" if column < n_response else f"X column {column - n_response}"
            declare = (
                "pass y as an ordered pandas category"
                if column < n_response
                else "declare it ordered ('o' in var_type)"
            )
            warnings.warn(
                f"bandwidth={name!r}: {which}'s width reached the search's lower "
                f"bound ({widths[column]:.3g}, {floor:g} of the rule's): its criterion still "
                "improves as h shrinks, as it does for repeated values. If the column is "
                f"discrete, {declare}; else use a rule or given widths",
                BandwidthRangeWarning,
                stacklevel=3,
            )


def loo_log_likelihood(
    X,
    bandwidth="normal_reference",
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    rtol=0.0,
    device="cpu",
) -> float:
    """-sum_i (w_i / mean w) log f₋ᵢ(x_i), n CV (module docstring: statsmodels'
    ``loo_likelihood`` plus n log(n - 1) without weights). The arguments are
    :func:`nbattn.distribution.density.kernel_density`'s (``bandwidth`` a rule or
    widths). +inf where a row has no other row within reach."""
    spec, (X,) = check_columns(
        {"X": X},
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        rtol=rtol,
        device=device,
    )
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    widths = resolve_density_widths(spec, X, bandwidth, sample_weight)
    criterion = LikelihoodCriterion(_loo_problem(spec, X, widths, sample_weight))
    theta = widths_to_theta(widths, spec.var_type, spec.n_categories)
    return X.shape[0] * criterion.loss(theta)
