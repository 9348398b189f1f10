"""Attention scoring functions s(q, k) of the attention chapter, and their registry.

Every function takes queries ``q`` (..., L, Eq) and keys ``k`` (..., S, Ek)
with any leading batch dimensions (broadcast like NumPy/torch) and returns
the score matrix (..., L, S), ``scores[..., i, j] = s(q_i, k_j)``:

==============  ===========================================  ==========================
name            s(q, k)                                      parameters
==============  ===========================================  ==========================
``additive``    v^T tanh(W k + U q)                          W (H, Ek), U (H, Eq), v (H,)
``dot``         k^T q                                        Eq = Ek
``scaled_dot``  k^T q / sqrt(D)  (``scale`` overrides 1/√D)  Eq = Ek = D
``bilinear``    k^T W q,  or low-rank (U k)^T (V q)          W (Ek, Eq) or U (R, Ek), V (R, Eq)
``gaussian``    -1/2 sum_d ((q_d - k_d) / h_d)^2              bandwidth h > 0 (scalar or (D,))
==============  ===========================================  ==========================

(The text writes the key as x: s(x, q).) ``SCORES`` maps each name to one
:class:`Score` record: its parameters and their checks, its CPU kernel, its
GPU kernel where one exists, and its flash path (how to write it as a scaled
dot product, where it is one). ``nbattn.attention`` runs every score through
its record; ``get_score(name)`` looks one up with a ValueError for unknown
names. Adding a score is one entry in ``SCORES`` (plus its public function).
Inputs are validated by ``nbattn._core.validation`` (finite, matching dimensions)
and never modified; the work is done by the numba kernels in
``nbattn.kernels.scores`` (the additive score never holds the (L, S, H)
tensor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._core.layout import feature_major, flat_batch
from .._core.validation import (
    as_float_array,
    broadcast_leading,
    check_bandwidth,
    check_scale,
    resolve_dtype,
    scaled_columns,
)
from ..dispatch.device import kernels_for

__all__ = [
    "SCORES",
    "Score",
    "additive",
    "bilinear",
    "dot",
    "gaussian",
    "get_score",
    "parameter_matrix",
    "scaled_dot",
]


# --------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class Score:
    """Everything nbattn needs to run one scoring function.

    Attributes
    ----------
    name : str
    function : callable
        The public function, ``f(q, k, ...)`` -> (..., L, S); calling the
        record calls it.
    params : frozenset of str
        The names of the extra parameters (``score_params`` of ``attention``).
    same_width : bool
        Queries and keys must have the same number of features.
    check : callable ``(eq, ek, params, dtype) -> dict``
        Validates the extra parameters (present, finite, of the right shapes)
        for query width ``eq`` and key width ``ek``; returns them ready for
        ``cpu``, ``cuda`` and ``flash``.
    cpu : callable ``(qf, kf, params) -> scores``
        The CPU kernel on flattened, laid-out arrays qf (B, L, Eq) and
        kf (B, S, Ek) of one dtype: scores (B, L, S).
    cuda : callable or None
        The GPU twin of ``cpu`` where one exists.
    flash : callable ``(qf, kf, params) -> (q', k', scale)`` or None
        The score as a scaled dot product ``scale * q' . k'``, which sends
        soft attention down the blocked (flash) or streaming kernels without
        a score matrix; None when the score is not one.
    """

    name: str
    function: Callable
    params: frozenset
    same_width: bool
    check: Callable
    cpu: Callable
    cuda: Callable | None = None
    flash: Callable | None = None

    def __call__(self, q, k, *args, **kwargs):
        return self.function(q, k, *args, **kwargs)

    def validate(self, eq: int, ek: int, params: dict, dtype) -> dict:
        """The checked parameters for query width ``eq`` and key width ``ek`` (ValueError)."""
        unknown = set(params) - self.params
        if unknown:
            raise ValueError(
                f"score {self.name!r} takes parameters {sorted(self.params)}, got unknown "
                f"{sorted(unknown)}"
            )
        if self.same_width and eq != ek:
            raise ValueError(
                f"score {self.name!r} needs queries and keys of the same width, got q with {eq} "
                f"features and k with {ek}"
            )
        return self.check(eq, ek, params, dtype)


# --------------------------------------------------------------------------- parameter checks
def parameter_matrix(x, name, shape, dtype):
    """A finite parameter array of ``shape`` (None entries: any size), in ``dtype``."""
    arr = as_float_array(x, name, min_ndim=len(shape), dtype=dtype, allow_bool=False)
    if arr.ndim != len(shape) or any(w is not None and a != w for a, w in zip(arr.shape, shape)):
        want = "(" + ", ".join("?" if w is None else str(w) for w in shape) + ")"
        if len(shape) == 1:
            want = want[:-1] + ",)"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    return arr


def _no_params(eq, ek, params, dtype):
    return {}


def _check_scaled_dot(eq, ek, params, dtype):
    return {"scale": check_scale(params.get("scale"), eq)}


def _check_gaussian(eq, ek, params, dtype):
    return {
        "bandwidth": check_bandwidth(params.get("bandwidth", 1.0), eq, square_representable=True)
    }


def _check_additive(eq, ek, params, dtype):
    for p in ("W", "U", "v"):
        if params.get(p) is None:
            raise ValueError(f"score 'additive' needs the parameter {p}")
    W = as_float_array(params["W"], "W", min_ndim=2, dtype=dtype, allow_bool=False)
    if W.ndim != 2 or W.shape[1] != ek:
        raise ValueError(f"W must have shape (hidden, {ek}) for keys of width {ek}, got {W.shape}")
    hidden = W.shape[0]
    return {
        "W": W,
        "U": parameter_matrix(params["U"], "U", (hidden, eq), dtype),
        "v": parameter_matrix(params["v"], "v", (hidden,), dtype),
    }


def _check_bilinear(eq, ek, params, dtype):
    W, U, V = params.get("W"), params.get("U"), params.get("V")
    if W is not None:
        if U is not None or V is not None:
            raise ValueError("bilinear takes either W or the low-rank pair (U, V), not both")
        return {"W": parameter_matrix(W, "W", (ek, eq), dtype)}
    if U is None or V is None:
        raise ValueError("bilinear needs W (Ek, Eq) or both U (R, Ek) and V (R, Eq)")
    U = as_float_array(U, "U", min_ndim=2, dtype=dtype, allow_bool=False)
    if U.ndim != 2 or U.shape[1] != ek:
        raise ValueError(f"U must have shape (rank, {ek}), got {U.shape}")
    return {"U": U, "V": parameter_matrix(V, "V", (U.shape[0], eq), dtype)}


# --------------------------------------------------------------------------- dot forms and kernels
def _dot_form(qf, kf, params):
    return qf, kf, 1.0


def _scaled_dot_form(qf, kf, params):
    return qf, kf, params["scale"]


def _bilinear_form(qf, kf, params):
    """k^T W q = k . (W q); (U k) . (V q) for the low-rank pair."""
    if "W" in params:
        return np.ascontiguousarray(qf @ params["W"].T), kf, 1.0
    return np.ascontiguousarray(qf @ params["V"].T), np.ascontiguousarray(kf @ params["U"].T), 1.0


def _dot_kernel(form):
    def cpu(qf, kf, params):
        qd, kd, scale = form(qf, kf, params)
        return kernels_for("scores", "cpu").dot_scores(
            np.ascontiguousarray(qd), feature_major(kd), scale
        )

    return cpu


def _gaussian_cpu(qf, kf, params):
    # the score is a difference: q and k are centred on the keys' midrange first (data
    # near 1e308 then stays finite; max / 2 + min / 2 never overflows), and data that
    # overflows once divided by h is refused by row and column (scaled_columns) instead
    # of giving inf or NaN scores
    h = params["bandwidth"].astype(qf.dtype)
    flat_keys = kf.reshape(-1, kf.shape[-1]).astype(np.float64)
    centre = None
    if flat_keys.shape[0]:
        centre = flat_keys.max(axis=0) / 2 + flat_keys.min(axis=0) / 2
    q = scaled_columns(qf, "q", h, centre=centre, dtype=qf.dtype)
    k = scaled_columns(kf, "k", h, centre=centre, dtype=kf.dtype)
    return kernels_for("scores", "cpu").gaussian_scores(np.ascontiguousarray(q), feature_major(k))


def _additive_cpu(qf, kf, params):
    uq = np.ascontiguousarray(qf @ params["U"].T)
    wk = kf @ params["W"].T
    return kernels_for("scores", "cpu").additive_scores(
        uq, feature_major(wk), np.ascontiguousarray(params["v"])
    )


def _evaluate(name, q, k, dtype, params):
    """Validate, broadcast the batch dimensions, run the score's CPU kernel."""
    record = SCORES[name]
    dt = resolve_dtype(dtype, q, k)
    q = as_float_array(q, "q", min_ndim=2, dtype=dt, allow_bool=False)
    k = as_float_array(k, "k", min_ndim=2, dtype=dt, allow_bool=False)
    p = record.validate(q.shape[-1], k.shape[-1], params, dt)
    batch = broadcast_leading({"q": q.shape[:-2], "k": k.shape[:-2]})
    s = record.cpu(flat_batch(q, batch), flat_batch(k, batch), p)
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
    return _evaluate("additive", q, k, dtype, {"W": W, "U": U, "v": v})


def dot(q, k, *, dtype=None):
    """Dot-product score ``s(q, k) = k^T q``; q (..., L, D), k (..., S, D) -> (..., L, S)."""
    return _evaluate("dot", q, k, dtype, {})


def scaled_dot(q, k, scale=None, *, dtype=None):
    """Scaled dot-product score ``s(q, k) = k^T q / sqrt(D)``.

    q (..., L, D), k (..., S, D) -> (..., L, S). ``scale`` replaces 1/sqrt(D)
    when given (torch's ``scale`` argument).
    """
    return _evaluate("scaled_dot", q, k, dtype, {"scale": scale})


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
        The low-rank factors, ``W = U^T V`` (the attention chapter: the bilinear
        model with W = U^T V is a dot product after separate linear maps of k
        and q).

    Returns
    -------
    scores : array (..., L, S)
    """
    return _evaluate("bilinear", q, k, dtype, {"W": W, "U": U, "V": V})


def gaussian(q, k, bandwidth=1.0, *, dtype=None):
    """Gaussian score ``s(q, k) = -1/2 sum_d ((q_d - k_d) / h_d)^2`` (Nadaraya-Watson).

    q (..., L, D), k (..., S, D) -> (..., L, S); ``bandwidth`` a positive
    float or (D,) array. Computed from direct differences (no cancellation).
    """
    return _evaluate("gaussian", q, k, dtype, {"bandwidth": bandwidth})


#: The scoring functions by name, each a :class:`Score` record.
SCORES = {
    record.name: record
    for record in (
        Score(
            "additive",
            additive,
            frozenset({"W", "U", "v"}),
            same_width=False,
            check=_check_additive,
            cpu=_additive_cpu,
        ),
        Score(
            "dot",
            dot,
            frozenset(),
            same_width=True,
            check=_no_params,
            cpu=_dot_kernel(_dot_form),
            flash=_dot_form,
        ),
        Score(
            "scaled_dot",
            scaled_dot,
            frozenset({"scale"}),
            same_width=True,
            check=_check_scaled_dot,
            cpu=_dot_kernel(_scaled_dot_form),
            flash=_scaled_dot_form,
        ),
        Score(
            "bilinear",
            bilinear,
            frozenset({"W", "U", "V"}),
            same_width=False,
            check=_check_bilinear,
            cpu=_dot_kernel(_bilinear_form),
            flash=_bilinear_form,
        ),
        Score(
            "gaussian",
            gaussian,
            frozenset({"bandwidth"}),
            same_width=True,
            check=_check_gaussian,
            cpu=_gaussian_cpu,
        ),
    )
}


def get_score(name) -> Score:
    """The :class:`Score` registered as ``name`` (ValueError naming ``score`` if unknown)."""
    if not isinstance(name, str) or name not in SCORES:
        raise ValueError(f"score must be one of {sorted(SCORES)} or a callable, got {name!r}")
    return SCORES[name]
