"""Which key leaves a local-polynomial pass visits for a chunk of queries: pruning within ``rtol``.

With ``LocalLeaves.rtol > 0`` the keys arrive in k-d order (``nbattn.local.leaves``
builds it), cut into leaves of contiguous keys, each with the bounding box of its
scaled continuous columns, the range of each categorical code and of the keys' log
weights. The passes take the queries in chunks of neighbours
(``LocalLeaves.query_start``, at most ``config.QUERY_BLOCK`` queries each, in k-d
order too); the chunk's box and code ranges against each leaf's bound every pair's
score from both sides (``nbattn.kernels.local``'s docstring has the score):

    smin_L <= s_ij <= smax_L            for every query i of the chunk and key j in L,

a continuous column through the nearest and farthest distances between the two
boxes (log K of each), a categorical column through its terms a and b + t |x - q|
over the two code ranges, the weights through their range. With F_L = (1 + sum_c
far_c^2)^degree bounding every design product |x_ja x_jb| of the leaf (far_c the
farthest box distance in column c),

    U_L = n_L F_L exp(smax_L),       Lo_L = n'_L exp(smin_L)

(n'_L = n_L, less one where the chunk's queries leave their own keys out), so that
the sum of Lo_L over all leaves is a lower bound of each query's normaliser
l = sum_j w_j; so is, per query, the sum over the few leaves of largest U_L of its
own Lo_L (a chunk spread wider than the widths has weak chunk-wide lower bounds).
With floor the larger of the two, the smallest over the chunk's queries, the leaves
are dropped in increasing order of U_L while

    sum_{dropped} U_L <= rtol floor,

so the dropped keys' weight, times any design product, sums to at most rtol l:
every moment sum of the pass (M, V / max|y|, the normaliser) moves by at most
rtol times the kept normaliser. The rule reads only the bounds, never the order of
the visit, and both passes of a fit (``local_fit``, ``local_loo_gradient``) call
the same :func:`kept_runs` on the same chunks, so they drop the same leaves (the
gradient is the exact derivative of the pruned criterion). A leaf whose keys all
weigh exactly 0 (outside a compact kernel's support, a category at l = 0) has
U_L = 0 and is dropped at any rtol > 0.

With rtol = 0 the passes receive ``AllKeys`` instead (every key, and none of this
module's code compiled into them). With missing values (their terms are left out,
which no box bounds here) or with a single leaf, a pruned pass visits every key
too, in the order of the exact kernels: one run [0, n_k), the same blocks, the
same sums to the bit.

Kept leaves next to each other merge into one run, which the passes walk in blocks
of at most ``config.KEY_BLOCK`` keys.

The GPU passes take the same runs per block of queries (one thread per query, the
block's threads walking the keys together): :func:`block_runs` computes them on the
host with the same rule, each block of consecutive queries bounded together as a chunk.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.extending import overload

from .. import config
from .._core.local_groups import EPANECHNIKOV, GAUSSIAN, AllKeys

#: Relative margin on each upper bound: the passes' differences and the bounds'
#: box distances round differently (a few ulp); this covers it many times over.
_MARGIN = 1.0 + 1e-9

#: Leaves (those of largest upper bound) against which each query bounds its own
#: normaliser from below (:func:`_floor`).
_FLOOR_LEAVES = 8


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _log_kernel(distance, kernel):
    """log K at a scaled distance >= 0 (-inf outside a compact support)."""
    if kernel == GAUSSIAN:
        return -0.5 * distance * distance
    if distance >= 1.0:
        return -np.inf
    if kernel == EPANECHNIKOV:
        return math.log1p(-distance * distance)
    return 3.0 * math.log1p(-distance * distance * distance)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _category_range(q_lo, q_hi, lo, hi, a, b, t):
    """(largest, smallest) term of a categorical column between a query code in
    [q_lo, q_hi] and a key code in [lo, hi]: a where equal, b + t max(|x - q|, 1)
    otherwise (t <= 0 or t = 0: the term falls with the distance or is flat)."""
    if lo == hi and q_lo == q_hi and lo == q_lo:
        return a, a
    near = max(lo - q_hi, q_lo - hi, 1.0)  # the closest unequal pair's distance
    far = max(hi - q_lo, q_hi - lo, 1.0)
    first = b + t * near if t != 0.0 else b
    last = b + t * far if t != 0.0 else b
    top, bottom = max(first, last), min(first, last)
    if lo <= q_hi and q_lo <= hi:  # some pair may be equal
        top, bottom = max(top, a), min(bottom, a)
    return top, bottom


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _box_bounds(q_lo, q_hi, leaf, model, leaves):
    """(largest, smallest score, spread) between queries in the box [q_lo, q_hi] (continuous
    columns, then the codes' ranges) and the keys of ``leaf``; spread = sum_c far_c^2."""
    cat_params, kernel = model.cat_params, model.kernel
    dc = leaves.box_lo.shape[1]
    top = leaves.log_weight_max[leaf]
    bottom = leaves.log_weight_min[leaf]
    spread = 0.0
    for c in range(dc):
        lo, hi = leaves.box_lo[leaf, c], leaves.box_hi[leaf, c]
        near = max(lo - q_hi[c], q_lo[c] - hi, 0.0)
        far = max(hi - q_lo[c], q_hi[c] - lo)
        spread += far * far
        top += _log_kernel(near, kernel)
        bottom += _log_kernel(far, kernel)
    for k in range(leaves.cat_lo.shape[1]):
        high, low = _category_range(
            q_lo[dc + k],
            q_hi[dc + k],
            leaves.cat_lo[leaf, k],
            leaves.cat_hi[leaf, k],
            cat_params[k, 0],
            cat_params[k, 1],
            cat_params[k, 2],
        )
        top += high
        bottom += low
    return top, bottom, spread


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _query_point(i, data, lo, hi):
    """lo = hi <- query i's continuous columns, then its codes."""
    dc = data.q_cont.shape[1]
    for c in range(dc):
        lo[c] = hi[c] = data.q_cont[i, c]
    for k in range(data.q_cat.shape[1]):
        lo[dc + k] = hi[dc + k] = data.q_cat[i, k]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _kept_count(leaf, i0, i1, model, leaves):
    """The leaf's keys that every query i0 .. i1-1 sums (one fewer where a query's own key
    may be in it, with exclude_self)."""
    a, b = leaves.leaf_start[leaf], leaves.leaf_start[leaf + 1]
    own = model.exclude_self and a < i1 and i0 < b
    return b - a - 1 if own else b - a


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _log_upper(top, log_size, degree, spread):
    """log U_L = top + log n_L + degree log(1 + spread) (module docstring), never NaN: -inf
    where no pair of the leaf weighs anything (top = -inf), whatever the spread; a spread
    that overflows (a box wider than 1e154 widths) counts only at degree >= 1 (0 * inf)."""
    if top == -np.inf:
        return -np.inf
    if degree == 0:
        return top + log_size
    return top + log_size + degree * math.log1p(spread)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def tile_bounds(i0, i1, data, model, leaves, upper, lower):
    """log U_L and log Lo_L of every leaf (module docstring) for the queries i0 .. i1-1
    together: the box of their continuous columns and the ranges of their codes against
    each leaf's, so that U_L bounds the leaf for each of them and Lo_L from below."""
    degree = model.degree
    width = data.q_cont.shape[1] + data.q_cat.shape[1]
    tile_lo, tile_hi = np.empty(width), np.empty(width)
    point_lo, point_hi = np.empty(width), np.empty(width)
    _query_point(i0, data, tile_lo, tile_hi)
    for i in range(i0 + 1, i1):
        _query_point(i, data, point_lo, point_hi)
        for f in range(width):
            tile_lo[f] = min(tile_lo[f], point_lo[f])
            tile_hi[f] = max(tile_hi[f], point_hi[f])
    for leaf in range(leaves.leaf_start.shape[0] - 1):
        top, bottom, spread = _box_bounds(tile_lo, tile_hi, leaf, model, leaves)
        upper[leaf] = _log_upper(top, leaves.log_size[leaf], degree, spread)
        kept = _kept_count(leaf, i0, i1, model, leaves)
        lower[leaf] = bottom + math.log(kept) if kept > 0 else -np.inf


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _log_add(a, b):
    """log(exp(a) + exp(b)) without overflow or underflow (-inf: an empty sum)."""
    top, low = max(a, b), min(a, b)
    if low == -np.inf:
        return top
    return top + math.log1p(math.exp(low - top))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _log_floor(i0, i1, data, model, leaves, upper, lower):
    """The log of a lower bound of every normaliser of the queries i0 .. i1-1: the larger
    of the tile's sum of Lo_L and, per query, its own Lo_L over the ``_FLOOR_LEAVES``
    leaves of largest U_L (a tile wider than the widths has weak tile bounds; a query
    against the leaves nearest it does not), the smallest over the queries. In logs
    throughout: the queries of one chunk may have normalisers e^-4000 apart (a query
    whose nearest keys are far), and no share of either may round to 0."""
    n_leaves = upper.shape[0]
    tile_floor = -np.inf
    for leaf in range(n_leaves):
        tile_floor = _log_add(tile_floor, lower[leaf])
    best = np.full(_FLOOR_LEAVES, -1, dtype=np.int64)
    for leaf in range(n_leaves):  # the leaves of largest upper bound, by insertion
        slot = _FLOOR_LEAVES
        while slot > 0 and (best[slot - 1] < 0 or upper[best[slot - 1]] < upper[leaf]):
            slot -= 1
        if slot < _FLOOR_LEAVES:
            for s in range(_FLOOR_LEAVES - 1, slot, -1):
                best[s] = best[s - 1]
            best[slot] = leaf
    width = data.q_cont.shape[1] + data.q_cat.shape[1]
    point_lo, point_hi = np.empty(width), np.empty(width)
    floor = np.inf
    for i in range(i0, i1):
        _query_point(i, data, point_lo, point_hi)
        own = -np.inf
        for s in range(_FLOOR_LEAVES):
            leaf = best[s]
            if leaf < 0:
                break
            kept = _kept_count(leaf, i, i + 1, model, leaves)
            if kept > 0:
                bottom = _box_bounds(point_lo, point_hi, leaf, model, leaves)[1]
                own = _log_add(own, bottom + math.log(kept))
        floor = min(floor, max(own, tile_floor))
    return floor


@njit(cache=config.CACHE)
def _precedes(values, a, b):
    """Whether index a comes before index b in :func:`ascending_order`: the smaller
    value, NaN last, the smaller index on ties."""
    va, vb = values[a], values[b]
    if va == vb or (va != va and vb != vb):
        return a < b
    return va < vb or vb != vb


@njit(cache=config.CACHE)
def ascending_order(values):
    """The indices of ``values`` in increasing order of value (NaN last, ties by index: one
    total order, so every run visits the leaves alike), by heapsort. ``np.argsort`` would
    compile numba's generic quicksort into every kernel that prunes (about 3 s of each)."""
    n = values.shape[0]
    order = np.arange(n)
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(values, order, start, n)
    for end in range(n - 1, 0, -1):
        order[0], order[end] = order[end], order[0]
        _sift_down(values, order, 0, end)
    return order


@njit(cache=config.CACHE)
def _sift_down(values, order, root, end):
    """Restore the max-heap (by :func:`_precedes`) of ``order[:end]`` below ``root``."""
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and _precedes(values, order[child], order[child + 1]):
            child += 1
        if not _precedes(values, order[root], order[child]):
            return
        order[root], order[child] = order[child], order[root]
        root = child


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def kept_runs(i0, i1, data, model, leaves, upper, lower, runs):
    """The key ranges [runs[r, 0], runs[r, 1]) that the passes visit for the queries
    i0 .. i1-1 (a chunk of neighbours); returns their count. ``upper``, ``lower``
    (n_leaves,) and ``runs`` (n_leaves, 2) are scratch."""
    n_k = data.log_weights.shape[0]
    n_leaves = leaves.leaf_start.shape[0] - 1
    if leaves.rtol <= 0.0 or n_leaves <= 1 or model.missing:
        runs[0, 0], runs[0, 1] = 0, n_k
        return 1
    tile_bounds(i0, i1, data, model, leaves, upper, lower)
    # a leaf whose bound overflowed (+inf: a design product beyond float64) is always kept
    finite = False
    unbounded = False
    for leaf in range(n_leaves):
        if upper[leaf] == np.inf:
            unbounded = True
        elif upper[leaf] > -np.inf:
            finite = True
    if not finite and not unbounded:  # no key reaches the queries
        return 0
    log_floor = _log_floor(i0, i1, data, model, leaves, upper, lower) if finite else -np.inf
    # the leaves of smallest U_L, as many as their sum allows: sum U_L <= rtol floor, in
    # logs (no share rounds to 0); without a lower bound only leaves of weight 0 go
    budget = math.log(leaves.rtol) + log_floor
    dropped = np.zeros(n_leaves, dtype=np.bool_)
    spent = -np.inf
    for leaf in ascending_order(upper):
        if upper[leaf] == -np.inf:
            dropped[leaf] = True
            continue
        if upper[leaf] == np.inf:
            break
        total = _log_add(spent, upper[leaf])
        if not total <= budget:
            break
        dropped[leaf] = True
        spent = total
    n_runs = 0
    open_run = False
    for leaf in range(n_leaves):
        if not dropped[leaf]:
            if open_run:
                runs[n_runs - 1, 1] = leaves.leaf_start[leaf + 1]
            else:
                runs[n_runs, 0] = leaves.leaf_start[leaf]
                runs[n_runs, 1] = leaves.leaf_start[leaf + 1]
                n_runs += 1
                open_run = True
        else:
            open_run = False
    return n_runs


def chunk_runs(chunk, data, model, leaves):
    """``(first, stop, runs, n_runs)``: the queries first .. stop-1 of chunk ``chunk``
    (``leaves.query_start``) and the key ranges ``runs[:n_runs]`` they visit, the
    passes' one call per chunk: with ``AllKeys`` every key, with ``LocalLeaves`` the
    runs of :func:`kept_runs`. The choice is made on the type, when a pass compiles,
    so the exact passes carry none of the pruning code (it cost their first compile
    about 5 s)."""
    raise NotImplementedError("chunk_runs is compiled into the passes (numba only)")


@overload(chunk_runs, inline="always")
def _chunk_runs_overload(chunk, data, model, leaves):
    if getattr(leaves, "instance_class", None) is AllKeys:

        def every_key(chunk, data, model, leaves):
            runs = np.zeros((1, 2), dtype=np.int64)
            runs[0, 1] = data.log_weights.shape[0]
            return leaves.query_start[chunk], leaves.query_start[chunk + 1], runs, np.int64(1)

        return every_key
    return lambda chunk, data, model, leaves: _pruned_runs(chunk, data, model, leaves)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _pruned_runs(chunk, data, model, leaves):
    n_leaves = leaves.leaf_start.shape[0] - 1
    upper, lower = np.zeros(n_leaves), np.zeros(n_leaves)
    runs = np.zeros((max(n_leaves, 1), 2), dtype=np.int64)
    first, stop = leaves.query_start[chunk], leaves.query_start[chunk + 1]
    n_runs = np.int64(kept_runs(first, stop, data, model, leaves, upper, lower, runs))
    return first, stop, runs, n_runs


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def block_runs(block_size, data, model, leaves):
    """``(block_runs, runs)`` of the GPU passes (``_core.local_groups.BlockRuns``): for
    each block of ``block_size`` consecutive queries the key ranges :func:`kept_runs`
    keeps for them, ``runs[block_runs[b, 0] : block_runs[b, 1]]``."""
    n_q = data.q_cont.shape[0]
    n_leaves = leaves.leaf_start.shape[0] - 1
    n_blocks = (n_q + block_size - 1) // block_size
    upper, lower = np.zeros(n_leaves), np.zeros(n_leaves)
    scratch = np.zeros((max(n_leaves, 1), 2), dtype=np.int64)
    table = np.zeros((n_blocks, 2), dtype=np.int64)
    runs = np.zeros((max(n_blocks, 1), 2), dtype=np.int64)
    used = 0
    for b in range(n_blocks):
        i0 = b * block_size
        i1 = min(i0 + block_size, n_q)
        n_runs = kept_runs(i0, i1, data, model, leaves, upper, lower, scratch)
        if used + n_runs > runs.shape[0]:  # grow by doubling: the total is not known ahead
            grown = np.zeros((max(2 * runs.shape[0], used + n_runs), 2), dtype=np.int64)
            for r in range(used):  # element by element (tests/kernels/test_kernel_sources.py)
                grown[r, 0], grown[r, 1] = runs[r, 0], runs[r, 1]
            runs = grown
        for r in range(n_runs):
            runs[used + r, 0], runs[used + r, 1] = scratch[r, 0], scratch[r, 1]
        table[b, 0], table[b, 1] = used, used + n_runs
        used += n_runs
    return table, runs[: max(used, 1)].copy()


@njit(cache=config.CACHE)
def leaf_ranges(keys_cont_t, keys_cat_t, log_weights, leaf_start):
    """The leaves' ranges of keys in k-d order: ``(box_lo, box_hi)`` (n_leaves, dc) of the
    continuous columns, ``(cat_lo, cat_hi)`` (n_leaves, dk) of the codes and
    ``(log_weight_max, log_weight_min)`` and ``log_size``, the log of the leaf's key
    count (widened by the bounds' margin), (n_leaves,)."""
    n_leaves = leaf_start.shape[0] - 1
    dc, dk = keys_cont_t.shape[0], keys_cat_t.shape[0]
    box_lo = np.empty((n_leaves, dc))
    box_hi = np.empty((n_leaves, dc))
    cat_lo = np.empty((n_leaves, dk))
    cat_hi = np.empty((n_leaves, dk))
    w_max = np.empty(n_leaves)
    w_min = np.empty(n_leaves)
    log_size = np.empty(n_leaves)
    for leaf in range(n_leaves):
        a, b = leaf_start[leaf], leaf_start[leaf + 1]
        for c in range(dc):
            box_lo[leaf, c] = keys_cont_t[c, a:b].min()
            box_hi[leaf, c] = keys_cont_t[c, a:b].max()
        for k in range(dk):
            cat_lo[leaf, k] = keys_cat_t[k, a:b].min()
            cat_hi[leaf, k] = keys_cat_t[k, a:b].max()
        w_max[leaf] = log_weights[a:b].max()
        w_min[leaf] = log_weights[a:b].min()
        log_size[leaf] = math.log((b - a) * _MARGIN)
    return box_lo, box_hi, cat_lo, cat_hi, w_max, w_min, log_size


@njit(cache=config.CACHE)
def visited_share(data, model, leaves, chunks):
    """The share of the keys that the chunks numbered ``chunks`` visit (``kept_runs``), over
    those chunks' queries: the cost model's sample (``nbattn.local.leaves``)."""
    n_k = data.log_weights.shape[0]
    visited = 0.0
    queries = 0.0
    for chunk in chunks:
        first, stop, runs, n_runs = chunk_runs(chunk, data, model, leaves)
        kept = 0
        for r in range(n_runs):
            kept += runs[r, 1] - runs[r, 0]
        visited += kept * (stop - first)
        queries += stop - first
    return visited / (queries * n_k) if queries > 0 and n_k > 0 else 0.0
