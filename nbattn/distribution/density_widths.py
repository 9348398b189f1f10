"""A density's widths by leave-one-out likelihood (statsmodels' and np's ``cv_ml``).

The criterion of widths theta (log h per continuous column, the categorical smoothing
through its sigmoid, :mod:`nbattn.local.search`) is the weighted mean negative
log-likelihood of each training row under the density of the others,

    CV(theta) = -sum_i u_i log f_-i(x_i),    u_i = w_i / W,

f_-i the density of the other rows (:func:`nbattn.distribution.density.log_density_of`
on the engine's leave-one-out problem: the pair (i, i) left out, W_-i its total weight).
Without weights n CV is statsmodels' ``loo_likelihood`` at the same widths plus
n log(n - 1) (statsmodels sums the other rows' kernels without dividing by their number;
:func:`loo_log_likelihood` returns n CV); with weights CV does not depend on their total.
It is +inf where a row has no other row within reach (exact matching of a category cell
seen once, a compact kernel narrower than the gaps).

The search is the regression's (:func:`nbattn.local.search.search_widths`: the rule's
widths, a common factor of every h, exact matching in the categorical columns, sweeps
of each width over a grid), without the gradient descents (no gradient pass yet), and
returns the best point it evaluated: never worse than the rule. The categorical
smoothing stays inside its kernel's range (l in [0, lambda_max]; statsmodels'
optimiser can leave it). With ``rtol > 0`` the search runs on the pruned criterion and
its answer is compared with the rule's widths exactly.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .._core.progress import FitProgress
from ..local.problem import LocalProblem, LocalSpec, check_columns, check_sample_weight
from ..local.search import search_widths, theta_to_widths, widths_to_theta
from ..local.widths import LooCriterion
from .density import density_layout, density_rule_widths, log_density_of, resolve_density_widths

__all__ = ["LikelihoodCriterion", "cv_ml_widths", "loo_log_likelihood"]


class LikelihoodCriterion(LooCriterion):
    """CV(theta) of the module docstring on a density's leave-one-out problem; no gradient."""

    has_gradient = False

    def __init__(self, problem: LocalProblem):
        super().__init__(problem)
        self.positive = self.loo_weights > 0.0

    def row_log_densities(self, theta) -> np.ndarray:
        """log f_-i(x_i) per row (n,) at theta."""
        return log_density_of(self.problem_at(theta))

    def _value(self, theta) -> float:
        logs = self.row_log_densities(theta)[self.positive]
        if not np.all(logs > -np.inf):
            return math.inf
        return -float(self.loo_weights[self.positive] @ logs)

    def loss_and_grad(self, theta):
        raise NotImplementedError("the leave-one-out likelihood has no gradient pass yet")


def _loo_problem(spec: LocalSpec, X, widths, sample_weight) -> LocalProblem:
    return density_layout(spec, X, X, widths, sample_weight, exclude_self=True)


def cv_ml_widths(spec: LocalSpec, X, sample_weight=None, *, start=None, verbose=0) -> np.ndarray:
    """The widths (d,) of least CV on checked data X (n, d) (module docstring), searched
    from ``start`` (the normal reference rule's by default)."""
    if X.shape[0] < 2:
        raise ValueError(
            f"bandwidth='cv_ml' leaves each row out: it needs at least 2 rows, got {X.shape[0]}"
        )
    start = density_rule_widths(spec, X, "normal_reference") if start is None else start
    criterion = LikelihoodCriterion(_loo_problem(spec, X, start, sample_weight))
    with FitProgress(verbose, "cv_ml_widths", unit="evaluation") as criterion.log:
        theta = search_widths(criterion, start, per_column=True)
    if spec.rtol > 0.0:
        exact = LikelihoodCriterion(
            dataclasses.replace(criterion.base, spec=dataclasses.replace(spec, rtol=0.0))
        )
        rule = widths_to_theta(start, spec.var_type, spec.n_categories)
        theta = theta if exact.loss(theta) < exact.loss(rule) else rule
    return theta_to_widths(theta, spec.var_type, spec.n_categories)


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
    """-sum_i (w_i / mean w) log f_-i(x_i), n CV (module docstring: statsmodels'
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
    widths = resolve_density_widths(spec, X, bandwidth)
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    criterion = LikelihoodCriterion(_loo_problem(spec, X, widths, sample_weight))
    theta = widths_to_theta(widths, spec.var_type, spec.n_categories)
    return X.shape[0] * criterion.loss(theta)
