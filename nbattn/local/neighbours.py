"""Nearest-neighbour widths (R np's ``bwtype``): a width per query or per key, set by
the data's density around it instead of one width per column.

For a continuous column with an integer k (``bandwidth`` holds k where fixed widths hold
h), with x_1 .. x_n the training values of the column:

* ``"generalized_nn"``: at a query x the column's width is h(x), the distance from x to
  its k-th nearest training value (for a training row in a leave-one-out fit, its k-th
  nearest *other* value), and the pair's kernel is K((x - x_i) / h(x)) / h(x);
* ``"adaptive_nn"``: training row i carries h_i, the distance from x_i to its k-th nearest
  other training value, and the pair's kernel is K((x - x_i) / h_i) / h_i.

A distance of 0 (k tied values at the point) would be a width of 0: there the width is
the distance to the nearest training value that differs from the point instead (the
k-th nearest *distinct* neighbour is not R np's rule; its rule divides by 0).

The engine keeps one width per column, the reference width h (the median of the column's
nearest-neighbour widths at the training rows), and scales its data by it as for fixed
widths; the kernel's argument is stretched by r = h / h(x) per query or r_i = h / h_i per
key (``LocalData.q_stretch`` / ``keys_stretch_t``, ``nbattn.kernels.local_pairs``), and
the design of a local polynomial keeps the differences in units of h, so a local-linear
fit is linear in x. The factor 1 / h_i of the adaptive kernel enters each key's log
weight (:meth:`nbattn.local.problem.LocalProblem.kernel_groups`); the factor 1 / h(x) of
the generalised kernel is the same for every key of a query, so it cancels in a
regression and the densities add it to each query's log density (:func:`query_log_stretch`).
"""

from __future__ import annotations

import numpy as np

from .._core.numeric import median

__all__ = [
    "BANDWIDTH_TYPES",
    "NN_TYPES",
    "check_neighbour_counts",
    "kth_distances",
    "neighbour_widths",
    "query_log_stretch",
    "refuse_stretched",
]

#: The nearest-neighbour width types.
NN_TYPES = ("generalized_nn", "adaptive_nn")
#: ``bandwidth_type``'s values: fixed widths, then the nearest-neighbour types.
BANDWIDTH_TYPES = ("fixed", *NN_TYPES)


def check_neighbour_counts(counts, n_train: int, name="bandwidth", columns=None) -> np.ndarray:
    """Neighbour counts k (one per continuous column) as float64 integers in [1, n - 1]
    (a training row has n - 1 other values); a ValueError naming the entry (``columns``:
    the continuous columns' names, else their positions among them) otherwise."""
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    for position, k in enumerate(counts):
        label = f"column {columns[position]!r}" if columns else f"continuous column {position}"
        if not (np.isfinite(k) and k == np.floor(k) and k >= 1):
            raise ValueError(
                f"{name}: nearest-neighbour widths take an integer k >= 1 per continuous "
                f"column, got {float(k)!r} for {label}"
            )
        if k > n_train - 1:
            raise ValueError(
                f"{name}: k = {k:g} for {label}, but a training row "
                f"has only {n_train - 1} other rows (n = {n_train})"
            )
    return counts


def kth_distances(sorted_values, points, k, skip_self=False) -> np.ndarray:
    """(m,) per point, the distance to its k-th nearest of ``sorted_values`` (n,), ascending;
    with ``skip_self`` each point is itself one of the values and not counted. Where that
    distance is 0 (tied values), the distance to the nearest value unequal to the point;
    0 where every value equals it.

    The k nearest values are a run a[lo : lo + k] of the sorted values, lo the first index
    with x - a[lo] <= a[lo + k] - x (a bisection, every point at once); the k-th distance
    is the larger of its two ends' distances."""
    a = np.asarray(sorted_values, dtype=np.float64)
    x = np.asarray(points, dtype=np.float64)
    k = int(k) + (1 if skip_self else 0)
    n = a.shape[0]
    lo = np.zeros(x.shape[0], dtype=np.int64)
    hi = np.full(x.shape[0], n - k, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            left_farther = (x - a[mid]) > (a[np.minimum(mid + k, n - 1)] - x)
            lo = np.where(open_ & left_farther, mid + 1, lo)
            hi = np.where(open_ & ~left_farther, mid, hi)
        dist = np.maximum(x - a[lo], a[lo + k - 1] - x)
        tied = dist == 0.0
        if tied.any():
            below = np.searchsorted(a, x[tied], side="left") - 1
            above = np.searchsorted(a, x[tied], side="right")
            gap_below = np.where(below >= 0, x[tied] - a[np.maximum(below, 0)], np.inf)
            gap_above = np.where(above < n, a[np.minimum(above, n - 1)] - x[tied], np.inf)
            gap = np.minimum(gap_below, gap_above)
            dist[tied] = np.where(np.isfinite(gap), gap, 0.0)
    return dist


def neighbour_widths(kind, counts, keys_cont, queries_cont, exclude_self, names=None):
    """The nearest-neighbour layout of the continuous columns: ``(h, q_stretch,
    keys_stretch_t)``, the reference widths (dc,), and the stretches r = h / h(x) of the
    queries (n_q, dc) for ``"generalized_nn"`` or r_i = h / h_i of the keys (dc, n_k) for
    ``"adaptive_nn"`` (the other (0, 0)).

    ``counts`` the k per continuous column (:func:`check_neighbour_counts`),
    ``keys_cont`` (n, dc) and ``queries_cont`` (n_q, dc) checked, complete columns;
    ``exclude_self``: the queries are the keys of a leave-one-out fit; ``names`` the
    columns' names in errors. Distances are taken in the data's own units (a difference
    of subnormals is exact). A ValueError names the column where one has a single value
    (no positive width), where a width lies beyond float64 (values near +-1e308 of both
    signs), or where the widths' ratio to their median does (a column spanning 1e-300 to
    1e300): never a silent 0 or inf."""
    n, dc = keys_cont.shape
    counts = check_neighbour_counts(counts, n)
    h = np.empty(dc)
    per_query = kind == "generalized_nn"
    q_stretch = np.empty((queries_cont.shape[0], dc) if per_query else (0, 0))
    keys_stretch_t = np.empty((0, 0) if per_query else (dc, n))
    for c in range(dc):
        label = names[c] if names is not None else f"continuous column {c}"
        keys = np.sort(keys_cont[:, c])
        at_keys = kth_distances(keys, keys_cont[:, c], counts[c], skip_self=True)
        if not at_keys.max() > 0.0:
            raise ValueError(
                f"{label} holds one value only: it has no nearest-neighbour width (a "
                "nearest-neighbour width needs two distinct values)"
            )
        reference = float(median(at_keys[at_keys > 0.0]))
        widths = at_keys
        if per_query and not exclude_self:  # else the queries are the keys
            widths = kth_distances(keys, queries_cont[:, c], counts[c])
        with np.errstate(over="ignore", divide="ignore"):
            stretch = _stretch(reference, widths)
        if not (np.isfinite(reference) and np.isfinite(stretch).all() and (stretch > 0).all()):
            raise ValueError(
                f"{label}: its nearest-neighbour widths (k = {counts[c]:g}) range from "
                f"{widths.min():.3g} to {widths.max():.3g} around their median "
                f"{reference:.3g}, beyond what float64 holds as a ratio or a distance"
            )
        h[c] = reference
        if per_query:
            q_stretch[:, c] = stretch
        else:
            keys_stretch_t[c] = stretch
    return h, np.ascontiguousarray(q_stretch), np.ascontiguousarray(keys_stretch_t)


def _stretch(reference, widths):
    """h / h(x), with a width of 0 (a point tied with every value) stretched as the smallest
    positive width of the column would be."""
    positive = widths[widths > 0.0]
    floor = positive.min() if positive.size else reference
    with np.errstate(divide="ignore", over="ignore"):
        return reference / np.where(widths > 0.0, widths, floor)


def query_log_stretch(q_stretch) -> np.ndarray:
    """(n_q,) sum over the continuous columns of log r(x): the log of the generalised
    kernel's 1 / h(x) in units of the reference widths, which a density adds to each
    query's log density; 0 per query without query stretches."""
    if q_stretch.shape[0] == 0:
        return 0.0
    return np.log(q_stretch).sum(axis=1)


def refuse_stretched(problem, what: str) -> None:
    """A NotImplementedError naming ``what`` where ``problem`` has nearest-neighbour
    widths (a path that reads one width per column)."""
    if problem.stretched:
        raise NotImplementedError(
            f"{what} take fixed widths only (bandwidth_type='fixed'); nearest-neighbour "
            f"widths ({problem.spec.bandwidth_type!r}) are not available there"
        )
