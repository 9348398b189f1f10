"""Device-side checks and layout for inputs that already live on the GPU.

The functional layer validates host arrays with NumPy; for arrays that expose
``__cuda_array_interface__`` (numba device arrays, CuPy, torch CUDA tensors)
these kernels do the same work on the device, so the data never makes a round
trip through the host:

* ``count_nonfinite``: how many entries are NaN or +-inf;
* ``column_moments``: per-column mean and sample standard deviation (for the
  bandwidth rules), from shifted sums so that large offsets do not cancel;
* ``scaled_transpose`` / ``scaled_copy``: the kernels' layout, x * scale per
  feature, transposed (keys) or not (queries), in the compute dtype.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .._core.numeric import power_of_two_scale
from .common import jit, launch


def _make_count_kernel(counts):
    """A grid-stride kernel ``(x, counter)`` that adds 1 to ``counter[0]`` for every
    entry of the 2-D ``x`` for which the device function ``counts(value)`` holds."""

    @jit
    def count_kernel(x, counter):
        n_rows, n_cols = x.shape
        for flat in range(cuda.grid(1), n_rows * n_cols, cuda.gridsize(1)):
            if counts(x[flat // n_cols, flat % n_cols]):
                cuda.atomic.add(counter, 0, 1)

    return count_kernel


@jit(device=True, inline=True)
def _nonfinite(value):
    return not math.isfinite(value)


@jit(device=True, inline=True)
def _nan_or_posinf(value):
    return math.isnan(value) or value == math.inf


_count_nonfinite_kernel = _make_count_kernel(_nonfinite)
_count_nan_or_posinf_kernel = _make_count_kernel(_nan_or_posinf)


@jit
def _column_spread_kernel(x, shift, spread):
    n_rows, n_cols = x.shape
    for flat in range(cuda.grid(1), n_rows * n_cols, cuda.gridsize(1)):
        f = flat % n_cols
        cuda.atomic.max(spread, f, abs(x[flat // n_cols, f] - shift[f]))


@jit
def _column_sums_kernel(x, shift, inv_scale, sums, sums_sq):
    n_rows, n_cols = x.shape
    for flat in range(cuda.grid(1), n_rows * n_cols, cuda.gridsize(1)):
        f = flat % n_cols
        centred = (x[flat // n_cols, f] - shift[f]) * inv_scale[f]
        cuda.atomic.add(sums, f, centred)
        cuda.atomic.add(sums_sq, f, centred * centred)


def _make_scaled_layout_kernel(transpose):
    """A grid-stride kernel ``(src, scale, dst)``: dst = src * scale per feature (column)
    of the 2-D ``src``, transposed (``transpose``, a compile-time constant) or not."""

    @jit
    def scaled_layout_kernel(src, scale, dst):
        n_rows, n_cols = src.shape
        for flat in range(cuda.grid(1), n_rows * n_cols, cuda.gridsize(1)):
            i = flat // n_cols
            f = flat % n_cols
            if transpose:
                dst[f, i] = src[i, f] * scale[f]
            else:
                dst[i, f] = src[i, f] * scale[f]

    return scaled_layout_kernel


_scaled_transpose_kernel = _make_scaled_layout_kernel(True)
_scaled_copy_kernel = _make_scaled_layout_kernel(False)


#: Grid-stride kernels: at most this many blocks, each thread loops over the rest.
_MAX_BLOCKS = 1024


def _run(kernel, n_items, *args):
    launch(kernel, n_items, args, max_blocks=_MAX_BLOCKS)


def count_nonfinite(device_x, allow_neg_inf=False) -> int:
    """Number of NaN or infinite entries of a 2-D device array (-inf allowed if asked)."""
    counter = cuda.to_device(np.zeros(1, dtype=np.int64))
    kernel = _count_nan_or_posinf_kernel if allow_neg_inf else _count_nonfinite_kernel
    _run(kernel, device_x.size, device_x, counter)
    return int(counter.copy_to_host()[0])


def column_moments(device_x):
    """Per-column mean and sample standard deviation (ddof=1) of a 2-D device array.

    Each column is shifted by its first row and divided by a power of two near
    its largest deviation from it (exact) before the squares, so data near
    1e160 or 1e-170 neither overflows nor underflows (as
    :func:`nbattn.smoothing.regression.feature_spread` on the host). Only the d-vectors
    of results come back to the host.
    """
    n, d = device_x.shape
    shift = device_x[0:1, :].copy_to_host().reshape(d).astype(np.float64)
    device_shift = cuda.to_device(shift)
    spread = cuda.to_device(np.zeros(d))
    _run(_column_spread_kernel, device_x.size, device_x, device_shift, spread)
    scale = power_of_two_scale(spread.copy_to_host())
    sums = cuda.to_device(np.zeros(d))
    sums_sq = cuda.to_device(np.zeros(d))
    _run(
        _column_sums_kernel,
        device_x.size,
        device_x,
        device_shift,
        cuda.to_device(1.0 / scale),
        sums,
        sums_sq,
    )
    s, s2 = sums.copy_to_host(), sums_sq.copy_to_host()
    mean = shift + s / n * scale
    var = (s2 - s * s / n) / (n - 1) if n > 1 else np.zeros(d)
    return mean, np.sqrt(np.maximum(var, 0.0)) * scale


def scaled_transpose(device_x, scale, dtype):
    """(n, d) device array -> (d, n) device array of ``x * scale`` in ``dtype``."""
    n, d = device_x.shape
    out = cuda.device_array((d, n), dtype=dtype)
    device_scale = cuda.to_device(np.asarray(scale, dtype))
    _run(_scaled_transpose_kernel, device_x.size, device_x, device_scale, out)
    return out


def scaled_copy(device_x, scale, dtype):
    """(n, d) device array -> C-contiguous (n, d) device array of ``x * scale`` in ``dtype``."""
    out = cuda.device_array(device_x.shape, dtype=dtype)
    device_scale = cuda.to_device(np.asarray(scale, dtype))
    _run(_scaled_copy_kernel, device_x.size, device_x, device_scale, out)
    return out
