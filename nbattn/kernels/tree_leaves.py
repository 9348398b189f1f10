"""The leaves of a k-d tree in the blocks a walk of ``nbattn.kernels.tree_pool`` reads.

Each leaf's keys and values are copied into one contiguous block (the walk then reads a
leaf as one stream, not d + p strided ones), the values first scaled by a power of two
per output so that their weighted sums cannot overflow. :func:`leaf_blocks` builds them
once per tree; every walk of that tree (the cost model's sample, then every query) reads
the same blocks, and :func:`check_blocks` refuses blocks of another tree.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config

__all__ = ["check_blocks", "leaf_blocks", "packed_leaves", "value_exponents"]


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


@njit(fastmath=False, cache=config.CACHE)
def value_exponents(values_t):
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


def leaf_blocks(keys_t, values_t, start, stop, right):
    """What every walk of one tree reads: ``(pack, exponents, leaf_max, nodes)``, the
    leaves in one block each (:func:`packed_leaves`) with the values scaled by
    :func:`value_exponents` (``exponents`` undoes it), the largest leaf's keys and the
    tree's ``(start, stop, right)`` they were packed for. Built once and passed to each
    walk of the tree (``nbattn.kernels.tree_pool.tree_pool``: the cost model's sample
    walk, then the walk of every query), instead of once per walk."""
    exponents, values_s = value_exponents(values_t)
    pack = packed_leaves(keys_t, values_s, start, stop, right)
    leaves = right < 0
    leaf_max = int((stop[leaves] - start[leaves]).max()) if leaves.any() else 0
    return pack, exponents, leaf_max, (start, stop, right)


def check_blocks(leaves, keys_t, n_outputs, start, stop, right):
    """Refuses :func:`leaf_blocks` of other keys or another tree than the walk's: the walk
    reads the pack and sizes its scratch by ``leaf_max`` unchecked, so blocks of a tree
    with smaller leaves would overrun it. What it cannot see: other values of the same
    shape (the blocks must be built from the walk's own arrays)."""
    pack, exponents, _, (b_start, b_stop, b_right) = leaves
    width = keys_t.shape[0] + n_outputs
    if pack.shape != (keys_t.shape[1] * width,) or exponents.shape != (n_outputs,):
        raise ValueError(
            f"leaves: a pack of {pack.shape[0]} and {exponents.shape[0]} exponents, not the "
            f"{keys_t.shape[1]} keys x {width} of these keys and values (leaf_blocks)"
        )
    if pack.dtype != keys_t.dtype:
        raise ValueError(f"leaves: packed in {pack.dtype}, the keys are {keys_t.dtype}")
    same = all(
        mine.shape == theirs.shape and np.array_equal(mine, theirs)
        for mine, theirs in ((start, b_start), (stop, b_stop), (right, b_right))
    )
    if not same:
        raise ValueError("leaves: packed for another tree than the nodes walked (leaf_blocks)")
