"""Local-polynomial regression with a mixed-type product kernel on the GPU: the twin
of ``nbattn.kernels.local``.

Same contracts, layouts and results as the CPU kernels (their module docstring
has the formulas): float64 throughout, the same argument groups
(``_core.local_groups``: ``LocalData`` with ``q_cont`` (n_q, dc) and ``keys_cont_t``
(dc, n_k) scaled by the widths, ``q_cat`` (n_q, dk) and ``keys_cat_t`` (dk, n_k)
float-coded categories, ``log_weights`` (n_k,), and the stretches of
nearest-neighbour widths ``q_stretch`` (n_q, dc) or ``keys_stretch_t`` (dc, n_k), the
kernel's argument r d_jc, ``local_pairs``; ``LocalModel`` with
``cat_params`` (dk, 3) the terms (a, b, t), ``kernel`` 0 gaussian,
1 epanechnikov, 2 tricube, the degree, the ridge, ``exclude_self`` and
``missing``: NaN entries marginalised, their term left out). The score of a
pair is

    s_j = log w_j + sum_c log K(d_jc) + sum_k (a_k if equal else b_k + t_k |q_k - k_jk|)

and the local design x_j = (1, d_j, [d_jc d_jc' for c <= c']) (degree 0, 1, 2).

* ``local_fit(data, model, values_t, want_mfx, leaves)``: the first pass, a ``LocalFit``
  (beta, g, shift, log_norm, nearest, mfx): per query the online-softmax
  moments M = sum_j w_j x_j x_j^T and V = sum_j w_j x_j y_j^T (w_j = exp(s_j - m),
  m the running maximum, the sums rescaled when m grows), then the
  ridge-stabilised Cholesky solve of (M/l + R) [g, beta] = [e_1, V/l] with the
  CPU's pivot rule (a term whose pivot is at most ``config.LOCAL_PIVOT_TOL`` of
  its diagonal is dropped); a query without a key of positive weight gets its
  nearest admissible key's value (``nearest``), log_norm = -inf.
* ``local_loo_gradient(data, model, fit, values_t, cat_dparams, out_weights, leaves)``
  (``local_passes``): the second pass, per query the derivative of
  sum_o e_o fit_o with respect to every width parameter (dc + dk,).
* ``local_interval_sums(data, model, fit, residuals_t)`` (``local_passes``): the
  second pass sum_j l_j^2 r_jo^2 with the equivalent-kernel weights
  l_j = p_j (g . x_j).

One thread per query keeps its query row, the categorical terms and its
accumulators (the p (p + 1) / 2 moments, p x n_out right-hand sides) in local
arrays of compile-time size; the block walks the keys in tiles (``block_k``
keys, ``common.tile_rows``) of continuous columns, categorical columns, the log
weight and the values, loaded together into shared memory. By algorithm, as on
the CPU: ``local_pairs`` (the pair's score and design vector, ``pair_function``;
each thread's walk over the keys, ``key_walk_function``, which the three kernels
share: each gives it its per-pair work), ``local_moments`` (the moment sums, the
fit's per-pair work, and the solve,
``solve_function``, written step for step like the CPU's ``solve`` so that both
drop the same terms), ``local_passes`` (the second passes). Kernels are compiled
per (dc, dk, kernel, degree, missing, outputs per launch[, marginal effects], stretch
kind); at
most ``config.CUDA_MAX_OUTPUTS`` outputs run per launch (the moments M, and so
g, do not depend on the outputs; the gradient is a sum over outputs, so each
launch adds its part). The host wrappers take the groups with NumPy or device
arrays and return NumPy arrays, as the CPU kernels do; the launched kernels take
the arrays one by one (the PTX catalogue, ``scripts/ptx.py``, compiles each from
an explicit signature of flat arrays, and each launch passes its own slice of the
outputs).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .._core.local_groups import (
    EPANECHNIKOV,
    GAUSSIAN,
    KERNEL_CODES,
    TRICUBE,
    LocalData,
    LocalFit,
    LocalModel,
    n_terms,
)
from .common import compiled, jit, launch, tile_rows, to_device
from .local_args import device_inputs, key_runs, stretch_kind
from .local_moments import moments_function, solve_function
from .local_pairs import (
    NO_STRETCH,
    key_walk_function,
    nearest_key,
    output_ranges,
    pair_function,
    tile_floats,
)
from .local_passes import gradient_kernel, interval_kernel, local_interval_sums, local_loo_gradient

__all__ = [
    "EPANECHNIKOV",
    "GAUSSIAN",
    "KERNEL_CODES",
    "TRICUBE",
    "LocalData",
    "LocalFit",
    "LocalModel",
    "fit_kernel",
    "gradient_kernel",
    "interval_kernel",
    "local_fit",
    "local_interval_sums",
    "local_loo_gradient",
    "n_terms",
    "pair_function",
    "solve_function",
]


def _make_fit_kernel(dc, dk, kernel, degree, missing, n_out, do_mfx, stretch):
    p = n_terms(dc, degree)
    dc1 = max(dc, 1)  # local arrays need a positive size
    add_pair = moments_function(p, n_out, dc, dk, kernel, do_mfx)
    walk_keys = key_walk_function(dc, dk, kernel, degree, missing, add_pair, stretch)
    solve = solve_function(p, n_out)
    minus_inf = -math.inf

    @jit
    def local_fit_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        log_weights,
        q_stretch,
        keys_stretch_t,
        values_t,
        exclude_self,
        ridge,
        block_k,
        block_table,
        key_ranges,
        beta,
        g,
        shift,
        log_norm,
        nearest,
        mfx,
    ):
        """The first pass for query i = this thread (see the module docstring)."""
        i = cuda.grid(1)
        active = i < q_cont.shape[0]
        moments = cuda.local.array((p, p), dtype=np.float64)
        rhs = cuda.local.array((p, n_out), dtype=np.float64)
        dsum = cuda.local.array(dc1, dtype=np.float64)
        dysum = cuda.local.array((dc1, n_out), dtype=np.float64)
        for a in range(p):
            for b in range(p):
                moments[a, b] = 0.0
            for o in range(n_out):
                rhs[a, o] = 0.0
        for c in range(dc1):
            dsum[c] = 0.0
            for o in range(n_out):
                dysum[c, o] = 0.0
        inputs = (q_cont, keys_cont_t, q_cat, keys_cat_t)
        inputs = (*inputs, cat_params, log_weights, q_stretch, keys_stretch_t)
        sums = (moments, rhs, dsum, dysum)
        runs = (block_table, key_ranges)
        m = walk_keys(i, active, exclude_self, inputs, values_t, block_k, runs, sums, minus_inf)
        if not active:
            return
        total = moments[0, 0]
        for c in range(dc):
            for o in range(n_out):
                mfx[i, c, o] = 0.0
        if not (total > 0.0):
            near = nearest_key(i, q_cont, keys_cont_t, q_cat, keys_cat_t, log_weights, exclude_self)
            nearest[i] = near
            shift[i] = minus_inf
            log_norm[i] = minus_inf
            for t in range(p):
                g[i, t] = 0.0
                for o in range(n_out):
                    beta[i, t, o] = 0.0
            if near >= 0:
                g[i, 0] = 1.0
                for o in range(n_out):
                    beta[i, 0, o] = values_t[o, near]
            return
        inv = 1.0 / total
        for a in range(p):
            for b in range(a, p):
                moments[b, a] = moments[a, b] * inv
                moments[a, b] = moments[b, a]
            for o in range(n_out):
                rhs[a, o] *= inv
        solve(moments, rhs, ridge, i, g, beta)
        shift[i] = m
        log_norm[i] = math.log(total)
        nearest[i] = -1
        if do_mfx:
            for c in range(dc):
                for o in range(n_out):
                    mfx[i, c, o] = (dysum[c, o] - beta[i, 0, o] * dsum[c]) * inv

    return local_fit_kernel


def fit_kernel(dc, dk, kernel, degree, missing, n_out, do_mfx, stretch=NO_STRETCH):
    """The compiled first-pass kernel for these compile-time sizes and flags
    (``stretch``: ``local_pairs.NO_STRETCH``, ``QUERY_STRETCH`` or ``KEY_STRETCH``)."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(n_out), bool(do_mfx))
    args += (int(stretch),)
    return compiled(("local_fit", *args), lambda: _make_fit_kernel(*args))


def local_fit(data, model, values_t, want_mfx, leaves=None):
    """The first pass on the GPU: the twin of :func:`nbattn.kernels.local.local_fit`.

    ``data`` (``LocalData``) and ``model`` (``LocalModel``) with NumPy or device
    arrays, ``values_t`` (n_out, n_k); ``leaves``: None or ``AllKeys`` (every key), or
    the ``BlockRuns`` of pruned leaves (``nbattn.local.leaves.TreeLayout.leaves_on``:
    each block of queries visits its runs of keys; the queries in the k-d order they
    were bounded in). Returns a ``LocalFit`` of NumPy arrays, as the CPU kernel:

    beta : (n_q, p, n_out)   coefficients in scaled units (beta[:, 0] is the fit)
    g : (n_q, p)             (M/l + R)^-1 e_1, the equivalent-kernel vector
    shift : (n_q,)           the running maximum m of the scores
    log_norm : (n_q,)        log l = log sum_j exp(s_j - m); -inf when the fit fell back
    nearest : (n_q,) int64   the fallback key, else -1
    mfx : (n_q, dc, n_out)   with ``want_mfx`` and degree 0 (p = 1, dc > 0):
                             d fit / d q = sum_j p_j (y_j - fit) ds_j/dq; zeros otherwise
    """
    inputs = device_inputs(data, model)
    stretch = stretch_kind(inputs)
    device_values_t = to_device(values_t)
    kernel, degree, missing = model.kernel, model.degree, model.missing
    n_q, dc = inputs[0].shape
    dk = inputs[2].shape[1]
    n_out = device_values_t.shape[0]
    p = n_terms(dc, degree)
    do_mfx = bool(want_mfx) and p == 1 and dc > 0
    beta = np.zeros((n_q, p, n_out))
    g = np.zeros((n_q, p))
    shift = np.full(n_q, -np.inf)
    log_norm = np.full(n_q, -np.inf)
    nearest = np.full(n_q, -1, dtype=np.int64)
    mfx = np.zeros((n_q, dc, n_out))
    if n_q == 0 or n_out == 0:
        return LocalFit(beta, g, shift, log_norm, nearest, mfx)
    device_g = cuda.device_array((n_q, p), dtype=np.float64)
    device_shift = cuda.device_array(n_q, dtype=np.float64)
    device_log_norm = cuda.device_array(n_q, dtype=np.float64)
    device_nearest = cuda.device_array(n_q, dtype=np.int64)
    threads, runs = key_runs(leaves, n_q, inputs[5].shape[0])
    for c0, c1 in output_ranges(n_out):
        per_key = tile_floats(dc, dk, c1 - c0, stretch)
        block_k = tile_rows(per_key, 8)
        device_beta = cuda.device_array((n_q, p, c1 - c0), dtype=np.float64)
        device_mfx = cuda.device_array((n_q, max(dc, 1), c1 - c0), dtype=np.float64)
        kernel_fn = fit_kernel(dc, dk, kernel, degree, missing, c1 - c0, do_mfx, stretch)
        args = (
            *inputs,
            device_values_t[c0:c1],
            bool(model.exclude_self),
            float(model.ridge),
            block_k,
            *runs,
            device_beta,
            device_g,
            device_shift,
            device_log_norm,
            device_nearest,
            device_mfx,
        )
        launch(kernel_fn, n_q, args, shared=per_key * block_k * 8, threads=threads)
        beta[:, :, c0:c1] = device_beta.copy_to_host()
        if do_mfx:
            mfx[:, :, c0:c1] = device_mfx.copy_to_host()[:, :dc]
    g = device_g.copy_to_host()
    shift = device_shift.copy_to_host()
    log_norm = device_log_norm.copy_to_host()
    nearest = device_nearest.copy_to_host()
    return LocalFit(beta, g, shift, log_norm, nearest, mfx)
