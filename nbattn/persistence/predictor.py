"""Predictions from a model file without scikit-learn: what ``nbattn predict`` runs.

``nbattn.load`` rebuilds the scikit-learn estimator, and importing
scikit-learn (with the SciPy it loads) takes longer than the whole prediction
of a small file. A :class:`Predictor` reads the same file
(:func:`nbattn.persistence.modelfile.read_fitted_state`: sizes, checksum), validates its
content (:func:`nbattn.estimators.fitted_state.check_fitted_state`: the checks the
estimator makes, without scikit-learn) and predicts through the same
functional-layer calls as the estimator's methods, in the same order and
with the same arguments (the one computation of both,
:class:`nbattn.estimators.prediction.PoolingPrediction`), so its predictions are bit for
bit the estimator's:

* all-continuous Gaussian data without missing values: attention pooling by
  the streaming kernel, :func:`nbattn.smoothing.regression.nadaraya_watson`, with
  sample weights pooled as ``[w v, w]`` and divided; the learned full metric
  maps x to Lx and pools with unit widths;
* categorical columns, ``missing="marginalize"``, a compact kernel, or a
  local polynomial: the mixed-type engine, :func:`nbattn.local.engine.local_polynomial`;
* ``kernel="average"``: :func:`nbattn.smoothing.regression.average_pooling`;
* ``return_std``: :func:`nbattn.smoothing.regression.nadaraya_watson_spread`, or the
  pooled moments about f for the engine and for weighted models
  (``sum_j w_ij (y_j - f)^2 = E[(y-c)^2] - 2 (f-c) E[y-c] + (f-c)^2``);
* classifiers: the pooled one-hot labels clipped at 0 and normalised; the
  label is the first class of largest probability;
* a regressor's ``marginal_effects`` and ``predict_interval``: the estimator's
  methods, computed by the same shared code;
* ``PartiallyLinearRegressor``: ``x_lin . coef_`` plus the local polynomial of the
  partial residuals over the z columns
  (:func:`nbattn.estimators.partially_linear_prediction.partially_linear_predict`, the
  estimator's own);
* the density estimators (``KernelDensity``, ``ConditionalKernelDensity``,
  ``KernelQuantileRegressor``): log densities (``score_samples``), distribution
  functions (``cdf``) and conditional quantiles (``predict``, ``predict_quantile``,
  ``predict_interval``), by their one computation,
  :class:`nbattn.estimators.prediction.DensityPrediction`.

``tests/persistence/test_predictor.py`` compares it with the estimator on every model
kind the command line fits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._core import columns
from ..estimators.fitted_state import (
    CLASSIFIERS,
    CONDITIONALS,
    DENSITIES,
    PARTIALLY_LINEAR,
    check_fitted_state,
)
from ..estimators.partially_linear_prediction import partially_linear_predict
from ..estimators.prediction import DensityPrediction, PoolingPrediction
from .modelfile import invalid_model, read_fitted_state

__all__ = ["Predictor", "read_predictor"]


def read_predictor(path):
    """``(Predictor, metadata)`` of a model file, validated; scikit-learn is not imported.

    Raises :class:`nbattn.persistence.modelfile.ModelFileError` (a ValueError) for a
    file :func:`nbattn.load` would refuse: foreign, truncated, corrupt,
    edited, of another format version, or naming an unknown estimator.
    """
    path = Path(path)
    meta, state = read_fitted_state(path)
    try:
        predictor = Predictor(meta.get("estimator"), meta.get("params", {}), state)
    except (TypeError, AttributeError, ValueError) as exc:
        raise invalid_model(path, exc) from exc
    return predictor, meta


class Predictor(PoolingPrediction, DensityPrediction):
    """A fitted nbattn estimator's predictions, from its class name, parameters and
    fitted attributes (what a model file holds).

    Parameters
    ----------
    estimator : str
        The class name, one of :data:`nbattn.estimators.spec.SPECS`.
    params : dict
        The estimator's parameters (``get_params()``).
    state : dict
        The fitted attributes by name (``bandwidth_``, ``X_fit_``, ...).

    Raises ValueError when they do not describe a valid fitted model
    (:func:`nbattn.estimators.fitted_state.check_fitted_state`).
    """

    def __init__(self, estimator: str, params: dict, state: dict):
        if not isinstance(params, dict) or not isinstance(state, dict):
            raise ValueError("params and state must be dictionaries")
        self.params = check_fitted_state(estimator, params, state)
        self.estimator = estimator
        self.state = dict(state)

    # ---- what the command line reads

    @property
    def is_classifier(self) -> bool:
        return self.estimator in CLASSIFIERS

    @property
    def is_density(self) -> bool:
        """A density estimator's model (no targets pooled: densities and quantiles)."""
        return self.estimator in DENSITIES

    @property
    def is_conditional(self) -> bool:
        """A model of y given X (a conditional density or quantile regressor)."""
        return self.estimator in CONDITIONALS

    @property
    def var_type_(self) -> str:
        return self.state["var_type_"]

    @property
    def categories_(self) -> list:
        return self.state["categories_"]

    @property
    def classes_(self):
        if not self.is_classifier:
            raise AttributeError(f"{self.estimator} has no classes_")
        return self.state["classes_"]

    @property
    def feature_names_in_(self):
        return self.state.get("feature_names_in_")

    def __repr__(self) -> str:
        return f"Predictor({self.estimator})"

    # ---- predictions

    def predict(self, X, return_std=False):
        """What the estimator's ``predict(X)`` (and ``return_std``) returns for X."""
        if self.is_density:
            if self.estimator != "KernelQuantileRegressor":
                raise AttributeError(f"{self.estimator} has no predict")
            if return_std:
                raise ValueError("return_std is for the pooling regressors")
            return self._quantiles(self._check_queries(X), [self.params["quantile"]])[:, 0]
        if self.is_classifier:
            if return_std:
                raise ValueError("return_std is for regressors")
            proba = self.predict_proba(X)
            return self.state["classes_"][np.argmax(proba, axis=1)]
        X = self._check_queries(X)
        if self.estimator == PARTIALLY_LINEAR:
            if return_std:
                raise ValueError(f"return_std is not offered by {PARTIALLY_LINEAR}")
            return partially_linear_predict(self.params, self.state, X)
        return self._predictions(X, return_std)

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes), columns in ``classes_`` order."""
        if not self.is_classifier:
            raise AttributeError(f"{self.estimator} has no predict_proba")
        X = self._check_queries(X)
        return self._probabilities(X)

    def marginal_effects(self, X):
        """What a regressor's ``marginal_effects(X)`` returns: the slope of the fit along
        each continuous column, (n, d_continuous)."""
        self._refuse_classifier("marginal_effects")
        return self._marginal_effects(self._check_queries(X))

    def predict_interval(
        self,
        X,
        alpha=0.05,
        kind="mean",
        method="asymptotic",
        n_boot=999,
        resample="wild",
        random_state=None,
    ):
        """What a regressor's ``predict_interval(X, alpha, kind, method, n_boot, resample,
        random_state)`` returns: (n, 2), the lower and upper ends of the pointwise
        (1 - alpha) interval (``method="bootstrap"``: the bootstrap band of the mean at the
        held widths); for a KernelQuantileRegressor, what its ``predict_interval(X,
        alpha)`` returns: its conditional quantiles at alpha/2 and 1 - alpha/2, (n, 2)
        (``kind`` and the bootstrap's keywords unused, ``method`` "asymptotic" only)."""
        if self.estimator == "KernelQuantileRegressor":
            from ..distribution.conditional import interval_levels

            if method != "asymptotic":
                raise ValueError(
                    f"method={method!r}: a KernelQuantileRegressor's interval is its "
                    "conditional quantiles (method='asymptotic'); the bootstrap is for the "
                    "pooling regressors"
                )
            return self._quantiles(self._check_queries(X), interval_levels(alpha))
        self._refuse_classifier("predict_interval")
        from ..local.bands import BandOptions

        band = BandOptions(method, n_boot, resample, random_state)
        return self._interval(self._check_queries(X), alpha, kind, band)

    def predict_quantile(self, X, q):
        """What a conditional model's ``predict_quantile(X, q)`` returns: (n,) for one
        level, (n, len(q)) for a list."""
        if not self.is_conditional:
            raise AttributeError(f"{self.estimator} has no predict_quantile")
        from ..distribution.conditional import check_levels

        levels, scalar = check_levels(q)
        out = self._quantiles(self._check_queries(X), levels)
        return out[:, 0] if scalar else out

    def score_samples(self, X, y=None):
        """What a density's ``score_samples`` returns: log f(x) per row (KernelDensity), or
        log f(y_i | x_i) (ConditionalKernelDensity, ``y`` required)."""
        if self.estimator == "KernelDensity":
            return self._log_density(self._check_queries(X))
        if self.estimator != "ConditionalKernelDensity":
            raise AttributeError(f"{self.estimator} has no score_samples")
        if y is None:
            raise ValueError("the conditional log density log f(y | x) needs y")
        return self._conditional_log_density(self._check_queries(X), y)

    def cdf(self, X, y=None):
        """What a density's ``cdf`` returns: F(x) (KernelDensity), or F(y_i | x_i)
        (ConditionalKernelDensity, ``y`` required)."""
        if self.estimator == "KernelDensity":
            return np.exp(self._log_cdf(self._check_queries(X)))
        if self.estimator != "ConditionalKernelDensity":
            raise AttributeError(f"{self.estimator} has no cdf")
        if y is None:
            raise ValueError("the conditional distribution function F(y | x) needs y")
        return np.exp(self._conditional_log_cdf(self._check_queries(X), y))

    def _refuse_classifier(self, method) -> None:
        if self.is_classifier or self.estimator == PARTIALLY_LINEAR:
            raise AttributeError(f"{self.estimator} has no {method}")
        self._refuse_density(method)

    def _refuse_density(self, method) -> None:
        if self.is_density:
            raise AttributeError(f"{self.estimator} has no {method}")

    # ---- what the shared computation reads (nbattn.estimators.prediction)

    def _param(self, name, default=None):
        return self.params.get(name, default)

    def _fitted(self, name, default=None):
        return self.state.get(name, default)

    def _is_local_polynomial(self) -> bool:
        return self.estimator == "LocalPolynomialRegressor"

    # ---- query checks (the estimators' run through scikit-learn's validate_data)

    def _check_queries(self, X):
        """X as the float64 (n, d) array the estimator's checks make of it: numbers for
        an all-continuous model, the category codes of :func:`nbattn._core.columns.encode_columns`
        otherwise; NaN only where the model marginalises (or ignores unseen categories)."""
        columns.refuse_no_columns(X)
        names = self.state.get("feature_names_in_")
        d = self.state["n_features_in_"]
        if columns.is_dataframe(X) and names is not None:
            got = [str(c) for c in X.columns]
            if got != [str(n) for n in names]:
                raise ValueError(
                    f"X has the columns {got}; the model was fitted on {list(map(str, names))}"
                )
        kinds = self.state["var_type_"]
        unknown_allowed = self._param("handle_unknown", "error") == "ignore"
        if set(kinds) == {"c"} and columns.all_numeric(X):
            arr = np.asarray(X, dtype=np.float64)  # as scikit-learn's check_array converts
            allow_nan = self._missing() == "marginalize"
        else:
            table = columns.as_table(X)
            arr = columns.encode_columns(
                table,
                kinds,
                self.state["categories_"],
                missing=self._missing(),
                handle_unknown=self._param("handle_unknown", "error"),
                offers=self._offers(),
            )
            allow_nan = self._missing() == "marginalize" or unknown_allowed
        if arr.ndim != 2 or arr.shape[1] != d:
            raise ValueError(f"X has shape {arr.shape}; the model expects {d} columns")
        if arr.shape[0] == 0:
            raise ValueError("X has no rows")
        bad = np.isinf(arr) if allow_nan else ~np.isfinite(arr)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ValueError(f"X holds {arr[i, j]} at row {i}, column {j}")
        return arr
