"""Gaussian attention pooling on BLAS tiles, for inputs with many features.

The Gaussian score expands into a dot product and two norms,

    s_ij = -||q_i - k_j||^2 = 2 q_i . k_j - ||k_j||^2 - ||q_i||^2,

so for many features the score tile of a block of queries against a block
of keys is one GEMM, T = Q K^T (``np.dot`` inside numba: BLAS). The rest of
the tile is two vectorised passes per row over T, in base 2 as the flash
kernels (``nbattn.kernels.flash``): with b = log2(e) the score is

    t_ij = b s_ij = -b max(||k_j||^2 + ||q_i||^2 - 2 T_ij, 0)

(the clamp removes the rounding-level negative distances of near pairs, so
that a weight never exceeds 1; b is applied last, so that its rounding is
relative to |s|, not to the norms). The first pass takes the row's maximum
of t, the second recomputes t and accumulates 2**(t - m) (``base2.exp2``:
one exact range reduction, cheaper than ``exp``), its sum and, with one
output, its product with the values; the scores are never stored (a loop
that stores them and reduces their maximum does not vectorise). With
several outputs the second pass stores the weights in the tile and P V is a
second GEMM. The online softmax keeps per row the running maximum m, the sum
l and acc = sum w v (float64), rescaled when m grows. The norms are
computed in float64 and rounded once to the input dtype; the tiles are in
the input dtype.

Tiles. ``tile_shape``: ``GEMM_BLOCK_Q`` x ``GEMM_BLOCK_K`` below
``GEMM_WIDE_FEATURES`` features, ``GEMM_WIDE_BLOCK_Q`` x ``GEMM_WIDE_BLOCK_K``
from there on, where the GEMM is nine tenths of the time and runs nearer
BLAS's peak on taller tiles (``config``, section "Gaussian pooling on GEMM
tiles", for the measurements).

Exactness. The expanded form carries a rounding error of about
(d + 2) u (||q_i||^2 + ||k_j||^2) + u |s_ij| in each score (u the dtype's
unit roundoff), where the direct difference of
``pooling`` carries (d + 3) u |s_ij|. Callers (``nbattn.smoothing.regression``) centre
queries and keys on the keys (in float64) so that data far from the origin
has small norms. A row keeps the GEMM result only where

* its sum l_i is positive and its best score m_i (natural units) is above
  ``-pooling.far_score`` (the query is not far from every key), and
* ||q_i||^2 + max_j ||k_j||^2 <= ``GEMM_NORM_RATIO`` * max(-m_i, ``GEMM_NORM_FLOOR``),
  so the GEMM error is at most about GEMM_NORM_RATIO times the direct path's
  (d + 3) u |m_i|, or bounded by the floor where the row has a near key;

any other row (a query far from every key, or a near query among keys far
from the centre) is recomputed by ``pooling.pool_row_one_pass`` on the
feature-major keys, with its float64 and anchored far-row paths. So a far
query still gets its nearest key's value.

Callers lay out the arrays: ``queries`` (n_queries, d) and ``keys``
(n_keys, d) C-contiguous, centred and scaled by 1/(h sqrt 2) like
``pooling``'s; ``keys_t`` = keys.T C-contiguous for the rows redone by the
direct path, or an empty (0, 0) array, and then the kernel transposes the
keys itself if a row needs them;
``values_t`` (n_outputs, n_keys); all one dtype. BLAS must be held to one
thread while the kernel runs (``np.dot`` on the work items' threads).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config
from .._core.numeric import LOG2E
from .base2 import LN2, exp2
from .fastmath import fmax, like
from .items import next_item, run_items
from .pooling import (
    _KEY_BLOCK,
    far_score,
    pool_row_one_pass,
    scaled_values,
    store_row,
    value_scales,
)

_BLOCK_Q = config.GEMM_BLOCK_Q
_BLOCK_K = config.GEMM_BLOCK_K
_WIDE_FEATURES = config.GEMM_WIDE_FEATURES
_WIDE_BLOCK_Q = config.GEMM_WIDE_BLOCK_Q
_WIDE_BLOCK_K = config.GEMM_WIDE_BLOCK_K
_NORM_RATIO = float(config.GEMM_NORM_RATIO)
_NORM_FLOOR = float(config.GEMM_NORM_FLOOR)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def squared_norms(rows, dtype_like):
    """||rows[i]||^2 accumulated in float64, rounded once to ``dtype_like``'s dtype."""
    out = np.empty(rows.shape[0], dtype=dtype_like.dtype)
    for i in range(rows.shape[0]):
        total = 0.0
        for f in range(rows.shape[1]):
            x = np.float64(rows[i, f])
            total += x * x
        out[i] = total
    return out


@njit(cache=config.CACHE)
def tile_shape(n_features):
    """(query rows, keys) per tile for ``n_features`` features (``config``, section
    "Gaussian pooling on GEMM tiles"): from ``GEMM_WIDE_FEATURES`` on, the taller
    and wider tiles on which one BLAS call per tile runs nearer its peak."""
    if n_features >= _WIDE_FEATURES:
        return _WIDE_BLOCK_Q, _WIDE_BLOCK_K
    return _BLOCK_Q, _BLOCK_K


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _score(dot, key_norm, q_norm, log2e, zero):
    """t = -max(||k||^2 + ||q||^2 - 2 q.k, 0) b, the score in base 2 (b = log2 e;
    ``log2e`` and ``zero`` in the tile's dtype). The clamp keeps a near pair's
    weight <= 1; dot = -inf (the excluded pair) gives -inf.
    """
    return -fmax(key_norm + q_norm - (dot + dot), zero) * log2e


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _tile_row_max(row, key_norms, q_norm):
    """max_j s_j over one row of dot products ``row`` (read only; -inf when empty).

    The scores are not stored: a loop that stores them and reduces their
    maximum does not vectorise (a scalar ``vmaxss`` loop, measured 7x slower),
    and recomputing s_j in the exponential pass costs one fused multiply-add.
    """
    best = like(-np.inf, row)
    zero = like(0.0, row)
    log2e = like(LOG2E, row)
    for j in range(row.shape[0]):
        best = fmax(best, _score(row[j], key_norms[j], q_norm, log2e, zero))
    return best


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _exp2_sum_dot(row, key_norms, q_norm, shift, values_row):
    """(sum_j 2**(t_j - shift), sum_j 2**(t_j - shift) values_row[j]) in the row's dtype."""
    zero = like(0.0, row)
    log2e = like(LOG2E, row)
    total = zero
    weighted = zero
    for j in range(row.shape[0]):
        w = exp2(_score(row[j], key_norms[j], q_norm, log2e, zero) - shift)
        total += w
        weighted += w * values_row[j]
    return total, weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _exp2_sum_store(row, key_norms, q_norm, shift):
    """row[j] <- 2**(t_j - shift) (the weights for the P V GEMM); returns their sum."""
    zero = like(0.0, row)
    log2e = like(LOG2E, row)
    total = zero
    for j in range(row.shape[0]):
        w = exp2(_score(row[j], key_norms[j], q_norm, log2e, zero) - shift)
        row[j] = w
        total += w
    return total


def gaussian_pool_gemm(queries, keys, keys_t, values_t, exclude_self, self_offset):
    """Gaussian attention pooling on GEMM tiles; returns ``(out, lse)`` like
    ``pooling.gaussian_pool`` (module docstring for the layout and the row checks).

    With ``exclude_self``, query row i is key row ``i + self_offset``. The offset has
    no default: an omitted argument would be a second compiled specialisation.

    The tiles of query rows, then the rows left to the direct path, are work items of
    :func:`nbattn.kernels.items.run_items`.
    """
    exponents, values_s, values_kc, key_norms, query_norms, out, lse, redo = _gemm_setup(
        queries, keys, values_t
    )
    exclude_self, self_offset = bool(exclude_self), np.int64(self_offset)
    run_items(
        _tile_items,
        queries,
        keys,
        values_s,
        values_kc,
        key_norms,
        query_norms,
        exponents,
        exclude_self,
        self_offset,
        out,
        lse,
        redo,
    )
    rows = np.nonzero(redo)[0]
    if rows.size > 0:
        # keys.T built here when the caller left the transposed copy out (rare rows need it)
        if keys_t.shape != (keys.shape[1], keys.shape[0]):
            keys_t = np.ascontiguousarray(keys.T)
        run_items(
            _redo_items,
            out,
            lse,
            rows,
            queries,
            keys_t,
            values_s,
            exponents,
            exclude_self,
            self_offset,
        )
    return out, lse


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _gemm_setup(queries, keys, values_t):
    """``(exponents, values_s, values_kc, key_norms, query_norms, out, lse, redo)``: the
    values' power-of-two scales, the scaled values (and key-major for the P V GEMM), the
    squared norms, and the outputs the items fill."""
    n_queries = queries.shape[0]
    exponents = value_scales(values_t)
    values_s = scaled_values(values_t, exponents)
    values_kc = np.ascontiguousarray(values_s.T)  # (n_keys, n_outputs) for the P V GEMM
    key_norms = squared_norms(keys, queries)
    query_norms = squared_norms(queries, queries)
    out = np.zeros((n_queries, values_t.shape[0]), dtype=queries.dtype)
    lse = np.empty(n_queries, dtype=np.float64)
    redo = np.zeros(n_queries, dtype=np.bool_)  # rows for the direct path
    return exponents, values_s, values_kc, key_norms, query_norms, out, lse, redo


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _tile_items(
    counter,
    queries,
    keys,
    values_s,
    values_kc,
    key_norms,
    query_norms,
    exponents,
    exclude_self,
    self_offset,
    out,
    lse,
    redo,
):
    """The tiles of query rows that ``counter`` hands this thread: their rows of ``out``
    and ``lse``, or their flag in ``redo``."""
    n_queries, n_features = queries.shape
    n_keys = keys.shape[0]
    n_outputs = values_s.shape[0]
    dtype = queries.dtype
    block_q, block_k = tile_shape(n_features)
    max_key_norm = np.float64(key_norms.max()) if n_keys > 0 else 0.0
    far = far_score(queries)
    n_tiles = (n_queries + block_q - 1) // block_q
    while True:
        tile = next_item(counter)
        if tile >= n_tiles:
            return
        i0 = tile * block_q
        mb = min(block_q, n_queries - i0)
        s_flat = np.empty(mb * block_k, dtype=dtype)
        pv_flat = np.empty(mb * n_outputs, dtype=dtype)
        m = np.full(mb, -np.inf)  # the rows' running maxima in base 2
        l = np.zeros(mb)
        acc = np.zeros((mb, n_outputs))
        q_tile = queries[i0 : i0 + mb]
        for j0 in range(0, n_keys, block_k):
            nb = min(block_k, n_keys - j0)
            st = s_flat[: mb * nb].reshape((mb, nb))
            np.dot(q_tile, keys[j0 : j0 + nb].T, st)  # st holds q.k until the weights
            norms_k = key_norms[j0 : j0 + nb]
            for r in range(mb):
                row = st[r]
                q_norm = query_norms[i0 + r]
                own_col = i0 + r + self_offset - j0 if exclude_self else -1
                if 0 <= own_col < nb:  # the excluded pair: a -inf score weighs exactly 0
                    row[own_col] = -np.inf
                best = np.float64(_tile_row_max(row, norms_k, q_norm))
                if best > m[r]:
                    rescale = math.exp((m[r] - best) * LN2)
                    l[r] *= rescale
                    for c in range(n_outputs):
                        acc[r, c] *= rescale
                    m[r] = best
                if m[r] == -np.inf:
                    if n_outputs > 1:
                        row[:] = 0.0
                    continue
                shift = like(m[r], row)
                if n_outputs == 1:
                    total, weighted = _exp2_sum_dot(
                        row, norms_k, q_norm, shift, values_s[0, j0 : j0 + nb]
                    )
                    l[r] += total
                    acc[r, 0] += weighted
                else:
                    l[r] += _exp2_sum_store(row, norms_k, q_norm, shift)
            if n_outputs > 1:
                pv = pv_flat.reshape((mb, n_outputs))
                np.dot(st, values_kc[j0 : j0 + nb], pv)
                for r in range(mb):
                    for c in range(n_outputs):
                        acc[r, c] += pv[r, c]
        row_acc = np.empty(n_outputs)
        for r in range(mb):
            i = i0 + r
            best = m[r] * LN2  # natural units from here on
            near = np.float64(query_norms[i]) + max_key_norm <= _NORM_RATIO * max(
                -best, _NORM_FLOOR
            )
            if l[r] > 0.0 and best >= -far and near:
                for c in range(n_outputs):
                    row_acc[c] = acc[r, c]
                store_row(out, lse, i, best, l[r], row_acc, exponents)
            else:
                redo[i] = True


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _redo_items(
    counter, out, lse, rows, queries, k_t, values_s, exponents, exclude_self, self_offset
):
    """The rows the GEMM tiles did not keep that ``counter`` hands this thread, by
    ``pooling.pool_row_one_pass`` on the feature-major keys ``k_t``."""
    while True:
        index = next_item(counter)
        if index >= rows.size:
            return
        i = rows[index]
        scores = np.empty(_KEY_BLOCK, dtype=queries.dtype)
        row_acc = np.empty(values_s.shape[0])
        own = i + self_offset if exclude_self else -1
        running_max, running_sum = pool_row_one_pass(
            queries[i], k_t, values_s, own, scores, row_acc
        )
        store_row(out, lse, i, running_max, running_sum, row_acc, exponents)
