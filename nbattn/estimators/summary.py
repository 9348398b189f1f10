"""``summary()`` of a fitted nbattn estimator: its widths per column and the figures of
its fit, as R np's ``summary(npreg(...))`` and statsmodels' results summaries give them.

:func:`summarize` computes a :class:`Summary`; ``print(model.summary())`` reads it at 80
columns. What it holds:

* the training rows n (and, when weighted, the sum of the sample weights and Kish's
  effective number of rows ``(sum w)^2 / sum w^2``), the estimator and its main options;
* one row per column: its name, kind (continuous, unordered, ordered), its width (h for a
  continuous column, lambda for a categorical one) and the width scaled, ``h / sd`` (sd the
  column's sample standard deviation, ddof = 1, unweighted) or ``lambda / lambda_max``
  (``lambda_max`` = (c - 1) / c for an unordered column of c categories, 1 for an ordered
  one: 1 means the column is smoothed out); a conditional model's response y is the
  first row; the learned full metric (``components_``) has no per-column width;
* the criterion at the fitted widths, computed exactly whatever ``rtol``:

  - regressors: the leave-one-out mean squared error
    ``CV = sum_i u_i mean_o (y_io - f_-i(x_i)_o)^2``, u_i = w_i / sum w (1 / n unweighted),
    f_-i the fit without row i (the fitted ``loss_`` of a one-target
    :class:`~nbattn.LearnedKernelRegressor`, else :func:`nbattn.local.engine.loo_loss`),
    and ``R^2_LOO = 1 - CV / var(y)`` with var the u-weighted variance of y (averaged over
    the outputs);
  - the classifier: the leave-one-out accuracy (share of u on the rows whose left-out
    probabilities put their own class first) and log-loss ``-sum_i u_i log P_-i(y_i | x_i)``
    of the probabilities the model predicts: pooled one-hot labels, smoothed towards the
    others' class frequencies by the fitted prior ``prior_count_``
    (:mod:`nbattn.local.class_widths`; +inf when a row's class gets probability 0);
  - densities: the mean leave-one-out log-likelihood ``sum_i u_i log f_-i(x_i)`` (for a
    conditional model ``log f_-i(y_i | x_i)``), the quantity ``"cv_ml"`` maximises;

* the effective number of neighbours of the training rows, Kish's effective sample size
  of the kernel (softmax) weights p_ij over the keys at query x_i (its own row included),
  ``n_eff(x_i) = 1 / sum_j p_ij^2``: its median and 5 % and 95 % quantiles. The sum of
  squares streams through the engine (:func:`nbattn.local.engine.interval_sums` at degree
  0 with values 1, whose ``sum_j l_j^2 v_j^2`` is then ``sum_j p_j^2``), never an n x n
  matrix; above :data:`N_EFF_QUERIES` rows it is taken at that many rows drawn with a
  fixed seed, and the text says so. A conditional model's weights are those of X's kernel;
  a local polynomial's are its kernel weights, not its equivalent kernel;
* the p-values of ``significance_`` when the model holds one (a DataFrame indexed by
  column name with columns "statistic" and "p_value"): per column in the table, other rows
  (joint tests) below it.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from .prediction import DensityPrediction

__all__ = ["N_EFF_QUERIES", "Summary", "scaled_widths", "summarize"]

#: Above this many training rows the effective number of neighbours is taken at this
#: many rows drawn without replacement by ``numpy.random.default_rng(N_EFF_SEED)``.
N_EFF_QUERIES = 2000
N_EFF_SEED = 0

_KIND_NAMES = {"c": "continuous", "u": "unordered", "o": "ordered"}
_OPTIONS = (
    "metric",
    "degree",
    "kernel",
    "bandwidth",
    "bandwidth_type",
    "y_bandwidth",
    "quantile",
    "rtol",
)
_RULES = {
    "scott": "Scott's rule",
    "silverman": "Silverman's rule",
    "normal_reference": "normal reference rule",
    "loo": "leave-one-out, per column",
    "loo_scale": "leave-one-out, one factor of Scott's",
    "cv_ml": "cross-validated likelihood (cv_ml)",
    "cv_ls": "least-squares cross-validation (cv_ls)",
    "aicc": "AICc of Hurvich, Simonoff and Tsai, per column",
}
_WIDTH = 80
_CRITERION_NOTES = {
    "loo_mse": "LOO: each row fitted by the others at the fitted widths; "
    "R^2 = 1 - LOO MSE / var(y).",
    "loo_accuracy": "LOO: each row's class probabilities from the others at the fitted "
    "widths and prior.",
    "loo_log_likelihood": "LOO: each row's log density under the others at the fitted widths.",
}


@dataclasses.dataclass(frozen=True)
class Summary:
    """The summary of a fitted estimator (module docstring); ``str()`` is the report.

    Attributes
    ----------
    estimator : str
        The estimator's class name.
    options : dict
        Its main parameters (degree, kernel, bandwidth, rtol, ...).
    n_samples : int
        Training rows (rows of weight 0 are not kept).
    weight_sum, n_weighted : float or None
        With sample weights: their sum and Kish's ``(sum w)^2 / sum w^2``.
    selection : str
        How the widths were chosen.
    table : pandas.DataFrame
        One row per column: ``name``, ``kind``, ``width``, ``scaled`` (h / sd or
        lambda / lambda_max; NaN for a constant column, a single category and the full
        metric), and ``p_value`` when the model holds ``significance_``.
    criteria : dict
        The criterion's figures by name (``loo_mse``, ``loo_r2``; ``loo_accuracy``,
        ``loo_log_loss``; ``loo_log_likelihood``); NaN where n < 2.
    n_eff_median, n_eff_low, n_eff_high : float
        The median, 5 % and 95 % quantiles of n_eff(x_i).
    n_eff_rows : int
        The training rows n_eff was taken at (all, or :data:`N_EFF_QUERIES`).
    tests : pandas.DataFrame or None
        The rows of ``significance_`` that are not columns (joint tests).
    """

    estimator: str
    options: dict
    n_samples: int
    weight_sum: float | None
    n_weighted: float | None
    selection: str
    table: object
    criteria: dict
    n_eff_median: float
    n_eff_low: float
    n_eff_high: float
    n_eff_rows: int
    tests: object = None

    def __getattr__(self, name):
        criteria = self.__dict__.get("criteria", {})
        if name in criteria:
            return criteria[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __str__(self) -> str:
        return "\n".join(_report(self))

    def __repr__(self) -> str:
        return str(self)


# ----------------------------------------------------------------------------- computation


def summarize(model) -> Summary:
    """The :class:`Summary` of a fitted nbattn estimator (scikit-learn's
    ``NotFittedError`` when it is not fitted)."""
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(model)
    X = model.X_fit_
    n = X.shape[0]
    sw = model.sample_weight_
    weight_sum = n_weighted = None
    if sw is not None:
        from ..smoothing.regression import effective_size

        top = float(sw.max())
        with np.errstate(over="ignore"):  # a sum beyond float64 is reported as inf
            weight_sum = float(np.sum(sw / top)) * top
        n_weighted = effective_size(sw)
    density = isinstance(model, DensityPrediction)
    if density:
        criteria = _density_criteria(model)
    elif hasattr(model, "classes_"):
        criteria = _class_criteria(model)
    else:
        criteria = _regression_criteria(model)
    rows = _n_eff_rows(n)
    n_eff = _n_eff(model, X[rows], density)
    low, median, high = np.quantile(n_eff, [0.05, 0.5, 0.95])
    table, tests = _table(model)
    return Summary(
        estimator=type(model).__name__,
        options={k: getattr(model, k) for k in _OPTIONS if hasattr(model, k)},
        n_samples=n,
        weight_sum=weight_sum,
        n_weighted=n_weighted,
        selection=_selection(model),
        table=table,
        criteria=criteria,
        n_eff_median=float(median),
        n_eff_low=float(low),
        n_eff_high=float(high),
        n_eff_rows=int(rows.size),
        tests=tests,
    )


def _n_eff_rows(n: int) -> np.ndarray:
    """The training rows n_eff is taken at: all, or N_EFF_QUERIES drawn with a fixed seed."""
    if n <= N_EFF_QUERIES:
        return np.arange(n)
    rng = np.random.default_rng(N_EFF_SEED)
    return np.sort(rng.choice(n, N_EFF_QUERIES, replace=False))


def _selection(model) -> str:
    """How the widths were chosen, in words."""
    if type(model).__name__ == "LearnedKernelRegressor":
        return f"leave-one-out MSE, learned ({model.metric} metric)"
    if getattr(model, "kernel", None) == "average":
        return "none: average pooling weighs every row alike (the widths are not used)"
    bandwidth = model.bandwidth
    if isinstance(bandwidth, str):
        words = _RULES.get(bandwidth, bandwidth)
        if hasattr(model, "classes_") and bandwidth.startswith("loo"):
            words += " (log-loss)"
        elif bandwidth.startswith("loo"):
            words += " (MSE)"
    else:
        words = "given"
    y_bandwidth = getattr(model, "y_bandwidth", None)
    if isinstance(y_bandwidth, str):  # "cv_cdf"
        words += "; y: cross-validated CDF (cv_cdf)"
    elif y_bandwidth is not None:
        words += "; y: given"
    return words


def _layout(model, queries, values, degree=None, exclude_self=False):
    """The engine's exact (rtol 0) layout of pooling ``values`` over a pooling model's
    keys at ``queries``: its own columns when the engine computes the model, else the
    Gaussian score's coordinates (the full metric's Lx at unit widths) as continuous
    columns; at the model's degree unless ``degree`` is given."""
    from ..local.problem import check_widths, layout

    spec = dataclasses.replace(model._local_spec(queries), rtol=0.0)
    if model._uses_engine():
        q, k, widths = queries, model.X_fit_, model.bandwidth_
    else:
        q, k, h = model._score_coordinates(queries)
        widths = np.broadcast_to(np.asarray(h, dtype=np.float64), (k.shape[1],)).copy()
        spec = dataclasses.replace(spec, var_type="c" * k.shape[1], n_categories=(0,) * k.shape[1])
    widths = check_widths(widths, spec.var_type, spec.counts, name="bandwidth_")
    return layout(
        spec,
        q,
        k,
        values,
        widths,
        model._degree() if degree is None else degree,
        sample_weight=model._weights(),
        exclude_self=exclude_self,
    )


def _term_weights(model, n):
    from ..local.engine import loo_term_weights

    return loo_term_weights(model._weights(), n)


def _regression_criteria(model) -> dict:
    """LOO MSE (mean over the outputs) and LOO R^2 (module docstring)."""
    from .._core.numeric import power_of_two_scale

    y = model.y_fit_
    n, m = y.shape
    if n < 2:
        return {"loo_mse": math.nan, "loo_r2": math.nan}
    u = _term_weights(model, n)
    # y in units of a power of two near its largest |y - centre| (exact, and every fit is
    # linear in y): squares of targets near 1e300 stay finite, R^2 exact
    centre = y.max(axis=0) / 2.0 + y.min(axis=0) / 2.0
    unit = float(power_of_two_scale(np.max(np.abs(y - centre))))
    scaled = (y - centre) / unit
    mean = u @ scaled
    variance = float(u @ ((scaled - mean) ** 2).sum(axis=1)) / m
    loss = getattr(model, "loss_", None)
    if loss is not None and m == 1:
        mse = float(loss) / (unit * unit)
    elif model._average():
        w = np.ones(n) if model._weights() is None else model._weights()
        total = w @ scaled
        fits = (total[None, :] - w[:, None] * scaled) / (w.sum() - w)[:, None]
        mse = float(u @ ((fits - scaled) ** 2).sum(axis=1)) / m
    else:
        from ..local.engine import loo_loss

        problem = _layout(model, model.X_fit_, scaled, exclude_self=True)
        mse = loo_loss(problem) / m
    with np.errstate(over="ignore", under="ignore"):
        loo_mse = mse * unit * unit
    if mse > 0.0 and (loo_mse == 0.0 or math.isinf(loo_mse)):
        import warnings

        warnings.warn(
            f"the leave-one-out MSE lies beyond float64's range in y's units squared and is "
            f"shown as {loo_mse}; LOO R^2, computed in scaled units, is exact",
            RuntimeWarning,
            stacklevel=3,
        )
    r2 = 1.0 - mse / variance if variance > 0.0 else math.nan
    return {"loo_mse": loo_mse, "loo_r2": r2}


def _class_criteria(model) -> dict:
    """The classifier's LOO accuracy and log-loss (module docstring)."""
    from ..local.class_widths import class_counts, log_mean_weight, smoothed_probabilities
    from ..local.engine import fit_problem

    Y = model.y_fit_
    n, k = Y.shape
    if n < 2:
        return {"loo_accuracy": math.nan, "loo_log_loss": math.nan}
    problem = _layout(model, model.X_fit_, Y, degree=0, exclude_self=True)
    beta, _, shift, log_norm, _, _ = fit_problem(problem)
    proba = np.clip(beta[:, 0, :], 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        # a row with no other row within reach has no kernel mass: no probabilities (0)
        proba = np.nan_to_num(proba / proba.sum(axis=1, keepdims=True), nan=0.0)
        log_mass = np.where(log_norm > -np.inf, shift + log_norm, -np.inf)
    codes = np.argmax(Y, axis=1)
    alpha = float(getattr(model, "prior_count_", 0.0))
    if alpha > 0.0:
        # each left-out row's prior: the others' Laplace frequencies pi_-i
        rows, counts = class_counts(Y, model._weights())
        others = np.maximum(counts[None, :] - rows[:, None] * Y, 0.0)
        prior = (others + 1.0) / (counts.sum() - rows + k)[:, None]
        log_mass = log_mass - log_mean_weight(model._weights())
        proba = smoothed_probabilities(proba, log_mass, math.log(alpha), prior)
    own = proba[np.arange(n), codes]
    u = _term_weights(model, n)
    right = (np.argmax(proba, axis=1) == codes) & (own > 0.0)
    with np.errstate(divide="ignore"):
        log_loss = -float(u @ np.log(own)) if np.all(own > 0.0) else math.inf
    return {"loo_accuracy": float(u @ right), "loo_log_loss": log_loss}


def _density_criteria(model) -> dict:
    """The mean leave-one-out log-likelihood (module docstring)."""
    from ..distribution.density import density_layout
    from ..local.engine import loo_term_weights
    from ..local.problem import check_widths

    n = model.X_fit_.shape[0]
    if n < 2:
        return {"loo_log_likelihood": math.nan}
    conditional = hasattr(model, "y_fit_")
    if conditional:
        from ..distribution.conditional import conditional_log_density

        spec = model._joint_spec()
        data = np.column_stack([model.y_fit_, model.X_fit_])
        widths = np.concatenate([[model.y_bandwidth_], model.bandwidth_])
    else:
        from ..distribution.density import log_density_of

        spec = model._density_spec(model._kinds(), model._n_categories())
        data, widths = model.X_fit_, model.bandwidth_
    spec = dataclasses.replace(spec, rtol=0.0)
    widths = check_widths(widths, spec.var_type, spec.counts, "bandwidth_")
    problem = density_layout(spec, data, data, widths, model.sample_weight_, exclude_self=True)
    if conditional:
        logs = conditional_log_density(problem, 1)
    else:
        logs = log_density_of(problem)
    u = loo_term_weights(model.sample_weight_, n)
    keep = u > 0.0
    value = float(u[keep] @ logs[keep]) if np.all(logs[keep] > -np.inf) else -math.inf
    return {"loo_log_likelihood": value}


def _n_eff(model, queries, density) -> np.ndarray:
    """n_eff(x_i) = 1 / sum_j p_ij^2 at the rows ``queries`` (module docstring)."""
    from ..local.engine import interval_sums
    from ..smoothing.regression import effective_size

    n = model.X_fit_.shape[0]
    weights = model._weights() if not density else model.sample_weight_
    if not density and model._average():
        size = float(n) if weights is None else effective_size(weights)
        return np.full(queries.shape[0], size)
    ones = np.ones(n)
    if density:
        from ..local.problem import check_widths, layout

        spec = model._density_spec(model._kinds(), model._n_categories())
        spec = dataclasses.replace(spec, rtol=0.0)
        widths = check_widths(model.bandwidth_, spec.var_type, spec.counts, "bandwidth_")
        problem = layout(spec, queries, model.X_fit_, ones, widths, 0, sample_weight=weights)
    else:
        problem = _layout(model, queries, ones, degree=0)
    squares = np.asarray(interval_sums(problem), dtype=np.float64)
    with np.errstate(divide="ignore"):
        return 1.0 / squares


# ----------------------------------------------------------------------------- the table


def scaled_widths(widths, kinds, counts, X) -> np.ndarray:
    """Each width relative to its column: h / sd for a continuous one (sd the sample's,
    missing values left out, at any magnitude), lambda / lambda_max for a categorical one
    (``counts`` its categories; lambda_max = (c - 1)/c unordered, 1 ordered: 1 means the
    column is smoothed out); NaN where sd or lambda_max is 0. ``X`` (n, len(kinds))."""
    from ..local.problem import lambda_max
    from ..smoothing.regression import feature_spread

    top = lambda_max(kinds, counts)
    out = np.full(len(kinds), math.nan)
    for position, kind in enumerate(kinds):
        if kind == "c":
            column = X[:, position]
            column = column[~np.isnan(column)][:, None]
            sd = float(feature_spread(column, ddof=1, name="X", columns=[position])[0])
            if sd > 0.0:
                with np.errstate(over="ignore"):
                    out[position] = widths[position] / sd
        elif top[position] > 0.0:
            out[position] = widths[position] / top[position]
    return out


def _table(model):
    """(the per-column table, the extra rows of ``significance_`` or None)."""
    import pandas as pd

    kinds = model._kinds()
    d = len(kinds)
    names = model._column_names()
    if hasattr(model, "bandwidth_"):
        widths = np.asarray(model.bandwidth_, dtype=np.float64)
        scaled = scaled_widths(widths, kinds, model._n_categories(), model.X_fit_)
        if model._bandwidth_type() != "fixed":  # counts k: the share of the other rows
            cont = np.array([kind == "c" for kind in kinds], dtype=bool)
            scaled[cont] = widths[cont] / max(model.X_fit_.shape[0] - 1, 1)
    else:  # the full learned metric: no width per column
        widths = scaled = np.full(d, math.nan)
    frame = {
        "name": names,
        "kind": [_KIND_NAMES[k] for k in kinds],
        "width": widths,
        "scaled": scaled,
    }
    if hasattr(model, "y_bandwidth_"):
        y_kind = model.y_type_
        counts = [0 if model.y_categories_ is None else len(model.y_categories_)]
        y_column = np.asarray(model.y_fit_, dtype=np.float64).reshape(-1, 1)
        y_scaled = scaled_widths([float(model.y_bandwidth_)], y_kind, counts, y_column)[0]
        if y_kind == "c" and model._bandwidth_type() != "fixed":  # y's count k
            y_scaled = float(model.y_bandwidth_) / max(y_column.shape[0] - 1, 1)
        frame["name"] = ["y", *frame["name"]]
        frame["kind"] = [_KIND_NAMES[y_kind], *frame["kind"]]
        frame["width"] = np.concatenate([[model.y_bandwidth_], widths])
        frame["scaled"] = np.concatenate([[y_scaled], scaled])
    table = pd.DataFrame(frame)
    table.attrs["bandwidth_type"] = model._bandwidth_type()
    tests = None
    significance = getattr(model, "significance_", None)
    if significance is not None:
        p = significance["p_value"]
        index = [str(name) for name in significance.index]
        table["p_value"] = [
            float(p.iloc[index.index(name)]) if name in index else math.nan
            for name in table["name"]
        ]
        extra = [i for i, name in enumerate(index) if name not in set(names)]
        if extra:
            tests = significance.iloc[extra]
    return table, tests


# ----------------------------------------------------------------------------- the text


def _number(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _criteria_lines(summary: Summary) -> list:
    c = summary.criteria
    if "loo_mse" in c:
        return [
            ("LOO MSE", _number(c["loo_mse"])),
            ("LOO R^2", _number(c["loo_r2"])),
        ]
    if "loo_accuracy" in c:
        return [
            ("LOO accuracy", _number(c["loo_accuracy"])),
            ("LOO log-loss", _number(c["loo_log_loss"])),
        ]
    return [("LOO log-lik/row", _number(c["loo_log_likelihood"]))]


def _pairs(left, right) -> list:
    """Two columns of (label, value) pairs, statsmodels' header block."""
    lines = []
    for i in range(max(len(left), len(right))):
        a = f"{left[i][0] + ':':<17}{left[i][1]:>21}" if i < len(left) else " " * 38
        b = f"{right[i][0] + ':':<19}{right[i][1]:>21}" if i < len(right) else ""
        lines.append((a + "  " + b).rstrip())
    return lines


def _report(summary: Summary) -> list:
    rule = "=" * _WIDTH
    thin = "-" * _WIDTH
    title = f"{summary.estimator} summary"
    lines = [title.center(_WIDTH).rstrip(), rule]
    left = [("Rows", str(summary.n_samples))]
    if summary.weight_sum is not None:
        left += [("Sum of weights", _number(summary.weight_sum))]
        left += [("Kish's n", _number(summary.n_weighted))]
    for name, value in summary.options.items():
        shown = value if isinstance(value, (str, int, float)) or value is None else "array"
        left.append((name, _clip(str(shown), 21)))
    right = _criteria_lines(summary)
    sampled = "" if summary.n_eff_rows == summary.n_samples else f" ({summary.n_eff_rows} rows)"
    right += [
        ("n_eff median", _number(summary.n_eff_median)),
        ("n_eff 5%-95%", f"{_number(summary.n_eff_low)} - {_number(summary.n_eff_high)}"),
    ]
    lines += _pairs(left, right)
    lines += _wrapped("Widths chosen by: " + summary.selection)
    lines += _wrapped(_CRITERION_NOTES[next(iter(summary.criteria))])
    if sampled:
        lines += _wrapped(
            f"n_eff = 1 / sum_j p_ij^2 at {summary.n_eff_rows} training rows drawn with a "
            f"fixed seed (of {summary.n_samples})."
        )
    else:
        lines += _wrapped("n_eff = 1 / sum_j p_ij^2 at every training row (its own included).")
    lines.append(thin)
    lines += _column_table(summary.table)
    if summary.tests is not None and len(summary.tests):
        lines.append(thin)
        lines.append(f"{'test':<40}{'statistic':>19}{'p-value':>21}")
        labels = _labels(summary.tests.index, 39)
        for label, (_, row) in zip(labels, summary.tests.iterrows()):
            lines.append(f"{label:<40}{_number(row['statistic']):>19}{_p(row['p_value']):>21}")
    lines.append(rule)
    return lines


def _p(value) -> str:
    value = float(value)
    if math.isnan(value):
        return "-"
    return "<1e-4" if value < 1e-4 else f"{value:.4f}"


def _column_table(table) -> list:
    has_p = "p_value" in table.columns
    head = f"{'column':<24}{'kind':<12}{'width':>14}{'scaled':>14}"
    continuous = (table["kind"] == "continuous").any()
    categorical = (table["kind"] != "continuous").any()
    neighbours = table.attrs.get("bandwidth_type", "fixed") != "fixed"
    scale_note = ", ".join(
        part
        for part, on in (
            ("k/(n-1)" if neighbours else "h/sd", continuous),
            ("lambda/lambda_max", categorical),
        )
        if on
    )
    if has_p:
        head += f"{'p-value':>14}"
    lines = [head]
    for label, (_, row) in zip(_labels(table["name"], 23), table.iterrows()):
        line = (
            f"{label:<24}{row['kind']:<12}{_number(row['width']):>14}{_number(row['scaled']):>14}"
        )
        if has_p:
            line += f"{_p(row['p_value']):>14}"
        lines.append(line)
    if np.all(np.isnan(table["width"].to_numpy(dtype=np.float64))):
        lines.append("full learned metric (components_): no width per column")
    else:
        h = f"k (continuous, {table.attrs['bandwidth_type']})" if neighbours else "h (continuous)"
        lines.append(f"width: {h} or lambda (categorical); scaled: {scale_note}")
    return lines


def _labels(names, width: int) -> list:
    """The names clipped to ``width`` characters so that they stay told apart: a long name
    keeps what it does not share with every other name (the part between their common
    prefix and suffix) and as much of its start and end as fit, "..." for what is cut;
    a name whose own part is too long keeps its start and end (:func:`_clip`)."""
    names = [str(name) for name in names]
    if all(len(name) <= width for name in names):
        return names
    if len(set(names)) < 2:
        return [_clip(name, width) for name in names]
    a = len(os.path.commonprefix(names))
    s = min(len(os.path.commonprefix([n[::-1] for n in names])), min(map(len, names)) - a)
    out = []
    for name in names:
        head, core, tail = name[:a], name[a : len(name) - s], name[len(name) - s :]
        budget = width - len(core)
        if len(name) <= width:
            out.append(name)
        elif len(tail) + 4 <= budget:  # cut the shared start only
            out.append(head[: budget - len(tail) - 3] + "..." + core + tail)
        elif len(head) + 4 <= budget:  # cut the shared end only
            out.append(head + core + "..." + tail[len(tail) - (budget - len(head) - 3) :])
        elif budget >= 8:  # cut both
            keep = (budget - 6) // 2
            rest = budget - 6 - keep
            out.append(head[:keep] + "..." + core + "..." + tail[len(tail) - rest :])
        else:
            out.append(_clip(name, width))
    return out


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and its end about "..." (long
    names of one table often share a prefix and differ at the end: x_1, ..., x_12)."""
    if len(text) <= width:
        return text
    tail = (width - 3) // 2
    return text[: width - 3 - tail] + "..." + text[len(text) - tail :]


def _wrapped(text: str) -> list:
    import textwrap

    return textwrap.wrap(text, _WIDTH)
