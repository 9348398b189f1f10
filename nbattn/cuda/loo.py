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
together into shared memory (``block_k`` keys: ``common.tile_rows``). The
loss kernel runs the Nadaraya-Watson walk of ``nbattn.cuda.pooling``
(its device function ``pool_row``, as the CPU loss kernel runs the CPU
``pool_row``); the gradient kernels weigh each pair with the one device
function ``pair_weight`` and accumulate their partial gradient in float64
registers (up to ``config.CUDA_MAX_GRAD_ENTRIES`` numbers per launch; kernels
are compiled per dtype and per count -- and the loss kernel per (k, outputs)
-- so that the local arrays have compile-time sizes); the block adds them
with shared-memory atomics and one thread per entry adds the block's sum into
the float64 result with ``cuda.atomic.add`` -- so n_blocks, not n_queries,
global atomics per entry. More features (diag) or lower-triangle pairs (full:
d (d+1)/2) run in several launches over ranges of entries; more than
``config.CUDA_MAX_OUTPUTS`` outputs in the loss likewise (the squared error
is a sum over outputs, so each range of outputs runs its own softmax). Both
limits are read at each call.

* ``gaussian_spread(queries, keys_t, values_t, centers, lse, exclude_self)``:
  ``var_ic = sum_j w_ij (v_jc - c_ic)^2`` (n_queries, n_outputs) and
  ``sum_w2_i = sum_j w_ij^2`` (n_queries,), both float64 host arrays; a query
  with lse = -inf gets 0 and 0; with ``exclude_self`` the pair (i, i) has
  weight 0. One thread per query walks tiles of keys and values (at most
  ``config.CUDA_MAX_OUTPUTS`` outputs per launch, more in further launches);
  per tile the sums run in the input dtype and are added into float64
  registers, as in the CPU kernel.

Far rows (the CPU's contract, ``nbattn.kernels.pooling``): a row whose best
score lies below ``-config.FAR_SCORE_<dtype>``, or whose scores overflowed,
takes float64 scores (a float32 row) or scores relative to its nearest key
(``nbattn.cuda.far``). The loss kernel redoes such a row in the thread that
found it (``far.far_squared_error``); the second passes leave rows with
lse < -FAR_SCORE (``far.far_rows``) to small kernels of one thread per far
row (``far_grad_kernels``, ``far_spread_kernel``) that pick the row's mode
from lse as the CPU's ``_row_setup`` does -- so the tiled kernels keep their
registers, and a call whose every lse is >= -FAR_SCORE launches nothing more.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, from_dtype

from .. import config
from .._core.numeric import power_of_two_scale
from . import far
from .common import compiled, exp_for, imin, jit, launch, load_columns, tile_rows, to_device
from .pooling import output_launches, pool_row_function, tile_score_function

__all__ = [
    "gaussian_spread",
    "grad_kernels",
    "loo_grad_diag",
    "loo_grad_full",
    "loo_squared_error",
    "far_grad_kernels",
    "far_spread_kernel",
    "loss_kernel",
    "pair_weight_function",
    "spread_kernel",
]


def _make_loss_kernel(float_type, k, n_outputs):
    """The LOO squared-error kernel for a dtype, k features and n_outputs outputs
    (compile-time sizes: query row and accumulators in registers)."""
    zero = float_type(0.0)
    tile_type = from_dtype(np.dtype(float_type))
    pool_row = pool_row_function(float_type, k, n_outputs)
    limit = far.far_limit(float_type)
    limit64 = far.FAR_SCORE_FLOAT64

    @jit
    def loo_squared_error_kernel(queries, keys_t, values_t, targets, self_index, bk, out):
        """Adds sum_i sum_c (f_-i(q_i)_c - targets_ic)^2 over this launch's outputs to out[0]."""
        tile = cuda.shared.array(0, dtype=tile_type)  # (k + n_outputs) x bk
        block_sum = cuda.shared.array(1, dtype=np.float64)
        i = cuda.grid(1)
        if cuda.threadIdx.x == 0:
            block_sum[0] = 0.0
        active = i < queries.shape[0]
        q_row = cuda.local.array(k, dtype=float_type)
        acc = cuda.local.array(n_outputs, dtype=np.float64)
        for f in range(k):
            q_row[f] = queries[i, f] if active else zero
        own = self_index[i] if active else -1
        running_max, running_sum = pool_row(keys_t, values_t, own, active, q_row, tile, bk, acc)
        if active:
            sq = 0.0
            if running_max >= -limit or not far.has_admissible_key(keys_t.shape[1], own):
                inv = 1.0 / running_sum if running_sum > 0.0 else 0.0
                for c in range(n_outputs):
                    err = acc[c] * inv - targets[i, c]
                    sq += err * err
            else:  # a far row (rare): redone as on the CPU (acc left alone: it stays in registers)
                sq = far.far_squared_error(
                    queries[i], keys_t, values_t, targets, i, own, limit, limit64
                )
            cuda.atomic.add(block_sum, 0, sq)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            cuda.atomic.add(out, 0, block_sum[0])

    return loo_squared_error_kernel


def _make_pair_weight(float_type):
    exp = exp_for(float_type)
    zero = float_type(0.0)

    @jit(device=True, inline=True)
    def pair_weight(tile, bk, jj, queries, i, shift, values_t, resid, centers, j):
        """g_ij = exp(s_ij - lse_i) * sum_c resid[i, c] (values_t[c, j] - centers[i, c]).

        The score s_ij = -sum_f (k_jf - q_if)^2 reads key j from rows 0..k-1,
        column jj of the tile (``bk`` columns); ``shift`` is lse_i in the
        input dtype. Everything in the input dtype.
        """
        s = zero
        for f in range(queries.shape[1]):
            diff = tile[f * bk + jj] - queries[i, f]
            s -= diff * diff
        w = exp(s - shift)
        total = zero
        for c in range(values_t.shape[0]):
            total += resid[i, c] * (values_t[c, j] - centers[i, c])
        return w * total

    return pair_weight


@jit(device=True, inline=True)
def pair_residual(values_t, resid, centers, i, j):
    """sum_c resid[i, c] (values_t[c, j] - centers[i, c]), in the input dtype."""
    total = resid[i, 0] * (values_t[0, j] - centers[i, 0])
    for c in range(1, values_t.shape[0]):
        total += resid[i, c] * (values_t[c, j] - centers[i, c])
    return total


def pair_weight_function(dtype):
    """The device function ``pair_weight`` for a dtype (see :func:`_make_pair_weight`)."""
    t = np.dtype(dtype).type
    return compiled(("pair_weight", t), lambda: _make_pair_weight(t))


def _make_grad_kernels(float_type, n_acc):
    """The (diag, full) gradient kernels for a dtype, accumulating n_acc entries
    per launch (a compile-time size: the accumulators live in registers)."""
    zero = float_type(0.0)
    tile_type = from_dtype(np.dtype(float_type))
    pair_weight = pair_weight_function(float_type)
    limit = far.far_limit(float_type)

    @jit
    def loo_grad_diag_kernel(
        queries, keys_t, values_t, resid, centers, lse, self_offset, f0, bk, out
    ):
        """Adds G_f for f in [f0, f0 + n_acc) into out (float64)."""
        tile = cuda.shared.array(0, dtype=tile_type)  # k x bk
        block_acc = cuda.shared.array(n_acc, dtype=np.float64)
        i = cuda.grid(1)
        tx = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        k = queries.shape[1]
        n_keys = keys_t.shape[1]
        for a in range(tx, n_acc, tpb):
            block_acc[a] = 0.0
        acc = cuda.local.array(n_acc, dtype=np.float64)
        for a in range(n_acc):
            acc[a] = 0.0
        active = False
        shift = zero
        own = i + self_offset
        if i < queries.shape[0]:
            active = lse[i] >= -limit  # far rows: far_grad_kernels
            shift = float_type(lse[i])
        for j0 in range(0, n_keys, bk):
            nb = imin(bk, n_keys - j0)
            load_columns(tile, bk, j0, nb, keys_t, k, keys_t, 0)
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    j = j0 + jj
                    if j == own:
                        continue
                    coef = pair_weight(tile, bk, jj, queries, i, shift, values_t, resid, centers, j)
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

    @jit
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
        k = queries.shape[1]
        d = points.shape[1]
        n_keys = keys_t.shape[1]
        for a in range(tx, n_acc, tpb):
            block_acc[a] = 0.0
        acc = cuda.local.array(n_acc, dtype=np.float64)
        for a in range(n_acc):
            acc[a] = 0.0
        active = False
        shift = zero
        own = i + self_offset
        if i < queries.shape[0]:
            active = lse[i] >= -limit  # far rows: far_grad_kernels
            shift = float_type(lse[i])
        for j0 in range(0, n_keys, bk):
            nb = imin(bk, n_keys - j0)
            load_columns(tile, bk, j0, nb, keys_t, k, points_t, d)
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    j = j0 + jj
                    if j == own:
                        continue
                    coef = pair_weight(tile, bk, jj, queries, i, shift, values_t, resid, centers, j)
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


def _make_far_grad_kernels(float_type, n_acc):
    """The (diag, full) gradient kernels of far rows: one thread per listed row, keys
    read from global memory, weights from ``far.row_setup`` / ``far.far_weight``."""
    limit = far.far_limit(float_type)
    limit64 = far.FAR_SCORE_FLOAT64

    @jit
    def far_grad_diag_kernel(
        queries, keys_t, values_t, resid, centers, lse, self_offset, rows, f0, out
    ):
        """Adds row rows[t]'s part of G_f for f in [f0, f0 + n_acc) into out."""
        t = cuda.grid(1)
        if t >= rows.shape[0]:
            return
        i = rows[t]
        own = i + self_offset
        skip, mode, anchor, scale, shift = far.row_setup(
            queries[i], keys_t, own, lse[i], limit, limit64
        )
        if skip:
            return
        acc = cuda.local.array(n_acc, dtype=np.float64)
        for a in range(n_acc):
            acc[a] = 0.0
        for j in range(keys_t.shape[1]):
            if j == own:
                continue
            w = far.far_weight(queries[i], keys_t, j, own, mode, lse[i], anchor, scale, shift)
            coef = float_type(w) * pair_residual(values_t, resid, centers, i, j)
            for a in range(n_acc):
                diff = keys_t[f0 + a, j] - queries[i, f0 + a]
                acc[a] += coef * diff * diff
        for a in range(n_acc):
            cuda.atomic.add(out, f0 + a, acc[a])

    @jit
    def far_grad_full_kernel(
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
        rows,
        out,
    ):
        """Adds row rows[t]'s part of M[pair_a[p], pair_b[p]] into out (flat)."""
        t = cuda.grid(1)
        if t >= rows.shape[0]:
            return
        i = rows[t]
        own = i + self_offset
        d = points.shape[1]
        skip, mode, anchor, scale, shift = far.row_setup(
            queries[i], keys_t, own, lse[i], limit, limit64
        )
        if skip:
            return
        acc = cuda.local.array(n_acc, dtype=np.float64)
        for p in range(n_acc):
            acc[p] = 0.0
        for j in range(keys_t.shape[1]):
            if j == own:
                continue
            w = far.far_weight(queries[i], keys_t, j, own, mode, lse[i], anchor, scale, shift)
            coef = float_type(w) * pair_residual(values_t, resid, centers, i, j)
            for p in range(n_acc):
                da = points_t[pair_a[p], j] - points[i, pair_a[p]]
                db = points_t[pair_b[p], j] - points[i, pair_b[p]]
                acc[p] += coef * da * db
        for p in range(n_acc):
            cuda.atomic.add(out, pair_a[p] * d + pair_b[p], acc[p])

    return far_grad_diag_kernel, far_grad_full_kernel


def far_grad_kernels(dtype, n_acc):
    """The (diag, full) far-row gradient kernels for a dtype and n_acc entries per launch."""
    t = np.dtype(dtype).type
    return compiled(("loo_far_grad", t, int(n_acc)), lambda: _make_far_grad_kernels(t, int(n_acc)))


def loss_kernel(dtype, k, n_outputs):
    """The compiled LOO squared-error kernel for a dtype, k features and n_outputs outputs."""
    t = np.dtype(dtype).type
    return compiled(
        ("loo_loss", t, int(k), int(n_outputs)),
        lambda: _make_loss_kernel(t, int(k), int(n_outputs)),
    )


def grad_kernels(dtype, n_acc):
    """The (diag, full) gradient kernels for a dtype and n_acc entries per launch."""
    t = np.dtype(dtype).type
    return compiled(("loo_grad", t, int(n_acc)), lambda: _make_grad_kernels(t, int(n_acc)))


def _lse_on_device(lse):
    return to_device(np.asarray(lse, dtype=np.float64) if isinstance(lse, np.ndarray) else lse)


def loo_squared_error(queries, keys_t, values_t, targets, self_index):
    """sum_i sum_c (f_-i(q_i)_c - targets[i, c])^2 as a float (float64 sums).

    The twin of :func:`nbattn.kernels.loo.loo_squared_error`: with queries =
    keys and ``self_index = arange(n)`` the exact LOO sum.
    """
    device_queries = to_device(queries)
    device_keys_t = to_device(keys_t)
    device_values_t = to_device(values_t)
    device_targets = to_device(np.asarray(targets, dtype=np.float64))
    device_index = to_device(np.asarray(self_index, dtype=np.int64))
    dtype = np.dtype(device_queries.dtype)
    k = device_keys_t.shape[0]
    n_outputs = device_values_t.shape[0]
    total = cuda.to_device(np.zeros(1))
    for c0, c1, bk, shared in output_launches(k, n_outputs, dtype.itemsize):
        args = (
            device_queries,
            device_keys_t,
            device_values_t[c0:c1],
            device_targets[:, c0:c1],
            device_index,
            bk,
            total,
        )
        kernel = loss_kernel(dtype, k, c1 - c0)
        launch(kernel, device_queries.shape[0], args, shared=shared)
    return float(total.copy_to_host()[0])


def loo_grad_diag(queries, keys_t, values_t, resid, centers, lse, self_offset=0):
    """G_f = sum_i sum_{j != i} g_ij (z_if - z_jf)^2, float64 (k,); see the module docstring.

    Query i is key ``i + self_offset`` (a block of rows for partitioned sums).
    """
    arrays = [to_device(a) for a in (queries, keys_t, values_t, resid, centers)]
    device_lse = _lse_on_device(lse)
    dtype = np.dtype(arrays[0].dtype)
    k = arrays[1].shape[0]
    out = cuda.to_device(np.zeros(k))
    bk = tile_rows(k, dtype.itemsize)
    per_launch = config.CUDA_MAX_GRAD_ENTRIES
    rows = far.far_rows(lse, dtype)
    device_rows = cuda.to_device(rows.astype(np.int64)) if rows.size else None
    for f0 in range(0, k, per_launch):
        n_acc = min(per_launch, k - f0)
        kernel = grad_kernels(dtype, n_acc)[0]
        args = (*arrays, device_lse, int(self_offset), f0, bk, out)
        launch(kernel, arrays[0].shape[0], args, shared=k * bk * dtype.itemsize)
        if rows.size:  # rare: rows whose weights need the far path
            far_kernel = far_grad_kernels(dtype, n_acc)[0]
            far_args = (*arrays, device_lse, int(self_offset), device_rows, f0, out)
            launch(far_kernel, rows.size, far_args)
    return out.copy_to_host()


def loo_grad_full(queries, keys_t, points, points_t, values_t, resid, centers, lse, self_offset=0):
    """M_ab = sum_i sum_{j != i} g_ij (x_ia - x_ja)(x_ib - x_jb), float64 (d, d).

    ``queries``/``keys_t`` are the projected points (score space), ``points``
    (n_queries, d) the original query rows and ``points_t`` (d, n_keys) the
    original keys (centred by the caller); query i is key ``i + self_offset``.
    """
    arrays = [to_device(a) for a in (queries, keys_t, points, points_t, values_t, resid, centers)]
    device_lse = _lse_on_device(lse)
    dtype = np.dtype(arrays[0].dtype)
    k = arrays[1].shape[0]
    d = arrays[2].shape[1]
    pairs_a, pairs_b = np.tril_indices(d)
    out = cuda.to_device(np.zeros(d * d))
    bk = tile_rows(k + d, dtype.itemsize)
    per_launch = config.CUDA_MAX_GRAD_ENTRIES
    rows = far.far_rows(lse, dtype)
    device_rows = cuda.to_device(rows.astype(np.int64)) if rows.size else None
    for p0 in range(0, pairs_a.size, per_launch):
        pa = cuda.to_device(pairs_a[p0 : p0 + per_launch].astype(np.int64))
        pb = cuda.to_device(pairs_b[p0 : p0 + per_launch].astype(np.int64))
        kernel = grad_kernels(dtype, pa.shape[0])[1]
        args = (*arrays, device_lse, int(self_offset), pa, pb, bk, out)
        launch(kernel, arrays[0].shape[0], args, shared=(k + d) * bk * dtype.itemsize)
        if rows.size:  # rare: rows whose weights need the far path
            far_kernel = far_grad_kernels(dtype, pa.shape[0])[1]
            far_args = (*arrays, device_lse, int(self_offset), pa, pb, device_rows, out)
            launch(far_kernel, rows.size, far_args)
    m = out.copy_to_host().reshape(d, d)
    return np.tril(m) + np.tril(m, -1).T


def _make_spread_kernel(float_type, k, n_outputs):
    """The spread kernel for a dtype, k features and n_outputs outputs (compile-time
    sizes: query row, centers and accumulators in registers)."""
    zero = float_type(0.0)
    tile_type = from_dtype(np.dtype(float_type))
    exp = exp_for(float_type)
    tile_score = tile_score_function(float_type, k)
    limit = far.far_limit(float_type)
    # float32 sums run per tile and are added into float64 once per tile (the
    # CPU kernel's scheme); float64 ones go straight into the float64
    # registers, which spares n_outputs registers of per-tile sums.
    per_tile = np.dtype(float_type) != np.float64

    @jit
    def gaussian_spread_kernel(
        queries, keys_t, values_t, centers, lse, exclude_self, bk, var, sum_w2
    ):
        """var[i, c] = sum_j w_ij (v_jc - c_ic)^2 and sum_w2[i] = sum_j w_ij^2,
        with w_ij = exp(s_ij - lse_i) (0 for the pair (i, i) with exclude_self)."""
        tile = cuda.shared.array(0, dtype=tile_type)  # (k + n_outputs) x bk
        i = cuda.grid(1)
        n_keys = keys_t.shape[1]
        in_range = i < queries.shape[0]
        own = i if exclude_self else -1
        active = False
        shift = zero
        if in_range:
            active = lse[i] >= -limit  # far rows: far_spread_kernel
            shift = float_type(lse[i])
        q_row = cuda.local.array(k, dtype=float_type)
        center = cuda.local.array(n_outputs, dtype=float_type)
        part = cuda.local.array(n_outputs, dtype=float_type)
        acc = cuda.local.array(n_outputs, dtype=np.float64)
        for f in range(k):
            q_row[f] = queries[i, f] if in_range else zero
        for c in range(n_outputs):
            center[c] = float_type(centers[i, c]) if in_range else zero
            acc[c] = 0.0
        w1 = 0.0
        w2 = 0.0
        for j0 in range(0, n_keys, bk):
            nb = imin(bk, n_keys - j0)
            load_columns(tile, bk, j0, nb, keys_t, k, values_t, n_outputs)
            cuda.syncthreads()
            if active:
                part_w1 = zero
                part_w2 = zero
                for c in range(n_outputs):
                    part[c] = zero
                for jj in range(nb):
                    if j0 + jj == own:
                        continue
                    w = exp(tile_score(tile, bk, jj, q_row) - shift)
                    part_w1 += w
                    part_w2 += w * w
                    for c in range(n_outputs):
                        dev = tile[(k + c) * bk + jj] - center[c]
                        if per_tile:
                            part[c] += w * dev * dev
                        else:
                            acc[c] += w * dev * dev
                w1 += part_w1
                w2 += part_w2
                if per_tile:
                    for c in range(n_outputs):
                        acc[c] += part[c]
            cuda.syncthreads()
        if in_range:  # renormalised, as the CPU kernel's (0 for a row left to the far kernel)
            norm = 1.0 / w1 if w1 > 0.0 else 0.0
            for c in range(n_outputs):
                var[i, c] = acc[c] * norm
            sum_w2[i] = w2 * norm * norm

    return gaussian_spread_kernel


def _make_far_spread_kernel(float_type):
    limit = far.far_limit(float_type)
    limit64 = far.FAR_SCORE_FLOAT64

    @jit
    def far_spread_kernel(queries, keys_t, values_t, centers, lse, exclude_self, rows, var, sum_w2):
        """var[i, c] and sum_w2[i] of the far row i = rows[t] (the tiled kernel left
        them 0), with the weights of ``far.row_setup`` / ``far.far_weight``."""
        t = cuda.grid(1)
        if t >= rows.shape[0]:
            return
        i = rows[t]
        own = i if exclude_self else -1
        skip, mode, anchor, scale, shift = far.row_setup(
            queries[i], keys_t, own, lse[i], limit, limit64
        )
        if skip:
            return
        w1 = 0.0
        w2 = 0.0
        for c in range(values_t.shape[0]):
            total = 0.0
            for j in range(keys_t.shape[1]):
                if j == own:
                    continue
                w = far.far_weight(queries[i], keys_t, j, own, mode, lse[i], anchor, scale, shift)
                w = float_type(w)
                dev = values_t[c, j] - centers[i, c]
                total += w * dev * dev
                if c == 0:
                    w1 += w
                    w2 += w * w
            var[i, c] = total
        if w1 > 0.0:  # renormalised, as the CPU kernel's
            for c in range(values_t.shape[0]):
                var[i, c] /= w1
            sum_w2[i] = w2 / (w1 * w1)

    return far_spread_kernel


def far_spread_kernel(dtype):
    """The far-row spread kernel for a dtype."""
    t = np.dtype(dtype).type
    return compiled(("far_spread", t), lambda: _make_far_spread_kernel(t))


def spread_kernel(dtype, k, n_outputs):
    """The compiled spread kernel for a dtype, k features and n_outputs outputs per launch."""
    t = np.dtype(dtype).type
    return compiled(
        ("spread", t, int(k), int(n_outputs)),
        lambda: _make_spread_kernel(t, int(k), int(n_outputs)),
    )


def gaussian_spread(queries, keys_t, values_t, centers, lse, exclude_self):
    """``(std, sum_w2)``: the weighted std (n_queries, n_outputs) and sum_j w_ij^2 (n_queries,).

    The twin of :func:`nbattn.kernels.loo.gaussian_spread`, with
    w_ij = exp(s_ij - lse_i): std_ic = S_c sqrt(sum_j w_ij ((v_jc - c_ic) / S_c)^2 / sum_j w_ij)
    and sum_w2 = sum_j w_ij^2 / (sum_j w_ij)^2 (renormalised, as the CPU kernel's),
    S_c a power of two near max_j |v_jc| (dividing by it is exact), so values
    near 1e200 keep their spread. Host or device arrays in (``centers`` and
    ``lse`` as the pool returns them); float64 host arrays out. A query with
    lse = -inf gets std = 0 and sum_w2 = 0.
    """
    host_values_t = values_t if isinstance(values_t, np.ndarray) else values_t.copy_to_host()
    host_centers = centers if isinstance(centers, np.ndarray) else centers.copy_to_host()
    scale = power_of_two_scale(np.abs(host_values_t.astype(np.float64)).max(axis=1))
    device_queries = to_device(queries)
    device_keys_t = to_device(keys_t)
    device_values_t = to_device(
        np.ascontiguousarray(host_values_t / scale[:, None], dtype=host_values_t.dtype)
    )
    device_centers = to_device(
        np.ascontiguousarray(host_centers / scale[None, :], dtype=host_centers.dtype)
    )
    device_lse = _lse_on_device(lse)
    dtype = np.dtype(device_queries.dtype)
    n_queries = device_queries.shape[0]
    k = device_keys_t.shape[0]
    n_outputs = device_values_t.shape[0]
    var = cuda.device_array((n_queries, n_outputs), dtype=np.float64)
    sum_w2 = cuda.device_array(n_queries, dtype=np.float64)
    rows = far.far_rows(lse, dtype)
    device_rows = cuda.to_device(rows.astype(np.int64)) if rows.size else None
    for c0, c1, bk, shared in output_launches(k, n_outputs, dtype.itemsize):
        args = (
            device_queries,
            device_keys_t,
            device_values_t[c0:c1],
            device_centers[:, c0:c1],
            device_lse,
            bool(exclude_self),
            bk,
            var[:, c0:c1],
            sum_w2,
        )
        kernel = spread_kernel(dtype, k, c1 - c0)
        launch(kernel, n_queries, args, shared=shared)
        if rows.size:  # rare: rows whose weights need the far path
            far_args = (*args[:6], device_rows, var[:, c0:c1], sum_w2)
            launch(far_spread_kernel(dtype), rows.size, far_args)
    std = np.sqrt(np.maximum(var.copy_to_host(), 0.0)) * scale[None, :]
    return std, sum_w2.copy_to_host()
