"""Attention scoring functions s(q, k) of the attention chapter (seed 000) and their registry.

Every function takes queries ``q`` (..., L, Eq) and keys ``k`` (..., S, Ek)
with any leading batch dimensions (broadcast like NumPy/torch) and returns
the score matrix (..., L, S), ``scores[..., i, j] = s(q_i, k_j)``:

==============  ==========================================  ==========================
name            s(q, k)                                      parameters
==============  ==========================================  ==========================
``additive``    v^T tanh(W k + U q)                          W (H, Ek), U (H, Eq), v (H,)
``dot``         k^T q                                        Eq = Ek
``scaled_dot``  k^T q / sqrt(D)  (``scale`` overrides 1/√D)  Eq = Ek = D
``bilinear``    k^T W q,  or low-rank (U k)^T (V q)          W (Ek, Eq) or U (R, Ek), V (R, Eq)
``gaussian``    -1/2 sum_d ((q_d - k_d) / h_d)^2              bandwidth h > 0 (scalar or (D,))
==============  ==========================================  ==========================

(The text writes the key as x: s(x, q).) ``SCORES`` maps each name to its
function; ``get_score(name)`` looks one up with a ValueError for unknown
names. Inputs are validated (finite, matching dimensions) and never modified;
the work is done by the numba kernels in ``nbattn.kernels.scores`` (the
additive score never holds the (L, S, H) tensor).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._validation import check_bandwidth
from .kernels import scores as _k

__all__ = [
    "SCORES",
    "additive",
    "bilinear",
    "dot",
    "gaussian",
    "get_score",
    "scaled_dot",
]


# --------------------------------------------------------------------------- helpers
def _array(x, name, min_ndim=2, dtype=None):
    """A finite float32/float64 copy of ``x`` with at least ``min_ndim`` dimensions."""
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype.kind == "b" or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if dtype is None:
        dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else np.float64
    arr = np.array(arr, dtype=dtype, copy=True)
    if not np.isfinite(arr).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise ValueError(f"{name} contains NaN or inf (first at index {bad})")
    return arr


def _result_dtype(arrays, dtype):
    if dtype is not None:
        key = np.dtype(dtype)
        if key not in (np.float32, np.float64):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        return key.type
    kinds = [np.asarray(a).dtype for a in arrays if a is not None]
    return np.float32 if kinds and all(d == np.float32 for d in kinds) else np.float64


def _broadcast_batch(shapes_by_name):
    """Broadcast the leading (batch) dimensions; ValueError naming the arguments."""
    try:
        return tuple(np.broadcast_shapes(*shapes_by_name.values()))
    except ValueError:
        desc = ", ".join(f"{n} {s}" for n, s in shapes_by_name.items())
        raise ValueError(f"the leading (batch) dimensions do not broadcast: {desc}") from None


def _flat(x, batch):
    """(..., A, B) broadcast to batch + (A, B) and flattened to a C-contiguous (n, A, B)."""
    full = np.broadcast_to(x, tuple(batch) + x.shape[-2:])
    return np.ascontiguousarray(full.reshape((-1,) + x.shape[-2:]))


def _transposed(x):
    """(B, S, E) -> C-contiguous (B, E, S): the kernels' feature-major key layout."""
    return np.ascontiguousarray(np.swapaxes(x, 1, 2))


def _matrix(x, name, shape, dtype):
    arr = _array(x, name, min_ndim=len(shape), dtype=dtype)
    if arr.ndim != len(shape) or any(w is not None and a != w for a, w in zip(arr.shape, shape)):
        want = "(" + ", ".join("?" if w is None else str(w) for w in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    return arr


def _scale(scale, dim):
    if scale is None:
        return 1.0 / np.sqrt(dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not np.isfinite(scale):
        raise ValueError(f"scale must be a finite real number, got {scale!r}")
    return float(scale)


# --------------------------------------------------------------------------- parameters
_PARAMS = {
    "additive": {"W", "U", "v"},
    "dot": set(),
    "scaled_dot": {"scale"},
    "bilinear": {"W", "U", "V"},
    "gaussian": {"bandwidth"},
}


def check_params(name, eq, ek, params, dtype):
    """Validate the extra parameters of score ``name`` for query/key widths eq, ek.

    Returns a dict of validated arrays/floats ready for ``compute``.
    """
    allowed = _PARAMS[name]
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(
            f"score {name!r} takes parameters {sorted(allowed)}, got unknown {sorted(unknown)}"
        )
    out = {}
    if name in ("dot", "scaled_dot", "gaussian") and eq != ek:
        raise ValueError(
            f"score {name!r} needs queries and keys of the same width, got q with {eq} "
            f"features and k with {ek}"
        )
    if name == "scaled_dot":
        out["scale"] = _scale(params.get("scale"), eq)
    elif name == "gaussian":
        out["bandwidth"] = check_bandwidth(params.get("bandwidth", 1.0), eq)
    elif name == "additive":
        for p in ("W", "U", "v"):
            if params.get(p) is None:
                raise ValueError(f"score 'additive' needs the parameter {p}")
        W = _array(params["W"], "W", min_ndim=2, dtype=dtype)
        if W.ndim != 2 or W.shape[1] != ek:
            raise ValueError(
                f"W must have shape (hidden, {ek}) for keys of width {ek}, got {W.shape}"
            )
        hidden = W.shape[0]
        out["W"] = W
        out["U"] = _matrix(params["U"], "U", (hidden, eq), dtype)
        out["v"] = _matrix(params["v"], "v", (hidden,), dtype)
    elif name == "bilinear":
        W, U, V = params.get("W"), params.get("U"), params.get("V")
        if W is not None:
            if U is not None or V is not None:
                raise ValueError("bilinear takes either W or the low-rank pair (U, V), not both")
            out["W"] = _matrix(W, "W", (ek, eq), dtype)
        else:
            if U is None or V is None:
                raise ValueError("bilinear needs W (Ek, Eq) or both U (R, Ek) and V (R, Eq)")
            U = _array(U, "U", min_ndim=2, dtype=dtype)
            if U.ndim != 2 or U.shape[1] != ek:
                raise ValueError(f"U must have shape (rank, {ek}), got {U.shape}")
            out["U"] = U
            out["V"] = _matrix(V, "V", (U.shape[0], eq), dtype)
    return out


def prepare_dot(name, q, k, params):
    """The (query, key, scale) whose scaled dot product is score ``name`` (dot-shaped scores).

    dot: (q, k, 1); scaled_dot: (q, k, scale); bilinear: (W q, k, 1) or (V q, U k, 1).
    """
    if name == "dot":
        return q, k, 1.0
    if name == "scaled_dot":
        return q, k, params["scale"]
    if "W" in params:
        return np.ascontiguousarray(q @ params["W"].T), k, 1.0
    return (
        np.ascontiguousarray(q @ params["V"].T),
        np.ascontiguousarray(k @ params["U"].T),
        1.0,
    )


def compute(name, qf, kf, params):
    """Scores (B, L, S) of score ``name`` for flattened qf (B, L, Eq), kf (B, S, Ek)."""
    if name in ("dot", "scaled_dot", "bilinear"):
        qd, kd, scale = prepare_dot(name, qf, kf, params)
        return _k.dot_scores(np.ascontiguousarray(qd), _transposed(kd), scale)
    if name == "gaussian":
        h = params["bandwidth"].astype(qf.dtype)
        return _k.gaussian_scores(np.ascontiguousarray(qf / h), _transposed(kf / h))
    # additive
    uq = np.ascontiguousarray(qf @ params["U"].T)
    wk = kf @ params["W"].T
    return _k.additive_scores(uq, _transposed(wk), np.ascontiguousarray(params["v"]))


def _scores(name, q, k, dtype, params):
    dt = _result_dtype([q, k], dtype)
    q = _array(q, "q", dtype=dt)
    k = _array(k, "k", dtype=dt)
    p = check_params(name, q.shape[-1], k.shape[-1], params, dt)
    batch = _broadcast_batch({"q": q.shape[:-2], "k": k.shape[:-2]})
    s = compute(name, _flat(q, batch), _flat(k, batch), p)
    return s.reshape(batch + s.shape[1:])


# --------------------------------------------------------------------------- public scores
def additive(q, k, W, U, v, *, dtype=None):
    """Additive (Bahdanau) score ``s(q, k) = v^T tanh(W k + U q)``.

    Parameters
    ----------
    q : array (..., L, Eq)
    k : array (..., S, Ek)
    W : array (H, Ek)
    U : array (H, Eq)
    v : array (H,)
    dtype : None, "float32" or "float64"
        None keeps float32 when every input is float32, float64 otherwise.

    Returns
    -------
    scores : array (..., L, S)
        ``scores[..., i, j] = sum_h v_h tanh((W k_j)_h + (U q_i)_h)``, computed
        pair by pair with a row accumulator: the (L, S, H) tensor is never held.
    """
    return _scores("additive", q, k, dtype, {"W": W, "U": U, "v": v})


def dot(q, k, *, dtype=None):
    """Dot-product score ``s(q, k) = k^T q``; q (..., L, D), k (..., S, D) -> (..., L, S)."""
    return _scores("dot", q, k, dtype, {})


def scaled_dot(q, k, scale=None, *, dtype=None):
    """Scaled dot-product score ``s(q, k) = k^T q / sqrt(D)``.

    q (..., L, D), k (..., S, D) -> (..., L, S). ``scale`` replaces 1/sqrt(D)
    when given (torch's ``scale`` argument).
    """
    return _scores("scaled_dot", q, k, dtype, {"scale": scale})


def bilinear(q, k, W=None, *, U=None, V=None, dtype=None):
    """Bilinear score ``s(q, k) = k^T W q``, or its low-rank form ``(U k)^T (V q)``.

    Parameters
    ----------
    q : array (..., L, Eq)
    k : array (..., S, Ek)
    W : array (Ek, Eq), optional
        The full bilinear form. Give either W or both U and V.
    U : array (R, Ek), optional
    V : array (R, Eq), optional
        The low-rank factors, ``W = U^T V`` (seed 000: the bilinear model with
        W = U^T V is a dot product after separate linear maps of k and q).

    Returns
    -------
    scores : array (..., L, S)
    """
    return _scores("bilinear", q, k, dtype, {"W": W, "U": U, "V": V})


def gaussian(q, k, bandwidth=1.0, *, dtype=None):
    """Gaussian score ``s(q, k) = -1/2 sum_d ((q_d - k_d) / h_d)^2`` (Nadaraya-Watson).

    q (..., L, D), k (..., S, D) -> (..., L, S); ``bandwidth`` a positive
    float or (D,) array. Computed from direct differences (no cancellation).
    """
    return _scores("gaussian", q, k, dtype, {"bandwidth": bandwidth})


#: The scoring functions by name.
SCORES = {
    "additive": additive,
    "dot": dot,
    "scaled_dot": scaled_dot,
    "bilinear": bilinear,
    "gaussian": gaussian,
}


def get_score(name):
    """The scoring function registered as ``name`` (ValueError naming ``score`` if unknown)."""
    if name not in SCORES:
        raise ValueError(f"score must be one of {sorted(SCORES)} or a callable, got {name!r}")
    return SCORES[name]
