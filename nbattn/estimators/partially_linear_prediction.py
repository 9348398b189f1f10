"""The partially linear model's predictions, without scikit-learn: ``x_lin . coef_ +
g(z)``, g the local polynomial of the partial residuals over the z columns
(:class:`SmoothPart`, a :class:`~nbattn.estimators.prediction.PoolingPrediction` of the z
columns alone), shared by :class:`nbattn.PartiallyLinearRegressor` and the model-file
Predictor (:mod:`nbattn.persistence.predictor`)."""

from __future__ import annotations

import numpy as np

from .prediction import PoolingPrediction

__all__ = ["SmoothPart", "linear_offset", "partially_linear_predict", "smooth_part"]


class SmoothPart(PoolingPrediction):
    """The nonparametric part of a partially linear model, ``g(z)``: a local polynomial
    of degree ``degree`` over the z columns (every column not in ``linear_columns_``),
    answering :class:`nbattn.estimators.prediction.PoolingPrediction`'s questions from
    plain dictionaries, so that the estimator and the scikit-learn-free Predictor pool
    the same way. ``state`` holds the z columns' own ``X_fit_``, ``var_type_``,
    ``categories_`` and ``n_features_in_``, the sample weights and, once known, the
    widths ``bandwidth_`` and the pooled values ``y_fit_``."""

    def __init__(self, params: dict, state: dict):
        self.params = params
        self.state = state
        # what the width searches read (nbattn.estimators.widths)
        self.verbose = params.get("verbose", 0)
        self.loo_subsample = params.get("loo_subsample")

    def _param(self, name, default=None):
        return self.params.get(name, default)

    def _fitted(self, name, default=None):
        return self.state.get(name, default)

    def _is_local_polynomial(self) -> bool:
        return True


def smooth_part(params: dict, state: dict, with_target: bool = True) -> SmoothPart:
    """The :class:`SmoothPart` of a partially linear model's parameters and fitted
    attributes (``X_fit_`` of every column, ``linear_columns_``, ...): its z columns, and
    with ``with_target`` the values g pools, the partial residuals
    ``r_i = y_i - x_lin,i . coef_`` (a ValueError where ``x_lin . coef_`` overflows)."""
    X = state["X_fit_"]
    lin = np.asarray(state["linear_columns_"])
    z = np.setdiff1d(np.arange(X.shape[1]), lin)
    categories = state.get("categories_") or [None] * X.shape[1]
    sub = {
        "X_fit_": X[:, z],
        "var_type_": "".join(state["var_type_"][j] for j in z),
        "categories_": [categories[j] for j in z],
        "n_features_in_": int(z.size),
        "sample_weight_": state.get("sample_weight_"),
        "bandwidth_": state.get("bandwidth_"),
        "outputs_2d_": False,
    }
    if with_target:
        offset = linear_offset(X[:, lin], state["coef_"])
        sub["y_fit_"] = (state["y_fit_"][:, 0] - offset)[:, None]
    return SmoothPart(params, sub)


def linear_offset(X_lin, coef) -> np.ndarray:
    """``x_lin . coef`` per row, or a ValueError naming the first row where it leaves
    float64's range (never a silent inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = X_lin @ coef
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"x_lin . coef_ at row {i} is beyond float64's range ({X_lin[i].tolist()} times "
            f"{coef.tolist()})"
        )
    return out


def partially_linear_predict(params: dict, state: dict, X) -> np.ndarray:
    """A partially linear model's predictions at the checked rows X (n, d), float64 (n,):
    ``x_lin . coef_ + g(z)``, g the local polynomial of the partial residuals over the z
    columns at the widths ``bandwidth_`` (:class:`SmoothPart`); a ValueError where the sum
    leaves float64's range."""
    lin = np.asarray(state["linear_columns_"])
    missing = np.argwhere(np.isnan(X[:, lin]))
    if missing.size:
        i, k = missing[0]
        raise ValueError(
            f"X holds a missing value in linear column {int(lin[k])} at row {int(i)}: "
            "the linear part needs every value (missing='marginalize' applies to z)"
        )
    z = np.setdiff1d(np.arange(X.shape[1]), lin)
    g = smooth_part(params, state)._predictions(np.ascontiguousarray(X[:, z]))
    with np.errstate(over="ignore", invalid="ignore"):
        out = linear_offset(X[:, lin], state["coef_"]) + g
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"the prediction at row {i} is beyond float64's range")
    return out
