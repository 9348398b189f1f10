"""Local-polynomial regression with a mixed-type product kernel (functional layer).

The fit at a query q is the weighted least-squares polynomial of degree 0
(Nadaraya-Watson), 1 (local-linear) or 2 (local-quadratic) in the continuous
columns, centred at q, with the attention weights of a product kernel:

    beta(q) = argmin_b sum_j p_j(q) (y_j - b . x_j(q))^2,  fit(q) = beta_0(q)
    p_j(q)  = softmax_j( sum_c log K((k_jc - q_c) / h_c) + sum_k log L_k + log w_j )

``x_j(q) = (1, k_j - q, [products of pairs of k_j - q])`` over the continuous
columns only: categorical columns enter through the weights, as in R's np
(Li and Racine). Conventions follow statsmodels ``KernelReg`` so that results
compare with it:

* ``var_type`` one letter per column: 'c' continuous, 'u' unordered, 'o' ordered
  categorical; categorical columns hold float-coded integer codes 0 .. c-1.
* Continuous kernels K of u = (q - k)/h: "gaussian" exp(-u^2/2), "epanechnikov"
  (1 - u^2) on |u| <= 1 and "tricube" (1 - |u|^3)^3 on |u| <= 1, the scaling of
  statsmodels (h is the half-width of the support; constants cancel). Keys
  outside the support weigh exactly 0; a query with no key inside gets its
  nearest key's value (``nbattn.kernels.local``).
* Unordered (Aitchison-Aitken): L = 1 - l if equal, l / (c - 1) otherwise,
  l in [0, (c-1)/c]; ordered (Wang-van Ryzin): L = 1 - l if equal,
  (1 - l)/2 l^|x - y| otherwise, l in [0, 1]. l = 0 is exact matching.
* ``bandwidth`` holds one entry per column: h for 'c' columns, l for 'u'/'o'.

statsmodels' local-linear ``KernelReg`` puts the category codes into the local
design as if they were numbers; nbattn does not (np's convention), so with
categorical columns the two agree only for ``reg_type="lc"``.

The local system is solved with a relative ridge, ``(M + ridge diag(0, M_11, ..,
M_pp)) beta = V`` (M the normalised moment matrix; default ``ridge=1e-12``,
``config.LOCAL_RIDGE``), which does not depend on the units of any column and
changes a well-conditioned fit by about ``ridge`` times its condition number.
A term whose design column lies within ``config.LOCAL_PIVOT_TOL`` (1e-8,
relative) of the span of the earlier ones is dropped (coefficient 0), as a
truncated pseudo-inverse would: a singular design (a constant column, fewer
distinct neighbours than terms, a query far from every key) shrinks towards
the local constant, never to NaN. Pass a larger ``ridge`` to shrink the slopes
of ill-conditioned designs more.

Missing values (``missing="marginalize"``): a pair with column c missing on
either side leaves that column's kernel term out. In the local design a key
missing continuous column c sits at the query's coordinate (difference 0), so
it informs the level but not the slope; a query missing column c has slope 0
in c (the column drops out of its design).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from .. import config
from .._core.columns import CONTINUOUS_KERNELS as KERNELS
from .._core.columns import check_var_type
from .._core.local_groups import KERNEL_CODES, LocalData, LocalModel
from .._core.threads import serial_below
from .._core.validation import (
    as_float_array,
    check_bandwidth,
    check_bool,
    check_positive_float,
    resolve_dtype,
)
from ..dispatch.device import kernels_for

__all__ = [
    "KERNELS",
    "check_n_categories",
    "check_var_type",
    "check_widths",
    "default_widths",
    "lambda_max",
    "local_interval_sums",
    "local_loo_loss",
    "local_polynomial",
    "local_prediction_interval",
]

_MISSING = ("error", "marginalize")
#: Default relative ridge of the local solve (module docstring).
DEFAULT_RIDGE = config.LOCAL_RIDGE


# --------------------------------------------------------------------------- checks
def _check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _check_degree(degree) -> int:
    if isinstance(degree, (bool, np.bool_)) or not isinstance(degree, (int, np.integer)):
        raise ValueError(f"degree must be 0, 1 or 2, got {degree!r}")
    if degree not in (0, 1, 2):
        raise ValueError(f"degree must be 0, 1 or 2, got {degree!r}")
    return int(degree)


def as_data_columns(x, name, allow_nan):
    """A float64 (n, d) copy of ``x`` (1-D is one column); NaN passes only with ``allow_nan``."""
    arr = np.asarray(x) if not isinstance(x, np.ndarray) else x
    if allow_nan and getattr(arr, "dtype", None) is not None and arr.dtype.kind == "f":
        nan = np.isnan(arr)
        if nan.any():
            filled = as_float_array(np.where(nan, 0.0, arr), name, ndim=(1, 2), dtype="float64")
            filled[nan] = np.nan
            return filled[:, None] if filled.ndim == 1 else filled
    out = as_float_array(x, name, ndim=(1, 2), dtype="float64")
    return out[:, None] if out.ndim == 1 else out


def _check_codes(column, name, position, n_categories):
    """Categorical codes: integers in 0 .. n_categories - 1 (NaN = missing passes)."""
    present = column[~np.isnan(column)]
    bad = (present != np.round(present)) | (present < 0) | (present >= n_categories)
    if bad.any():
        value = present[np.argmax(bad)]
        raise ValueError(
            f"{name} column {position} is categorical with {n_categories} categories; "
            f"its codes must be integers 0 .. {n_categories - 1}, found {value!r}"
        )


def check_n_categories(n_categories, var_type, *datasets) -> np.ndarray:
    """Categories per column (int array, 0 for 'c' columns).

    None: one more than the largest code in ``datasets`` (each an (n, d) array).
    """
    d = len(var_type)
    if n_categories is None:
        counts = np.zeros(d, dtype=np.int64)
        for position, kind in enumerate(var_type):
            if kind == "c":
                continue
            top = -1.0
            for data in datasets:
                col = data[:, position]
                col = col[~np.isnan(col)]
                if col.size:
                    top = max(top, float(col.max()))
            counts[position] = max(1, int(top) + 1) if top >= 0 else 1
        return counts
    if np.isscalar(n_categories):
        n_categories = [n_categories] * d
    counts = np.asarray(n_categories)
    if counts.shape != (d,):
        raise ValueError(f"n_categories must have one entry per column ({d}), got {n_categories!r}")
    out = np.zeros(d, dtype=np.int64)
    for position, kind in enumerate(var_type):
        if kind == "c":
            continue
        value = counts[position]
        if isinstance(value, (bool, np.bool_)) or value != np.round(value) or value < 1:
            raise ValueError(f"n_categories[{position}] must be a positive integer, got {value!r}")
        out[position] = int(value)
    return out


def lambda_max(var_type: str, n_categories) -> np.ndarray:
    """Largest admissible l per column: (c-1)/c for 'u', 1 for 'o' (0 for 'c')."""
    out = np.zeros(len(var_type))
    for position, kind in enumerate(var_type):
        if kind == "u":
            c = n_categories[position]
            out[position] = (c - 1) / c
        elif kind == "o":
            out[position] = 1.0
    return out


def check_widths(bandwidth, var_type, n_categories, name="bandwidth") -> np.ndarray:
    """Per-column widths (d,) float64: h > 0 (normal) for 'c', l in [0, lambda_max] for 'u'/'o'."""
    d = len(var_type)
    if isinstance(bandwidth, str):
        raise ValueError(f"{name}={bandwidth!r} is not a number; resolve rule names first")
    if isinstance(bandwidth, (bool, np.bool_)):
        raise ValueError(f"{name} must be a number or an array of {d}, got {bandwidth!r}")
    arr = as_float_array(bandwidth, name, dtype="float64", allow_bool=False).reshape(-1)
    if arr.size == 1:
        arr = np.full(d, arr[0])
    if arr.size != d:
        raise ValueError(f"{name} has {arr.size} entries but the data has {d} columns")
    cont = np.array([k == "c" for k in var_type])
    if cont.any():
        arr[cont] = check_bandwidth(arr[cont], int(cont.sum()), name)
    top = lambda_max(var_type, n_categories)
    for position, kind in enumerate(var_type):
        if kind == "c":
            continue
        lam = arr[position]
        if not (0.0 <= lam <= top[position] * (1 + 1e-12)):
            raise ValueError(
                f"{name}[{position}] is the smoothing l of a categorical column with "
                f"{n_categories[position]} categories; it must lie in [0, {top[position]:.6g}], "
                f"got {lam!r}"
            )
        arr[position] = min(lam, top[position])
    return arr


def _nan_spread(X):
    """Sample standard deviation per column over the present (non-NaN) rows, at any magnitude."""
    from ..smoothing.regression import feature_spread

    out = np.zeros(X.shape[1])
    for c in range(X.shape[1]):
        col = X[:, c]
        col = col[~np.isnan(col)]
        if col.size:
            out[c] = feature_spread(col[:, None])[0]
    return out


def default_widths(X, var_type=None, n_categories=None, rule="scott") -> np.ndarray:
    """Rule-of-thumb widths per column: a bandwidth rule's h for 'c', a default l otherwise.

    Continuous columns get ``regression.rule_bandwidth`` of their spread
    (``factor(n, d) sigma_c``, Scott or Silverman, d the number of columns; a
    constant column gets factor times 1). Categorical columns get
    ``l = lambda_max * factor(n, d)``: like h, a fixed share of the column's
    range that shrinks with n (lambda_max = (c-1)/c for 'u', 1 for 'o'). Missing
    entries (NaN) are left out of the spreads.
    """
    from ..smoothing.regression import BANDWIDTH_RULES, rule_bandwidth

    X = as_data_columns(X, "X", allow_nan=True)
    var_type = check_var_type(var_type, X.shape[1])
    counts = check_n_categories(n_categories, var_type, X)
    if not isinstance(rule, str) or rule not in BANDWIDTH_RULES:
        raise ValueError(f"bandwidth rule must be one of {sorted(BANDWIDTH_RULES)}, got {rule!r}")
    n, d = X.shape
    out = np.empty(d)
    cont = np.array([k == "c" for k in var_type])
    if cont.any():
        h = rule_bandwidth(_nan_spread(X[:, cont]), n, rule)
        # rule_bandwidth's factor uses the number of continuous columns; use all d
        factor = BANDWIDTH_RULES[rule](n, d) / BANDWIDTH_RULES[rule](n, int(cont.sum()))
        out[cont] = h * factor
    factor = min(1.0, BANDWIDTH_RULES[rule](n, d))
    top = lambda_max(var_type, counts)
    for position, kind in enumerate(var_type):
        if kind != "c":
            out[position] = top[position] * factor
    return out


# --------------------------------------------------------------------------- layout
@dataclass
class LocalProblem:
    """Checked inputs laid out for ``nbattn.kernels.local`` (see its docstring)."""

    q_cont: np.ndarray
    keys_cont_t: np.ndarray
    q_cat: np.ndarray
    keys_cat_t: np.ndarray
    cat_params: np.ndarray
    log_weights: np.ndarray
    values_t: np.ndarray
    kernel: int
    degree: int
    exclude_self: bool
    missing: bool
    ridge: float
    h: np.ndarray  # widths of the continuous columns
    var_type: str
    n_categories: np.ndarray
    widths: np.ndarray
    values_1d: bool

    def kernel_groups(self, **model_changes):
        """The local kernels' argument groups for this problem, ``(LocalData,
        LocalModel)`` (``nbattn._core.local_groups``, the same on CPU and GPU);
        ``model_changes`` replace fields of the model (``degree``, ``exclude_self``)."""
        data = LocalData(
            self.q_cont, self.keys_cont_t, self.q_cat, self.keys_cat_t, self.log_weights
        )
        model = LocalModel(
            cat_params=self.cat_params,
            kernel=int(self.kernel),
            degree=int(self.degree),
            ridge=float(self.ridge),
            exclude_self=bool(self.exclude_self),
            missing=bool(self.missing),
        )
        return data, model._replace(**model_changes)


def _log(x):
    with np.errstate(divide="ignore"):
        return float(np.log(x)) if x > 0 else -math.inf


def categorical_terms(var_type, n_categories, widths):
    """(dk, 3) score terms (a, b, t) of the categorical columns (``nbattn.kernels.local``)."""
    rows = []
    for position, kind in enumerate(var_type):
        if kind == "c":
            continue
        lam = float(widths[position])
        if kind == "u":
            c = int(n_categories[position])
            b = _log(lam / (c - 1)) if c > 1 else -math.inf
            rows.append((_log(1.0 - lam), b, 0.0))
        else:
            rows.append((_log(1.0 - lam), _log((1.0 - lam) / 2.0), _log(lam)))
    return np.array(rows, dtype=np.float64).reshape(len(rows), 3)


def _check_sample_weight(sample_weight, n_keys):
    if sample_weight is None:
        return np.zeros(n_keys)
    w = as_float_array(sample_weight, "sample_weight", ndim=(1,), dtype="float64")
    if w.shape[0] != n_keys:
        raise ValueError(f"sample_weight has {w.shape[0]} entries but keys has {n_keys} rows")
    if (w < 0).any():
        raise ValueError(
            f"sample_weight must be >= 0; entry {int(np.argmax(w < 0))} is {w[w < 0][0]!r}"
        )
    if not (w > 0).any():
        raise ValueError("sample_weight is zero everywhere: no key has weight")
    with np.errstate(divide="ignore"):
        return np.log(w)


def prepare(
    queries,
    keys,
    values,
    bandwidth,
    degree,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    exclude_self=False,
    ridge=None,
) -> LocalProblem:
    """Check every input of the local fits and lay them out for the kernels."""
    missing = _check_choice(missing, "missing", _MISSING) == "marginalize"
    keys = as_data_columns(keys, "keys", missing)
    queries = as_data_columns(queries, "queries", missing)
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(f"queries has {queries.shape[1]} features but keys has {keys.shape[1]}")
    values_arr = as_float_array(values, "values", ndim=(1, 2), dtype="float64")
    if values_arr.shape[0] != keys.shape[0]:
        raise ValueError(f"values has {values_arr.shape[0]} rows but keys has {keys.shape[0]}")
    values_1d = values_arr.ndim == 1
    values_2d = values_arr[:, None] if values_1d else values_arr
    degree = _check_degree(degree)
    code = KERNEL_CODES[_check_choice(kernel, "kernel", KERNELS)]
    exclude_self = check_bool(exclude_self, "exclude_self")
    if exclude_self and queries.shape[0] != keys.shape[0]:
        raise ValueError(
            "exclude_self=True pairs query i with key i, so queries and keys must have the "
            f"same number of rows; got {queries.shape[0]} and {keys.shape[0]}"
        )
    ridge = DEFAULT_RIDGE if ridge is None else _check_ridge(ridge)
    var_type = check_var_type(var_type, keys.shape[1])
    counts = check_n_categories(n_categories, var_type, keys, queries)
    for position, kind in enumerate(var_type):
        if kind != "c":
            _check_codes(keys[:, position], "keys", position, counts[position])
            _check_codes(queries[:, position], "queries", position, counts[position])
    if isinstance(bandwidth, str):
        widths = default_widths(keys, var_type, counts, rule=bandwidth)
    else:
        widths = check_widths(bandwidth, var_type, counts)
    log_weights = _check_sample_weight(sample_weight, keys.shape[0])
    cont = np.array([k == "c" for k in var_type], dtype=bool)
    h = widths[cont]
    kc, qc = keys[:, cont], queries[:, cont]
    if not cont.any():
        centre = np.zeros(0)
    elif missing and np.isnan(kc).any():
        with warnings.catch_warnings():  # an all-NaN column has no centre: use 0
            warnings.simplefilter("ignore", RuntimeWarning)
            centre = np.nanmedian(kc, axis=0)
        centre = np.where(np.isnan(centre), 0.0, centre)
    else:
        centre = np.median(kc, axis=0)
    with np.errstate(over="ignore"):
        q_cont = np.ascontiguousarray((qc - centre) / h)
        keys_cont_t = np.ascontiguousarray(((kc - centre) / h).T)
    for name, arr in (("queries", q_cont), ("keys", keys_cont_t)):
        if np.isinf(arr).any():
            raise ValueError(
                f"{name} / bandwidth overflows float64 (data near 1e308 with small widths); "
                "rescale the data"
            )
    return LocalProblem(
        q_cont=q_cont,
        keys_cont_t=keys_cont_t,
        q_cat=np.ascontiguousarray(queries[:, ~cont]),
        keys_cat_t=np.ascontiguousarray(keys[:, ~cont].T),
        cat_params=categorical_terms(var_type, counts, widths),
        log_weights=log_weights,
        values_t=np.ascontiguousarray(values_2d.T),
        kernel=code,
        degree=degree,
        exclude_self=exclude_self,
        missing=bool(missing),
        ridge=float(ridge),
        h=h,
        var_type=var_type,
        n_categories=counts,
        widths=widths,
        values_1d=values_1d,
    )


def _check_ridge(ridge):
    if isinstance(ridge, (int, float, np.floating, np.integer)) and ridge == 0:
        return 0.0
    return check_positive_float(ridge, "ridge")


def threads_for(problem: LocalProblem):
    """One numba thread for calls with fewer than ``config.SERIAL_PAIRS`` pairs (a parallel
    launch costs more than it saves there; on a busy 2-core machine 30x more at n = 150)."""
    return serial_below(problem.q_cont.shape[0] * problem.log_weights.shape[0], config.SERIAL_PAIRS)


def fit_problem(problem: LocalProblem, device="cpu", want_mfx=False):
    """Run the first pass of the local fit (``kernels.local.local_fit``) on a prepared problem."""
    module = kernels_for("local", device)
    with threads_for(problem):
        return module.local_fit(*problem.kernel_groups(), problem.values_t, bool(want_mfx))


def _cast(x, dtype):
    return np.asarray(x, dtype=dtype)


# --------------------------------------------------------------------------- public API
def local_polynomial(
    queries,
    keys,
    values,
    bandwidth="scott",
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    exclude_self=False,
    ridge=None,
    return_gradient=False,
    device="cpu",
    dtype=None,
):
    """Local-polynomial regression (degree 0: Nadaraya-Watson, 1: local-linear, 2: quadratic).

    .. math::

        \\hat f(q) = e_1^T \\Big(\\sum_j p_j x_j x_j^T + R\\Big)^{-1} \\sum_j p_j x_j y_j,
        \\qquad p_j = \\operatorname{softmax}_j\\big(\\textstyle\\sum_c \\log K_c(q_c, k_{jc})
        + \\log w_j\\big)

    with ``x_j = (1, k_j - q, ...)`` the centred monomials of the continuous
    columns up to ``degree`` and R the relative ridge (module docstring). One
    streaming pass per query accumulates the moments with the online softmax;
    nothing of size queries x keys is held.

    Parameters
    ----------
    queries : array-like (n_queries, d) or (n_queries,)
    keys : array-like (n_keys, d) or (n_keys,)
    values : array-like (n_keys,) or (n_keys, n_outputs)
    bandwidth : "scott", "silverman" or array (d,)
        h per continuous column, l per categorical column (see :func:`default_widths`).
    degree : 0, 1 or 2
    var_type : str, optional
        'c'/'u'/'o' per column; None: all continuous.
    n_categories : int or array (d,), optional
        Categories per categorical column; None: one more than the largest code.
    kernel : "gaussian", "epanechnikov" or "tricube"
        The continuous kernel.
    sample_weight : array (n_keys,), optional
        Non-negative key weights (0 leaves a key out).
    missing : "error" or "marginalize"
        With "marginalize", NaN entries leave their column's term out (module docstring).
    exclude_self : bool
        Skip the pair (i, i): the exact leave-one-out fit when queries are the keys.
    ridge : float, optional
        Relative ridge of the local solve; None is ``DEFAULT_RIDGE`` (1e-12).
    return_gradient : bool
        Also return the marginal effects d fit / d q_c of the continuous columns:
        the local slopes for degree >= 1; for degree 0 the analytic derivative
        of the softmax-weighted mean, sum_j p_j (y_j - fit) d s_j / d q_c (so
        not statsmodels' local-constant ``mfx``, whose scale is off).
    device : "cpu", "cuda" or "auto"
    dtype : "float64" or "float32", optional
        The output dtype (the computation is float64 throughout).

    Returns
    -------
    fit : ndarray (n_queries,) or (n_queries, n_outputs)
    gradient : ndarray (n_queries, d_cont) or (n_queries, d_cont, n_outputs),
        only with ``return_gradient=True``
    """
    dtype = resolve_dtype(dtype, queries, keys, values)
    return_gradient = check_bool(return_gradient, "return_gradient")
    problem = prepare(
        queries,
        keys,
        values,
        bandwidth,
        degree,
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        sample_weight=sample_weight,
        missing=missing,
        exclude_self=exclude_self,
        ridge=ridge,
    )
    beta, _, _, _, _, mfx = fit_problem(problem, device, want_mfx=return_gradient)
    fit = beta[:, 0, :]
    if problem.values_1d:
        fit = fit[:, 0]
    if not return_gradient:
        return _cast(fit, dtype)
    return _cast(fit, dtype), _cast(marginal_effects(problem, beta, mfx), dtype)


def marginal_effects(problem: LocalProblem, beta, mfx):
    """d fit / d q per continuous column from a first pass, in the data's units."""
    dc = problem.h.size
    if problem.degree >= 1 and dc > 0:
        grad = beta[:, 1 : 1 + dc, :] / problem.h[None, :, None]
    else:
        grad = mfx / problem.h[None, :, None]
    return grad[:, :, 0] if problem.values_1d else grad


def local_interval_sums(
    queries,
    keys,
    residuals,
    bandwidth="scott",
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    exclude_self=False,
    ridge=None,
    device="cpu",
):
    """Per query ``sum_j l_j(q)^2 r_j^2``, the sandwich variance of the fit at q.

    ``l_j(q)`` are the equivalent-kernel weights of the local fit (``fit(q) =
    sum_j l_j(q) y_j``): the softmax weights for degree 0, ``p_j e_1^T (M + R)^-1
    x_j`` for degree >= 1. ``residuals`` (n_keys,) or (n_keys, n_outputs); the
    result has the same trailing shape. Two streaming passes (the fit's state,
    then the sum).
    """
    problem = prepare(
        queries,
        keys,
        residuals,
        bandwidth,
        degree,
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        sample_weight=sample_weight,
        missing=missing,
        exclude_self=exclude_self,
        ridge=ridge,
    )
    return _interval_sums(problem, device)


def _interval_sums(problem: LocalProblem, device, residuals_t=None):
    fit = fit_problem(problem, device)
    module = kernels_for("local", device)
    with threads_for(problem):
        out = module.local_interval_sums(
            *problem.kernel_groups(),
            fit,
            problem.values_t if residuals_t is None else residuals_t,
        )
    return out[:, 0] if problem.values_1d else out


def local_prediction_interval(
    X,
    y,
    queries,
    bandwidth="scott",
    degree=1,
    *,
    alpha=0.05,
    kind="mean",
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    ridge=None,
    device="cpu",
    return_fit=False,
):
    """A pointwise (1 - alpha) normal interval for the local fit at ``queries``.

    With leave-one-out residuals r_j = y_j - fit_{-j}(x_j) of the training data,

        var_mean(q) = sum_j l_j(q)^2 r_j^2                    (sandwich, kind="mean")
        var_obs(q)  = var_mean(q) + sum_j p_j(q) r_j^2        (kind="observation")

    where l_j are the equivalent-kernel weights (:func:`local_interval_sums`) and
    the second term is the kernel-weighted mean of r^2 at q, the local residual
    variance. The interval is ``fit(q) -/+ z_{1 - alpha/2} sqrt(var)``.

    Returns
    -------
    lower, upper : ndarrays like the fit; ``(fit, lower, upper)`` with ``return_fit``.
    """
    from scipy.stats import norm

    alpha = check_positive_float(alpha, "alpha")
    if not alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    kind = _check_choice(kind, "kind", ("mean", "observation"))
    common = dict(
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        sample_weight=sample_weight,
        missing=missing,
        ridge=ridge,
    )
    train = prepare(X, X, y, bandwidth, degree, exclude_self=True, **common)
    widths = train.widths
    beta_loo = fit_problem(train, device)[0]
    residuals_t = np.ascontiguousarray(train.values_t - beta_loo[:, 0, :].T)
    problem = prepare(
        queries, X, y, widths, degree, **{**common, "n_categories": train.n_categories}
    )
    state = fit_problem(problem, device)
    module = kernels_for("local", device)
    with threads_for(problem):
        variance = module.local_interval_sums(
            *problem.kernel_groups(exclude_self=False), state, residuals_t
        )
    if kind == "observation":
        squared = np.ascontiguousarray(residuals_t**2)
        groups = problem.kernel_groups(degree=0, exclude_self=False)
        with threads_for(problem):
            local_var = module.local_fit(*groups, squared, False).beta[:, 0, :]
        variance = variance + local_var
    z = float(norm.ppf(1.0 - alpha / 2.0))
    fit = state.beta[:, 0, :]
    half = z * np.sqrt(np.maximum(variance, 0.0))
    lower, upper = fit - half, fit + half
    if problem.values_1d:
        fit, lower, upper = fit[:, 0], lower[:, 0], upper[:, 0]
    return (fit, lower, upper) if return_fit else (lower, upper)


def loo_term_weights(sample_weight, n):
    """The leave-one-out criterion's term weights, summing to 1 (uniform without weights)."""
    if sample_weight is None:
        return np.full(n, 1.0 / n)
    w = as_float_array(sample_weight, "sample_weight", ndim=(1,), dtype="float64")
    return w / w.sum()


def local_loo_loss(
    X,
    y,
    bandwidth="scott",
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    ridge=None,
    device="cpu",
):
    """The leave-one-out mean squared error of the local fit at the training points.

        CV = sum_i w_i sum_o (y_io - fit_{-i}(x_i)_o)^2 / sum_i w_i

    (statsmodels ``KernelReg.cv_loo`` when unweighted and with one output), where
    fit_{-i} leaves row i out of the keys; ``sample_weight`` weighs both the
    keys of every fit and the terms of the sum.
    """
    problem = prepare(
        X,
        X,
        y,
        bandwidth,
        degree,
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        sample_weight=sample_weight,
        missing=missing,
        exclude_self=True,
        ridge=ridge,
    )
    beta = fit_problem(problem, device)[0]
    errors = ((beta[:, 0, :] - problem.values_t.T) ** 2).sum(axis=1)
    return float(errors @ loo_term_weights(sample_weight, errors.shape[0]))
