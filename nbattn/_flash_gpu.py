"""The GPU branch of ``nbattn.flash``: validation, layout and dispatch to ``nbattn.cuda.flash``.

Kept beside ``flash.py`` so that the CPU module only gains a ``device``
keyword and one dispatch line. Two kinds of input:

* NumPy (or anything array-like): validated and laid out exactly as for the
  CPU (``flash._check_qkv``, broadcasting of the leading dimensions), copied
  to the GPU, and the results copied back: NumPy in, NumPy out.
* GPU arrays (``__cuda_array_interface__``: numba device arrays, CuPy, torch
  CUDA tensors): used where they are, without a round trip through the host.
  They must be C-contiguous, share one float dtype and the same leading
  (batch, head) dimensions (no broadcasting on the device); NaN/inf are
  found by a device kernel. Results come back as the kind of GPU array ``q``
  is.
"""

from __future__ import annotations

import math

import numpy as np

from .device import as_numba_device_array, is_device_array, like_input, resolve_device


def runs_on_gpu(device, *arrays) -> bool:
    """Whether a flash call with these arrays runs on the GPU.

    GPU arrays need ``device="cuda"`` or ``"auto"``; "auto" with host arrays
    picks the GPU when numba sees one; "cuda" without a GPU raises (see
    :func:`nbattn.device.resolve_device`).
    """
    on_device = any(is_device_array(a) for a in arrays)
    if on_device:
        if device == "cpu" or resolve_device("cuda" if device == "auto" else device) != "cuda":
            raise ValueError(f"GPU arrays need device='cuda' or 'auto', got device={device!r}")
        return True
    return resolve_device(device) == "cuda"


def _check_head_dims(d, d_v):
    from .cuda.flash import MAX_HEAD_DIM

    if d > MAX_HEAD_DIM or d_v > MAX_HEAD_DIM:
        raise ValueError(
            f"device='cuda' supports head dimensions up to {MAX_HEAD_DIM} "
            f"(nbattn.cuda.flash.MAX_HEAD_DIM), got E={d}, Ev={d_v}; use device='cpu'"
        )


def _device_tensor(x, name, allow_neg_inf=False, min_ndim=2):
    """A numba view of a GPU array, checked: float, C-contiguous, non-empty, finite."""
    from .cuda import layout

    arr = as_numba_device_array(x)
    if not min_ndim <= arr.ndim:
        raise ValueError(f"{name} must have {min_ndim} or more dimensions, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if np.dtype(arr.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{name} must be float32 or float64 on the GPU, got dtype {arr.dtype}")
    if not arr.is_c_contiguous():
        raise ValueError(f"{name} must be C-contiguous on the GPU")
    if layout.count_nonfinite(arr.reshape(arr.size, 1), allow_neg_inf):
        raise ValueError(f"{name} contains {'NaN or +inf' if allow_neg_inf else 'NaN or inf'}")
    return arr


class _Shaped:
    """A device array with ``shape`` as a plain tuple (the simulator's shape
    object rejects negative indices)."""

    def __init__(self, arr):
        self.arr = arr
        self.shape = tuple(arr.shape)
        self.dtype = arr.dtype


def _device_qkv(q, k, v):
    q, k, v = (_Shaped(_device_tensor(a, n)) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"q, k and v on the GPU must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has E={q.shape[-1]} features but k has {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has S={k.shape[-2]} keys but v has {v.shape[-2]}")
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead:
        raise ValueError(
            f"GPU arrays need equal leading dimensions (no broadcasting on the device), got "
            f"q {q.shape}, k {k.shape}, v {v.shape}"
        )
    _check_head_dims(q.shape[-1], v.shape[-1])
    n_bh = math.prod(lead)
    flat = [a.arr.reshape((n_bh,) + a.shape[-2:]) for a in (q, k, v)]
    return q, k, v, lead, flat


def flash_attention(q, k, v, causal, scale, return_lse):
    """``flash.flash_attention`` on the GPU (see the module docstring for the array kinds)."""
    from . import flash as _flash
    from .cuda import flash as _cuda

    if any(is_device_array(a) for a in (q, k, v)):
        template = q
        q, k, v, lead, (qf, kf, vf) = _device_qkv(q, k, v)
        scale = _flash._check_scale(scale, q.shape[-1])
        out, lse = _cuda.flash_forward(qf, kf, vf, scale, causal)
        out = like_input(out.reshape(lead + tuple(out.shape)[1:]), template)
        lse = like_input(lse.reshape(lead + tuple(lse.shape)[1:]), template)
        return (out, lse) if return_lse else out
    q, k, v, lead, dtype = _flash._check_qkv(q, k, v)
    _check_head_dims(q.shape[-1], v.shape[-1])
    scale = _flash._check_scale(scale, q.shape[-1])
    out, lse = _cuda.flash_forward(
        _flash._flat(q, lead, dtype),
        _flash._flat(k, lead, dtype),
        _flash._flat(v, lead, dtype),
        scale,
        causal,
    )
    out = out.copy_to_host().reshape(lead + (q.shape[-2], v.shape[-1]))
    if return_lse:
        return out, lse.copy_to_host().reshape(lead + (q.shape[-2],))
    return out


def flash_attention_backward(q, k, v, out, lse, grad_out, causal, scale):
    """``flash.flash_attention_backward`` on the GPU: ``(dq, dk, dv)``."""
    from . import flash as _flash
    from .cuda import flash as _cuda

    if any(is_device_array(a) for a in (q, k, v, out, lse, grad_out)):
        template = q
        q, k, v, lead, (qf, kf, vf) = _device_qkv(q, k, v)
        scale = _flash._check_scale(scale, q.shape[-1])
        out_shape = lead + (q.shape[-2], v.shape[-1])
        o = _Shaped(_device_tensor(out, "out"))
        g = _Shaped(_device_tensor(grad_out, "grad_out"))
        lse_d = _Shaped(_device_tensor(lse, "lse", allow_neg_inf=True, min_ndim=1))
        for name, arr, shape in (
            ("out", o, out_shape),
            ("grad_out", g, out_shape),
            ("lse", lse_d, lead + (q.shape[-2],)),
        ):
            if arr.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
        if not (o.dtype == g.dtype == q.dtype):
            raise ValueError(f"out and grad_out on the GPU must have q's dtype {q.dtype}")
        if lse_d.dtype != np.float64:
            raise ValueError(f"lse on the GPU must be float64, got {lse_d.dtype}")
        n_bh = qf.shape[0]
        grads = _cuda.flash_backward(
            qf,
            kf,
            vf,
            o.arr.reshape((n_bh,) + o.shape[-2:]),
            lse_d.arr.reshape(n_bh, q.shape[-2]),
            g.arr.reshape((n_bh,) + g.shape[-2:]),
            scale,
            causal,
        )
        return tuple(
            like_input(grad.reshape(arr.shape), template)
            for grad, arr in zip(grads, (q, k, v), strict=True)
        )
    q, k, v, lead, dtype = _flash._check_qkv(q, k, v)
    _check_head_dims(q.shape[-1], v.shape[-1])
    scale = _flash._check_scale(scale, q.shape[-1])
    n_q = q.shape[-2]
    out_shape = lead + (n_q, v.shape[-1])
    out = _flash._as_array(out, "out")
    grad_out = _flash._as_array(grad_out, "grad_out")
    lse = _flash._as_array(lse, "lse", allow_neg_inf=True)
    if out.shape != out_shape:
        raise ValueError(f"out must have shape {out_shape}, got {out.shape}")
    if grad_out.shape != out_shape:
        raise ValueError(f"grad_out must have shape {out_shape}, got {grad_out.shape}")
    if lse.shape != lead + (n_q,):
        raise ValueError(f"lse must have shape {lead + (n_q,)}, got {lse.shape}")
    dtype = np.result_type(dtype, out.dtype, grad_out.dtype)
    dq, dk, dv = _cuda.flash_backward(
        _flash._flat(q, lead, dtype),
        _flash._flat(k, lead, dtype),
        _flash._flat(v, lead, dtype),
        _flash._flat(out, lead, dtype),
        np.ascontiguousarray(lse.reshape(-1, n_q), dtype=np.float64),
        _flash._flat(grad_out, lead, dtype),
        scale,
        causal,
    )
    dq = _flash._unbroadcast(dq.copy_to_host().reshape(lead + dq.shape[1:]), q.shape)
    dk = _flash._unbroadcast(dk.copy_to_host().reshape(lead + dk.shape[1:]), k.shape)
    dv = _flash._unbroadcast(dv.copy_to_host().reshape(lead + dv.shape[1:]), v.shape)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
