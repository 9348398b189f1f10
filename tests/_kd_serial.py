"""The serial k-d split as it was before the threads: the reference the threaded
split (``nbattn.kernels.kd_order.kd_split``) must equal bit for bit."""

import numpy as np
from numba import njit

from nbattn.kernels import kd_order as kd


@njit(cache=True)
def serial_kd_order(z, leaf_keys, scan_per_key):
    """``(order, leaf_start)`` of the serial split: one stack, depth first, left before
    right, the same guarded median selection (``kd_order._select_median``)."""
    n, k = z.shape
    leaf_keys = max(leaf_keys, 1)
    order = np.arange(n)
    if n == 0:
        return order, np.zeros(1, dtype=np.int64)
    zc = np.empty((k, n))
    for t in range(n):
        for f in range(k):
            zc[f, t] = z[t, f]
    stack_a = np.empty(64, dtype=np.int64)
    stack_b = np.empty(64, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    n_leaves = 0
    stack_a[0], stack_b[0] = 0, n
    top = 1
    while top > 0:
        top -= 1
        a, b = stack_a[top], stack_b[top]
        if b - a <= leaf_keys:
            starts[n_leaves] = a
            n_leaves += 1
            continue
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
        kd._select_median(order, zc, a, b, mid, best_dim, scan_per_key)
        stack_a[top], stack_b[top] = mid, b
        stack_a[top + 1], stack_b[top + 1] = a, mid
        top += 2
    starts[n_leaves] = n
    return order, starts[: n_leaves + 1].copy()
