"""Blocked (FlashAttention-style) scaled dot-product attention, forward and backward.

    out = softmax(cap(scale * q k^T) + mask) v  (with dropout),
    lse = logsumexp(cap(scale * q k^T) + mask)

computed tile by tile with an online softmax by ``nbattn.kernels.flash``:
memory is linear in the sequence lengths, never queries x keys. This layer
validates (``nbattn.attn.flash_args`` checks the keywords), broadcasts the leading
(batch, head) dimensions, picks the dtype, lays the arrays out for the
kernels and holds BLAS to one thread while they run (they call BLAS on tiles
from their own parallel loop).

Shapes follow ``torch.nn.functional.scaled_dot_product_attention``: q
(..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); the leading
dimensions broadcast, and with ``enable_gqa=True`` k and v may have fewer
heads (axis -3) than q. What the keywords mean:

* ``mask``: boolean (True = may attend) or float (added to the scores),
  broadcastable to (..., L, S); a key-padding mask is (..., 1, S). It is
  applied on the tiles, never expanded: a (B, 1, 1, S) mask costs S floats
  per batch entry, and tiles that a boolean mask excludes entirely are
  skipped.
* ``causal`` and ``causal_alignment``: "top_left" lets query i see keys
  j <= i (torch's ``is_causal``: with L > S the rows i >= S see every key,
  with L < S the keys j >= L are seen by no query); "bottom_right" lets it
  see j <= i + S - L (FlashAttention-2: the last query sees every key, as
  in decoding with a cache).
* ``window=(left, right)``: query i sees keys j with
  i - left <= j - offset <= i + right (offset = 0 top-left, S - L
  bottom-right; None on a side = unbounded); composes with ``causal``.
  Tiles outside the band are never visited: the work is O(L * window).
* ``softcap=c``: scores become c tanh(s / c) (on the scaled score, before
  the mask: FlashAttention-2's order), with the gradient 1 - tanh^2.
* ``dropout_p``, ``random_state``: each weight is dropped with probability
  p and the kept ones scaled by 1 / (1 - p), after the softmax normaliser
  (lse does not see dropout, as in torch and FlashAttention-2). The mask is
  a counter-based hash of the seed and the weight's position
  (``nbattn.kernels.dropout``): deterministic for a given seed, independent
  of tile sizes and thread count, the same on the GPU. The backward pass
  regenerates it from the seed, so it needs the int ``random_state`` that
  the forward used (``random_state=None`` in the forward draws a fresh seed
  that cannot be given back: pass an int when you take gradients).

The device is chosen once, by ``nbattn.dispatch.device.device_for`` and
``kernels_for("flash", device)``: NumPy (or any array-like) inputs are
validated and laid out here the same way for either device and handed to
that device's kernels with the same arguments (every keyword works on both;
the GPU twin's device results are copied back, so host in, host out). GPU
arrays (``__cuda_array_interface__``: numba device arrays, CuPy, torch CUDA
tensors) are checked on the device by ``nbattn.dispatch.transfer.as_device_array``
and used where they are (C-contiguous, one float dtype, equal leading
dimensions: no broadcasting on the device), and the results come back as the
kind of GPU array ``q`` is; that in-place path runs plain (optionally causal)
attention only and refuses the other keywords with a ValueError.

Magnitudes: the kernels work in base 2 (scores times log2(e)). A mask with
entries beyond 64 in magnitude is shifted per query row by its largest
admissible entry -- the softmax does not change, lse gets the shift back --
so biases up to the float64 range are exact; scores ``scale * q . k`` or
ALiBi terms that the base-2 form cannot hold are refused with a ValueError
naming the argument. Values near the top of the range (where the kernels'
sum of weights times values, taken before normalising, would overflow) are
divided by a power of two per key/value slice and the output multiplied
back (``flash_args.value_scales``): exact, so any finite values give the
finite convex combination. The in-place GPU-array path does not scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import config
from .._core.attn_groups import Band, Dropout, ScoreTransform, Tiles
from .._core.layout import flat_batch, unbroadcast
from .._core.numeric import LOG2E
from .._core.threads import blas_one_thread, dynamic_below, serial_below
from .._core.validation import as_float_array, check_bool, check_dot_range, check_scale
from ..dispatch.device import device_for, kernels_for
from ..dispatch.transfer import as_device_array, is_device_array, like_input, to_host
from .flash_args import (
    Keywords,
    MaskArrays,
    band,
    check_forward_results,
    check_keywords,
    check_qkv,
    check_shapes,
    dropout_words,
    flash_tiles,
    has_band,
    kv_layout,
    mask_arrays,
    scale_values,
    score_transform,
    unscale_output,
    value_scales,
)
from .flash_args import backward_groups as _n_groups
from .flex import check_mods, check_on_cpu, flex_backward, flex_forward, uses_flex
from .flex_cuda import flex_device
from .masks import mask_as_bias, mask_input

__all__ = [
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_bias",
    "flash_attention_bias_backward",
]

_NO_MASK_LIVE = np.ones((1, 1, 1), dtype=np.uint8)


def _threads_for(work):
    """One numba thread below ``config.FLASH_SERIAL_WORK`` multiply-adds (read per call)."""
    return serial_below(work, config.FLASH_SERIAL_WORK)


def _scheduling_for(work, n_items):
    """Items handed out one at a time from ``config.FLASH_DYNAMIC_ITEM_WORK``
    multiply-adds per item (read per call), else equal static shares."""
    return dynamic_below(work / max(n_items, 1), config.FLASH_DYNAMIC_ITEM_WORK)


# --------------------------------------------------------------------------- host inputs
def _key_bias_mask(key_bias, n_k):
    """A per-key bias (..., S) as a float64 mask (..., 1, S)."""
    bias = as_float_array(key_bias, "key_bias", dtype="float64", allow_neg_inf=True)
    if bias.ndim == 0 or bias.shape[-1] != n_k:
        raise ValueError(f"key_bias must have shape (..., S) with S={n_k}, got {bias.shape}")
    return bias[..., None, :]


def _slopes(alibi_slopes, lead, n_q, n_k, dtype):
    """The kernels' base-2 ALiBi slopes (BH,); slopes whose terms overflow are refused."""
    slopes = as_float_array(alibi_slopes, "alibi_slopes", dtype="float64", allow_bool=False)
    try:
        slopes = np.broadcast_to(slopes, lead).reshape(math.prod(lead))
    except ValueError as exc:
        raise ValueError(
            f"alibi_slopes of shape {slopes.shape} does not broadcast to the leading "
            f"dimensions {lead}"
        ) from exc
    limit = float(np.finfo(dtype).max) / 16
    largest = float(np.abs(slopes).max())
    if largest * max(n_q, n_k) * LOG2E > limit:
        raise ValueError(
            f"alibi_slopes holds the slope {largest:.3g}: slope x distance over "
            f"{max(n_q, n_k)} positions exceeds what the {np.dtype(dtype).name} kernels can hold "
            f"(|slope| <= {limit / (max(n_q, n_k) * LOG2E):.3g} here); rescale the slopes"
        )
    return np.ascontiguousarray(slopes * LOG2E, dtype=dtype)


def _flat(x, lead):
    """A checked array (our own C-contiguous copy) as (prod(lead), n, d): a view when its
    leading dimensions are ``lead``, else a broadcast copy."""
    if x.shape[:-2] == tuple(lead) and x.flags.c_contiguous:
        return x.reshape((-1,) + x.shape[-2:])
    return flat_batch(x, lead)


@dataclass
class _Layout:
    """Everything the CPU kernels read for one call, and how to give the results back."""

    qf: np.ndarray  # (BH, L, E): q * scale * log2(e)
    kf: np.ndarray  # (BKV, S, E)
    vf: np.ndarray  # (BKV, S, Ev)
    lead: tuple
    kv_lead: tuple
    kv_index: np.ndarray
    masks: MaskArrays
    slopes: np.ndarray
    band: Band
    score: ScoreTransform  # the user's scale, the base-2 softcap
    dtype: type
    shapes: tuple  # q, k, v shapes as given

    @property
    def work(self):
        """Multiply-adds of the full (unbanded) computation, for the thread rule."""
        n_bh, n_q, e = self.qf.shape
        return n_bh * n_q * self.kf.shape[1] * (e + self.vf.shape[2])

    def tiles(self, backward, n_groups=1) -> Tiles:
        """The tile sizes of this call's forward or backward (``flash_args.flash_tiles``)."""
        return flash_tiles(self.kf.shape[1], self.band, backward, n_groups)

    def bias(self, tiles: Tiles, device):
        """The kernels' Bias group, with the CPU's table of live mask tiles for ``tiles``
        (the GPU twin skips closed tiles by itself)."""
        live = _NO_MASK_LIVE
        if device == "cpu" and self.masks.mask.shape[0] > 0:
            live = self.masks.live_for(tiles)
            if live is None:
                live = kernels_for("flash", "cpu").mask_tile_live(
                    self.masks.mask, tiles.block_q, tiles.block_k
                )
        return self.masks.bias(live, self.slopes)


def _layout(
    q, k, v, kw: Keywords, scale, mask, key_bias=None, alibi_slopes=None, others=(), owned=False
):
    """Checked and laid-out arrays of one CPU flash call (forward or backward).

    ``owned``: q, k and v are already checked arrays of one float dtype that this
    call may modify (the caller's own copies): they are used as they are.
    """
    if owned:
        dtype = q.dtype.type
        check_shapes(q, k, v, kw.enable_gqa)
    else:
        q, k, v, dtype = check_qkv(q, k, v, kw.enable_gqa, others)
    scale = check_scale(scale, q.shape[-1])
    check_dot_range(q, k, scale * LOG2E, dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    bias = mask_input(mask, (n_q, n_k))  # its entries are read once, by mask_arrays
    if key_bias is not None:
        kb = _key_bias_mask(key_bias, n_k)
        bias = kb if bias is None else mask_as_bias(bias, dtype=dtype) + kb
    extra = () if bias is None else (bias.shape[:-2],)
    lead, kv_lead, kv_index = kv_layout(q.shape, k.shape, v.shape, kw.enable_gqa, extra)
    band_ = band(kw, n_q, n_k)
    # the forward's table of open tiles is made with the mask (the backward makes its own)
    tiles = flash_tiles(n_k, band_, backward=False)
    masks = mask_arrays(bias, lead, n_q, n_k, dtype, band_, has_band(band_, n_q, n_k), tiles)
    slopes = np.zeros(0, dtype=dtype)
    if alibi_slopes is not None:
        slopes = _slopes(alibi_slopes, lead, n_q, n_k, dtype)
    qf = _flat(q, lead)
    qf *= dtype(scale * LOG2E)
    return _Layout(
        qf=qf,
        kf=_flat(k, kv_lead),
        vf=_flat(v, kv_lead),
        lead=lead,
        kv_lead=kv_lead,
        kv_index=kv_index,
        masks=masks,
        slopes=slopes,
        band=band_,
        score=score_transform(scale, kw),
        dtype=dtype,
        shapes=(q.shape, k.shape, v.shape),
    )


def _to_host(a):
    """A kernel result on the host: GPU twins give device arrays, the CPU kernels ndarrays."""
    return to_host(a)


def _run_forward(lay: _Layout, dropout: Dropout, device="cpu"):
    """The flash forward of ``kernels_for("flash", device)`` on a layout, on the host:
    (out (BH, L, Ev), shifted lse (BH, L))."""
    tiles = lay.tiles(backward=False)
    bias = lay.bias(tiles, device)
    n_items = lay.qf.shape[0] * -(-lay.qf.shape[1] // tiles.block_q)
    # around the kernel alone: mask_tile_live's np.zeros is a parallel loop of its own
    with _scheduling_for(lay.work, n_items):
        out, lse = kernels_for("flash", device).flash_forward(
            lay.qf, lay.kf, lay.vf, lay.kv_index, bias, lay.band, lay.score, dropout, tiles
        )
    return _to_host(out), _to_host(lse)


def _forward(
    q,
    k,
    v,
    kw,
    scale,
    return_lse,
    mask,
    random_state,
    key_bias=None,
    alibi=None,
    device="cpu",
    owned=False,
):
    """:func:`flash_attention` of host inputs, on ``device`` (results on the host)."""
    lay = _layout(q, k, v, kw, scale, mask, key_bias, alibi, owned=owned)
    if device == "cuda":
        _head_dims(kernels_for("flash", "cuda"), lay.qf.shape[2], lay.vf.shape[2])
    n_q = lay.qf.shape[1]
    dropout = dropout_words(kw.dropout_p, random_state, n_q, lay.kf.shape[1])
    # values near the top of the range: the kernels' sum_j p_j v_j before normalising
    # would overflow, so v is divided by a power of two per slice and out multiplied back
    scales = value_scales(lay.vf, lay.kf.shape[1])
    scale_values(lay.vf, scales)
    with blas_one_thread(), _threads_for(lay.work):
        out, lse = _run_forward(lay, dropout, device)
    unscale_output(out, scales, lay.kv_index)
    out = out.reshape(lay.lead + (n_q, lay.vf.shape[2]))
    if not return_lse:
        return out
    shift = lay.masks.lse_shift(n_q)
    if shift is not None:
        lse += shift
    return out, lse.reshape(lay.lead + (n_q,))


#: A mask shift (see ``nbattn.attn.flash_args.mask_arrays``) from which ``lse - shift``
#: loses more than 10 bits of lse; the backward then recomputes the shifted lse
#: (one more forward pass) instead of subtracting.
_RECOMPUTE_SHIFT = 2.0**10


def _backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    kw,
    scale,
    mask,
    random_state,
    key_bias=None,
    alibi=None,
    device="cpu",
):
    """:func:`flash_attention_backward` of host inputs, on ``device`` (results on the host)."""
    lay = _layout(q, k, v, kw, scale, mask, key_bias, alibi, others=(out, grad_out))
    if device == "cuda":
        _head_dims(kernels_for("flash", "cuda"), lay.qf.shape[2], lay.vf.shape[2])
    n_bh, n_q, _ = lay.qf.shape
    n_kv, n_k, _ = lay.kf.shape
    out, lse, grad_out = check_forward_results(
        out, lse, grad_out, lay.lead, n_q, lay.vf.shape[2], lay.dtype
    )
    dropout = dropout_words(kw.dropout_p, random_state, n_q, n_k, for_backward=True)
    of = flat_batch(out, lay.lead, lay.dtype)
    gf = flat_batch(grad_out, lay.lead, lay.dtype)
    lf = np.ascontiguousarray(lse.reshape(-1, n_q), dtype=np.float64)
    shift = lay.masks.lse_shift(n_q)
    block_k = lay.tiles(backward=True).block_k
    # the backward keeps equal static shares: numba turns its np.zeros into a parallel
    # loop of its own, which one-at-a-time scheduling would cut into single elements
    tiles = lay.tiles(backward=True, n_groups=_n_groups(n_kv, -(-n_k // block_k), lay.qf.nbytes))
    with blas_one_thread(), _threads_for(lay.work):
        if shift is not None:
            if np.abs(shift).max() >= _RECOMPUTE_SHIFT:
                # lse - shift has lost the low bits of lse: recompute the shifted lse
                _, lf = _run_forward(lay, dropout, device)
            else:
                lf = lf - shift
        args = (lay.kv_index, lay.bias(tiles, device), lay.band, lay.score, dropout, tiles)
        grads = kernels_for("flash", device).flash_backward(
            lay.qf, lay.kf, lay.vf, of, lf, gf, *args
        )
    dq, dk, dv = map(_to_host, grads)
    q_shape, k_shape, v_shape = lay.shapes
    return (
        unbroadcast(dq.reshape(lay.lead + dq.shape[1:]), q_shape),
        unbroadcast(dk.reshape(lay.kv_lead + dk.shape[1:]), k_shape),
        unbroadcast(dv.reshape(lay.kv_lead + dv.shape[1:]), v_shape),
    )


def flash_attention_bias(
    q,
    k,
    v,
    *,
    key_bias=None,
    alibi_slopes=None,
    causal=False,
    scale=None,
    return_lse=False,
):
    """Blocked attention with an optional per-key bias and ALiBi slopes.

        s_ij   = scale * q_i . k_j + key_bias_j + slope * (j - i)
        out_i  = sum_j softmax_j(s_ij) v_j,     lse_i = log sum_j exp(s_ij)

    with j restricted to j <= i when ``causal``. ``key_bias`` is the mask
    ``key_bias[..., None, :]`` of :func:`flash_attention` (a key-padding
    mask); ``alibi_slopes`` adds ``slope * (j - i)`` per (batch, head)
    without a score matrix. The Gaussian kernel of Nadaraya-Watson rides the
    same kernel: with bandwidth h, -||q - k||^2 / (2 h^2) = q.k / h^2 -
    ||k||^2 / (2 h^2) + (a per-query constant that the softmax cancels), so
    ``scale = 1 / h**2`` and ``key_bias = -||k||^2 / (2 h**2)`` give the same
    weights (lse then lacks the -||q||^2 / (2 h^2) term).

    Parameters
    ----------
    q, k, v : array_like, (..., L, E), (..., S, E), (..., S, Ev)
    key_bias : array_like (..., S), optional
        ``-inf`` excludes a key; any finite magnitude up to the float64 range
        is exact (see the module notes).
    alibi_slopes : array_like, optional
        One slope per (batch, head), broadcasting to the leading dimensions
        (for example shape (H,) with q of shape (B, H, L, E)). Adds
        ``slope * (j - i)`` (torch/ALiBi write ``-m (i - j)``).
    causal, scale, return_lse
        As in :func:`flash_attention`.
    """
    kw = check_keywords(causal, False, None, "top_left", None, 0.0)
    return_lse = check_bool(return_lse, "return_lse")
    return _forward(q, k, v, kw, scale, return_lse, None, None, key_bias, alibi_slopes)


def flash_attention_owned(q, k, v, *, causal=False, scale=None, mask=None, enable_gqa=False):
    """:func:`flash_attention` (forward, ``(out, lse)``) of arrays the caller has checked
    and owns: q, k, v of one float dtype (float32 or float64), finite, which the call
    may modify in place (q is scaled, v divided by powers of two near the top of the
    range). ``nbattn.attention`` and ``nbattn.multi_head_attention`` run their heads
    through it, without a second copy and check of their arrays; ``mask`` is checked
    here as by :func:`flash_attention`.
    """
    kw = check_keywords(causal, enable_gqa, None, "top_left", None, 0.0)
    return _forward(q, k, v, kw, scale, True, mask, None, owned=True)


def flash_attention_bias_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    *,
    key_bias=None,
    alibi_slopes=None,
    causal=False,
    scale=None,
):
    """Gradients of :func:`flash_attention_bias` with respect to q, k and v.

    The bias and the slopes are constants here (no gradient is returned for
    them). See :func:`flash_attention_backward` for the formulas.
    """
    kw = check_keywords(causal, False, None, "top_left", None, 0.0)
    return _backward(q, k, v, out, lse, grad_out, kw, scale, None, None, key_bias, alibi_slopes)


# --------------------------------------------------------------------------- GPU
def _head_dims(kernels, d, d_v):
    if d > kernels.MAX_HEAD_DIM or d_v > kernels.MAX_HEAD_DIM:
        raise ValueError(
            f"device='cuda' supports head dimensions up to {kernels.MAX_HEAD_DIM} "
            f"(nbattn.cuda.flash.MAX_HEAD_DIM), got E={d}, Ev={d_v}; use device='cpu'"
        )


def _device_qkv(kernels, q, k, v):
    """GPU q, k, v checked on the device: (flat (BH, n, d) views, their shapes, lead)."""
    arrays = [as_device_array(a, n, min_ndim=2, contiguous=True) for a, n in zip((q, k, v), "qkv")]
    q_shape, k_shape, v_shape = (tuple(a.shape) for a in arrays)
    if not (arrays[0].dtype == arrays[1].dtype == arrays[2].dtype):
        raise ValueError(
            "q, k and v on the GPU must share one dtype, got "
            + ", ".join(str(a.dtype) for a in arrays)
        )
    if q_shape[-1] != k_shape[-1]:
        raise ValueError(f"q has E={q_shape[-1]} features but k has {k_shape[-1]}")
    if k_shape[-2] != v_shape[-2]:
        raise ValueError(f"k has S={k_shape[-2]} keys but v has {v_shape[-2]}")
    lead = q_shape[:-2]
    if k_shape[:-2] != lead or v_shape[:-2] != lead:
        raise ValueError(
            f"GPU arrays need equal leading dimensions (no broadcasting on the device), got "
            f"q {q_shape}, k {k_shape}, v {v_shape}"
        )
    _head_dims(kernels, q_shape[-1], v_shape[-1])
    n_bh = math.prod(lead)
    flat = [a.reshape((n_bh,) + s[-2:]) for a, s in zip(arrays, (q_shape, k_shape, v_shape))]
    return flat, (q_shape, k_shape, v_shape), lead


def _forward_cuda(q, k, v, causal, scale, return_lse):
    """:func:`flash_attention` of GPU arrays, in place (see the module docstring)."""
    kernels = kernels_for("flash", "cuda")
    template = q
    (qf, kf, vf), (q_shape, _, _), lead = _device_qkv(kernels, q, k, v)
    scale = check_scale(scale, q_shape[-1])
    out, lse = kernels.flash_forward(qf, kf, vf, scale, causal)
    out = like_input(out.reshape(lead + tuple(out.shape)[1:]), template)
    lse = like_input(lse.reshape(lead + tuple(lse.shape)[1:]), template)
    return (out, lse) if return_lse else out


def _backward_cuda(q, k, v, out, lse, grad_out, causal, scale):
    """:func:`flash_attention_backward` of GPU arrays, in place: ``(dq, dk, dv)``."""
    kernels = kernels_for("flash", "cuda")
    template = q
    (qf, kf, vf), shapes, lead = _device_qkv(kernels, q, k, v)
    q_shape, _, v_shape = shapes
    scale = check_scale(scale, q_shape[-1])
    n_q = q_shape[-2]
    out_shape = lead + (n_q, v_shape[-1])
    o = as_device_array(out, "out", min_ndim=2, contiguous=True)
    g = as_device_array(grad_out, "grad_out", min_ndim=2, contiguous=True)
    ls = as_device_array(lse, "lse", min_ndim=1, allow_neg_inf=True, contiguous=True)
    for name, arr, shape in (
        ("out", o, out_shape),
        ("grad_out", g, out_shape),
        ("lse", ls, lead + (n_q,)),
    ):
        if tuple(arr.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(arr.shape)}")
    if not (o.dtype == g.dtype == qf.dtype):
        raise ValueError(f"out and grad_out on the GPU must have q's dtype {qf.dtype}")
    if np.dtype(ls.dtype) != np.float64:
        raise ValueError(f"lse on the GPU must be float64, got {ls.dtype}")
    n_bh = qf.shape[0]
    grads = kernels.flash_backward(
        qf,
        kf,
        vf,
        o.reshape((n_bh,) + out_shape[-2:]),
        ls.reshape(n_bh, n_q),
        g.reshape((n_bh,) + out_shape[-2:]),
        scale,
        causal,
    )
    return tuple(
        like_input(grad.reshape(shape), template) for grad, shape in zip(grads, shapes, strict=True)
    )


# --------------------------------------------------------------------------- public entries
def _cuda_refuses(kw: Keywords, mask):
    """GPU arrays are used in place for plain (optionally causal) attention only; say so."""
    used = [
        name
        for name, on in (
            ("mask", mask is not None),
            ("enable_gqa", kw.enable_gqa),
            ("window", kw.window is not None),
            ("causal_alignment", kw.causal_alignment != "top_left"),
            ("softcap", kw.softcap is not None),
            ("dropout_p", kw.dropout_p > 0.0),
        )
        if on
    ]
    if used:
        raise ValueError(
            f"GPU arrays do not support {', '.join(used)} yet; pass host (NumPy) arrays, "
            "which device='cuda' takes with every keyword, or use device='cpu'"
        )


def flash_attention(
    q,
    k,
    v,
    causal=False,
    scale=None,
    return_lse=False,
    mask=None,
    enable_gqa=False,
    window=None,
    causal_alignment="top_left",
    softcap=None,
    dropout_p=0.0,
    random_state=None,
    device="cpu",
    *,
    score_mod=None,
    mask_mod=None,
    block_mask=None,
    mod_args=(),
):
    """Scaled dot-product attention, blocked, with memory linear in the lengths.

        s_ij   = cap(scale * q_i . k_j) + mask_ij      (j admissible: causal, window)
        out_i  = sum_j drop_ij softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

    with cap(x) = c tanh(x / c) under ``softcap=c`` and drop_ij in
    {0, 1 / (1 - p)} under ``dropout_p=p``: the same as
    ``torch.nn.functional.scaled_dot_product_attention`` (with ``enable_gqa``,
    ``attn_mask``, ``is_causal``, ``scale``), plus windows, bottom-right
    causal alignment and softcapping of FlashAttention-2. Query tiles x key
    tiles, an online softmax (running maximum and sum, deferred
    normalisation) and BLAS on every tile; the queries x keys matrix is
    never formed. See the module docstring for each keyword's meaning.

    Parameters
    ----------
    q : array_like (..., L, E)
    k : array_like (..., S, E)
    v : array_like (..., S, Ev)
        Leading (batch, head) dimensions broadcast. float32 stays float32
        when all three are float32; anything else is float64.
    causal : bool
        Query i attends to keys j <= i + offset (offset per ``causal_alignment``).
    scale : float, optional
        Default 1 / sqrt(E).
    return_lse : bool
        Also return ``lse`` (..., L) as float64 (the log-normaliser before
        dropout), which :func:`flash_attention_backward` takes.
    mask : bool or float array_like broadcastable to (..., L, S), optional
        True = may attend; a float mask is added to the scores (-inf excludes).
    enable_gqa : bool
        k and v may have H_kv heads (axis -3) dividing q's H; query head h
        reads key/value head h // (H // H_kv). Nothing is copied per head.
    window : (left, right) or None
        Query i sees keys with i - left <= j - offset <= i + right; None on a
        side is unbounded.
    causal_alignment : "top_left" or "bottom_right"
        offset = 0 (torch's ``is_causal``) or S - L (FlashAttention-2).
    softcap : float > 0, optional
    dropout_p : float in [0, 1)
    random_state : None, int or numpy.random.Generator
        The dropout seed (``nbattn._core.numeric.dropout_seed``); pass an
        int to take gradients (the backward needs the same int).
    device : "cpu", "cuda" or "auto"
        "auto" runs on a CUDA GPU when numba sees one. On the GPU E and Ev are
        at most ``nbattn.cuda.flash.MAX_HEAD_DIM``. Host arrays take every
        keyword on either device and the results come back as ndarrays; GPU
        arrays are used in place (results of the same kind) for plain,
        optionally causal, attention only.
    score_mod : function ``score_mod(score, b, h, q_idx, kv_idx, *mod_args) -> float``, optional
        Programmable attention (PyTorch FlexAttention's signature): replaces
        each score s_ij = scale q_i . k_j (scaled, before the softmax) by
        ``score_mod(s_ij, b, h, i, j, *mod_args)``, with b and h the indices of
        the batch and head axes of q (B, H, L, E). A plain Python function on
        scalars, compiled into the kernels with numba (``njit`` is applied when
        it is not jitted); compiled once per function and cached on disk
        (``nbattn.kernels.flex_build``): each new function, and each new value
        of a number it reads from its globals or closure, compiles anew (about
        4 s), so pass values that change in ``mod_args``. Not a
        ``functools.partial`` or bound method, and no keyword-only parameter or
        ``**kwargs`` (numba calls it positionally): put parameters in ``mod_args``.
        As in FlexAttention it is evaluated on every entry of a visited tile
        inside the band, masked or not: it must be safe there (numba does not
        check array bounds). On ``device="cuda"`` (host arrays) the same
        functions are compiled with ``numba.cuda.jit(device=True)`` into the GPU
        kernels, once per process (``nbattn.attn.flex_cuda``). Not with ``mask``,
        ``softcap`` or ``dropout_p`` (express them in the functions; for a
        softcap, ``c * nbattn.flex_tanh(score / c)`` vectorises where
        ``np.tanh`` does not; ``math.tanh`` has no complex form, so the
        backward's complex step refuses it). As in torch, whose Python floats
        take the tensor's dtype, on float32 inputs the Python floats it reads
        (constants, closure cells, module globals, defaults) are float32
        (``30.0 * nbattn.flex_tanh(score / 30.0)`` computes in float32: numba
        alone would type 30.0 as a float64 and compute the softcap 1.4-1.5x
        slower); ``np.float64(c)``, module attributes such as ``math.pi`` and
        float64 ``mod_args`` keep float64 arithmetic where it is wanted. The
        same holds for ``score_mod_grad`` and ``score_mod_args_grad``. NaN or +inf on an admissible
        entry makes the row's output and lse NaN (as in torch), -inf masks the
        entry, and a finite score beyond max / log2(e) of the dtype (about
        1.2e308 in float64) is a ValueError. Indexing out of range in it is
        undefined behaviour (wrong values or a crash), and Ctrl-C takes effect
        only when the call returns.
    mask_mod : function ``mask_mod(b, h, q_idx, kv_idx, *mod_args) -> bool``, optional
        True where query i may attend to key j, applied after ``score_mod``
        and evaluated per element on every tile.
    block_mask : BlockMask, optional
        From :func:`nbattn.create_block_mask`: ``mask_mod`` classified per tile,
        so that masked tiles are skipped and open ones need no per-element
        mask (instead of ``mask_mod``).
    mod_args : tuple of arrays and numbers
        The trailing arguments of ``score_mod`` and ``mask_mod`` (bias tables,
        slopes, document ids): both receive all of them, so each must accept
        every entry (``*rest`` for those it does not use); a ``block_mask``
        holds its own (``create_block_mask(..., mod_args=)``). Functions that
        read arrays from their globals, closure or a module (``helpers.TABLE``)
        are refused: numba would freeze the array into the kernel. Numbers
        that change between calls belong here (in globals they compile anew).
        Arrays keep their shape (0-d included); an error without
        ``score_mod`` or ``mask_mod``.

    Returns
    -------
    out : ndarray (..., L, Ev) in the computation dtype, or ``(out, lse)``.
        A row with no admissible key gives zeros and lse = -inf.
    """
    kw = check_keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p)
    return_lse = check_bool(return_lse, "return_lse")
    if uses_flex(score_mod, mask_mod, block_mask, mod_args=mod_args):
        mods = check_mods(score_mod, mask_mod, block_mask, mod_args, None, kw, mask)
        device = flex_device(device, q, k, v)
        return flex_forward(q, k, v, kw, scale, return_lse, mods, device)
    device = device_for(device, q, k, v)
    if device == "cuda" and any(is_device_array(a) for a in (q, k, v)):
        _cuda_refuses(kw, mask)
        return _forward_cuda(q, k, v, kw.causal, scale, return_lse)
    return _forward(q, k, v, kw, scale, return_lse, mask, random_state, device=device)


def flash_attention_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    causal=False,
    scale=None,
    mask=None,
    enable_gqa=False,
    window=None,
    causal_alignment="top_left",
    softcap=None,
    dropout_p=0.0,
    random_state=None,
    device="cpu",
    *,
    score_mod=None,
    mask_mod=None,
    block_mask=None,
    mod_args=(),
    score_mod_grad=None,
    score_mod_args_grad=None,
):
    """Gradients of :func:`flash_attention`: ``(dq, dk, dv)``, blocked, O(N) memory.

    With P = softmax(S'), S' = cap(S) + mask, S = scale q k^T, recomputed
    tile by tile from the saved ``lse`` (P = exp(S' - lse)), Z the dropout
    factors (0 or 1 / (1 - p)) and dO = ``grad_out``:

        dV = (P o Z)^T dO,   dP = (dO V^T) o Z,   D_i = sum_c dO_ic O_ic,
        dS = P o (dP - D) o cap'(S),   dQ = scale dS K,   dK = scale dS^T Q

    with cap' = 1 - tanh^2(S / c) under a softcap. With ``enable_gqa`` dK and
    dV are summed over the query heads that share a key/value head.

    Parameters
    ----------
    q, k, v : array_like
        The forward inputs.
    out, lse : array_like
        The forward's outputs, ``flash_attention(q, k, v, ..., return_lse=True)``.
        ``lse`` may hold -inf (rows without keys; their gradients are zero).
    grad_out : array_like, the shape of ``out``
        The gradient of the loss with respect to ``out``.
    causal, scale, mask, enable_gqa, window, causal_alignment, softcap, dropout_p
        As in the forward call.
    random_state : int
        With ``dropout_p > 0``: the int the forward used (the dropout mask is
        regenerated from it); anything else is a ValueError.
    device : "cpu", "cuda" or "auto"
        As in :func:`flash_attention` (GPU arrays in, the same kind out).
    score_mod, mask_mod, block_mask, mod_args
        As in the forward call. Through ``score_mod`` dS = P o (dP - D) o g with
        g = d score_mod / d score, taken by the complex step: ``score_mod`` is
        compiled for a complex128 score and g = Im score_mod(s + i h) / h
        (h = 2**-64), exact to rounding where the function is analytic in
        ``score`` (use ``np.tanh``, not ``math.tanh``, which numba has only for
        real numbers). The complex step is wrong where a non-analytic operation
        (``abs``, ``max``, a comparison, ``.real``) sits inside an expression that
        stays complex (``score - 0.5 * abs(score)``): the imaginary part it drops
        goes unseen. Before the kernel compiles, the complex step is compared
        with a finite difference of ``score_mod`` at scores -3.1, -0.7, 0.4, 2.9
        (b = h = q_idx = kv_idx = 0, this call's ``mod_args``), and a mismatch is
        refused (pass ``score_mod_grad``); a non-analytic point elsewhere can still
        go unseen.
    score_mod_grad : function ``score_mod_grad(score, b, h, q_idx, kv_idx, *mod_args)``, optional
        d score_mod / d score, for functions that are not analytic (``abs``,
        ``max``, comparisons on the score) or to spare the complex arithmetic.
    score_mod_args_grad : function, optional
        ``(grad_score, score, b, h, q_idx, kv_idx, *mod_args, *mod_args_grads)``:
        adds grad_score * d score_mod / d mod_args[m] into ``mod_args_grads[m]``
        (float64, the shape of ``mod_args[m]``), dL/dT = sum_e grad_score_e
        d score_mod_e / dT. Called on every admissible entry (never masked ones),
        grad_score = dL/d score_mod (float64), score the unmodified scaled product.
        Entries that are not float arrays get a placeholder (see
        ``nbattn.kernels.flex_args``). Without it no ``mod_args`` gradient is built.

    Returns
    -------
    dq, dk, dv : ndarrays of the shapes of q, k, v (gradients summed over
        broadcast leading dimensions) in the computation dtype; with
        ``score_mod_args_grad``, ``(dq, dk, dv, dmod_args)``: per ``mod_args``
        entry its gradient in its shape and dtype, or None (not a float array).
    """
    kw = check_keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p)
    arrays = (q, k, v, out, lse, grad_out)
    if uses_flex(score_mod, mask_mod, block_mask, score_mod_grad, mod_args, score_mod_args_grad):
        mods = check_mods(
            score_mod,
            mask_mod,
            block_mask,
            mod_args,
            score_mod_grad,
            kw,
            mask,
            score_mod_args_grad=score_mod_args_grad,
        )
        if score_mod_args_grad is None:
            device = flex_device(device, *arrays)
        else:  # the mod_args gradients have no GPU kernel
            check_on_cpu(device, *arrays, what="score_mod_args_grad")
            device = "cpu"
        return flex_backward(q, k, v, out, lse, grad_out, kw, scale, mods, device)
    device = device_for(device, *arrays)
    if device == "cuda" and any(is_device_array(a) for a in arrays):
        _cuda_refuses(kw, mask)
        return _backward_cuda(q, k, v, out, lse, grad_out, kw.causal, scale)
    return _backward(q, k, v, out, lse, grad_out, kw, scale, mask, random_state, device=device)
