"""scikit-learn estimators over the functional kernel-regression layer.

Every estimator here is attention pooling over its training set,

.. math::

    \\hat y(x) = \\sum_j \\operatorname{softmax}_j\\big(s(x, x_j)\\big)\\, y_j ,

with the queries the rows to predict, the keys the training rows ``X_fit_``
and the values ``y_fit_`` (targets, or one-hot labels for the classifier).
They share one base, :class:`_PoolingEstimator`, which does the things that
must not differ between them:

* input checks: training data through scikit-learn's ``validate_data`` (and
  copied: a fitted model never shares memory with the caller's arrays), plus
  errors that name a DataFrame's date or complex columns and a target's
  missing values;
* the device: ``device`` is resolved when a method runs, never stored at
  fit, so a model fitted with ``device="auto"`` on a GPU machine predicts on
  a CPU-only one after ``nbattn.save`` / ``nbattn.load``;
* the computation: every method goes through the functional layer
  (:func:`nbattn.regression.nadaraya_watson` and friends) with the model's
  ``dtype`` and ``device``; results are float64 whatever ``dtype`` is;
* output shaping: 1-D targets give 1-D predictions.

:func:`check_fitted_state` validates a model rebuilt from a file: its
parameters, its fitted attributes' presence, shapes, dtypes and agreement,
and that it holds nothing else.
"""

from __future__ import annotations

import numbers
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import learning, regression
from ._validation import as_float_array, check_bandwidth, resolve_dtype
from .device import resolve_device

__all__ = [
    "LearnedKernelRegressor",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "check_fitted_state",
]

_BANDWIDTH_CONSTRAINT = [
    StrOptions(set(regression.BANDWIDTH_RULES) | {"loo"}),
    Interval(Real, 0, None, closed="neither"),
    "array-like",
]


# ----------------------------------------------------------------------------- input checks


def _refuse_dates_and_complex(X) -> None:
    """Name the DataFrame column (or say X) that holds dates, durations or complex numbers.

    scikit-learn's float conversion of such data fails with a NumPy dtype
    promotion error that names neither the column nor what to do.
    """
    dtypes = getattr(X, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "items"):  # a pandas DataFrame
        columns = [(f"X column {name!r}", dtype) for name, dtype in dtypes.items()]
    elif isinstance(X, np.ndarray):
        columns = [("X", X.dtype)]
    else:
        return
    for what, dtype in columns:
        kind = getattr(dtype, "kind", "O")
        if kind in "mM":
            held, hint = ("dates", "seconds since a reference time")
            if kind == "m":
                held, hint = ("durations", "their length in seconds")
            raise ValueError(
                f"{what} holds {held} (dtype {dtype}); convert it to numbers first, "
                f"for instance {hint}"
            )
        if kind == "c":
            raise ValueError(
                f"{what} holds complex numbers (dtype {dtype}): Complex data not supported; "
                "pass the real and imaginary parts as two columns"
            )


def _refuse_missing_targets(y) -> None:
    """Refuse ``y`` holding None, pandas.NA or NaN in an object array, naming the row.

    scikit-learn converts such an array to float only after its finiteness
    check, so None would become a NaN training target (every prediction that
    pools it NaN), or an error about label types for a classifier.
    """
    if y is None:  # scikit-learn's own message: "requires y to be passed"
        return
    arr = np.asarray(y) if not hasattr(y, "to_numpy") else y.to_numpy()
    if arr.dtype.kind != "O" or arr.ndim == 0:
        return
    missing = np.frompyfunc(_is_missing, 1, 1)(arr.reshape(-1)).astype(bool)
    if missing.any():
        index = int(np.argmax(missing))
        row = np.unravel_index(index, arr.shape)[0]
        raise ValueError(
            f"y holds a missing value ({arr.reshape(-1)[index]!r}) at row {int(row)}; "
            "drop or fill the rows without a target before fitting"
        )


def _is_missing(value) -> bool:
    """None, pandas.NA (without importing pandas) or a float NaN."""
    return (
        value is None
        or type(value).__name__ == "NAType"
        or (isinstance(value, numbers.Real) and value != value)
    )


# ----------------------------------------------------------------------------- the base


class _PoolingEstimator(BaseEstimator):
    """What every nbattn estimator shares: checks, device, dtype, the pooling calls.

    A subclass fits ``X_fit_`` (n, d) and ``y_fit_`` (n, m) (float64 copies)
    and describes its score through :meth:`_score_coordinates`: the queries,
    keys and per-feature widths under which the score is the Gaussian
    ``-1/2 sum_d ((q_d - k_d) / h_d)^2``.
    """

    _common_constraints = {
        "device": [StrOptions({"cpu", "cuda", "auto"})],
        "dtype": [StrOptions({"float64", "float32"})],
        "verbose": ["verbose"],
    }

    # ---- fit-time helpers

    def _validate_training_X(self, X, y, **kwargs):
        """validate_data on the training data, X copied; errors name columns and y's rows."""
        _refuse_dates_and_complex(X)
        _refuse_missing_targets(y)
        return validate_data(self, X, y, dtype=np.float64, copy=True, **kwargs)

    def _fit_bandwidth(self, bandwidth, X, Y):
        """Per-feature widths: the LOO-optimal scale of Scott's for "loo", else rule or value."""
        if isinstance(bandwidth, str) and bandwidth == "loo":
            return learning.loo_bandwidth(
                X,
                Y,
                dtype=self._dtype(),
                device=self._device(),
                verbose=self.verbose,
            )
        return regression.resolve_bandwidth(bandwidth, X)

    # ---- resolved at every call

    def _device(self) -> str:
        """The device that runs this call ("auto" resolved here, not at fit)."""
        return resolve_device(self.device)

    def _dtype(self):
        return resolve_dtype(self.dtype)

    # ---- query-time helpers

    def _check_queries(self, X):
        check_is_fitted(self)
        _refuse_dates_and_complex(X)
        return validate_data(self, X, reset=False, dtype=np.float64)

    def _score_coordinates(self, X):
        """(queries, keys, widths) of the Gaussian score for the checked queries X."""
        return X, self.X_fit_, self.bandwidth_

    def _pooled(self, X):
        """Pooled values ``sum_j w_ij y_fit_j`` (n_queries, m) as float64, on ``device``."""
        q, k, h = self._score_coordinates(X)
        out = regression.nadaraya_watson(
            q, k, self.y_fit_, h, dtype=self._dtype(), device=self._device()
        )
        return np.asarray(out, dtype=np.float64)

    def _pooled_spread(self, X):
        """(pooled values, weighted std about them, effective n) for the checked queries X,
        on ``device`` (:func:`nbattn.learning.nadaraya_watson_spread`)."""
        q, k, h = self._score_coordinates(X)
        mean, std, n_eff = learning.nadaraya_watson_spread(
            q, k, self.y_fit_, h, dtype=self._dtype(), device=self._device()
        )
        return (
            np.asarray(mean, dtype=np.float64),
            np.asarray(std, dtype=np.float64),
            np.asarray(n_eff, dtype=np.float64),
        )

    # ---- public diagnostics, the same for every estimator

    def attention_weights(self, X):
        """Attention weights ``W[i, j] = softmax_j(s(x_i, x_j))`` (n_queries, n_train).

        Row i is how query i pools ``y_fit_``: ``W @ y_fit_`` is the pooled
        prediction. Memory is n_queries x n_train: meant for plots and
        diagnostics. Computed by :func:`nbattn.regression.gaussian_attention_weights`
        on ``device``.
        """
        X = self._check_queries(X)
        q, k, h = self._score_coordinates(X)
        w = regression.gaussian_attention_weights(
            q, k, h, dtype=self._dtype(), device=self._device()
        )
        return np.asarray(w, dtype=np.float64)

    def effective_n_neighbors(self, X):
        """Effective number of training rows each query pools: ``1 / sum_j w_ij^2``.

        1 when one training row holds all the weight, n_train for uniform
        weights (average pooling). A diagnostic of the width: small values
        mean a wiggly, high-variance fit.
        """
        X = self._check_queries(X)
        return self._pooled_spread(X)[2]

    # ---- fitted-state description (for check_fitted_state)

    def _check_fitted_attributes(self):
        """Check the fitted attributes shared by every estimator; return the allowed names."""
        d = _require_int(self, "n_features_in_", minimum=1)
        X = _require_array(self, "X_fit_", "f", (None, d))
        n = X.shape[0]
        y = _require_array(self, "y_fit_", "f", (n, None))
        if n < 1 or y.shape[1] < 1:
            raise ValueError(
                f"X_fit_ and y_fit_ must be non-empty, got shapes {X.shape}, {y.shape}"
            )
        allowed = {"n_features_in_", "X_fit_", "y_fit_"}
        if "feature_names_in_" in vars(self):
            names = _require_array(self, "feature_names_in_", "OU", (d,))
            if not all(isinstance(v, str) for v in names):
                raise ValueError("feature_names_in_ must hold strings")
            allowed.add("feature_names_in_")
        return allowed


# ----------------------------------------------------------------------------- regressors


class _PoolingRegressor(RegressorMixin, _PoolingEstimator):
    """The regressors' share: targets as float64 columns, 1-D or 2-D output, ``return_std``."""

    def _validate_regression_data(self, X, y):
        """(X, y as float64 (n, n_outputs), whether y is 2-D); X and y are copies."""
        X, y = self._validate_training_X(X, y, multi_output=True, y_numeric=True)
        # a float64 copy, finite: scikit-learn checks object arrays before converting them
        y = as_float_array(y, "y", ndim=(1, 2), dtype="float64")
        return X, y.reshape(len(y), -1), y.ndim == 2

    def _store_training_data(self, X, y2, outputs_2d):
        self.X_fit_ = X
        self.y_fit_ = y2
        self.n_outputs_ = y2.shape[1]
        self.outputs_2d_ = outputs_2d

    def _shape_output(self, out):
        """Columns of (n_queries, n_outputs) → 1-D when the model was fitted on a 1-D y."""
        return out if self.outputs_2d_ else out[:, 0]

    def predict(self, X, return_std=False):
        """Attention-pooled targets for the rows of X (float64).

        With ``return_std=True`` also the attention-weighted standard deviation
        of the training targets about the prediction,
        ``std_i = sqrt(sum_j w_ij (y_j - f_i)^2)`` (computed in a second pass
        about f_i, not as E[y^2] - E[y]^2, which cancels), shaped like the
        prediction. It is the spread of the targets the query pools, not a
        confidence interval of f. Both run on ``device``
        (:func:`nbattn.learning.nadaraya_watson_spread` for the spread).
        """
        X = self._check_queries(X)
        if return_std:
            out, std, _ = self._pooled_spread(X)
            return self._shape_output(out), self._shape_output(std)
        return self._shape_output(self._pooled(X))

    def _check_fitted_attributes(self):
        allowed = super()._check_fitted_attributes()
        m = _require_int(self, "n_outputs_", minimum=1)
        if self.y_fit_.shape[1] != m:
            raise ValueError(f"y_fit_ has {self.y_fit_.shape[1]} columns but n_outputs_ is {m}")
        two_d = _require_bool(self, "outputs_2d_")
        if not two_d and m != 1:
            raise ValueError(f"outputs_2d_ is False but n_outputs_ is {m}")
        return allowed | {"n_outputs_", "outputs_2d_"}


class NadarayaWatsonRegressor(_PoolingRegressor):
    """Nadaraya-Watson kernel regression: attention pooling over the training set.

    .. math::

        \\hat y(x) = \\sum_j \\operatorname{softmax}_j\\Big(-\\tfrac12 \\sum_d
                     \\big(\\tfrac{x_d - x_{jd}}{h_d}\\big)^2\\Big)\\, y_j

    The queries are the rows to predict, the keys and values the training
    rows and targets (the attention-pooling walk-through, section 1.3.2).
    Computed by a streaming online-softmax kernel: exact, stable for queries
    far from the data, and in memory linear in the number of rows.

    Parameters
    ----------
    bandwidth : "scott", "silverman", "loo", float or array-like of shape (n_features,)
        Kernel widths h_d. Rule names are per feature (see
        :func:`nbattn.regression.bandwidth_rule`). "loo" scales Scott's widths
        by the one factor that minimises the leave-one-out MSE
        (:func:`nbattn.learning.loo_bandwidth`).
    kernel : "gaussian" or "average"
        "average" is average pooling (the walk-through, section 1.3.1): every
        training target gets the same weight, whatever the query.
    device : "cpu", "cuda" or "auto"
        Where the computation runs, resolved each time a method runs: "auto"
        picks a CUDA GPU when numba sees one, so a saved model predicts on
        machines with or without one.
    dtype : "float64" or "float32"
        Precision of the computation (running sums are float64 always);
        results are float64 either way.
    verbose : int or bool, default 0
        Progress of the ``bandwidth="loo"`` search (passed to
        :func:`nbattn.learning.loo_bandwidth`).

    Attributes
    ----------
    bandwidth_ : ndarray of shape (n_features,)
        The per-feature widths used.
    n_features_in_ : int
    feature_names_in_ : ndarray of str, only when fitted on a DataFrame
    n_outputs_ : int
    outputs_2d_ : bool
        Whether ``y`` was 2-D at fit (predictions are then 2-D too).
    X_fit_ : ndarray (n_samples, n_features), a float64 copy of the training rows (keys)
    y_fit_ : ndarray (n_samples, n_outputs), a float64 copy of the targets (values)
    """

    _parameter_constraints = {
        "bandwidth": _BANDWIDTH_CONSTRAINT,
        "kernel": [StrOptions({"gaussian", "average"})],
        **_PoolingEstimator._common_constraints,
    }

    def __init__(
        self, bandwidth="scott", kernel="gaussian", device="cpu", dtype="float64", verbose=0
    ):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        # average pooling ignores X by design (the walk-through's baseline)
        tags.regressor_tags.poor_score = self.kernel == "average"
        return tags

    def fit(self, X, y):
        """Store copies of the training rows as keys and values; resolve the bandwidth."""
        self._validate_params()
        X, y2, outputs_2d = self._validate_regression_data(X, y)
        bandwidth = self._fit_bandwidth(self.bandwidth, X, y2)
        self._store_training_data(X, y2, outputs_2d)
        self.bandwidth_ = bandwidth
        return self

    def _pooled(self, X):
        if self.kernel == "average":
            return regression.average_pooling(X, self.y_fit_)
        return super()._pooled(X)

    def _pooled_spread(self, X):
        if self.kernel == "average":
            n = X.shape[0]
            mean = regression.average_pooling(X, self.y_fit_)
            std = np.broadcast_to(regression.feature_spread(self.y_fit_, ddof=0), mean.shape).copy()
            return mean, std, np.full(n, float(self.X_fit_.shape[0]))
        return super()._pooled_spread(X)

    def attention_weights(self, X):
        """Attention weights ``W[i, j]`` (n_queries, n_train); 1/n_train for average pooling.

        Row i is how query i pools ``y_fit_``: ``W @ y_fit_`` is the prediction.
        """
        if self.kernel == "average":
            X = self._check_queries(X)
            n = self.X_fit_.shape[0]
            return np.full((X.shape[0], n), 1.0 / n)
        return super().attention_weights(X)

    def _check_fitted_attributes(self):
        allowed = super()._check_fitted_attributes()
        _require_bandwidth(self, self.bandwidth)
        return allowed | {"bandwidth_"}


class LearnedKernelRegressor(_PoolingRegressor):
    """Nadaraya-Watson regression whose kernel metric is learned from the data.

    The attention-pooling walk-through, section 1.3.3: the width is a
    parameter, fitted by minimising the leave-one-out mean squared error

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
          widths and one factor c learned (the walk-through's single w = 1/(c h) in 1-D);
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
    random_state : int, numpy.random.Generator, numpy.random.RandomState or None
        Randomness of init="random". A Generator or RandomState is used (and
        advanced) as given; model files store such a parameter as None, since
        a fitted model's predictions do not depend on it.
    device : "cpu", "cuda" or "auto"
        Where the fit and the predictions run, resolved each time (see
        :class:`NadarayaWatsonRegressor`).
    dtype : "float64" or "float32"
        Precision of the computation; results are float64 either way.
    verbose : int or bool, default 0
        Progress of the optimisation (passed to
        :func:`nbattn.learning.fit_learned_kernel`): iteration, loss, change.

    Attributes
    ----------
    bandwidth_ : ndarray (n_features,), metrics "scalar" and "diagonal"
    components_ : ndarray (n_components, n_features), metric "full"
    loss_ : float, the final LOO MSE
    loss_curve_ : ndarray, LOO MSE at the start and after each iteration
    n_iter_ : int
    n_features_in_, feature_names_in_, n_outputs_, outputs_2d_, X_fit_, y_fit_
        As for :class:`NadarayaWatsonRegressor`.

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
        "random_state": ["random_state", np.random.Generator],
        **_PoolingEstimator._common_constraints,
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
        verbose=0,
    ):
        self.metric = metric
        self.n_components = n_components
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _seed(self):
        """random_state for :func:`nbattn.learning.fit_learned_kernel` (numpy's default_rng)."""
        if isinstance(self.random_state, np.random.RandomState):
            return int(self.random_state.randint(np.iinfo(np.int32).max))
        return self.random_state  # None, an int or a Generator: default_rng takes them

    def fit(self, X, y):
        """Learn the metric by minimising the leave-one-out MSE (L-BFGS-B)."""
        self._validate_params()
        X, y2, outputs_2d = self._validate_regression_data(X, y)
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
        result = learning.fit_learned_kernel(
            X,
            y2,
            metric=self.metric,
            n_components=self.n_components,
            init=self.init,
            max_iter=self.max_iter,
            tol=self.tol,
            random_state=self._seed(),
            dtype=self._dtype(),
            device=self._device(),
            verbose=self.verbose,
        )
        self._store_training_data(X, y2, outputs_2d)
        if self.metric == "full":
            self.components_ = np.asarray(result["components"], dtype=np.float64)
        else:
            self.bandwidth_ = np.asarray(result["bandwidth"], dtype=np.float64)
        self.loss_ = float(result["loss"])
        self.loss_curve_ = np.asarray(result["loss_curve"], dtype=np.float64)
        self.n_iter_ = int(result["n_iter"])
        return self

    def _score_coordinates(self, X):
        """Metric "full" maps x to Lx, where the score is the unit-width Gaussian."""
        if self.metric == "full":
            L = self.components_
            return X @ L.T, self.X_fit_ @ L.T, 1.0
        return X, self.X_fit_, self.bandwidth_

    def _check_fitted_attributes(self):
        allowed = super()._check_fitted_attributes()
        if self.X_fit_.shape[0] < 2:
            raise ValueError("X_fit_ of a LearnedKernelRegressor must have at least 2 rows")
        d = self.n_features_in_
        if self.metric == "full":
            k = d if self.n_components is None else self.n_components
            _require_array(self, "components_", "f", (k, d))
            fitted = "components_"
        else:
            _require_bandwidth(self, None)
            fitted = "bandwidth_"
        loss = getattr(self, "loss_", None)
        if not isinstance(loss, Real) or isinstance(loss, bool) or not loss >= 0:
            raise ValueError(f"loss_ must be a non-negative number, got {loss!r}")
        _require_array(self, "loss_curve_", "f", (None,))
        _require_int(self, "n_iter_", minimum=0)
        return allowed | {fitted, "loss_", "loss_curve_", "n_iter_"}


# ----------------------------------------------------------------------------- classifier


class NadarayaWatsonClassifier(ClassifierMixin, _PoolingEstimator):
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
        Resolved each time a method runs (see :class:`NadarayaWatsonRegressor`).
    dtype : "float64" or "float32"
        Precision of the computation; probabilities are float64 either way.
    verbose : int or bool, default 0
        Progress of the ``bandwidth="loo"`` search.

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
    bandwidth_ : ndarray (n_features,)
    X_fit_ : ndarray (n_samples, n_features), a float64 copy of the training rows
    y_fit_ : ndarray (n_samples, n_classes), the one-hot training labels (the
        values pooled; named like the regressors' targets)
    n_features_in_, feature_names_in_
    """

    _parameter_constraints = {
        "bandwidth": _BANDWIDTH_CONSTRAINT,
        **_PoolingEstimator._common_constraints,
    }

    def __init__(self, bandwidth="scott", device="cpu", dtype="float64", verbose=0):
        self.bandwidth = bandwidth
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def fit(self, X, y):
        """Store copies of the training rows and one-hot labels; resolve the bandwidth."""
        self._validate_params()
        X, y = self._validate_training_X(X, y)
        check_classification_targets(y)
        classes, codes = np.unique(y, return_inverse=True)
        if classes.size < 2:
            raise ValueError(
                "NadarayaWatsonClassifier needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {classes[0]!r}"
            )
        Y = np.zeros((X.shape[0], classes.size))
        Y[np.arange(X.shape[0]), codes] = 1.0
        bandwidth = self._fit_bandwidth(self.bandwidth, X, Y)
        self.classes_ = classes
        self.X_fit_ = X
        self.y_fit_ = Y
        self.bandwidth_ = bandwidth
        return self

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes) as float64, columns in ``classes_`` order."""
        X = self._check_queries(X)
        proba = np.clip(self._pooled(X), 0.0, None)
        return proba / proba.sum(axis=1, keepdims=True)

    def predict(self, X):
        """The most probable class of each row (ties go to the first in ``classes_``)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def _check_fitted_attributes(self):
        allowed = super()._check_fitted_attributes()
        classes = _require_array(self, "classes_", "biufUO", (None,))
        if classes.size < 2 or len(np.unique(classes)) != classes.size:
            raise ValueError(f"classes_ must hold at least 2 distinct labels, got {classes!r}")
        Y = self.y_fit_
        if Y.shape[1] != classes.size:
            raise ValueError(f"y_fit_ has {Y.shape[1]} columns but classes_ has {classes.size}")
        if not (np.isin(Y, (0.0, 1.0)).all() and (Y.sum(axis=1) == 1.0).all()):
            raise ValueError("y_fit_ of a classifier must be one-hot (one 1 per row, else 0)")
        _require_bandwidth(self, self.bandwidth)
        return allowed | {"classes_", "bandwidth_"}


# ----------------------------------------------------------------------------- fitted state


def _require(model, name):
    if name not in vars(model):
        raise ValueError(f"{type(model).__name__}: fitted attribute {name!r} is missing")
    return vars(model)[name]


def _require_int(model, name, minimum):
    value = _require(model, name)
    if not isinstance(value, Integral) or isinstance(value, (bool, np.bool_)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _require_bool(model, name):
    value = _require(model, name)
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _require_array(model, name, kinds, shape):
    """The attribute ``name``: an ndarray of a dtype kind in ``kinds`` and ``shape``
    (None matches any length), finite when it is float."""
    value = _require(model, name)
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{name} must be an array, got {type(value).__name__}")
    if value.dtype.kind not in kinds or (value.dtype.kind == "f" and value.dtype != np.float64):
        want = "float64" if kinds == "f" else f"kinds {kinds!r}"
        raise ValueError(f"{name} must have dtype {want}, got {value.dtype}")
    if value.ndim != len(shape) or any(
        s is not None and s != v for s, v in zip(shape, value.shape)
    ):
        want = tuple("any" if s is None else s for s in shape)
        raise ValueError(f"{name} has shape {value.shape}, expected {want}")
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        raise ValueError(f"{name} holds NaN or infinity")
    return value


def _require_bandwidth(model, parameter):
    """bandwidth_: positive finite float64 (n_features,), equal to a numeric ``parameter``."""
    h = _require_array(model, "bandwidth_", "f", (model.n_features_in_,))
    check_bandwidth(h, model.n_features_in_, name="bandwidth_")
    if parameter is not None and not isinstance(parameter, str):
        expected = check_bandwidth(parameter, model.n_features_in_)
        if not np.array_equal(expected, h):
            raise ValueError("bandwidth_ does not match the numeric bandwidth parameter")


def check_fitted_state(model) -> None:
    """Validate a fitted nbattn estimator, such as one rebuilt from a model file.

    A model file's checksum detects accidents, not edits, so
    :func:`nbattn.load` calls this after rebuilding a model. It checks

    * that ``model`` is one of the estimators of this module;
    * the parameters, through the estimator's own ``_parameter_constraints``
      (a ``kernel`` of ``"evil"`` is refused);
    * every required fitted attribute: present, with the right type, dtype
      and shape, finite, and consistent with the others (``X_fit_`` rows =
      ``y_fit_`` rows, ``n_features_in_`` = ``X_fit_`` columns = the length of
      ``bandwidth_`` and ``feature_names_in_``, ``classes_`` = the one-hot
      columns of ``y_fit_``, ``components_`` (n_components, n_features), a
      numeric ``bandwidth`` parameter = ``bandwidth_``);
    * that the model holds no other attribute.

    Raises
    ------
    ValueError
        naming the parameter or attribute at fault (scikit-learn's
        ``InvalidParameterError``, a ValueError, for parameters).
    """
    if not isinstance(model, _PoolingEstimator):
        raise ValueError(
            f"not an nbattn estimator: {type(model).__module__}.{type(model).__name__}"
        )
    model._validate_params()
    allowed = model._check_fitted_attributes()
    params = set(model.get_params(deep=False))
    unknown = sorted(set(vars(model)) - params - allowed)
    if unknown:
        raise ValueError(
            f"{type(model).__name__}: {unknown[0]!r} is not a fitted attribute of this estimator"
            + (f" (nor are {unknown[1:]})" if len(unknown) > 1 else "")
        )
