"""Local-polynomial regression with a mixed-type product kernel on the GPU: the twin
of ``nbattn.kernels.local``.

Same contracts, layouts and results as the CPU kernels (their module docstring
has the formulas): float64 throughout, ``q_cont`` (n_q, dc) and ``keys_cont_t``
(dc, n_k) scaled by the widths, ``q_cat`` (n_q, dk) and ``keys_cat_t`` (dk, n_k)
float-coded categories, ``cat_params`` (dk, 3) the terms (a, b, t), ``log_weights``
(n_k,), ``values_t`` (n_out, n_k); ``kernel`` 0 gaussian, 1 epanechnikov,
2 tricube; NaN entries marginalised (term left out) with ``missing``. The score
of a pair is

    s_j = log w_j + sum_c log K(d_jc) + sum_k (a_k if equal else b_k + t_k |q_k - k_jk|)

and the local design x_j = (1, d_j, [d_jc d_jc' for c <= c']) (degree 0, 1, 2).

* ``local_fit(...)``: the first pass, ``(beta, g, shift, log_norm, nearest, mfx)``:
  per query the online-softmax moments M = sum_j w_j x_j x_j^T and
  V = sum_j w_j x_j y_j^T (w_j = exp(s_j - m), m the running maximum, the sums
  rescaled when m grows), then the ridge-stabilised Cholesky solve of
  (M/l + R) [g, beta] = [e_1, V/l] with the CPU's pivot rule (a term whose pivot
  is at most ``config.LOCAL_PIVOT_TOL`` of its diagonal is dropped); a query
  without a key of positive weight gets its nearest admissible key's value
  (``nearest``), log_norm = -inf.
* ``local_loo_gradient(...)``: the second pass, per query the derivative of
  sum_o e_o fit_o with respect to every width parameter (dc + dk,).
* ``local_interval_sums(...)``: the second pass sum_j l_j^2 r_jo^2 with the
  equivalent-kernel weights l_j = p_j (g . x_j).

One thread per query keeps its query row, the categorical terms and its
accumulators (the p (p + 1) / 2 moments, p x n_out right-hand sides) in local
arrays of compile-time size; the block walks the keys in tiles (``block_k``
keys, ``common.tile_rows``) of continuous columns, categorical columns, the log
weight and the values, loaded together into shared memory. The pair's score
and design vector are the one device function ``pair_function``; the solve is
the device function ``solve_function``, written step for step like the CPU's
``_solve`` so that both drop the same terms. Kernels are compiled per (dc, dk,
kernel, degree, missing, outputs per launch[, marginal effects]); at most
``config.CUDA_MAX_OUTPUTS`` outputs run per launch (the moments M, and so g,
do not depend on the outputs; the gradient is a sum over outputs, so each
launch adds its part). The host wrappers take NumPy or device arrays and
return NumPy arrays, as the CPU kernels do.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, from_dtype

from .. import config
from .common import compiled, imin, jit, launch, tile_rows, to_device

__all__ = [
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

#: Continuous kernel codes, the same as ``nbattn.kernels.local`` (the layer rules keep
#: ``cuda/`` from importing it; a test checks that they agree).
GAUSSIAN, EPANECHNIKOV, TRICUBE = 0, 1, 2

#: The tiles' element type (float64: the CPU kernels' one dtype).
_TILE_TYPE = from_dtype(np.dtype(np.float64))


def n_terms(dc, degree):
    """Terms of the local design: 1, 1 + dc, or 1 + dc + dc (dc + 1) / 2."""
    if degree == 0 or dc == 0:
        return 1
    if degree == 1:
        return 1 + dc
    return 1 + dc + dc * (dc + 1) // 2


def _design_rows(dc, degree):
    """Entries of the per-pair design vector: the p terms, and at least 1 + dc (the
    scaled differences, which the degree-0 marginal effects and the gradient read)."""
    return max(n_terms(dc, degree), 1 + dc)


# --------------------------------------------------------------------------- device functions


def _make_dlog_kernel(kernel):
    @jit(device=True, inline=True)
    def dlog_kernel(d):
        """s'(d), the derivative of log K(d) (0 outside a compact support)."""
        if kernel == GAUSSIAN:
            return -d
        if kernel == EPANECHNIKOV:
            d2 = d * d
            if d2 >= 1.0:
                return 0.0
            return -2.0 * d / (1.0 - d2)
        a = abs(d)
        a3 = a * a * a
        if a3 >= 1.0:
            return 0.0
        return -9.0 * d * a / (1.0 - a3)

    return dlog_kernel


def _make_pair(dc, dk, kernel, degree, missing):
    p = n_terms(dc, degree)
    weight_row = dc + dk
    minus_inf = -math.inf

    @jit(device=True, inline=True)
    def pair_score(tile, block_k, jj, q_cont_row, q_cat_row, cat, x):
        """The score s_j of the key in column ``jj`` of the tile, and its design vector.

        Tile rows: 0..dc-1 the scaled continuous columns, dc..dc+dk-1 the
        categorical codes, dc+dk the log weight. ``cat`` (dk, 3) holds (a, b, t)
        per categorical column (``cat_params``). Fills x[0] = 1, x[1 + c] = d_jc (0 where
        missing) and, for degree 2, the products d_jc d_jc' (c <= c').
        """
        s = tile[weight_row * block_k + jj]
        if kernel == GAUSSIAN:
            for c in range(dc):
                d = tile[c * block_k + jj] - q_cont_row[c]
                if missing and d != d:  # missing on either side: the term is left out
                    d = 0.0
                x[1 + c] = d
                s -= 0.5 * d * d
        elif dc > 0:
            # compact kernels: the product in the linear domain, one log per pair
            prod = 1.0
            for c in range(dc):
                d = tile[c * block_k + jj] - q_cont_row[c]
                if missing and d != d:
                    d = 0.0
                x[1 + c] = d
                if kernel == EPANECHNIKOV:
                    f = 1.0 - d * d
                else:
                    a = abs(d)
                    f = 1.0 - a * a * a
                    f = f * f * f
                prod *= f if f > 0.0 else 0.0
            s += math.log(prod) if prod > 0.0 else minus_inf
        for k in range(dk):
            qk = q_cat_row[k]
            if missing and qk != qk:
                continue
            xk = tile[(dc + k) * block_k + jj]
            if xk == qk:
                s += cat[k, 0]
            elif xk == xk:  # not missing
                if cat[k, 2] == 0.0:
                    s += cat[k, 1]
                else:
                    # |x - q| >= 1 where codes differ, so t = -inf (l = 0) never meets 0
                    gap = abs(xk - qk)
                    s += cat[k, 1] + cat[k, 2] * (gap if gap > 1.0 else 1.0)
        x[0] = 1.0
        if degree >= 2 and p > 1:
            t = 1 + dc
            for c in range(dc):
                for c2 in range(c, dc):
                    x[t] = x[1 + c] * x[1 + c2]
                    t += 1
        return s

    return pair_score


def pair_function(dc, dk, kernel, degree, missing):
    """The device function ``pair_score`` for these compile-time sizes and flags."""
    key = ("local_pair", int(dc), int(dk), int(kernel), int(degree), bool(missing))
    return compiled(
        key, lambda: _make_pair(int(dc), int(dk), int(kernel), int(degree), bool(missing))
    )


def _make_solve(p, n_out):
    pivot_tol = float(config.LOCAL_PIVOT_TOL)

    @jit(device=True)
    def solve(moments, rhs, ridge, i, g, beta):
        """Solve (M + ridge diag(0, M_11, ...)) [g, beta] = [e_1, rhs] for query i.

        ``moments`` (p, p) symmetric and ``rhs`` (p, n_out) are normalised by l;
        writes g[i, :] and beta[i, :, :]. Cholesky with the CPU's pivot rule: a
        pivot not above ``config.LOCAL_PIVOT_TOL`` (read when compiled) of its
        (ridged) diagonal, or a zero diagonal, drops its term (coefficient 0).
        """
        a = cuda.local.array((p, p), dtype=np.float64)
        keep = cuda.local.array(p, dtype=np.int32)
        z = cuda.local.array(p, dtype=np.float64)
        for t in range(p):
            for u in range(p):
                a[t, u] = moments[t, u]
        for t in range(1, p):
            a[t, t] += ridge * a[t, t]
        for t in range(p):
            keep[t] = 1
            for u in range(t):
                if keep[u] == 0:
                    continue
                a[t, t] -= a[t, u] * a[t, u]
            diag_scale = moments[t, t] * (1.0 + ridge)
            if not (a[t, t] > pivot_tol * diag_scale) or not (diag_scale > 0.0):
                keep[t] = 0
                for v in range(t, p):
                    a[v, t] = 0.0
                continue
            a[t, t] = math.sqrt(a[t, t])
            for v in range(t + 1, p):
                acc = a[v, t]
                for u in range(t):
                    acc -= a[v, u] * a[t, u]
                a[v, t] = acc / a[t, t]
        for col in range(n_out + 1):
            for t in range(p):
                z[t] = 0.0
            for t in range(p):
                if keep[t] == 0:
                    continue
                if col == 0:
                    acc = 1.0 if t == 0 else 0.0
                else:
                    acc = rhs[t, col - 1]
                for u in range(t):
                    acc -= a[t, u] * z[u]
                z[t] = acc / a[t, t]
            for t in range(p - 1, -1, -1):
                if keep[t] == 0:
                    z[t] = 0.0
                    continue
                acc = z[t]
                for u in range(t + 1, p):
                    acc -= a[u, t] * z[u]
                z[t] = acc / a[t, t]
            if col == 0:
                for t in range(p):
                    g[i, t] = z[t]
            else:
                for t in range(p):
                    beta[i, t, col - 1] = z[t]

    return solve


def solve_function(p, n_out):
    """The device function ``solve`` for p terms and n_out outputs."""
    return compiled(("local_solve", int(p), int(n_out)), lambda: _make_solve(int(p), int(n_out)))


@jit(device=True, inline=True)
def load_tile(tile, block_k, j0, nb, keys_cont_t, keys_cat_t, log_weights, values_t):
    """Keys j0:j0 + nb into the tile: continuous rows, categorical rows, the log
    weight, then the values (or residuals) rows; consecutive threads on
    consecutive keys (coalesced). The caller synchronises."""
    dc = keys_cont_t.shape[0]
    dk = keys_cat_t.shape[0]
    for jj in range(cuda.threadIdx.x, nb, cuda.blockDim.x):
        for f in range(dc):
            tile[f * block_k + jj] = keys_cont_t[f, j0 + jj]
        for f in range(dk):
            tile[(dc + f) * block_k + jj] = keys_cat_t[f, j0 + jj]
        tile[(dc + dk) * block_k + jj] = log_weights[j0 + jj]
        for f in range(values_t.shape[0]):
            tile[(dc + dk + 1 + f) * block_k + jj] = values_t[f, j0 + jj]


@jit(device=True)
def nearest_key(i, q_cont, keys_cont_t, q_cat, keys_cat_t, log_weights, exclude_self):
    """The admissible key nearest query i: fewest unequal categories, then the
    smallest sum of squared scaled differences (missing entries ignored), the
    first on ties; -1 when no key is admissible. A rare path: global reads."""
    n_k = log_weights.shape[0]
    best = -1
    best_mis = math.inf
    best_dist = math.inf
    for j in range(n_k):
        if log_weights[j] == -math.inf or (exclude_self and j == i):
            continue
        mis = 0.0
        for k in range(keys_cat_t.shape[0]):
            xk = keys_cat_t[k, j]
            qk = q_cat[i, k]
            if xk == xk and qk == qk and xk != qk:
                mis += 1.0
        dist = 0.0
        for c in range(keys_cont_t.shape[0]):
            d = keys_cont_t[c, j] - q_cont[i, c]
            if d == d:
                dist += d * d
        if mis < best_mis or (mis == best_mis and dist < best_dist):
            best = j
            best_mis = mis
            best_dist = dist
    return best


def _query_state(dc, dk):
    """The device function that loads a thread's query row (compile-time sizes: the
    row stays in registers; the categorical terms, the same for every thread, are
    read from global memory, where all threads of a warp share one load)."""

    @jit(device=True, inline=True)
    def load_query(i, active, q_cont, q_cat, q_cont_row, q_cat_row):
        for c in range(dc):
            q_cont_row[c] = q_cont[i, c] if active else 0.0
        for k in range(dk):
            q_cat_row[k] = q_cat[i, k] if active else 0.0

    return load_query


# --------------------------------------------------------------------------- first pass


def _make_fit_kernel(dc, dk, kernel, degree, missing, n_out, do_mfx):
    p = n_terms(dc, degree)
    n_design = _design_rows(dc, degree)
    dc1, dk1 = max(dc, 1), max(dk, 1)  # local arrays need a positive size
    value_row = dc + dk + 1
    pair_score = pair_function(dc, dk, kernel, degree, missing)
    solve = solve_function(p, n_out)
    dlog_kernel = _make_dlog_kernel(kernel)
    load_query = _query_state(dc, dk)
    minus_inf = -math.inf

    @jit
    def local_fit_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        log_weights,
        values_t,
        exclude_self,
        ridge,
        block_k,
        beta,
        g,
        shift,
        log_norm,
        nearest,
        mfx,
    ):
        """The first pass for query i = this thread (see the module docstring)."""
        tile = cuda.shared.array(0, dtype=_TILE_TYPE)  # (dc + dk + 1 + n_out) x block_k
        i = cuda.grid(1)
        active = i < q_cont.shape[0]
        q_cont_row = cuda.local.array(dc1, dtype=np.float64)
        q_cat_row = cuda.local.array(dk1, dtype=np.float64)
        load_query(i, active, q_cont, q_cat, q_cont_row, q_cat_row)
        x = cuda.local.array(n_design, dtype=np.float64)
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
        for t in range(n_design):
            x[t] = 0.0
        m = minus_inf
        own = i if exclude_self else -1
        n_k = log_weights.shape[0]
        for j0 in range(0, n_k, block_k):
            nb = imin(block_k, n_k - j0)
            load_tile(tile, block_k, j0, nb, keys_cont_t, keys_cat_t, log_weights, values_t)
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    if j0 + jj == own:
                        continue
                    s = pair_score(tile, block_k, jj, q_cont_row, q_cat_row, cat_params, x)
                    if s == minus_inf:
                        continue
                    if s > m:
                        if m > minus_inf:
                            factor = math.exp(m - s)
                            for a in range(p):
                                for b in range(a, p):
                                    moments[a, b] *= factor
                                for o in range(n_out):
                                    rhs[a, o] *= factor
                            if do_mfx:
                                for c in range(dc):
                                    dsum[c] *= factor
                                    for o in range(n_out):
                                        dysum[c, o] *= factor
                        m = s
                    w = math.exp(s - m)
                    for a in range(p):
                        wa = w * x[a]
                        for b in range(a, p):
                            moments[a, b] += wa * x[b]
                        for o in range(n_out):
                            rhs[a, o] += wa * tile[(value_row + o) * block_k + jj]
                    if do_mfx:
                        for c in range(dc):
                            wd = -dlog_kernel(x[1 + c]) * w
                            dsum[c] += wd
                            for o in range(n_out):
                                dysum[c, o] += wd * tile[(value_row + o) * block_k + jj]
            cuda.syncthreads()
        if not active:
            return
        total = moments[0, 0]
        for c in range(dc):
            for o in range(n_out):
                mfx[i, c, o] = 0.0
        if not (total > 0.0):
            near = nearest_key(i, q_cont, keys_cont_t, q_cat, keys_cat_t, log_weights, own >= 0)
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


def fit_kernel(dc, dk, kernel, degree, missing, n_out, do_mfx):
    """The compiled first-pass kernel for these compile-time sizes and flags."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(n_out), bool(do_mfx))
    return compiled(("local_fit", *args), lambda: _make_fit_kernel(*args))


def _device_inputs(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights):
    return tuple(
        to_device(np.ascontiguousarray(a, dtype=np.float64) if isinstance(a, np.ndarray) else a)
        for a in (q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights)
    )


def _host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def _output_ranges(n_out):
    per_launch = max(1, int(config.CUDA_MAX_OUTPUTS))
    return [(c0, min(n_out, c0 + per_launch)) for c0 in range(0, n_out, per_launch)]


def _tile_floats(dc, dk, n_out):
    return dc + dk + 1 + n_out


def local_fit(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    values_t,
    kernel,
    degree,
    exclude_self,
    missing,
    ridge,
    want_mfx,
):
    """The first pass on the GPU: the twin of :func:`nbattn.kernels.local.local_fit`.

    Returns NumPy arrays, as the CPU kernel:

    beta : (n_q, p, n_out)   coefficients in scaled units (beta[:, 0] is the fit)
    g : (n_q, p)             (M/l + R)^-1 e_1, the equivalent-kernel vector
    shift : (n_q,)           the running maximum m of the scores
    log_norm : (n_q,)        log l = log sum_j exp(s_j - m); -inf when the fit fell back
    nearest : (n_q,) int64   the fallback key, else -1
    mfx : (n_q, dc, n_out)   with ``want_mfx`` and degree 0 (p = 1, dc > 0):
                             d fit / d q = sum_j p_j (y_j - fit) ds_j/dq; zeros otherwise
    """
    inputs = _device_inputs(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights)
    device_values_t = to_device(values_t)
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
        return beta, g, shift, log_norm, nearest, mfx
    device_g = cuda.device_array((n_q, p), dtype=np.float64)
    device_shift = cuda.device_array(n_q, dtype=np.float64)
    device_log_norm = cuda.device_array(n_q, dtype=np.float64)
    device_nearest = cuda.device_array(n_q, dtype=np.int64)
    for c0, c1 in _output_ranges(n_out):
        per_key = _tile_floats(dc, dk, c1 - c0)
        block_k = tile_rows(per_key, 8)
        device_beta = cuda.device_array((n_q, p, c1 - c0), dtype=np.float64)
        device_mfx = cuda.device_array((n_q, max(dc, 1), c1 - c0), dtype=np.float64)
        kernel_fn = fit_kernel(dc, dk, kernel, degree, missing, c1 - c0, do_mfx)
        args = (
            *inputs,
            device_values_t[c0:c1],
            bool(exclude_self),
            float(ridge),
            block_k,
            device_beta,
            device_g,
            device_shift,
            device_log_norm,
            device_nearest,
            device_mfx,
        )
        launch(kernel_fn, n_q, args, shared=per_key * block_k * 8)
        beta[:, :, c0:c1] = device_beta.copy_to_host()
        if do_mfx:
            mfx[:, :, c0:c1] = device_mfx.copy_to_host()[:, :dc]
    g = device_g.copy_to_host()
    shift = device_shift.copy_to_host()
    log_norm = device_log_norm.copy_to_host()
    nearest = device_nearest.copy_to_host()
    return beta, g, shift, log_norm, nearest, mfx


# --------------------------------------------------------------------------- second passes


def _make_interval_kernel(dc, dk, kernel, degree, missing, n_out):
    p = n_terms(dc, degree)
    n_design = _design_rows(dc, degree)
    dc1, dk1 = max(dc, 1), max(dk, 1)
    value_row = dc + dk + 1
    pair_score = pair_function(dc, dk, kernel, degree, missing)
    load_query = _query_state(dc, dk)
    minus_inf = -math.inf

    @jit
    def local_interval_sums_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        log_weights,
        residuals_t,
        exclude_self,
        g,
        shift,
        log_norm,
        nearest,
        block_k,
        out,
    ):
        """out[i, o] = sum_j l_j^2 r_jo^2, l_j = exp(s_j - shift_i - log_norm_i) (g_i . x_j);
        a query that fell back gets its nearest key's r^2 (weight 1)."""
        tile = cuda.shared.array(0, dtype=_TILE_TYPE)  # (dc + dk + 1 + n_out) x block_k
        i = cuda.grid(1)
        in_range = i < q_cont.shape[0]
        q_cont_row = cuda.local.array(dc1, dtype=np.float64)
        q_cat_row = cuda.local.array(dk1, dtype=np.float64)
        load_query(i, in_range, q_cont, q_cat, q_cont_row, q_cat_row)
        x = cuda.local.array(n_design, dtype=np.float64)
        g_row = cuda.local.array(p, dtype=np.float64)
        acc = cuda.local.array(n_out, dtype=np.float64)
        for t in range(n_design):
            x[t] = 0.0
        for o in range(n_out):
            acc[o] = 0.0
        active = False
        offset = 0.0
        if in_range:
            active = log_norm[i] != minus_inf
            offset = shift[i] + log_norm[i]
        for t in range(p):
            g_row[t] = g[i, t] if in_range else 0.0
        own = i if exclude_self else -1
        n_k = log_weights.shape[0]
        for j0 in range(0, n_k, block_k):
            nb = imin(block_k, n_k - j0)
            load_tile(tile, block_k, j0, nb, keys_cont_t, keys_cat_t, log_weights, residuals_t)
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    if j0 + jj == own:
                        continue
                    s = pair_score(tile, block_k, jj, q_cont_row, q_cat_row, cat_params, x)
                    if s == minus_inf:
                        continue
                    cj = 0.0
                    for t in range(p):
                        cj += g_row[t] * x[t]
                    lj = math.exp(s - offset) * cj
                    l2 = lj * lj
                    for o in range(n_out):
                        r = tile[(value_row + o) * block_k + jj]
                        acc[o] += l2 * r * r
            cuda.syncthreads()
        if not in_range:
            return
        if active:
            for o in range(n_out):
                out[i, o] = acc[o]
            return
        near = nearest[i]
        for o in range(n_out):
            if near >= 0:
                r = residuals_t[o, near]
                out[i, o] = r * r
            else:
                out[i, o] = 0.0

    return local_interval_sums_kernel


def interval_kernel(dc, dk, kernel, degree, missing, n_out):
    """The compiled interval-sums kernel for these compile-time sizes and flags."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(n_out))
    return compiled(("local_interval", *args), lambda: _make_interval_kernel(*args))


def local_interval_sums(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    residuals_t,
    kernel,
    degree,
    exclude_self,
    missing,
    g,
    shift,
    log_norm,
    nearest,
):
    """Per query and output sum_j l_j^2 r_jo^2 on the GPU: the twin of
    :func:`nbattn.kernels.local.local_interval_sums` (``g``, ``shift``,
    ``log_norm``, ``nearest`` from :func:`local_fit`). Returns (n_q, n_out) NumPy."""
    inputs = _device_inputs(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights)
    device_r_t = to_device(residuals_t)
    n_q, dc = inputs[0].shape
    dk = inputs[2].shape[1]
    n_out = device_r_t.shape[0]
    out = np.zeros((n_q, n_out))
    if n_q == 0 or n_out == 0:
        return out
    state = [
        to_device(np.ascontiguousarray(_host(a), dtype=t))
        for a, t in ((g, np.float64), (shift, np.float64), (log_norm, np.float64))
    ]
    device_nearest = to_device(np.ascontiguousarray(_host(nearest), dtype=np.int64))
    for c0, c1 in _output_ranges(n_out):
        per_key = _tile_floats(dc, dk, c1 - c0)
        block_k = tile_rows(per_key, 8)
        device_out = cuda.device_array((n_q, c1 - c0), dtype=np.float64)
        kernel_fn = interval_kernel(dc, dk, kernel, degree, missing, c1 - c0)
        args = (
            *inputs,
            device_r_t[c0:c1],
            bool(exclude_self),
            *state,
            device_nearest,
            block_k,
            device_out,
        )
        launch(kernel_fn, n_q, args, shared=per_key * block_k * 8)
        out[:, c0:c1] = device_out.copy_to_host()
    return out


def _make_gradient_kernel(dc, dk, kernel, degree, missing, n_out):
    p = n_terms(dc, degree)
    n_design = _design_rows(dc, degree)
    dc1, dk1 = max(dc, 1), max(dk, 1)
    n_par = dc + dk
    n_par1 = max(n_par, 1)
    value_row = dc + dk + 1
    pair_score = pair_function(dc, dk, kernel, degree, missing)
    dlog_kernel = _make_dlog_kernel(kernel)
    load_query = _query_state(dc, dk)
    minus_inf = -math.inf

    @jit
    def local_loo_gradient_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        cat_dparams,
        log_weights,
        values_t,
        exclude_self,
        ridge,
        beta,
        g,
        shift,
        log_norm,
        out_weights,
        block_k,
        out,
    ):
        """Adds this launch's outputs' part of d (sum_o e_o fit_o) / d theta to out[i]:
        a_t - (sum_j coef_j) s_t with coef_j = p_j sum_o e_o [c_j r_jo - ridge
        sum_{t>=1} g_t beta_to x_jt^2], a_t = sum_j coef_j ds_jt, s_t = sum_j p_j ds_jt."""
        tile = cuda.shared.array(0, dtype=_TILE_TYPE)  # (dc + dk + 1 + n_out) x block_k
        i = cuda.grid(1)
        in_range = i < q_cont.shape[0]
        q_cont_row = cuda.local.array(dc1, dtype=np.float64)
        q_cat_row = cuda.local.array(dk1, dtype=np.float64)
        load_query(i, in_range, q_cont, q_cat, q_cont_row, q_cat_row)
        x = cuda.local.array(n_design, dtype=np.float64)
        g_row = cuda.local.array(p, dtype=np.float64)
        beta_row = cuda.local.array((p, n_out), dtype=np.float64)
        e_row = cuda.local.array(n_out, dtype=np.float64)
        a_sum = cuda.local.array(n_par1, dtype=np.float64)
        s_sum = cuda.local.array(n_par1, dtype=np.float64)
        for t in range(n_design):
            x[t] = 0.0
        for t in range(n_par1):
            a_sum[t] = 0.0
            s_sum[t] = 0.0
        active = False
        offset = 0.0
        if in_range:
            active = log_norm[i] != minus_inf
            offset = shift[i] + log_norm[i]
        for t in range(p):
            g_row[t] = g[i, t] if in_range else 0.0
            for o in range(n_out):
                beta_row[t, o] = beta[i, t, o] if in_range else 0.0
        for o in range(n_out):
            e_row[o] = out_weights[i, o] if in_range else 0.0
        a_total = 0.0
        own = i if exclude_self else -1
        n_k = log_weights.shape[0]
        for j0 in range(0, n_k, block_k):
            nb = imin(block_k, n_k - j0)
            load_tile(tile, block_k, j0, nb, keys_cont_t, keys_cat_t, log_weights, values_t)
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    if j0 + jj == own:
                        continue
                    s = pair_score(tile, block_k, jj, q_cont_row, q_cat_row, cat_params, x)
                    if s == minus_inf:  # weight 0: contributes nothing
                        continue
                    w = math.exp(s - offset)
                    cj = 0.0
                    for t in range(p):
                        cj += g_row[t] * x[t]
                    total = 0.0
                    for o in range(n_out):
                        e = e_row[o]
                        if e == 0.0:
                            continue
                        fit = 0.0
                        pen = 0.0
                        for t in range(p):
                            xt = x[t]
                            fit += beta_row[t, o] * xt
                            if t >= 1:
                                pen += g_row[t] * beta_row[t, o] * xt * xt
                        y = tile[(value_row + o) * block_k + jj]
                        total += e * (cj * (y - fit) - ridge * pen)
                    coef = w * total
                    a_total += coef
                    for c in range(dc):
                        if missing and q_cont_row[c] != q_cont_row[c]:
                            continue
                        d = x[1 + c]
                        ds = -d * dlog_kernel(d)
                        a_sum[c] += coef * ds
                        s_sum[c] += w * ds
                    for k in range(dk):
                        qk = q_cat_row[k]
                        if missing and qk != qk:
                            continue
                        xk = tile[(dc + k) * block_k + jj]
                        if xk == qk:
                            ds = cat_dparams[k, 0]
                        elif xk == xk:
                            ds = cat_dparams[k, 1] + cat_dparams[k, 2] * abs(xk - qk)
                        else:
                            ds = 0.0
                        a_sum[dc + k] += coef * ds
                        s_sum[dc + k] += w * ds
            cuda.syncthreads()
        if active:
            for t in range(n_par):
                out[i, t] += a_sum[t] - a_total * s_sum[t]

    return local_loo_gradient_kernel


def gradient_kernel(dc, dk, kernel, degree, missing, n_out):
    """The compiled LOO-gradient kernel for these compile-time sizes and flags."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(n_out))
    return compiled(("local_gradient", *args), lambda: _make_gradient_kernel(*args))


def local_loo_gradient(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    values_t,
    cat_dparams,
    kernel,
    degree,
    exclude_self,
    missing,
    ridge,
    beta,
    g,
    shift,
    log_norm,
    out_weights,
):
    """Per query d (sum_o e_o fit_o) / d theta on the GPU: the twin of
    :func:`nbattn.kernels.local.local_loo_gradient` (theta = log widths of the
    continuous columns, then one parameter per categorical column; ``beta``,
    ``g``, ``shift``, ``log_norm`` from :func:`local_fit`, ``out_weights`` the
    e_o (n_q, n_out)). Queries that fell back (log_norm = -inf) get 0.
    Returns (n_q, dc + dk) NumPy."""
    inputs = _device_inputs(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights)
    device_dparams = to_device(np.ascontiguousarray(_host(cat_dparams), dtype=np.float64))
    device_values_t = to_device(values_t)
    n_q, dc = inputs[0].shape
    dk = inputs[2].shape[1]
    n_out = device_values_t.shape[0]
    if n_q == 0 or n_out == 0 or dc + dk == 0:
        return np.zeros((n_q, dc + dk))
    host_beta = np.ascontiguousarray(_host(beta), dtype=np.float64)
    host_e = np.ascontiguousarray(_host(out_weights), dtype=np.float64)
    device_g, device_shift, device_log_norm = (
        to_device(np.ascontiguousarray(_host(a), dtype=np.float64)) for a in (g, shift, log_norm)
    )
    device_out = cuda.to_device(np.zeros((n_q, dc + dk)))
    for c0, c1 in _output_ranges(n_out):
        per_key = _tile_floats(dc, dk, c1 - c0)
        block_k = tile_rows(per_key, 8)
        kernel_fn = gradient_kernel(dc, dk, kernel, degree, missing, c1 - c0)
        args = (
            inputs[0],
            inputs[1],
            inputs[2],
            inputs[3],
            inputs[4],
            device_dparams,
            inputs[5],
            device_values_t[c0:c1],
            bool(exclude_self),
            float(ridge),
            to_device(np.ascontiguousarray(host_beta[:, :, c0:c1])),
            device_g,
            device_shift,
            device_log_norm,
            to_device(np.ascontiguousarray(host_e[:, c0:c1])),
            block_k,
            device_out,
        )
        launch(kernel_fn, n_q, args, shared=per_key * block_k * 8)
    return device_out.copy_to_host()
