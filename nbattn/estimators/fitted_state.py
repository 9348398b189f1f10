"""What a fitted nbattn estimator holds, checked without scikit-learn.

A model file's checksum detects accidents, not edits, so the state read from
one is validated before anything predicts with it. :mod:`nbattn.estimators.base`
does that on the rebuilt estimator (``check_fitted_state``, through
scikit-learn's parameter constraints); this module does the same checks on
the plain content of a file (the class name, the parameters, the fitted
attributes by name), which is what :mod:`nbattn.persistence.predictor` predicts from in a
process that never imports scikit-learn.

The parameter tables (:data:`ESTIMATORS`, :data:`DEFAULTS`, :data:`CLASSIFIERS`)
are read from :data:`nbattn.estimators.spec.SPECS`, where the estimators'
``_parameter_constraints`` come from too; the fitted-attribute checks below are
the one copy of those, for both readers.
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from .._core.columns import check_categories, check_var_type, n_categories
from .._core.validation import check_bandwidth
from ..local.class_widths import ALPHA_HIGH_PER_ROW, ALPHA_LOW
from ..local.problem import check_widths
from .partially_linear_prediction import smooth_part
from .spec import DENSITY_SPECS, SPECS, is_int, is_real

__all__ = [
    "CLASSIFIERS",
    "CONDITIONALS",
    "DEFAULTS",
    "DENSITIES",
    "ESTIMATORS",
    "PARTIALLY_LINEAR",
    "RESULT_ATTRIBUTES",
    "check_attributes",
    "check_fitted_state",
    "check_params",
    "check_table_attributes",
    "require",
    "require_array",
    "require_bandwidth",
    "require_bool",
    "require_int",
]

#: estimator class name -> {parameter: its :class:`nbattn.estimators.spec.Param`}, the
#: parameters a model file saves, in the order of the class's ``__init__``
ESTIMATORS = {name: {p.name: p for p in spec.params if p.saved} for name, spec in SPECS.items()}
#: attributes that hold results of a method run after fit (``significance_test``'s table,
#: about the data it was given), not the fitted model: model files do not save them
RESULT_ATTRIBUTES = frozenset({"significance_"})
#: the estimators that predict class labels
CLASSIFIERS = tuple(name for name, spec in SPECS.items() if spec.classifier)
#: estimator class name -> its ``__init__`` defaults: a parameter a model file lacks
#: (one written before the parameter existed) takes its default, as in the estimator
DEFAULTS = {name: spec.defaults() for name, spec in SPECS.items()}
#: the density estimators (:data:`nbattn.estimators.spec.DENSITY_SPECS`): no ``y_fit_`` of
#: targets to pool; the conditional ones hold a response y (``y_fit_`` (n,), ``y_type_``,
#: ``y_categories_``, ``y_bandwidth_``)
DENSITIES = tuple(DENSITY_SPECS)
CONDITIONALS = ("ConditionalKernelDensity", "KernelQuantileRegressor")
#: the partially linear model: x_lin . coef_ + g(z), g pooled over the z columns only
PARTIALLY_LINEAR = "PartiallyLinearRegressor"


def check_params(estimator: str, params: dict) -> dict:
    """Every parameter of ``estimator``: ``params`` over the defaults (:data:`DEFAULTS`).

    Raises ValueError naming an unknown estimator, the first parameter that
    ``estimator`` does not have, or the first whose value it does not allow.
    """
    allowed = ESTIMATORS.get(estimator) if isinstance(estimator, str) else None
    if allowed is None:
        raise ValueError(
            f"estimator {estimator!r} is not available in this nbattn (known: {sorted(ESTIMATORS)})"
        )
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"parameters {unknown} are not parameters of nbattn.{estimator}")
    params = {**DEFAULTS[estimator], **params}
    for name, param in allowed.items():
        param.check(params[name], estimator)
    return params


# ----------------------------------------------------------------------------- attributes


def require(state: dict, name: str, estimator: str = "the model"):
    """The fitted attribute ``name`` of ``state`` (an estimator's ``vars``), or a ValueError."""
    if name not in state:
        raise ValueError(f"{estimator}: fitted attribute {name!r} is missing")
    return state[name]


def require_int(state, name, minimum, estimator="the model") -> int:
    value = require(state, name, estimator)
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def require_bool(state, name, estimator="the model") -> bool:
    value = require(state, name, estimator)
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def require_array(state, name, kinds, shape, allow_nan=False, estimator="the model"):
    """The attribute ``name``: an ndarray of a dtype kind in ``kinds`` and ``shape``
    (None matches any length), finite when it is float (NaN allowed with ``allow_nan``)."""
    value = require(state, name, estimator)
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
    if value.dtype.kind == "f":
        bad = np.isinf(value) if allow_nan else ~np.isfinite(value)
        if bad.any():
            raise ValueError(f"{name} holds NaN or infinity")
    return value


def check_table_attributes(state, X, estimator="the model") -> set:
    """var_type_, categories_ (codes of X_fit_ within them) and sample_weight_ of
    ``state`` for the training rows X; returns their names."""
    d = X.shape[1]
    kinds = require(state, "var_type_", estimator)
    if not isinstance(kinds, str):
        raise ValueError(f"var_type_ must be a string, got {kinds!r}")
    check_var_type(kinds, d)
    cats = require(state, "categories_", estimator)
    if not isinstance(cats, list) or len(cats) != d:
        raise ValueError(f"categories_ must be a list of {d} entries")
    for j, (kind, c) in enumerate(zip(kinds, cats)):
        if kind == "c":
            if c is not None:
                raise ValueError(f"categories_[{j}] must be None for a continuous column")
            continue
        plain = (bool, int, float, str)
        if not isinstance(c, list) or not c or not all(isinstance(v, plain) for v in c):
            raise ValueError(f"categories_[{j}] must be a non-empty list of strings or numbers")
        check_categories(c, f"categories_[{j}]")  # what fit makes: distinct, one kind, no NaN
        codes = X[:, j][~np.isnan(X[:, j])]
        if not np.all((codes == np.round(codes)) & (codes >= 0) & (codes < len(c))):
            raise ValueError(f"X_fit_ column {j} holds codes outside categories_[{j}]")
    sw = require(state, "sample_weight_", estimator)
    if sw is not None:
        sw = require_array(state, "sample_weight_", "f", (X.shape[0],), estimator=estimator)
        if not np.all(sw > 0):
            raise ValueError("sample_weight_ must be positive")
    return {"var_type_", "categories_", "sample_weight_"}


def require_bandwidth(state, parameter, kinds: str, estimator="the model"):
    """bandwidth_ (n_features,) float64: the widths the engine takes
    (:func:`nbattn.local.problem.check_widths`: a positive normal width for a continuous
    column, ``0 <= lambda <= (c-1)/c`` for Aitchison-Aitken's unordered kernel over c
    categories, ``0 <= lambda < 1`` for the ordered one); equal to a numeric
    ``parameter`` (a single number: on the continuous columns)."""
    d = state["n_features_in_"]
    h = require_array(state, "bandwidth_", "f", (d,), estimator=estimator)
    continuous = np.array([k == "c" for k in kinds])
    check_widths(h, kinds, n_categories(state["categories_"]), name="bandwidth_")
    if parameter is not None and not isinstance(parameter, str):
        if isinstance(parameter, Real) and not continuous.all():
            expected, got = np.full(int(continuous.sum()), float(parameter)), h[continuous]
        else:
            expected, got = np.asarray(parameter, dtype=np.float64).reshape(-1), h
            if continuous.all():
                expected = check_bandwidth(parameter, d)
        if not np.array_equal(np.broadcast_to(expected, got.shape), got):
            raise ValueError("bandwidth_ does not match the numeric bandwidth parameter")
    return h


def _table_attributes(state, params, estimator) -> set:
    """n_features_in_, X_fit_ (non-empty), the table's attributes, feature_names_in_."""
    d = require_int(state, "n_features_in_", 1, estimator)
    allow_nan = params.get("missing", "error") != "error"
    X = require_array(state, "X_fit_", "f", (None, d), allow_nan=allow_nan, estimator=estimator)
    if X.shape[0] < 1:
        raise ValueError(f"X_fit_ must be non-empty, got shape {X.shape}")
    allowed = {"n_features_in_", "X_fit_"}
    allowed |= check_table_attributes(state, X, estimator)
    if "feature_names_in_" in state:
        names = require_array(state, "feature_names_in_", "OU", (d,), estimator=estimator)
        if not all(isinstance(v, str) for v in names):
            raise ValueError("feature_names_in_ must hold strings")
        allowed.add("feature_names_in_")
    return allowed


def _common_attributes(state, params, estimator) -> set:
    allowed = _table_attributes(state, params, estimator)
    X = state["X_fit_"]
    y = require_array(state, "y_fit_", "f", (X.shape[0], None), estimator=estimator)
    if y.shape[1] < 1:
        raise ValueError(f"X_fit_ and y_fit_ must be non-empty, got shapes {X.shape}, {y.shape}")
    return allowed | {"y_fit_"}


def _density_widths(state, parameter, kinds, counts, name, estimator) -> np.ndarray:
    """The fitted widths ``name`` of a density's columns ``kinds``: inside each kernel's
    range (:func:`nbattn.local.problem.check_widths`), and equal to a numeric ``parameter``
    (one number: every column's)."""
    h = require_array(state, name, "f", (len(kinds),), estimator=estimator)
    check_widths(h, kinds, counts, name=name)
    if parameter is not None and not isinstance(parameter, str):
        expected = np.asarray(parameter, dtype=np.float64).reshape(-1)
        if expected.size not in (1, h.size) or not np.array_equal(
            np.broadcast_to(expected, h.shape), h
        ):
            raise ValueError(f"{name} does not match the numeric bandwidth parameter")
    return h


def _density_attributes(state, params, estimator) -> set:
    """A density's fitted state: its table and widths; a conditional one's response y too."""
    allowed = _table_attributes(state, params, estimator) | {"bandwidth_"}
    if estimator not in CONDITIONALS:
        counts = n_categories(state["categories_"])
        _density_widths(
            state, params["bandwidth"], state["var_type_"], counts, "bandwidth_", estimator
        )
        return allowed
    n = state["X_fit_"].shape[0]
    kind = require(state, "y_type_", estimator)
    if kind not in ("c", "u", "o"):
        raise ValueError(f"y_type_ must be 'c', 'u' or 'o' (y's kind), got {kind!r}")
    y = require_array(state, "y_fit_", "f", (n,), estimator=estimator)
    cats = require(state, "y_categories_", estimator)
    if kind == "c":
        if cats is not None:
            raise ValueError("y_categories_ must be None for a continuous y")
    else:
        plain = (bool, int, float, str)
        if not isinstance(cats, list) or not cats or not all(isinstance(v, plain) for v in cats):
            raise ValueError("y_categories_ must be a non-empty list of strings or numbers")
        check_categories(cats, "y_categories_")
        if not np.all((y == np.round(y)) & (y >= 0) & (y < len(cats))):
            raise ValueError("y_fit_ holds codes outside y_categories_")
    y_width = require(state, "y_bandwidth_", estimator)
    if not is_real(y_width):
        raise ValueError(f"y_bandwidth_ must be a number, got {y_width!r}")
    counts = n_categories([cats, *state["categories_"]])
    h = require_array(state, "bandwidth_", "f", (state["n_features_in_"],), estimator=estimator)
    joint = np.concatenate(([float(y_width)], h))
    check_widths(joint, kind + state["var_type_"], counts, name="(y_bandwidth_, *bandwidth_)")
    _density_widths(
        state, params["bandwidth"], state["var_type_"], counts[1:], "bandwidth_", estimator
    )
    given = params["y_bandwidth"]
    if given is not None and not isinstance(given, str) and float(y_width) != float(given):
        raise ValueError("y_bandwidth_ does not match the y_bandwidth parameter")
    return allowed | {"y_fit_", "y_type_", "y_categories_", "y_bandwidth_"}


def _regressor_attributes(state, estimator) -> set:
    m = require_int(state, "n_outputs_", 1, estimator)
    if state["y_fit_"].shape[1] != m:
        raise ValueError(f"y_fit_ has {state['y_fit_'].shape[1]} columns but n_outputs_ is {m}")
    two_d = require_bool(state, "outputs_2d_", estimator)
    if not two_d and m != 1:
        raise ValueError(f"outputs_2d_ is False but n_outputs_ is {m}")
    return {"n_outputs_", "outputs_2d_"}


def _learned_attributes(state, params, estimator) -> set:
    if state["X_fit_"].shape[0] < 2:
        raise ValueError("X_fit_ of a LearnedKernelRegressor must have at least 2 rows")
    d = state["n_features_in_"]
    if params["metric"] == "full":
        k = d if params["n_components"] is None else params["n_components"]
        require_array(state, "components_", "f", (k, d), estimator=estimator)
        fitted = "components_"
    else:
        require_bandwidth(state, None, state["var_type_"], estimator)
        fitted = "bandwidth_"
    loss = state.get("loss_")
    if not is_real(loss) or not loss >= 0:
        raise ValueError(f"loss_ must be a non-negative number, got {loss!r}")
    require_array(state, "loss_curve_", "f", (None,), estimator=estimator)
    require_int(state, "n_iter_", 0, estimator)
    return {fitted, "loss_", "loss_curve_", "n_iter_"}


def _classifier_attributes(state, params, estimator) -> set:
    classes = require_array(state, "classes_", "biufUO", (None,), estimator=estimator)
    if classes.size < 2 or len(np.unique(classes)) != classes.size:
        raise ValueError(f"classes_ must hold at least 2 distinct labels, got {classes!r}")
    Y = state["y_fit_"]
    if Y.shape[1] != classes.size:
        raise ValueError(f"y_fit_ has {Y.shape[1]} columns but classes_ has {classes.size}")
    if not (np.isin(Y, (0.0, 1.0)).all() and (Y.sum(axis=1) == 1.0).all()):
        raise ValueError("y_fit_ of a classifier must be one-hot (one 1 per row, else 0)")
    require_bandwidth(state, params["bandwidth"], state["var_type_"], estimator)
    alpha = require(state, "prior_count_", estimator)
    high = ALPHA_HIGH_PER_ROW * state["X_fit_"].shape[0]  # the most n_eff <= n rows allow
    try:
        ok = is_real(alpha) and (float(alpha) == 0.0 or ALPHA_LOW <= float(alpha) <= high)
    except OverflowError:  # an integer beyond float64 (an edited file)
        ok = False
    if not ok:
        raise ValueError(
            f"prior_count_ must be 0 or a number in [{ALPHA_LOW:g}, {high:g}] (the prior a "
            f"fit of {state['X_fit_'].shape[0]} rows learns), got {alpha!r}"
        )
    if alpha > 0.0 and params["bandwidth"] not in ("loo", "loo_scale"):
        raise ValueError(
            f"prior_count_ is {alpha!r} but bandwidth={params['bandwidth']!r} learns none "
            "(only 'loo' and 'loo_scale' do)"
        )
    return {"classes_", "bandwidth_", "prior_count_"}


def check_fitted_state(estimator: str, params: dict, state: dict) -> dict:
    """Validate the content of a fitted estimator: class name, parameters, attributes.

    The checks of :func:`nbattn.estimators.check_fitted_state` on plain data:
    ``estimator`` one of :data:`ESTIMATORS`; ``params`` exactly its
    parameters, each allowed (a ``kernel`` of ``"evil"`` is refused); every
    required fitted attribute in ``state`` present, with the right type,
    dtype and shape, finite, and consistent with the others (``X_fit_`` rows =
    ``y_fit_`` rows, ``n_features_in_`` = ``X_fit_`` columns = the length of
    ``bandwidth_`` and ``feature_names_in_``, ``classes_`` = the one-hot
    columns of ``y_fit_``, ``components_`` (n_components, n_features), a
    numeric ``bandwidth`` parameter = ``bandwidth_``); and nothing else held.

    Returns every parameter (``params`` over :data:`DEFAULTS`).

    Raises
    ------
    ValueError
        naming the parameter or attribute at fault.
    """
    params = check_params(estimator, params)
    check_attributes(estimator, params, state)
    return params


def check_attributes(estimator: str, params: dict, state: dict) -> None:
    """The attribute half of :func:`check_fitted_state`: ``state`` against the
    estimator ``estimator`` with (already checked) parameters ``params``.

    :func:`nbattn.estimators.check_fitted_state` calls it after scikit-learn has
    checked the parameters (an in-memory estimator may hold a
    ``numpy.random.Generator`` as ``random_state``, which no model file does).
    """
    if estimator in DENSITIES:
        allowed = _density_attributes(state, params, estimator)
    elif estimator in CLASSIFIERS:
        allowed = _common_attributes(state, params, estimator)
        allowed |= _classifier_attributes(state, params, estimator)
    else:
        allowed = _common_attributes(state, params, estimator)
        allowed |= _regressor_attributes(state, estimator)
        if estimator == PARTIALLY_LINEAR:
            allowed |= _partially_linear_attributes(state, params, estimator)
        elif estimator == "LearnedKernelRegressor":
            allowed |= _learned_attributes(state, params, estimator)
        else:
            require_bandwidth(state, params["bandwidth"], state["var_type_"], estimator)
            allowed.add("bandwidth_")
    unknown = sorted(set(state) - allowed)
    if unknown:
        raise ValueError(
            f"{estimator}: {unknown[0]!r} is not a fitted attribute of this estimator"
            + (f" (nor are {unknown[1:]})" if len(unknown) > 1 else "")
        )


# ----------------------------------------------------------------------------- partially linear


def _partially_linear_attributes(state, params, estimator) -> set:
    """linear_columns_ (distinct positions of continuous columns, not all), coef_ and
    coef_se_ (p,), bandwidth_ (q,) the widths of y's and g's regressions on z and
    linear_bandwidths_ (p, q) those of the linear columns', both inside the engine's
    ranges for z's kinds; a 1-D target."""
    X = state["X_fit_"]
    d = X.shape[1]
    lin = require_array(state, "linear_columns_", "i", (None,), estimator=estimator)
    p = lin.size
    if not 1 <= p < d or np.unique(lin).size != p or lin.min() < 0 or lin.max() >= d:
        raise ValueError(
            f"linear_columns_ must hold 1 to {d - 1} distinct column positions in [0, {d}), "
            f"got {lin.tolist()}"
        )
    kinds = state["var_type_"]
    if any(kinds[j] != "c" for j in lin):
        raise ValueError("linear_columns_ must name continuous columns only")
    if np.isnan(X[:, lin]).any():
        raise ValueError("X_fit_ holds NaN in a linear column")
    if state["outputs_2d_"] or state["n_outputs_"] != 1:
        raise ValueError(f"{estimator} fits a 1-D target: outputs_2d_ must be False")
    require_array(state, "coef_", "f", (p,), estimator=estimator)
    se = require_array(state, "coef_se_", "f", (p,), estimator=estimator)
    if np.any(se < 0):
        raise ValueError("coef_se_ must be non-negative")
    view = smooth_part(params, state, with_target=False)
    z_kinds, counts = view._kinds(), view._n_categories()
    h = require_array(state, "bandwidth_", "f", (d - p,), estimator=estimator)
    check_widths(h, z_kinds, counts, name="bandwidth_")
    widths = require_array(state, "linear_bandwidths_", "f", (p, d - p), estimator=estimator)
    for row in widths:
        check_widths(row, z_kinds, counts, name="linear_bandwidths_")
    given = params["bandwidth"]
    if given is not None and not isinstance(given, str):
        # a number or an array is every regression's widths (one number: z's continuous h)
        continuous = np.array([k == "c" for k in z_kinds])
        for row in (h, *widths):
            if isinstance(given, Real):
                ok = np.all(row[continuous] == float(given))
            else:
                ok = np.array_equal(np.asarray(given, dtype=np.float64).reshape(-1), row)
            if not ok:
                raise ValueError("bandwidth_ does not match the numeric bandwidth parameter")
    return {"linear_columns_", "coef_", "coef_se_", "bandwidth_", "linear_bandwidths_"}
