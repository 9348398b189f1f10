"""The second passes of the local-polynomial fit on the GPU: the width gradient and
the interval sums.

The twin of ``nbattn.kernels.local_passes`` (its docstring and
``nbattn.kernels.local``'s have the formulas). Each thread takes one query, sets
itself up as the first pass does (``local_pairs``: the query row, the tile of
keys, and the first pass's state g, shift + log_norm), recomputes each pair's
score and design and adds p_j = exp(s_j - shift - log_norm) times its terms.
``local_interval_sums`` and ``local_loo_gradient`` take the argument groups
(``_core.local_groups``) and the first pass's ``LocalFit``; the launched kernels take
the arrays one by one, as the first pass's do (``nbattn.cuda.local``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .._core.local_groups import n_terms
from .common import compiled, jit, launch, tile_rows, to_device
from .local_args import device_inputs, host_array, key_runs, stretch_kind
from .local_pairs import (
    NO_STRETCH,
    category_term,
    clear,
    dlog_kernel_function,
    key_walk_function,
    output_ranges,
    pass_state_function,
    tile_floats,
)


def _make_interval_kernel(dc, dk, kernel, degree, missing, n_out, stretch):
    p = n_terms(dc, degree)
    value_row = dc + dk + 1  # the residuals' first row in the tile (``load_tile``)
    load_pass_state = pass_state_function(p)

    @jit(device=True, inline=True)
    def add_squared_weight(s, carry, x, tile, block_k, jj, q_cont_row, q_cat_row, state):
        """acc_o += l_j^2 r_jo^2 with l_j = exp(s_j - offset) (g . x_j); ``state`` is
        (g_row, offset, acc) (the visitor of ``local_pairs.key_walk_function``)."""
        g_row, offset, acc = state
        cj = 0.0
        for t in range(p):
            cj += g_row[t] * x[t]
        lj = math.exp(s - offset) * cj
        l2 = lj * lj
        for o in range(n_out):
            r = tile[(value_row + o) * block_k + jj]
            acc[o] += l2 * r * r
        return carry

    walk_keys = key_walk_function(dc, dk, kernel, degree, missing, add_squared_weight, stretch)

    @jit
    def local_interval_sums_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        log_weights,
        q_stretch,
        keys_stretch_t,
        residuals_t,
        exclude_self,
        g,
        shift,
        log_norm,
        nearest,
        block_k,
        block_table,
        key_ranges,
        out,
    ):
        """out[i, o] = sum_j l_j^2 r_jo^2, l_j = exp(s_j - shift_i - log_norm_i) (g_i . x_j);
        a query that fell back gets its nearest key's r^2 (weight 1)."""
        i = cuda.grid(1)
        in_range = i < q_cont.shape[0]
        g_row = cuda.local.array(p, dtype=np.float64)
        acc = cuda.local.array(n_out, dtype=np.float64)
        clear(acc)
        active, offset = load_pass_state(i, in_range, g, shift, log_norm, g_row)
        inputs = (q_cont, keys_cont_t, q_cat, keys_cat_t)
        inputs = (*inputs, cat_params, log_weights, q_stretch, keys_stretch_t)
        runs = (block_table, key_ranges)
        state = (g_row, offset, acc)
        walk_keys(i, active, exclude_self, inputs, residuals_t, block_k, runs, state, 0.0)
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


def interval_kernel(dc, dk, kernel, degree, missing, n_out, stretch=NO_STRETCH):
    """The compiled interval-sums kernel for these compile-time sizes and flags."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(n_out), int(stretch))
    return compiled(("local_interval", *args), lambda: _make_interval_kernel(*args))


def local_interval_sums(data, model, fit, residuals_t):
    """Per query and output sum_j l_j^2 r_jo^2 on the GPU: the twin of
    :func:`nbattn.kernels.local.local_interval_sums` (``fit`` from
    :func:`nbattn.cuda.local.local_fit`: its ``g``, ``shift``, ``log_norm`` and
    ``nearest``). Returns (n_q, n_out) NumPy."""
    inputs = device_inputs(data, model)
    stretch = stretch_kind(inputs)
    device_r_t = to_device(residuals_t)
    n_q, dc = inputs[0].shape
    dk = inputs[2].shape[1]
    n_out = device_r_t.shape[0]
    out = np.zeros((n_q, n_out))
    if n_q == 0 or n_out == 0:
        return out
    state = [to_device(host_array(a)) for a in (fit.g, fit.shift, fit.log_norm)]
    device_nearest = to_device(host_array(fit.nearest, np.int64))
    threads, runs = key_runs(None, n_q, inputs[5].shape[0])
    for c0, c1 in output_ranges(n_out):
        per_key = tile_floats(dc, dk, c1 - c0, stretch)
        block_k = tile_rows(per_key, 8)
        device_out = cuda.device_array((n_q, c1 - c0), dtype=np.float64)
        flags = (model.kernel, model.degree, model.missing, c1 - c0, stretch)
        kernel_fn = interval_kernel(dc, dk, *flags)
        args = (
            *inputs,
            device_r_t[c0:c1],
            bool(model.exclude_self),
            *state,
            device_nearest,
            block_k,
            *runs,
            device_out,
        )
        launch(kernel_fn, n_q, args, shared=per_key * block_k * 8, threads=threads)
        out[:, c0:c1] = device_out.copy_to_host()
    return out


def _make_gradient_kernel(dc, dk, kernel, degree, missing, n_out, stretch):
    p = n_terms(dc, degree)
    n_par1 = max(dc + dk, 1)  # local arrays need a positive size
    value_row = dc + dk + 1  # the values' first row in the tile (``load_tile``)
    dlog_kernel = dlog_kernel_function(kernel)
    load_pass_state = pass_state_function(p)

    @jit(device=True, inline=True)
    def add_gradient_terms(s, a_total, x, tile, block_k, jj, q_cont_row, q_cat_row, state):
        """Adds the pair's coef_j ds_jt to a_sum and p_j ds_jt to s_sum; returns
        a_total + coef_j. ``state`` is (g_row, beta_row, e_row, offset, ridge,
        cat_dparams, a_sum, s_sum) (the visitor of ``local_pairs.key_walk_function``)."""
        g_row, beta_row, e_row, offset, ridge, cat_dparams, a_sum, s_sum = state
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
            ds = category_term(xk, qk, cat_dparams[k, 0], cat_dparams[k, 1], cat_dparams[k, 2])
            a_sum[dc + k] += coef * ds
            s_sum[dc + k] += w * ds
        return a_total + coef

    walk_keys = key_walk_function(dc, dk, kernel, degree, missing, add_gradient_terms, stretch)

    @jit
    def local_loo_gradient_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        cat_dparams,
        log_weights,
        q_stretch,
        keys_stretch_t,
        values_t,
        exclude_self,
        ridge,
        beta,
        g,
        shift,
        log_norm,
        out_weights,
        block_k,
        block_table,
        key_ranges,
        out,
    ):
        """Adds this launch's outputs' part of d (sum_o e_o fit_o) / d theta to out[i]:
        a_t - (sum_j coef_j) s_t with coef_j = p_j sum_o e_o [c_j r_jo - ridge
        sum_{t>=1} g_t beta_to x_jt^2], a_t = sum_j coef_j ds_jt, s_t = sum_j p_j ds_jt."""
        i = cuda.grid(1)
        in_range = i < q_cont.shape[0]
        g_row = cuda.local.array(p, dtype=np.float64)
        beta_row = cuda.local.array((p, n_out), dtype=np.float64)
        e_row = cuda.local.array(n_out, dtype=np.float64)
        a_sum = cuda.local.array(n_par1, dtype=np.float64)
        s_sum = cuda.local.array(n_par1, dtype=np.float64)
        clear(a_sum)
        clear(s_sum)
        active, offset = load_pass_state(i, in_range, g, shift, log_norm, g_row)
        for t in range(p):
            for o in range(n_out):
                beta_row[t, o] = beta[i, t, o] if in_range else 0.0
        for o in range(n_out):
            e_row[o] = out_weights[i, o] if in_range else 0.0
        inputs = (q_cont, keys_cont_t, q_cat, keys_cat_t)
        inputs = (*inputs, cat_params, log_weights, q_stretch, keys_stretch_t)
        state = (g_row, beta_row, e_row, offset, ridge, cat_dparams, a_sum, s_sum)
        runs = (block_table, key_ranges)
        a_total = walk_keys(i, active, exclude_self, inputs, values_t, block_k, runs, state, 0.0)
        if active:
            for t in range(dc + dk):
                out[i, t] += a_sum[t] - a_total * s_sum[t]

    return local_loo_gradient_kernel


def gradient_kernel(dc, dk, kernel, degree, missing, n_out, stretch=NO_STRETCH):
    """The compiled LOO-gradient kernel for these compile-time sizes and flags."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(n_out), int(stretch))
    return compiled(("local_gradient", *args), lambda: _make_gradient_kernel(*args))


def local_loo_gradient(data, model, fit, values_t, cat_dparams, out_weights, leaves=None):
    """Per query d (sum_o e_o fit_o) / d theta on the GPU: the twin of
    :func:`nbattn.kernels.local.local_loo_gradient` (theta = log widths of the
    continuous columns, then one parameter per categorical column; ``fit`` from
    :func:`nbattn.cuda.local.local_fit`, its ``beta``, ``g``, ``shift`` and
    ``log_norm``; ``out_weights`` the e_o (n_q, n_out)). Queries that fell back
    (log_norm = -inf) get 0; ``leaves`` as in ``local_fit`` (the first pass's: the
    derivative of the pruned sums). Returns (n_q, dc + dk) NumPy."""
    inputs = device_inputs(data, model)
    stretch = stretch_kind(inputs)
    device_dparams = to_device(host_array(cat_dparams))
    device_values_t = to_device(values_t)
    n_q, dc = inputs[0].shape
    dk = inputs[2].shape[1]
    n_out = device_values_t.shape[0]
    if n_q == 0 or n_out == 0 or dc + dk == 0:
        return np.zeros((n_q, dc + dk))
    host_beta = host_array(fit.beta)
    host_e = host_array(out_weights)
    device_g, device_shift, device_log_norm = (
        to_device(host_array(a)) for a in (fit.g, fit.shift, fit.log_norm)
    )
    device_out = cuda.to_device(np.zeros((n_q, dc + dk)))
    threads, runs = key_runs(leaves, n_q, inputs[5].shape[0])
    for c0, c1 in output_ranges(n_out):
        per_key = tile_floats(dc, dk, c1 - c0, stretch)
        block_k = tile_rows(per_key, 8)
        flags = (model.kernel, model.degree, model.missing, c1 - c0, stretch)
        kernel_fn = gradient_kernel(dc, dk, *flags)
        args = (
            inputs[0],
            inputs[1],
            inputs[2],
            inputs[3],
            inputs[4],
            device_dparams,
            inputs[5],
            inputs[6],
            inputs[7],
            device_values_t[c0:c1],
            bool(model.exclude_self),
            float(model.ridge),
            to_device(np.ascontiguousarray(host_beta[:, :, c0:c1])),
            device_g,
            device_shift,
            device_log_norm,
            to_device(np.ascontiguousarray(host_e[:, c0:c1])),
            block_k,
            *runs,
            device_out,
        )
        launch(kernel_fn, n_q, args, shared=per_key * block_k * 8, threads=threads)
    return device_out.copy_to_host()
