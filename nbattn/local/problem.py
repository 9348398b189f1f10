"""The inputs of a local fit, checked once: :class:`LocalSpec` (the options) and
:class:`LocalProblem` (the data laid out for the kernels).

The public functions of :mod:`nbattn.local.engine` and :mod:`nbattn.local.widths`
take the options as keywords, check them and the data here (:func:`prepare`), and
hand the engine a :class:`LocalProblem`. The estimators check X themselves
(scikit-learn's ``validate_data``, their own category codes) and build the spec
and the problem from it directly (:func:`LocalSpec` and :func:`layout`), so X is
checked once per fit. Conventions (column kinds, kernels, widths, missing values)
are the engine's module docstring.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np

from .. import config
from .._core.columns import CONTINUOUS_KERNELS as KERNELS
from .._core.columns import check_var_type
from .._core.local_groups import KERNEL_CODES, LocalData, LocalModel
from .._core.numeric import median
from .._core.validation import (
    as_float_array,
    check_bandwidth,
    check_bool,
    check_choice,
    check_positive_float,
    check_rtol,
    scaled_columns,
)
from .neighbours import BANDWIDTH_TYPES, check_neighbour_counts, neighbour_widths

__all__ = [
    "DEFAULT_RIDGE",
    "SPEC_OPTIONS",
    "KERNELS",
    "LocalProblem",
    "LocalSpec",
    "check_columns",
    "check_data",
    "check_degree",
    "check_n_categories",
    "check_sample_weight",
    "check_spec",
    "check_widths",
    "default_widths",
    "lambda_max",
    "layout",
    "log_key_weights",
    "prepare",
    "rule_lambdas",
    "rule_widths",
    "spec_options",
]

_MISSING = ("error", "marginalize")
#: Default relative ridge of the local solve (the engine's module docstring).
DEFAULT_RIDGE = config.LOCAL_RIDGE


# --------------------------------------------------------------------------- the options
#: The keywords of the public local functions that make their :class:`LocalSpec`.
SPEC_OPTIONS = (
    "var_type",
    "n_categories",
    "kernel",
    "missing",
    "ridge",
    "device",
    "rtol",
    "bandwidth_type",
)


def spec_options(arguments: dict) -> dict:
    """The :data:`SPEC_OPTIONS` among a public function's arguments (its ``locals()``;
    a function without ``rtol`` is exact)."""
    return {name: arguments[name] for name in SPEC_OPTIONS if name in arguments}


@dataclass(frozen=True)
class LocalSpec:
    """The options of a local fit, checked (:func:`check_spec`) or built by a fitted model.

    ``var_type`` one letter per column ('c', 'u', 'o'); ``n_categories`` the
    categories per column (0 for 'c'); ``kernel`` a name of ``KERNELS``;
    ``missing`` whether NaN entries are marginalised; ``ridge`` the relative
    ridge of the local solve; ``device`` "cpu", "cuda" or "auto"; ``rtol`` the
    relative error allowed on every kernel sum (0: exact; ``nbattn.local.leaves``);
    ``bandwidth_type`` "fixed" (a width h per continuous column) or a nearest-neighbour
    type (an integer k per continuous column: :mod:`nbattn.local.neighbours`).
    """

    var_type: str
    n_categories: tuple
    kernel: str = "gaussian"
    missing: bool = False
    ridge: float = DEFAULT_RIDGE
    device: str = "cpu"
    rtol: float = 0.0
    bandwidth_type: str = "fixed"

    def __post_init__(self):
        if self.bandwidth_type != "fixed" and self.rtol > 0.0:
            check_bandwidth_type(self.bandwidth_type, rtol=self.rtol)  # its error

    @property
    def nearest_neighbour(self) -> bool:
        """Whether the continuous columns' widths are nearest-neighbour counts k."""
        return self.bandwidth_type != "fixed"

    @property
    def continuous(self) -> np.ndarray:
        """(d,) bool: which columns are continuous."""
        return np.array([kind == "c" for kind in self.var_type], dtype=bool)

    @property
    def counts(self) -> np.ndarray:
        """(d,) int64 categories per column (0 for 'c')."""
        return np.asarray(self.n_categories, dtype=np.int64).reshape(len(self.var_type))


def check_spec(
    n_columns,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    missing="error",
    ridge=None,
    device="cpu",
    rtol=0.0,
    bandwidth_type="fixed",
    data=(),
) -> LocalSpec:
    """The options checked into a :class:`LocalSpec`; ``data`` (checked (n, d) arrays)
    give ``n_categories=None`` its counts (one more than the largest code). With
    ``rtol > 0`` "auto" becomes "cpu": the pruned GPU passes (``BlockRuns``) run where
    "cuda" is asked for, and are measured on the simulator only so far."""
    marginalize = check_choice(missing, "missing", _MISSING) == "marginalize"
    rtol = check_rtol(rtol)
    if rtol > 0.0 and device == "auto":
        device = "cpu"
    var_type = check_var_type(var_type, n_columns)
    counts = check_n_categories(n_categories, var_type, *data)
    bandwidth_type = check_bandwidth_type(bandwidth_type, rtol=rtol, missing=marginalize)
    return LocalSpec(
        var_type=var_type,
        n_categories=tuple(int(c) for c in counts),
        kernel=check_choice(kernel, "kernel", KERNELS),
        missing=marginalize,
        ridge=DEFAULT_RIDGE if ridge is None else _check_ridge(ridge),
        device=device,
        rtol=rtol,
        bandwidth_type=bandwidth_type,
    )


def check_bandwidth_type(bandwidth_type, *, rtol=0.0, missing=False) -> str:
    """``bandwidth_type`` checked (:data:`nbattn.local.neighbours.BANDWIDTH_TYPES`); a
    nearest-neighbour type is exact (``rtol`` 0: the pruned passes bound a leaf by one
    width per column) and needs complete continuous columns (``missing="error"``)."""
    bandwidth_type = check_choice(bandwidth_type, "bandwidth_type", BANDWIDTH_TYPES)
    if bandwidth_type != "fixed":
        if rtol > 0.0:
            raise ValueError(
                f"bandwidth_type={bandwidth_type!r} is exact: rtol must be 0 (the pruned "
                f"passes bound a leaf of keys by one width per column), got rtol={rtol!r}"
            )
        if missing:
            raise ValueError(
                f"bandwidth_type={bandwidth_type!r} needs complete continuous columns: "
                'missing="marginalize" is not available with nearest-neighbour widths'
            )
    return bandwidth_type


def check_columns(named: dict, **options):
    """Data and options of a local fit checked together: ``(spec, arrays)``.

    ``named`` maps each dataset's name to its array-like (the first is the keys
    or X): each becomes float64 (n, d) columns (1-D is one column; NaN only with
    ``missing="marginalize"``), all with the first's d; ``options`` are the
    keywords of :func:`check_spec` (``n_categories=None`` counts the codes of
    the first: the categories are the keys', so a fit at one query never depends
    on the codes of another), and every categorical column's codes must then be
    integers in 0 .. c - 1.
    """
    allow_nan = check_choice(options.get("missing", "error"), "missing", _MISSING) == "marginalize"
    arrays = [as_data_columns(x, name, allow_nan) for name, x in named.items()]
    first, d = next(iter(named)), arrays[0].shape[1]
    for name, arr in zip(named, arrays):
        if arr.shape[1] != d:
            raise ValueError(f"{name} has {arr.shape[1]} features but {first} has {d}")
    spec = check_spec(d, data=arrays[:1], **options)
    for name, arr in zip(named, arrays):
        _check_all_codes(spec, arr, name)
    return spec, arrays


def check_data(spec: LocalSpec, x, name) -> np.ndarray:
    """More data for a checked spec (queries of a fitted problem), checked as
    :func:`check_columns` checks its datasets."""
    arr = as_data_columns(x, name, spec.missing)
    if arr.shape[1] != len(spec.var_type):
        raise ValueError(
            f"{name} has {arr.shape[1]} features but the fit has {len(spec.var_type)} "
            f"(var_type={spec.var_type!r})"
        )
    _check_all_codes(spec, arr, name)
    return arr


def _check_all_codes(spec, arr, name):
    for position, kind in enumerate(spec.var_type):
        if kind != "c":
            _check_codes(arr[:, position], name, position, spec.n_categories[position])


def check_degree(degree) -> int:
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


def check_widths(
    bandwidth, var_type, n_categories, name="bandwidth", bandwidth_type="fixed"
) -> np.ndarray:
    """Per-column widths (d,) float64: h > 0 (normal) for 'c' (with a nearest-neighbour
    ``bandwidth_type``, an integer k >= 1 instead: its upper end, n - 1, is checked by the
    layout, which knows n); for a categorical column l in
    [0, (c-1)/c] for 'u' (the end is the uniform kernel: the column ignored) and l in [0, 1)
    for 'o' (at l = 1 the Wang-van Ryzin kernel is 0 for every pair: no weight is left, and
    the fit would fall back to its nearest neighbours)."""
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
    cont = np.array([k == "c" for k in var_type], dtype=bool)
    if cont.any() and bandwidth_type != "fixed":
        arr[cont] = check_neighbour_counts(arr[cont], math.inf, name)
    elif cont.any():
        arr[cont] = check_bandwidth(arr[cont], int(cont.sum()), name)
    top = lambda_max(var_type, n_categories)
    for position, kind in enumerate(var_type):
        if kind == "c":
            continue
        lam = arr[position]
        if kind == "o" and lam >= 1.0:
            raise ValueError(
                f"{name}[{position}] is the smoothing l of the ordered column {position}; it "
                f"must lie in [0, 1), got {float(lam)!r}: at l = 1 the ordered kernel "
                "(1 - l at the own level) is 0 for every pair"
            )
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
            out[c] = feature_spread(col[:, None], name="keys", columns=[c])[0]
    return out


def default_widths(X, var_type=None, n_categories=None, rule="scott") -> np.ndarray:
    """Rule-of-thumb widths per column of X (checked here): :func:`rule_widths`."""
    spec, (X,) = check_columns(
        {"X": X}, var_type=var_type, n_categories=n_categories, missing="marginalize"
    )
    return rule_widths(spec, X, rule)


def rule_widths(spec: LocalSpec, X, rule="scott") -> np.ndarray:
    """Rule-of-thumb widths per column of the checked X: a bandwidth rule's h for 'c',
    a default l otherwise.

    Continuous columns get ``regression.rule_bandwidth`` of their spread
    (``factor(n, d) sigma_c``, Scott or Silverman, d the number of columns; a
    constant column gets factor times 1). Categorical columns get
    :func:`rule_lambdas`. Missing entries (NaN) are left out of the spreads.
    """
    from ..smoothing.regression import BANDWIDTH_RULES, rule_bandwidth

    check_choice(rule, "bandwidth rule", sorted(BANDWIDTH_RULES))
    n, d = X.shape
    out = rule_lambdas(spec.var_type, spec.n_categories, n, rule)
    cont = spec.continuous
    if cont.any():
        h = rule_bandwidth(_nan_spread(X[:, cont]), n, rule)
        # rule_bandwidth's factor uses the number of continuous columns; use all d
        factor = BANDWIDTH_RULES[rule](n, d) / BANDWIDTH_RULES[rule](n, int(cont.sum()))
        out[cont] = h * factor
    return out


def rule_lambdas(var_type: str, n_categories, n, rule="scott") -> np.ndarray:
    """A rule's smoothing l per categorical column (0 for a continuous one), for n rows
    (or an effective number of rows, any real n > 0) and d = len(var_type) columns.

    ``l = lambda_max factor(max(n, 2), d)``: like h, a fixed share of the column's
    range that shrinks with n (lambda_max = (c-1)/c for 'u', 1 for 'o'). Below two rows
    there is no spread to measure, and the factor of two rows (below 1 for either
    rule and any d) keeps l strictly inside its range: the ordered kernel is 0 at
    l = 1, and l = lambda_max would turn the column off whatever the data.
    """
    from ..smoothing.regression import BANDWIDTH_RULES

    check_choice(rule, "bandwidth rule", sorted(BANDWIDTH_RULES))
    top = lambda_max(var_type, n_categories)
    factor = BANDWIDTH_RULES[rule](max(float(n), 2.0), len(var_type))
    # the largest float below each end, should the factor ever round to 1 (d near 1e16)
    return np.minimum(top * factor, np.nextafter(top, 0.0))


# --------------------------------------------------------------------------- layout
def _no_stretch():
    return np.zeros((0, 0))


@dataclass
class LocalProblem:
    """Checked inputs laid out for ``nbattn.kernels.local`` (see its docstring): the
    continuous columns centred and divided by their widths (queries row-major, keys
    column-major), the category codes, the categorical score terms, the keys' log
    weights and the values column-major."""

    spec: LocalSpec
    q_cont: np.ndarray
    keys_cont_t: np.ndarray
    q_cat: np.ndarray
    keys_cat_t: np.ndarray
    cat_params: np.ndarray
    log_weights: np.ndarray
    sample_weight: np.ndarray | None  # the checked key weights (None: all 1)
    values_t: np.ndarray
    degree: int
    exclude_self: bool
    h: np.ndarray  # widths of the continuous columns
    widths: np.ndarray
    values_1d: bool
    #: the centre subtracted from each continuous column before the division by h
    centre: np.ndarray | None = None
    #: nearest-neighbour widths (:mod:`nbattn.local.neighbours`): (n_q, dc) the queries'
    #: stretches h / h(x) (generalised), else (0, 0)
    q_stretch: np.ndarray = dataclasses.field(default_factory=_no_stretch)
    #: (dc, n_k) the keys' stretches h / h_j (adaptive), else (0, 0)
    keys_stretch_t: np.ndarray = dataclasses.field(default_factory=_no_stretch)

    @property
    def stretched(self) -> bool:
        """Whether the problem has nearest-neighbour widths (a stretch per query or key)."""
        return self.q_stretch.shape[0] > 0 or self.keys_stretch_t.shape[1] > 0

    def kernel_groups(self, **model_changes):
        """The local kernels' argument groups for this problem, ``(LocalData,
        LocalModel)`` (``nbattn._core.local_groups``, the same on CPU and GPU);
        ``model_changes`` replace fields of the model (``degree``, ``exclude_self``).
        Adaptive widths' 1 / h_j enters each key's log weight as log(h / h_j)."""
        log_weights = self.log_weights
        if self.keys_stretch_t.shape[1] > 0:
            log_weights = np.ascontiguousarray(
                log_weights + np.log(self.keys_stretch_t).sum(axis=0)
            )
        stretched = self.stretched  # else None: the kernels compile without the stretches
        data = LocalData(
            self.q_cont,
            self.keys_cont_t,
            self.q_cat,
            self.keys_cat_t,
            log_weights,
            self.q_stretch if stretched else None,
            self.keys_stretch_t if stretched else None,
        )
        model = LocalModel(
            cat_params=self.cat_params,
            kernel=KERNEL_CODES[self.spec.kernel],
            degree=int(self.degree),
            ridge=float(self.spec.ridge),
            exclude_self=bool(self.exclude_self),
            missing=bool(self.spec.missing),
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


def log_key_weights(sample_weight, n_keys) -> np.ndarray:
    """log w_j of checked non-negative key weights (0 for every key without weights)."""
    if sample_weight is None:
        return np.zeros(n_keys)
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(sample_weight, dtype=np.float64))


def layout(
    spec: LocalSpec,
    queries,
    keys,
    values,
    widths,
    degree,
    *,
    sample_weight=None,
    exclude_self=False,
) -> LocalProblem:
    """Checked inputs laid out for the kernels (nothing is checked again here).

    ``queries`` (n_q, d) and ``keys`` (n, d) float64 columns of ``spec``
    (:func:`check_data`), ``values`` (n,) or (n, m) float64, ``widths`` (d,)
    checked widths (:func:`check_widths`), ``sample_weight`` (n,) non-negative
    with a positive entry, or None. The continuous columns are centred on the
    keys' median and divided by their widths; that must stay finite.
    """
    values = np.asarray(values, dtype=np.float64)
    values_1d = values.ndim == 1
    values_2d = values[:, None] if values_1d else values
    cont = spec.continuous
    h = widths[cont]
    kc, qc = keys[:, cont], queries[:, cont]
    stretches = {}
    if spec.nearest_neighbour and cont.any():
        names = [f"column {j}" for j in np.flatnonzero(cont)]
        h, q_stretch, keys_stretch_t = neighbour_widths(
            spec.bandwidth_type, h, kc, qc, bool(exclude_self), names
        )
        stretches = {"q_stretch": q_stretch, "keys_stretch_t": keys_stretch_t}
    if not cont.any():
        centre = np.zeros(0)
    elif spec.missing and np.isnan(kc).any():
        with warnings.catch_warnings():  # an all-NaN column has no centre: use 0
            warnings.simplefilter("ignore", RuntimeWarning)
            centre = median(kc, skip_nan=True)
        centre = np.where(np.isnan(centre), 0.0, centre)
    else:
        centre = median(kc)
    missing = bool(spec.missing)
    q_cont = scaled_columns(qc, "queries", h, centre=centre, allow_nan=missing)
    keys_cont_t = scaled_columns(kc, "keys", h, centre=centre, allow_nan=missing).T
    q_cont, keys_cont_t = np.ascontiguousarray(q_cont), np.ascontiguousarray(keys_cont_t)
    return LocalProblem(
        spec=spec,
        q_cont=q_cont,
        keys_cont_t=keys_cont_t,
        q_cat=np.ascontiguousarray(queries[:, ~cont]),
        keys_cat_t=np.ascontiguousarray(keys[:, ~cont].T),
        cat_params=categorical_terms(spec.var_type, spec.n_categories, widths),
        log_weights=log_key_weights(sample_weight, keys.shape[0]),
        sample_weight=sample_weight,
        # writable: a read-only y (a fitted model's memory-mapped y_fit_) would compile
        # every pass again for read-only arrays
        values_t=np.require(values_2d.T, requirements=("C", "W")),
        degree=int(degree),
        exclude_self=bool(exclude_self),
        h=h,
        widths=widths,
        values_1d=values_1d,
        centre=centre,
        **stretches,
    )


def prepare(
    queries, keys, values, bandwidth, degree, *, sample_weight=None, exclude_self=False, **options
) -> LocalProblem:
    """Check every input of a public local fit once and lay them out (:func:`layout`).

    ``bandwidth`` a rule name (:func:`rule_widths` of the keys) or widths;
    ``options`` the :data:`SPEC_OPTIONS`; all as in
    :func:`nbattn.local.engine.local_polynomial`.
    """
    spec, (keys, queries) = check_columns({"keys": keys, "queries": queries}, **options)
    values = as_float_array(values, "values", ndim=(1, 2), dtype="float64")
    if values.shape[0] != keys.shape[0]:
        raise ValueError(f"values has {values.shape[0]} rows but keys has {keys.shape[0]}")
    degree = check_degree(degree)
    exclude_self = check_bool(exclude_self, "exclude_self")
    if exclude_self and queries.shape[0] != keys.shape[0]:
        raise ValueError(
            "exclude_self=True pairs query i with key i, so queries and keys must have the "
            f"same number of rows; got {queries.shape[0]} and {keys.shape[0]}"
        )
    widths = resolve_widths(spec, keys, bandwidth)
    sample_weight = check_sample_weight(sample_weight, keys.shape[0])
    return layout(
        spec,
        queries,
        keys,
        values,
        widths,
        degree,
        sample_weight=sample_weight,
        exclude_self=exclude_self,
    )


def resolve_widths(spec: LocalSpec, keys, bandwidth) -> np.ndarray:
    """A rule name's widths on the checked keys (:func:`rule_widths`), or checked widths."""
    if isinstance(bandwidth, str):
        if spec.nearest_neighbour:
            raise ValueError(
                f"bandwidth={bandwidth!r}: with bandwidth_type={spec.bandwidth_type!r} the "
                "widths are an integer k per continuous column (or a search of the caller's)"
            )
        return rule_widths(spec, keys, bandwidth)
    return check_widths(bandwidth, spec.var_type, spec.counts, bandwidth_type=spec.bandwidth_type)


def check_sample_weight(sample_weight, n_keys):
    """Key weights as a float64 (n_keys,) array: non-negative, one at least positive
    (None stays None: every key weighs 1; equal weights become None too, since every use
    of them is scale-free: the unweighted computation, bit for bit, at any value)."""
    if sample_weight is None:
        return None
    w = as_float_array(sample_weight, "sample_weight", ndim=(1,), dtype="float64")
    if w.shape[0] != n_keys:
        raise ValueError(f"sample_weight has {w.shape[0]} entries but keys has {n_keys} rows")
    if (w < 0).any():
        raise ValueError(
            f"sample_weight must be >= 0; entry {int(np.argmax(w < 0))} is {w[w < 0][0]!r}"
        )
    if not (w > 0).any():
        raise ValueError("sample_weight is zero everywhere: no key has weight")
    return None if np.all(w == w[0]) else w


def _check_ridge(ridge):
    if isinstance(ridge, (int, float, np.floating, np.integer)) and ridge == 0:
        return 0.0
    return check_positive_float(ridge, "ridge")
