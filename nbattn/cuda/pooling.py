"""Streaming Nadaraya-Watson on the GPU: the twin of ``nbattn.kernels.pooling``.

Same contract as the CPU kernel: ``queries`` (n_queries, d) and ``keys_t``
(d, n_keys) pre-scaled by 1/(h sqrt 2), ``values_t`` (n_outputs, n_keys), one
float dtype; returns ``out`` (n_queries, n_outputs) and ``lse`` (n_queries,)
float64, with

    s_ij = -|| q_i - k_j ||^2,   out_i = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

One thread per query keeps its query row and the online-softmax state
(running max, sum and weighted sums, float64) in registers -- a kernel is
compiled per (dtype, d, outputs per launch), so that these arrays have
compile-time sizes; the block walks the keys in tiles of ``block_k`` keys
(at most ``config.CUDA_THREADS_PER_BLOCK``, and at most
``config.CUDA_SHARED_MEMORY_BYTES`` of tile) that its threads load together
into shared memory. Up to ``MAX_OUTPUTS`` outputs per launch; more outputs
are handled in several launches by the host wrapper.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, from_dtype

from .. import config
from ._util import exp_for, imin

#: Outputs accumulated per thread and launch (more run in further launches).
MAX_OUTPUTS = 8

_kernel_cache = {}


def _make_pool_kernel(float_type, d, n_outputs):
    """The kernel for one dtype, d features and n_outputs outputs (compile-time sizes,
    so that the query row and the accumulators live in registers): scores, exp
    and the sums over one tile of keys in ``float_type``, running sum and weighted
    sums across tiles in float64 (as the CPU kernel: block sums in the input
    dtype, added into float64)."""
    zero = float_type(0.0)
    minus_inf = float_type(-np.inf)
    tile_type = from_dtype(np.dtype(float_type))
    exp = exp_for(float_type)

    @cuda.jit
    def gaussian_pool_kernel(
        queries, keys_t, values_t, exclude_self, self_offset, block_k, out, lse
    ):
        tile = cuda.shared.array(0, dtype=tile_type)  # (d + n_outputs) x block_k
        i = cuda.grid(1)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        n_queries = queries.shape[0]
        n_keys = keys_t.shape[1]
        active = i < n_queries
        q_row = cuda.local.array(d, dtype=float_type)
        acc = cuda.local.array(n_outputs, dtype=np.float64)
        part = cuda.local.array(n_outputs, dtype=float_type)
        for f in range(d):
            q_row[f] = queries[i, f] if active else zero
        for c in range(n_outputs):
            acc[c] = 0.0
        running_max = minus_inf
        running_sum = 0.0
        for j0 in range(0, n_keys, block_k):
            nb = imin(block_k, n_keys - j0)
            for jj in range(tx, nb, tpb):
                for f in range(d):
                    tile[f * block_k + jj] = keys_t[f, j0 + jj]
                for c in range(n_outputs):
                    tile[(d + c) * block_k + jj] = values_t[c, j0 + jj]
            cuda.syncthreads()
            if active:
                part_sum = zero
                for c in range(n_outputs):
                    part[c] = zero
                for jj in range(nb):
                    if exclude_self and j0 + jj == i + self_offset:
                        continue
                    s = zero
                    for f in range(d):
                        diff = tile[f * block_k + jj] - q_row[f]
                        s -= diff * diff
                    if s > running_max:
                        rescale = math.exp(float(running_max) - float(s))
                        running_sum *= rescale
                        part_sum *= float_type(rescale)
                        for c in range(n_outputs):
                            acc[c] *= rescale
                            part[c] *= float_type(rescale)
                        running_max = s
                    w = exp(s - running_max)
                    part_sum += w
                    for c in range(n_outputs):
                        part[c] += w * tile[(d + c) * block_k + jj]
                running_sum += part_sum
                for c in range(n_outputs):
                    acc[c] += part[c]
            cuda.syncthreads()
        if active:
            if running_sum > 0.0:
                for c in range(n_outputs):
                    out[i, c] = acc[c] / running_sum
                lse[i] = running_max + math.log(running_sum)
            else:
                for c in range(n_outputs):
                    out[i, c] = 0.0
                lse[i] = -math.inf

    return gaussian_pool_kernel


def gaussian_pool_kernel(dtype, d, n_outputs):
    """The compiled kernel for a dtype, d features and n_outputs <= MAX_OUTPUTS outputs."""
    key = (np.dtype(dtype), int(d), int(n_outputs))
    if key not in _kernel_cache:
        _kernel_cache[key] = _make_pool_kernel(np.dtype(dtype).type, int(d), int(n_outputs))
    return _kernel_cache[key]


def to_device(array):
    """A device view of ``array``: host arrays are copied, GPU arrays
    (``__cuda_array_interface__``: numba, CuPy, torch) are used in place."""
    if isinstance(array, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(array))
    if hasattr(array, "__cuda_array_interface__"):
        return cuda.as_cuda_array(array)
    return array  # already a numba device array (or the simulator's)


def gaussian_pool(queries, keys_t, values_t, exclude_self, self_offset=0):
    """Host wrapper: NumPy or device arrays in; ``(out, lse)`` as device arrays.

    ``out`` has the dtype of ``queries``; running sums are float64. With
    ``exclude_self``, query i skips key ``i + self_offset`` (as the CPU kernel).
    """
    device_queries = to_device(queries)
    device_keys_t = to_device(keys_t)
    device_values_t = to_device(values_t)
    n_queries = device_queries.shape[0]
    d, n_keys = device_keys_t.shape
    n_outputs = device_values_t.shape[0]
    device_out = cuda.device_array((n_queries, n_outputs), dtype=device_queries.dtype)
    device_lse = cuda.device_array(n_queries, dtype=np.float64)
    tpb = config.CUDA_THREADS_PER_BLOCK
    blocks = max(1, (n_queries + tpb - 1) // tpb)
    itemsize = np.dtype(device_queries.dtype).itemsize
    for c0 in range(0, n_outputs, MAX_OUTPUTS):
        c1 = min(n_outputs, c0 + MAX_OUTPUTS)
        per_key = d + c1 - c0
        block_k = max(1, min(tpb, config.CUDA_SHARED_MEMORY_BYTES // (per_key * itemsize)))
        kernel = gaussian_pool_kernel(device_queries.dtype, d, c1 - c0)
        kernel[blocks, tpb, 0, per_key * block_k * itemsize](
            device_queries,
            device_keys_t,
            device_values_t[c0:c1],
            bool(exclude_self),
            int(self_offset),
            block_k,
            device_out[:, c0:c1],
            device_lse,
        )
    return device_out, device_lse
