"""KernelDensity: the kernel density of a table with continuous, unordered and ordered
columns (statsmodels' ``KDEMultivariate``, R np's ``npudens``), as a scikit-learn estimator.

The computation is :mod:`nbattn.distribution.density` (the density as the normaliser of
the pooling, on the mixed-type engine) and :mod:`nbattn.distribution.density_widths`
(``bandwidth="cv_ml"``) and :mod:`nbattn.distribution.ls_widths` (``"cv_ls"``); this module
reads the table and keeps the fitted state.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ..distribution.density import resolve_density_widths, sample_rows
from ..distribution.density_widths import cv_ml_widths, neighbour_cv_ml_widths
from ..distribution.ls_widths import cv_ls_widths
from ..local.problem import LocalSpec
from .base import SpecEstimator, decoded_rows, generator
from .prediction import DensityPrediction
from .widths import fit_neighbour_counts

__all__ = ["KernelDensity"]


class KernelDensity(DensityPrediction, SpecEstimator):
    """Kernel density of mixed data: continuous, unordered and ordered categorical columns.

    .. math::

        \\hat f(x) = \\frac{1}{W} \\sum_j w_j \\prod_c \\frac{1}{\\kappa h_c}
        K\\Big(\\frac{x_c - x_{jc}}{h_c}\\Big) \\prod_k L_k(x_k, x_{jk})

    with the Aitchison-Aitken kernel for unordered columns and the Wang-van Ryzin kernel
    for ordered ones (statsmodels' ``KDEMultivariate``: the same widths give its density),
    computed as the normaliser of attention pooling in log space. The Wang-van Ryzin
    kernel, (1 - l) on a match and (1 - l) l^|x - y| / 2 elsewhere, sums to 1 over all
    integers but not over a column's c codes (it loses its tails past the first and last
    category: at l = 0.4 over three codes a key at an end keeps 0.768 of its mass, one in
    the middle 0.84), so with an ordered
    column the density sums to less than 1 over the categories and ``cdf`` at the last
    category is below 1, as in statsmodels and R's np at the same l.

    Parameters
    ----------
    bandwidth : {"normal_reference", "silverman", "cv_ml", "cv_ls"}, float or array-like
        A rule (statsmodels' normal reference 1.06 sigma n^(-1/(4+d)) for continuous columns,
        a share of the range for categorical ones), ``"cv_ml"`` (the widths of greatest
        leave-one-out likelihood, never worse than the rule's), ``"cv_ls"`` (the widths of
        least integrated squared error by least-squares cross-validation, never worse than
        the rule's; Gaussian and Epanechnikov kernels), one number for every column
        or an array in column order (h for continuous columns, l in [0, (c-1)/c] for
        unordered and [0, 1) for ordered ones).
    bandwidth_type : {"fixed", "generalized_nn", "adaptive_nn"}
        R np's ``bwtype``. With a nearest-neighbour type ``bandwidth`` is ``"cv_ml"`` (the
        counts of greatest leave-one-out likelihood), one integer k for every continuous
        column, or an array (k per continuous column, l per categorical one): at a query x
        a continuous column's width is the distance from x to its k-th nearest training
        value (generalised), or each training row carries the distance to its k-th nearest
        other value and weighs K((x - x_i) / h_i) / h_i (adaptive)
        (:mod:`nbattn.local.neighbours`). Exact (``rtol`` 0), CPU and GPU; ``pdf`` and
        ``score_samples`` only (not ``cdf`` nor ``sample``). The generalised estimate is
        Loftsgaarden and Quesenberry's "balloon" estimator: its width grows with the
        distance to the data, so its tails fall as ``1 / abs(x)`` and it does not integrate to 1
        (Terrell and Scott 1992, "Variable kernel density estimation"); the adaptive one
        is a mixture of kernels and does.
    kernel : {"gaussian", "epanechnikov", "tricube"}
        The continuous kernel (compact ones with h the half-width of the support).
    rtol : float in [0, 1)
        The relative error allowed on every kernel sum (0: exact): each density within
        ``rtol`` relative (CPU; ``cdf`` is always exact).
    var_type : str, optional
        One letter per column: 'c' continuous, 'u' unordered, 'o' ordered. By default from
        a DataFrame's dtypes (category, bool, text: 'u'; ordered category: 'o'), else 'c'.
    missing : {"error", "marginalize"}
        A missing value (NaN, None, pandas.NA) in a query row: an error naming the row
        and column, or ``"marginalize"``: the row's density and CDF are those of its
        observed columns, the others integrated out (exact: the product kernel integrates
        to 1 over each column left out). The training rows must be complete either way
        (a density has no kernel for an unknown value): drop incomplete rows first.
    device : {"cpu", "cuda", "auto"}
        Where the densities, CDFs and quantiles run ("auto": the GPU when there is one);
        ``sample``'s draws and the ``"cv_ml"`` search's gradient run on the CPU.
    verbose : int or bool
        A line per evaluation of the ``"cv_ml"`` or ``"cv_ls"`` search.

    Attributes
    ----------
    bandwidth_ : ndarray (n_features,)
        The widths in column order.
    X_fit_ : ndarray (n_samples, n_features)
        The training rows (category codes for categorical columns).
    sample_weight_ : ndarray or None
    var_type_, categories_, n_features_in_, feature_names_in_
        The columns as read at fit.
    """

    def __init__(
        self,
        bandwidth="normal_reference",
        bandwidth_type="fixed",
        kernel="gaussian",
        rtol=0.0,
        var_type=None,
        missing="error",
        device="cpu",
        verbose=0,
    ):
        self._set_params_from(locals())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "density_estimator"
        tags.target_tags.required = False
        return tags

    def fit(self, X, y=None, sample_weight=None):
        """Fit the density of the rows of X (y is ignored); rows of weight 0 are dropped."""
        self._validate_params()
        X, _, sample_weight = self._validate_training_X(X, None, sample_weight, unsupervised=True)
        self._refuse_incomplete_rows(X)
        spec = self._local_spec()
        if spec.nearest_neighbour:
            search = lambda: neighbour_cv_ml_widths(spec, X, sample_weight)  # noqa: E731
            widths = fit_neighbour_counts(self, spec, X, self.bandwidth, "cv_ml", search)
        elif isinstance(self.bandwidth, str) and self.bandwidth == "cv_ml":
            widths = cv_ml_widths(spec, X, sample_weight, verbose=self.verbose)
        elif isinstance(self.bandwidth, str) and self.bandwidth == "cv_ls":
            widths = cv_ls_widths(spec, X, sample_weight, verbose=self.verbose)
        else:
            widths = resolve_density_widths(spec, X, self.bandwidth, sample_weight)
        self.X_fit_ = X
        self.sample_weight_ = sample_weight
        self.bandwidth_ = widths
        return self

    def _local_spec(self, device=None) -> LocalSpec:
        return self._density_spec(self._kinds(), self._n_categories(), device)

    def score_samples(self, X):
        """log f(x) per row of X (n,): exact where f underflows (scikit-learn's name)."""
        return self._log_density(self._check_queries(X))

    def pdf(self, X):
        """f(x) per row of X (n,) (statsmodels' name)."""
        return np.exp(self.score_samples(X))

    def cdf(self, X):
        """The joint distribution function F(x) per row of X (n,): each continuous kernel
        integrated, each categorical one summed over the codes up to x's (statsmodels'
        convention, unordered columns included). Exact, on ``device``."""
        return np.exp(self._log_cdf(self._check_queries(X)))

    def score(self, X, y=None):
        """The total log-likelihood of the rows of X (scikit-learn's convention)."""
        return float(np.sum(self.score_samples(X)))

    def sample(self, n_samples=1, random_state=None):
        """``n_samples`` rows drawn from the density (n_samples, n_features): a DataFrame
        with the fitted columns and categories when the model was fitted on one, else an
        array holding the fitted categories' values (float64 when they are all numbers),
        so that ``score_samples`` reads the draws back. ``random_state``: None, a seed, a
        RandomState or a Generator; the same seed gives the same rows."""
        check_is_fitted(self)
        if isinstance(n_samples, (bool, np.bool_)) or not isinstance(n_samples, (int, np.integer)):
            raise ValueError(f"n_samples must be an int >= 1, got {n_samples!r}")
        if n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1, got {n_samples!r}")
        spec = self._local_spec("cpu")
        if spec.nearest_neighbour:
            raise NotImplementedError(
                "sample() draws from fixed widths; this density has nearest-neighbour "
                f"widths (bandwidth_type={spec.bandwidth_type!r})"
            )
        rows = sample_rows(
            spec,
            self.X_fit_,
            self.bandwidth_,
            self.sample_weight_,
            int(n_samples),
            generator(random_state),
        )
        return decoded_rows(self, rows)
