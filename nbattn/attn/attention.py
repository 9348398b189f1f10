"""Key-value attention ``att((K, V), q) = sum_j alpha_j v_j``: soft, hard and sampled, with
any registered score, as in the attention chapter.

Shapes follow torch's ``scaled_dot_product_attention``: queries q (..., L, E),
keys k (..., S, E), values v (..., S, Ev) -> (..., L, Ev), with any leading
batch/head dimensions, broadcast like torch. Masks follow torch's SDPA
convention (``nbattn.attn.masks``): a boolean mask is True where a query may
attend to a key, a float mask is added to the scores; either broadcasts to
(..., L, S).

A query row with no admissible key (fully masked, or causal with nothing
before it) gets an all-zero output and an all-zero weight row — never NaN
(``torch.nn.MultiheadAttention`` returns NaN there; recent torch SDPA zeros).

This layer validates (ValueError naming the argument; inputs never modified),
broadcasts and lays out arrays, and runs the blocked flash kernels
(``nbattn.attn.flash``) or the score and softmax kernels of
``nbattn.kernels``. Softmax functions live in ``nbattn.attn.softmax``,
multi-head and hierarchical attention, built on :func:`attention`, in
``nbattn.attn.multihead`` and ``nbattn.attn.hierarchical``.
"""

from __future__ import annotations

import numpy as np

from .. import config
from .._core.layout import flat_batch
from .._core.validation import (
    as_float_array,
    broadcast_leading,
    check_bool,
    check_choice,
    check_dot_range,
    resolve_dtype,
)
from ..dispatch.device import kernels_for
from . import scores as _scores
from .flash_args import scale_values, unscale_output, value_scales
from .masks import mask_as_bias, mask_input, shift_rows

__all__ = ["MODES", "attention"]

#: The attention modes of the text: soft (weighted average), hard (arg-max key),
#: sample (a key drawn from the attention distribution).
MODES = ("soft", "hard", "sample")


def _kernels(op):
    """The CPU kernel module of ``op`` (the score-matrix paths have no GPU twin)."""
    return kernels_for(op, "cpu")


# --------------------------------------------------------------------------- masks
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
    shifted = shift_rows(bias, admissible)
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


# --------------------------------------------------------------------------- attention
def _soft_attention(q, k, v, scale, mask, causal, batch=None):
    """The soft scaled-dot-product path: flat q (B, L, E), k (B, S, E), v (B, S, Ev),
    this call's own checked arrays (the kernels may modify them).

    ``mask`` is None or the user's boolean or float mask (..., Lb, Sb) as
    ``masks.mask_input`` gives it, whose leading dimensions broadcast to
    ``batch`` (B = prod(batch); default (B,)); it is handed to the blocked
    FlashAttention kernel (``nbattn.flash``, BLAS on tiles), which reads it
    once into its own base-2 form, never expanded per head, and applies it on
    the tiles. Returns ``(out (B, L, Ev), lse (B, L))``.
    """
    from .flash import flash_attention_owned

    batch = q.shape[:1] if batch is None else batch

    def lead(x):
        return x.reshape(tuple(batch) + x.shape[1:])

    out, lse = flash_attention_owned(
        lead(q), lead(k), lead(v), causal=causal, scale=scale, mask=mask
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
    check_choice(mode, "mode", MODES)
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
    # the mask's kind and shape only: the flash path reads its entries once, in its own
    # conversion; the weight-matrix path makes its float64 bias below
    mask_arr = mask_input(mask, (L, S))
    shapes = {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]}
    if mask_arr is not None:
        shapes["mask"] = mask_arr.shape[:-2]
    batch = broadcast_leading(shapes)
    qf, kf, vf = flat_batch(q, batch), flat_batch(k, batch), flat_batch(v, batch)

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
            out, _ = _soft_attention(qd, kd, vf, sc, mask_arr, causal, batch)
            return out.reshape(batch + (L, Ev))
        s_all = None

    # float64: _fit_bias shifts huge biases exactly
    bias = _fit_bias(mask_as_bias(mask_arr, float_dtype=np.float64), dt, causal, L)
    bias_f = _flat_bias(bias, batch)

    # the weight-matrix path, in slices of query rows that hold at most `limit` scores
    u = np.random.default_rng(random_state).random((B, L)) if mode == "sample" else None
    # normalised weights: w @ v is within (1 + S eps) max|v|; values at the very top of the
    # range are divided by a power of two per batch entry (exact) and out multiplied back
    scales = value_scales(vf, S, weight_bound=2.0) if mode == "soft" else None
    scale_values(vf, scales)
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
                wider = " (or use float64 inputs)" if dt != np.float64 else ""
                raise ValueError(
                    f"q and k: the {record.name!r} scores overflow {np.dtype(dt).name}; "
                    f"rescale them{wider}"
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
    out = unscale_output(out, scales).reshape(batch + (L, Ev))
    if return_weights:
        return out, weights.reshape(batch + (L, S))
    return out
