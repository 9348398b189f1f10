"""The widths an estimator resolves at fit: ``bandwidth`` -> ``bandwidth_``.

Two paths, as for prediction (:class:`nbattn.estimators.prediction.PoolingPrediction`):

* the Gaussian fast path (all-continuous data, the Gaussian kernel, no
  missing values): "loo" is the LOO-optimal scale of Scott's widths
  (:func:`nbattn.smoothing.width_search.loo_bandwidth`), a rule name the rule on
  the spread, a number or an array the widths as given;
* the mixed-type engine's path (categorical columns, missing values, another
  kernel, a local polynomial): "loo" learns every h and lambda together
  (:func:`nbattn.local.widths.local_loo_widths`), a rule gives the continuous
  columns its widths and the categorical ones the engine's default lambda
  (:func:`nbattn.local.engine.default_widths`).

With sample weights the rules use the weighted spread and n = sum of the
weights, so that integer weights equal repeated rows, and "loo" weighs each
left-out term. The model passed in answers the questions of
:class:`~nbattn.estimators.prediction.PoolingPrediction` (its column kinds,
kernel, device, ...) for the training data being fitted.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from .. import config
from .._core.validation import check_bandwidth
from ..smoothing import regression, width_search
from ..smoothing.search import minimize_log_scale

__all__ = [
    "engine_loo_loss",
    "engine_loo_widths",
    "fit_widths",
    "weighted_default_widths",
    "weighted_loo_scale",
    "weighted_rule_bandwidth",
    "weighted_spread",
]


def _engine():
    """The mixed-type local-polynomial engine, imported when a model first needs it."""
    from ..local import engine

    return engine


def fit_widths(model, bandwidth, X, Y, sample_weight=None, degree=0) -> np.ndarray:
    """Per-feature widths (h for continuous columns, lambda for categorical ones).

    Parameters
    ----------
    model : a nbattn estimator being fitted (its ``var_type_`` and ``categories_`` set)
    bandwidth : its ``bandwidth`` parameter: "loo", a rule name, a number or an array
    X : ndarray (n, d) float64, the checked training rows
    Y : ndarray (n, m) float64, the values pooled (targets or one-hot labels)
    sample_weight : ndarray (n,) of positive weights, or None
    degree : int, the local polynomial's degree ("loo" on the engine's path)
    """
    is_loo = isinstance(bandwidth, str) and bandwidth == "loo"
    if not model._uses_engine():
        if is_loo and sample_weight is not None:
            return weighted_loo_scale(model, X, Y, sample_weight)
        if is_loo:
            return width_search.loo_bandwidth(
                X,
                Y,
                dtype=model._dtype(),
                device=model._device(),
                verbose=model.verbose,
            )
        if isinstance(bandwidth, str) and sample_weight is not None:
            return weighted_rule_bandwidth(X, sample_weight, bandwidth)
        return regression.resolve_bandwidth(bandwidth, X)
    local = _engine()
    kinds, counts = model.var_type_, model._n_categories()
    if is_loo:
        return engine_loo_widths(model, X, Y, sample_weight, degree)
    if isinstance(bandwidth, str):
        if sample_weight is not None:
            return weighted_default_widths(X, kinds, counts, sample_weight, bandwidth)
        return np.asarray(local.default_widths(X, kinds, counts, bandwidth), dtype=np.float64)
    if isinstance(bandwidth, Real) and set(kinds) - {"c"}:
        # one number is a width for the continuous columns; categories keep their default
        widths = np.asarray(local.default_widths(X, kinds, counts, "scott"), dtype=np.float64)
        widths[[k == "c" for k in kinds]] = check_bandwidth(bandwidth, 1)[0]
        return widths
    return np.asarray(local.check_widths(bandwidth, kinds, counts), dtype=np.float64)


def _loo_options(model, sample_weight) -> dict:
    """The keywords of the engine's LOO calls for ``model``'s training data."""
    return dict(
        var_type=model._kinds(),
        n_categories=model._n_categories(),
        kernel=model._kernel(),
        sample_weight=sample_weight,
        missing=model._missing(),
        device=model._device(),
    )


def engine_loo_widths(model, X, Y, sample_weight, degree) -> np.ndarray:
    """Every h and lambda learned by the engine's (weighted) LOO MSE of this degree's fit
    (:func:`nbattn.local.widths.local_loo_widths`)."""
    from ..local.widths import local_loo_widths

    options = _loo_options(model, sample_weight)
    return np.asarray(local_loo_widths(X, Y, degree, **options), dtype=np.float64)


def engine_loo_loss(model, X, Y, widths, sample_weight, degree) -> float:
    """The engine's (weighted) LOO MSE at ``widths``
    (:func:`nbattn.local.engine.local_loo_loss`)."""
    options = _loo_options(model, sample_weight)
    return float(_engine().local_loo_loss(X, Y, widths, degree, **options))


def weighted_loo_scale(model, X, Y, sample_weight) -> np.ndarray:
    """Weighted Scott widths times the one factor minimising the weighted LOO MSE.

    The weighted form of :func:`nbattn.smoothing.width_search.loo_bandwidth`: the same
    search over log-scale factors (:func:`nbattn.smoothing.search.minimize_log_scale`,
    the same grid and tolerance) of the criterion
    ``sum_i s_i (y_i - f_{-i}(x_i))^2 / sum_i s_i``, where f_{-i} leaves row i
    out and weighs every other key by its s_j
    (:func:`nbattn.local.engine.local_loo_loss` at degree 0).
    """
    local = _engine()
    base = weighted_rule_bandwidth(X, sample_weight, "scott")

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


def weighted_default_widths(X, var_type, n_categories, sample_weight, rule) -> np.ndarray:
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
        sigma = weighted_spread(X[present, j : j + 1], sample_weight[present])[0]
        out[j] = factor * (sigma if sigma > 0 else 1.0)
    return out


def weighted_spread(X, w) -> np.ndarray:
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


def weighted_rule_bandwidth(X, sample_weight, rule) -> np.ndarray:
    """A rule's widths from the weighted spread, with n = sum of weights.

    ``sigma_d^2 = sum_j s_j (x_jd - m_d)^2 / (sum_j s_j - 1)`` with the weighted
    mean m_d: for integer weights exactly the spread of the repeated rows (the
    columns are divided by a power of two near their largest magnitude first,
    as in :func:`nbattn.smoothing.regression.feature_spread`).
    """
    w = np.asarray(sample_weight, dtype=np.float64)
    return regression.rule_bandwidth(weighted_spread(X, w), float(w.sum()), rule)
