"""The keys in k-d order and their leaves' bounding boxes: which keys a LOO tile needs.

``nbattn.kernels.loo_tiles.loo_tiles_boxed`` prunes by boxes in every score
coordinate. A window along one direction is not enough when several score
coordinates are wide (a table whose widths make a category an almost exact
match, sizes that vary together): a key can be close along that direction and
far in another. Here the keys are ordered by a k-d split (``kd_order``: halve the
widest coordinate of each node at its median, down to leaves of ``leaf_keys``
keys), so that each leaf, a contiguous range of the order, is small in every
coordinate (``leaf_boxes``), and a tile keeps only the leaves whose bounding box
comes within reach of one of its rows (``kept_leaves``):

    dist^2(z_i, box) = sum_f max(lo_f - z_if, 0, z_if - hi_f)^2 <= |z_i - z_j|^2

for every key j in the box, so a leaf with dist^2(z_i, box) > U_i + gap holds
no key of row i's weight above exp(-gap) of its largest, U_i being row i's
squared distance to the nearest of a few keys beside it in the order (so
-max_j s_ij <= U_i). The bound is per row; a tile takes the union of its rows'
leaves.

Points are float64, ``z`` (n, k) row-major for the order, ``z_t`` (k, n) in
k-d order for the boxes and the bound.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from .. import config
from .items import next_item, run_items

_NEIGHBOURS = 4  # keys on each side, in the k-d order, that bound a row's best score


#: The guard of ``_select_median``: a call may scan (hi - lo + 1 summed over its partition
#: passes) at most _SCAN_PER_KEY * (b - a) + _SCAN_SLACK keys before it sorts what is left.
#: Hoare's selection scans about 3.4 (b - a) on average. Measured over ~6e6 calls per kind
#: (n 1e2..1e5, k 1..5, leaves of 1..256 keys, 12 draws each): random normal, uniform,
#: clustered, lognormal, Cauchy, NaN-holding, mixed categorical and rounded keys at most
#: 9.7 (b - a); few values, sorted, reverse-sorted, constant at most 4.6; random walks
#: at most 17 (12 at n 3e5..1e6). Organ-pipe columns scan about (b - a)^2 / 5, and columns
#: near that shape reach the budget too (a bump or a sine sampled on a sorted grid, V
#: shapes): there the order is the guarded selection's, as valid a split.
_SCAN_PER_KEY = 32
_SCAN_SLACK = 256

#: ``kd_order`` splits on the threads from this many keys (``kd_split``): below it the
#: hand-offs (about 0.05 ms each, a few a call) cost about what the threads save.
_PARALLEL_KEYS = 16384
#: The nodes per thread whose subtrees ``kd_split`` hands out whole (work items of about
#: equal size: a thread that finishes early takes the next one).
_ITEMS_PER_THREAD = 4
#: Subtrees of at most this many keys are handed out whole even when there are fewer than
#: ``_ITEMS_PER_THREAD`` a thread (``kd_split``).
_SUBTREE_KEYS = 16384
#: Columns per work item of ``take_columns``, and the values from which it gathers on the
#: threads (about 0.3 ms of work: a hand-off costs about 0.05).
_TAKE_COLUMNS = 4096
_PARALLEL_VALUES = 1 << 17


@njit(cache=config.CACHE)
def _sort_range(order, zc, lo, stop, dim):
    """Sort positions [lo, stop) of ``order`` (and ``zc``'s columns with it) by the key
    along ``dim``, NaN last, ties kept in their present order (a stable bottom-up merge
    sort: O(m log m) whatever the keys)."""
    k = zc.shape[0]
    m = stop - lo
    key = zc[dim, lo:stop].copy()
    pos = np.arange(m)
    key_out = np.empty(m)
    pos_out = np.empty(m, dtype=np.int64)
    width = 1
    while width < m:
        for start in range(0, m, 2 * width):
            middle = min(start + width, m)
            end = min(start + 2 * width, m)
            i, j, t = start, middle, start
            while i < middle and j < end:
                x, y = key[j], key[i]
                # x strictly before y: smaller, or a number before a NaN
                if x < y or (y != y and x == x):
                    key_out[t], pos_out[t] = x, pos[j]
                    j += 1
                else:
                    key_out[t], pos_out[t] = y, pos[i]
                    i += 1
                t += 1
            while i < middle:
                key_out[t], pos_out[t] = key[i], pos[i]
                i += 1
                t += 1
            while j < end:
                key_out[t], pos_out[t] = key[j], pos[j]
                j += 1
                t += 1
        key, key_out = key_out, key
        pos, pos_out = pos_out, pos
        width *= 2
    moved = order[lo:stop].copy()
    for t in range(m):
        order[lo + t] = moved[pos[t]]
    column = np.empty(m)
    for f in range(k):
        for t in range(m):
            column[t] = zc[f, lo + t]
        for t in range(m):
            zc[f, lo + t] = column[pos[t]]


@njit(cache=config.CACHE)
def _select_median(order, zc, a, b, mid, dim, scan_per_key):
    """Reorder order[a:b] so that order[mid] holds the median key along ``dim``, with no
    key before it larger and none after it smaller (Hoare's selection, the middle
    element as pivot, guarded). ``zc`` (k, n) holds the keys' coordinates in the current
    order (column t is key order[t]) and its columns move with ``order``: the selection
    reads contiguous memory, not the keys gathered through ``order``.

    The guard (introselect's idea): the middle pivot takes quadratic time on some columns
    (organ-pipe values, rising then falling: ~5 s at 2e5 keys, minutes at 1e6). Each pass
    adds the keys it scans, hi - lo + 1, to a count; a pass that would take it past
    ``scan_per_key * (b - a) + _SCAN_SLACK`` is not made, and the range [lo, hi] still
    holding the median is sorted instead (``_sort_range``: O(m log m), stable, NaN
    last), so a call costs O(m log m) at worst. The passes before leave [a, lo) no larger
    and (hi, b) no smaller than what [lo, hi] holds, so the split stays valid. Random
    keys of the kinds measured under ``_SCAN_PER_KEY`` scan about 3.4 (b - a) and have
    never come near the budget, so the guard only counts there and the order is exactly
    the unguarded selection's; columns that rise then fall may reach it. Returns whether
    the guard sorted."""
    k = zc.shape[0]
    lo, hi = a, b - 1
    budget = scan_per_key * (b - a) + _SCAN_SLACK
    scanned = 0
    while lo < hi:
        scanned += hi - lo + 1
        if scanned > budget:
            _sort_range(order, zc, lo, hi + 1, dim)
            return True
        pivot = zc[dim, (lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while zc[dim, i] < pivot:
                i += 1
            while zc[dim, j] > pivot:
                j -= 1
            if i <= j:
                order[i], order[j] = order[j], order[i]
                for f in range(k):
                    zc[f, i], zc[f, j] = zc[f, j], zc[f, i]
                i += 1
                j -= 1
        if mid <= j:
            hi = j
        elif mid >= i:
            lo = i
        else:
            return False
    return False


@njit(nogil=True, cache=config.CACHE)
def _split_items(counter, order, zc, node_a, node_b, leaf_keys, scan_per_key, levels):
    """Work items: node [node_a[i], node_b[i]) and its descendants down to ``levels``
    below it (all of them: 64) split, depth first, left before right, down to leaves of
    at most ``leaf_keys`` keys. A node is split at its median along its widest
    coordinate to (a + b) // 2 (``_select_median``). The nodes are disjoint, so each item
    moves its own range of ``order`` and ``zc``'s columns only."""
    k = zc.shape[0]
    stack_a = np.empty(64, dtype=np.int64)
    stack_b = np.empty(64, dtype=np.int64)
    stack_level = np.empty(64, dtype=np.int64)
    while True:
        item = next_item(counter)
        if item >= node_a.shape[0]:
            return
        stack_a[0], stack_b[0], stack_level[0] = node_a[item], node_b[item], 0
        top = 1
        while top > 0:
            top -= 1
            a, b, level = stack_a[top], stack_b[top], stack_level[top]
            if b - a <= leaf_keys or level >= levels:
                continue
            # int64 from its first value: a literal 0 compiles _select_median once more
            best_dim, best_extent = np.int64(0), -1.0
            for f in range(k):
                low, high = np.inf, -np.inf
                for t in range(a, b):
                    value = zc[f, t]
                    low = min(low, value)
                    high = max(high, value)
                if high - low > best_extent:
                    best_dim, best_extent = f, high - low
            mid = (a + b) // 2
            _select_median(order, zc, a, b, mid, best_dim, scan_per_key)
            # the right half first on the stack, so that the left one is split first
            stack_a[top], stack_b[top], stack_level[top] = mid, b, level + 1
            stack_a[top + 1], stack_b[top + 1], stack_level[top + 1] = a, mid, level + 1
            top += 2


def _leaf_starts(n, leaf_keys):
    """The leaves' first positions (plus n), in depth-first order, which is ascending:
    every split is at (a + b) // 2, so they follow from n and ``leaf_keys`` alone."""
    if n == 0:  # no leaf: the starts hold the end alone
        return np.zeros(1, dtype=np.int64)
    return np.append(_leaf_offsets(n, leaf_keys, {}), n)


def _leaf_offsets(m, leaf_keys, known):
    """The leaves' first positions in a node of m keys: a node of m > ``leaf_keys`` keys
    holds one of m // 2 and, after it, one of m - m // 2. A level's nodes have at most two
    sizes, so ``known`` (size -> offsets) makes it O(log m) concatenations."""
    if m <= leaf_keys:
        return np.zeros(1, dtype=np.int64)
    if m not in known:
        half = m // 2
        left = _leaf_offsets(half, leaf_keys, known)
        known[m] = np.concatenate((left, half + _leaf_offsets(m - half, leaf_keys, known)))
    return known[m]


def _children(node_a, node_b):
    """The nodes' halves, left then right of each: ``(a, b)`` of 2 len(node_a) nodes."""
    mid = (node_a + node_b) // 2
    return np.stack((node_a, mid), axis=1).ravel(), np.stack((mid, node_b), axis=1).ravel()


def _split_a_level(node_a, node_b, threads):
    """Whether ``kd_split`` splits the nodes [node_a, node_b) one level before it hands
    their subtrees out whole: while they are fewer than the threads, or fewer than
    ``_ITEMS_PER_THREAD`` per thread and larger than ``_SUBTREE_KEYS`` (a level's
    hand-off costs about what a few items of that size lose to an uneven share)."""
    count = node_a.shape[0]
    if count == 0:
        return False
    return count < threads or (
        count < _ITEMS_PER_THREAD * threads and (node_b - node_a).max() > _SUBTREE_KEYS
    )


def _run(kernel, threaded, *args):
    """``kernel(counter, *args)`` on the threads (:func:`run_items`) or on this one."""
    if threaded:
        run_items(kernel, *args)
    else:
        kernel(np.zeros(1, dtype=np.int64), *args)


def kd_split(zc, leaf_keys, scan_per_key=_SCAN_PER_KEY, parallel_keys=_PARALLEL_KEYS):
    """``(order, leaf_start)`` of :func:`kd_order` for the keys' float64 coordinates
    ``zc`` (k, n), C-contiguous, which it leaves in k-d order (column t is key order[t]).

    The split of a node reads and moves only its own range of ``order`` and ``zc``, so
    nodes with no ancestor left to split can be split in any order, on any thread, to
    the same result as the serial depth-first split. From ``parallel_keys`` keys on (and
    on more than one thread) the top of the tree is split level by level, each level's
    nodes the work items of :func:`nbattn.kernels.items.run_items`, until a level holds a
    node to split per thread and either ``_ITEMS_PER_THREAD`` per thread or nodes of at
    most ``_SUBTREE_KEYS`` keys (:func:`_split_a_level`); those nodes' subtrees are then
    split whole, one item each. Below it, or on one thread, the root's subtree is the
    one item, on this thread.
    """
    k, n = zc.shape
    leaf_keys = max(int(leaf_keys), 1)
    order = np.arange(n)
    starts = _leaf_starts(n, leaf_keys)
    scan_per_key = np.int64(scan_per_key)
    threads = numba.get_num_threads()
    threaded = threads > 1 and n >= parallel_keys
    # the nodes to split (none without coordinates: any order is a k-d order of no features)
    node_a = np.zeros(1 if n > leaf_keys and k > 0 else 0, dtype=np.int64)
    node_b = np.full(node_a.shape[0], n, dtype=np.int64)
    if threaded:
        while _split_a_level(node_a, node_b, threads):
            _run(
                _split_items,
                node_a.shape[0] > 1,
                order,
                zc,
                node_a,
                node_b,
                leaf_keys,
                scan_per_key,
                1,
            )
            node_a, node_b = _children(node_a, node_b)
            split = node_b - node_a > leaf_keys
            node_a, node_b = node_a[split], node_b[split]
    if node_a.shape[0] > 0:
        _run(_split_items, threaded, order, zc, node_a, node_b, leaf_keys, scan_per_key, 64)
    return order, starts


def kd_order(z, leaf_keys, scan_per_key=_SCAN_PER_KEY, parallel_keys=_PARALLEL_KEYS):
    """``(order, leaf_start)``: keys in k-d order and the leaves' first positions (plus n).

    Each node [a, b) of more than ``leaf_keys`` keys (at least 1) is split at its median
    along its widest coordinate; leaves are ranges of ``order``, in depth-first order.
    Keys are compared as float64. The split works on a copy of the coordinates kept in
    the current order (feature-major, k n float64 more), so that each node's extents and
    selection scan contiguous memory. The median selection is guarded
    (``_select_median``): O(m log m) per node at worst, O(n log^2 n) in all, and on
    normal keys the same order as plain Hoare's selection. ``scan_per_key``: the guard's
    budget per key (``_SCAN_PER_KEY``; one too large to reach, such as 2**40, gives the
    plain selection, the reference the tests compare with). From ``parallel_keys`` keys
    on the split runs on the threads (:func:`kd_split`), to the same order.
    """
    zc = np.array(z.T, dtype=np.float64, order="C")  # a copy, even of a float64 z.T
    return kd_split(zc, leaf_keys, scan_per_key, parallel_keys)


@njit(nogil=True, cache=config.CACHE)
def _take_items(counter, x, order, out):
    """Work items: out[:, t] = x[:, order[t]] for the columns of chunk ``item``."""
    p, n = out.shape
    n_chunks = (n + _TAKE_COLUMNS - 1) // _TAKE_COLUMNS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        for f in range(p):
            for t in range(chunk * _TAKE_COLUMNS, min(n, (chunk + 1) * _TAKE_COLUMNS)):
                out[f, t] = x[f, order[t]]


def take_columns(x, order, parallel_values=_PARALLEL_VALUES):
    """``x[:, order]`` (C-contiguous, x's dtype), its chunks of columns on the threads
    from ``parallel_values`` values on (a few ns each: a gather from memory)."""
    out = np.empty((x.shape[0], order.shape[0]), dtype=x.dtype)
    threaded = numba.get_num_threads() > 1 and out.size >= parallel_values
    _run(_take_items, threaded, x, order, out)
    return out


@njit(cache=config.CACHE)
def leaf_boxes(z_t, leaf_start):
    """(lo, hi), each (n_leaves, k): the bounding box of each leaf's keys (z_t in k-d order)."""
    k = z_t.shape[0]
    n_leaves = leaf_start.shape[0] - 1
    lo = np.empty((n_leaves, k))
    hi = np.empty((n_leaves, k))
    for leaf in range(n_leaves):
        for f in range(k):
            low, high = np.inf, -np.inf
            for j in range(leaf_start[leaf], leaf_start[leaf + 1]):
                low = min(low, z_t[f, j])
                high = max(high, z_t[f, j])
            lo[leaf, f] = low
            hi[leaf, f] = high
    return lo, hi


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _row_bound(z_t, own):
    """U: the squared distance from key ``own`` to the nearest of its neighbours in the
    order (an upper bound of -max_j s_own,j); inf when there is none or it overflows."""
    k, n = z_t.shape
    nearest = np.inf
    for j in range(max(own - _NEIGHBOURS, 0), min(own + _NEIGHBOURS + 1, n)):
        if j == own:
            continue
        dist = 0.0
        for f in range(k):
            diff = z_t[f, j] - z_t[f, own]
            dist += diff * diff
        nearest = min(nearest, dist)
    return nearest


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def kept_leaves(z_t, rows, i0, nb, box_lo, box_hi, prune_gap, reach, keep):
    """keep[leaf] <- whether some row of the block comes within reach of the leaf's box
    (the bound of the module docstring); every leaf when a row's bound is not finite.
    ``reach`` (block_rows,) is scratch: each row's U_i + gap."""
    k = z_t.shape[0]
    n_leaves = box_lo.shape[0]
    block_lo = np.full(k, np.inf)
    block_hi = np.full(k, -np.inf)
    reach_max = 0.0
    for r in range(nb):
        own = rows[i0 + r]
        bound = _row_bound(z_t, own)
        if not bound < np.inf:
            keep[:] = True
            return
        # a relative margin over the rounding of the bound and of the box distances
        reach[r] = (bound + prune_gap) * (1.0 + 1e-9)
        reach_max = max(reach_max, reach[r])
        for f in range(k):
            block_lo[f] = min(block_lo[f], z_t[f, own])
            block_hi[f] = max(block_hi[f], z_t[f, own])
    for leaf in range(n_leaves):
        keep[leaf] = False
        # the distance between the block's box and the leaf's first: a cheap filter
        total = 0.0
        for f in range(k):
            gap = max(box_lo[leaf, f] - block_hi[f], block_lo[f] - box_hi[leaf, f], 0.0)
            total += gap * gap
        if total > reach_max:
            continue
        for r in range(nb):
            own = rows[i0 + r]
            total = 0.0
            for f in range(k):
                value = z_t[f, own]
                gap = max(box_lo[leaf, f] - value, value - box_hi[leaf, f], 0.0)
                total += gap * gap
            if total <= reach[r]:
                keep[leaf] = True
                break


@njit(cache=config.CACHE)
def kept_keys(leaf_start, keep, key_index):
    """key_index[:width] <- the positions of the keys of the kept leaves (``keep``),
    ascending; returns width."""
    width = 0
    for leaf in range(keep.shape[0]):
        if not keep[leaf]:
            continue
        for j in range(leaf_start[leaf], leaf_start[leaf + 1]):
            key_index[width] = j
            width += 1
    return width


@njit(cache=config.CACHE)
def kd_nodes(z_t, leaf_keys):
    """The whole tree of ``kd_order``'s split as arrays: ``(start, stop, right, lo, hi)``.

    ``z_t`` (k, n) holds the keys in k-d order (the order ``kd_order(z, leaf_keys)``
    returned, with the same ``leaf_keys``). The split of a node [a, b) of more than
    ``leaf_keys`` keys is at (a + b) // 2 whatever the data, so the ranges follow from n
    alone and the order supplies the rest. Nodes are numbered in depth-first preorder:
    node 0 is the root, an internal node's left child is the node after it and
    ``right[node]`` its right child; a leaf has ``right = -1``. ``start``/``stop`` are
    each node's range of the order, ``lo``/``hi`` (n_nodes, k) its keys' bounding box
    (float64).
    """
    k, n = z_t.shape
    stack_a = np.empty(128, dtype=np.int64)
    stack_b = np.empty(128, dtype=np.int64)
    stack_parent = np.empty(128, dtype=np.int64)
    n_nodes = 0
    stack_a[0], stack_b[0] = 0, n
    top = 1
    while top > 0:  # count first
        top -= 1
        a, b = stack_a[top], stack_b[top]
        n_nodes += 1
        if b - a > leaf_keys:
            mid = (a + b) // 2
            stack_a[top], stack_b[top] = mid, b
            stack_a[top + 1], stack_b[top + 1] = a, mid
            top += 2
    start = np.empty(n_nodes, dtype=np.int64)
    stop = np.empty(n_nodes, dtype=np.int64)
    right = np.full(n_nodes, -1, dtype=np.int64)
    lo = np.empty((n_nodes, k))
    hi = np.empty((n_nodes, k))
    node = 0
    stack_a[0], stack_b[0], stack_parent[0] = 0, n, -1
    top = 1
    while top > 0:
        top -= 1
        a, b, parent = stack_a[top], stack_b[top], stack_parent[top]
        if parent >= 0:  # pushed as a right child (left children carry -1)
            right[parent] = node
        start[node], stop[node] = a, b
        if b - a > leaf_keys:
            mid = (a + b) // 2
            stack_a[top], stack_b[top], stack_parent[top] = mid, b, node
            stack_a[top + 1], stack_b[top + 1], stack_parent[top + 1] = a, mid, -1
            top += 2
        node += 1
    for node in range(n_nodes - 1, -1, -1):  # children after parents: boxes bottom-up
        if right[node] < 0:
            for f in range(k):
                low, high = np.inf, -np.inf
                for j in range(start[node], stop[node]):
                    low = min(low, z_t[f, j])
                    high = max(high, z_t[f, j])
                lo[node, f] = low
                hi[node, f] = high
        else:
            for f in range(k):
                lo[node, f] = min(lo[node + 1, f], lo[right[node], f])
                hi[node, f] = max(hi[node + 1, f], hi[right[node], f])
    return start, stop, right, lo, hi
