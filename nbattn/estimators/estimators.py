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
  (:func:`nbattn.smoothing.regression.nadaraya_watson` and friends) with the model's
  ``dtype`` and ``device``; results are float64 whatever ``dtype`` is;
* output shaping: 1-D targets give 1-D predictions.

:func:`check_fitted_state` validates a model rebuilt from a file: its
parameters, its fitted attributes' presence, shapes, dtypes and agreement,
and that it holds nothing else.
"""

from __future__ import annotations

import math
import numbers
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    check_is_fitted,
    check_X_y,
    validate_data,
)

from .. import config
from .._core import columns
from .._core.validation import as_float_array, check_bandwidth
from ..dispatch.device import resolve_device
from ..smoothing import learned_metric, regression, width_search
from ..smoothing.search import minimize_log_scale
from .fitted_state import ESTIMATORS, check_attributes
from .prediction import PoolingPrediction

__all__ = [
    "LearnedKernelRegressor",
    "LocalPolynomialRegressor",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "check_fitted_state",
]

_BANDWIDTH_CONSTRAINT = [
    StrOptions(set(regression.BANDWIDTH_RULES) | {"loo"}),
    Interval(Real, 0, None, closed="neither"),
    "array-like",
]
#: the kernels of the mixed-type engine (:mod:`nbattn.local.engine`) for continuous columns
_KERNELS = ("gaussian", "epanechnikov", "tricube")
#: the parameters that say how a table's columns are read (see :mod:`nbattn._core.columns`)
_TABLE_CONSTRAINTS = {
    "var_type": [str, None],
    "missing": [StrOptions({"error", "marginalize"})],
    "handle_unknown": [StrOptions({"error", "ignore"})],
}


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


class _PoolingEstimator(PoolingPrediction, BaseEstimator):
    """What every nbattn estimator shares: checks, device, dtype, the pooling calls
    (the computation is :class:`nbattn.estimators.prediction.PoolingPrediction`, shared with
    :class:`nbattn.persistence.predictor.Predictor`).

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

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = getattr(self, "missing", "error") == "marginalize"
        return tags

    # ---- fit-time helpers

    def _validate_training_X(self, X, y, sample_weight=None, **kwargs):
        """(X float64 (n, d), y, sample weights or None): the training data checked and copied.

        Column kinds come from ``var_type`` or a DataFrame's dtypes
        (:mod:`nbattn._core.columns`). All-continuous numeric data goes through
        scikit-learn's ``validate_data`` as it is (NaN allowed with
        ``missing="marginalize"``); a table with categorical or text columns
        is encoded first (category codes, NaN where missing) and checked
        after. Rows of zero weight are dropped; weights that are all 1 become
        None (the unweighted fit).
        Sets ``var_type_`` and ``categories_``.
        """
        _refuse_dates_and_complex(X)
        _refuse_missing_targets(y)
        var_type = getattr(self, "var_type", None)
        missing = getattr(self, "missing", "error")
        kinds = None
        if var_type is not None or columns.is_dataframe(X):
            kinds = columns.resolve_var_type(columns.as_table(X), var_type)
        if (kinds is None or set(kinds) <= {"c"}) and columns.all_numeric(X):
            X, y = validate_data(
                self,
                X,
                y,
                dtype=np.float64,
                copy=True,
                ensure_all_finite="allow-nan" if missing == "marginalize" else True,
                **kwargs,
            )
            categories = [None] * X.shape[1]
        else:
            table = columns.as_table(X)
            validate_data(self, table, y, skip_check_array=True)
            if sample_weight is not None:
                # a row of weight 0 is a row removed: its categories are not the model's
                sample_weight = _check_sample_weight(
                    sample_weight,
                    np.empty((table.shape[0], 1)),
                    dtype=np.float64,
                    ensure_non_negative=True,
                )
                keep = sample_weight > 0
                table = table.iloc[keep] if columns.is_dataframe(table) else table[keep]
                if y is not None and len(y) == len(keep):
                    y = y.iloc[keep] if hasattr(y, "iloc") else np.asarray(y)[keep]
                sample_weight = sample_weight[keep]
            categories = columns.fit_categories(table, kinds)
            encoded = columns.encode_columns(table, kinds, categories, missing=missing)
            X, y = check_X_y(
                encoded,
                y,
                dtype=np.float64,
                ensure_all_finite="allow-nan" if missing == "marginalize" else True,
                estimator=self,
                **kwargs,
            )
        self.var_type_ = "c" * X.shape[1] if kinds is None else kinds
        self.categories_ = categories
        if sample_weight is None:
            return X, y, None
        sw = _check_sample_weight(
            sample_weight, X, dtype=np.float64, ensure_non_negative=True, copy=True
        )
        keep = sw > 0
        X, y, sw = X[keep], y[keep], sw[keep]
        return X, y, (None if np.all(sw == 1.0) else sw)

    def _fit_bandwidth(self, bandwidth, X, Y, sample_weight=None, degree=0):
        """Per-feature widths (h for continuous columns, lambda for categorical ones).

        The Gaussian fast path: "loo" is the LOO-optimal scale of Scott's
        widths, a rule name the rule on the (weighted) spread. The engine's
        path (categorical columns, missing values, another kernel, weights
        with "loo"): :func:`nbattn.local.engine.local_loo_widths` learns every h and
        lambda together, :func:`nbattn.local.engine.default_widths` gives a rule's
        h and the engine's default lambda.
        """
        is_loo = isinstance(bandwidth, str) and bandwidth == "loo"
        if not self._uses_engine():
            if is_loo and sample_weight is not None:
                return _weighted_loo_scale(self, X, Y, sample_weight)
            if is_loo:
                return width_search.loo_bandwidth(
                    X,
                    Y,
                    dtype=self._dtype(),
                    device=self._device(),
                    verbose=self.verbose,
                )
            if isinstance(bandwidth, str) and sample_weight is not None:
                return _weighted_rule_bandwidth(X, sample_weight, bandwidth)
            return regression.resolve_bandwidth(bandwidth, X)
        local = _engine()
        kinds, counts = self.var_type_, self._n_categories()
        if is_loo:
            return _engine_loo_widths(self, X, Y, sample_weight, degree)[0]
        if isinstance(bandwidth, str):
            if sample_weight is not None:
                return _weighted_default_widths(X, kinds, counts, sample_weight, bandwidth)
            return np.asarray(local.default_widths(X, kinds, counts, bandwidth), dtype=np.float64)
        if isinstance(bandwidth, Real) and set(kinds) - {"c"}:
            # one number is a width for the continuous columns; categories keep their default
            widths = np.asarray(local.default_widths(X, kinds, counts, "scott"), dtype=np.float64)
            widths[[k == "c" for k in kinds]] = check_bandwidth(bandwidth, 1)[0]
            return widths
        return np.asarray(local.check_widths(bandwidth, kinds, counts), dtype=np.float64)

    # ---- what the shared computation reads (nbattn.estimators.prediction)

    def _param(self, name, default=None):
        return getattr(self, name, default)

    def _fitted(self, name, default=None):
        return getattr(self, name, default)

    def _device(self) -> str:
        """The device that runs this call ("auto" resolved here, not at fit), through this
        module's ``resolve_device`` (the name tests replace to pretend a GPU machine)."""
        return resolve_device(self.device)

    # ---- query-time helpers

    def _check_queries(self, X):
        check_is_fitted(self)
        _refuse_dates_and_complex(X)
        if set(self._kinds()) == {"c"} and columns.all_numeric(X):
            allow_nan = self._missing() == "marginalize"
            return validate_data(
                self,
                X,
                reset=False,
                dtype=np.float64,
                ensure_all_finite="allow-nan" if allow_nan else True,
            )
        table = columns.as_table(X)
        validate_data(self, table, reset=False, skip_check_array=True)  # names and count
        encoded = columns.encode_columns(
            table,
            self._kinds(),
            self.categories_,
            missing=self._missing(),
            handle_unknown=getattr(self, "handle_unknown", "error"),
        )
        unknown_allowed = getattr(self, "handle_unknown", "error") == "ignore"
        return check_array(
            encoded,
            dtype=np.float64,
            # NaN here is a marginalised missing value or an unseen category (nbattn._core.columns)
            ensure_all_finite="allow-nan"
            if self._missing() == "marginalize" or unknown_allowed
            else True,
            estimator=self,
        )

    def _attention_weights_checked(self, X):
        """Attention weights (n_queries, n_train) for the checked queries X."""
        if self._uses_engine():
            # weight j is the pooled value of the j-th unit vector; keys in blocks of columns
            n = self.X_fit_.shape[0]
            w = np.empty((X.shape[0], n))
            for start in range(0, n, 256):
                block = np.zeros((n, min(256, n - start)))
                block[np.arange(start, start + block.shape[1]), np.arange(block.shape[1])] = 1.0
                w[:, start : start + block.shape[1]] = self._pooled_values(X, block)
            return w
        q, k, h = self._score_coordinates(X)
        w = regression.gaussian_attention_weights(
            q, k, h, dtype=self._dtype(), device=self._device()
        )
        w = np.asarray(w, dtype=np.float64)
        sw = self._weights()
        if sw is not None:
            w = w * sw
            w /= w.sum(axis=1, keepdims=True)
        return w

    # ---- public diagnostics, the same for every estimator

    def attention_weights(self, X):
        """Attention weights ``W[i, j] = softmax_j(s(x_i, x_j))`` (n_queries, n_train).

        Row i is how query i pools ``y_fit_``: ``W @ y_fit_`` is the pooled
        prediction. Memory is n_queries x n_train: meant for plots and
        diagnostics. Computed by :func:`nbattn.smoothing.regression.gaussian_attention_weights`
        on ``device``.
        """
        X = self._check_queries(X)
        return self._attention_weights_checked(X)

    def effective_n_neighbors(self, X):
        """Effective number of training rows each query pools: ``1 / sum_j w_ij^2``.

        1 when one training row holds all the weight, n_train for uniform
        weights (average pooling). A diagnostic of the width: small values
        mean a wiggly, high-variance fit.
        """
        X = self._check_queries(X)
        return self._pooled_spread(X)[2]


# ----------------------------------------------------------------------------- regressors


class _PoolingRegressor(RegressorMixin, _PoolingEstimator):
    """The regressors' share: targets as float64 columns, 1-D or 2-D output, ``return_std``."""

    def _validate_regression_data(self, X, y, sample_weight=None):
        """(X, y as float64 (n, n_outputs), whether y is 2-D, sample weights or None);
        X and y are copies, rows of zero weight dropped."""
        X, y, sw = self._validate_training_X(X, y, sample_weight, multi_output=True, y_numeric=True)
        # a float64 copy, finite: scikit-learn checks object arrays before converting them
        y = as_float_array(y, "y", ndim=(1, 2), dtype="float64")
        return X, y.reshape(len(y), -1), y.ndim == 2, sw

    def _store_training_data(self, X, y2, outputs_2d, sample_weight=None):
        self.X_fit_ = X
        self.y_fit_ = y2
        self.n_outputs_ = y2.shape[1]
        self.outputs_2d_ = outputs_2d
        self.sample_weight_ = sample_weight

    def predict(self, X, return_std=False):
        """Attention-pooled targets for the rows of X (float64).

        With ``return_std=True`` also the attention-weighted standard deviation
        of the training targets about the prediction,
        ``std_i = sqrt(sum_j w_ij (y_j - f_i)^2)`` (computed in a second pass
        about f_i, not as E[y^2] - E[y]^2, which cancels), shaped like the
        prediction. It is the spread of the targets the query pools, not a
        confidence interval of f. Both run on ``device``
        (:func:`nbattn.smoothing.regression.nadaraya_watson_spread` for the spread).
        """
        X = self._check_queries(X)
        return self._predictions(X, return_std)

    def marginal_effects(self, X):
        """The slope of the fit along each continuous column at the rows of X.

        ``d f(x) / d x_d`` for every column of kind "c" (in column order),
        shape (n, d_continuous) for a 1-D target, (n, n_outputs, d_continuous)
        for a 2-D one. For the Gaussian kernel at degree 0 (Nadaraya-Watson)
        it is exact: with the attention weights w_j(x),

        .. math::

            \\frac{\\partial f}{\\partial x_d} =
            \\frac{1}{h_d^2} \\sum_j w_j(x)\\,(y_j - f(x))\\,(x_{jd} - x_d),

        the weighted covariance of y and the key's coordinate divided by
        h_d^2 (categorical columns do not depend on x_d, so the formula holds
        in the mixed product kernel too). A local polynomial of degree >= 1
        and the compact kernels return the engine's local slope
        (:func:`nbattn.local.engine.local_polynomial` with ``return_gradient``).
        """
        X = self._check_queries(X)
        continuous = np.array([k == "c" for k in self._kinds()])
        if not continuous.any():
            raise ValueError("marginal_effects needs a continuous column; this model has none")
        if self._degree() == 0 and self._kernel() == "gaussian" and self._missing() == "error":
            grad = self._gaussian_slopes(X)[:, :, continuous]
        else:
            _, grad = self._local_fit(X, self.y_fit_, return_gradient=True)
        return grad if self.outputs_2d_ else grad[:, 0, :]

    def predict_interval(self, X, alpha=0.05, kind="mean"):
        """A pointwise (1 - alpha) normal interval at the rows of X: (n, 2), or
        (n, n_outputs, 2) for a 2-D target; column 0 the lower, 1 the upper end.

        From the leave-one-out residuals r_j of the training rows and the
        equivalent-kernel weights l_j(x) of the fit (``f(x) = sum_j l_j(x) y_j``):

        * ``kind="mean"``: the interval for the regression function,
          ``var = sum_j l_j(x)^2 r_j^2`` (the sandwich variance);
        * ``kind="observation"``: for a new observation at x, adding the
          kernel-weighted mean of r^2 around x (the local noise variance).

        The ends are ``f(x) -/+ z_{1 - alpha/2} sqrt(var)``
        (:func:`nbattn.local.engine.local_prediction_interval`). The interval is
        centred on f, so it covers the true mean only where the smoothing
        bias is small against the noise (a wide enough width).
        """
        X = self._check_queries(X)
        if self._average():
            raise ValueError("predict_interval needs a kernel; kernel='average' has none")
        if self._uses_engine():
            q, k, widths = X, self.X_fit_, self.bandwidth_
        else:
            q, k, h = self._score_coordinates(X)
            widths = np.broadcast_to(np.asarray(h, dtype=np.float64), (k.shape[1],)).copy()
        options = self._engine_options(X)
        if not self._uses_engine():
            options.update(var_type="c" * k.shape[1], n_categories=None)
        lower, upper = _engine().local_prediction_interval(
            k, self.y_fit_, q, widths, self._degree(), alpha=alpha, kind=kind, **options
        )
        out = np.stack([np.asarray(lower), np.asarray(upper)], axis=-1).astype(np.float64)
        return out if self.outputs_2d_ else out[:, 0, :]

    def _gaussian_slopes(self, X):
        """(n, m, d) exact slopes of the Gaussian pooling in the score's coordinates,
        mapped back to X's columns (``components_`` for the full metric)."""
        q, k, h = self._score_coordinates(X)
        m, e = self.y_fit_.shape[1], k.shape[1]
        h = np.broadcast_to(np.asarray(h, dtype=np.float64), (e,))
        centre = k.mean(axis=0)
        dk = k - centre
        y = self.y_fit_
        values = np.column_stack([y, dk, (y[:, :, None] * dk[:, None, :]).reshape(len(y), -1)])
        pooled = self._pooled_values(X, values)
        ey, ek = pooled[:, :m], pooled[:, m : m + e]
        eyk = pooled[:, m + e :].reshape(-1, m, e)
        grad = (eyk - ey[:, :, None] * ek[:, None, :]) / (h * h)
        components = getattr(self, "components_", None)
        if getattr(self, "metric", None) == "full" and components is not None:
            grad = grad @ components
        return grad


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
        :func:`nbattn.smoothing.regression.bandwidth_rule`). "loo" scales Scott's widths
        by the one factor that minimises the leave-one-out MSE
        (:func:`nbattn.smoothing.width_search.loo_bandwidth`).
    kernel : "gaussian", "epanechnikov", "tricube" or "average"
        The kernel of the continuous columns. "average" is average pooling
        (the walk-through, section 1.3.1): every training target gets the same
        weight, whatever the query. The Gaussian kernel on all-continuous data
        without missing values runs the streaming kernels (CPU or GPU); every
        other case the mixed-type engine :mod:`nbattn.local.engine`.
    var_type : str of "c", "u", "o", or None
        The kind of each column: continuous, unordered or ordered categorical
        (statsmodels' letters). None: from a DataFrame's dtypes (``category``
        ordered -> "o"; ``category``, bool, object, string -> "u"; numeric ->
        "c"); a NumPy array is all continuous. See :mod:`nbattn._core.columns`.
    missing : "error" or "marginalize"
        A missing value in X (NaN, None, pandas.NA): an error naming the
        column and row, or "marginalize": that column drops out of that row's
        kernel product (no imputation, no rows dropped).
    handle_unknown : "error" or "ignore"
        A category unseen at fit: an error naming the column and value, or
        "ignore": it matches no training row (every row gets the mismatch
        weight lambda / (c - 1) in that column).
    device : "cpu", "cuda" or "auto"
        Where the computation runs, resolved each time a method runs: "auto"
        picks a CUDA GPU when numba sees one, so a saved model predicts on
        machines with or without one.
    dtype : "float64" or "float32"
        Precision of the computation (running sums are float64 always);
        results are float64 either way.
    verbose : int or bool, default 0
        Progress of the ``bandwidth="loo"`` search (passed to
        :func:`nbattn.smoothing.width_search.loo_bandwidth`).

    Attributes
    ----------
    bandwidth_ : ndarray of shape (n_features,)
        The per-feature widths used: h for a continuous column, lambda (in
        [0, 1]) for a categorical one.
    var_type_ : str
        The kind of each column, as used.
    categories_ : list
        Per column: None (continuous) or the list of its categories; code k
        in ``X_fit_`` is ``categories_[j][k]``.
    sample_weight_ : ndarray (n_samples,) or None
        The positive training weights (None: unweighted; rows of weight 0
        are not kept).
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
        "kernel": [StrOptions({*_KERNELS, "average"})],
        **_TABLE_CONSTRAINTS,
        **_PoolingEstimator._common_constraints,
    }

    def __init__(
        self,
        bandwidth="scott",
        kernel="gaussian",
        var_type=None,
        missing="error",
        handle_unknown="error",
        device="cpu",
        dtype="float64",
        verbose=0,
    ):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.var_type = var_type
        self.missing = missing
        self.handle_unknown = handle_unknown
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        # average pooling ignores X by design (the walk-through's baseline)
        tags.regressor_tags.poor_score = self.kernel == "average"
        return tags

    def fit(self, X, y, sample_weight=None):
        """Store copies of the training rows as keys and values; resolve the bandwidth.

        ``sample_weight`` (n_samples,), non-negative: a key's weight multiplies
        its kernel weight, ``f(x) = sum_j s_j K_j(x) y_j / sum_j s_j K_j(x)``;
        the rules use the weighted spread and n = sum of weights (so integer
        weights equal repeated rows) and "loo" weights each left-out term.
        """
        self._validate_params()
        X, y2, outputs_2d, sw = self._validate_regression_data(X, y, sample_weight)
        bandwidth = self._fit_bandwidth(self.bandwidth, X, y2, sw)
        self._store_training_data(X, y2, outputs_2d, sw)
        self.bandwidth_ = bandwidth
        return self

    def _attention_weights_checked(self, X):
        if self.kernel == "average":
            sw = self._weights()
            sw = np.ones(self.X_fit_.shape[0]) if sw is None else sw
            return np.broadcast_to(sw / sw.sum(), (X.shape[0], sw.size)).copy()
        return super()._attention_weights_checked(X)


class LearnedKernelRegressor(_PoolingRegressor):
    """Nadaraya-Watson regression whose kernel metric is learned from the data.

    The attention-pooling walk-through, section 1.3.3: the width is a
    parameter, fitted by minimising the leave-one-out mean squared error

    .. math::

        L = \\frac{1}{n p} \\sum_i \\| f_{-i}(x_i) - y_i \\|^2, \\qquad
        f_{-i}(x_i) = \\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij})\\, y_j

    with scipy's L-BFGS-B on the exact gradient, streamed in O(n d) memory
    (:func:`nbattn.smoothing.learned_metric.fit_learned_kernel`). Prediction is attention
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
    var_type, missing, handle_unknown
        How the columns of X are read (see :class:`NadarayaWatsonRegressor`).
        Categorical columns, missing values or sample weights need
        ``metric="diagonal"``: the engine (:func:`nbattn.local.engine.local_loo_widths`)
        then learns each h and lambda together by the weighted LOO MSE.
    device : "cpu", "cuda" or "auto"
        Where the fit and the predictions run, resolved each time (see
        :class:`NadarayaWatsonRegressor`).
    dtype : "float64" or "float32"
        Precision of the computation; results are float64 either way.
    verbose : int or bool, default 0
        Progress of the optimisation (passed to
        :func:`nbattn.smoothing.learned_metric.fit_learned_kernel`): iteration, loss, change.

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
        **_TABLE_CONSTRAINTS,
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
        var_type=None,
        missing="error",
        handle_unknown="error",
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
        self.var_type = var_type
        self.missing = missing
        self.handle_unknown = handle_unknown
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _seed(self):
        """random_state for ``fit_learned_kernel`` (numpy's default_rng)."""
        if isinstance(self.random_state, np.random.RandomState):
            return int(self.random_state.randint(np.iinfo(np.int32).max))
        return self.random_state  # None, an int or a Generator: default_rng takes them

    def fit(self, X, y, sample_weight=None):
        """Learn the metric by minimising the leave-one-out MSE (L-BFGS-B).

        With ``sample_weight``, categorical columns or missing values (metric
        "diagonal" only) the engine learns the widths: each key's weight
        multiplies its kernel weight and each left-out term of the criterion.
        """
        self._validate_params()
        X, y2, outputs_2d, sw = self._validate_regression_data(X, y, sample_weight)
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
        if sw is not None and self.metric != "diagonal" and np.all(sw == sw[0]):
            sw = None  # one weight for every row changes neither the softmax nor the LOO mean
        if self._uses_engine() or sw is not None:
            if self.metric != "diagonal":
                raise ValueError(
                    f"metric={self.metric!r} learns on continuous, complete, unweighted data; "
                    "categorical columns, missing='marginalize' and sample_weight need "
                    "metric='diagonal'"
                )
            widths, loss = _engine_loo_widths(self, X, y2, sw, degree=0)
            self._store_training_data(X, y2, outputs_2d, sw)
            self.bandwidth_ = widths
            self.loss_ = loss
            self.loss_curve_ = np.array([loss])
            self.n_iter_ = 0
            return self
        result = learned_metric.fit_learned_kernel(
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


class LocalPolynomialRegressor(_PoolingRegressor):
    """Local-polynomial kernel regression over mixed continuous and categorical columns.

    At each query x the fit solves a small weighted least-squares problem in
    the continuous differences ``k - x`` and reads off its constant term:

    .. math::

        \\hat\\beta(x) = \\arg\\min_\\beta \\sum_j s_j K(x, x_j)
            \\big(y_j - \\beta_0 - \\beta_1^\\top (x_j - x)_c - \\dots\\big)^2,
        \\qquad \\hat f(x) = \\hat\\beta_0(x),

    with the product kernel K (Gaussian, Epanechnikov or tricube in each
    continuous column of width h_d; Aitchison-Aitken ``1 - lambda`` /
    ``lambda / (c - 1)`` in an unordered column; the engine's ordered kernel
    in an ordered one) and s_j the sample weights. Degree 0 is Nadaraya-Watson;
    degree 1 (local-linear) removes the boundary bias and the bias from a
    sloped design density; ``beta_1`` is the local slope
    (:meth:`marginal_effects`). The weights are the attention weights of the
    mixed-type score, so the sums stream over the keys as in every other
    estimator here (:func:`nbattn.local.engine.local_polynomial`).

    Parameters
    ----------
    degree : 0, 1 or 2
        Degree of the local polynomial in the continuous columns.
    bandwidth : "loo", "scott", "silverman", float or array-like (n_features,)
        "loo" learns every h and lambda by the leave-one-out MSE of this
        degree's fit (:func:`nbattn.local.engine.local_loo_widths`); a rule gives the
        continuous columns its widths and the categorical ones the engine's
        default lambda (:func:`nbattn.local.engine.default_widths`); one number is h
        for every continuous column; an array gives h or lambda per column.
    kernel : "gaussian", "epanechnikov" or "tricube"
        The kernel of the continuous columns.
    var_type, missing, handle_unknown
        How the columns of X are read (see :class:`NadarayaWatsonRegressor`).
    device : "cpu", "cuda" or "auto"
        Resolved each time a method runs.
    dtype : "float64" or "float32"
        Precision of the computation; results are float64 either way.
    verbose : int or bool, default 0
        Accepted for symmetry with the other estimators.

    Attributes
    ----------
    bandwidth_, var_type_, categories_, sample_weight_, n_features_in_,
    feature_names_in_, n_outputs_, outputs_2d_, X_fit_, y_fit_
        As for :class:`NadarayaWatsonRegressor`.
    """

    _parameter_constraints = {
        "degree": [Interval(Integral, 0, 2, closed="both")],
        "bandwidth": _BANDWIDTH_CONSTRAINT,
        "kernel": [StrOptions(set(_KERNELS))],
        **_TABLE_CONSTRAINTS,
        **_PoolingEstimator._common_constraints,
    }

    def __init__(
        self,
        degree=1,
        bandwidth="loo",
        kernel="gaussian",
        var_type=None,
        missing="error",
        handle_unknown="error",
        device="cpu",
        dtype="float64",
        verbose=0,
    ):
        self.degree = degree
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.var_type = var_type
        self.missing = missing
        self.handle_unknown = handle_unknown
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _is_local_polynomial(self) -> bool:
        return True

    def fit(self, X, y, sample_weight=None):
        """Store the training rows, targets and weights; resolve the widths."""
        self._validate_params()
        X, y2, outputs_2d, sw = self._validate_regression_data(X, y, sample_weight)
        if isinstance(self.bandwidth, str) and self.bandwidth == "loo":
            if X.shape[0] < 2:
                raise ValueError(
                    "bandwidth='loo' needs at least 2 samples (leave-one-out), "
                    f"got n_samples={X.shape[0]}"
                )
            bandwidth, _ = _engine_loo_widths(self, X, y2, sw, degree=self._degree())
        else:
            bandwidth = self._fit_bandwidth(self.bandwidth, X, y2, sw, degree=self._degree())
        self._store_training_data(X, y2, outputs_2d, sw)
        self.bandwidth_ = bandwidth
        return self


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
    kernel : "gaussian", "epanechnikov" or "tricube"
        The kernel of the continuous columns (see :class:`NadarayaWatsonRegressor`).
    var_type, missing, handle_unknown
        How the columns of X are read (see :class:`NadarayaWatsonRegressor`);
        with categorical columns "loo" learns each h and lambda by the LOO
        Brier score (:func:`nbattn.local.engine.local_loo_widths`).
    device : "cpu", "cuda" or "auto"
        Resolved each time a method runs (see :class:`NadarayaWatsonRegressor`).
    dtype : "float64" or "float32"
        Precision of the computation; probabilities are float64 either way.
    verbose : int or bool, default 0
        Progress of the ``bandwidth="loo"`` search.

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
    bandwidth_ : ndarray (n_features,), h per continuous column, lambda per categorical one
    var_type_, categories_, sample_weight_
        As for :class:`NadarayaWatsonRegressor`.
    X_fit_ : ndarray (n_samples, n_features), a float64 copy of the training rows
    y_fit_ : ndarray (n_samples, n_classes), the one-hot training labels (the
        values pooled; named like the regressors' targets)
    n_features_in_, feature_names_in_
    """

    _parameter_constraints = {
        "bandwidth": _BANDWIDTH_CONSTRAINT,
        "kernel": [StrOptions(set(_KERNELS))],
        **_TABLE_CONSTRAINTS,
        **_PoolingEstimator._common_constraints,
    }

    def __init__(
        self,
        bandwidth="scott",
        kernel="gaussian",
        var_type=None,
        missing="error",
        handle_unknown="error",
        device="cpu",
        dtype="float64",
        verbose=0,
    ):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.var_type = var_type
        self.missing = missing
        self.handle_unknown = handle_unknown
        self.device = device
        self.dtype = dtype
        self.verbose = verbose

    def fit(self, X, y, sample_weight=None):
        """Store copies of the training rows and one-hot labels; resolve the bandwidth.

        ``sample_weight`` multiplies each key's kernel weight (and its term in
        the "loo" criterion); rows of weight 0 are dropped.
        """
        self._validate_params()
        X, y, sw = self._validate_training_X(X, y, sample_weight)
        check_classification_targets(y)
        classes, codes = np.unique(y, return_inverse=True)
        if classes.size < 2:
            raise ValueError(
                "NadarayaWatsonClassifier needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {classes[0]!r}"
            )
        Y = np.zeros((X.shape[0], classes.size))
        Y[np.arange(X.shape[0]), codes] = 1.0
        bandwidth = self._fit_bandwidth(self.bandwidth, X, Y, sw)
        self.classes_ = classes
        self.X_fit_ = X
        self.y_fit_ = Y
        self.sample_weight_ = sw
        self.bandwidth_ = bandwidth
        return self

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes) as float64, columns in ``classes_`` order."""
        X = self._check_queries(X)
        return self._probabilities(X)

    def predict(self, X):
        """The most probable class of each row (ties go to the first in ``classes_``)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]


# ----------------------------------------------------------------------------- engine helpers


def _engine():
    """The mixed-type local-polynomial engine, imported when a model first needs it."""
    from ..local import engine as local

    return local


def _engine_loo_widths(model, X, Y, sample_weight, degree):
    """(widths, LOO MSE at them): every h and lambda learned by the engine's weighted LOO."""
    local = _engine()
    common = dict(
        var_type=model._kinds(),
        n_categories=model._n_categories(),
        kernel=model._kernel(),
        sample_weight=sample_weight,
        missing=model._missing(),
        device=model._device(),
    )
    from ..local.widths import local_loo_widths

    widths = np.asarray(local_loo_widths(X, Y, degree, **common), dtype=np.float64)
    loss = float(local.local_loo_loss(X, Y, widths, degree, **common))
    return widths, loss


def _weighted_loo_scale(model, X, Y, sample_weight):
    """Weighted Scott widths times the one factor minimising the weighted LOO MSE.

    The weighted form of :func:`nbattn.smoothing.width_search.loo_bandwidth`: the same
    search over log-scale factors (:func:`nbattn.search.minimize_log_scale`,
    the same grid and tolerance) of the criterion
    ``sum_i s_i (y_i - f_{-i}(x_i))^2 / sum_i s_i``, where f_{-i} leaves row i
    out and weighs every other key by its s_j
    (:func:`nbattn.local.engine.local_loo_loss` at degree 0).
    """
    local = _engine()
    base = _weighted_rule_bandwidth(X, sample_weight, "scott")

    def criterion(t):
        return local.local_loo_loss(
            X, Y, base * math.exp(t), 0, sample_weight=sample_weight, device=model._device()
        )

    result = minimize_log_scale(
        criterion,
        np.log(np.sort(np.asarray(config.LOO_GRID, dtype=np.float64))),
        rtol=config.LOO_RTOL,
        extend=config.LOO_EXTEND_DECADES * math.log(10.0),
        anchor=0.0,
    )
    return base * math.exp(result.t)


def _weighted_default_widths(X, var_type, n_categories, sample_weight, rule):
    """:func:`nbattn.local.engine.default_widths` with the weighted spread and n = sum of weights.

    The engine's rule: ``h_c = factor(n, d) sigma_c`` over all d columns and
    ``lambda = lambda_max min(1, factor(n, d))``; with integer weights this is
    the rule of the repeated rows. Missing entries are left out of the spreads.
    """
    local = _engine()
    d = X.shape[1]
    factor = regression.BANDWIDTH_RULES[rule](float(np.sum(sample_weight)), d)
    out = np.empty(d)
    top = local.lambda_max(var_type, n_categories)
    for j, kind in enumerate(var_type):
        if kind != "c":
            out[j] = top[j] * min(1.0, factor)
            continue
        present = ~np.isnan(X[:, j])
        sigma = _weighted_spread(X[present, j : j + 1], sample_weight[present])[0]
        out[j] = factor * (sigma if sigma > 0 else 1.0)
    return out


def _weighted_spread(X, w):
    """Weighted standard deviation per column, ``sum s (x - m)^2 / (sum s - 1)`` (zeros
    when sum s <= 1), on columns divided by a power of two near their largest magnitude."""
    total = float(w.sum())
    if X.shape[0] == 0 or total <= 1.0:
        return np.zeros(X.shape[1])
    peak = np.abs(X).max(axis=0)
    scale = np.ldexp(1.0, np.frexp(np.where(peak > 0, peak, 1.0))[1])
    Z = X / scale
    mean = (w @ Z) / total
    return np.sqrt((w @ ((Z - mean) ** 2)) / (total - 1.0)) * scale


def _weighted_rule_bandwidth(X, sample_weight, rule):
    """A rule's widths from the weighted spread, with n = sum of weights.

    ``sigma_d^2 = sum_j s_j (x_jd - m_d)^2 / (sum_j s_j - 1)`` with the weighted
    mean m_d: for integer weights exactly the spread of the repeated rows (the
    columns are divided by a power of two near their largest magnitude first,
    as in :func:`nbattn.smoothing.regression.feature_spread`).
    """
    w = np.asarray(sample_weight, dtype=np.float64)
    return regression.rule_bandwidth(_weighted_spread(X, w), float(w.sum()), rule)


# ----------------------------------------------------------------------------- fitted state


def check_fitted_state(model) -> None:
    """Validate a fitted nbattn estimator, such as one rebuilt from a model file.

    A model file's checksum detects accidents, not edits, so
    :func:`nbattn.load` calls this after rebuilding a model. It checks

    * that ``model`` is one of the estimators of this module;
    * the parameters, through the estimator's own ``_parameter_constraints``
      (a ``kernel`` of ``"evil"`` is refused);
    * every required fitted attribute (:func:`nbattn.estimators.fitted_state.check_attributes`,
      the checks ``nbattn predict`` runs without scikit-learn): present, with the right type, dtype
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
    params = model.get_params(deep=False)
    state = {name: value for name, value in vars(model).items() if name not in params}
    estimator = next(c.__name__ for c in type(model).__mro__ if c.__name__ in ESTIMATORS)
    check_attributes(estimator, params, state)
