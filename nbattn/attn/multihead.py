"""Multi-head scaled-dot-product attention with torch's parameter layout.

:func:`multi_head_attention` projects queries, keys and values per head
(grouped-query attention: fewer key/value heads, each shared), optionally
rotates them (RoPE), attends per head and projects the concatenated heads
back: the functional form of ``torch.nn.MultiheadAttention`` (batch first),
which :class:`nbattn.MultiHeadAttention` wraps. Heads run on the blocked
flash kernels unless the weights are asked for, which take the score-matrix
path of :func:`nbattn.attn.attention.attention`.
"""

from __future__ import annotations

import numpy as np

from .._core.validation import as_float_array, check_bool, check_positive_int, resolve_dtype
from . import scores as _scores
from .attention import attention
from .masks import mask_as_bias, mask_input

__all__ = ["multi_head_attention"]


def _linear(x, weight, bias):
    y = x @ weight.T
    if bias is not None:
        y += bias
    return y


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
    # self-attention (one array for all three) is checked once and projected by one product
    same_input = key is query and value is query
    query = as_float_array(query, "query", min_ndim=2, dtype=dt, allow_bool=False)
    if same_input:
        key = value = query
    else:
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

    if same_input and in_proj_weight is not None:
        # [W_q; W_k; W_v] in one product; the heads are views of its column blocks
        qkv = _linear(query, w, None if in_proj_bias is None else b)
        qh = heads(qkv[..., :E], H)
        kh = heads(qkv[..., E : E + E_kv], H_kv)
        vh = heads(qkv[..., E + E_kv :], H_kv)
    else:
        qh = heads(_linear(query, wq, bq), H)
        kh = heads(_linear(key, wk, bk), H_kv)
        vh = heads(_linear(value, wv, bv), H_kv)
    if rotary_base is not None:
        from .positional import rope

        qh = rope(qh, base=rotary_base)
        kh = rope(kh, base=rotary_base)

    bias = mask_input(mask, (L, S))  # read once, by the flash path or attention()
    if key_mask is not None:
        km = np.asarray(key_mask)
        if km.dtype.kind != "b":
            raise ValueError(f"key_mask must be boolean (True = key takes part), got {km.dtype}")
        if km.ndim < 1 or km.shape[-1] != S:
            raise ValueError(f"key_mask must have shape (..., {S}), got {km.shape}")
        kb = mask_as_bias(km[..., None, None, :], name="key_mask")
        bias = kb if bias is None else mask_as_bias(bias, float_dtype=np.float64) + kb
    if need_weights:
        if H_kv != H:
            kh = np.repeat(kh, H // H_kv, axis=-3)
            vh = np.repeat(vh, H // H_kv, axis=-3)
        out_h, weights = attention(
            qh, kh, vh, "scaled_dot", mask=bias, causal=causal, return_weights=True, dtype=dt
        )
    else:
        from .flash import flash_attention_owned

        # the projections are this call's own arrays: no second copy and check of them
        out_h, _ = flash_attention_owned(qh, kh, vh, causal=causal, mask=bias, enable_gqa=H_kv != H)
        weights = None
    concat = np.swapaxes(out_h, -2, -3)
    concat = concat.reshape(concat.shape[:-2] + (E,))
    out = _linear(concat, wo, bo)
    if weights is not None and average_attn_weights:
        weights = weights.mean(axis=-3)
    return out, weights
