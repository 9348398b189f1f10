"""The conditional distribution of y given a mixed table X as scikit-learn estimators:
:class:`ConditionalKernelDensity` (statsmodels' ``KDEMultivariateConditional``, np's
``npcdens`` and ``npcdist``) and :class:`KernelQuantileRegressor` (np's ``npqreg``).

The computation is :mod:`nbattn.distribution.conditional` (the ratio of the joint and
marginal normalisers, the pooled integrated kernel, quantiles by a safeguarded root-finder)
and :mod:`nbattn.distribution.density_widths` (``"cv_ml"``) and
:mod:`nbattn.distribution.ls_widths` (``"cv_ls"``); this module reads the tables,
lays out the joint data (y's column first, then X's, statsmodels' order) and keeps the
fitted state.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils.validation import check_is_fitted

from ..distribution.conditional import (
    conditional_log_cdf,
    conditional_log_density,
    conditional_quantiles,
)
from ..distribution.density import density_layout, resolve_density_widths
from ..distribution.density_widths import cv_ml_widths
from ..distribution.ls_widths import cv_ls_widths
from ..local.problem import LocalSpec, check_widths
from .base import SpecEstimator, generator
from .density import density_spec

__all__ = ["ConditionalKernelDensity", "KernelQuantileRegressor"]


class _ConditionalModel(SpecEstimator):
    """The fit and the layout shared by the conditional estimators."""

    def _joint_spec(self, device=None) -> LocalSpec:
        y_counts = [0 if self.y_categories_ is None else len(self.y_categories_)]
        kinds = self.y_type_ + self._kinds()
        return density_spec(self, kinds, y_counts + self._n_categories(), device)

    def _fit_conditional(self, X, y, sample_weight):
        self._validate_params()
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None"
            )
        y_codes, y_type, y_categories = self._read_response(y)
        X, y_checked, sample_weight = self._validate_training_X(
            X, y_codes, sample_weight, y_numeric=True
        )
        self.y_type_ = y_type
        self.y_categories_ = y_categories
        joint = np.column_stack([y_checked, X])
        spec = self._joint_spec()
        y_width = self.y_bandwidth
        searches = {"cv_ml": cv_ml_widths, "cv_ls": cv_ls_widths}
        if isinstance(self.bandwidth, str) and self.bandwidth in searches:
            if y_width is not None:
                raise ValueError(
                    f"y_bandwidth must be None with bandwidth={self.bandwidth!r}: the criterion "
                    "chooses the widths of y and X together"
                )
            search = searches[self.bandwidth]
            widths = search(spec, joint, sample_weight, n_response=1, verbose=self.verbose)
        else:
            rule = self.bandwidth if isinstance(self.bandwidth, str) else "normal_reference"
            widths = resolve_density_widths(spec, joint, rule, sample_weight)
            if not isinstance(self.bandwidth, str):
                x_widths = np.asarray(self.bandwidth, dtype=np.float64).reshape(-1)
                if x_widths.size not in (1, X.shape[1]):
                    raise ValueError(
                        f"bandwidth has {x_widths.size} entries but X has {X.shape[1]} columns"
                    )
                widths[1:] = x_widths
            if y_width is not None:
                widths[0] = y_width
            widths = check_widths(widths, spec.var_type, spec.counts, "bandwidth")
        self.X_fit_ = X
        self.y_fit_ = y_checked
        self.sample_weight_ = sample_weight
        self.y_bandwidth_ = float(widths[0])
        self.bandwidth_ = widths[1:].copy()
        return self

    def _joint_problem(self, X, y=None, device=None):
        """The joint layout at the checked rows of X with y (codes for a categorical y;
        zeros where y is None)."""
        check_is_fitted(self)
        queries = self._check_queries(X)
        if y is None:
            y_codes = np.zeros(queries.shape[0])
        else:
            y_codes = self._read_response(y, self.y_type_, self.y_categories_)[0]
            if y_codes.shape[0] != queries.shape[0]:
                raise ValueError(f"X has {queries.shape[0]} rows but y has {y_codes.shape[0]}")
        spec = self._joint_spec(device)
        widths = check_widths(
            np.concatenate(([self.y_bandwidth_], self.bandwidth_)),
            spec.var_type,
            spec.counts,
            "bandwidth_",
        )
        keys = np.column_stack([self.y_fit_, self.X_fit_])
        return density_layout(
            spec, np.column_stack([y_codes, queries]), keys, widths, self.sample_weight_
        )

    def _quantiles(self, X, levels):
        check_is_fitted(self)
        if self.y_type_ != "c":
            raise ValueError("quantiles need a continuous y; this model's y is categorical")
        return conditional_quantiles(
            self._joint_problem(X, device=self._cpu_only("the conditional quantiles")), levels
        )


def _check_levels(q, name="q") -> tuple[np.ndarray, bool]:
    """Levels in (0, 1) as a 1-D array, and whether one number was given."""
    scalar = isinstance(q, numbers.Real) and not isinstance(q, (bool, np.bool_))
    arr = (
        np.asarray(q, dtype=np.float64).reshape(-1) if not isinstance(q, (bool, np.bool_)) else None
    )
    if arr is None or arr.size == 0 or not np.all((arr > 0.0) & (arr < 1.0)):
        raise ValueError(f"{name} must be a level or a list of levels in (0, 1); got {q!r}")
    return arr, scalar


class ConditionalKernelDensity(_ConditionalModel):
    """The conditional density and distribution of y given mixed X.

    .. math::

        \\hat f(y \\mid x) = \\frac{\\hat f(x, y)}{\\hat f(x)}
                          = \\sum_j p_j(x)\\, K_y(y, y_j),\\qquad
        \\hat F(y \\mid x) = \\sum_j p_j(x)\\, G\\Big(\\frac{y - y_j}{h_y}\\Big)

    with p_j(x) the pooling weights of X's product kernel (statsmodels'
    ``KDEMultivariateConditional``: the same widths give its pdf and cdf).

    Parameters
    ----------
    bandwidth : {"normal_reference", "silverman", "cv_ml", "cv_ls"}, float or array-like
        X's widths: a rule, ``"cv_ml"`` (the widths of X and y of greatest leave-one-out
        conditional likelihood, never worse than the rule's), ``"cv_ls"`` (of least
        least-squares cross-validation of the conditional density, never worse than the
        rule's; Gaussian and Epanechnikov kernels, O(n^3) per evaluation), or numbers in X's column
        order (h for continuous columns, l for categorical ones).
    y_bandwidth : float, optional
        y's width (its h, or its l when y is categorical); None: by the same rule or
        criterion as X's.
    kernel, rtol, var_type, device, verbose
        As :class:`nbattn.KernelDensity` (``var_type`` is X's; y's kind comes from its
        dtype: numbers are continuous, a pandas category unordered or ordered).

    Attributes
    ----------
    bandwidth_ : ndarray (n_features,)
        X's widths in column order.
    y_bandwidth_ : float
        y's width.
    y_type_ : str
        y's kind: 'c', 'u' or 'o'.
    y_categories_ : list or None
        y's categories (None for a continuous y).
    X_fit_, y_fit_, sample_weight_, var_type_, categories_
        The training data as read at fit (category codes in categorical columns).
    """

    def __init__(
        self,
        bandwidth="normal_reference",
        y_bandwidth=None,
        kernel="gaussian",
        rtol=0.0,
        var_type=None,
        device="cpu",
        verbose=0,
    ):
        self._set_params_from(locals())

    def fit(self, X, y, sample_weight=None):
        """Fit the conditional distribution of y given the rows of X."""
        return self._fit_conditional(X, y, sample_weight)

    def score_samples(self, X, y):
        """log f(y_i | x_i) per row (n,)."""
        return conditional_log_density(self._joint_problem(X, y))

    def pdf(self, X, y):
        """f(y_i | x_i) per row (n,)."""
        return np.exp(self.score_samples(X, y))

    def cdf(self, X, y):
        """F(y_i | x_i) per row (n,) (for a categorical y: the codes up to y_i's). Exact,
        on the CPU."""
        problem = self._joint_problem(X, y, self._cpu_only("the conditional CDF"))
        return np.exp(conditional_log_cdf(problem))

    def score(self, X, y):
        """The total conditional log-likelihood of the rows."""
        return float(np.sum(self.score_samples(X, y)))

    def predict_quantile(self, X, q):
        """The conditional quantiles of a continuous y: (n,) for one level, (n, len(q))
        for a list; each within 1e-10 y-widths of the root of F(q | x) = tau,
        non-decreasing in the level."""
        levels, scalar = _check_levels(q)
        out = self._quantiles(X, levels)
        return out[:, 0] if scalar else out

    def sample(self, X, random_state=None):
        """One draw of y per row of X (n,), from f(y | x_i): the quantile at a uniform
        level (continuous y; exact to the quantiles' tolerance), or the category whose
        cumulative probability first reaches it. The same ``random_state``, the same draws."""
        check_is_fitted(self)
        problem = self._joint_problem(X, device=self._cpu_only("sample"))
        u = generator(random_state).random(problem.q_cont.shape[0])
        if self.y_type_ == "c":
            return conditional_quantiles(problem, u[:, None])[:, 0]
        count = len(self.y_categories_)
        cumulative = np.empty((u.size, count))
        for code in range(count):
            problem.q_cat[:, 0] = code
            cumulative[:, code] = np.exp(conditional_log_cdf(problem))
        codes = np.minimum((cumulative < (u * cumulative[:, -1])[:, None]).sum(axis=1), count - 1)
        return np.asarray(self.y_categories_, dtype=object)[codes]


class KernelQuantileRegressor(RegressorMixin, _ConditionalModel):
    """The conditional quantile of y given mixed X as a regressor (Li and Racine's
    ``npqreg``): ``predict`` is q_quantile(x), the root of F(q | x) = quantile for
    the conditional CDF of :class:`ConditionalKernelDensity`.

    Parameters
    ----------
    quantile : float in (0, 1)
        The level ``predict`` returns (0.5: the conditional median).
    bandwidth, y_bandwidth, kernel, rtol, var_type, device, verbose
        As :class:`ConditionalKernelDensity` (``bandwidth`` defaults to ``"cv_ml"``).
    """

    def __init__(
        self,
        quantile=0.5,
        bandwidth="cv_ml",
        y_bandwidth=None,
        kernel="gaussian",
        rtol=0.0,
        var_type=None,
        device="cpu",
        verbose=0,
    ):
        self._set_params_from(locals())

    def fit(self, X, y, sample_weight=None):
        """Fit the conditional distribution of a continuous y given the rows of X."""
        return self._fit_conditional(X, y, sample_weight)

    def predict(self, X):
        """q_quantile(x) per row (n,)."""
        return self._quantiles(X, [self.quantile])[:, 0]

    def predict_quantile(self, X, q):
        """The conditional quantiles: (n,) for one level, (n, len(q)) for a list."""
        levels, scalar = _check_levels(q)
        out = self._quantiles(X, levels)
        return out[:, 0] if scalar else out

    def predict_interval(self, X, alpha=0.1):
        """(lower, upper), each (n,): the conditional quantiles at alpha/2 and 1 - alpha/2."""
        if (
            isinstance(alpha, (bool, np.bool_))
            or not isinstance(alpha, numbers.Real)
            or not 0.0 < alpha < 1.0
        ):
            raise ValueError(f"alpha must be a float in (0, 1); got {alpha!r}")
        out = self._quantiles(X, [alpha / 2.0, 1.0 - alpha / 2.0])
        return out[:, 0], out[:, 1]
