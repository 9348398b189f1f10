"""Input checks shared by the functional API and the estimators.

Every check returns a new array (inputs are never modified) and raises a
ValueError that names the offending argument.
"""

from __future__ import annotations

import numbers

import numpy as np

_DTYPES = {"float64": np.float64, "float32": np.float32}


def check_dtype(dtype) -> type:
    """Map "float64"/"float32" (or the NumPy types) to a NumPy scalar type."""
    if dtype is None:
        return np.float64
    key = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
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
    raise ValueError(f"{name} must be True or False, got {value!r}")


def as_float_array(x, name: str, ndim: tuple[int, ...], dtype=None) -> np.ndarray:
    """A finite float array with ``x.ndim`` in ``ndim``.

    Accepts anything ``np.asarray`` accepts (DataFrames included). Raises a
    ValueError naming ``name`` for non-numeric data, wrong dimensions, empty
    arrays and NaN or inf entries.
    """
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be numeric; got dtype {arr.dtype}: {exc}") from exc
    if arr.ndim not in ndim:
        want = " or ".join(f"{n}-D" for n in ndim)
        raise ValueError(f"{name} must be {want}, got an array of shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    target = (
        check_dtype(dtype)
        if dtype is not None
        else (arr.dtype.type if arr.dtype.kind == "f" and arr.dtype.itemsize >= 4 else np.float64)
    )
    arr = np.array(arr, dtype=target, copy=True)
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(
            f"{name} contains NaN or inf (first at index {tuple(int(i) for i in bad)})"
        )
    return arr


def check_bandwidth(bandwidth, n_features: int, name: str = "bandwidth") -> np.ndarray:
    """A positive, finite per-feature bandwidth array of shape (n_features,).

    ``bandwidth`` is a positive float (the same for every feature) or an array
    of n_features positive floats.
    """
    if isinstance(bandwidth, str):
        raise ValueError(f"{name}={bandwidth!r} is not a number; resolve rule names first")
    if isinstance(bandwidth, numbers.Real) and not isinstance(bandwidth, bool):
        h = np.full(n_features, float(bandwidth))
    else:
        try:
            h = np.asarray(bandwidth, dtype=np.float64).reshape(-1).copy()
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{name} must be a positive float or array, got {bandwidth!r}"
            ) from exc
        if h.size == 1:
            h = np.full(n_features, h[0])
        elif h.size != n_features:
            raise ValueError(f"{name} has {h.size} entries but the data has {n_features} features")
    if not np.isfinite(h).all() or (h <= 0).any():
        raise ValueError(f"{name} must be positive and finite, got {bandwidth!r}")
    return h


def check_same_features(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    n_a, n_b = a.shape[len(a.shape) - 1], b.shape[len(b.shape) - 1]  # simulator shapes lack [-1]
    if n_a != n_b:
        raise ValueError(f"{name_a} has {n_a} features but {name_b} has {n_b}")
