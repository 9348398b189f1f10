"""Predictions from a model file without scikit-learn: what ``nbattn predict`` runs.

``nbattn.load`` rebuilds the scikit-learn estimator, and importing
scikit-learn (with the SciPy it loads) takes longer than the whole prediction
of a small file. A :class:`Predictor` reads the same file
(:func:`nbattn.modelfile.read_fitted_state`: sizes, checksum), validates its
content (:func:`nbattn.fitted_state.check_fitted_state`: the checks the
estimator makes, without scikit-learn) and predicts through the same
functional-layer calls as the estimator's methods, in the same order and
with the same arguments, so its predictions are bit for bit the estimator's:

* all-continuous Gaussian data without missing values: attention pooling by
  the streaming kernel, :func:`nbattn.regression.nadaraya_watson`, with
  sample weights pooled as ``[w v, w]`` and divided; the learned full metric
  maps x to Lx and pools with unit widths;
* categorical columns, ``missing="marginalize"``, a compact kernel, or a
  local polynomial: the mixed-type engine, :func:`nbattn.local.local_polynomial`;
* ``kernel="average"``: :func:`nbattn.regression.average_pooling`;
* ``return_std``: :func:`nbattn.learning.nadaraya_watson_spread`, or the
  pooled moments about f for the engine and for weighted models
  (``sum_j w_ij (y_j - f)^2 = E[(y-c)^2] - 2 (f-c) E[y-c] + (f-c)^2``);
* classifiers: the pooled one-hot labels clipped at 0 and normalised; the
  label is the first class of largest probability.

``tests/test_predictor.py`` compares it with the estimator on every model
kind the command line fits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import columns
from ._validation import resolve_dtype
from .device import resolve_device
from .fitted_state import CLASSIFIERS, check_fitted_state
from .modelfile import invalid_model, read_fitted_state

__all__ = ["Predictor", "read_predictor"]


def read_predictor(path):
    """``(Predictor, metadata)`` of a model file, validated; scikit-learn is not imported.

    Raises :class:`nbattn.modelfile.ModelFileError` (a ValueError) for a
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


class Predictor:
    """A fitted nbattn estimator's predictions, from its class name, parameters and
    fitted attributes (what a model file holds).

    Parameters
    ----------
    estimator : str
        The class name, one of ``nbattn.estimators.__all__``.
    params : dict
        The estimator's parameters (``get_params()``).
    state : dict
        The fitted attributes by name (``bandwidth_``, ``X_fit_``, ...).

    Raises ValueError when they do not describe a valid fitted model
    (:func:`nbattn.fitted_state.check_fitted_state`).
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
    def var_type_(self) -> str:
        return self.state["var_type_"]

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
        if self.is_classifier:
            if return_std:
                raise ValueError("return_std is for regressors")
            proba = self.predict_proba(X)
            return self.state["classes_"][np.argmax(proba, axis=1)]
        X = self._check_queries(X)
        if return_std:
            out, std = self._pooled_spread(X)
            return self._shape_output(out), self._shape_output(std)
        return self._shape_output(self._pooled(X))

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes), columns in ``classes_`` order."""
        if not self.is_classifier:
            raise AttributeError(f"{self.estimator} has no predict_proba")
        X = self._check_queries(X)
        proba = np.clip(self._pooled(X), 0.0, None)
        return proba / proba.sum(axis=1, keepdims=True)

    # ---- how the model reads its columns (as the estimators' shared base)

    def _kernel(self) -> str:
        kernel = self.params.get("kernel", "gaussian")
        return "gaussian" if kernel == "average" else kernel

    def _average(self) -> bool:
        return self.params.get("kernel") == "average"

    def _missing(self) -> str:
        return self.params["missing"]

    def _uses_engine(self) -> bool:
        if self.estimator == "LocalPolynomialRegressor":
            return True
        kinds = self.state["var_type_"]
        encodes = set(kinds) != {"c"} or self._missing() == "marginalize"
        return encodes or self._kernel() != "gaussian"

    def _degree(self) -> int:
        return int(self.params["degree"]) if self.estimator == "LocalPolynomialRegressor" else 0

    def _weights(self):
        return self.state["sample_weight_"]

    def _device(self) -> str:
        return resolve_device(self.params["device"])

    def _dtype(self):
        return resolve_dtype(self.params["dtype"])

    def _shape_output(self, out):
        return out if self.state["outputs_2d_"] else out[:, 0]

    def _check_queries(self, X):
        """X as the float64 (n, d) array the estimator's checks make of it: numbers for
        an all-continuous model, the category codes of :func:`nbattn.columns.encode_columns`
        otherwise; NaN only where the model marginalises (or ignores unseen categories)."""
        names = self.state.get("feature_names_in_")
        d = self.state["n_features_in_"]
        if columns.is_dataframe(X) and names is not None:
            got = [str(c) for c in X.columns]
            if got != [str(n) for n in names]:
                raise ValueError(
                    f"X has the columns {got}; the model was fitted on {list(map(str, names))}"
                )
        kinds = self.state["var_type_"]
        unknown_allowed = self.params["handle_unknown"] == "ignore"
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
                handle_unknown=self.params["handle_unknown"],
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

    def _score_coordinates(self, X):
        """(queries, keys, widths) of the Gaussian score; metric "full" maps x to Lx."""
        if self.estimator == "LearnedKernelRegressor" and self.params["metric"] == "full":
            L = self.state["components_"]
            return X @ L.T, self.state["X_fit_"] @ L.T, 1.0
        return X, self.state["X_fit_"], self.state["bandwidth_"]

    def _engine_options(self, X):
        missing = self._missing()
        if missing == "error" and X is not None and np.isnan(X).any():
            missing = "marginalize"  # an unseen category (nbattn.columns)
        return dict(
            var_type=self.state["var_type_"],
            n_categories=columns.n_categories(self.state["categories_"]),
            kernel=self._kernel(),
            sample_weight=self._weights(),
            missing=missing,
            device=self._device(),
        )

    # ---- the computation (the same calls as nbattn.estimators)

    def _local_fit(self, X, values, degree=None):
        from .local import local_polynomial

        out = local_polynomial(
            X,
            self.state["X_fit_"],
            values,
            self.state["bandwidth_"],
            self._degree() if degree is None else degree,
            return_gradient=False,
            dtype=self._dtype(),
            **self._engine_options(X),
        )
        return np.asarray(out, dtype=np.float64)

    def _pooled_values(self, X, values):
        if self._average():
            from .regression import average_pooling

            sw = self._weights()
            if sw is None:
                return average_pooling(X, values)
            mean = (sw @ values) / sw.sum()
            return np.broadcast_to(mean, (X.shape[0], values.shape[1])).copy()
        if self._uses_engine():
            return self._local_fit(X, values, degree=0)
        from .regression import nadaraya_watson

        q, k, h = self._score_coordinates(X)
        sw = self._weights()
        if sw is not None:
            values = np.column_stack([sw[:, None] * values, sw])
        out = nadaraya_watson(q, k, values, h, dtype=self._dtype(), device=self._device())
        out = np.asarray(out, dtype=np.float64)
        return out if sw is None else out[:, :-1] / out[:, -1:]

    def _pooled(self, X):
        y = self.state["y_fit_"]
        if not self._average() and self._uses_engine():
            return self._local_fit(X, y)
        return self._pooled_values(X, y)

    def _pooled_spread(self, X):
        """(predictions, weighted std of the targets about them), as the estimators'."""
        y = self.state["y_fit_"]
        if self._average() and self._weights() is None:
            from .regression import average_pooling, feature_spread

            mean = average_pooling(X, y)
            return mean, np.broadcast_to(feature_spread(y, ddof=0), mean.shape).copy()
        if not self._uses_engine() and self._weights() is None:
            from .learning import nadaraya_watson_spread

            q, k, h = self._score_coordinates(X)
            mean, std, _ = nadaraya_watson_spread(
                q, k, y, h, dtype=self._dtype(), device=self._device()
            )
            return np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
        f = self._pooled(X)
        m = y.shape[1]
        centre = y.mean(axis=0)
        dy = y - centre
        moments = self._pooled_values(X, np.column_stack([dy, dy * dy]))
        first, second = moments[:, :m], moments[:, m:]
        fc = f - centre
        var = np.maximum(second - 2.0 * fc * first + fc * fc, 0.0)
        return f, np.sqrt(var)
