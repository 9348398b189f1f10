"""Nadaraya-Watson on a k-d tree of the keys, with certified pruning to a relative tolerance.

For queries q_i, keys k_j and values v_j (laid out as for ``nbattn.kernels.pooling``:
inputs pre-scaled by 1/(h sqrt 2), so the weight of key j is exp(s_ij) with
s_ij = -||q_i - k_j||^2) the exact sums are

    S_i = sum_j exp(s_ij),    A_ic = sum_j exp(s_ij) v_jc,    out_ic = A_ic / S_i.

Here the keys are in the k-d order of ``nbattn.kernels.kd_order`` and every node of the
split (``kd_nodes``) carries the bounding box of its keys. Each query walks the tree
depth first, nearer child first (Gray and Moore's traversal), and sums the leaves it
reaches with a max-shifted online softmax in float64 running sums, as the streaming
kernel does. A node of c keys whose box lies at squared distance d2 from the query holds
a weight of at most

    B = c exp(-d2)                      (every key in the box is at least that far)

and it is dropped, unvisited, when

    U + B <= rtol * L                   (the rule)

where L is the sum of the weights of the leaves summed so far and U the sum of the
bounds B of the nodes dropped so far (U then grows by B). Both are kept relative to the
row's running maximum m, exactly as the streaming kernel keeps its sums, so neither
underflows for a query far from the keys.

Proof that the dropped mass E is at most rtol * S. The rule keeps the invariant
U <= rtol * L at every step: it holds at the start (0 <= 0), a drop adds B only when
U + B <= rtol * L, and summing a leaf only increases L. At the end L is a sum over a
subset of the keys, so L <= S, and each dropped node's true weight is at most its B, so

    E <= U <= rtol * L <= rtol * S.

Gray and Moore's rule, which drops a node when B <= rtol * L * c / n (its share of the
tolerance by its count), is the case where every drop spends only its own share; the
rule above lets a node spend what earlier drops left unspent. The rule is checked in
floating point: it holds to the rounding of L, U and d2 (d2 is shrunk by 2**-40,
relative, to cover the rounding of the box distance).

Consequences, for the computed Shat = S - E and Ahat_c = A_c - sum_{dropped j} w_j v_jc:

* the normaliser: (1 - rtol) S <= Shat <= S, so lse moves by at most -log(1 - rtol);
* each weighted sum: |Ahat_c - A_c| <= E max_j |v_jc| <= rtol * S * max_j |v_jc|;
* the prediction: fhat - f = -sum_{dropped j} w_j (v_j - f) / (S - E), so

      |fhat_c - f_c| <= rtol / (1 - rtol) * max_j |v_jc - f_c|.

All of these are on top of the rounding error that the exact streaming sums carry
themselves (the scores are computed in the input dtype, as there).

Far rows. A row whose best score lies below ``-far_score`` of its dtype (the threshold
of ``nbattn.kernels.pooling``'s far rows), or whose every score overflowed, is flagged
instead of finished (``far``), and the caller recomputes it with the exact kernel, whose
far-row paths give the nearest key's value where the textbook formula gives 0/0. A row
whose root box already lies beyond that distance is flagged before any leaf is summed.

Layout: ``queries`` (n_queries, d), ``keys_t`` (d, n_keys) and ``values_t``
(n_outputs, n_keys) in k-d order, of one dtype (float32 or float64), C-contiguous; the
tree arrays as ``kd_nodes`` returns them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import overload

from .. import config
from .fastmath import fast_exp, like
from .kd_order import kd_nodes, kd_order

__all__ = ["kd_nodes", "kd_order", "tree_pool"]

_QUERY_BLOCK = config.QUERY_BLOCK
_FAR_SCORE_FLOAT32 = float(config.FAR_SCORE_FLOAT32)
_FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)
# A box distance is rounded by at most ~(d + 2) 2**-53 relative; shrinking it by 2**-40
# keeps each bound B an upper bound for any d below 2**13.
_D2_SHRINK = 1.0 - 2.0**-40
_STACK = 128  # the tree's depth is below 64 for any n below 2**63


def _far_score(array):
    """The best score below which a row of ``array``'s dtype is far (``kernels.pooling``)."""
    return _FAR_SCORE_FLOAT32 if array.dtype == np.float32 else _FAR_SCORE_FLOAT64


@overload(_far_score, inline="always")
def _far_score_overload(array):
    if array.dtype == types.float32:
        return lambda array: _FAR_SCORE_FLOAT32
    return lambda array: _FAR_SCORE_FLOAT64


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _box_d2(q64, lo, hi, node):
    """Squared distance from the query to node's bounding box (0 inside it)."""
    total = 0.0
    for f in range(q64.shape[0]):
        gap = max(lo[node, f] - q64[f], q64[f] - hi[node, f], 0.0)
        total += gap * gap
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def packed_leaves(keys_t, values_t, start, stop, right):
    """Each leaf's keys and values in one contiguous block (a walk reads a leaf as one
    stream instead of d + p strided ones): the leaf [a, b) of nb keys starts at
    a * (d + p) and holds feature f of its t-th key at f * nb + t, then value c at
    (d + c) * nb + t."""
    k, n = keys_t.shape
    width = k + values_t.shape[0]
    pack = np.empty(n * width, dtype=keys_t.dtype)
    for node in range(start.shape[0]):
        if right[node] >= 0:
            continue
        a, nb = start[node], stop[node] - start[node]
        base = a * width
        for f in range(k):
            for t in range(nb):
                pack[base + f * nb + t] = keys_t[f, a + t]
        for c in range(values_t.shape[0]):
            for t in range(nb):
                pack[base + (k + c) * nb + t] = values_t[c, a + t]
    return pack


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _leaf_distances(query_row, pack, base, nb, buf):
    """buf[t] = ||query - key t of the leaf at ``base``||^2 for t < nb (dtype of the keys)."""
    q0 = query_row[0]
    for t in range(nb):
        diff = pack[base + t] - q0
        buf[t] = diff * diff
    for f in range(1, query_row.shape[0]):
        qf = query_row[f]
        row = base + f * nb
        for t in range(nb):
            diff = pack[row + t] - qf
            buf[t] += diff * diff


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _leaf_weights(buf, nb, shift):
    """buf[j] <- exp(-buf[j] - shift) for j < nb; returns their sum (dtype of buf)."""
    total = like(0.0, buf)
    s = like(shift, buf)
    for j in range(nb):
        w = fast_exp(-buf[j] - s)
        buf[j] = w
        total += w
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _leaf_dot(buf, nb, pack, row):
    total = like(0.0, buf)
    for t in range(nb):
        total += buf[t] * pack[row + t]
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _tree_row(
    query_row,
    q64,
    pack,
    n_outputs,
    start,
    stop,
    right,
    lo,
    hi,
    own,
    rtol,
    far,
    buf,
    acc,
    stack_node,
    stack_d2,
):
    """One query: ``(m, l, keys_summed, nodes_seen)`` with acc[c] = sum of w_j v_jc
    (relative to exp(m)); m = nan flags a far row (module docstring)."""
    acc[:] = 0.0
    m = -np.inf
    total = 0.0  # L relative to exp(m)
    used = 0.0  # U relative to exp(m)
    summed = 0
    seen = 1
    d2_root = _box_d2(q64, lo, hi, 0)
    if d2_root > far:
        return np.nan, 0.0, summed, seen
    stack_node[0] = 0
    stack_d2[0] = d2_root
    top = 1
    while top > 0:
        top -= 1
        node = stack_node[top]
        d2 = stack_d2[top]
        if total > 0.0:
            bound = (stop[node] - start[node]) * fast_exp(-d2 * _D2_SHRINK - m)
            if used + bound <= rtol * total:
                used += bound
                continue
        r = right[node]
        if r >= 0:
            left = node + 1
            d2_left = _box_d2(q64, lo, hi, left)
            d2_right = _box_d2(q64, lo, hi, r)
            seen += 2
            if d2_left <= d2_right:  # the nearer child on top of the stack
                stack_node[top], stack_d2[top] = r, d2_right
                stack_node[top + 1], stack_d2[top + 1] = left, d2_left
            else:
                stack_node[top], stack_d2[top] = left, d2_left
                stack_node[top + 1], stack_d2[top + 1] = r, d2_right
            top += 2
            continue
        a = start[node]
        nb = stop[node] - a
        summed += nb
        base = a * (query_row.shape[0] + n_outputs)
        _leaf_distances(query_row, pack, base, nb, buf)
        if a <= own < a + nb:
            buf[own - a] = np.inf
        nearest = np.inf
        for j in range(nb):
            nearest = min(nearest, np.float64(buf[j]))
        if not nearest < np.inf:  # every score overflowed (or the one key was excluded)
            continue
        if -nearest > m:
            scale = math.exp(m + nearest)
            total *= scale
            used *= scale
            for c in range(acc.shape[0]):
                acc[c] *= scale
            m = -nearest
        total += _leaf_weights(buf, nb, m)
        for c in range(acc.shape[0]):
            acc[c] += _leaf_dot(buf, nb, pack, base + (query_row.shape[0] + c) * nb)
    if total > 0.0:
        if m < -far:
            return np.nan, 0.0, summed, seen
        return m, total, summed, seen
    n_keys = pack.shape[0] // (query_row.shape[0] + n_outputs)
    if n_keys - (1 if 0 <= own < n_keys else 0) > 0:  # every admissible score overflowed
        return np.nan, 0.0, summed, seen
    return -np.inf, 0.0, summed, seen


@njit(fastmath=False, cache=config.CACHE)
def _value_exponents(values_t):
    """Per output c the exponent e_c with max_j |v_cj| < 2**e_c <= 2 max_j |v_cj| (0 for
    zeros), and the values divided by 2**(e_c - 1) (exact): sums of n weights times
    values in [-2, 2] cannot overflow where values near the largest float would."""
    n_outputs, n = values_t.shape
    exponents = np.zeros(n_outputs, dtype=np.int64)
    scaled = np.empty_like(values_t)
    for c in range(n_outputs):
        big = 0.0
        for j in range(n):
            big = max(big, abs(np.float64(values_t[c, j])))
        if big > 0.0:
            exponents[c] = math.frexp(big)[1]
        for j in range(n):
            scaled[c, j] = math.ldexp(np.float64(values_t[c, j]), 1 - exponents[c])
    return exponents, scaled


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def tree_pool(queries, keys_t, values_t, start, stop, right, lo, hi, own, rtol, rows):
    """``(out, lse, far, work)`` for the queries ``rows`` (indices into ``queries``).

    out (n_rows, n_outputs) in the input dtype, lse (n_rows,) float64, far (n_rows,)
    bool: rows to recompute with the exact kernel (their out and lse are left 0 and
    nan), work (n_rows, 2) int64: keys summed and nodes seen per row. ``own``
    (n_queries,) holds the k-d position of the key each query skips (-1: none), or is
    empty (no key is skipped). ``rtol`` in [0, 1): the module docstring's tolerance.
    """
    n_rows = rows.shape[0]
    n_outputs = values_t.shape[0]
    k = queries.shape[1]
    dtype = queries.dtype
    far = _far_score(queries)
    exponents, values_s = _value_exponents(values_t)
    pack = packed_leaves(keys_t, values_s, start, stop, right)
    leaf_max = 0
    for node in range(start.shape[0]):
        if right[node] < 0:
            leaf_max = max(leaf_max, stop[node] - start[node])
    out = np.zeros((n_rows, n_outputs), dtype=dtype)
    lse = np.full(n_rows, np.nan)
    far_rows = np.zeros(n_rows, dtype=np.bool_)
    work = np.zeros((n_rows, 2), dtype=np.int64)
    n_chunks = (n_rows + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for chunk in prange(n_chunks):
        buf = np.empty(max(leaf_max, 1), dtype=dtype)
        acc = np.empty(n_outputs, dtype=np.float64)
        q64 = np.empty(k, dtype=np.float64)
        stack_node = np.empty(_STACK, dtype=np.int64)
        stack_d2 = np.empty(_STACK, dtype=np.float64)
        for r in range(chunk * _QUERY_BLOCK, min(n_rows, (chunk + 1) * _QUERY_BLOCK)):
            i = rows[r]
            for f in range(k):
                q64[f] = queries[i, f]
            skip = own[i] if own.shape[0] > 0 else -1
            m, total, summed, seen = _tree_row(
                queries[i],
                q64,
                pack,
                n_outputs,
                start,
                stop,
                right,
                lo,
                hi,
                skip,
                rtol,
                far,
                buf,
                acc,
                stack_node,
                stack_d2,
            )
            work[r, 0] = summed
            work[r, 1] = seen
            if np.isnan(m):
                far_rows[r] = True
            elif total > 0.0:
                for c in range(n_outputs):
                    out[r, c] = math.ldexp(acc[c] / total, exponents[c] - 1)
                lse[r] = m + np.log(total)
            else:  # no admissible key: one key, excluded
                lse[r] = -np.inf
    return out, lse, far_rows, work
