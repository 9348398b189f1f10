"""The pair terms of the local-polynomial GPU kernels and each thread's walk over the keys.

The twin of ``nbattn.kernels.local_pairs``: the score of a (query, key) pair and
its design vector (``pair_function``), the nearest-key fallback
(``nearest_key``), s'(d) (``dlog_kernel_function``); and what every kernel of
``nbattn.cuda.local`` and ``nbattn.cuda.local_passes`` does around its own
per-pair work: the walk over the keys (``key_walk_function``: the thread's
query row, the tiles of keys in shared memory, ``load_tile``, ``tile_floats``,
the pair's score and design vector), zeroed accumulators (``clear``) and, in
the second passes, the first pass's state (``pass_state_function``).
The formulas are in ``nbattn.kernels.local``'s docstring.

Nearest-neighbour widths (``nbattn.local.neighbours``) stretch the kernel's argument
of continuous column c, u = r d with d = k_jc - q_ic, as the CPU's ``stretched_terms``
does: r the query's ``q_stretch[i, c]`` (``QUERY_STRETCH``: the thread keeps its row in
registers, as it does its query row) or the key's ``keys_stretch_t[c, j]``
(``KEY_STRETCH``: dc more rows of the tile, after the values'); the design keeps d.
The stretch kind is a compile-time flag of ``pair_function`` and ``key_walk_function``
(``NO_STRETCH``, fixed widths: the code and the tiles of before).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, from_dtype

from .. import config
from .._core.local_groups import EPANECHNIKOV, GAUSSIAN, n_terms
from .common import compiled, imin, jit

#: The tiles' element type (float64: the CPU kernels' one dtype).
_TILE_TYPE = from_dtype(np.dtype(np.float64))

#: The stretch kinds of nearest-neighbour widths (``LocalData.q_stretch`` /
#: ``keys_stretch_t``), a compile-time flag: none (fixed widths), per query, per key.
NO_STRETCH, QUERY_STRETCH, KEY_STRETCH = 0, 1, 2


def design_rows(dc, degree):
    """Entries of the per-pair design vector: the p terms, and at least 1 + dc (the
    scaled differences, which the degree-0 marginal effects and the gradient read)."""
    return max(n_terms(dc, degree), 1 + dc)


def tile_floats(dc, dk, n_out, stretch=NO_STRETCH):
    """Floats per key in a tile: its continuous and categorical columns, its log
    weight, its n_out values and, under ``KEY_STRETCH``, its dc stretches."""
    return dc + dk + 1 + n_out + (dc if stretch == KEY_STRETCH else 0)


def output_ranges(n_out):
    """The (first, stop) outputs of each launch: at most ``config.CUDA_MAX_OUTPUTS`` each
    (the moments, and so g, do not depend on the outputs)."""
    per_launch = max(1, int(config.CUDA_MAX_OUTPUTS))
    return [(c0, min(n_out, c0 + per_launch)) for c0 in range(0, n_out, per_launch)]


# --------------------------------------------------------------------------- device functions


def dlog_kernel_function(kernel):
    """The device function ``dlog_kernel(d)`` for the continuous kernel ``kernel``."""

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


@jit(device=True, inline=True)
def category_term(xk, qk, a, b, t):
    """The term of a categorical column for a key's code xk and the query's code qk:
    a for equal codes, b + t max(|xk - qk|, 1) for unequal ones, 0 where xk is missing.
    The score's term with (a, b, t) = ``cat_params[k]``, its derivative with
    ``cat_dparams[k]`` (the term is linear in them). (|x - q| >= 1 where integer codes
    differ, so t = -inf, l = 0, never meets 0.)"""
    if xk == qk:
        return a
    if xk == xk:
        gap = abs(xk - qk)
        return b + t * (gap if gap > 1.0 else 1.0)
    return 0.0


def _make_pair(dc, dk, kernel, degree, missing, stretch):
    p = n_terms(dc, degree)
    weight_row = dc + dk
    minus_inf = -math.inf

    @jit(device=True, inline=True)
    def argument(d, c, tile, block_k, jj, q_stretch_row, stretch_row):
        """The kernel's argument u = r d of continuous column c: r = 1 (fixed widths),
        the query's stretch ``q_stretch_row[c]`` or the key's, tile row stretch_row + c."""
        if stretch == QUERY_STRETCH:
            return d * q_stretch_row[c]
        if stretch == KEY_STRETCH:
            return d * tile[(stretch_row + c) * block_k + jj]
        return d

    @jit(device=True, inline=True)
    def pair_score(tile, block_k, jj, q_cont_row, q_cat_row, q_stretch_row, stretch_row, cat, x):
        """The score s_j of the key in column ``jj`` of the tile, and its design vector.

        Tile rows: 0..dc-1 the scaled continuous columns, dc..dc+dk-1 the
        categorical codes, dc+dk the log weight, and from ``stretch_row`` on the keys'
        stretches (``KEY_STRETCH``). ``cat`` (dk, 3) holds (a, b, t) per categorical
        column (``cat_params``). The continuous terms are log K(u_jc), u_jc = r d_jc
        (``argument``). Fills x[0] = 1, x[1 + c] = d_jc (0 where missing) and, for
        degree 2, the products d_jc d_jc' (c <= c').
        """
        s = tile[weight_row * block_k + jj]
        if kernel == GAUSSIAN:
            for c in range(dc):
                d = tile[c * block_k + jj] - q_cont_row[c]
                if missing and d != d:  # missing on either side: the term is left out
                    d = 0.0
                x[1 + c] = d
                u = argument(d, c, tile, block_k, jj, q_stretch_row, stretch_row)
                s -= 0.5 * u * u
        elif dc > 0:
            # compact kernels: the product in the linear domain, one log per pair
            prod = 1.0
            for c in range(dc):
                d = tile[c * block_k + jj] - q_cont_row[c]
                if missing and d != d:
                    d = 0.0
                x[1 + c] = d
                u = argument(d, c, tile, block_k, jj, q_stretch_row, stretch_row)
                if kernel == EPANECHNIKOV:
                    f = 1.0 - u * u
                else:
                    a = abs(u)
                    f = 1.0 - a * a * a
                    f = f * f * f
                prod *= f if f > 0.0 else 0.0
            s += math.log(prod) if prod > 0.0 else minus_inf
        for k in range(dk):
            qk = q_cat_row[k]
            if missing and qk != qk:
                continue
            xk = tile[(dc + k) * block_k + jj]
            s += category_term(xk, qk, cat[k, 0], cat[k, 1], cat[k, 2])
        x[0] = 1.0
        if degree >= 2 and p > 1:
            t = 1 + dc
            for c in range(dc):
                for c2 in range(c, dc):
                    x[t] = x[1 + c] * x[1 + c2]
                    t += 1
        return s

    return pair_score


def pair_function(dc, dk, kernel, degree, missing, stretch=NO_STRETCH):
    """The device function ``pair_score`` for these compile-time sizes and flags
    (``stretch``: ``NO_STRETCH``, ``QUERY_STRETCH`` or ``KEY_STRETCH``)."""
    args = (int(dc), int(dk), int(kernel), int(degree), bool(missing), int(stretch))
    return compiled(("local_pair", *args), lambda: _make_pair(*args))


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


@jit(device=True, inline=True)
def load_stretch_rows(tile, block_k, j0, nb, keys_stretch_t, stretch_row):
    """The stretches of keys j0:j0 + nb (``KEY_STRETCH``) into tile rows stretch_row ..
    stretch_row + dc - 1, after ``load_tile``'s rows; coalesced as there. The caller
    synchronises."""
    for jj in range(cuda.threadIdx.x, nb, cuda.blockDim.x):
        for c in range(keys_stretch_t.shape[0]):
            tile[(stretch_row + c) * block_k + jj] = keys_stretch_t[c, j0 + jj]


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


@jit(device=True, inline=True)
def clear(values):
    """Zero a thread's local accumulator array (1-D)."""
    for t in range(values.shape[0]):
        values[t] = 0.0


def _make_pass_state(p):
    minus_inf = -math.inf

    @jit(device=True, inline=True)
    def load_pass_state(i, in_range, g, shift, log_norm, g_row):
        """The first pass's state of query i for a second pass: g_i into ``g_row`` and
        (active, offset) with active = the fit did not fall back (log_norm > -inf) and
        offset = shift_i + log_norm_i, so that p_j = exp(s_j - offset)."""
        active = False
        offset = 0.0
        if in_range:
            active = log_norm[i] != minus_inf
            offset = shift[i] + log_norm[i]
        for t in range(p):
            g_row[t] = g[i, t] if in_range else 0.0
        return active, offset

    return load_pass_state


def pass_state_function(p):
    """The device function ``load_pass_state`` for p terms."""
    return compiled(("local_pass_state", int(p)), lambda: _make_pass_state(int(p)))


def key_walk_function(dc, dk, kernel, degree, missing, visit, stretch=NO_STRETCH):
    """The device function ``walk_keys`` of a kernel whose per-pair work is ``visit``.

    ``walk_keys(i, active, exclude_self, inputs, rows_t, block_k, runs, state, carry)``
    is the loop every local kernel runs for its thread's query i: ``inputs`` =
    (q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights, q_stretch,
    keys_stretch_t), the launch's arrays (``local_args.device_inputs``; the stretches
    (0, 0) where ``stretch`` is ``NO_STRETCH``); ``runs`` = (block_table, key_ranges),
    the key ranges the block
    visits, ``key_ranges[block_table[b, 0] : block_table[b, 1]]`` for block b
    (``local_args.key_runs``: every key in one run, or the pruned leaves' runs of a
    ``BlockRuns``); the keys go through a shared-memory tile of ``block_k`` keys
    (``load_tile``, with the rows of ``rows_t``, the values or residuals, after
    the keys', then under ``KEY_STRETCH`` the keys' stretches, ``load_stretch_rows``),
    all threads of the block loading each tile, and for every
    admissible pair (the key is not query i itself under ``exclude_self``, its
    score is above -inf) of an ``active`` thread it calls

        carry = visit(s, carry, x, tile, block_k, jj, q_cont_row, q_cat_row, state)

    with s the pair's score and x its design vector (``pair_function``), ``jj``
    the key's column in the tile (the rows_t rows start at row dc + dk + 1), the
    query's row and ``state``, the kernel's own accumulators and constants (a
    tuple); returns the last ``carry`` (the fit's running maximum, the
    gradient's sum of coefficients). The query row (and under ``QUERY_STRETCH`` its
    stretches) and x are the walk's own (compile-time sizes: they stay in registers);
    the tile is the launch's dynamic shared memory,
    ``tile_floats(dc, dk, rows, stretch) * block_k`` floats.
    """
    n_design = design_rows(dc, degree)
    dc1, dk1 = max(dc, 1), max(dk, 1)  # local arrays need a positive size
    pair_score = pair_function(dc, dk, kernel, degree, missing, stretch)
    query_stretch = stretch == QUERY_STRETCH
    key_stretch = stretch == KEY_STRETCH
    minus_inf = -math.inf

    @jit(device=True, inline=True)
    def walk_keys(i, active, exclude_self, inputs, rows_t, block_k, runs, state, carry):
        (
            q_cont,
            keys_cont_t,
            q_cat,
            keys_cat_t,
            cat_params,
            log_weights,
            q_stretch,
            keys_stretch_t,
        ) = inputs
        block_table, key_ranges = runs
        tile = cuda.shared.array(0, dtype=_TILE_TYPE)  # tile_floats(...) x block_k
        # the query row in registers (compile-time sizes); the categorical terms, the
        # same for every thread, are read from global memory, one load per warp
        in_range = i < q_cont.shape[0]
        q_cont_row = cuda.local.array(dc1, dtype=np.float64)
        q_cat_row = cuda.local.array(dk1, dtype=np.float64)
        q_stretch_row = cuda.local.array(dc1, dtype=np.float64)
        for c in range(dc):
            q_cont_row[c] = q_cont[i, c] if in_range else 0.0
            if query_stretch:
                q_stretch_row[c] = q_stretch[i, c] if in_range else 0.0
        for k in range(dk):
            q_cat_row[k] = q_cat[i, k] if in_range else 0.0
        stretch_row = dc + dk + 1 + rows_t.shape[0]  # the keys' stretches (KEY_STRETCH)
        x = cuda.local.array(n_design, dtype=np.float64)
        clear(x)
        own = i if exclude_self else -1
        block = cuda.blockIdx.x
        for r in range(block_table[block, 0], block_table[block, 1]):
            stop = key_ranges[r, 1]
            for j0 in range(key_ranges[r, 0], stop, block_k):
                nb = imin(block_k, stop - j0)
                load_tile(tile, block_k, j0, nb, keys_cont_t, keys_cat_t, log_weights, rows_t)
                if key_stretch:
                    load_stretch_rows(tile, block_k, j0, nb, keys_stretch_t, stretch_row)
                cuda.syncthreads()
                if active:
                    for jj in range(nb):
                        if j0 + jj == own:
                            continue
                        s = pair_score(
                            tile,
                            block_k,
                            jj,
                            q_cont_row,
                            q_cat_row,
                            q_stretch_row,
                            stretch_row,
                            cat_params,
                            x,
                        )
                        if s == minus_inf:  # weight 0: contributes nothing
                            continue
                        carry = visit(s, carry, x, tile, block_k, jj, q_cont_row, q_cat_row, state)
                cuda.syncthreads()
        return carry

    return walk_keys
