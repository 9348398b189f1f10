"""Softmax functions: softmax, log-softmax, the masked softmax of valid lengths, and the
log-sum-exp merge of two partial attention results.

Masks follow torch's SDPA convention (``nbattn.attn.masks``): boolean True
keeps an entry, a float mask is added before the softmax; a slice whose
every entry is masked gives zeros (log-softmax: -inf), never NaN. This layer
validates, moves the axis last and broadcasts; the row kernels are
``nbattn.kernels.softmax``'s.
"""

from __future__ import annotations

import numpy as np

from .._core.validation import as_float_array, resolve_dtype
from ..dispatch.device import kernels_for
from .masks import mask_as_bias, shift_rows

__all__ = ["log_softmax", "masked_softmax", "merge_attention_states", "softmax"]


def _kernels():
    """The CPU softmax kernels (rows in, rows out; no GPU twin)."""
    return kernels_for("softmax", "cpu")


def _check_axis(axis, ndim, name):
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} is out of range for {name} with {ndim} dimensions")
    return int(axis) % ndim


def _rows(x):
    """(..., n) as C-contiguous (rows, n)."""
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]))


def _scores_with_mask(x, mask, name, axis=-1, admissible=None):
    """``x + mask`` with ``axis`` moved last, in ``x``'s dtype, finite or -inf.

    Huge values (a mask of -1e308 and +1e308, float32 scores with a float64
    mask beyond float32) are summed as halves and shifted by each row's
    maximum over its ``admissible`` positions: the softmax is unchanged and
    nothing overflows to +inf or NaN.
    """
    xa = as_float_array(x, name, min_ndim=1, allow_bool=False)
    axis = _check_axis(axis, xa.ndim, name)
    if mask is None:
        return np.moveaxis(xa, axis, -1)
    bias = mask_as_bias(mask, float_dtype=np.float64)
    try:
        shape = np.broadcast_shapes(np.shape(mask), xa.shape)
    except ValueError:
        shape = None
    if shape != xa.shape:
        raise ValueError(
            f"mask has shape {np.shape(mask)}, which does not broadcast to {name}'s shape "
            f"{xa.shape}"
        )
    bias = np.moveaxis(np.broadcast_to(bias.reshape(np.shape(mask)), xa.shape), axis, -1)
    x64 = np.moveaxis(xa, axis, -1).astype(np.float64)
    with np.errstate(over="ignore"):
        z = x64 + bias
    overflow = (z == np.inf) | ((z == -np.inf) & np.isfinite(bias))
    finite = np.isfinite(z)
    limit = float(np.finfo(xa.dtype).max) / 2
    if overflow.any() or (finite.any() and np.abs(z[finite]).max() > limit):
        with np.errstate(over="ignore"):
            z = shift_rows(x64 / 2 + bias / 2, admissible) * 2
    with np.errstate(over="ignore"):
        return z.astype(xa.dtype)


def softmax(x, axis=-1, mask=None):
    """Numerically stable softmax along ``axis``.

    .. math:: \\operatorname{softmax}(x)_j = \\frac{e^{x_j - m}}{\\sum_k e^{x_k - m}},
              \\quad m = \\max_k x_k

    Parameters
    ----------
    x : array-like, finite (float32 stays float32; anything else becomes float64)
    axis : int
    mask : array-like of bool or float, optional, broadcastable to ``x``
        Boolean: True keeps an entry, False gives it weight 0. Float: added to
        ``x`` before the softmax (use ``-inf`` to drop an entry); any finite
        magnitude, up to the float64 range, is exact (a row is shifted by its
        maximum before anything could overflow).

    Returns
    -------
    array of ``x``'s shape. A slice whose every entry is masked is all zeros
    (not NaN).
    """
    z = _scores_with_mask(x, mask, "x", axis)
    out = _kernels().softmax_rows(_rows(z)).reshape(z.shape)
    return np.moveaxis(out, -1, axis)


def log_softmax(x, axis=-1, mask=None):
    """Numerically stable log-softmax along ``axis``.

    .. math:: \\log\\operatorname{softmax}(x)_j = x_j - m - \\log\\sum_k e^{x_k - m}

    ``mask`` as in :func:`softmax`; masked entries are ``-inf`` (log 0), and a
    fully masked slice is all ``-inf``, never NaN.
    """
    z = _scores_with_mask(x, mask, "x", axis)
    out = _kernels().log_softmax_rows(_rows(z)).reshape(z.shape)
    return np.moveaxis(out, -1, axis)


def _valid_lengths(valid_lens, lead, n):
    """``valid_lens`` checked and broadcast to ``lead`` (int64)."""
    lens = np.asarray(valid_lens)
    if lens.dtype.kind == "f":
        if not np.isfinite(lens).all() or (lens != np.round(lens)).any():
            raise ValueError("valid_lens must hold whole numbers")
        lens = lens.astype(np.int64)
    if lens.dtype.kind not in "iu":
        raise ValueError(f"valid_lens must be an integer array, got dtype {lens.dtype}")
    if lens.ndim > len(lead) or lens.shape != lead[: lens.ndim]:
        raise ValueError(
            f"valid_lens has shape {lens.shape}; it must be a prefix of scores.shape[:-1] = {lead}"
        )
    if lens.size and (lens.min() < 0 or lens.max() > n):
        raise ValueError(
            f"valid_lens must lie in [0, {n}], got values in [{lens.min()}, {lens.max()}]"
        )
    full = np.broadcast_to(lens.reshape(lens.shape + (1,) * (len(lead) - lens.ndim)), lead)
    return np.array(full, dtype=np.int64)  # writeable: one kernel specialisation


def masked_softmax(scores, valid_lens=None, mask=None):
    """Softmax over the last axis, keeping only the first ``valid_lens`` positions.

    .. math:: w_{\\dots j} = \\frac{e^{x_{\\dots j}}\\,[j < n]}{\\sum_{k < n} e^{x_{\\dots k}}}

    The d2l book's ``masked_softmax`` with one difference: a length of 0
    gives an all-zero row here, where d2l's fill value of -1e6 gives a
    uniform row over every position.

    Parameters
    ----------
    scores : array (..., S)
    valid_lens : int array, optional
        Shape a prefix of ``scores.shape[:-1]``: with scores (B, L, S), (B,)
        gives one length per batch entry (repeated over the L rows, as in d2l)
        and (B, L) one per row. Values in [0, S]. Positions at or past the
        length get weight 0.
    mask : bool or float array, optional, broadcastable to ``scores``
        Applied as in :func:`softmax`, together with ``valid_lens``.

    Returns
    -------
    array of ``scores``' shape.
    """
    if valid_lens is None:
        z = _scores_with_mask(scores, mask, "scores")
        return _kernels().softmax_rows(_rows(z)).reshape(z.shape)
    shape = np.shape(scores)
    if len(shape) == 0:
        raise ValueError("scores must have at least 1 dimensions, got an array of shape ()")
    lens = _valid_lengths(valid_lens, shape[:-1], shape[-1])
    admissible = np.arange(shape[-1]) < lens[..., None]
    z = _scores_with_mask(scores, mask, "scores", admissible=admissible)
    out = _kernels().masked_softmax_rows(_rows(z), lens.reshape(-1))
    return out.reshape(z.shape)


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merge two partial attention results over disjoint key sets (online softmax).

    .. math::

        m = \\max(l_a, l_b),\\quad
        \\text{out} = \\frac{e^{l_a - m}\\,\\text{out}_a + e^{l_b - m}\\,\\text{out}_b}
                          {e^{l_a - m} + e^{l_b - m}},\\quad
        l = m + \\log(e^{l_a - m} + e^{l_b - m})

    ``out_*`` (..., Ev), ``lse_*`` (...) with ``lse = log sum_j exp(s_j)`` of
    each part (-inf for a part with no admissible key). Returns (out, lse).
    """
    dt = resolve_dtype(None, out_a, out_b)
    oa = as_float_array(out_a, "out_a", min_ndim=1, dtype=dt)
    ob = as_float_array(out_b, "out_b", min_ndim=1, dtype=dt)
    if oa.shape != ob.shape:
        raise ValueError(f"out_a {oa.shape} and out_b {ob.shape} must have the same shape")
    lses = []
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        arr = np.asarray(lse)
        if arr.shape != oa.shape[:-1]:
            raise ValueError(f"{name} must have shape {oa.shape[:-1]}, got {arr.shape}")
        if arr.ndim == 0:
            arr = arr.reshape(1)
        lses.append(as_float_array(arr, name, dtype="float64", allow_neg_inf=True))
    la, lb = lses
    d = oa.shape[-1]
    out, lse = _kernels().merge_states(
        oa.reshape(-1, d), la.reshape(-1), np.ascontiguousarray(ob.reshape(-1, d)), lb.reshape(-1)
    )
    return out.reshape(oa.shape), lse.reshape(oa.shape[:-1])
