"""The second passes of the local-polynomial fit (CPU): the width gradient and the interval sums.

Both walk the keys again with the first pass's state (``LocalFit``: the
running maximum ``shift``, ``log_norm`` = log l and g = (M/l + R)^-1 e_1) and
recompute each pair's normalised weight and design,

    p_j = exp(s_j - shift - log_norm),    l_j = p_j (g . x_j)

(l_j the equivalent-kernel weight: fit = sum_j l_j y_j), so nothing of size
queries x keys is held (except by ``local_equivalent_weights``, whose result is
that matrix). ``local_loo_gradient`` feeds the width search
(``nbattn.local.widths``), ``local_interval_sums`` the sandwich variance of
``nbattn.local.engine.local_prediction_interval``, ``local_equivalent_weights``
the estimators' ``attention_weights``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .fastmath import fast_exp
from .items import next_item, run_items
from .local_leaves import chunk_runs
from .local_pairs import (
    block_scratch,
    category_term,
    dlog_kernel,
    one_pass_for,
    pair_scores,
    problem_shape,
    problem_sizes,
)

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def block_weights(one_pass, i, j0, nb, data, model, fit, weighted, scores, design):
    """The normalised weights p_j = exp(s_j - shift_i - log_norm_i) of keys j0 .. j0+nb-1
    for query i into ``scores`` and their design rows into ``design``
    (``local_pairs.pair_scores``, ``one_pass`` its ``one_pass_for``); returns nb, or 0
    when no key of the block is admissible (nothing to add)."""
    # the design rows are stored (np.bool_, not the literal True: numba would compile
    # block_scores once more for a literal argument)
    store_design = np.bool_(True)
    block_max = pair_scores(
        one_pass, i, j0, nb, data, model, weighted, store_design, scores, design
    )
    if block_max == -np.inf:
        return 0
    offset = fit.shift[i] + fit.log_norm[i]
    for j in range(nb):
        scores[j] = fast_exp(scores[j] - offset)
    return nb


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def equivalent_coefficients(g_row, design, nb, cvec):
    """``cvec[j] <- c_j = g . x_j`` for the block's ``nb`` keys (x_j0 = 1; ``design`` the
    block's design rows): the equivalent-kernel coefficient of each key."""
    p = g_row.shape[0]
    for j in range(nb):
        cvec[j] = g_row[0]
    for t in range(1, p):
        gt = g_row[t]
        xt = design[t]
        for j in range(nb):
            cvec[j] += gt * xt[j]


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def fitted_and_penalty(b, g_row, design, nb, fitted, pen):
    """``fitted[j] <- b . x_j`` and ``pen[j] <- sum_{t>=1} g_t b_t x_jt^2`` for the block's
    ``nb`` keys (``b`` (p,) one output's coefficients): the local fit at each key and the
    ridge's term of the width gradient."""
    p = g_row.shape[0]
    b0 = b[0]
    for j in range(nb):
        fitted[j] = b0
        pen[j] = 0.0
    for t in range(1, p):
        bt = b[t]
        gbt = g_row[t] * bt
        xt = design[t]
        for j in range(nb):
            fitted[j] += bt * xt[j]
            pen[j] += gbt * xt[j] * xt[j]


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def add_continuous_derivative_sums(i, nb, data, model, coef, scores, design, a_sum, s_sum):
    """``a_sum[c] += sum_j coef_j ds_jc`` and ``s_sum[c] += sum_j p_j ds_jc`` over the
    block's keys for every continuous column c of query i, ds_jc = -d_jc s'(d_jc) the
    score's derivative with respect to log h_c (``scores`` holds the p_j)."""
    for c in range(data.keys_cont_t.shape[0]):
        qc = data.q_cont[i, c]
        if model.missing and qc != qc:
            continue
        row = design[1 + c]
        acc_a = 0.0
        acc_s = 0.0
        for j in range(nb):
            d = row[j]
            ds = -d * dlog_kernel(d, model.kernel)
            acc_a += coef[j] * ds
            acc_s += scores[j] * ds
        a_sum[c] += acc_a
        s_sum[c] += acc_s


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def add_categorical_derivative_sums(
    i, j0, nb, data, model, cat_dparams, coef, scores, a_sum, s_sum
):  # fmt: skip
    """The same sums for every categorical column k of query i (after the dc continuous
    ones in ``a_sum``, ``s_sum``), ds_jk the column's term with the derivatives
    ``cat_dparams[k]`` of its parameters (``category_term``)."""
    dc = data.keys_cont_t.shape[0]
    for k in range(data.keys_cat_t.shape[0]):
        qk = data.q_cat[i, k]
        if model.missing and qk != qk:
            continue
        dparams = cat_dparams[k]  # the score's term, derived (category_term)
        acc_a = 0.0
        acc_s = 0.0
        # a slice from index 0: numba drops the wraparound select of keys_cat_t[k, j0 + j]
        keys_k = data.keys_cat_t[k, j0 : j0 + nb]
        for j in range(nb):
            x = keys_k[j]
            ds = category_term(x, qk, dparams[0], dparams[1], dparams[2])
            acc_a += coef[j] * ds
            acc_s += scores[j] * ds
        a_sum[dc + k] += acc_a
        s_sum[dc + k] += acc_s


def local_loo_gradient(data, model, fit, values_t, cat_dparams, out_weights, leaves):
    """The second pass: per query sum_o e_o d fit_o / d theta for every width parameter.

    theta = (log h_1 .. log h_dc, t_1 .. t_dk): log widths of the continuous
    columns, then one parameter per categorical column whose score terms have
    the derivatives ``cat_dparams[k] = (da, db, dt)`` (``nbattn.kernels.local``'s
    docstring has a, b, t). With p_j the normalised weights, x_j the design, c_j = g . x_j,
    r_jo = y_jo - beta_o . x_j and ds_j the score's derivative,

        d fit_o = sum_j dp_j [c_j r_jo - ridge sum_{t>=1} g_t beta_to x_jt^2],
        dp_j    = p_j (ds_j - sum_k p_k ds_k)

    (the derivative of (M/l + R)^-1 V/l, R the relative ridge). Queries that fell
    back to their nearest key (log_norm = -inf) have zero derivative. ``leaves``
    (``LocalLeaves``): the keys each query visits, the first pass's
    (``nbattn.kernels.local_leaves``): the derivative of the pruned sums.
    Returns (n_q, dc + dk).
    """
    n_q, dc, dk = data.q_cont.shape[0], data.keys_cont_t.shape[0], data.keys_cat_t.shape[0]
    out = np.zeros((n_q, dc + dk))
    # without categorical columns their derivative code is not compiled (None: rule 4)
    cat_dparams = cat_dparams if dk else None
    run_items(
        _gradient_items, data, model, fit, values_t, cat_dparams, out_weights, out, leaves,
        one_pass_for(data, model),
    )  # fmt: skip
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _gradient_items(
    counter, data, model, fit, values_t, cat_dparams, out_weights, out, leaves, one_pass
):  # fmt: skip
    """The chunks of queries that ``counter`` hands this thread: their rows of ``out``
    (``one_pass``: ``local_pairs.one_pass_for``'s)."""
    weighted = problem_sizes(data)[4]
    ridge = model.ridge
    beta, g, log_norm = fit.beta, fit.g, fit.log_norm
    n_q, dc, dk, n_k = problem_shape(data)
    n_out = values_t.shape[0]
    p = beta.shape[1]
    n_par = dc + dk
    n_chunks = leaves.query_start.shape[0] - 1
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        scores, design = block_scratch(p, dc)
        coef = np.zeros(_KEY_BLOCK)
        cvec = np.zeros(_KEY_BLOCK)
        fitted = np.zeros(_KEY_BLOCK)
        pen = np.zeros(_KEY_BLOCK)
        a_sum = np.zeros(n_par)
        s_sum = np.zeros(n_par)
        # the chunk's queries (neighbours in k-d order when pruned) visit the same keys
        first, stop, runs, n_runs = chunk_runs(chunk, data, model, leaves)
        for i in range(first, stop):
            if log_norm[i] == -np.inf:
                continue
            a_sum[:] = 0.0
            s_sum[:] = 0.0
            a_total = 0.0
            for r in range(n_runs):
                for j0 in range(runs[r, 0], runs[r, 1], _KEY_BLOCK):
                    nb = min(_KEY_BLOCK, runs[r, 1] - j0)
                    nb = block_weights(one_pass, i, j0, nb, data, model, fit, weighted, scores,
                                       design)  # fmt: skip
                    # coef_j = p_j sum_o e_o [c_j r_jo - ridge sum_t g_t beta_to x_jt^2]
                    equivalent_coefficients(g[i], design, nb, cvec)
                    for j in range(nb):
                        coef[j] = 0.0
                    for o in range(n_out):
                        e = out_weights[i, o]
                        if e == 0.0:
                            continue
                        y = values_t[o, j0 : j0 + nb]
                        fitted_and_penalty(beta[i, :, o], g[i], design, nb, fitted, pen)
                        for j in range(nb):
                            coef[j] += e * (cvec[j] * (y[j] - fitted[j]) - ridge * pen[j])
                    for j in range(nb):
                        coef[j] *= scores[j]
                        a_total += coef[j]
                    add_continuous_derivative_sums(i, nb, data, model, coef, scores, design,
                                                   a_sum, s_sum)  # fmt: skip
                    if cat_dparams is not None:
                        add_categorical_derivative_sums(i, j0, nb, data, model, cat_dparams,
                                                        coef, scores, a_sum, s_sum)  # fmt: skip
            for t in range(n_par):
                out[i, t] = a_sum[t] - a_total * s_sum[t]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def block_equivalent_weights(g_i, design, nb, weights):
    """``weights[j] <- l_j = p_j (g_i . x_j)`` for the block's ``nb`` keys, from their
    normalised weights p_j (``block_weights``) and design rows x_j: the equivalent-kernel
    weights of the local fit at one query (fit(q) = sum_j l_j y_j)."""
    p = g_i.shape[0]
    for j in range(nb):
        cj = g_i[0]
        for t in range(1, p):
            cj += g_i[t] * design[t, j]
        weights[j] *= cj


def local_interval_sums(data, model, fit, residuals_t):
    """Per query and output sum_j l_j^2 r_jo^2, with l_j = p_j (g . x_j) the
    equivalent-kernel weights of the first pass ``fit`` (the nearest key's weight is 1
    for a query that fell back). ``residuals_t`` (n_out, n_k). Returns (n_q, n_out).
    """
    out = np.zeros((data.q_cont.shape[0], residuals_t.shape[0]))
    run_items(_interval_items, data, model, fit, residuals_t, out, one_pass_for(data, model))
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _interval_items(counter, data, model, fit, residuals_t, out, one_pass):
    """The chunks of queries that ``counter`` hands this thread: their rows of ``out``."""
    weighted = problem_sizes(data)[4]
    g, log_norm, nearest = fit.g, fit.log_norm, fit.nearest
    n_q, dc, _, n_k = problem_shape(data)
    n_out = residuals_t.shape[0]
    p = g.shape[1]
    n_chunks = (n_q + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        scores, design = block_scratch(p, dc)
        stop = min(n_q, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            if log_norm[i] == -np.inf:
                near = nearest[i]
                if near >= 0:
                    for o in range(n_out):
                        out[i, o] = residuals_t[o, near] ** 2
                continue
            for j0 in range(0, n_k, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_k - j0)
                nb = block_weights(one_pass, i, j0, nb, data, model, fit, weighted, scores, design)
                block_equivalent_weights(g[i], design, nb, scores)
                for j in range(nb):
                    scores[j] *= scores[j]
                for o in range(n_out):
                    r = residuals_t[o, j0 : j0 + nb]
                    acc = 0.0
                    for j in range(nb):
                        acc += scores[j] * r[j] * r[j]
                    out[i, o] += acc


def local_equivalent_weights(data, model, fit):
    """The equivalent-kernel weights l_j(q) = p_j (g . x_j) of the first pass ``fit``
    (the rows of the hat matrix: fit(q) = sum_j l_j(q) y_j; negative where the local
    polynomial extrapolates), (n_q, n_k). A query that fell back to its nearest key
    has weight 1 there and 0 elsewhere; a query with no admissible key a row of zeros.
    """
    out = np.zeros((data.q_cont.shape[0], data.log_weights.shape[0]))
    run_items(_equivalent_items, data, model, fit, out, one_pass_for(data, model))
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _equivalent_items(counter, data, model, fit, out, one_pass):
    """The chunks of queries that ``counter`` hands this thread: their rows of ``out``."""
    weighted = problem_sizes(data)[4]
    g, log_norm, nearest = fit.g, fit.log_norm, fit.nearest
    n_q, dc, _, n_k = problem_shape(data)
    p = g.shape[1]
    n_chunks = (n_q + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        scores, design = block_scratch(p, dc)
        stop = min(n_q, (chunk + 1) * _QUERY_BLOCK)
        for i in range(chunk * _QUERY_BLOCK, stop):
            if log_norm[i] == -np.inf:
                if nearest[i] >= 0:
                    out[i, nearest[i]] = 1.0
                continue
            for j0 in range(0, n_k, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_k - j0)
                nb = block_weights(one_pass, i, j0, nb, data, model, fit, weighted, scores, design)
                block_equivalent_weights(g[i], design, nb, scores)
                row = out[i, j0 : j0 + nb]
                for j in range(nb):  # not a slice assignment: see kernels/flash.py
                    row[j] = scores[j]
