"""The least-squares cross-validation sums of a mixed-type product kernel (CPU), for
:mod:`nbattn.distribution.ls_widths`: per row the log-sums of the convolved kernel
K*K over the other rows and of the kernel itself, with their derivatives in the widths,
without the n x n matrix (the kernel terms of :mod:`nbattn.kernels.local_pairs`).
``dispatch.device.kernels_for("density", "cpu")`` returns :mod:`nbattn.kernels.density`,
which re-exports these kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config
from .._core.local_groups import GAUSSIAN, UNORDERED
from .items import next_item, run_items
from .local_pairs import category_term, dlog_kernel, log_kernel

__all__ = ["category_convolution", "log_convolved_kernel", "ls_conditional_terms", "ls_pair_sums"]

#: Rows per work item (:mod:`nbattn.kernels.items`): each row is a pass over all rows, or
#: over all pairs, so one is work enough, and a small table still fills every thread.
_ROWS = 1


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def log_convolved_kernel(u, kernel):
    """(log (K * K)(u), its derivative in u): the normalised continuous kernel convolved
    with itself, without its constant (``nbattn.distribution.ls_widths.LS_KERNELS``):
    -u^2 / 4 for the Gaussian (the Gaussian of variance 2); for the Epanechnikov kernel
    log((2 - |u|)^3 (u^2 + 6 |u| + 4)) on |u| < 2, -inf outside."""
    if kernel == GAUSSIAN:
        return -0.25 * u * u, -0.5 * u
    a = abs(u)
    if a >= 2.0:
        return -math.inf, 0.0
    b, poly = 2.0 - a, a * a + 6.0 * a + 4.0
    slope = -3.0 / b + (2.0 * a + 6.0) / poly
    return math.log(b * b * b * poly), slope if u >= 0.0 else -slope


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def category_convolution(x, y, params, sums):
    """(log C(x, y), d log C / dt): the categorical kernel convolved with itself over the
    column's codes, C(x, y) = sum_v L(x, v) L(y, v), v = 0 .. c - 1, and its derivative in
    the width parameter t (l = lambda_max sigmoid(t), so dl/dt = l (1 - sigmoid(t))).

    ``params`` = (kind, l, c, 1 - sigmoid(t)). Aitchison-Aitken (unordered):
    C = (1 - l)^2 + l^2 / (c - 1) for equal codes, 2 l (1 - l) / (c - 1) + (c - 2) l^2 /
    (c - 1)^2 otherwise. Wang-van Ryzin (ordered), D = |x - y|, with the geometric sums
    S(m) = sum_{k=1}^{m} l^(2k) of the codes below both and above both (``sums`` (2, c):
    S(m) and l dS/dl per m):

        C = (1 - l)^2 l^D (1 + (max(D - 1, 0) + S(min(x, y)) + S(c - 1 - max(x, y))) / 4).
    """
    kind, lam, count, slope = params[0], params[1], params[2], params[3]
    if kind == UNORDERED:
        if count <= 1.0:
            return 0.0, 0.0
        share = 1.0 / (count - 1.0)
        if x == y:
            value = (1.0 - lam) ** 2 + lam * lam * share
            dvalue = -2.0 * lam * (1.0 - lam) + 2.0 * lam * lam * share
        else:
            rest = (count - 2.0) * lam * lam * share * share
            value = 2.0 * lam * (1.0 - lam) * share + rest
            dvalue = 2.0 * lam * (1.0 - 2.0 * lam) * share + 2.0 * rest
        if value <= 0.0:
            return -math.inf, 0.0
        return math.log(value), slope * dvalue / value
    distance = abs(x - y)
    if lam <= 0.0:
        return (0.0, 0.0) if distance == 0.0 else (-math.inf, 0.0)
    if lam >= 1.0:
        return -math.inf, 0.0
    low, high = int(min(x, y)), int(count - 1.0 - max(x, y))
    q = max(distance - 1.0, 0.0) + sums[0, low] + sums[0, high]
    value = 2.0 * math.log(1.0 - lam) + math.log1p(0.25 * q)
    if distance > 0.0:
        value += distance * math.log(lam)
    dq = sums[1, low] + sums[1, high]
    return value, slope * (-2.0 * lam / (1.0 - lam) + distance + dq / (4.0 + q))


# _kernel_terms, _convolved_terms and _online_add are inlined: called per pair with
# array arguments, they took half of a pass (1-D, n = 300: 8.6 ms called, 4.6 ms inlined).
# The continuous columns' sum and their derivatives are two loops: LLVM vectorises a loop
# that stores (``out``) behind a runtime check of the distance between ``out`` and the
# rows it reads, and a sum in such a loop would take the scalar order or the vector one
# depending on where the arrays were allocated (ARCHITECTURE, "Numerics"). Two loops
# cost the conditional criterion about 3 % (a scratch for the convolved terms, 15 %).
@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _kernel_terms(rows_cont, rows_cat, i, j, c0, c1, k0, k1, cat_params, cat_dparams, kernel, out):
    """The engine's log kernel of rows i and j (no weight, no constants) over the
    continuous columns c0 .. c1 - 1 and the categorical ones k0 .. k1 - 1; its derivatives
    in theta into ``out`` (continuous column c at c, categorical k at dc + k)."""
    dc = rows_cont.shape[1]
    s = 0.0
    for c in range(c0, c1):
        s += log_kernel(rows_cont[j, c] - rows_cont[i, c], kernel)
    for c in range(c0, c1):
        u = rows_cont[j, c] - rows_cont[i, c]
        out[c] = -u * dlog_kernel(u, kernel)
    for k in range(k0, k1):
        x, q = rows_cat[j, k], rows_cat[i, k]
        s += category_term(x, q, cat_params[k, 0], cat_params[k, 1], cat_params[k, 2])
        out[dc + k] = category_term(x, q, cat_dparams[k, 0], cat_dparams[k, 1], cat_dparams[k, 2])
    return s


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _convolved_terms(rows_cont, rows_cat, i, j, c1, k1, conv_params, conv_sums, kernel, out):
    """log of the convolved product kernel of rows i and j without constants over the
    continuous columns 0 .. c1 - 1 and the categorical ones 0 .. k1 - 1; its derivatives
    in theta into ``out`` as :func:`_kernel_terms` (log h: -u (log K*K)'(u))."""
    dc = rows_cont.shape[1]
    s = 0.0
    for c in range(c1):
        s += log_convolved_kernel(rows_cont[j, c] - rows_cont[i, c], kernel)[0]
    for c in range(c1):
        u = rows_cont[j, c] - rows_cont[i, c]
        out[c] = -u * log_convolved_kernel(u, kernel)[1]
    for k in range(k1):
        value, slope = category_convolution(
            rows_cat[i, k], rows_cat[j, k], conv_params[k], conv_sums[k]
        )
        s += value
        out[dc + k] = slope
    return s


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _online_add(s, top, total, means, first, slopes, d):
    """One term exp(s) with score slopes into a running (top, total) and its means
    ``means[first : first + d]`` (unnormalised, rescaled when the maximum grows)."""
    if s > top:
        scale = math.exp(top - s)
        total *= scale
        for g in range(d):
            means[first + g] *= scale
        top = s
    p = math.exp(s - top)
    for g in range(d):
        means[first + g] += p * slopes[g]
    return top, total + p


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _ls_row(i, rows_cont, rows_cat, cat_params, cat_dparams, conv, log_weights, kernel, out):
    """Row i of :func:`ls_pair_sums`: two online softmaxes over the rows."""
    n, dc, dk = rows_cont.shape[0], rows_cont.shape[1], rows_cat.shape[1]
    d = dc + dk
    slopes = np.zeros(d)
    top_c, total_c, top_l, total_l = -math.inf, 0.0, -math.inf, 0.0
    for j in range(n):
        w = log_weights[j]
        if w == -math.inf:
            continue
        s = w + _convolved_terms(
            rows_cont, rows_cat, i, j, dc, dk, conv[0], conv[1], kernel, slopes
        )
        if s > -math.inf:
            top_c, total_c = _online_add(s, top_c, total_c, out[i], 2, slopes, d)
        if j == i:
            continue
        s = w + _kernel_terms(
            rows_cont, rows_cat, i, j, 0, dc, 0, dk, cat_params, cat_dparams, kernel, slopes
        )
        if s > -math.inf:
            top_l, total_l = _online_add(s, top_l, total_l, out[i], 2 + d, slopes, d)
    out[i, 0] = top_c + math.log(total_c) if total_c > 0.0 else -math.inf
    out[i, 1] = top_l + math.log(total_l) if total_l > 0.0 else -math.inf
    for g in range(d):
        out[i, 2 + g] = out[i, 2 + g] / total_c if total_c > 0.0 else 0.0
        out[i, 2 + d + g] = out[i, 2 + d + g] / total_l if total_l > 0.0 else 0.0


def ls_pair_sums(
    rows_cont, rows_cat, cat_params, cat_dparams, conv_params, conv_sums, log_weights, kernel
):
    """The two pair sums of least-squares cross-validation over the training rows (both
    the queries and the keys: ``rows_cont`` (n, dc) divided by their widths, ``rows_cat``
    (n, dk) codes), in log space, with the softmax means of their scores' derivatives;
    one pass over the rows per row, rows in parallel. Returns (n, 2 + 2 d):

    * column 0: log sum_j w_j Kbar(x_i, x_j), the convolved product kernel without
      constants (:func:`_convolved_terms`), the pair (i, i) included: int f^2's terms;
    * column 1: log sum_{j != i} w_j K(x_i, x_j), the engine's kernel without constants:
      the leave-one-out density's (-inf where no other row reaches x_i);
    * columns 2 .. 2 + d and 2 + d .. 2 + 2 d: the softmax means of d log(term) / dtheta
      of each sum, continuous columns first, as :func:`log_sums_and_score_means`.

    ``cat_params``, ``cat_dparams`` as :func:`log_sums_and_score_means`; ``conv_params``
    (dk, 4) and ``conv_sums`` (dk, 2, m) :func:`category_convolution`'s per column.

    Chunks of ``_ROWS`` rows are the work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    d = rows_cont.shape[1] + rows_cat.shape[1]
    out = np.zeros((rows_cont.shape[0], 2 + 2 * d))
    run_items(
        _ls_pair_sums_items,
        rows_cont,
        rows_cat,
        cat_params,
        cat_dparams,
        conv_params,
        conv_sums,
        log_weights,
        kernel,
        out,
    )
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _ls_pair_sums_items(
    counter,
    rows_cont,
    rows_cat,
    cat_params,
    cat_dparams,
    conv_params,
    conv_sums,
    log_weights,
    kernel,
    out,
):
    """The chunks of rows that ``counter`` hands this thread: their rows of ``out``."""
    n = rows_cont.shape[0]
    conv = (conv_params, conv_sums)
    n_chunks = (n + _ROWS - 1) // _ROWS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        for row in range(chunk * _ROWS, min(n, (chunk + 1) * _ROWS)):
            _ls_row(
                np.int64(row),
                rows_cont,
                rows_cat,
                cat_params,
                cat_dparams,
                conv,
                log_weights,
                kernel,
                out,
            )


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _ls_conditional_row(
    row, rows_cont, rows_cat, cat_params, cat_dparams, conv, log_weights, kernel, ny, out
):
    """Row ``row`` of :func:`ls_conditional_terms` (``ny``: y's continuous and categorical
    column counts)."""
    n, dc, dk = rows_cont.shape[0], rows_cont.shape[1], rows_cat.shape[1]
    d, cy, ky = dc + dk, ny[0], ny[1]
    p = np.full(n, -math.inf)
    slopes = np.zeros((n, d))  # d s_x(row, j) / dtheta: x's columns (y's entries stay 0)
    for j in range(n):
        if j != row and log_weights[j] > -math.inf:
            p[j] = log_weights[j] + _kernel_terms(
                rows_cont,
                rows_cat,
                row,
                j,
                cy,
                dc,
                ky,
                dk,
                cat_params,
                cat_dparams,
                kernel,
                slopes[j],
            )
    top = p.max()
    if top == -math.inf:  # no other row reaches x_row: f(y | x_row) has no estimate
        out[row, 0] = math.nan
        out[row, 1] = math.nan
        return
    p = np.exp(p - top)
    p /= p.sum()
    mean = np.zeros(d)
    for j in range(n):
        for g in range(d):
            mean[g] += p[j] * slopes[j, g]
    work = np.zeros(d)
    for j in range(n):  # T2 = sum_j p_j K_y(y_row, y_j)
        if p[j] == 0.0:
            continue
        s = _kernel_terms(
            rows_cont, rows_cat, row, j, 0, cy, 0, ky, cat_params, cat_dparams, kernel, work
        )
        if s == -math.inf:
            continue
        e = p[j] * math.exp(s)
        out[row, 1] += e
        for g in range(d):
            y_column = g < cy or dc <= g < dc + ky
            out[row, 2 + d + g] += e * (work[g] if y_column else slopes[j, g] - mean[g])
    reach = np.zeros(n)  # r_i = sum_j p_j Kbar_y(y_i, y_j); T1 = sum_i p_i r_i
    for i in range(n):
        if p[i] == 0.0:
            continue
        for j in range(i, n):
            if p[j] == 0.0:
                continue
            s = _convolved_terms(rows_cont, rows_cat, i, j, cy, ky, conv[0], conv[1], kernel, work)
            if s == -math.inf:
                continue
            kb = math.exp(s)
            pair = (1.0 if i == j else 2.0) * p[i] * p[j] * kb
            out[row, 0] += pair
            reach[i] += p[j] * kb
            if j != i:
                reach[j] += p[i] * kb
            for g in range(cy):
                out[row, 2 + g] += pair * work[g]
            for g in range(dc, dc + ky):
                out[row, 2 + g] += pair * work[g]
    for g in range(d):  # x's columns: dp_i = p_i (s'_i - mean s')
        total = 0.0
        for i in range(n):
            total += p[i] * reach[i] * slopes[i, g]
        out[row, 2 + g] += 2.0 * (total - mean[g] * out[row, 0])


def ls_conditional_terms(
    rows_cont, rows_cat, cat_params, cat_dparams, conv_params, conv_sums, log_weights, kernel, ny
):
    """The terms of least-squares cross-validation of a conditional density per training
    row l (rows in parallel), and their gradients; the arguments as :func:`ls_pair_sums`,
    the columns of (y, x) with y's first in each kind (``ny`` = (y's continuous, y's
    categorical) column counts). With p_j = softmax_{j != l} of x's scores (the engine's,
    log w_j included), returns (n, 2 + 2 d):

    * column 0: T1 = sum_i sum_j p_i p_j Kbar_y(y_i, y_j) (int f_-l(y | x_l)^2 dy, y's
      convolved kernels without constants: :func:`_convolved_terms`), over pairs i <= j;
    * column 1: T2 = sum_j p_j K_y(y_l, y_j) (f_-l(y_l | x_l), y's kernels without
      constants); NaN in both where no other row reaches x_l;
    * columns 2 .. 2 + d, 2 + d .. 2 + 2 d: dT1 / dtheta, dT2 / dtheta (continuous columns
      first): y's from the kernels, x's from the weights (dp_i = p_i (s'_i - mean s')):
      2 (sum_i p_i r_i s'_i - mean s' T1), r_i = sum_j p_j Kbar_ij, and
      sum_j p_j K_y (s'_j - mean s').

    O(n^2) per row (n^3 in all, as statsmodels' ``imse``), memory O(n d) per row.

    Chunks of ``_ROWS`` rows are the work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    d = rows_cont.shape[1] + rows_cat.shape[1]
    out = np.zeros((rows_cont.shape[0], 2 + 2 * d))
    run_items(
        _ls_conditional_terms_items,
        rows_cont,
        rows_cat,
        cat_params,
        cat_dparams,
        conv_params,
        conv_sums,
        log_weights,
        kernel,
        ny,
        out,
    )
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _ls_conditional_terms_items(
    counter,
    rows_cont,
    rows_cat,
    cat_params,
    cat_dparams,
    conv_params,
    conv_sums,
    log_weights,
    kernel,
    ny,
    out,
):
    """The chunks of rows that ``counter`` hands this thread: their rows of ``out``."""
    n = rows_cont.shape[0]
    conv = (conv_params, conv_sums)
    n_chunks = (n + _ROWS - 1) // _ROWS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        for row in range(chunk * _ROWS, min(n, (chunk + 1) * _ROWS)):
            _ls_conditional_row(
                np.int64(row),
                rows_cont,
                rows_cat,
                cat_params,
                cat_dparams,
                conv,
                log_weights,
                kernel,
                ny,
                out,
            )
