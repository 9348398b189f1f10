"""scikit-learn estimators over the functional kernel-regression layer."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import learning, regression
from ._validation import check_dtype
from .device import resolve_device

__all__ = ["LearnedKernelRegressor", "NadarayaWatsonClassifier", "NadarayaWatsonRegressor"]


def _validate_regression_data(estimator, X, y):
    """validate_data for a regressor: float64 X and y as 2-D (n, n_outputs); remembers y's ndim."""
    X, y = validate_data(estimator, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    estimator._y_ndim = y.ndim
    return X, y.reshape(len(y), -1)


def _fit_bandwidth(bandwidth, X, Y, dtype, device="cpu"):
    """Per-feature widths: the LOO-optimal scale of Scott's for "loo", else the rule or value."""
    if isinstance(bandwidth, str) and bandwidth == "loo":
        return learning.loo_bandwidth(X, Y, dtype=check_dtype(dtype), device=device)
    return regression.resolve_bandwidth(bandwidth, X)


class NadarayaWatsonRegressor(RegressorMixin, BaseEstimator):
    """Nadaraya-Watson kernel regression: attention pooling over the training set.

    .. math::

        \\hat y(x) = \\sum_j \\operatorname{softmax}_j\\Big(-\\tfrac12 \\sum_d
                     \\big(\\tfrac{x_d - x_{jd}}{h_d}\\big)^2\\Big)\\, y_j

    The queries are the rows to predict, the keys and values the training
    rows and targets (seed 002, section 1.3.2). Computed by a streaming
    online-softmax kernel: exact, stable for queries far from the data, and
    in memory linear in the number of rows.

    Parameters
    ----------
    bandwidth : "scott", "silverman", "loo", float or array-like of shape (n_features,)
        Kernel widths h_d. Rule names are per feature (see
        :func:`nbattn.regression.bandwidth_rule`). "loo" scales Scott's widths
        by the one factor that minimises the leave-one-out MSE (a coarse grid
        then bounded Brent on the log scale, :func:`nbattn.learning.loo_bandwidth`).
    kernel : "gaussian" or "average"
        "average" is average pooling (seed section 1.3.1): every training
        target gets the same weight, whatever the query.
    device : "cpu", "cuda" or "auto"
        Where predictions run; "auto" picks a CUDA GPU when numba sees one.
        ``device_`` holds the device chosen at fit.
    dtype : "float64" or "float32"
        Precision of the computation (running sums are float64 always);
        predictions are returned as float64 either way.

    Attributes
    ----------
    bandwidth_ : ndarray of shape (n_features,)
        The per-feature widths used.
    n_features_in_ : int
    feature_names_in_ : ndarray of str, only when fitted on a DataFrame
    n_outputs_ : int
    X_fit_, y_fit_ : training data (the keys and values)
    """

    _parameter_constraints = {
        "bandwidth": [
            StrOptions(set(regression.BANDWIDTH_RULES) | {"loo"}),
            Interval(Real, 0, None, closed="neither"),
            "array-like",
        ],
        "kernel": [StrOptions({"gaussian", "average"})],
        "device": [StrOptions({"cpu", "cuda", "auto"})],
        "dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(self, bandwidth="scott", kernel="gaussian", device="cpu", dtype="float64"):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.device = device
        self.dtype = dtype

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        # average pooling ignores X by design (the seed's baseline)
        tags.regressor_tags.poor_score = self.kernel == "average"
        return tags

    def fit(self, X, y):
        """Store the training rows as keys and values and resolve the bandwidth."""
        self._validate_params()
        self.device_ = resolve_device(self.device)
        X, y2 = _validate_regression_data(self, X, y)
        self.n_outputs_ = y2.shape[1]
        self.X_fit_ = X
        self.y_fit_ = y2
        self.bandwidth_ = _fit_bandwidth(self.bandwidth, X, y2, self.dtype, self.device_)
        return self

    def _check_queries(self, X):
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64)

    def predict(self, X, return_std=False):
        """Attention-pooled targets for the rows of X.

        With ``return_std=True`` also the attention-weighted standard deviation
        of the training targets about the prediction,
        ``std_i = sqrt(sum_j w_ij (y_j - f_i)^2)`` (computed in a second pass
        about f_i, not as E[y^2] - E[y]^2, which cancels), shaped like the
        prediction. It is the spread of the targets the query pools, not a
        confidence interval of f.
        """
        X = self._check_queries(X)
        if self.kernel == "average":
            out = regression.average_pooling(X, self.y_fit_)
            std = np.broadcast_to(self.y_fit_.std(axis=0), out.shape).copy()
        elif return_std:
            out, std, _ = learning.nadaraya_watson_spread(
                X, self.X_fit_, self.y_fit_, self.bandwidth_, dtype=check_dtype(self.dtype)
            )
        else:
            out = regression.nadaraya_watson(
                X,
                self.X_fit_,
                self.y_fit_,
                self.bandwidth_,
                dtype=check_dtype(self.dtype),
                device=self.device_,
            )
        out = np.asarray(out, dtype=np.float64)  # float64 like every scikit-learn regressor
        std = np.asarray(std, dtype=np.float64) if return_std else None
        if self._y_ndim == 1:
            out = out[:, 0]
            std = std[:, 0] if return_std else None
        return (out, std) if return_std else out

    def effective_n_neighbors(self, X):
        """Effective number of training rows each query pools: ``1 / sum_j w_ij^2``.

        1 when one training row holds all the weight, n_train for uniform
        weights (average pooling). A diagnostic of the width: small values mean
        a wiggly, high-variance fit.
        """
        X = self._check_queries(X)
        if self.kernel == "average":
            return np.full(X.shape[0], float(self.X_fit_.shape[0]))
        _, _, n_eff = learning.nadaraya_watson_spread(
            X, self.X_fit_, self.y_fit_, self.bandwidth_, dtype=check_dtype(self.dtype)
        )
        return n_eff

    def attention_weights(self, X):
        """Attention weights (n_queries, n_train): row i is how query i pools y_fit_."""
        X = self._check_queries(X)
        if self.kernel == "average":
            n = self.X_fit_.shape[0]
            return np.full((X.shape[0], n), 1.0 / n)
        return regression.gaussian_attention_weights(
            X, self.X_fit_, self.bandwidth_, dtype=check_dtype(self.dtype)
        )


class LearnedKernelRegressor(RegressorMixin, BaseEstimator):
    """Nadaraya-Watson regression whose kernel metric is learned from the data.

    Seed 002, section 1.3.3: the width is a parameter, fitted by minimising the
    leave-one-out mean squared error

    .. math::

        L = \\frac{1}{n p} \\sum_i \\| f_{-i}(x_i) - y_i \\|^2, \\qquad
        f_{-i}(x_i) = \\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij})\\, y_j

    with scipy's L-BFGS-B on the exact gradient, streamed in O(n d) memory
    (:func:`nbattn.learning.fit_learned_kernel`). Prediction is attention
    pooling with the learned score.

    Parameters
    ----------
    metric : "scalar", "diagonal" or "full"
        * "scalar": ``s = -1/2 sum_d ((x_d - x'_d) / (c h_d))^2`` with h Scott's
          widths and one factor c learned (the seed's single w = 1/(c h) in 1-D);
        * "diagonal": one width h_d per feature, learned on the log scale; the
          width of an irrelevant feature grows (up to 1e4 x Scott), switching it off;
        * "full": ``s = -1/2 ||L (x - x')||^2`` with L (n_components, d) learned:
          metric learning for kernel regression (MLKR).
    n_components : int or None
        Rows of L for metric="full" (default: n_features). Ignored otherwise.
    init : "scott" or "random" (full only)
        Starting point: Scott's widths (full: ``L = diag(1/h_scott)``, or the
        leading principal directions when n_components < n_features).
    max_iter : int
        L-BFGS-B iterations; stopping at it raises a ``ConvergenceWarning``.
    tol : float
        L-BFGS-B tolerance on the loss divided by the variance of y.
    random_state : int, Generator or None, for init="random".
    device : "cpu", "cuda" or "auto"
    dtype : "float64" or "float32"

    Attributes
    ----------
    bandwidth_ : ndarray (n_features,), metrics "scalar" and "diagonal"
    components_ : ndarray (n_components, n_features), metric "full"
    loss_ : float, the final LOO MSE
    loss_curve_ : ndarray, LOO MSE at the start and after each iteration
    n_iter_ : int
    n_features_in_, n_outputs_, X_fit_, y_fit_

    Notes
    -----
    A constant feature has zero differences, so its width (or L's column)
    gets zero gradient and keeps its initial value: it adds nothing to any
    score. Widths are measured in the feature's units; features are
    standardised internally for the optimisation.
    """

    _parameter_constraints = {
        "metric": [StrOptions({"scalar", "diagonal", "full"})],
        "n_components": [Interval(Integral, 1, None, closed="left"), None],
        "init": [StrOptions({"scott", "random"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "random_state": ["random_state"],
        "device": [StrOptions({"cpu", "cuda", "auto"})],
        "dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(
        self,
        metric="diagonal",
        n_components=None,
        init="scott",
        max_iter=200,
        tol=1e-6,
        random_state=None,
        device="cpu",
        dtype="float64",
    ):
        self.metric = metric
        self.n_components = n_components
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.device = device
        self.dtype = dtype

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X, y):
        """Learn the metric by minimising the leave-one-out MSE (L-BFGS-B)."""
        self._validate_params()
        self.device_ = resolve_device(self.device)
        X, y2 = _validate_regression_data(self, X, y)
        if X.shape[0] < 2:
            raise ValueError(
                "LearnedKernelRegressor needs at least 2 samples (leave-one-out), "
                f"got n_samples={X.shape[0]}"
            )
        if self.metric == "full" and self.n_components is not None:
            if self.n_components > X.shape[1]:
                raise ValueError(
                    f"n_components={self.n_components} exceeds n_features={X.shape[1]}"
                )
        if self.init == "random" and self.metric != "full":
            raise ValueError("init='random' is only for metric='full'")
        random_state = self.random_state
        if isinstance(random_state, np.random.RandomState):
            random_state = random_state.randint(2**31 - 1)
        result = learning.fit_learned_kernel(
            X,
            y2,
            metric=self.metric,
            n_components=self.n_components,
            init=self.init,
            max_iter=self.max_iter,
            tol=self.tol,
            random_state=random_state,
            dtype=check_dtype(self.dtype),
            device=self.device_,
        )
        self.n_outputs_ = y2.shape[1]
        self.X_fit_ = X
        self.y_fit_ = y2
        if self.metric == "full":
            self.components_ = result["components"]
        else:
            self.bandwidth_ = result["bandwidth"]
        self.loss_ = result["loss"]
        self.loss_curve_ = result["loss_curve"]
        self.n_iter_ = result["n_iter"]
        return self

    def _pool_args(self, X):
        """(queries, keys, bandwidth) in the learned score's coordinates."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        if self.metric == "full":
            L = self.components_
            return X @ L.T, self.X_fit_ @ L.T, 1.0
        return X, self.X_fit_, self.bandwidth_

    def predict(self, X, return_std=False):
        """Attention-pooled targets; with ``return_std`` also their weighted spread.

        See :meth:`NadarayaWatsonRegressor.predict`.
        """
        q, k, h = self._pool_args(X)
        dtype = check_dtype(self.dtype)
        if return_std:
            out, std, _ = learning.nadaraya_watson_spread(q, k, self.y_fit_, h, dtype=dtype)
        else:
            out = regression.nadaraya_watson(q, k, self.y_fit_, h, dtype=dtype, device=self.device_)
        if self._y_ndim == 1:
            out = out[:, 0]
            std = std[:, 0] if return_std else None
        return (out, std) if return_std else out

    def attention_weights(self, X):
        """Attention weights (n_queries, n_train) of the learned score."""
        q, k, h = self._pool_args(X)
        return regression.gaussian_attention_weights(q, k, h, dtype=check_dtype(self.dtype))

    def effective_n_neighbors(self, X):
        """``1 / sum_j w_ij^2`` per query; see the regressor's ``effective_n_neighbors``."""
        q, k, h = self._pool_args(X)
        return learning.nadaraya_watson_spread(q, k, self.y_fit_, h, dtype=check_dtype(self.dtype))[
            2
        ]


class NadarayaWatsonClassifier(ClassifierMixin, BaseEstimator):
    """Nadaraya-Watson classification: attention pooling over one-hot labels.

    .. math::

        P(y = c \\mid x) = \\sum_j \\operatorname{softmax}_j\\Big(-\\tfrac12 \\sum_d
                          \\big(\\tfrac{x_d - x_{jd}}{h_d}\\big)^2\\Big)\\,
                          [y_j = c]

    The probabilities are the attention-weighted class frequencies around x;
    they are non-negative and sum to 1 by construction.

    Parameters
    ----------
    bandwidth : "scott", "silverman", "loo", float or array-like (n_features,)
        "loo" scales Scott's widths by the factor minimising the leave-one-out
        **Brier score**, ``1/(n K) sum_i sum_c (P_{-i}(c | x_i) - [y_i = c])^2``
        (the LOO MSE of the one-hot regression, same search as the regressor).
        The Brier score rather than the log-loss: it is a proper scoring rule
        that stays finite when a left-out point's class gets probability 0
        (which happens as soon as its nearest neighbours all disagree and the
        width is small), so the search never meets an infinite plateau, and it
        runs on the same exact LOO kernel as the regressor.
    device : "cpu", "cuda" or "auto"
    dtype : "float64" or "float32"

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
    bandwidth_ : ndarray (n_features,)
    n_features_in_, X_fit_, Y_fit_ (one-hot training labels)
    """

    _parameter_constraints = {
        "bandwidth": [
            StrOptions(set(regression.BANDWIDTH_RULES) | {"loo"}),
            Interval(Real, 0, None, closed="neither"),
            "array-like",
        ],
        "device": [StrOptions({"cpu", "cuda", "auto"})],
        "dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(self, bandwidth="scott", device="cpu", dtype="float64"):
        self.bandwidth = bandwidth
        self.device = device
        self.dtype = dtype

    def fit(self, X, y):
        """Store the training rows and one-hot labels; resolve the bandwidth."""
        self._validate_params()
        self.device_ = resolve_device(self.device)
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(
                "NadarayaWatsonClassifier needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {self.classes_[0]!r}"
            )
        Y = np.zeros((X.shape[0], self.classes_.size))
        Y[np.arange(X.shape[0]), codes] = 1.0
        self.X_fit_ = X
        self.Y_fit_ = Y
        self.bandwidth_ = _fit_bandwidth(self.bandwidth, X, Y, self.dtype, self.device_)
        return self

    def _check_queries(self, X):
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64)

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes), columns in the order of ``classes_``."""
        X = self._check_queries(X)
        proba = regression.nadaraya_watson(
            X, self.X_fit_, self.Y_fit_, self.bandwidth_, dtype=check_dtype(self.dtype)
        ).astype(np.float64)
        proba = np.clip(proba, 0.0, None)
        return proba / proba.sum(axis=1, keepdims=True)

    def predict(self, X):
        """The most probable class of each row (ties go to the first in ``classes_``)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def attention_weights(self, X):
        """Attention weights (n_queries, n_train)."""
        X = self._check_queries(X)
        return regression.gaussian_attention_weights(
            X, self.X_fit_, self.bandwidth_, dtype=check_dtype(self.dtype)
        )
