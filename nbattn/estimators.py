"""scikit-learn estimators over the functional kernel-regression layer."""

from __future__ import annotations

from numbers import Real

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from . import regression
from ._validation import check_dtype
from .device import resolve_device

__all__ = ["NadarayaWatsonRegressor"]


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
    bandwidth : "scott", "silverman", float or array-like of shape (n_features,)
        Kernel widths h_d. Rule names are per feature (see
        :func:`nbattn.regression.bandwidth_rule`).
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
            StrOptions(set(regression.BANDWIDTH_RULES)),
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
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self._y_ndim = y.ndim
        y2 = y.reshape(len(y), -1)
        self.n_outputs_ = y2.shape[1]
        self.X_fit_ = X
        self.y_fit_ = y2
        self.bandwidth_ = regression.resolve_bandwidth(self.bandwidth, X)
        return self

    def _check_queries(self, X):
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64)

    def predict(self, X):
        """Attention-pooled targets for the rows of X."""
        X = self._check_queries(X)
        if self.kernel == "average":
            out = regression.average_pooling(X, self.y_fit_)
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
        return out[:, 0] if self._y_ndim == 1 else out

    def attention_weights(self, X):
        """Attention weights (n_queries, n_train): row i is how query i pools y_fit_."""
        X = self._check_queries(X)
        if self.kernel == "average":
            n = self.X_fit_.shape[0]
            return np.full((X.shape[0], n), 1.0 / n)
        return regression.gaussian_attention_weights(
            X, self.X_fit_, self.bandwidth_, dtype=check_dtype(self.dtype)
        )
