"""Streaming local-polynomial regression with a mixed-type product kernel (CPU).

For a query q and keys k_j with values y_j the score of a pair is the log of
a product kernel (statsmodels ``KernelReg`` / R ``np`` conventions)

    s_j = sum_c log K(d_jc) + sum_k log L_k(q_k, k_jk) + log w_j

over the continuous columns c (``d_jc = (k_jc - q_c) / h_c``, already scaled
by the caller) and the categorical columns k, with ``log w_j`` the key's
log sample weight (-inf excludes it). Continuous kernels (``kernel``):

    0 gaussian      log K(d) = -d^2 / 2
    1 epanechnikov  log K(d) = log(1 - d^2)           (|d| < 1, else -inf)
    2 tricube       log K(d) = 3 log(1 - |d|^3)       (|d| < 1, else -inf)

(constant factors cancel in the softmax). Categorical columns carry three
numbers per column, ``cat_params[k] = (a, b, t)``: the term is ``a`` when the
codes are equal and ``b + t |q_k - k_jk|`` otherwise, which covers
Aitchison-Aitken (a = log(1-l), b = log(l/(c-1)), t = 0) and Wang-van Ryzin
(a = log(1-l), b = log((1-l)/2), t = log l). A missing entry (NaN, on either
side) leaves its column's term out.

Per query one streaming pass over blocks of ``config.KEY_BLOCK`` keys keeps
the online-softmax state (running maximum ``m``, rescaled sums) of the
weighted moments of the local design x_j = (1, d_j, [d_jc d_jc' for c <= c'])
(degree 0, 1 or 2; ``p`` terms):

    M = sum_j w_j x_j x_j^T,    V = sum_j w_j x_j y_j^T,     w_j = exp(s_j - m)

and at the end solves the small system, normalised by l = sum_j w_j,

    (M/l + R) beta = V/l,       R = ridge * diag(0, M_11/l, ..., M_pp/l)

by a Cholesky factorisation; a term whose pivot is below
``config.LOCAL_PIVOT_TOL`` times its diagonal entry (its column within that
relative distance of the span of the earlier ones: a zero or constant column,
fewer distinct neighbours than terms) is dropped (coefficient 0), like a
truncated pseudo-inverse, so a singular design shrinks towards the local
constant and never gives NaN. ``beta`` holds the fit (beta[0]) and the local
slopes in scaled units (divide by h). The relative ridge is invariant to the
units of every column.

A query with no key of positive weight (compact kernels outside the support,
categorical exact matching, all keys excluded or of weight 0) gets its
nearest admissible key's value (fewest unequal categories, then smallest
sum of d^2; the first on ties); ``nearest`` reports that key (else -1) and
``log_norm`` is -inf there. A query with no admissible key at all gets 0.

All arithmetic is float64 (the local solve needs it); callers cast outputs.
Layouts (C-contiguous, float64): ``q_cont`` (n_q, dc), ``keys_cont_t``
(dc, n_k), ``q_cat`` (n_q, dk), ``keys_cat_t`` (dk, n_k), ``cat_params``
(dk, 3), ``log_weights`` (n_k,), ``values_t`` (n_out, n_k).

The second-pass kernels (``local_loo_gradient``, ``local_interval_sums``,
``local_equivalent_weights``; the last one CPU only: it fills a queries x keys matrix)
recompute the weights p_j = exp(s_j - shift - log_norm) from the first pass's
state and the equivalent-kernel weights l_j = p_j (g . x_j), g = (M/l + R)^-1 e_1.

The kernels take their inputs in typed groups (``nbattn._core.local_groups``:
``LocalData``, ``LocalModel``, ``LocalFit``). This module holds the first pass, ``local_fit``,
and is the op module that ``dispatch.device.kernels_for("local", "cpu")``
returns: it also exposes the groups, the codes and the second passes.
By algorithm: ``local_pairs`` (the scores and design rows of a key block, the
nearest-key fallback), ``local_moments`` (the moment sums and the small
solve), ``local_passes`` (the second passes). ``nbattn.cuda`` has the twin
modules of the same names.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .._core import local_groups
from .._core.local_groups import (
    EPANECHNIKOV,
    GAUSSIAN,
    KERNEL_CODES,
    TRICUBE,
    LocalData,
    LocalFit,
    LocalLeaves,
    LocalModel,
)
from .items import next_item, run_items
from .kd_order import kd_order
from .local_args import n_terms
from .local_leaves import block_runs, chunk_runs, leaf_ranges, visited_share
from .local_moments import block_moments, fused_moments_for, solve
from .local_pairs import (
    block_scratch,
    nearest_key,
    one_pass_for,
    pair_scores,
    problem_sizes,
)
from .local_passes import local_equivalent_weights, local_interval_sums, local_loo_gradient

__all__ = [
    "EPANECHNIKOV",
    "GAUSSIAN",
    "KERNEL_CODES",
    "TRICUBE",
    "LocalData",
    "LocalFit",
    "LocalLeaves",
    "LocalModel",
    "block_runs",
    "local_equivalent_weights",
    "local_fit",
    "local_interval_sums",
    "kd_order",
    "leaf_ranges",
    "local_loo_gradient",
    "n_terms",
    "nearest_key",
    "visited_share",
]

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK
#: ``nearest`` of a query that no key reached, until :func:`_nearest_items` fills it.
_NEAREST_PENDING = -2


def local_fit(data, model, values_t, want_mfx, leaves):
    """The first pass: per query the local fit, its coefficients and the softmax state.

    ``data`` (``LocalData``) and ``model`` (``LocalModel``): the problem;
    ``values_t`` (n_out, n_k) the values; ``want_mfx``: the local-constant
    marginal effects too; ``leaves`` (``LocalLeaves``): the keys each query visits
    (``nbattn.kernels.local_leaves``; rtol = 0: all of them). The chunks of
    queries (``leaves.query_start``) are the work items of
    :func:`nbattn.kernels.items.run_items`.

    Returns
    -------
    LocalFit, the tuple of
    beta : (n_q, p, n_out)   coefficients in scaled units (beta[:, 0] is the fit)
    g : (n_q, p)             (M/l + R)^-1 e_1, the equivalent-kernel vector
    shift : (n_q,)           the running maximum m of the scores
    log_norm : (n_q,)        log l = log sum_j exp(s_j - m); -inf when the fit fell back
    nearest : (n_q,) int64   the fallback key (module docstring), else -1
    mfx : (n_q, dc, n_out)   with ``want_mfx`` and degree 0: d fit / d q (scaled units),
                             sum_j p_j (y_j - fit) ds_j/dq; zeros otherwise
    """
    fit = _fit_outputs(data, model, values_t)
    p = fit.g.shape[1]
    # the fused moment sums of this p where they serve, passed by address (one compiled
    # _fit_items for every p)
    fused = fused_moments_for(p, data, values_t)
    # the scores in one pass over the keys where a kernel of the columns' kinds serves,
    # passed by address (one compiled _fit_items for all kinds)
    one_pass = one_pass_for(data, model)
    run_items(_fit_items, data, model, values_t, bool(want_mfx), fused, one_pass, leaves, fit)
    # queries that no key reached take their nearest key, in a kernel of their own
    # (compiled only by a call that has such a query)
    fallback = np.flatnonzero(fit.nearest == _NEAREST_PENDING)
    if fallback.size:
        run_items(_nearest_items, fallback, data, model, values_t, fit)
    return fit


def _fit_outputs(data, model, values_t):
    """The ``LocalFit`` that :func:`_fit_items` fills, in its initial state (NumPy:
    nothing here needs compiling)."""
    n_q, dc = data.q_cont.shape[0], data.keys_cont_t.shape[0]
    n_out = values_t.shape[0]
    p = local_groups.n_terms(dc, int(model.degree))
    return LocalFit(
        np.zeros((n_q, p, n_out)),
        np.zeros((n_q, p)),
        np.full(n_q, -np.inf),
        np.full(n_q, -np.inf),
        np.full(n_q, -1, dtype=np.int64),
        np.zeros((n_q, dc, n_out)),
    )


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def rescale(moments, rhs, dsum, dysum, factor):
    """The running sums times ``factor`` (a new maximum of the scores). Loops, not
    ``moments *= factor``: numba compiles an array expression per statement."""
    for a in range(moments.shape[0]):
        for b in range(moments.shape[1]):
            moments[a, b] *= factor
        for o in range(rhs.shape[1]):
            rhs[a, o] *= factor
    for c in range(dsum.shape[0]):
        dsum[c] *= factor
        for o in range(dysum.shape[1]):
            dysum[c, o] *= factor


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _fit_items(counter, data, model, values_t, want_mfx, fused, one_pass, leaves, fit):
    """The chunks of queries that ``counter`` hands this thread: their rows of ``fit``.
    ``fused``: ``local_moments.fused_moments_for``'s (the fused moment sums or the general
    paths); ``one_pass``: ``local_pairs.one_pass_for``'s."""
    beta, g, shift, log_norm, nearest, mfx = fit
    kernel, ridge = model.kernel, model.ridge
    degree, missing = model.degree, model.missing
    n_q, dc, _, _, weighted = problem_sizes(data)
    n_out = values_t.shape[0]
    p = n_terms(dc, degree)
    do_mfx = want_mfx and p == 1 and dc > 0
    # without missing values the local-linear moments and the local constant read the
    # differences from the keys: the design rows are never written (one pass less)
    store_design = missing or do_mfx or (p > 1 and (degree >= 2 or not fused[1]))
    n_chunks = leaves.query_start.shape[0] - 1
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        # scratch zeroed once per chunk (block_scratch): never junk from an earlier call
        scores, design = block_scratch(p, dc)
        wx = np.zeros(_KEY_BLOCK)
        moments = np.zeros((p, p))
        rhs = np.zeros((p, n_out))
        scratch = np.zeros((p, p))
        keep = np.zeros(p, dtype=np.bool_)
        z = np.zeros(p)
        dsum = np.zeros(dc)
        dysum = np.zeros((dc, n_out))
        # the chunk's queries (neighbours in k-d order when pruned) visit the same keys
        first, stop, runs, n_runs = chunk_runs(chunk, data, model, leaves)
        for i in range(first, stop):
            for a in range(p):  # explicit loops: slice assignment costs more per query
                for b in range(p):
                    moments[a, b] = 0.0
                for o in range(n_out):
                    rhs[a, o] = 0.0
            for c in range(dc):
                dsum[c] = 0.0
                for o in range(n_out):
                    dysum[c, o] = 0.0
            m = -np.inf
            for r in range(n_runs):
                for j0 in range(runs[r, 0], runs[r, 1], _KEY_BLOCK):
                    nb = min(_KEY_BLOCK, runs[r, 1] - j0)
                    block_max = pair_scores(
                        one_pass, i, j0, nb, data, model, weighted, store_design, scores, design
                    )
                    if block_max == -np.inf:
                        continue
                    if block_max > m:
                        if m > -np.inf:
                            rescale(moments, rhs, dsum, dysum, np.exp(m - block_max))
                        m = block_max
                    block_moments(
                        fused, i, j0, nb, data, values_t, store_design, do_mfx, kernel,
                        scores, design, m, wx, moments, rhs, dsum, dysum,
                    )  # fmt: skip
            total = moments[0, 0]
            if not (total > 0.0):
                nearest[i] = _NEAREST_PENDING
                continue
            inv = 1.0 / total
            for a in range(p):
                for b in range(a, p):
                    moments[b, a] = moments[a, b] * inv
                    moments[a, b] = moments[b, a]
                for o in range(n_out):
                    rhs[a, o] *= inv
            if p == 1:  # the local constant: M/l = 1, nothing to factorise
                g[i, 0] = 1.0
                for o in range(n_out):
                    beta[i, 0, o] = rhs[0, o]
            else:
                solve(moments, rhs, ridge, g[i], beta[i], scratch, keep, z)
            shift[i] = m
            log_norm[i] = np.log(total)
            if do_mfx:
                for c in range(dc):
                    for o in range(n_out):
                        mfx[i, c, o] = (dysum[c, o] - beta[i, 0, o] * dsum[c]) * inv


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _nearest_items(counter, rows, data, model, values_t, fit):
    """The queries ``rows`` that no key reached, one per item: the values of their
    nearest admissible key (``nearest_key``), or nothing (``nearest`` -1) without one."""
    beta, g, nearest = fit.beta, fit.g, fit.nearest
    n_out = values_t.shape[0]
    while True:
        item = next_item(counter)
        if item >= rows.shape[0]:
            return
        i = rows[item]
        near = nearest_key(i, data, model.exclude_self)
        nearest[i] = near
        if near >= 0:
            g[i, 0] = 1.0
            for o in range(n_out):
                beta[i, 0, o] = values_t[o, near]
