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
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from . import _flash_gpu, config
from .kernels import flash as _kernels

__all__ = [
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_bias",
    "flash_attention_bias_backward",
]

_MAX_NDIM = 32
#: Memory allowed for the per-group dQ buffers of the backward pass.
_MAX_DQ_BUFFER_BYTES = 256 * 2**20
_controller = None


def _blas_one_thread():
    """A context manager holding every BLAS library to one thread."""
    global _controller
    if _controller is None:
        # numba's np.dot calls the BLAS behind scipy.linalg.cython_blas; load it
        # first, or the controller would not see it and could not limit it.
        import scipy.linalg.cython_blas  # noqa: F401
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


#: Below this many multiply-adds (queries x keys x features, all heads) a call
#: runs on one thread: waking the other numba threads costs more (measured
#: 68 us on one thread against 5.7 ms on two for a 2 x 16 x 8 input on a busy
#: machine).
_SERIAL_WORK = 1 << 22


@contextlib.contextmanager
def _threads_for(work):
    """One numba thread for small work, the configured number otherwise."""
    if work >= _SERIAL_WORK:
        yield
        return
    import numba

    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(saved)


def _as_array(x, name, allow_neg_inf=False):
    """A float array copy of ``x``; NaN, +inf (and -inf unless allowed) raise."""
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.dtype.kind != "f" or arr.dtype.itemsize < 4:
        arr = arr.astype(np.float64)
    elif arr.dtype.itemsize > 8:
        arr = arr.astype(np.float64)
    bad = np.isnan(arr) | (arr == np.inf)
    if not allow_neg_inf:
        bad |= arr == -np.inf
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        raise ValueError(f"{name} contains {what} (first at index {where})")
    return arr


def _check_qkv(q, k, v):
    q = _as_array(q, "q")
    k = _as_array(k, "k")
    v = _as_array(v, "v")
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if not 2 <= arr.ndim <= _MAX_NDIM:
            raise ValueError(f"{name} must have 2 or more dimensions (..., n, d), got {arr.shape}")
        if arr.size == 0:
            raise ValueError(f"{name} is empty (shape {arr.shape})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has E={q.shape[-1]} features but k has {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has S={k.shape[-2]} keys but v has {v.shape[-2]}")
    try:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError as exc:
        raise ValueError(
            f"the leading dimensions of q {q.shape}, k {k.shape} and v {v.shape} do not broadcast"
        ) from exc
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    return q, k, v, lead, dtype


def _check_scale(scale, n_features):
    if scale is None:
        return 1.0 / math.sqrt(n_features)
    try:
        value = float(scale)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"scale must be a float or None, got {scale!r}") from exc
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return value


def _flat(arr, lead, dtype):
    """Broadcast to lead + arr.shape[-2:] and lay out as C-contiguous (BH, n, d)."""
    full = np.broadcast_to(arr, lead + arr.shape[-2:])
    return np.array(full.reshape((-1,) + arr.shape[-2:]), dtype=dtype, order="C")


def _extras(key_bias, alibi_slopes, lead, n_keys, dtype):
    """Kernel arrays and flags for the optional key bias and ALiBi slopes."""
    n_bh = math.prod(lead)
    if key_bias is None:
        bias = np.zeros((1, 1), dtype=dtype)
    else:
        bias = _as_array(key_bias, "key_bias", allow_neg_inf=True)
        if bias.ndim == 0 or bias.shape[-1] != n_keys:
            raise ValueError(f"key_bias must have shape (..., S) with S={n_keys}, got {bias.shape}")
        try:
            bias = np.broadcast_to(bias, lead + (n_keys,))
        except ValueError as exc:
            raise ValueError(
                f"key_bias of shape {bias.shape} does not broadcast to {lead + (n_keys,)}"
            ) from exc
        bias = np.array(bias.reshape(n_bh, n_keys), dtype=dtype, order="C")
    if alibi_slopes is None:
        slopes = np.zeros(1, dtype=dtype)
    else:
        slopes = _as_array(alibi_slopes, "alibi_slopes")
        try:
            slopes = np.broadcast_to(slopes, lead)
        except ValueError as exc:
            raise ValueError(
                f"alibi_slopes of shape {slopes.shape} does not broadcast to the leading "
                f"dimensions {lead}"
            ) from exc
        slopes = np.array(slopes.reshape(n_bh), dtype=dtype, order="C")
    # the kernels work in base 2: scores times log2(e)
    bias *= dtype.type(_kernels.LOG2E)
    slopes *= dtype.type(_kernels.LOG2E)
    return bias, slopes, key_bias is not None, alibi_slopes is not None


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
        with no admissible key gives zeros and lse = -inf.
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
    q, k, v, lead, dtype = _check_qkv(q, k, v)
    scale = _check_scale(scale, q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    bias, slopes, use_bias, use_alibi = _extras(key_bias, alibi_slopes, lead, n_k, dtype)
    qf = _flat(q, lead, dtype)
    qf *= dtype.type(scale * _kernels.LOG2E)  # the kernels work in base 2
    kf = _flat(k, lead, dtype)
    vf = _flat(v, lead, dtype)
    work = qf.shape[0] * n_q * n_k * (q.shape[-1] + v.shape[-1])
    with _blas_one_thread(), _threads_for(work):
        out, lse = _kernels.flash_forward(
            qf,
            kf,
            vf,
            bias,
            slopes,
            bool(causal),
            use_bias,
            use_alibi,
            config.FLASH_BLOCK_Q,
            config.FLASH_BLOCK_K,
        )
    out = out.reshape(lead + (n_q, v.shape[-1]))
    if return_lse:
        return out, lse.reshape(lead + (n_q,))
    return out


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
    if _flash_gpu.runs_on_gpu(device, q, k, v):
        return _flash_gpu.flash_attention(q, k, v, bool(causal), scale, return_lse)
    return flash_attention_bias(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


def _unbroadcast(grad, shape):
    """Sum ``grad`` over the dimensions that broadcasting added to ``shape``."""
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape[:-2]) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad


def _n_groups(n_bh, n_key_tiles, dq_bytes):
    """Key-tile groups per (batch*head) so that every thread has work.

    Each group beyond the first costs a dQ buffer of ``dq_bytes``; the extra
    buffers are capped at ``_MAX_DQ_BUFFER_BYTES`` in all.
    """
    import numba

    threads = numba.get_num_threads()
    if threads <= 1 or n_bh % threads == 0 or n_bh >= 4 * threads:
        return 1
    groups = min(n_key_tiles, -(-2 * threads // n_bh))
    return max(1, min(groups, 1 + _MAX_DQ_BUFFER_BYTES // max(dq_bytes, 1)))


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
    q, k, v, lead, dtype = _check_qkv(q, k, v)
    scale = _check_scale(scale, q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    out_shape = lead + (n_q, v.shape[-1])
    out = _as_array(out, "out")
    grad_out = _as_array(grad_out, "grad_out")
    lse = _as_array(lse, "lse", allow_neg_inf=True)
    if out.shape != out_shape:
        raise ValueError(f"out must have shape {out_shape}, got {out.shape}")
    if grad_out.shape != out_shape:
        raise ValueError(f"grad_out must have shape {out_shape}, got {grad_out.shape}")
    if lse.shape != lead + (n_q,):
        raise ValueError(f"lse must have shape {lead + (n_q,)}, got {lse.shape}")
    dtype = np.result_type(dtype, out.dtype, grad_out.dtype)
    bias, slopes, use_bias, use_alibi = _extras(key_bias, alibi_slopes, lead, n_k, dtype)
    qf = _flat(q, lead, dtype)
    qf *= dtype.type(scale * _kernels.LOG2E)  # the kernels work in base 2
    kf = _flat(k, lead, dtype)
    vf = _flat(v, lead, dtype)
    of = _flat(out, lead, dtype)
    gf = _flat(grad_out, lead, dtype)
    lf = np.ascontiguousarray(lse.reshape(-1, n_q), dtype=np.float64)
    block_k = config.FLASH_BWD_BLOCK_K
    work = qf.shape[0] * n_q * n_k * (q.shape[-1] + v.shape[-1])
    with _blas_one_thread(), _threads_for(work):
        groups = _n_groups(qf.shape[0], -(-n_k // block_k), qf.nbytes)
        dq, dk, dv = _kernels.flash_backward(
            qf,
            kf,
            vf,
            of,
            lf,
            gf,
            bias,
            slopes,
            scale,
            bool(causal),
            use_bias,
            use_alibi,
            groups,
            config.FLASH_BWD_BLOCK_Q,
            block_k,
        )
    dq = _unbroadcast(dq.reshape(lead + dq.shape[1:]), q.shape)
    dk = _unbroadcast(dk.reshape(lead + dk.shape[1:]), k.shape)
    dv = _unbroadcast(dv.reshape(lead + dv.shape[1:]), v.shape)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


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
    if _flash_gpu.runs_on_gpu(device, q, k, v, out, lse, grad_out):
        return _flash_gpu.flash_attention_backward(q, k, v, out, lse, grad_out, bool(causal), scale)
    return flash_attention_bias_backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale)
