"""Distribution functions of a mixed-type product kernel (CPU): joint and conditional.

For a query q and keys k_j with weights w_j the kernel estimate of the joint CDF is

    F(q) = sum_j w_j prod_c G((q_c - k_jc) / h_c) prod_k C_k(q_k, k_jk) / sum_j w_j

over the continuous columns c (the caller passes them already centred and divided by
their widths) and the categorical columns k. G is the integrated continuous kernel (the
kernels of ``nbattn.kernels.local``, normalised to integrate to 1):

    gaussian      G(z) = Phi(z)
    epanechnikov  G(z) = (1 + z)^2 (2 - z) / 4                   on [-1, 1]
    tricube       G(z) = 1/2 + sign(z) 70/81 (a - 3a^4/4 + 3a^7/7 - a^10/10),  a = |z| <= 1

and C_k sums the column's kernel over the categories 0 .. Q, Q = min(floor(q_k), c_k - 1)
(statsmodels' convention, for unordered columns too: their CDF follows the code order).
With l the column's smoothing and x the key's code, Aitchison-Aitken (unordered) gives
(1 - l) [x <= Q] + (m - [x <= Q]) l / (c - 1), m = Q + 1 categories, and Wang-van Ryzin
(ordered), summing the geometric tails in closed form,

    x <= Q:  (1 - l) + l (1 - l^x) / 2 + l (1 - l^(Q - x)) / 2
    x >  Q:  l^(x - Q) (1 - l^(Q + 1)) / 2.

The sum runs in log space (an online log-sum-exp per query, as every pooling here),
each factor's logarithm taken directly, or for the Gaussian as -x^2 / 2 in the score and
a factor that cannot underflow (``nbattn.kernels.normal``: Phi without erfc or a
logarithm per pair, in loops the compiler vectorises), so a CDF far below every key is
its true tiny value, not 0 from an underflowed product. Returns log F (-inf where F is
0). The quantiles' mixtures run in linear space with the same vectorisable Phi.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config
from .._core.local_groups import (
    EPANECHNIKOV,
    GAUSSIAN,
    QUANTILE_MAX_STEPS,
    QUANTILE_ULPS,
    UNORDERED,
)
from .fastmath import fast_exp, fmax
from .items import next_item, run_items
from .local_pairs import category_term, dlog_kernel, log_kernel
from .normal import normal_cdf, normal_cdf_parts

__all__ = [
    "QUANTILE_WEIGHT_FLOOR",
    "conditional_quantile_roots",
    "category_convolution",
    "integrated_kernel",
    "log_convolved_kernel",
    "ls_conditional_terms",
    "ls_pair_sums",
    "log_sums_and_score_means",
    "log_category_cdf",
    "pair_score",
    "log_integrated_kernel",
    "log_kernel",
    "log_kernel_sums",
]

#: Keys per block of the gradient pass: their scores in a buffer small enough for L1.
SCORE_BLOCK = 256
#: Queries per work item (:mod:`nbattn.kernels.items`): a query costs one pass over the keys.
_ROWS = 8

_LOG_HALF = math.log(0.5)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _log_normal_cdf(z):
    """log Phi(z) to about 1e-14 relative everywhere: erfc while Phi(z) is a normal
    float64, then the asymptotic series of Mills' ratio (5 terms: below z = -37 the next
    one is under 1e-13)."""
    if z > -37.0:
        return math.log(0.5 * math.erfc(-z / math.sqrt(2.0)))
    r = 1.0 / (z * z)
    series = 1.0 - r * (1.0 - 3.0 * r * (1.0 - 5.0 * r * (1.0 - 7.0 * r)))
    return -0.5 * z * z - math.log(-z) - _HALF_LOG_2PI + math.log(series)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def log_integrated_kernel(z, kernel):
    """log G(z), the integrated continuous kernel (module docstring)."""
    if kernel == GAUSSIAN:
        return _log_normal_cdf(z)
    if z <= -1.0:
        return -math.inf
    if z >= 1.0:
        return 0.0
    if kernel == EPANECHNIKOV:
        return math.log((1.0 + z) * (1.0 + z) * (2.0 - z) * 0.25)
    a = abs(z)
    a3 = a * a * a
    half_mass = (70.0 / 81.0) * a * (1.0 - a3 * (0.75 - a3 * (3.0 / 7.0 - 0.1 * a3)))
    value = 0.5 + half_mass if z >= 0.0 else 0.5 - half_mass
    return math.log(value) if value > 0.0 else -math.inf


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def log_category_cdf(q, x, kind, lam, count):
    """log C(q, x): the categorical kernel of a key's code x summed over the codes
    0 .. min(floor(q), count - 1) (module docstring)."""
    if q < 0.0:
        return -math.inf
    top = min(math.floor(q), count - 1.0)
    below = x <= top
    if kind == UNORDERED:
        m = top + 1.0
        if count <= 1.0:
            return 0.0
        share = lam / (count - 1.0)
        value = (1.0 - lam) + (m - 1.0) * share if below else m * share
    elif below:
        value = (1.0 - lam) + 0.5 * lam * (1.0 - lam**x) + 0.5 * lam * (1.0 - lam ** (top - x))
    else:
        value = 0.5 * lam ** (x - top) * (1.0 - lam ** (top + 1.0))
    return math.log(value) if value > 0.0 else -math.inf


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def pair_score(i, j, q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights, kernel):
    """The engine's score of query i and key j (``nbattn.kernels.local``): log w_j, the
    continuous kernels' logs without their constants and the categorical terms
    (``category_term`` of ``cat_params``)."""
    s = log_weights[j]
    for c in range(keys_cont_t.shape[0]):
        s += log_kernel(keys_cont_t[c, j] - q_cont[i, c], kernel)
    for k in range(keys_cat_t.shape[0]):
        s += category_term(
            keys_cat_t[k, j], q_cat[i, k], cat_params[k, 0], cat_params[k, 1], cat_params[k, 2]
        )
    return s


def log_kernel_sums(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cont_integrated,
    cat_integrated,
    cat_params,
    cat_kind,
    cat_lambda,
    cat_count,
    log_weights,
    kernel,
):
    """log sum_j w_j prod_c A_c prod_k B_k per query (n_q,), each factor the column's
    integrated kernel (G, C_k of the module docstring) where its flag in
    ``cont_integrated`` (dc,) / ``cat_integrated`` (dk,) is set, else its kernel
    (K without constant; L_k as the engine's term of ``cat_params``): the joint CDF with
    every flag set, the numerator of a conditional CDF with the flags of the response's
    columns alone.

    ``q_cont`` (n_q, dc) and ``keys_cont_t`` (dc, n_k): continuous columns divided by
    their widths (same centre); ``q_cat`` (n_q, dk) and ``keys_cat_t`` (dk, n_k):
    category codes; ``cat_kind`` (dk,) int64 ``UNORDERED``/``ORDERED``, ``cat_lambda``
    (dk,) the smoothing, ``cat_count`` (dk,) the number of categories; ``log_weights``
    (n_k,) log w_j (-inf leaves a key out); ``kernel`` the continuous kernel's code.

    One online log-sum-exp per query over blocks of ``SCORE_BLOCK`` keys: a block's
    scores and linear factors first, then their weights. An integrated Gaussian column
    adds the exponent of ``nbattn.kernels.normal.normal_cdf_parts`` to the score (-x^2 / 2
    below the key) and multiplies its factor (R(x), or Phi in [1/2, 1]) into the key's
    value, so the common case (Gaussian kernels, continuous columns) runs in loops the
    compiler vectorises, with no logarithm or erfc per pair, and stays exact in the far
    lower tail (the factor never underflows); the compact kernels and the categorical
    columns add their logarithms to the score, one pair at a time.

    Chunks of ``_ROWS`` rows are the work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    out = np.empty(q_cont.shape[0])
    run_items(
        _log_kernel_sums_items,
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cont_integrated,
        cat_integrated,
        cat_params,
        cat_kind,
        cat_lambda,
        cat_count,
        log_weights,
        kernel,
        out,
    )
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _log_kernel_sums_items(
    counter,
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cont_integrated,
    cat_integrated,
    cat_params,
    cat_kind,
    cat_lambda,
    cat_count,
    log_weights,
    kernel,
    out,
):
    """The chunks of rows that ``counter`` hands this thread: their rows of ``out``."""
    n_q = q_cont.shape[0]
    n_chunks = (n_q + _ROWS - 1) // _ROWS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        for i in range(chunk * _ROWS, min(n_q, (chunk + 1) * _ROWS)):
            out[i] = _log_kernel_sums_row(
                np.int64(i),
                q_cont,
                keys_cont_t,
                q_cat,
                keys_cat_t,
                cont_integrated,
                cat_integrated,
                cat_params,
                cat_kind,
                cat_lambda,
                cat_count,
                log_weights,
                kernel,
            )


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _log_kernel_sums_row(
    i,
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cont_integrated,
    cat_integrated,
    cat_params,
    cat_kind,
    cat_lambda,
    cat_count,
    log_weights,
    kernel,
):
    """Row ``i`` of :func:`log_kernel_sums`.

    The key loops here and in :func:`log_sums_and_score_means` run over slices from
    index 0: numba then knows no index is negative and drops the wraparound select that
    keeps a loop over ``keys_cont_t[c, j0 + jj]`` scalar."""
    n_k = log_weights.shape[0]
    dc = keys_cont_t.shape[0]
    dk = keys_cat_t.shape[0]
    scores = np.empty(SCORE_BLOCK)
    values = np.empty(SCORE_BLOCK)
    top = -math.inf
    total = 0.0
    for j0 in range(0, n_k, SCORE_BLOCK):
        nb = min(SCORE_BLOCK, n_k - j0)
        block_weights = log_weights[j0 : j0 + nb]
        for jj in range(nb):
            scores[jj] = block_weights[jj]
            values[jj] = 1.0
        for c in range(dc):
            qc = q_cont[i, c]
            keys_c = keys_cont_t[c, j0 : j0 + nb]
            if kernel == GAUSSIAN and cont_integrated[c]:  # the common cases, vectorised
                for jj in range(nb):
                    e, v = normal_cdf_parts(qc - keys_c[jj])
                    scores[jj] += e
                    values[jj] *= v
            elif kernel == GAUSSIAN:
                for jj in range(nb):
                    d = qc - keys_c[jj]
                    scores[jj] -= 0.5 * d * d
            elif cont_integrated[c]:
                for jj in range(nb):
                    scores[jj] += log_integrated_kernel(qc - keys_c[jj], kernel)
            else:
                for jj in range(nb):
                    scores[jj] += log_kernel(qc - keys_c[jj], kernel)
        for k in range(dk):
            qk = q_cat[i, k]
            keys_k = keys_cat_t[k, j0 : j0 + nb]
            for jj in range(nb):
                if scores[jj] == -math.inf:
                    continue
                if cat_integrated[k]:
                    scores[jj] += log_category_cdf(
                        qk, keys_k[jj], cat_kind[k], cat_lambda[k], cat_count[k]
                    )
                else:
                    scores[jj] += category_term(
                        keys_k[jj],
                        qk,
                        cat_params[k, 0],
                        cat_params[k, 1],
                        cat_params[k, 2],
                    )
        block_top = -math.inf
        for jj in range(nb):
            block_top = fmax(block_top, scores[jj])
        if block_top == -math.inf:
            continue
        if block_top > top:
            total *= math.exp(top - block_top)
            top = block_top
        block_total = 0.0
        for jj in range(nb):
            block_total += fast_exp(scores[jj] - top) * values[jj]
        total += block_total
    return top + math.log(total) if total > 0.0 else -math.inf


def log_sums_and_score_means(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    cat_dparams,
    log_weights,
    kernel,
    exclude_self,
    gradient=True,
):
    """The normaliser and the mean score derivatives of a density's pooling, in one pass.

    With the engine's score s_j = log w_j + sum_c log K(d_jc) + sum_k (a_k if equal else
    b_k + t_k |q_k - k_jk|) (``nbattn.kernels.local``; d_jc = k_jc - q_c, the columns
    divided by their widths) and p_j = softmax_j(s_j), returns per query

    * ``log_sums`` (n_q,): log sum_j exp(s_j) (-inf where no key has weight), and
    * ``means`` (n_q, dc + dk): sum_j p_j ds_j/dtheta, continuous columns first:
      ds_j / dlog h_c = -d_jc s'(d_jc) (d_jc^2 for the Gaussian), then per categorical
      column the derivative of its term, linear in (a, b, t): ``cat_dparams[k]`` holds
      (da, db, dt) with respect to the column's parameter.

    The mean is d log sum_j exp(s_j) / dtheta: the gradient of a log density in the widths
    (``nbattn.distribution.density_widths``). ``exclude_self`` leaves the pair (i, i) out;
    ``gradient=False`` computes ``log_sums`` alone (``means`` stays 0).
    One online pass over blocks of ``SCORE_BLOCK`` keys: a block's scores first (loops the
    compiler vectorises), then its weights and their sums, rescaled whenever the running
    maximum grows.

    Chunks of ``_ROWS`` rows are the work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    n_q = q_cont.shape[0]
    log_sums = np.empty(n_q)
    means = np.zeros((n_q, keys_cont_t.shape[0] + keys_cat_t.shape[0]))
    run_items(
        _log_sums_and_score_means_items,
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        cat_dparams,
        log_weights,
        kernel,
        exclude_self,
        gradient,
        log_sums,
        means,
    )
    return log_sums, means


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _log_sums_and_score_means_items(
    counter,
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    cat_dparams,
    log_weights,
    kernel,
    exclude_self,
    gradient,
    log_sums,
    means,
):
    """The chunks of rows that ``counter`` hands this thread: their rows of ``log_sums``
    and ``means``."""
    n_q = q_cont.shape[0]
    n_k = log_weights.shape[0]
    dc = keys_cont_t.shape[0]
    dk = keys_cat_t.shape[0]
    n_chunks = (n_q + _ROWS - 1) // _ROWS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        for i in range(chunk * _ROWS, min(n_q, (chunk + 1) * _ROWS)):
            scores = np.empty(SCORE_BLOCK)
            acc = np.zeros(dc + dk)
            top = -math.inf
            total = 0.0
            for j0 in range(0, n_k, SCORE_BLOCK):
                nb = min(SCORE_BLOCK, n_k - j0)
                block_weights = log_weights[j0 : j0 + nb]
                for jj in range(nb):
                    scores[jj] = block_weights[jj]
                for c in range(dc):
                    qc = q_cont[i, c]
                    keys_c = keys_cont_t[c, j0 : j0 + nb]
                    if kernel == GAUSSIAN:  # the common case, in a loop the compiler vectorises
                        for jj in range(nb):
                            d = keys_c[jj] - qc
                            scores[jj] -= 0.5 * d * d
                    else:  # indexed: over the slice this loop measured 1.5x slower here
                        for jj in range(nb):
                            scores[jj] += log_kernel(keys_cont_t[c, j0 + jj] - qc, kernel)
                for k in range(dk):
                    qk, a, b, t = q_cat[i, k], cat_params[k, 0], cat_params[k, 1], cat_params[k, 2]
                    keys_k = keys_cat_t[k, j0 : j0 + nb]
                    for jj in range(nb):
                        scores[jj] += category_term(keys_k[jj], qk, a, b, t)
                if exclude_self and j0 <= i < j0 + nb:
                    scores[i - j0] = -math.inf
                block_top = -math.inf
                for jj in range(nb):
                    block_top = fmax(block_top, scores[jj])
                if block_top == -math.inf:
                    continue
                if block_top > top:
                    scale = math.exp(top - block_top)
                    total *= scale
                    for g in range(dc + dk):
                        acc[g] *= scale
                    top = block_top
                block_total = 0.0
                for jj in range(nb):
                    p = fast_exp(scores[jj] - top)
                    scores[jj] = p
                    block_total += p
                total += block_total
                if not gradient:
                    continue
                for c in range(dc):
                    qc = q_cont[i, c]
                    keys_c = keys_cont_t[c, j0 : j0 + nb]
                    part = 0.0
                    if kernel == GAUSSIAN:  # -d s'(d) = d^2
                        for jj in range(nb):
                            d = keys_c[jj] - qc
                            part += scores[jj] * d * d
                    else:
                        for jj in range(nb):
                            d = keys_c[jj] - qc
                            part -= scores[jj] * d * dlog_kernel(d, kernel)
                    acc[c] += part
                for k in range(dk):
                    qk, a, b, t = (
                        q_cat[i, k],
                        cat_dparams[k, 0],
                        cat_dparams[k, 1],
                        cat_dparams[k, 2],
                    )
                    keys_k = keys_cat_t[k, j0 : j0 + nb]
                    part = 0.0
                    for jj in range(nb):
                        part += scores[jj] * category_term(keys_k[jj], qk, a, b, t)
                    acc[dc + k] += part
            if total > 0.0:
                log_sums[i] = top + math.log(total)
                for g in range(dc + dk):
                    means[i, g] = acc[g] / total
            else:
                log_sums[i] = -math.inf


#: Keys whose weight is below this share of a query's largest are left out of its
#: quantiles' mixture: n of them move F by at most n times it (1e-20 n, far below the
#: root-finder's tolerance for any table that fits in memory).
QUANTILE_WEIGHT_FLOOR = 1e-20


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def integrated_kernel(z, kernel):
    """G(z), the integrated continuous kernel (module docstring), in linear space (the
    Gaussian's by ``nbattn.kernels.normal.normal_cdf``)."""
    if kernel == GAUSSIAN:
        return normal_cdf(z)
    if z <= -1.0:
        return 0.0
    if z >= 1.0:
        return 1.0
    if kernel == EPANECHNIKOV:
        return (1.0 + z) * (1.0 + z) * (2.0 - z) * 0.25
    a = abs(z)
    a3 = a * a * a
    half_mass = (70.0 / 81.0) * a * (1.0 - a3 * (0.75 - a3 * (3.0 / 7.0 - 0.1 * a3)))
    return 0.5 + half_mass if z >= 0.0 else 0.5 - half_mass


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _mixture_cdf(u, ys, ps, count, kernel):
    """sum_m ps[m] G(u - ys[m]) over the first ``count`` entries (a loop the compiler
    vectorises for the Gaussian kernel)."""
    total = 0.0
    if kernel == GAUSSIAN:
        for m in range(count):
            total += ps[m] * normal_cdf(u - ys[m])
        return total
    for m in range(count):
        total += ps[m] * integrated_kernel(u - ys[m], kernel)
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _row_scores(i, q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights, kernel, out):
    """The engine's score of query ``i`` against every key (``pair_score``) into ``out``
    (n_k,), a column at a time (the Gaussian columns in loops the compiler vectorises)."""
    n_k = log_weights.shape[0]
    for j in range(n_k):
        out[j] = log_weights[j]
    for c in range(keys_cont_t.shape[0]):
        qc = q_cont[i, c]
        if kernel == GAUSSIAN:
            for j in range(n_k):
                d = keys_cont_t[c, j] - qc
                out[j] -= 0.5 * d * d
        else:
            for j in range(n_k):
                out[j] += log_kernel(keys_cont_t[c, j] - qc, kernel)
    for k in range(keys_cat_t.shape[0]):
        qk, a, b, t = q_cat[i, k], cat_params[k, 0], cat_params[k, 1], cat_params[k, 2]
        for j in range(n_k):
            out[j] += category_term(keys_cat_t[k, j], qk, a, b, t)


def conditional_quantile_roots(
    q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights, keys_y, levels, z, kernel, xtol
):
    """The roots u of F(u | x_i) = tau (n_q, n_levels), F the mixture sum_j p_j G(u - y_j).

    Per query: the pooling weights p_j of x's columns (the engine's score of
    ``nbattn.kernels.local``: ``q_cont``/``keys_cont_t``, ``q_cat``/``keys_cat_t`` and
    ``cat_params`` are x's columns alone) computed once, the keys below
    ``QUANTILE_WEIGHT_FLOOR`` of the largest weight left out, then for each level, in
    the order given (the caller sorts them), a root of the mixture's CDF in y's units
    ``keys_y`` (y's column divided by its width, same centre as the result): bracketed
    by [min y_j + z, max y_j + z] (``z`` (n_q, n_levels) = G^-1(tau); the previous
    level's root raises the lower end), narrowed by regula falsi with the Illinois rule
    and a bisection every fourth step until the bracket is within ``xtol`` (or 4 ulp
    of its ends). NaN for a query that no key reaches (the caller falls back).

    Chunks of ``_ROWS`` rows are the work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    out = np.empty((q_cont.shape[0], levels.shape[1]))
    run_items(
        _conditional_quantile_roots_items,
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cat_params,
        log_weights,
        keys_y,
        levels,
        z,
        kernel,
        xtol,
        out,
    )
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _conditional_quantile_roots_items(
    counter,
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    keys_y,
    levels,
    z,
    kernel,
    xtol,
    out,
):
    """The chunks of rows that ``counter`` hands this thread: their rows of ``out``."""
    n_q = q_cont.shape[0]
    n_k = log_weights.shape[0]
    n_levels = levels.shape[1]
    n_chunks = (n_q + _ROWS - 1) // _ROWS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        for i in range(chunk * _ROWS, min(n_q, (chunk + 1) * _ROWS)):
            scores = np.empty(n_k)
            _row_scores(
                np.int64(i),
                q_cont,
                keys_cont_t,
                q_cat,
                keys_cat_t,
                cat_params,
                log_weights,
                kernel,
                scores,
            )
            top = -math.inf
            for j in range(n_k):
                top = fmax(top, scores[j])
            if top == -math.inf:
                for level in range(n_levels):
                    out[i, level] = math.nan
                continue
            ys = np.empty(n_k)
            ps = np.empty(n_k)
            count = np.int64(0)  # not Literal[int](0): _mixture_cdf compiles once
            total = 0.0
            floor = math.log(QUANTILE_WEIGHT_FLOOR)
            low_y = math.inf
            high_y = -math.inf
            for j in range(n_k):
                if scores[j] - top >= floor:
                    p = fast_exp(scores[j] - top)
                    ys[count] = keys_y[j]
                    ps[count] = p
                    total += p
                    count += 1
                    low_y = min(low_y, keys_y[j])
                    high_y = max(high_y, keys_y[j])
            for m in range(count):
                ps[m] /= total
            previous = -math.inf
            for level in range(n_levels):
                tau = levels[i, level]
                lo = max(low_y + z[i, level], previous)
                hi = max(high_y + z[i, level], lo)
                f_lo = _mixture_cdf(lo, ys, ps, count, kernel) - tau
                f_hi = _mixture_cdf(hi, ys, ps, count, kernel) - tau
                side = 0
                for step in range(QUANTILE_MAX_STEPS):
                    width = hi - lo
                    if width <= xtol or width <= QUANTILE_ULPS * max(abs(lo), abs(hi)):
                        break
                    if f_lo >= 0.0:
                        hi = lo
                        break
                    if f_hi <= 0.0:
                        lo = hi
                        break
                    u = hi - f_hi * (hi - lo) / (f_hi - f_lo)
                    if step % 4 == 3 or not (lo < u < hi):
                        u = 0.5 * (lo + hi)
                    f_u = _mixture_cdf(u, ys, ps, count, kernel) - tau
                    if f_u < 0.0:
                        lo = u
                        f_lo = f_u
                        if side == -1:
                            f_hi *= 0.5
                        side = -1
                    elif f_u > 0.0:
                        hi = u
                        f_hi = f_u
                        if side == 1:
                            f_lo *= 0.5
                        side = 1
                    else:
                        lo = u
                        hi = u
                root = 0.5 * (lo + hi)
                out[i, level] = root
                previous = root


# the least-squares cross-validation kernels live in their own module; re-exported here, the
# CPU "density" op module that dispatch.device.kernels_for returns
from .density_ls import (  # noqa: E402
    category_convolution,
    log_convolved_kernel,
    ls_conditional_terms,
    ls_pair_sums,
)
