"""Leave-one-out loss and gradients on the GPU: the twin of ``nbattn.kernels.loo``.

Same contracts and layout as the CPU kernels (see ``nbattn.kernels.loo``):
``queries`` (n_queries, k) and ``keys_t`` (k, n_keys), already multiplied by
the metric and divided by sqrt(2), so that ``s_ij = -|| queries_i - keys_t[:, j] ||^2``;
``values_t`` (n_outputs, n_keys); ``resid`` and ``centers`` (n_queries,
n_outputs); one float dtype (float32 or float64); ``lse`` float64.

* ``loo_squared_error(queries, keys_t, values_t, targets, self_index)``:
  ``sum_i sum_c (f_-i(q_i)_c - targets_ic)^2`` with key ``self_index[i]``
  left out of query i's softmax (a query with no admissible key predicts 0).
* ``loo_grad_diag(queries, keys_t, values_t, resid, centers, lse)``:
  ``G_f = sum_i sum_{j != i} g_ij (z_if - z_jf)^2`` (k,)
* ``loo_grad_full(queries, keys_t, points, points_t, values_t, resid, centers, lse)``:
  ``M_ab = sum_i sum_{j != i} g_ij (x_ia - x_ja)(x_ib - x_jb)`` (d, d)

with ``g_ij = w_ij sum_c r_ic (y_jc - f_ic)`` and the exact weights
``w_ij = exp(s_ij - lse_i)``. The host wrappers take NumPy or device arrays
and return what the CPU kernels return (a float, or float64 NumPy arrays):
the results are a few numbers, the inputs stay on the device.

One thread per query i streams over the keys in tiles that the block loads
together into shared memory (``block_k`` keys, at most
``config.CUDA_THREADS_PER_BLOCK`` and at most ``config.CUDA_SHARED_MEMORY_BYTES``
of tile). Each thread accumulates its partial gradient in float64 registers
(up to ``MAX_ACC`` numbers per launch; kernels are compiled per dtype and
per count -- and the loss kernel per (k, outputs) -- so that the local
arrays have compile-time sizes and stay out of local memory); the block
adds them with shared-memory atomics and one thread per entry adds the
block's sum into the float64 result with ``cuda.atomic.add`` -- so
n_blocks, not n_queries, global atomics per entry.
More than ``MAX_ACC`` features (diag) or lower-triangle pairs (full: d (d+1)/2)
are handled in several launches over ranges of entries; more than
``MAX_OUTPUTS`` outputs in the loss likewise (the squared error is a sum
over outputs, so each range of outputs runs its own softmax).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, from_dtype

from .. import config
from ._util import exp_for, imin

#: Gradient entries accumulated per thread and launch (float64, in registers).
MAX_ACC = 64
#: Outputs accumulated per thread and launch by the loss kernel.
MAX_OUTPUTS = 8


def block_keys(floats_per_key, itemsize):
    """Keys per shared-memory tile: at most the threads per block and the shared budget."""
    tpb = config.CUDA_THREADS_PER_BLOCK
    fit = config.CUDA_SHARED_MEMORY_BYTES // max(1, floats_per_key * itemsize)
    return max(1, min(tpb, fit))


def _make_loss_kernel(float_type, k, n_outputs):
    """The LOO squared-error kernel for a dtype, k features and n_outputs outputs
    (compile-time sizes: query row and accumulators in registers)."""
    zero = float_type(0.0)
    minus_inf = float_type(-np.inf)
    tile_type = from_dtype(np.dtype(float_type))
    exp = exp_for(float_type)

    @cuda.jit
    def loo_squared_error_kernel(queries, keys_t, values_t, targets, self_index, bk, out):
        """Adds sum_i sum_c (f_-i(q_i)_c - targets_ic)^2 over this launch's outputs to out[0]."""
        tile = cuda.shared.array(0, dtype=tile_type)  # (k + n_outputs) x bk
        block_sum = cuda.shared.array(1, dtype=np.float64)
        i = cuda.grid(1)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        n_queries = queries.shape[0]
        n_keys = keys_t.shape[1]
        if tx == 0:
            block_sum[0] = 0.0
        active = i < n_queries
        q_row = cuda.local.array(k, dtype=float_type)
        acc = cuda.local.array(n_outputs, dtype=np.float64)
        part = cuda.local.array(n_outputs, dtype=float_type)
        for f in range(k):
            q_row[f] = queries[i, f] if active else zero
        for c in range(n_outputs):
            acc[c] = 0.0
        running_max = minus_inf
        running_sum = 0.0
        own = self_index[i] if active else -1
        for j0 in range(0, n_keys, bk):
            nb = imin(bk, n_keys - j0)
            for jj in range(tx, nb, tpb):
                for f in range(k):
                    tile[f * bk + jj] = keys_t[f, j0 + jj]
                for c in range(n_outputs):
                    tile[(k + c) * bk + jj] = values_t[c, j0 + jj]
            cuda.syncthreads()
            if active:  # tile sums in the input dtype, added into float64 (as pooling)
                part_sum = zero
                for c in range(n_outputs):
                    part[c] = zero
                for jj in range(nb):
                    if j0 + jj == own:
                        continue
                    s = zero
                    for f in range(k):
                        diff = tile[f * bk + jj] - q_row[f]
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
                        part[c] += w * tile[(k + c) * bk + jj]
                running_sum += part_sum
                for c in range(n_outputs):
                    acc[c] += part[c]
            cuda.syncthreads()
        if i < n_queries:
            inv = 1.0 / running_sum if running_sum > 0.0 else 0.0
            sq = 0.0
            for c in range(n_outputs):
                err = acc[c] * inv - targets[i, c]
                sq += err * err
            cuda.atomic.add(block_sum, 0, sq)
        cuda.syncthreads()
        if tx == 0:
            cuda.atomic.add(out, 0, block_sum[0])

    return loo_squared_error_kernel


def _make_kernels(float_type, n_acc):
    """The (diag, full) gradient kernels for a dtype, accumulating n_acc <= MAX_ACC
    entries per launch (a compile-time size: the accumulators live in registers)."""
    zero = float_type(0.0)
    tile_type = from_dtype(np.dtype(float_type))
    exp = exp_for(float_type)

    @cuda.jit(device=True)
    def _coef(values_t, resid, centers, i, j):
        """sum_c resid[i, c] * (values_t[c, j] - centers[i, c]), in the input dtype."""
        total = zero
        for c in range(values_t.shape[0]):
            total += resid[i, c] * (values_t[c, j] - centers[i, c])
        return total

    @cuda.jit
    def loo_grad_diag_kernel(
        queries, keys_t, values_t, resid, centers, lse, self_offset, f0, bk, out
    ):
        """Adds G_f for f in [f0, f0 + n_acc) into out (float64)."""
        tile = cuda.shared.array(0, dtype=tile_type)  # k x bk
        block_acc = cuda.shared.array(n_acc, dtype=np.float64)
        i = cuda.grid(1)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        n_queries, k = queries.shape
        n_keys = keys_t.shape[1]
        for a in range(tx, n_acc, tpb):
            block_acc[a] = 0.0
        acc = cuda.local.array(n_acc, dtype=np.float64)
        for a in range(n_acc):
            acc[a] = 0.0
        active = False
        shift = zero
        if i < n_queries:
            active = lse[i] != -math.inf
            shift = float_type(lse[i])
        for j0 in range(0, n_keys, bk):
            nb = imin(bk, n_keys - j0)
            for jj in range(tx, nb, tpb):
                for f in range(k):
                    tile[f * bk + jj] = keys_t[f, j0 + jj]
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    j = j0 + jj
                    if j == i + self_offset:
                        continue
                    s = zero
                    for f in range(k):
                        diff = tile[f * bk + jj] - queries[i, f]
                        s -= diff * diff
                    coef = exp(s - shift) * _coef(values_t, resid, centers, i, j)
                    for a in range(n_acc):
                        diff = tile[(f0 + a) * bk + jj] - queries[i, f0 + a]
                        acc[a] += coef * diff * diff
            cuda.syncthreads()
        if active:
            for a in range(n_acc):
                cuda.atomic.add(block_acc, a, acc[a])
        cuda.syncthreads()
        for a in range(tx, n_acc, tpb):
            cuda.atomic.add(out, f0 + a, block_acc[a])

    @cuda.jit
    def loo_grad_full_kernel(
        queries,
        keys_t,
        points,
        points_t,
        values_t,
        resid,
        centers,
        lse,
        self_offset,
        pair_a,
        pair_b,
        bk,
        out,
    ):
        """Adds M[pair_a[p], pair_b[p]] for this launch's pairs into out (float64, flat)."""
        tile = cuda.shared.array(0, dtype=tile_type)  # (k + d) x bk
        block_acc = cuda.shared.array(n_acc, dtype=np.float64)
        i = cuda.grid(1)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        n_queries, k = queries.shape
        d = points.shape[1]
        n_keys = keys_t.shape[1]
        for a in range(tx, n_acc, tpb):
            block_acc[a] = 0.0
        acc = cuda.local.array(n_acc, dtype=np.float64)
        for a in range(n_acc):
            acc[a] = 0.0
        active = False
        shift = zero
        if i < n_queries:
            active = lse[i] != -math.inf
            shift = float_type(lse[i])
        for j0 in range(0, n_keys, bk):
            nb = imin(bk, n_keys - j0)
            for jj in range(tx, nb, tpb):
                for f in range(k):
                    tile[f * bk + jj] = keys_t[f, j0 + jj]
                for f in range(d):
                    tile[(k + f) * bk + jj] = points_t[f, j0 + jj]
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    j = j0 + jj
                    if j == i + self_offset:
                        continue
                    s = zero
                    for f in range(k):
                        diff = tile[f * bk + jj] - queries[i, f]
                        s -= diff * diff
                    coef = exp(s - shift) * _coef(values_t, resid, centers, i, j)
                    for p in range(n_acc):
                        a = pair_a[p]
                        b = pair_b[p]
                        da = tile[(k + a) * bk + jj] - points[i, a]
                        db = tile[(k + b) * bk + jj] - points[i, b]
                        acc[p] += coef * da * db
            cuda.syncthreads()
        if active:
            for p in range(n_acc):
                cuda.atomic.add(block_acc, p, acc[p])
        cuda.syncthreads()
        for p in range(tx, n_acc, tpb):
            cuda.atomic.add(out, pair_a[p] * d + pair_b[p], block_acc[p])

    return loo_grad_diag_kernel, loo_grad_full_kernel


_kernel_cache = {}


def _cached(key, make):
    if key not in _kernel_cache:
        _kernel_cache[key] = make()
    return _kernel_cache[key]


def loss_kernel(dtype, k, n_outputs):
    """The compiled LOO squared-error kernel for a dtype, k features, n_outputs <= MAX_OUTPUTS."""
    t = np.dtype(dtype).type
    return _cached(("loss", t, k, n_outputs), lambda: _make_loss_kernel(t, k, n_outputs))


def grad_kernels(dtype, n_acc):
    """The (diag, full) gradient kernels for a dtype and n_acc <= MAX_ACC entries per launch."""
    t = np.dtype(dtype).type
    return _cached(("grad", t, n_acc), lambda: _make_kernels(t, n_acc))


def _device(array):
    from .pooling import to_device

    return to_device(array)


def _blocks(n):
    tpb = config.CUDA_THREADS_PER_BLOCK
    return max(1, (n + tpb - 1) // tpb), tpb


def loo_squared_error(queries, keys_t, values_t, targets, self_index):
    """sum_i sum_c (f_-i(q_i)_c - targets[i, c])^2 as a float (float64 sums).

    The twin of :func:`nbattn.kernels.loo.loo_squared_error`: with queries =
    keys and ``self_index = arange(n)`` the exact LOO sum.
    """
    device_queries = _device(queries)
    device_keys_t = _device(keys_t)
    device_values_t = _device(values_t)
    device_targets = _device(np.asarray(targets, dtype=np.float64))
    device_index = _device(np.asarray(self_index, dtype=np.int64))
    dtype = np.dtype(device_queries.dtype)
    k, n_keys = device_keys_t.shape
    n_outputs = device_values_t.shape[0]
    total = cuda.to_device(np.zeros(1))
    blocks, tpb = _blocks(device_queries.shape[0])
    for c0 in range(0, n_outputs, MAX_OUTPUTS):
        c1 = min(n_outputs, c0 + MAX_OUTPUTS)
        kernel = loss_kernel(dtype, k, c1 - c0)
        bk = block_keys(k + c1 - c0, dtype.itemsize)
        shared = (k + c1 - c0) * bk * dtype.itemsize
        kernel[blocks, tpb, 0, shared](
            device_queries,
            device_keys_t,
            device_values_t[c0:c1],
            device_targets[:, c0:c1],
            device_index,
            bk,
            total,
        )
    return float(total.copy_to_host()[0])


def loo_grad_diag(queries, keys_t, values_t, resid, centers, lse, self_offset=0):
    """G_f = sum_i sum_{j != i} g_ij (z_if - z_jf)^2, float64 (k,); see the module docstring.

    Query i is key ``i + self_offset`` (a block of rows for partitioned sums).
    """
    args = [_device(a) for a in (queries, keys_t, values_t, resid, centers)]
    device_lse = _device(np.asarray(lse, dtype=np.float64) if isinstance(lse, np.ndarray) else lse)
    dtype = np.dtype(args[0].dtype)
    k = args[1].shape[0]
    out = cuda.to_device(np.zeros(k))
    bk = block_keys(k, dtype.itemsize)
    blocks, tpb = _blocks(args[0].shape[0])
    for f0 in range(0, k, MAX_ACC):
        kernel = grad_kernels(dtype, min(MAX_ACC, k - f0))[0]
        shared = k * bk * dtype.itemsize
        kernel[blocks, tpb, 0, shared](*args, device_lse, int(self_offset), f0, bk, out)
    return out.copy_to_host()


def loo_grad_full(queries, keys_t, points, points_t, values_t, resid, centers, lse, self_offset=0):
    """M_ab = sum_i sum_{j != i} g_ij (x_ia - x_ja)(x_ib - x_jb), float64 (d, d).

    ``queries``/``keys_t`` are the projected points (score space), ``points``
    (n_queries, d) the original query rows and ``points_t`` (d, n_keys) the
    original keys (centred by the caller); query i is key ``i + self_offset``.
    """
    args = [_device(a) for a in (queries, keys_t, points, points_t, values_t, resid, centers)]
    device_lse = _device(np.asarray(lse, dtype=np.float64) if isinstance(lse, np.ndarray) else lse)
    dtype = np.dtype(args[0].dtype)
    k = args[1].shape[0]
    d = args[2].shape[1]
    pairs_a, pairs_b = np.tril_indices(d)
    out = cuda.to_device(np.zeros(d * d))
    bk = block_keys(k + d, dtype.itemsize)
    blocks, tpb = _blocks(args[0].shape[0])
    for p0 in range(0, pairs_a.size, MAX_ACC):
        pa = cuda.to_device(pairs_a[p0 : p0 + MAX_ACC].astype(np.int64))
        pb = cuda.to_device(pairs_b[p0 : p0 + MAX_ACC].astype(np.int64))
        kernel = grad_kernels(dtype, pa.shape[0])[1]
        shared = (k + d) * bk * dtype.itemsize
        kernel[blocks, tpb, 0, shared](*args, device_lse, int(self_offset), pa, pb, bk, out)
    m = out.copy_to_host().reshape(d, d)
    return np.tril(m) + np.tril(m, -1).T
