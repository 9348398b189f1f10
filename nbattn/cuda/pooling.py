"""Streaming Nadaraya-Watson on the GPU: the twin of ``nbattn.kernels.pooling``.

Same contract as the CPU kernel: ``queries`` (n_queries, d) and ``keys_t``
(d, n_keys) pre-scaled by 1/(h sqrt 2), ``values_t`` (n_outputs, n_keys), one
float dtype; returns ``out`` (n_queries, n_outputs) and ``lse`` (n_queries,)
float64, with

    s_ij = -|| q_i - k_j ||^2,   out_i = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

One thread per query keeps its query row and the online-softmax state
(running max, sum and weighted sums, float64) in registers; the block walks
the keys in tiles of ``block_k`` keys (``common.tile_rows``: at most
``config.CUDA_THREADS_PER_BLOCK`` keys and ``config.CUDA_SHARED_MEMORY_BYTES``
of tile) that its threads load together into shared memory. That walk is the
device function :func:`pool_row_function` ``(dtype, d, n_outputs)``, the twin
of the CPU ``pool_row``; the LOO loss kernel (``nbattn.cuda.loo``) runs the
same one. Kernels and device functions are compiled per (dtype, d, outputs
per launch), so that the query row and the accumulators have compile-time
sizes and stay in registers. Up to ``config.CUDA_MAX_OUTPUTS`` outputs per
launch (read at each call); more run in further launches.

``gaussian_weights(queries, keys_t, exclude_self)`` is the twin of the CPU
diagnostic: the full (n_queries, n_keys) matrix W_ij = softmax_j(s_ij), a row
with no admissible key all 0, as a host array. A first kernel runs
``pool_row`` (on one row of zero values) for each query's maximum m_i and
float64 sum l_i = sum_j exp(s_ij - m_i); a second, one thread per pair on a
(key blocks, queries) grid, writes W_ij = exp(s_ij - m_i) / l_i (coalesced
along the keys). Shifting by the maximum, not by lse_i = m_i + log l_i, keeps
the largest weight of a far query exact in float32, where lse_i would round.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, from_dtype

from .. import config
from .common import compiled, exp_for, imin, jit, launch, load_columns, tile_rows, to_device

__all__ = [
    "gaussian_pool",
    "gaussian_pool_kernel",
    "gaussian_weights",
    "output_launches",
    "pool_row_function",
    "tile_score_function",
    "to_device",
    "weights_kernels",
]


def _make_tile_score(float_type, d):
    zero = float_type(0.0)

    @jit(device=True, inline=True)
    def tile_score(tile, block_k, jj, q_row):
        """s = -sum_f (tile[f * block_k + jj] - q_row[f])^2: the score of the key in
        column ``jj`` of a tile (features in rows 0..d-1), in the input dtype."""
        s = zero
        for f in range(d):
            diff = tile[f * block_k + jj] - q_row[f]
            s -= diff * diff
        return s

    return tile_score


def tile_score_function(dtype, d):
    """The device function ``tile_score`` for a dtype and d features (the one score
    of the tiled Nadaraya-Watson kernels: the pool here, the spread in ``loo``)."""
    t = np.dtype(dtype).type
    return compiled(("tile_score", t, int(d)), lambda: _make_tile_score(t, int(d)))


def _make_pool_row(float_type, d, n_outputs):
    zero = float_type(0.0)
    minus_inf = float_type(-np.inf)
    exp = exp_for(float_type)
    tile_score = tile_score_function(float_type, d)

    @jit(device=True, inline=True)
    def pool_row(keys_t, values_t, own, active, q_row, tile, block_k, acc):
        """The online softmax of this thread's query over all keys; key ``own`` is skipped.

        Called by every thread of the block (the threads load each tile of
        ``block_k`` keys and values into ``tile`` together: (d + n_outputs) x
        block_k floats of shared memory); only ``active`` threads compute.
        Leaves sum_j exp(s_j - m) v_j in ``acc`` (float64, n_outputs) and
        returns ``(m, l)``, the running maximum and l = sum_j exp(s_j - m);
        with no admissible key l = 0 and m = -inf. Within a tile the sums run
        in the input dtype and are added into the float64 ``l`` and ``acc``
        once per tile (the CPU kernels' scheme: no float64 work per pair).
        """
        n_keys = keys_t.shape[1]
        part = cuda.local.array(n_outputs, dtype=float_type)
        for c in range(n_outputs):
            acc[c] = 0.0
        running_max = minus_inf
        running_sum = 0.0
        for j0 in range(0, n_keys, block_k):
            nb = imin(block_k, n_keys - j0)
            load_columns(tile, block_k, j0, nb, keys_t, d, values_t, n_outputs)
            cuda.syncthreads()
            if active:
                part_sum = zero
                for c in range(n_outputs):
                    part[c] = zero
                for jj in range(nb):
                    if j0 + jj == own:
                        continue
                    s = tile_score(tile, block_k, jj, q_row)
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
        return running_max, running_sum

    return pool_row


def pool_row_function(dtype, d, n_outputs):
    """The device function ``pool_row`` for a dtype, d features and n_outputs outputs."""
    t = np.dtype(dtype).type
    return compiled(
        ("pool_row", t, int(d), int(n_outputs)), lambda: _make_pool_row(t, int(d), int(n_outputs))
    )


def _make_pool_kernel(float_type, d, n_outputs):
    zero = float_type(0.0)
    tile_type = from_dtype(np.dtype(float_type))
    pool_row = pool_row_function(float_type, d, n_outputs)

    @jit
    def gaussian_pool_kernel(
        queries, keys_t, values_t, exclude_self, self_offset, block_k, out, lse
    ):
        tile = cuda.shared.array(0, dtype=tile_type)  # (d + n_outputs) x block_k
        i = cuda.grid(1)
        active = i < queries.shape[0]
        q_row = cuda.local.array(d, dtype=float_type)
        acc = cuda.local.array(n_outputs, dtype=np.float64)
        for f in range(d):
            q_row[f] = queries[i, f] if active else zero
        own = i + self_offset if exclude_self else -1
        running_max, running_sum = pool_row(
            keys_t, values_t, own, active, q_row, tile, block_k, acc
        )
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
    """The compiled kernel for a dtype, d features and n_outputs outputs per launch."""
    t = np.dtype(dtype).type
    return compiled(
        ("pool", t, int(d), int(n_outputs)), lambda: _make_pool_kernel(t, int(d), int(n_outputs))
    )


def gaussian_pool(queries, keys_t, values_t, exclude_self, self_offset=0):
    """Host wrapper: NumPy or device arrays in; ``(out, lse)`` as device arrays.

    ``out`` has the dtype of ``queries``; running sums are float64. With
    ``exclude_self``, query i skips key ``i + self_offset`` (as the CPU kernel).
    """
    device_queries = to_device(queries)
    device_keys_t = to_device(keys_t)
    device_values_t = to_device(values_t)
    n_queries = device_queries.shape[0]
    d = device_keys_t.shape[0]
    n_outputs = device_values_t.shape[0]
    dtype = np.dtype(device_queries.dtype)
    device_out = cuda.device_array((n_queries, n_outputs), dtype=dtype)
    device_lse = cuda.device_array(n_queries, dtype=np.float64)
    for c0, c1, block_k, shared in output_launches(d, n_outputs, dtype.itemsize):
        args = (
            device_queries,
            device_keys_t,
            device_values_t[c0:c1],
            bool(exclude_self),
            int(self_offset),
            block_k,
            device_out[:, c0:c1],
            device_lse,
        )
        kernel = gaussian_pool_kernel(dtype, d, c1 - c0)
        launch(kernel, n_queries, args, shared=shared)
    return device_out, device_lse


def output_launches(n_features, n_outputs, itemsize):
    """The launches of a kernel whose tiles hold keys of ``n_features`` columns and some
    of their ``n_outputs`` value columns (the pool here, the loss and the spread in
    ``loo``): per launch ``(c0, c1, block_k, shared)``, the outputs c0 .. c1 - 1 (at
    most ``config.CUDA_MAX_OUTPUTS``: their accumulators are registers), ``block_k``
    keys per tile (``tile_rows``) and the tile's bytes."""
    per_launch = config.CUDA_MAX_OUTPUTS
    for c0 in range(0, n_outputs, per_launch):
        c1 = min(n_outputs, c0 + per_launch)
        per_key = n_features + c1 - c0
        block_k = tile_rows(per_key, itemsize)
        yield c0, c1, block_k, per_key * block_k * itemsize


def _make_weights_kernels(float_type, d):
    """(row normaliser, weights) kernels of :func:`gaussian_weights` for a dtype and d."""
    zero = float_type(0.0)
    tile_type = from_dtype(np.dtype(float_type))
    exp = exp_for(float_type)
    pool_row = pool_row_function(float_type, d, 1)

    @jit
    def row_normaliser_kernel(queries, keys_t, zero_values_t, exclude_self, block_k, m, l):
        """m[i] = max_j s_ij and l[i] = sum_j exp(s_ij - m[i]) (float64) over admissible keys."""
        tile = cuda.shared.array(0, dtype=tile_type)  # (d + 1) x block_k
        i = cuda.grid(1)
        active = i < queries.shape[0]
        q_row = cuda.local.array(d, dtype=float_type)
        acc = cuda.local.array(1, dtype=np.float64)
        for f in range(d):
            q_row[f] = queries[i, f] if active else zero
        own = i if exclude_self else -1
        running_max, running_sum = pool_row(
            keys_t, zero_values_t, own, active, q_row, tile, block_k, acc
        )
        if active:
            m[i] = running_max
            l[i] = running_sum

    @jit
    def weights_kernel(queries, keys_t, m, l, exclude_self, q0, weights):
        """weights[i, j] = exp(s_ij - m[i]) / l[i] for query i = q0 + blockIdx.y."""
        j = cuda.grid(1)
        i = q0 + cuda.blockIdx.y
        if j >= keys_t.shape[1]:
            return
        row = cuda.blockIdx.y
        if l[i] == 0.0 or (exclude_self and i == j):
            weights[row, j] = zero
            return
        s = zero
        for f in range(d):
            diff = keys_t[f, j] - queries[i, f]
            s -= diff * diff
        weights[row, j] = exp(s - m[i]) * float_type(1.0 / l[i])

    return row_normaliser_kernel, weights_kernel


def weights_kernels(dtype, d):
    """The (row normaliser, weights) kernels of :func:`gaussian_weights` for a dtype and d."""
    t = np.dtype(dtype).type
    return compiled(("weights", t, int(d)), lambda: _make_weights_kernels(t, int(d)))


def gaussian_weights(queries, keys_t, exclude_self):
    """Full attention-weight matrix (n_queries, n_keys) of the Gaussian score, on the GPU.

    The twin of :func:`nbattn.kernels.pooling.gaussian_weights`: row i is
    softmax_j(-||q_i - k_j||^2), the pair (i, i) left out with
    ``exclude_self``; a row with no admissible key is 0. Host or device
    arrays in; a host array of the dtype of ``queries`` out (meant for small
    inputs: the matrix is n_queries x n_keys).
    """
    device_queries = to_device(queries)
    device_keys_t = to_device(keys_t)
    n_queries = device_queries.shape[0]
    d, n_keys = device_keys_t.shape
    dtype = np.dtype(device_queries.dtype)
    if n_queries == 0 or n_keys == 0:
        return np.zeros((n_queries, n_keys), dtype=dtype)
    normaliser, weights = weights_kernels(dtype, d)
    zero_values_t = cuda.to_device(np.zeros((1, n_keys), dtype=dtype))
    device_m = cuda.device_array(n_queries, dtype=dtype)
    device_l = cuda.device_array(n_queries, dtype=np.float64)
    out = cuda.device_array((n_queries, n_keys), dtype=dtype)
    block_k = tile_rows(d + 1, dtype.itemsize)
    args = (device_queries, device_keys_t, zero_values_t, bool(exclude_self), block_k)
    launch(
        normaliser,
        n_queries,
        (*args, device_m, device_l),
        shared=(d + 1) * block_k * dtype.itemsize,
    )

    def rows(b0, b1):
        return (
            device_queries,
            device_keys_t,
            device_m,
            device_l,
            bool(exclude_self),
            b0,
            out[b0:b1],
        )

    launch(weights, n_keys, rows, n_slices=n_queries)
    return out.copy_to_host()
