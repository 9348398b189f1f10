"""Functional attention: softmax, key-value attention (soft, hard, sampled), multi-head
and hierarchical attention, as in the attention chapter.

Shapes follow torch's ``scaled_dot_product_attention``: queries q (..., L, E),
keys k (..., S, E), values v (..., S, Ev) -> (..., L, Ev), with any leading
batch/head dimensions, broadcast like torch. Masks follow torch's SDPA
convention: a boolean mask is True where a query may attend to a key, a float
mask is added to the scores; either broadcasts to (..., L, S).

A query row with no admissible key (fully masked, or causal with nothing
before it) gets an all-zero output and an all-zero weight row — never NaN
(``torch.nn.MultiheadAttention`` returns NaN there; recent torch SDPA zeros).

This layer validates (ValueError naming the argument; inputs never modified),
broadcasts and lays out arrays, and calls the numba kernels in
``nbattn.kernels``.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .. import config
from .._core.layout import flat_batch
from .._core.validation import (
    as_float_array,
    broadcast_leading,
    check_bool,
    check_dot_range,
    check_positive_int,
    resolve_dtype,
)
from ..dispatch.device import kernels_for
from . import scores as _scores

__all__ = [
    "HierarchicalResult",
    "MODES",
    "attention",
    "hierarchical_attention",
    "log_softmax",
    "masked_softmax",
    "merge_attention_states",
    "multi_head_attention",
    "softmax",
]

#: The attention modes of the text: soft (weighted average), hard (arg-max key),
#: sample (a key drawn from the attention distribution).
MODES = ("soft", "hard", "sample")


def _kernels(op):
    """The CPU kernel module of ``op`` (the score-matrix paths have no GPU twin)."""
    return kernels_for(op, "cpu")


# --------------------------------------------------------------------------- masks
def _mask_bias(mask, name="mask", shape=None):
    """A boolean (True = attend) or float (additive) mask as an additive float64 array.

    ``shape`` (L, S), when given, checks that the last two axes broadcast to it.
    Returns None for ``mask=None``. float64 whatever the computation's dtype:
    :func:`_fit_bias` shifts huge biases before they are cast.
    """
    if mask is None:
        return None
    try:
        arr = np.asarray(mask)
    except Exception as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if arr.dtype.kind == "b":
        bias = np.where(arr, 0.0, -np.inf)
    elif arr.dtype.kind == "f":
        bias = as_float_array(arr, name, dtype="float64", allow_neg_inf=True)
    else:
        raise ValueError(
            f"{name} must be boolean (True = attend) or float (added to the scores), "
            f"got dtype {arr.dtype}"
        )
    if bias.ndim == 0:
        bias = bias.reshape(1, 1)
    elif bias.ndim == 1:
        bias = bias[None, :]
    if shape is not None:
        L, S = shape
        if bias.shape[-2] not in (1, L) or bias.shape[-1] not in (1, S):
            raise ValueError(
                f"{name} has shape {np.shape(mask)}, which does not broadcast to (..., L, S) = "
                f"(..., {L}, {S})"
            )
    return bias


def _shift_rows(z, admissible=None):
    """``z - max`` along the last axis over the admissible entries (a softmax-invariant shift).

    Rows without an admissible finite entry are left as they are. Called only
    when the values are too large for the computation's dtype; entries that
    fall below the float64 range become -inf, which is their weight (0)
    relative to the row's maximum.
    """
    considered = z if admissible is None else np.where(admissible, z, -np.inf)
    top = considered.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        return z - top


def _fit_bias(bias, dtype, causal=False, n_queries=None):
    """An additive float64 (..., Lb, Sb) bias in ``dtype``, shifted per query row when huge.

    Adding a constant to every admissible key of a query row leaves its softmax
    unchanged, so a bias beyond a quarter of the dtype's range (where adding
    the scores could overflow) is shifted by the row's largest admissible
    entry; what then lies beyond the dtype's range has weight 0 next to that
    entry and becomes -inf. Causal rows are shifted over the keys they see.
    """
    if bias is None:
        return None
    finite = np.isfinite(bias)
    limit = float(np.finfo(dtype).max) / 4
    if not finite.any() or np.abs(bias[finite]).max() <= limit:
        return bias.astype(dtype)
    admissible = None
    if causal:
        S = bias.shape[-1]
        bias = np.broadcast_to(bias, bias.shape[:-2] + (n_queries, S))
        admissible = np.arange(S)[None, :] <= np.arange(n_queries)[:, None]
    shifted = _shift_rows(bias, admissible)
    with np.errstate(over="ignore"):
        return np.where(shifted < -float(np.finfo(dtype).max), -np.inf, shifted).astype(dtype)


def _flat_bias(bias, batch):
    """Bias (..., Lb, Sb) -> (Bb, Lb, Sb) for the kernels, Bb = 1 when it has no batch."""
    if bias is None:
        return None
    lead = bias.shape[:-2]
    if all(d == 1 for d in lead):
        return np.ascontiguousarray(bias.reshape((1,) + bias.shape[-2:]))
    return flat_batch(bias, batch)


_NO_BIAS = {np.float32: np.zeros((1, 1, 1), np.float32), np.float64: np.zeros((1, 1, 1))}


# --------------------------------------------------------------------------- softmax
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
    bias = _mask_bias(mask, name="mask")
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
            z = _shift_rows(x64 / 2 + bias / 2, admissible) * 2
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
    out = _kernels("softmax").softmax_rows(_rows(z)).reshape(z.shape)
    return np.moveaxis(out, -1, axis)


def log_softmax(x, axis=-1, mask=None):
    """Numerically stable log-softmax along ``axis``.

    .. math:: \\log\\operatorname{softmax}(x)_j = x_j - m - \\log\\sum_k e^{x_k - m}

    ``mask`` as in :func:`softmax`; masked entries are ``-inf`` (log 0), and a
    fully masked slice is all ``-inf``, never NaN.
    """
    z = _scores_with_mask(x, mask, "x", axis)
    out = _kernels("softmax").log_softmax_rows(_rows(z)).reshape(z.shape)
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
        return _kernels("softmax").softmax_rows(_rows(z)).reshape(z.shape)
    shape = np.shape(scores)
    if len(shape) == 0:
        raise ValueError("scores must have at least 1 dimensions, got an array of shape ()")
    lens = _valid_lengths(valid_lens, shape[:-1], shape[-1])
    admissible = np.arange(shape[-1]) < lens[..., None]
    z = _scores_with_mask(scores, mask, "scores", admissible=admissible)
    out = _kernels("softmax").masked_softmax_rows(_rows(z), lens.reshape(-1))
    return out.reshape(z.shape)


# --------------------------------------------------------------------------- attention
def _soft_attention(q, k, v, scale, mask_bias, causal, batch=None):
    """The soft scaled-dot-product path: flat q (B, L, E), k (B, S, E), v (B, S, Ev).

    ``mask_bias`` is None or an additive (..., Lb, Sb) array whose leading
    dimensions broadcast to ``batch`` (B = prod(batch); default (B,)); it is handed to the
    blocked FlashAttention kernel (``nbattn.flash``, BLAS on tiles) as it is,
    never expanded per head, and applied on the tiles. Returns
    ``(out (B, L, Ev), lse (B, L))``.
    """
    from .flash import flash_attention

    batch = q.shape[:1] if batch is None else batch

    def lead(x):
        return x.reshape(tuple(batch) + x.shape[1:])

    out, lse = flash_attention(
        lead(q), lead(k), lead(v), causal=causal, scale=scale, return_lse=True, mask=mask_bias
    )
    return out.reshape(q.shape[:1] + out.shape[-2:]), lse.reshape(q.shape[:1] + lse.shape[-1:])


def _select(weights, vf, mode, u, scores_masked):
    """Hard / sampled selection: returns (out, one-hot weights).

    ``u`` (B, L) uniform draws for mode "sample"; ``scores_masked`` the masked
    scores for mode "hard" (ties go to the first key).
    """
    B, L, S = weights.shape
    alive = weights.sum(axis=-1) > 0
    if mode == "hard":
        idx = np.argmax(scores_masked, axis=-1)
    else:
        cdf = np.cumsum(weights.astype(np.float64), axis=-1)
        idx = (cdf <= (u * cdf[..., -1])[..., None]).sum(axis=-1)
        last = S - 1 - np.argmax(weights[..., ::-1] > 0, axis=-1)
        idx = np.minimum(idx, last)
    onehot = np.zeros_like(weights)
    b_idx, i_idx = np.nonzero(alive)
    onehot[b_idx, i_idx, idx[b_idx, i_idx]] = 1.0
    out = np.zeros((B, L, vf.shape[-1]), dtype=vf.dtype)
    out[b_idx, i_idx] = vf[b_idx, idx[b_idx, i_idx]]
    return out, onehot


def attention(
    q,
    k,
    v,
    score="scaled_dot",
    mask=None,
    causal=False,
    mode="soft",
    random_state=None,
    return_weights=False,
    *,
    scale=None,
    score_params=None,
    dtype=None,
    **score_kwargs,
):
    """Key-value attention ``att((K, V), q) = sum_j alpha_j v_j`` (the attention chapter).

    .. math::

        s_{ij} = s(q_i, k_j) + b_{ij}, \\qquad
        \\alpha_{ij} = \\operatorname{softmax}_j(s_{ij}), \\qquad
        \\text{out}_i = \\sum_j \\alpha_{ij} v_j

    with ``b`` the mask (0 / -inf for a boolean mask, the values of a float
    mask) and ``b_ij = -inf`` for j > i when ``causal``. K = V is plain soft
    attention over the inputs.

    Parameters
    ----------
    q : array (..., L, Eq)
    k : array (..., S, Ek)
    v : array (..., S, Ev)
        Leading dimensions of q, k, v and mask broadcast (torch semantics).
    score : str or callable
        A name in ``nbattn.scores.SCORES`` ("scaled_dot" default, "dot",
        "additive", "bilinear", "gaussian"), or ``f(q, k, **params)`` returning
        (..., L, S) scores.
    mask : bool or float array broadcastable to (..., L, S), optional
        torch SDPA semantics: boolean True = the query may attend to the key;
        float = added to the scores.
    causal : bool
        Query i attends to keys j <= i only (torch's ``is_causal``: the causal
        band is aligned at the top-left, also when L != S).
    mode : "soft", "hard" or "sample"
        soft: the weighted average. hard: the value of the arg-max key (ties
        go to the first key). sample: the value of a key drawn from alpha_i,
        one draw per query: ``u = rng.random(batch + (L,))`` (C order) and the
        key is the first j with ``cumsum(alpha_i)_j > u * sum(alpha_i)``.
    random_state : None, int or numpy Generator
        For mode="sample"; passed to ``numpy.random.default_rng``.
    return_weights : bool
        Also return the weights (..., L, S) that produced the output: alpha for
        "soft", the one-hot selection for "hard" and "sample" (so that
        ``out = weights @ v`` in every mode).
    scale : float, optional
        For "scaled_dot": replaces 1/sqrt(E).
    score_params : dict, optional
        Extra score parameters: W, U, v for "additive" (v must go here, since
        ``v`` is the values), W or U, V for "bilinear", bandwidth for
        "gaussian". Keyword arguments W=, U=, V=, bandwidth= are merged in.
    dtype : None, "float32" or "float64"
        None: float32 if q, k and v are all float32, else float64.

    Returns
    -------
    out : array (..., L, Ev)
        Rows with no admissible key (fully masked; causal with no key) are
        zeros, never NaN, and their weight rows are zeros.
    weights : array (..., L, S), only with ``return_weights=True``

    Notes
    -----
    Soft mode with the "scaled_dot", "dot" or "bilinear" score and no weights
    requested runs the blocked FlashAttention kernels (``nbattn.flash``, the
    mask applied on the tiles without expanding it per head): online softmax
    over key tiles, memory O((L + S) E) per batch entry, no L x S matrix.
    Every other case computes score rows with the kernels of
    ``nbattn.kernels.scores`` and the masked softmax of
    ``nbattn.kernels.softmax``, in slices of query rows holding at most
    ``config.MAX_WEIGHT_MATRIX_ELEMENTS`` scores (``return_weights=True``
    beyond that is refused with a ValueError).
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(score, _scores.Score):
        record = score
    elif callable(score):
        record = None  # a user's score function: its (B, L, S) result is checked below
    else:
        record = _scores.get_score(score)
    causal = check_bool(causal, "causal")
    return_weights = check_bool(return_weights, "return_weights")
    params = dict(score_params or {})
    params.update(score_kwargs)
    if scale is not None:
        params["scale"] = scale
    dt = resolve_dtype(dtype, q, k, v)
    q = as_float_array(q, "q", min_ndim=2, dtype=dt, allow_bool=False)
    k = as_float_array(k, "k", min_ndim=2, dtype=dt, allow_bool=False)
    v = as_float_array(v, "v", min_ndim=2, dtype=dt, allow_bool=False)
    L, S = q.shape[-2], k.shape[-2]
    if v.shape[-2] != S:
        raise ValueError(
            f"k and v must have the same number of keys; k has {S} (shape {k.shape}) and "
            f"v has {v.shape[-2]} (shape {v.shape})"
        )
    raw_bias = _mask_bias(mask, shape=(L, S))  # float64: the flash path shifts it exactly
    bias = _fit_bias(raw_bias, dt, causal, L)
    shapes = {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]}
    if bias is not None:
        shapes["mask"] = bias.shape[:-2]
    batch = broadcast_leading(shapes)
    qf, kf, vf = flat_batch(q, batch), flat_batch(k, batch), flat_batch(v, batch)
    bias_f = _flat_bias(bias, batch)

    B, Ev = qf.shape[0], v.shape[-1]
    limit = config.MAX_WEIGHT_MATRIX_ELEMENTS
    if return_weights and B * L * S > limit:
        raise ValueError(
            f"return_weights=True would hold {B * L * S} weights, more than "
            f"nbattn.config.MAX_WEIGHT_MATRIX_ELEMENTS={limit}; ask for fewer queries or "
            "raise the limit (environment variable NBATTN_MAX_WEIGHT_MATRIX_ELEMENTS)"
        )
    if record is None:
        s_all = np.asarray(score(qf, kf, **params))
        if s_all.shape != (B, L, S):
            raise ValueError(
                f"the score callable returned shape {s_all.shape}, expected {(B, L, S)}"
            )
        if not np.isfinite(s_all).all():
            raise ValueError("the score callable returned NaN or inf")
        s_all = np.array(s_all, dtype=dt, copy=True)
    else:
        p = record.validate(q.shape[-1], k.shape[-1], params, dt)
        if mode == "soft" and not return_weights and record.flash is not None:
            qd, kd, sc = record.flash(qf, kf, p)
            check_dot_range(qd, kd, sc, dt)
            out, _ = _soft_attention(qd, kd, vf, sc, raw_bias, causal, batch)
            return out.reshape(batch + (L, Ev))
        s_all = None

    # the weight-matrix path, in slices of query rows that hold at most `limit` scores
    u = np.random.default_rng(random_state).random((B, L)) if mode == "sample" else None
    has_bias = bias_f is not None
    out = np.empty((B, L, Ev), dtype=dt)
    weights = np.empty((B, L, S), dtype=dt) if return_weights else None
    rows = max(1, limit // (B * S))
    for l0 in range(0, L, rows):
        l1 = min(L, l0 + rows)
        if s_all is not None:
            s = np.ascontiguousarray(s_all[:, l0:l1])
        else:
            s = record.cpu(np.ascontiguousarray(qf[:, l0:l1]), kf, p)
            if not np.isfinite(s).all():
                raise ValueError(
                    f"q and k: the {record.name!r} scores overflow {np.dtype(dt).name}; "
                    "rescale them (or use float64 inputs)"
                )
        bias_c = _NO_BIAS[dt]
        if has_bias:
            bias_c = bias_f if bias_f.shape[1] == 1 else np.ascontiguousarray(bias_f[:, l0:l1])
        masked = None
        if mode == "hard":
            masked = s + bias_c if has_bias else s.copy()
            if causal:
                ii, jj = np.nonzero(np.arange(S)[None, :] > np.arange(l0, l1)[:, None])
                masked[:, ii, jj] = -np.inf
        w, _ = _kernels("softmax").attention_weights(s, bias_c, has_bias, causal, l0)
        if mode == "soft":
            out[:, l0:l1] = np.matmul(w, vf)
        else:
            uc = None if u is None else u[:, l0:l1]
            out[:, l0:l1], w = _select(w, vf, mode, uc, masked)
        if return_weights:
            weights[:, l0:l1] = w
    out = out.reshape(batch + (L, Ev))
    if return_weights:
        return out, weights.reshape(batch + (L, S))
    return out


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
    out, lse = _kernels("softmax").merge_states(
        oa.reshape(-1, d), la.reshape(-1), np.ascontiguousarray(ob.reshape(-1, d)), lb.reshape(-1)
    )
    return out.reshape(oa.shape), lse.reshape(oa.shape[:-1])


# --------------------------------------------------------------------------- multi-head
def _linear(x, weight, bias):
    y = x @ weight.T
    return y + bias if bias is not None else y


def multi_head_attention(
    query,
    key,
    value,
    num_heads,
    in_proj_weight=None,
    in_proj_bias=None,
    out_proj_weight=None,
    out_proj_bias=None,
    *,
    q_proj_weight=None,
    k_proj_weight=None,
    v_proj_weight=None,
    mask=None,
    key_mask=None,
    causal=False,
    need_weights=True,
    average_attn_weights=True,
    rotary_base=None,
    num_kv_heads=None,
    dtype=None,
):
    """Multi-head scaled-dot-product attention with torch's parameter layout (batch first).

    .. math::

        \\text{head}_h = \\operatorname{att}\\big((K W_k^{(h)}, V W_v^{(h)}), Q W_q^{(h)}\\big),
        \\qquad
        \\text{out} = (\\text{head}_1 \\oplus \\cdots \\oplus \\text{head}_H) W_o^T + b_o

    with per-head width d = E / H and the scaled dot score 1/sqrt(d). With
    ``num_kv_heads = H_kv < H`` (grouped-query attention) there are H_kv key
    and value projections of width d, and query head h reads key/value head
    h // (H / H_kv).

    Parameters
    ----------
    query : array (..., L, E)
    key : array (..., S, kdim)
    value : array (..., S, vdim)
    num_heads : int, dividing E
    in_proj_weight : array (3E, E), optional
        Stacked [W_q; W_k; W_v] (torch's ``in_proj_weight``) when kdim = vdim = E;
        otherwise give ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim),
        ``v_proj_weight`` (E, vdim). With ``num_kv_heads`` the key and value
        blocks have H_kv d rows: (E + 2 H_kv d, E) stacked, (H_kv d, kdim) and
        (H_kv d, vdim) apart.
    in_proj_bias : array (3E,) or (E + 2 H_kv d,), optional
    out_proj_weight : array (E, E)
    out_proj_bias : array (E,), optional
    mask : bool or float array broadcastable to (..., H, L, S), optional
        nbattn/SDPA convention: True = may attend (the opposite of
        ``torch.nn.MultiheadAttention``'s ``attn_mask``, where True = blocked).
        A per-batch mask without a head axis goes as (B, 1, L, S).
    key_mask : bool array (..., S), optional
        True = the key takes part (the opposite of torch's ``key_padding_mask``).
    causal : bool
    need_weights : bool
        Return the attention weights too (else None).
    average_attn_weights : bool
        Weights averaged over heads, (..., L, S) (torch's default), or per head,
        (..., H, L, S).
    rotary_base : float, optional
        Apply RoPE (``nbattn.positional.rope``, half-split pairing) with this
        base to the per-head queries and keys before the scores.
    num_kv_heads : int dividing num_heads, optional
        Key/value heads for grouped-query attention (1: multi-query
        attention); default num_heads. The key/value heads are shared by
        their query heads without copies on the blocked path.

    Notes
    -----
    With ``need_weights=False`` the heads run on the blocked flash kernels
    (``nbattn.flash.flash_attention``, the mask applied on the tiles and
    the key/value heads shared with ``enable_gqa``); weights need the score
    matrix and take the path of :func:`attention`.

    Returns
    -------
    out : array (..., L, E)
    weights : array (..., L, S) or (..., H, L, S), or None
        Fully masked rows give zero outputs (before the output projection,
        so ``out`` is the output bias there) and zero weights, never NaN.
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    causal = check_bool(causal, "causal")
    need_weights = check_bool(need_weights, "need_weights")
    average_attn_weights = check_bool(average_attn_weights, "average_attn_weights")
    dt = resolve_dtype(dtype, query, key, value)
    query = as_float_array(query, "query", min_ndim=2, dtype=dt, allow_bool=False)
    key = as_float_array(key, "key", min_ndim=2, dtype=dt, allow_bool=False)
    value = as_float_array(value, "value", min_ndim=2, dtype=dt, allow_bool=False)
    E = query.shape[-1]
    if E % num_heads:
        raise ValueError(f"embed dim {E} of query is not divisible by num_heads={num_heads}")
    H_kv = num_heads if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
    if num_heads % H_kv:
        raise ValueError(f"num_kv_heads={H_kv} must divide num_heads={num_heads}")
    E_kv = H_kv * (E // num_heads)
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key and value must have the same length; got {key.shape[-2]} and {value.shape[-2]}"
        )

    def mat(x, name, shape):
        return _scores.parameter_matrix(x, name, shape, dt)

    if in_proj_weight is not None:
        if key.shape[-1] != E or value.shape[-1] != E:
            raise ValueError(
                "in_proj_weight needs key and value of width E; use q_proj_weight, "
                "k_proj_weight, v_proj_weight for other widths"
            )
        w = mat(in_proj_weight, "in_proj_weight", (E + 2 * E_kv, E))
        wq, wk, wv = w[:E], w[E : E + E_kv], w[E + E_kv :]
    else:
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise ValueError(
                "give in_proj_weight or all of q_proj_weight, k_proj_weight, v_proj_weight"
            )
        wq = mat(q_proj_weight, "q_proj_weight", (E, E))
        wk = mat(k_proj_weight, "k_proj_weight", (E_kv, key.shape[-1]))
        wv = mat(v_proj_weight, "v_proj_weight", (E_kv, value.shape[-1]))
    bq = bk = bv = None
    if in_proj_bias is not None:
        b = mat(in_proj_bias, "in_proj_bias", (E + 2 * E_kv,))
        bq, bk, bv = b[:E], b[E : E + E_kv], b[E + E_kv :]
    if out_proj_weight is None:
        raise ValueError("out_proj_weight is required")
    wo = mat(out_proj_weight, "out_proj_weight", (E, E))
    bo = None if out_proj_bias is None else mat(out_proj_bias, "out_proj_bias", (E,))

    H, d = num_heads, E // num_heads
    L, S = query.shape[-2], key.shape[-2]

    def heads(x, n_heads):  # (..., n, n_heads d) -> (..., n_heads, n, d)
        return np.swapaxes(x.reshape(x.shape[:-1] + (n_heads, d)), -2, -3)

    qh = heads(_linear(query, wq, bq), H)
    kh = heads(_linear(key, wk, bk), H_kv)
    vh = heads(_linear(value, wv, bv), H_kv)
    if rotary_base is not None:
        from .positional import rope

        qh = rope(qh, base=rotary_base)
        kh = rope(kh, base=rotary_base)

    bias = _mask_bias(mask, shape=(L, S))
    if key_mask is not None:
        km = np.asarray(key_mask)
        if km.dtype.kind != "b":
            raise ValueError(f"key_mask must be boolean (True = key takes part), got {km.dtype}")
        if km.ndim < 1 or km.shape[-1] != S:
            raise ValueError(f"key_mask must have shape (..., {S}), got {km.shape}")
        kb = _mask_bias(km[..., None, None, :], name="key_mask")
        bias = kb if bias is None else bias + kb
    if need_weights:
        if H_kv != H:
            kh = np.repeat(kh, H // H_kv, axis=-3)
            vh = np.repeat(vh, H // H_kv, axis=-3)
        out_h, weights = attention(
            qh, kh, vh, "scaled_dot", mask=bias, causal=causal, return_weights=True, dtype=dt
        )
    else:
        from .flash import flash_attention

        out_h = flash_attention(qh, kh, vh, causal=causal, mask=bias, enable_gqa=H_kv != H)
        weights = None
    concat = np.swapaxes(out_h, -2, -3)
    concat = concat.reshape(concat.shape[:-2] + (E,))
    out = _linear(concat, wo, bo)
    if weights is not None and average_attn_weights:
        weights = weights.mean(axis=-3)
    return out, weights


# --------------------------------------------------------------------------- hierarchical
HierarchicalResult = namedtuple(
    "HierarchicalResult",
    ["output", "segments", "item_weights", "segment_weights", "segment_labels"],
)
HierarchicalResult.__doc__ = """Result of :func:`hierarchical_attention`.

output : (Ev,) the document vector; segments : (G, Ev) the segment vectors;
item_weights : (N,) alpha of each item within its segment (each segment's
weights sum to 1); segment_weights : (G,) beta over segments;
segment_labels : (G,) the distinct segment ids, in sorted order (row g of
``segments`` belongs to ``segment_labels[g]``).
"""


def hierarchical_attention(
    x,
    segment_ids,
    item_query,
    segment_query,
    score="scaled_dot",
    values=None,
    *,
    item_score_params=None,
    segment_score_params=None,
    dtype=None,
):
    """Two-level (structured) attention: items -> segments -> document (the attention chapter).

    Items (words) x_n with segment ids g(n) (sentences) are pooled within each
    segment by an item-level query, and the segment vectors are pooled by a
    segment-level query (Yang et al. 2016's hierarchical attention network,
    without its projections):

    .. math::

        \\alpha_n = \\operatorname{softmax}_{n : g(n) = g}\\, s(u_w, x_n), \\qquad
        c_g = \\sum_{n : g(n) = g} \\alpha_n\\, v_n

        \\beta_g = \\operatorname{softmax}_g\\, s(u_s, c_g), \\qquad
        \\text{output} = \\sum_g \\beta_g\\, c_g

    Parameters
    ----------
    x : array (N, D)
        The items (keys of level 1).
    segment_ids : int array (N,)
        The segment of each item; any integers, need not be sorted or
        contiguous. Segments are ordered by id.
    item_query : array (D,)
        u_w, the item-level query.
    segment_query : array (Dv,)
        u_s, the segment-level query (Dv = D unless ``values`` is given).
    score : str or callable
        The score of both levels (see :func:`attention`).
    values : array (N, Dv), optional
        Values to pool instead of x (level 1 is key-value attention; the
        segment vectors c_g are then both keys and values of level 2).
    item_score_params, segment_score_params : dict, optional
        Extra score parameters of each level (e.g. W, U, v for "additive").

    Returns
    -------
    HierarchicalResult(output, segments, item_weights, segment_weights, segment_labels)
    """
    dt = resolve_dtype(dtype, x, item_query, segment_query, values)
    x = as_float_array(x, "x", min_ndim=2, dtype=dt, allow_bool=False)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (N items, D), got shape {x.shape}")
    N = x.shape[0]
    ids = np.asarray(segment_ids)
    if ids.dtype.kind not in "iu" or ids.shape != (N,):
        raise ValueError(
            f"segment_ids must be an integer array of shape ({N},), got dtype {ids.dtype} "
            f"and shape {ids.shape}"
        )
    vals = x if values is None else as_float_array(values, "values", min_ndim=2, dtype=dt)
    if vals.ndim != 2 or vals.shape[0] != N:
        raise ValueError(f"values must have shape ({N}, Dv), got {vals.shape}")
    uq = as_float_array(item_query, "item_query", min_ndim=1, dtype=dt)
    if uq.ndim != 1:
        raise ValueError(f"item_query must be 1-D, got shape {uq.shape}")
    us = as_float_array(segment_query, "segment_query", min_ndim=1, dtype=dt)
    if us.ndim != 1:
        raise ValueError(f"segment_query must be 1-D, got shape {us.shape}")
    labels, inverse = np.unique(ids, return_inverse=True)
    G = labels.shape[0]
    member = inverse[None, :] == np.arange(G)[:, None]  # (G, N)
    segs, w1 = attention(
        np.broadcast_to(uq, (G, uq.shape[0])),
        x,
        vals,
        score,
        mask=member,
        return_weights=True,
        score_params=item_score_params,
        dtype=dt,
    )
    item_weights = w1[inverse, np.arange(N)]
    doc, w2 = attention(
        us[None, :],
        segs,
        segs,
        score,
        return_weights=True,
        score_params=segment_score_params,
        dtype=dt,
    )
    return HierarchicalResult(doc[0], segs, item_weights, w2[0], labels)
