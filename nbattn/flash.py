"""Blocked (FlashAttention-style) scaled dot-product attention, forward and backward.

    out = softmax(scale * q k^T [+ bias]) v,     lse = logsumexp(scale * q k^T [+ bias])

computed tile by tile with an online softmax by ``nbattn.kernels.flash``:
memory is linear in the sequence lengths, never queries x keys. This layer
validates, broadcasts the leading (batch, head) dimensions, picks the dtype,
lays the arrays out for the kernels and holds BLAS to one thread while they
run (they call BLAS on tiles from their own parallel loop).

Shapes follow ``torch.nn.functional.scaled_dot_product_attention``: q
(..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); the leading
dimensions broadcast. ``causal=True`` lets query i see keys j <= i, aligned
at the top left as torch's ``is_causal`` (so with L > S the last L - S rows
see every key, and with L < S the last S - L keys are seen by no query).

The device is chosen once, by ``nbattn.device.device_for`` and
``kernels_for("flash", device)``: NumPy (or any array-like) inputs are
validated and laid out here for either device; GPU arrays
(``__cuda_array_interface__``: numba device arrays, CuPy, torch CUDA tensors)
are checked on the device by ``nbattn._validation.as_device_array`` and used
where they are (C-contiguous, one float dtype, equal leading dimensions: no
broadcasting on the device), and the results come back as the kind of GPU
array ``q`` is.

Magnitudes: the kernels work in base 2 (scores times log2(e)). A per-key
bias is shifted by its largest entry per (batch, head) -- the softmax does not
change, lse gets the shift back -- so biases up to the float64 range are
exact; scores ``scale * q . k`` or ALiBi terms that the base-2 form cannot
hold are refused with a ValueError naming the argument.
"""

from __future__ import annotations

import math

import numpy as np

from . import config
from ._layout import flat_batch, unbroadcast
from ._threads import blas_one_thread, serial_below
from ._validation import (
    as_device_array,
    as_float_array,
    broadcast_leading,
    check_bool,
    check_dot_range,
    check_scale,
    resolve_dtype,
)
from .device import device_for, is_device_array, kernels_for, like_input
from .kernels.flash import LOG2E

__all__ = [
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_bias",
    "flash_attention_bias_backward",
]


def _cpu_forward(qf, kf, vf, bias, slopes, causal, use_bias, use_alibi):
    """The CPU flash forward on laid-out arrays, with the configured tiles (read per call)."""
    return kernels_for("flash", "cpu").flash_forward(
        qf,
        kf,
        vf,
        bias,
        slopes,
        causal,
        use_bias,
        use_alibi,
        config.FLASH_BLOCK_Q,
        config.FLASH_BLOCK_K,
    )


def _threads_for(work):
    """One numba thread below ``config.FLASH_SERIAL_WORK`` multiply-adds (read per call)."""
    return serial_below(work, config.FLASH_SERIAL_WORK)


# --------------------------------------------------------------------------- host inputs
def _check_qkv(q, k, v, *others):
    """Checked host q, k, v, their broadcast leading dimensions and the computation dtype.

    ``others`` (out, grad_out of the backward) take part in the dtype rule.
    """
    dtype = resolve_dtype(None, q, k, v, *others)
    q = as_float_array(q, "q", min_ndim=2, dtype=dtype, allow_bool=False)
    k = as_float_array(k, "k", min_ndim=2, dtype=dtype, allow_bool=False)
    v = as_float_array(v, "v", min_ndim=2, dtype=dtype, allow_bool=False)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has E={q.shape[-1]} features but k has {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has S={k.shape[-2]} keys but v has {v.shape[-2]}")
    lead = broadcast_leading({"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]})
    return q, k, v, lead, dtype


def _key_bias(key_bias, lead, n_q, n_k, dtype, causal):
    """The kernels' base-2 key bias (BH, S) in ``dtype`` and the shift per (batch*head).

    ``bias - max_j bias_j`` changes no softmax (the same constant for every
    key of a row); lse gets the shift back. Entries more than half the
    dtype's range below that maximum have weight 0 next to it and become
    -inf. Under ``causal`` a row sees only keys j <= i, so the largest bias
    among those must itself be representable after the shift.
    """
    n_bh = math.prod(lead)
    bias = as_float_array(key_bias, "key_bias", dtype="float64", allow_neg_inf=True)
    if bias.ndim == 0 or bias.shape[-1] != n_k:
        raise ValueError(f"key_bias must have shape (..., S) with S={n_k}, got {bias.shape}")
    try:
        bias = np.broadcast_to(bias, lead + (n_k,)).reshape(n_bh, n_k)
    except ValueError as exc:
        raise ValueError(
            f"key_bias of shape {bias.shape} does not broadcast to {lead + (n_k,)}"
        ) from exc
    finite = np.isfinite(bias)
    top = np.where(finite, bias, -np.inf).max(axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    floor = -float(np.finfo(dtype).max) / 2
    with np.errstate(over="ignore"):
        base2 = (bias - top[:, None]) * LOG2E
    lost = finite & (base2 < floor)
    if causal and lost.any():
        # finite biases that overflowed to -inf in the shift still count as seen keys
        admissible = np.where(finite, np.maximum(base2, -np.finfo(np.float64).max), -np.inf)
        seen = np.maximum.accumulate(admissible, axis=1)[:, : min(n_q, n_k)]
        if ((seen < floor / 2) & (seen > -np.inf)).any():
            raise ValueError(
                "key_bias: with causal=True some query sees only keys whose bias lies more than "
                f"the {np.dtype(dtype).name} range below the largest bias; rescale key_bias"
            )
    base2 = np.where(lost, -np.inf, base2)
    return np.ascontiguousarray(base2, dtype=dtype), top


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


def _extras(key_bias, alibi_slopes, lead, n_q, n_k, dtype, causal):
    """Kernel arrays, flags and the per-(batch*head) lse shift of the optional bias terms."""
    n_bh = math.prod(lead)
    bias, shift = np.zeros((1, 1), dtype=dtype), np.zeros(n_bh)
    if key_bias is not None:
        bias, shift = _key_bias(key_bias, lead, n_q, n_k, dtype, causal)
    slopes = np.zeros(1, dtype=dtype)
    if alibi_slopes is not None:
        slopes = _slopes(alibi_slopes, lead, n_q, n_k, dtype)
    return bias, slopes, key_bias is not None, alibi_slopes is not None, shift


def _base2_queries(q, lead, dtype, scale):
    """q times scale * log2(e), flattened to (BH, L, E): the kernels work in base 2."""
    qf = flat_batch(q, lead, dtype)
    qf *= dtype(scale * LOG2E)
    return qf


# --------------------------------------------------------------------------- CPU
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

    The internal entry behind :func:`flash_attention` (which is this with no
    bias), for callers that route biased soft attention here (positional
    biases, key padding masks, the Gaussian kernel written as a dot product):

        s_ij   = scale * q_i . k_j + key_bias_j + slope * (j - i)
        out_i  = sum_j softmax_j(s_ij) v_j,     lse_i = log sum_j exp(s_ij)

    with j restricted to j <= i when ``causal``. The Gaussian kernel of
    Nadaraya-Watson rides the same kernel: with bandwidth h,
    -||q - k||^2 / (2 h^2) = q.k / h^2 - ||k||^2 / (2 h^2) + (a per-query
    constant that the softmax cancels), so ``scale = 1 / h**2`` and
    ``key_bias = -||k||^2 / (2 h**2)`` give the same weights (lse then lacks
    the -||q||^2 / (2 h^2) term).

    Parameters
    ----------
    q, k, v : array_like, (..., L, E), (..., S, E), (..., S, Ev)
        Leading dimensions broadcast. float32 stays float32 (if all three
        are float32); anything else is computed in float64.
    key_bias : array_like (..., S), optional
        Added to every query's scores for key j; broadcasts against the
        leading dimensions. ``-inf`` excludes a key (a padding mask); a row
        with no admissible key gives zeros and lse = -inf. Any finite
        magnitude up to the float64 range is exact (see the module notes).
    alibi_slopes : array_like, optional
        One slope per (batch, head), broadcasting to the leading dimensions
        (for example shape (H,) with q of shape (B, H, L, E)). Adds
        ``slope * (j - i)`` (negative for past keys when the slope is
        positive; torch/ALiBi write ``-m (i - j)``), without a score matrix.
    causal : bool
        Keys j <= i only (top-left alignment, as torch's ``is_causal``).
    scale : float, optional
        Multiplies q . k; default 1 / sqrt(E).
    return_lse : bool
        Also return lse (..., L), float64 (the row's log-normaliser, what
        :func:`flash_attention_backward` needs).

    Returns
    -------
    out : ndarray (..., L, Ev), or ``(out, lse)`` if ``return_lse``.
    """
    causal = check_bool(causal, "causal")
    return_lse = check_bool(return_lse, "return_lse")
    q, k, v, lead, dtype = _check_qkv(q, k, v)
    scale = check_scale(scale, q.shape[-1])
    check_dot_range(q, k, scale * LOG2E, dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    bias, slopes, use_bias, use_alibi, shift = _extras(
        key_bias, alibi_slopes, lead, n_q, n_k, dtype, causal
    )
    qf = _base2_queries(q, lead, dtype, scale)
    kf = flat_batch(k, lead, dtype)
    vf = flat_batch(v, lead, dtype)
    work = qf.shape[0] * n_q * n_k * (q.shape[-1] + v.shape[-1])
    with blas_one_thread(), _threads_for(work):
        out, lse = _cpu_forward(qf, kf, vf, bias, slopes, causal, use_bias, use_alibi)
    out = out.reshape(lead + (n_q, v.shape[-1]))
    if return_lse:
        lse += shift[:, None]
        return out, lse.reshape(lead + (n_q,))
    return out


#: A key-bias shift (see :func:`_key_bias`) from which ``lse - shift`` loses more
#: than 10 bits of lse; the backward then recomputes the shifted lse (one more
#: forward pass) instead of subtracting.
_RECOMPUTE_SHIFT = 2.0**10


def _n_groups(n_bh, n_key_tiles, dq_bytes):
    """Key-tile groups per (batch*head) so that every thread has work.

    Each group beyond the first costs a dQ buffer of ``dq_bytes``; the extra
    buffers are capped at ``config.FLASH_MAX_DQ_BUFFER_BYTES`` in all (read
    per call).
    """
    import numba

    threads = numba.get_num_threads()
    if threads <= 1 or n_bh % threads == 0 or n_bh >= 4 * threads:
        return 1
    groups = min(n_key_tiles, -(-2 * threads // n_bh))
    return max(1, min(groups, 1 + config.FLASH_MAX_DQ_BUFFER_BYTES // max(dq_bytes, 1)))


def _check_forward_results(out, lse, grad_out, lead, n_q, d_v, dtype):
    """The forward's out, lse and the incoming grad_out, checked against the shapes."""
    out_shape = lead + (n_q, d_v)
    out = as_float_array(out, "out", min_ndim=2, dtype=dtype, allow_bool=False)
    grad_out = as_float_array(grad_out, "grad_out", min_ndim=2, dtype=dtype, allow_bool=False)
    lse = as_float_array(lse, "lse", min_ndim=1, dtype="float64", allow_neg_inf=True)
    if out.shape != out_shape:
        raise ValueError(f"out must have shape {out_shape}, got {out.shape}")
    if grad_out.shape != out_shape:
        raise ValueError(f"grad_out must have shape {out_shape}, got {grad_out.shape}")
    if lse.shape != lead + (n_q,):
        raise ValueError(f"lse must have shape {lead + (n_q,)}, got {lse.shape}")
    return out, lse, grad_out


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
    them). See :func:`flash_attention_backward` for the formulas. When the
    key bias reaches magnitudes of 2**10 and more, the row normalisers are
    recomputed from the shifted bias rather than taken from ``lse`` (whose
    low bits are lost next to such a bias), at the cost of a forward pass.
    """
    causal = check_bool(causal, "causal")
    q, k, v, lead, dtype = _check_qkv(q, k, v, out, grad_out)
    scale = check_scale(scale, q.shape[-1])
    check_dot_range(q, k, scale * LOG2E, dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    out, lse, grad_out = _check_forward_results(out, lse, grad_out, lead, n_q, v.shape[-1], dtype)
    bias, slopes, use_bias, use_alibi, shift = _extras(
        key_bias, alibi_slopes, lead, n_q, n_k, dtype, causal
    )
    qf = _base2_queries(q, lead, dtype, scale)
    kf = flat_batch(k, lead, dtype)
    vf = flat_batch(v, lead, dtype)
    of = flat_batch(out, lead, dtype)
    gf = flat_batch(grad_out, lead, dtype)
    lf = np.ascontiguousarray(lse.reshape(-1, n_q) - shift[:, None], dtype=np.float64)
    block_k = config.FLASH_BWD_BLOCK_K
    work = qf.shape[0] * n_q * n_k * (q.shape[-1] + v.shape[-1])
    with blas_one_thread(), _threads_for(work):
        if np.abs(shift).max() >= _RECOMPUTE_SHIFT:
            # lse - shift has lost the low bits of lse: recompute the shifted lse
            _, lf = _cpu_forward(qf, kf, vf, bias, slopes, causal, use_bias, use_alibi)
        groups = _n_groups(qf.shape[0], -(-n_k // block_k), qf.nbytes)
        dq, dk, dv = kernels_for("flash", "cpu").flash_backward(
            qf,
            kf,
            vf,
            of,
            lf,
            gf,
            bias,
            slopes,
            scale,
            causal,
            use_bias,
            use_alibi,
            groups,
            config.FLASH_BWD_BLOCK_Q,
            block_k,
        )
    return (
        unbroadcast(dq.reshape(lead + dq.shape[1:]), q.shape),
        unbroadcast(dk.reshape(lead + dk.shape[1:]), k.shape),
        unbroadcast(dv.reshape(lead + dv.shape[1:]), v.shape),
    )


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
    """:func:`flash_attention` on the GPU (see the module docstring for the array kinds)."""
    kernels = kernels_for("flash", "cuda")
    if any(is_device_array(a) for a in (q, k, v)):
        template = q
        (qf, kf, vf), (q_shape, _, _), lead = _device_qkv(kernels, q, k, v)
        scale = check_scale(scale, q_shape[-1])
        out, lse = kernels.flash_forward(qf, kf, vf, scale, causal)
        out = like_input(out.reshape(lead + tuple(out.shape)[1:]), template)
        lse = like_input(lse.reshape(lead + tuple(lse.shape)[1:]), template)
        return (out, lse) if return_lse else out
    q, k, v, lead, dtype = _check_qkv(q, k, v)
    _head_dims(kernels, q.shape[-1], v.shape[-1])
    scale = check_scale(scale, q.shape[-1])
    out, lse = kernels.flash_forward(
        flat_batch(q, lead, dtype),
        flat_batch(k, lead, dtype),
        flat_batch(v, lead, dtype),
        scale,
        causal,
    )
    out = out.copy_to_host().reshape(lead + (q.shape[-2], v.shape[-1]))
    if return_lse:
        return out, lse.copy_to_host().reshape(lead + (q.shape[-2],))
    return out


def _backward_cuda(q, k, v, out, lse, grad_out, causal, scale):
    """:func:`flash_attention_backward` on the GPU: ``(dq, dk, dv)``."""
    kernels = kernels_for("flash", "cuda")
    if any(is_device_array(a) for a in (q, k, v, out, lse, grad_out)):
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
            like_input(grad.reshape(shape), template)
            for grad, shape in zip(grads, shapes, strict=True)
        )
    q, k, v, lead, dtype = _check_qkv(q, k, v, out, grad_out)
    _head_dims(kernels, q.shape[-1], v.shape[-1])
    scale = check_scale(scale, q.shape[-1])
    n_q = q.shape[-2]
    out, lse, grad_out = _check_forward_results(out, lse, grad_out, lead, n_q, v.shape[-1], dtype)
    dq, dk, dv = kernels.flash_backward(
        flat_batch(q, lead, dtype),
        flat_batch(k, lead, dtype),
        flat_batch(v, lead, dtype),
        flat_batch(out, lead, dtype),
        np.ascontiguousarray(lse.reshape(-1, n_q)),
        flat_batch(grad_out, lead, dtype),
        scale,
        causal,
    )
    return (
        unbroadcast(dq.copy_to_host().reshape(lead + dq.shape[1:]), q.shape),
        unbroadcast(dk.copy_to_host().reshape(lead + dk.shape[1:]), k.shape),
        unbroadcast(dv.copy_to_host().reshape(lead + dv.shape[1:]), v.shape),
    )


# --------------------------------------------------------------------------- public entries
def flash_attention(q, k, v, causal=False, scale=None, return_lse=False, device="cpu"):
    """Scaled dot-product attention, blocked, with memory linear in the lengths.

        out = softmax(scale * q k^T) v,     scale = 1 / sqrt(E) by default

    the same as ``torch.nn.functional.scaled_dot_product_attention`` (without
    dropout or masks). Query tiles x key tiles, an online softmax (running
    maximum and sum, deferred normalisation) and BLAS on every tile; the
    queries x keys matrix is never formed.

    Parameters
    ----------
    q : array_like (..., L, E)
    k : array_like (..., S, E)
    v : array_like (..., S, Ev)
        Leading (batch, head) dimensions broadcast. float32 stays float32
        when all three are float32; anything else is float64.
    causal : bool
        Query i attends to keys j <= i. Aligned at the top left like torch's
        ``is_causal``: with L > S the rows i >= S see every key; with L < S
        the keys j >= L are seen by no query.
    scale : float, optional
        Default 1 / sqrt(E).
    return_lse : bool
        Also return ``lse = log sum_j exp(scale q_i . k_j)`` (..., L) as
        float64, which :func:`flash_attention_backward` takes.
    device : "cpu", "cuda" or "auto"
        "auto" runs on a CUDA GPU when numba sees one. GPU arrays
        (``__cuda_array_interface__``: numba, CuPy, torch CUDA tensors) are
        used in place and the results come back as the same kind of array;
        on the GPU E and Ev are at most ``nbattn.cuda.flash.MAX_HEAD_DIM``.

    Returns
    -------
    out : ndarray (..., L, Ev) in the computation dtype, or ``(out, lse)``.
    """
    causal = check_bool(causal, "causal")
    return_lse = check_bool(return_lse, "return_lse")
    if device_for(device, q, k, v) == "cuda":
        return _forward_cuda(q, k, v, causal, scale, return_lse)
    return flash_attention_bias(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, scale=None, device="cpu"):
    """Gradients of :func:`flash_attention`: ``(dq, dk, dv)``, blocked, O(N) memory.

    With P = softmax(S), S = scale q k^T, recomputed tile by tile from the
    saved ``lse`` (P = exp(S - lse)), and dO = ``grad_out``:

        dV = P^T dO,   dP = dO V^T,   D_i = sum_c dO_ic O_ic,
        dS = P o (dP - D),   dQ = scale dS K,   dK = scale dS^T Q

    Parameters
    ----------
    q, k, v : array_like
        The forward inputs.
    out, lse : array_like
        The forward's outputs, ``flash_attention(q, k, v, ..., return_lse=True)``.
        ``lse`` may hold -inf (rows without keys; their gradients are zero).
    grad_out : array_like, the shape of ``out``
        The gradient of the loss with respect to ``out``.
    causal, scale
        As in the forward call.
    device : "cpu", "cuda" or "auto"
        As in :func:`flash_attention` (GPU arrays in, the same kind out).

    Returns
    -------
    dq, dk, dv : ndarrays of the shapes of q, k, v (gradients summed over
        broadcast leading dimensions) in the computation dtype.
    """
    causal = check_bool(causal, "causal")
    if device_for(device, q, k, v, out, lse, grad_out) == "cuda":
        return _backward_cuda(q, k, v, out, lse, grad_out, causal, scale)
    return flash_attention_bias_backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale)
