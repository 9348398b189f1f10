"""A density's widths by least-squares cross-validation (statsmodels' and np's ``cv_ls``),
for the joint density of x and the conditional density of y given x (Li and Racine 2007,
*Nonparametric Econometrics*, sections 1.3, 4.2 and 5.2).

The criterion estimates the integrated squared error less its constant: with weights
u_i = w_i / W (1 / n without weights),

    CV(h) = int f^2 - 2 sum_i u_i f₋ᵢ(x_i),
    int f^2 = sum_i sum_j u_i u_j prod_c Kbar_c(x_ic, x_jc),
    f₋ᵢ(x_i) = sum_{j != i} w_j K_ij / W₋ᵢ,

Kbar the convolution of a column's kernel with itself (so the integral is exact): for a
continuous column (K * K)((x - x') / h) / h, the Gaussian of width sqrt(2) h for the
Gaussian kernel and 3/160 (2 - abs(u))^3 (u^2 + 6 abs(u) + 4) on abs(u) < 2 for the
Epanechnikov kernel; for a categorical one the kernel convolved over the column's codes,
sum_v L(a, v) L(b, v), v = 0 .. c - 1 (the closed forms are
:func:`nbattn.kernels.density.category_convolution`'s). Without weights it is
statsmodels' ``KDEMultivariate.imse``: (1/n^2) sum_ij Kbar_ij - 2/(n (n - 1)) sum_{i != j}
K_ij. With weights it does not depend on their total. Departure from statsmodels: the
categorical sums run over the declared codes 0 .. c - 1, statsmodels' over the levels
present in the data (the same where every level occurs).

For the conditional density of y given x (statsmodels' ``KDEMultivariateConditional.imse``),

    CV(h) = sum_l u_l [ int f₋ₗ(y | x_l)^2 dy - 2 f₋ₗ(y_l | x_l) ],
    int f₋ₗ(y | x_l)^2 dy = sum_{i, j != l} p_i p_j Kbar_y(y_i, y_j),

p_j = w_j K_x(x_l, x_j) / sum_{j' != l} w_j' K_x(x_l, x_j') the pooling weights of x's
columns: a sum over pairs for every row, O(n^3) in all as in statsmodels. It is +inf
where a row's x is reached by no other row (compact kernels, exact matching).

Both run as pair passes over the rows in log space (:mod:`nbattn.kernels.density`:
``ls_pair_sums``, ``ls_conditional_terms``; never the n x n matrix) with the exact
gradient in theta (log h per continuous column, the categorical smoothing through its
sigmoid): each sum's softmax mean of its score's derivatives, as ``cv_ml``'s.

The search is ``cv_ml``'s (:func:`nbattn.local.search.search_widths`: the rule, a common
factor of every h, L-BFGS-B with the exact gradient, exact matching, sweeps), on CV
divided by a positive constant, its leave-one-out term sum_i u_i f₋ᵢ(x_i) at the start
(a number without units, near -1 at the start, so that the optimiser's absolute
tolerances act as relative ones); the answer is the best point evaluated, never worse
than the rule, each l inside [0, lambda_max]. The criterion is
exact (``rtol`` does not apply) and runs on the CPU. The Gaussian and Epanechnikov
kernels only: the tricube's convolution is a piecewise polynomial of degree 19 not
implemented here.
"""

from __future__ import annotations

import math

import numpy as np

from .. import config
from .._core.local_groups import KERNEL_CODES
from .._core.progress import FitProgress
from .._core.threads import serial_below
from ..dispatch.device import kernels_for
from ..local.problem import LocalProblem, LocalSpec, check_columns, check_sample_weight
from ..local.search import search_widths, sigmoid, theta_to_widths, widths_to_theta
from ..local.widths import LooCriterion, categorical_derivatives
from .density import (
    KERNEL_LOG_CONSTANTS,
    density_layout,
    density_rule_widths,
    log_weight_sums,
    resolve_density_widths,
)
from .density_widths import warn_at_the_floor

__all__ = ["LS_KERNELS", "LeastSquaresCriterion", "cv_ls_widths", "least_squares_cv"]

#: The continuous kernels whose convolution ``cv_ls`` knows, and log of its constant
#: per unit of h (:data:`nbattn.kernels.density.CONVOLVED_LOG_CONSTANTS`).
LS_KERNELS = {"gaussian": -0.5 * math.log(4.0 * math.pi), "epanechnikov": math.log(3.0 / 160.0)}


def _check_ls_kernel(kernel: str) -> None:
    """Refuse a continuous kernel whose convolution with itself is not in ``LS_KERNELS``."""
    if kernel not in LS_KERNELS:
        raise ValueError(
            f"bandwidth='cv_ls' needs the convolution of the kernel with itself, known here "
            f"for kernel in {sorted(LS_KERNELS)}; got kernel={kernel!r}: use one of those, "
            "or bandwidth='cv_ml'"
        )


def _convolution_arguments(spec: LocalSpec, widths, theta):
    """``(conv_params (dk, 4), conv_sums (dk, 2, m))`` of the categorical columns, the
    arguments of :func:`nbattn.kernels.density.category_convolution`: (kind, l, c,
    1 - sigmoid(t)) and the geometric sums S(m) = sum_{k=1}^{m} l^(2k), l dS/dl,
    m = 0 .. max c - 1."""
    cat = [p for p, kind in enumerate(spec.var_type) if kind != "c"]
    top = max([int(spec.n_categories[p]) for p in cat], default=1)
    params = np.zeros((len(cat), 4))
    sums = np.zeros((len(cat), 2, max(top, 1)))
    for k, p in enumerate(cat):
        lam = float(widths[p])
        count = int(spec.n_categories[p])
        params[k] = (0.0 if spec.var_type[p] == "u" else 1.0, lam, count, sigmoid(-theta[p]))
        steps = np.arange(1, max(count, 1), dtype=np.float64)
        powers = lam ** (2.0 * steps)
        sums[k, 0, 1:count] = np.cumsum(powers)
        sums[k, 1, 1:count] = np.cumsum(2.0 * steps * powers)
    return params, sums


class LeastSquaresCriterion(LooCriterion):
    """CV(theta) of the module docstring on a density's training problem (its keys are
    its queries) divided by its leave-one-out term at the problem's widths (``unit``;
    where that term is 0, CV times prod h at those widths), and its exact gradient.
    With ``n_response`` > 0 the problem is the joint one of (y, x), y's columns first,
    and CV the conditional density's."""

    pools_ties = False  # a density's criterion: no local fits

    has_gradient = True

    def __init__(self, problem: LocalProblem, n_response: int = 0):
        super().__init__(problem)
        _check_ls_kernel(problem.spec.kernel)
        spec = problem.spec
        self.n_response = n_response
        response = spec.var_type[:n_response]
        self._cont_y = sum(kind == "c" for kind in response)
        self._cat_y = n_response - self._cont_y
        dc = problem.keys_cont_t.shape[0]
        # the continuous columns whose 1 / h the criterion carries: y's, or all of them
        self._scaled = np.arange(self._cont_y if n_response else dc)
        n = self.targets.shape[0]
        self._log_total = log_weight_sums(problem.sample_weight, n)[0]
        self._log_others = log_weight_sums(problem.sample_weight, n, exclude_self=True)
        k = len(self._scaled)
        self._conv_constant = math.exp(k * LS_KERNELS[spec.kernel])
        self._loo_constant = math.exp(-k * KERNEL_LOG_CONSTANTS[spec.kernel])
        self._log_h0 = float(np.sum(np.log(problem.h[self._scaled])))
        self.unit = 1.0
        theta0 = widths_to_theta(problem.widths, spec.var_type, spec.n_categories)
        parts = self._parts(theta0)
        loo = self._loo_constant * parts[1]
        if math.isfinite(loo) and loo > 0.0:
            self.unit = loo

    def _parts(self, theta):
        """(A, B, dA, dB, log prod h): CV = (c_A A - 2 c_B B) / prod h over the scaled
        columns, A the integral term and B the leave-one-out term without constants, dA
        and dB their gradients in the kernels' order (continuous columns first)."""
        theta = np.asarray(theta, dtype=np.float64)
        problem = self.problem_at(theta)
        spec = problem.spec
        dparams = np.ascontiguousarray(
            categorical_derivatives(theta, spec.var_type, spec.n_categories), dtype=np.float64
        ).reshape(-1, 3)
        conv_params, conv_sums = _convolution_arguments(spec, problem.widths, theta)
        module = kernels_for("density", "cpu")
        n = problem.log_weights.shape[0]
        d = len(spec.var_type)
        u = self.loo_weights
        log_h = float(np.sum(np.log(problem.h[self._scaled])))
        args = (
            problem.q_cont,
            problem.q_cat,
            problem.cat_params,
            dparams,
            conv_params,
            conv_sums,
            problem.log_weights,
            KERNEL_CODES[spec.kernel],
        )
        if not self.n_response:
            with serial_below(n * n, config.SERIAL_PAIRS):
                out = module.ls_pair_sums(*args)
            a = np.exp(out[:, 0] - self._log_total)
            with np.errstate(invalid="ignore"):
                b = np.where(out[:, 1] > -np.inf, np.exp(out[:, 1] - self._log_others), 0.0)
            means = out[:, 2:]
            return u @ a, u @ b, (u * a) @ means[:, :d], (u * b) @ means[:, d:], log_h
        with serial_below(n * n * n, config.SERIAL_PAIRS):  # n^2 pairs per row
            out = module.ls_conditional_terms(*args, (self._cont_y, self._cat_y))
        keep = u > 0.0
        if not np.isfinite(out[keep, :2]).all():
            return math.inf, math.inf, np.zeros(d), np.zeros(d), log_h
        return (
            u[keep] @ out[keep, 0],
            u[keep] @ out[keep, 1],
            u[keep] @ out[keep, 2 : 2 + d],
            u[keep] @ out[keep, 2 + d :],
            log_h,
        )

    def imse(self, theta) -> float:
        """CV(theta) itself (statsmodels' ``imse`` without weights), in the data's units."""
        a, b, _, _, log_h = self._parts(theta)
        if not math.isfinite(a):  # a row's x reached by no other row
            return math.inf
        return (self._conv_constant * a - 2.0 * self._loo_constant * b) * math.exp(-log_h)

    def _value(self, theta) -> float:
        a, b, _, _, log_h = self._parts(theta)
        scale = math.exp(self._log_h0 - log_h) / self.unit
        return (self._conv_constant * a - 2.0 * self._loo_constant * b) * scale

    def loss_and_grad(self, theta):
        """The criterion and its exact gradient in theta: each sum's softmax mean of its
        score's derivatives, less the value once per continuous column whose 1 / h the
        criterion carries."""
        self.n_grad += 1
        theta = np.asarray(theta, dtype=np.float64)
        a, b, da, db, log_h = self._parts(theta)
        scale = math.exp(self._log_h0 - log_h) / self.unit
        value = (self._conv_constant * a - 2.0 * self._loo_constant * b) * scale
        slopes = (self._conv_constant * da - 2.0 * self._loo_constant * db) * scale
        slopes[self._scaled] -= value
        grad = np.empty(theta.size)
        grad[self.order] = slopes
        if not math.isfinite(value) or not np.isfinite(grad).all():
            return math.inf, np.zeros(theta.size)
        self.cache[theta.tobytes()] = value
        self._record(value, theta)
        return value, grad


def _check_rows(n: int) -> None:
    if n < 2:
        raise ValueError(
            f"bandwidth='cv_ls' leaves each row out: it needs at least 2 rows (n_samples = {n})"
        )


def cv_ls_widths(
    spec: LocalSpec, X, sample_weight=None, *, start=None, n_response=0, verbose=0
) -> np.ndarray:
    """The widths (d,) of least CV on checked data X (n, d) (module docstring), searched
    from ``start`` (the normal reference rule's by default). ``n_response`` > 0: X holds
    (y, x), y's columns first, and CV is the conditional density's."""
    _check_rows(X.shape[0])
    _check_ls_kernel(spec.kernel)
    if start is None:
        start = density_rule_widths(spec, X, "normal_reference", sample_weight)
    problem = density_layout(spec, X, X, start, sample_weight)
    criterion = LeastSquaresCriterion(problem, n_response)
    with FitProgress(verbose, "cv_ls_widths", unit="evaluation") as criterion.log:
        theta = search_widths(criterion, start, per_column=True)
    widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
    warn_at_the_floor(spec, start, widths, "cv_ls", n_response)
    return widths


def least_squares_cv(
    X,
    bandwidth="normal_reference",
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    n_response=0,
) -> float:
    """CV at the widths ``bandwidth`` (a rule or widths) of the rows of X (module
    docstring): statsmodels' ``KDEMultivariate.imse`` without weights, or with
    ``n_response`` > 0 (X holding y's columns first) ``KDEMultivariateConditional.imse``.
    The other arguments are :func:`nbattn.distribution.density.kernel_density`'s."""
    spec, (X,) = check_columns(
        {"X": X}, var_type=var_type, n_categories=n_categories, kernel=kernel
    )
    _check_rows(X.shape[0])
    _check_ls_kernel(spec.kernel)
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    widths = resolve_density_widths(spec, X, bandwidth, sample_weight)
    criterion = LeastSquaresCriterion(density_layout(spec, X, X, widths, sample_weight), n_response)
    theta = widths_to_theta(widths, spec.var_type, spec.n_categories)
    theta[~spec.continuous & (widths == 0.0)] = -math.inf  # l = 0 exactly, not sigmoid(-30)
    return criterion.imse(theta)
