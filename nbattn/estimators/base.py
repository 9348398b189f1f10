"""What every nbattn estimator shares: parameters, input checks, the fit path, diagnostics.

Every estimator here is attention pooling over its training set,

.. math::

    \\hat y(x) = \\sum_j \\operatorname{softmax}_j\\big(s(x, x_j)\\big)\\, y_j ,

with the queries the rows to predict, the keys the training rows ``X_fit_``
and the values ``y_fit_`` (targets, or one-hot labels for the classifier).
They share one base, :class:`_PoolingEstimator`, which does the things that
must not differ between them:

* parameters: each estimator's are written once, in
  :mod:`nbattn.estimators.spec`; the base builds scikit-learn's
  ``_parameter_constraints`` from it (:func:`parameter_constraints`), stores
  them in ``__init__`` (:meth:`_PoolingEstimator._set_params_from`) and checks,
  when a class is created, that its ``__init__`` signature is the spec's;
* input checks: training data through scikit-learn's ``validate_data`` (and
  copied: a fitted model never shares memory with the caller's arrays), plus
  errors that name a DataFrame's date or complex columns and a target's
  missing values; queries checked once per call (:meth:`_PoolingEstimator._check_queries`);
* the device: ``device`` is resolved when a method runs, never stored at
  fit, so a model fitted with ``device="auto"`` on a GPU machine predicts on
  a CPU-only one after ``nbattn.save`` / ``nbattn.load``;
* the computation: every method goes through the functional layer
  (:class:`nbattn.estimators.prediction.PoolingPrediction`, with the model's
  ``dtype`` and ``device``; widths at fit by :mod:`nbattn.estimators.widths`);
  results are float64 whatever ``dtype`` is;
* output shaping: 1-D targets give 1-D predictions.

:func:`check_fitted_state` validates a model rebuilt from a file: its
parameters, its fitted attributes' presence, shapes, dtypes and agreement,
and that it holds nothing else.
"""

from __future__ import annotations

import functools
import inspect
import numbers
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    check_is_fitted,
    check_X_y,
    validate_data,
)

from .._core import columns
from ..smoothing import regression
from . import spec as specs
from .fitted_state import RESULT_ATTRIBUTES, check_attributes
from .prediction import (
    ModelSettings,
    PoolingPrediction,
    refuse_dates_and_complex,
    refuse_missing_targets,
)

__all__ = [
    "SpecEstimator",
    "check_fitted_state",
    "decoded_rows",
    "generator",
    "parameter_constraints",
]


def parameter_constraints(spec: specs.EstimatorSpec) -> dict:
    """scikit-learn's ``_parameter_constraints`` of an estimator, from its spec.

    Each rule of :mod:`nbattn.estimators.spec` becomes scikit-learn's
    constraint objects (``Options`` -> ``StrOptions``, ``IntRange`` and
    ``RealRange`` -> ``Interval``, ...), and None is added where the spec
    allows it.
    """
    out = {}
    for param in spec.params:
        constraints = [c for rule in param.allowed for c in _sklearn_constraints(rule)]
        out[param.name] = constraints + ([None] if param.none else [])
    return out


def _sklearn_constraints(rule) -> list:
    if isinstance(rule, specs.Options):
        return [StrOptions(set(rule.values))]
    if isinstance(rule, specs.IntRange):
        closed = "left" if rule.high is None else "both"
        return [Interval(Integral, rule.low, rule.high, closed=closed)]
    if isinstance(rule, specs.RealRange):
        if rule.below is None:
            return [Interval(Real, rule.low, None, closed="left" if rule.inclusive else "neither")]
        closed = "left" if rule.inclusive else "neither"
        return [Interval(Real, rule.low, rule.below, closed=closed)]
    if isinstance(rule, specs.ArrayLike):
        return ["array-like"]
    if isinstance(rule, specs.Text):
        return [str]
    if isinstance(rule, specs.Verbose):
        return ["verbose"]
    if isinstance(rule, specs.RandomState):
        return ["random_state", np.random.Generator]
    raise TypeError(f"no scikit-learn constraint for the rule {rule!r}")


def _check_signature(cls, spec: specs.EstimatorSpec) -> None:
    """Refuse a class whose ``__init__`` does not take the spec's parameters, in its
    order, with its defaults (the signature is written out for help() and IDEs)."""
    signature = inspect.signature(cls.__init__)
    got = [(p.name, p.default) for p in list(signature.parameters.values())[1:]]
    want = list(spec.defaults().items())
    if got != want:
        raise TypeError(f"{cls.__name__}.__init__ takes {got}; its spec says {want}")


# ----------------------------------------------------------------------------- input checks


# ----------------------------------------------------------------------------- the base


class SpecEstimator(ModelSettings, BaseEstimator):
    """What every nbattn estimator shares, whatever it computes: parameters from its
    spec, the checks of training tables and queries (column kinds from ``var_type``
    or a DataFrame's dtypes, category codes), and how it reads its own settings.

    A subclass named in :data:`nbattn.estimators.spec.SPECS` gets its ``_spec`` and its
    ``_parameter_constraints`` from there; its ``__init__`` lists the spec's
    parameters (checked when the class is created) and stores them with
    :meth:`_set_params_from`.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = specs.SPECS.get(cls.__name__)
        if spec is not None:
            _check_signature(cls, spec)
            cls._spec = spec
            cls._parameter_constraints = parameter_constraints(spec)
        if "fit" in cls.__dict__:
            cls.fit = _all_or_nothing(cls.__dict__["fit"])

    def _set_params_from(self, values: dict) -> None:
        """The body of every ``__init__``: each parameter of the spec stored as given
        (``values`` is the ``__init__``'s ``locals()``; scikit-learn checks at fit)."""
        for param in self._spec.params:
            setattr(self, param.name, values[param.name])

    def _validate_params(self):
        """scikit-learn's checks of the spec's constraints, then ``rtol`` by the library's
        one rule (:func:`nbattn._core.validation.check_rtol`): a bool passes the number
        range (False is 0) but is refused there, so it is refused at fit as at predict."""
        super()._validate_params()
        self._rtol()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = getattr(self, "missing", "error") == "marginalize"
        return tags

    # ---- columns by name or position

    def _column_names(self) -> list:
        """The fitted columns' names: a DataFrame's (as str), else x0, x1, ...
        (scikit-learn's ``get_feature_names_out`` convention)."""
        names = getattr(self, "feature_names_in_", None)
        if names is not None:
            return [str(name) for name in names]
        return [f"x{position}" for position in range(self.n_features_in_)]

    def _column_positions(self, columns, name: str) -> list:
        """``columns`` (one or a list of column names and int positions, negative ones
        counted from the end) as positions, in the order given; a ValueError naming the
        argument ``name`` for an unknown name, a position out of range, another kind of
        value, or a column given twice."""
        names = self._column_names()
        d = len(names)
        if isinstance(columns, (str, bytes)) or specs.is_int(columns):
            columns = [columns]
        positions = []
        for column in columns.tolist() if isinstance(columns, np.ndarray) else columns:
            if specs.is_int(column):
                if not -d <= column < d:
                    raise ValueError(f"{name}: position {column} is out of range for {d} columns")
                position = int(column) % d
            elif isinstance(column, str):
                if column not in names:
                    raise ValueError(f"{name}: {column!r} is not a column of the model ({names})")
                position = names.index(column)
            else:
                raise ValueError(
                    f"{name} holds {column!r}: give column names (str) or positions (int)"
                )
            if position in positions:
                raise ValueError(f"{name}: column {names[position]!r} is listed twice")
            positions.append(position)
        return positions

    # ---- fit-time helpers

    def _validate_training_X(self, X, y, sample_weight=None, unsupervised=False, **kwargs):
        """(X float64 (n, d), y, sample weights or None): the training data checked and copied.

                Column kinds come from ``var_type`` or a DataFrame's dtypes
                (:mod:`nbattn._core.columns`). All-continuous numeric data goes through
                scikit-learn's ``validate_data`` as it is (NaN allowed with
                ``missing="marginalize"``); a table with categorical or text columns
                is encoded first (category codes, NaN where missing) and checked
                after. Rows of zero weight are dropped; weights that are all equal become
                None (the unweighted fit). ``unsupervised``: X alone (a density; y is ignored and
        returned as None).
                Sets ``var_type_`` and ``categories_``.
        """
        columns.refuse_no_columns(X)
        refuse_dates_and_complex(X)
        y = None if unsupervised else y
        refuse_missing_targets(y)
        var_type = getattr(self, "var_type", None)
        missing = getattr(self, "missing", "error")
        kinds = None
        if var_type is not None or columns.is_dataframe(X):
            kinds = columns.resolve_var_type(columns.as_table(X), var_type)
        finite = "allow-nan" if missing == "marginalize" else True
        if (kinds is None or set(kinds) <= {"c"}) and columns.all_numeric(X):
            if unsupervised:  # a density: X alone
                X = validate_data(self, X, dtype=np.float64, copy=True, ensure_all_finite=finite)
            else:
                X, y = validate_data(
                    self, X, y, dtype=np.float64, copy=True, ensure_all_finite=finite, **kwargs
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
            encoded = columns.encode_columns(
                table, kinds, categories, missing=missing, offers=self._training_offers()
            )
            if unsupervised:
                X = check_array(encoded, dtype=np.float64, ensure_all_finite=finite, estimator=self)
            else:
                X, y = check_X_y(
                    encoded, y, dtype=np.float64, ensure_all_finite=finite, estimator=self, **kwargs
                )
        self.var_type_ = "c" * X.shape[1] if kinds is None else kinds
        self.categories_ = categories
        if sample_weight is None:
            return X, y, None
        sw = _check_sample_weight(
            sample_weight, X, dtype=np.float64, ensure_non_negative=True, copy=True
        )
        keep = sw > 0
        X, y, sw = X[keep], (None if y is None else y[keep]), sw[keep]
        # every use of the weights is scale-free: equal weights are the unweighted fit,
        # bit for bit, whatever their value (5e-324 to 1e308)
        return X, y, (None if sw.size == 0 or np.all(sw == sw[0]) else sw)

    # ---- the report of a fit

    def summary(self):
        """The fit in brief, as R np's ``summary(npreg(...))``: ``print(model.summary())``.

        A :class:`nbattn.estimators.summary.Summary`: the training rows (and the sum of
        the sample weights), the main options, the leave-one-out criterion at the fitted
        widths (a regressor's MSE and ``R^2 = 1 - MSE / var(y)``, the classifier's
        accuracy and log-loss, a density's log-likelihood per row), the effective number
        of neighbours ``1 / sum_j p_ij^2`` of the training rows (Kish's effective sample
        size of the kernel weights), and ``.table``, one row per column: its kind, width
        (h or lambda) and scaled width (h / sd or lambda / lambda_max), with the p-values
        of ``significance_`` when the model holds one. Costs about one leave-one-out
        pass over the training rows. Raises scikit-learn's ``NotFittedError`` before fit.
        """
        from .summary import summarize

        return summarize(self)

    # ---- what the shared computation reads (nbattn.estimators.prediction)

    def _param(self, name, default=None):
        return getattr(self, name, default)

    def _fitted(self, name, default=None):
        return getattr(self, name, default)

    # ---- query-time helpers

    def _check_queries(self, X):
        """The rows of X as the float64 (n, d) array the model pools at, checked once:
        numbers for an all-continuous model (scikit-learn's ``validate_data``), else the
        table's feature names and count, then its category codes
        (:func:`nbattn._core.columns.encode_columns`) checked as numbers."""
        check_is_fitted(self)
        columns.refuse_no_columns(X)
        refuse_dates_and_complex(X)
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
            offers=self._offers(),
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


class _PoolingEstimator(PoolingPrediction, SpecEstimator):
    """The base of the estimators that pool targets (the computation is
    :class:`nbattn.estimators.prediction.PoolingPrediction`, shared with
    :class:`nbattn.persistence.predictor.Predictor`).

    It fits ``X_fit_`` (n, d) and ``y_fit_`` (n, m) (float64 copies) and describes its
    score through :meth:`_score_coordinates`: the queries, keys and per-feature widths
    under which the score is the Gaussian ``-1/2 sum_d ((q_d - k_d) / h_d)^2``.
    """

    def _attention_weights_checked(self, X):
        """Attention weights (n_queries, n_train) for the checked queries X."""
        if self._uses_engine():
            # the equivalent-kernel weights of this model's degree: W @ y_fit_ is predict(X)
            from ..local.engine import equivalent_weights

            problem = self._local_problem(self._local_spec(X), X, self.y_fit_, self._degree())
            return equivalent_weights(problem)
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

        Row i is how query i pools ``y_fit_``: ``W @ y_fit_`` is the
        prediction. For a local polynomial of degree >= 1 row i is the
        equivalent kernel ``l_j(x_i)`` (the rows of the hat matrix,
        :func:`nbattn.local.engine.equivalent_weights`): the softmax weights
        reweighted by the local design, summing to 1 and possibly negative.
        Memory is n_queries x n_train: meant for plots and diagnostics.
        Computed by :func:`nbattn.smoothing.regression.gaussian_attention_weights`
        on ``device`` (models on the mixed-type engine: on the CPU).
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


def _all_or_nothing(fit):
    """``fit`` that leaves the estimator as it found it when it raises (a bad input found
    late, a KeyboardInterrupt in a width search): an unfitted estimator stays unfitted,
    a fitted one keeps its previous fit, never a mix of the two (scikit-learn's
    ``check_is_fitted`` would take a model holding ``n_features_in_`` but no widths for a
    fitted one)."""

    @functools.wraps(fit)
    def wrapped(self, *args, **kwargs):
        before = dict(vars(self))
        try:
            return fit(self, *args, **kwargs)
        except BaseException:
            vars(self).clear()
            vars(self).update(before)
            raise

    return wrapped


def _nadaraya_watson_init(
    self,
    bandwidth="scott",
    kernel="gaussian",
    rtol=0.0,
    var_type=None,
    missing="error",
    handle_unknown="error",
    device="cpu",
    dtype="float64",
    verbose=0,
):
    """The ``__init__`` of NadarayaWatsonClassifier."""
    self._set_params_from(locals())


def _nadaraya_watson_regressor_init(
    self,
    bandwidth="scott",
    bandwidth_type="fixed",
    kernel="gaussian",
    rtol=0.0,
    var_type=None,
    missing="error",
    handle_unknown="error",
    device="cpu",
    dtype="float64",
    verbose=0,
):
    """The ``__init__`` of NadarayaWatsonRegressor: the classifier's parameters and
    ``bandwidth_type`` (its kernels include "average" too)."""
    self._set_params_from(locals())


def generator(random_state) -> np.random.Generator:
    """A NumPy Generator from a ``random_state``: a Generator itself, else a seed drawn from
    scikit-learn's ``check_random_state`` (None, an int or a RandomState)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    from sklearn.utils import check_random_state

    seed = check_random_state(random_state).randint(0, 2**32, dtype=np.uint64)
    return np.random.default_rng(int(seed))


def decoded_rows(model, rows):
    """Rows in a model's column layout (category codes in categorical columns) as the
    user's data: a DataFrame with the fitted names and categories when the model was
    fitted on one, else an array of the categories' values (float64 when all are
    numbers, objects otherwise)."""
    names = getattr(model, "feature_names_in_", None)
    kinds = model.var_type_
    decoded = []
    for position, kind in enumerate(kinds):
        column = rows[:, position]
        if kind == "c":
            decoded.append(column)
            continue
        values = np.empty(len(model.categories_[position]), dtype=object)
        values[:] = list(model.categories_[position])
        decoded.append(values[column.astype(np.int64)])
    if names is not None:
        import pandas as pd

        frame = {}
        for position, name in enumerate(names):
            if kinds[position] == "c":
                frame[name] = decoded[position]
            else:
                frame[name] = pd.Categorical(
                    decoded[position],
                    categories=list(model.categories_[position]),
                    ordered=kinds[position] == "o",
                )
        return pd.DataFrame(frame)
    numeric = all(
        isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
        for position, kind in enumerate(kinds)
        if kind != "c"
        for value in model.categories_[position]
    )
    out = np.empty(rows.shape, dtype=np.float64 if numeric else object)
    for position, column in enumerate(decoded):
        out[:, position] = column
    return out


# ----------------------------------------------------------------------------- fitted state


def check_fitted_state(model) -> None:
    """Validate a fitted nbattn estimator, such as one rebuilt from a model file.

    A model file's checksum detects accidents, not edits, so
    :func:`nbattn.load` calls this after rebuilding a model. It checks

    * that ``model`` is one of the estimators of :mod:`nbattn.estimators`;
    * the parameters, through the estimator's own ``_parameter_constraints``
      (a ``kernel`` of ``"evil"`` is refused);
    * every required fitted attribute (:func:`nbattn.estimators.fitted_state.check_attributes`,
      the checks ``nbattn predict`` runs without scikit-learn): present, with the right type, dtype
      and shape, finite, and consistent with the others (``X_fit_`` rows =
      ``y_fit_`` rows, ``n_features_in_`` = ``X_fit_`` columns = the length of
      ``bandwidth_`` and ``feature_names_in_``, ``classes_`` = the one-hot
      columns of ``y_fit_``, ``components_`` (n_components, n_features), a
      numeric ``bandwidth`` parameter = ``bandwidth_``);
    * that the model holds no other attribute (besides the results of methods run
      after fit, ``fitted_state.RESULT_ATTRIBUTES``: ``significance_``).

    Raises
    ------
    ValueError
        naming the parameter or attribute at fault (scikit-learn's
        ``InvalidParameterError``, a ValueError, for parameters).
    """
    if not isinstance(model, SpecEstimator) or specs.SPECS.get(type(model).__name__) is None:
        raise ValueError(
            f"not an nbattn estimator: {type(model).__module__}.{type(model).__name__}"
        )
    model._validate_params()
    params = model.get_params(deep=False)
    held = vars(model).items()
    state = {k: v for k, v in held if k not in params and k not in RESULT_ATTRIBUTES}
    check_attributes(model._spec.name, params, state)
