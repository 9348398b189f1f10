"""The widths an estimator resolves at fit: ``bandwidth`` -> ``bandwidth_``.

"loo" learns every width on its own, an h per continuous column and an l per
categorical one, by the engine's leave-one-out MSE
(:func:`nbattn.local.widths.loo_widths`; it starts with the one-factor search, so
it is never worse than "loo_scale"). "loo_scale" multiplies Scott's widths by the
one factor minimising that criterion (the categorical columns' l at the rule's).
Otherwise two paths, as for prediction
(:class:`nbattn.estimators.prediction.PoolingPrediction`):

* the Gaussian fast path (all-continuous data, the Gaussian kernel, no
  missing values): "loo_scale" is :func:`nbattn.smoothing.width_search.loo_scale`
  (with sample weights :func:`engine_loo_scale`), a rule name the rule on the
  spread, a number or an array the widths as given;
* the mixed-type engine's path (categorical columns, missing values, another
  kernel, a local polynomial): "loo_scale" is :func:`engine_loo_scale`, a rule
  gives the continuous columns its widths and the categorical ones the rule's
  lambda (:func:`nbattn.local.problem.rule_widths`).

With sample weights the rules use the weighted spread and n = Kish's effective
number of rows (:func:`effective_size`), so that multiplying every weight by one
constant changes no width, and "loo" weighs each left-out term.

A regressor's "aicc" learns every width by the improved Akaike criterion of Hurvich,
Simonoff and Tsai (1998), ``log sigma2 + (1 + tr(H)/n) / (1 - (tr(H) + 2)/n)``, on the
engine's fit of this degree at the training rows (:func:`engine_aicc_widths`; the
search starts at the (weighted) Scott rule and is never worse than it).

A classifier's "loo" and "loo_scale" minimise the leave-one-out log-loss of its
probabilities smoothed towards the class frequencies instead
(:func:`fit_class_widths`), on the engine on every path.

The model passed in answers the questions of
:class:`~nbattn.estimators.prediction.PoolingPrediction` (its column kinds, kernel,
device, ...) for the training data being fitted.
"""

from __future__ import annotations

import dataclasses
import math
from numbers import Real

import numpy as np

from .. import config
from .._core.numeric import power_of_two_scale, within_squares
from .._core.progress import FitProgress
from .._core.validation import check_bandwidth, check_choice
from ..smoothing import regression, width_search
from ..smoothing.regression import effective_size, weighted_spread
from ..smoothing.search import minimize_log_scale

__all__ = [
    "engine_aicc_widths",
    "engine_loo_loss",
    "effective_size",
    "engine_loo_widths",
    "fit_class_widths",
    "check_neighbour_columns",
    "fit_widths",
    "fit_neighbour_counts",
    "given_neighbour_widths",
    "refuse_bool_counts",
    "weighted_default_widths",
    "weighted_loo_scale",
    "weighted_rule_bandwidth",
    "weighted_spread",
]


def fit_widths(model, bandwidth, X, Y, sample_weight=None, degree=0) -> np.ndarray:
    """Per-feature widths (h for continuous columns, lambda for categorical ones).

    Parameters
    ----------
    model : a nbattn estimator being fitted (its ``var_type_`` and ``categories_`` set)
    bandwidth : its ``bandwidth`` parameter: "loo", "loo_scale", "aicc" (a regressor's), a
        rule name, a number or an array
    X : ndarray (n, d) float64, the checked training rows
    Y : ndarray (n, m) float64, the values pooled (targets or one-hot labels)
    sample_weight : ndarray (n,) of positive weights, or None
    degree : int, the local polynomial's degree (the engine's LOO fit)
    """
    if model._bandwidth_type() != "fixed":
        from ..local.neighbour_search import neighbour_loo_widths

        spec = model._local_spec()
        search = lambda: neighbour_loo_widths(spec, X, Y, degree, sample_weight)[0]  # noqa: E731
        return fit_neighbour_counts(model, spec, X, bandwidth, "loo", search)
    if isinstance(bandwidth, str) and bandwidth == "aicc":
        return engine_aicc_widths(model, X, Y, sample_weight, degree)
    if _is_loo(bandwidth, X):
        fast = not model._uses_engine()
        if bandwidth == "loo":
            return engine_loo_widths(model, X, Y, sample_weight, degree)
        if not fast or sample_weight is not None:
            return engine_loo_scale(model, X, Y, sample_weight, degree)
        return width_search.loo_scale(
            X, Y, dtype=model._dtype(), device=model._device(), verbose=model.verbose
        )
    if not model._uses_engine():
        if isinstance(bandwidth, str) and sample_weight is not None:
            return weighted_rule_bandwidth(X, sample_weight, bandwidth)
        return regression.resolve_bandwidth(bandwidth, X, "X")
    from ..local.problem import check_widths, rule_widths

    spec = model._local_spec()
    if isinstance(bandwidth, str):
        if sample_weight is not None:
            return weighted_default_widths(X, spec, sample_weight, bandwidth)
        return rule_widths(spec, X, bandwidth)
    if isinstance(bandwidth, Real) and set(spec.var_type) - {"c"}:
        # one number is a width for the continuous columns; categories keep their default
        widths = rule_widths(spec, X, "scott")
        widths[spec.continuous] = check_bandwidth(bandwidth, 1)[0]
        return widths
    return check_widths(bandwidth, spec.var_type, spec.counts)


def fit_neighbour_counts(model, spec, X, bandwidth, search_name, search) -> np.ndarray:
    """A nearest-neighbour model's widths (:mod:`nbattn.local.neighbours`) at fit:
    ``bandwidth == search_name`` ("loo" for a regressor, "cv_ml" for a density) runs
    ``search()``, the search of the counts k and the categorical l, else
    :func:`given_neighbour_widths`. The other names (rules, "loo_scale", "aicc", "cv_ls")
    measure fixed widths: refused; so are ``rtol > 0`` and ``missing="marginalize"``."""
    from ..local.problem import check_bandwidth_type

    kind = spec.bandwidth_type
    check_bandwidth_type(kind, rtol=spec.rtol, missing=model._missing() == "marginalize")
    names = model._column_names()
    if isinstance(bandwidth, str):
        if bandwidth != search_name:
            raise ValueError(
                f"bandwidth={bandwidth!r} chooses fixed widths; with bandwidth_type={kind!r} "
                f'bandwidth is "{search_name}" (the counts k by leave-one-out), an integer k, '
                "or an array (k per continuous column, l per categorical one)"
            )
        check_neighbour_columns(X, spec.var_type, names)
        return search()
    return given_neighbour_widths(spec, X, bandwidth, names)


def given_neighbour_widths(spec, X, bandwidth, names, name="bandwidth") -> np.ndarray:
    """Given nearest-neighbour widths on checked rows X (n, d): one integer is k for every
    continuous column (the categorical columns at their rule's l), an array holds k per
    continuous column and l per categorical one; checked against the data at fit (k in
    [1, n - 1], every continuous column with two distinct values, errors naming the
    column ``names[j]``), so that a fitted model predicts."""
    from ..local.neighbours import check_neighbour_counts
    from ..local.problem import check_widths, rule_lambdas

    refuse_bool_counts(bandwidth, name)
    continuous = [n for n, kind in zip(names, spec.var_type) if kind == "c"]
    if isinstance(bandwidth, Real):
        widths = rule_lambdas(spec.var_type, spec.counts, X.shape[0])
        counts = check_neighbour_counts([bandwidth] * len(continuous), X.shape[0], name, continuous)
        widths[spec.continuous] = counts
    else:
        widths = check_widths(
            bandwidth, spec.var_type, spec.counts, name, bandwidth_type=spec.bandwidth_type
        )
    check_neighbour_counts(widths[spec.continuous], X.shape[0], name, continuous)
    check_neighbour_columns(X, spec.var_type, names)
    return widths


def refuse_bool_counts(bandwidth, name="bandwidth") -> None:
    """A ValueError where ``bandwidth`` is a bool or holds one (numpy reads True as 1)."""
    values = bandwidth if isinstance(bandwidth, (list, tuple, np.ndarray)) else [bandwidth]
    if any(isinstance(v, (bool, np.bool_)) for v in np.asarray(values, dtype=object).ravel()):
        raise ValueError(f"{name} must be an integer k or an array of them, got {bandwidth!r}")


def check_neighbour_columns(X, var_type, names) -> None:
    """A ValueError naming the first continuous column of X that holds one value only:
    it has no nearest-neighbour width (every distance to another row is 0)."""
    for j, kind in enumerate(var_type):
        if kind == "c" and X.shape[0] and not np.any(X[:, j] != X[0, j]):
            raise ValueError(
                f"column {names[j]!r} holds one value only: it has no nearest-neighbour "
                "width (a nearest-neighbour width needs two distinct values)"
            )


def _is_loo(bandwidth, X) -> bool:
    """Whether ``bandwidth`` names a leave-one-out search; refused on fewer than 2 rows."""
    if not (isinstance(bandwidth, str) and bandwidth in ("loo", "loo_scale")):
        return False
    if X.shape[0] < 2:
        raise ValueError(
            f"bandwidth={bandwidth!r} needs at least 2 samples (leave-one-out), got "
            f"n_samples={X.shape[0]} (rows of weight 0 are left out)"
        )
    return True


def fit_class_widths(model, bandwidth, X, Y, sample_weight=None) -> tuple[np.ndarray, float]:
    """A classifier's ``(bandwidth_, prior_count_)`` for one-hot labels Y (n, n_classes).

    "loo" learns every width, "loo_scale" one factor of Scott's h, by the smoothed
    leave-one-out log-loss (:func:`nbattn.local.class_widths.class_loo_widths`), with
    the prior alpha of the class frequencies in rows; otherwise the widths of
    :func:`fit_widths` and alpha = 0 (the plain Nadaraya-Watson probabilities).
    """
    if not _is_loo(bandwidth, X):
        return fit_widths(model, bandwidth, X, Y, sample_weight), 0.0
    from ..local.class_widths import class_loo_widths

    spec = model._local_spec()
    sample_weight, init = _scaled_weights(X, spec, sample_weight)
    return class_loo_widths(
        spec,
        X,
        Y,
        sample_weight=sample_weight,
        init=init,
        per_column=bandwidth == "loo",
        verbose=model.verbose,
    )


def _scaled_weights(X, spec, sample_weight):
    """``(sample_weight, init)`` of a search on the engine: the weights with the largest
    brought to [1, 2) (exact: weights times a power of two fit the same to the bit, where
    the engine's log w would change in the last bits) and the weighted rule's widths
    (None without weights: the search's own rule)."""
    if sample_weight is None:
        return None, None
    sample_weight = sample_weight / power_of_two_scale(sample_weight.max())
    return sample_weight, weighted_default_widths(X, spec, sample_weight, "scott")


def engine_aicc_widths(model, X, Y, sample_weight, degree) -> np.ndarray:
    """Every h and lambda learned by AICc of this degree's fit
    (:func:`nbattn.local.aicc.aicc_widths` on the checked training data), from the
    (weighted) Scott rule."""
    from ..local.aicc import aicc_widths

    spec = model._local_spec()
    sample_weight, init = _scaled_weights(X, spec, sample_weight)
    return aicc_widths(
        spec, X, Y, degree, sample_weight=sample_weight, init=init, verbose=model.verbose
    )


def engine_loo_widths(model, X, Y, sample_weight, degree) -> np.ndarray:
    """Every h and lambda learned by the engine's (weighted) LOO MSE of this degree's fit
    (:func:`nbattn.local.widths.loo_widths` on the checked training data)."""
    from ..local.widths import loo_widths

    return loo_widths(
        model._local_spec(),
        X,
        Y,
        degree,
        sample_weight=sample_weight,
        verbose=model.verbose,
        subsample=getattr(model, "loo_subsample", None),
    )


def engine_loo_loss(model, X, Y, widths, sample_weight, degree) -> float:
    """The engine's (weighted) LOO MSE at ``widths`` (:func:`nbattn.local.engine.loo_loss`
    on the checked training data), exact whatever the model's ``rtol``."""
    spec = dataclasses.replace(model._local_spec(), rtol=0.0)
    return _loo_loss(spec, X, Y, widths, sample_weight, degree)


def _loo_loss(spec, X, Y, widths, sample_weight, degree) -> float:
    from ..local.engine import loo_loss
    from ..local.problem import check_widths, layout

    widths = check_widths(widths, spec.var_type, spec.counts)
    problem = layout(spec, X, X, Y, widths, degree, sample_weight=sample_weight, exclude_self=True)
    return loo_loss(problem)


def engine_loo_scale(model, X, Y, sample_weight, degree) -> np.ndarray:
    """Scott's widths with every h times the one factor minimising the engine's (weighted)
    LOO MSE of this degree's fit, the categorical columns' l at the rule's.

    The engine's form of :func:`nbattn.smoothing.width_search.loo_bandwidth` (weights, other
    kernels, categorical columns, local polynomials): the same search over log-scale
    factors (:func:`nbattn.smoothing.search.minimize_log_scale`, the same grid and
    tolerance) of ``sum_i s_i (y_i - f_{-i}(x_i))^2 / sum_i s_i``, where f_{-i} leaves row
    i out and weighs every other key by its s_j (:func:`nbattn.local.engine.loo_loss`).
    """
    from ..local.problem import rule_widths

    spec = model._local_spec()
    if sample_weight is None:
        base = rule_widths(spec, X, "scott")
    else:
        base = weighted_default_widths(X, spec, sample_weight, "scott")
    cont = spec.continuous
    if not cont.any():
        return base

    def scaled(t):
        widths = base.copy()
        widths[cont] = base[cont] * math.exp(t)
        return widths

    Y = within_squares(Y)  # the squared errors of y beyond 2**+-400 would overflow or vanish

    def criterion(t):
        return _loo_loss(spec, X, Y, scaled(t), sample_weight, degree)

    def report(stage, t, value):  # the model's verbose: a step per evaluation
        log.step(f"{stage}: the continuous widths at {math.exp(t):.4g} x Scott's")

    with FitProgress(model.verbose, "loo_scale", total=len(config.LOO_GRID), unit="width") as log:
        result = minimize_log_scale(
            criterion,
            np.log(np.sort(np.asarray(config.LOO_GRID, dtype=np.float64))),
            rtol=config.LOO_RTOL,
            extend=config.LOO_EXTEND_DECADES * math.log(10.0),
            anchor=0.0,
            report=report if log.enabled else None,
        )
        log.note(f"the continuous widths at {math.exp(result.t):.4g} x Scott's")
    if spec.rtol > 0.0:  # searched on the pruned criterion: never worse than the rule, exactly
        exact = dataclasses.replace(spec, rtol=0.0)
        found, rule = (
            _loo_loss(exact, X, Y, w, sample_weight, degree) for w in (scaled(result.t), base)
        )
        if not found < rule:
            return base
    return scaled(result.t)


def weighted_loo_scale(model, X, Y, sample_weight) -> np.ndarray:
    """Weighted Scott widths times the one factor minimising the weighted LOO MSE
    (:func:`engine_loo_scale` at degree 0, on all-continuous data)."""
    return engine_loo_scale(model, X, Y, sample_weight, 0)


def weighted_default_widths(X, spec, sample_weight, rule) -> np.ndarray:
    """:func:`nbattn.local.problem.rule_widths` with the weighted spread and n the effective
    number of rows, for the columns of ``spec`` (a :class:`nbattn.local.problem.LocalSpec`).

    The engine's rule: ``h_c = factor(n_eff, d) sigma_c`` over all d columns
    (:func:`weighted_spread`, :func:`effective_size`) and the categorical columns'
    :func:`nbattn.local.problem.rule_lambdas` at n_eff. Unchanged when every weight is
    multiplied by one constant; equal weights give the unweighted rule. Missing entries
    are left out of the spreads.
    """
    from ..local.problem import rule_lambdas

    w = np.asarray(sample_weight, dtype=np.float64)
    check_choice(rule, "bandwidth rule", sorted(regression.BANDWIDTH_RULES))
    n_eff = effective_size(w)
    out = rule_lambdas(spec.var_type, spec.n_categories, n_eff, rule)
    factor = regression.BANDWIDTH_RULES[rule](n_eff, X.shape[1])
    for j, kind in enumerate(spec.var_type):
        if kind == "c":
            present = ~np.isnan(X[:, j])
            sigma = weighted_spread(X[present, j : j + 1], w[present])[0]
            out[j] = factor * (sigma if sigma > 0 else 1.0)
    return out


def weighted_rule_bandwidth(X, sample_weight, rule) -> np.ndarray:
    """A rule's widths from the weighted spread, with n Kish's effective number of rows.

    ``h_d = factor(n_eff, d) sigma_d`` (:func:`weighted_spread`, :func:`effective_size`):
    the same for weights ``c s`` at any c > 0, and the unweighted rule for equal weights.
    Weights are not repetitions here: weights 2, 2, 2 give n_eff = 3, where each row
    given twice is 6 rows (a rule needs a count, and only a scale-free one makes
    weights given as shares, summing to 1, mean what they say).
    """
    w = np.asarray(sample_weight, dtype=np.float64)
    return regression.rule_bandwidth(weighted_spread(X, w), effective_size(w), rule)
