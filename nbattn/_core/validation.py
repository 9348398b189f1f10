"""The one input layer of nbattn: array checks, dtype resolution, error wording.

Every function here either returns a new, checked value (inputs are never
modified) or raises a ValueError whose message starts with the name of the
offending argument, in one wording:

* ``"{name} must be ..."``                            wrong type, shape, sign or range
* ``"{name} contains NaN or inf (first at index i)"``  non-finite entries
* ``"{name} contains None (first at index i)"``        object arrays with holes
* ``"{name} holds complex values ..."``               never silently truncated
* ``"{name} has values beyond the float32 range ..."``  a float32 computation
  cannot hold them (an error, not inf with a warning)
* ``"{name} row i, column j: x / bandwidth h overflows ..."``  finite data that
  overflows only once divided by its width (:func:`scaled_columns`)

The dtype rule (:func:`resolve_dtype`): an explicit ``dtype`` wins; otherwise
float32 when every input is float32, float64 otherwise.

Host arrays go through :func:`as_float_array`, GPU arrays
(``__cuda_array_interface__``) through :func:`as_device_array`; the
functional modules (regression, attention, scores, positional, flash) use
nothing else.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .numeric import median

_DTYPES = {"float64": np.float64, "float32": np.float32}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT64_TINY = float(np.finfo(np.float64).tiny)
#: Widths whose square is a normal float64: sqrt(tiny) and sqrt(max).
_MIN_WIDTH = math.sqrt(_FLOAT64_TINY)
_MAX_WIDTH = math.sqrt(float(np.finfo(np.float64).max))


# --------------------------------------------------------------------------- wording
def shown(value) -> str:
    """``value`` as an error message shows it: its repr, with a NumPy scalar as the Python
    value it holds (``2.5``, not ``np.float64(2.5)``) and an array as its entries (a few
    of them, for a large one)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        return np.array2string(value, separator=", ", threshold=8, edgeitems=3)
    return repr(value)


def plural(n, word: str, many: str | None = None) -> str:
    """``n`` and the noun that counts it: ``"1 row"``, ``"2 rows"`` (``many``: a plural
    that is not ``word + "s"``, as ``plural(n, "process", "processes")``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


# --------------------------------------------------------------------------- dtypes and flags
def check_dtype(dtype) -> type:
    """Map "float64"/"float32" (or the NumPy types) to a NumPy scalar type; None is float64."""
    if dtype is None:
        return np.float64
    try:
        key = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    except TypeError:
        key = None
    if key not in _DTYPES:
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    return _DTYPES[key]


def resolve_dtype(dtype, *arrays) -> type:
    """The one dtype rule of nbattn: the computation's NumPy float type.

    An explicit ``dtype`` ("float64"/"float32" or the NumPy types) wins;
    otherwise float32 when every given array (NumPy, torch or GPU array) is
    float32, float64 otherwise. ``None`` entries in ``arrays`` are ignored.
    """
    if dtype is not None:
        return check_dtype(dtype)
    kinds = [str(getattr(a, "dtype", "")) for a in arrays if a is not None]
    return np.float32 if kinds and all(k.endswith("float32") for k in kinds) else np.float64


def check_bool(value, name: str) -> bool:
    """``value`` as a Python bool; anything but a bool (or NumPy bool) raises, naming ``name``.

    Strings such as ``"False"`` are truthy in Python; taking them as True would
    silently apply what the caller asked to leave out.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {shown(value)}")


def check_choice(value, name: str, choices):
    """``value`` if it is one of the strings ``choices``; a ValueError naming ``name`` otherwise.

    Anything but a string is refused before the membership test, so an
    unhashable or array value gets the same message, not a TypeError.
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {shown(value)}")
    return value


def check_positive_int(value, name: str) -> int:
    """``value`` as a Python int >= 1 (bools refused), naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
    return int(value)


def check_positive_float(value, name: str) -> float:
    """``value`` as a positive, finite Python float (bools refused), naming ``name`` otherwise."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name} must be a positive finite number, got {shown(value)}")
    return float(value)


def check_scale(scale, n_features: int, name: str = "scale") -> float:
    """The factor of a scaled dot product: ``1 / sqrt(n_features)`` for None, else a finite real."""
    if scale is None:
        return 1.0 / math.sqrt(n_features)
    if (
        isinstance(scale, (bool, np.bool_))
        or not isinstance(scale, numbers.Real)
        or not math.isfinite(scale)
    ):
        raise ValueError(f"{name} must be a finite real number or None, got {shown(scale)}")
    return float(scale)


# --------------------------------------------------------------------------- host arrays
def _index(flat_position, shape):
    return tuple(int(i) for i in np.unravel_index(flat_position, shape))


def _is_real_type(t) -> bool:
    """Entries of this type convert to float64 exactly as numbers (no strings, no None)."""
    return issubclass(t, (numbers.Real, np.bool_))  # NumPy's numbers are registered there


def _numeric(arr, name):
    """``arr`` with a bool, integer or float dtype; object arrays are checked entry by entry."""
    kind = arr.dtype.kind
    if kind == "c":
        raise ValueError(
            f"{name} holds complex values (dtype {arr.dtype}); nbattn works on real numbers, "
            "pass the real part or the modulus explicitly"
        )
    if kind in "biuf":
        return arr
    if kind != "O":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    flat = arr.reshape(-1)
    if all(_is_real_type(t) for t in set(map(type, flat))):
        return arr.astype(np.float64)
    for position, item in enumerate(flat):
        if item is None:
            raise ValueError(f"{name} contains None (first at index {_index(position, arr.shape)})")
        if isinstance(item, (complex, np.complexfloating)):
            raise ValueError(
                f"{name} holds complex values (first at index {_index(position, arr.shape)}); "
                "nbattn works on real numbers"
            )
        if isinstance(item, (str, bytes)) or not isinstance(item, (numbers.Real, np.generic)):
            raise ValueError(
                f"{name} must be numeric; the entry at index {_index(position, arr.shape)} is "
                f"of type {type(item).__name__}"
            )
    return arr.astype(np.float64)


def as_float_array(
    x,
    name: str,
    ndim: tuple[int, ...] | None = None,
    dtype=None,
    *,
    min_ndim: int = 0,
    allow_neg_inf: bool = False,
    allow_bool: bool = True,
) -> np.ndarray:
    """A checked, finite float32/float64 copy of ``x``.

    Parameters
    ----------
    x : array_like
        Anything ``np.asarray`` accepts (lists, DataFrames, CPU tensors).
    name : str
        The argument's name, used in every error message.
    ndim : tuple of int, optional
        The allowed numbers of dimensions; ``min_ndim`` a lower bound instead.
    dtype : None, "float32" or "float64"
        The result's dtype; None keeps float32 and float64 and turns anything
        else (integers, bools, float16, long double) into float64.
    allow_neg_inf : bool
        Let ``-inf`` through (additive masks, log-normalisers).
    allow_bool : bool
        Whether a boolean array counts as numeric.

    Raises
    ------
    ValueError
        Naming ``name``: not convertible, non-numeric (strings, datetimes),
        complex, None in an object array, wrong dimensions, empty, NaN or inf,
        or finite values beyond the float32 range when the result is float32.
    """
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists, tensors that require grad, ...
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    arr = _numeric(arr, name)
    if arr.dtype.kind == "b" and not allow_bool:
        raise ValueError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim not in ndim:
        want = " or ".join(f"{n}-D" for n in ndim)
        raise ValueError(f"{name} must be {want}, got an array of shape {arr.shape}")
    if arr.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got an array of shape {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if dtype is not None:
        target = check_dtype(dtype)
    else:
        target = np.float32 if arr.dtype == np.float32 else np.float64
    source = arr if arr.dtype.kind == "f" and arr.dtype.itemsize <= 8 else arr.astype(np.float64)
    finite = np.isfinite(source)
    bad = None
    if not finite.all():  # only then work out which entries are refused
        bad = ~finite if not allow_neg_inf else np.isnan(source) | (source == np.inf)
    if bad is not None and bad.any():
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        first = _index(int(np.argmax(bad.reshape(-1))), arr.shape)
        raise ValueError(f"{name} contains {what} (first at index {first})")
    if target is np.float32 and source.dtype != np.float32:
        values = source[finite]
        largest = float(np.abs(values).max()) if values.size else 0.0
        if largest > _FLOAT32_MAX:
            raise ValueError(
                f"{name} has values beyond the float32 range (largest magnitude {largest:.3g} > "
                f"{_FLOAT32_MAX:.3g}); compute in float64 (dtype='float64') or rescale the data"
            )
    return np.array(source, dtype=target, copy=True)


def broadcast_leading(shapes_by_name: dict) -> tuple[int, ...]:
    """Broadcast the leading (batch, head) dimensions; a ValueError names every argument."""
    try:
        return tuple(np.broadcast_shapes(*shapes_by_name.values()))
    except ValueError:
        desc = ", ".join(f"{n} {tuple(s)}" for n, s in shapes_by_name.items())
        raise ValueError(f"the leading (batch) dimensions do not broadcast: {desc}") from None


def _log_max_abs(x) -> float:
    """log of the largest magnitude in ``x`` (-inf for all zeros), without overflow."""
    top = max(float(x.max()), -float(x.min()))  # no |x| temporary
    return math.log(top) if top > 0 else -math.inf


def check_dot_range(q, k, scale: float, dtype, name: str = "q and k") -> None:
    """Refuse scaled dot products ``scale * q . k`` that could overflow ``dtype``.

    The bound |scale| max|q| max|k| E (and |scale| max|q| alone, which the
    kernels form first) must stay below 1/16 of the dtype's largest value,
    so that scores, biases and ALiBi terms add up without overflow and a
    softmax never meets inf - inf. The message names ``name``.
    """
    if scale == 0.0:
        return
    log_limit = math.log(float(np.finfo(dtype).max) / 16)
    log_q = math.log(abs(scale)) + _log_max_abs(q)
    log_bound = log_q + _log_max_abs(k) + math.log(q.shape[-1])
    if log_q > log_limit or log_bound > log_limit:
        reach = max(log_q, log_bound) / math.log(10)
        advice = "rescale them" + (" (or use float64 inputs)" if dtype != np.float64 else "")
        raise ValueError(
            f"{name}: the scores scale * q . k can reach about 10**{reach:.0f}, beyond what "
            f"{np.dtype(dtype).name} can hold (10**{log_limit / math.log(10):.0f}); {advice}"
        )


def check_same_features(a, b, name_a: str, name_b: str) -> None:
    """The last dimensions of ``a`` and ``b`` agree (host or GPU arrays)."""
    n_a, n_b = a.shape[len(a.shape) - 1], b.shape[len(b.shape) - 1]  # simulator shapes lack [-1]
    if n_a != n_b:
        raise ValueError(f"{name_a} has {plural(n_a, 'feature')} but {name_b} has {n_b}")


# --------------------------------------------------------------------------- GPU arrays
def as_columns(x, name: str, dtype=None) -> np.ndarray:
    """:func:`as_float_array` of a 1-D or 2-D ``x``, as (n, d) columns: (n,) becomes (n, 1)."""
    arr = as_float_array(x, name, ndim=(1, 2), dtype=dtype)
    return arr[:, None] if arr.ndim == 1 else arr


def check_pooling_inputs(queries, keys, values=None):
    """Queries (n_q, d), keys (n_k, d) and values (n_k, p) of attention pooling, float64.

    1-D queries and keys are one feature; 1-D values are one output. Raises a
    ValueError naming the argument when features or rows do not match.
    Returns ``(queries, keys, values, values_1d)``; values is None when not given.
    """
    keys = as_columns(keys, "keys", np.float64)
    queries = as_columns(queries, "queries", np.float64)
    check_same_features(queries, keys, "queries", "keys")
    if values is None:
        return queries, keys, None, False
    values_arr = as_float_array(values, "values", ndim=(1, 2), dtype=np.float64)
    if values_arr.shape[0] != keys.shape[0]:
        raise ValueError(
            f"values has {plural(values_arr.shape[0], 'row')} but keys has {keys.shape[0]}"
        )
    values_1d = values_arr.ndim == 1
    return queries, keys, (values_arr[:, None] if values_1d else values_arr), values_1d


# --------------------------------------------------------------------------- bandwidths
def check_bandwidth(
    bandwidth, n_features: int, name: str = "bandwidth", *, square_representable: bool = False
) -> np.ndarray:
    """A positive, finite per-feature bandwidth array of shape (n_features,), float64.

    ``bandwidth`` is a positive float (the same for every feature) or an array
    of n_features positive floats. Refused, naming ``name``: strings (resolve
    rule names first), NaN, inf, zero or negative widths, and subnormal widths
    (1 / h overflows: every weight would underflow and every prediction would
    be 0). The streaming kernels need only 1 / h, so data at 1e-170 with
    widths at 1e-170 is fine. With ``square_representable``, widths whose
    square under- or overflows float64 (h outside [1.5e-154, 1.3e154]) are
    refused too: the scaled dot-product form of the Gaussian score needs
    1 / h**2.
    """
    if isinstance(bandwidth, str):
        raise ValueError(f"{name}={shown(bandwidth)} is not a number; resolve rule names first")
    if isinstance(bandwidth, (bool, np.bool_)):
        raise ValueError(f"{name} must be a positive float or array, got {shown(bandwidth)}")
    if isinstance(bandwidth, numbers.Real):
        h = np.full(n_features, float(bandwidth))
    else:
        h = as_float_array(bandwidth, name, dtype="float64", allow_bool=False).reshape(-1)
        if h.size == 1:
            h = np.full(n_features, h[0])
        elif h.size != n_features:
            raise ValueError(
                f"{name} has {plural(h.size, 'entry', 'entries')} but the data has "
                f"{plural(n_features, 'feature')}"
            )
    if not np.isfinite(h).all() or (h <= 0).any():
        raise ValueError(f"{name} must be positive and finite, got {shown(bandwidth)}")
    smallest, largest = float(h.min()), float(h.max())
    if smallest < _FLOAT64_TINY:
        raise ValueError(
            f"{name} holds the subnormal width {smallest:.3g}: every Gaussian weight would "
            "underflow to 0; rescale the data (multiply it by a power of ten)"
        )
    if square_representable and (smallest < _MIN_WIDTH or largest > _MAX_WIDTH):
        bad = smallest if smallest < _MIN_WIDTH else largest
        what = "underflows" if bad < 1.0 else "overflows"
        raise ValueError(
            f"{name} holds the width {bad:.3g}, whose square {what} float64 (widths must lie in "
            f"[{_MIN_WIDTH:.2g}, {_MAX_WIDTH:.2g}]); rescale the data (multiply or divide it "
            "by a power of ten)"
        )
    return h


def check_rtol(rtol) -> float:
    """``rtol`` as a float in [0, 1); anything else raises a ValueError naming it."""
    if isinstance(rtol, (bool, np.bool_)) or not isinstance(
        rtol, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"rtol must be a number in [0, 1), got {rtol!r}")
    value = float(rtol)
    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise ValueError(f"rtol must be a finite number in [0, 1), got {rtol!r}")
    return value


# ------------------------------------------------------------------------ data in units of widths
def _where(index, ndim: int) -> str:
    """``"row i, column j"`` of a 2-D position; ``"row (b, i), column j"`` beyond."""
    index = tuple(int(i) for i in index)
    row = index[0] if ndim == 2 else index[:-1]
    return f"row {row}, column {index[-1]}"


def centred_columns(x) -> np.ndarray:
    """Finite (n, d) float64 ``x`` with each column centred on its median.

    Where ``x - median`` overflows (a column spanning more than the float64
    range from its median, as [-1.7e308, -1.7e308, 1.7e308]), that column is
    centred on its midrange ``max / 2 + min / 2`` instead, from which no entry
    is further than the largest float64.
    """
    x = np.asarray(x, dtype=np.float64)
    centre = median(x)
    with np.errstate(over="ignore", invalid="ignore"):
        centred = x - centre
    wide = ~np.isfinite(centred).all(axis=0)
    if wide.any():
        mid = x[:, wide].max(axis=0) / 2 + x[:, wide].min(axis=0) / 2
        centred[:, wide] = x[:, wide] - mid
    return centred


def scaled_columns(
    x,
    name: str,
    widths,
    *,
    scale=None,
    centre=None,
    dtype=np.float64,
    width_name: str = "bandwidth",
    allow_nan: bool = False,
) -> np.ndarray:
    """Data in units of its widths: ``(x - centre) / widths`` per column (the last axis),
    computed in float64 and rounded once to ``dtype``; or ``(x - centre) * scale`` when
    ``scale`` (a per-column multiplier, as ``1 / (widths sqrt 2)``) is given.

    The one place where nbattn divides user data by widths. Finite data can
    overflow only here, once scaled (data near 1e308 over a width of 0.01,
    or ``x - centre`` beyond the float64 range). Where the right value is
    reachable it is returned: an entry whose ``x - centre`` overflows is
    computed as ``x * scale - centre * scale`` (no cancellation: x and the
    centre then have opposite signs). An entry whose scaled value lies beyond
    float64 (or beyond float32 when ``dtype`` is float32) raises a ValueError
    that names ``name``, the entry's row and column, its value and its width,
    and no RuntimeWarning escapes. ``allow_nan`` lets NaN entries of ``x``
    through as NaN (missing data); inf is never expected in ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    widths = np.broadcast_to(np.asarray(widths, dtype=np.float64), (d,))
    factor = None if scale is None else np.broadcast_to(np.asarray(scale, np.float64), (d,))
    c = None if centre is None else np.broadcast_to(np.asarray(centre, np.float64), (d,))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        shifted = x if c is None else x - c
        z = shifted / widths if factor is None else shifted * factor
        if c is not None:
            bad = np.isinf(z)
            if bad.any():  # x - centre overflowed: scale first, then subtract
                cols = np.nonzero(bad)[-1]
                f = 1.0 / widths[cols] if factor is None else factor[cols]
                z[bad] = x[bad] * f - c[cols] * f
        overflow = np.isinf(z) | (np.isnan(z) & ~np.isnan(x))
        if not allow_nan:
            overflow |= np.isnan(x)  # not expected: the caller checked x
        target = np.dtype(dtype)
        limit = float(np.finfo(target).max)
        beyond = None
        if target != np.float64:
            beyond = np.abs(z) > limit

    def first_of(bad) -> str:
        """``"name row i, column j: (x - centre) / width h"`` of the first entry of ``bad``."""
        index = np.unravel_index(int(np.argmax(bad.reshape(-1))), x.shape)
        col = int(index[-1])
        value = f"{float(x[index]):.3g}"
        if c is not None and c[col] != 0.0:
            value = f"({value} - centre {c[col]:.3g})"
        return f"{name} {_where(index, x.ndim)}: {value} / {width_name} {widths[col]:.3g}"

    if overflow.any():
        raise ValueError(
            f"{first_of(overflow)} overflows float64; rescale the column (divide it by a "
            f"power of ten) or widen the {width_name}"
        )
    if beyond is not None and beyond.any():
        raise ValueError(
            f"{first_of(beyond)} lies beyond the {target.name} range ({limit:.3g}) once "
            "scaled; compute in float64 (dtype='float64') or rescale the column"
        )
    return z if target == np.float64 else z.astype(target)
