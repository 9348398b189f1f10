"""Nadaraya-Watson within a relative tolerance: the k-d tree path of ``rtol > 0``.

:func:`nbattn.nadaraya_watson` with ``rtol > 0`` comes here on the CPU. The keys are put
in k-d order once (O(n log n), arrays), each query walks the tree and drops the nodes
whose weight is certified small (``nbattn.kernels.tree_pool``, whose docstring holds the
rule and its proof), and the rows too far from every key for the tree's sums are
recomputed by the exact streaming kernel. A cost model picks the exact streaming path
instead where the tree would not pay (few keys, many features, or a sample of the
queries that finds little to drop): ``rtol`` is a licence to be faster, never slower.
Where that sample sums much of the keys (wide widths, few features) it may also build the
nodes' Taylor series (``nbattn.kernels.tree_series``) and walk the sample again with them,
keeping them where that is cheaper (:func:`_tree_plan`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .. import config
from ..dispatch.device import kernels_for

__all__ = ["pool_within_rtol", "tree_layout"]


def tree_layout(k_t, v_t, exclude_self, n_queries):
    """The laid-out keys (d, n) and values (p, n) in k-d order with the tree's nodes:
    ``(k_t, v_t, nodes, own)``, ``nodes`` = (start, stop, right, lo, hi) of
    ``kernels.kd_order.kd_nodes`` and ``own`` the k-d position of key i for query i
    (``exclude_self``) or an empty array."""
    tree = kernels_for("tree_pool", "cpu")
    leaf_keys = int(config.TREE_LEAF_KEYS)
    points = np.array(k_t, dtype=np.float64, order="C")  # left in k-d order by kd_split
    order, _ = tree.kd_split(points, leaf_keys)
    # float64 back to k_t's dtype is exact: the keys in k-d order, with no gather
    k_t = points if k_t.dtype == np.float64 else points.astype(k_t.dtype)
    v_t = tree.take_columns(v_t, order)
    nodes = tree.kd_nodes(k_t, leaf_keys)
    own = np.empty(0, dtype=np.int64)
    if exclude_self:
        own = np.empty(k_t.shape[1], dtype=np.int64)
        own[order] = np.arange(k_t.shape[1])
        own = own[:n_queries]
    return k_t, v_t, nodes, own


def _query_order(q):
    """The queries in k-d order: neighbouring rows then walk the same leaves (cache)."""
    if q.shape[0] <= int(config.TREE_LEAF_KEYS):
        return np.arange(q.shape[0])
    order, _ = kernels_for("tree_pool", "cpu").kd_order(
        np.ascontiguousarray(q, dtype=np.float64), int(config.TREE_LEAF_KEYS)
    )
    return order


def _sample_tiles(order, tile, n_sample):
    """About ``n_sample`` rows of ``order`` (the queries in k-d order) as whole tiles of
    ``tile`` consecutive rows, the tiles evenly spaced over the order."""
    n_queries = order.shape[0]
    n_tiles = max(1, min(n_queries // tile, -(-n_sample // tile)))
    if n_tiles * tile >= n_queries:
        return order
    firsts = np.linspace(0, n_queries - tile, n_tiles).round().astype(np.int64)
    return order[(firsts[:, None] + np.arange(tile)).ravel()]


def _walk_cost(q, k_t, v_t, nodes, own, rtol, rows, series, ratio, leaves):
    """The sample walk of ``rows`` (with ``series`` or None; ``leaves`` the tree's
    ``leaf_blocks``): ``(cost per near query in streamed keys, share of near rows, share
    of the keys summed)`` (``config.TREE_*``)."""
    tree = kernels_for("tree_pool", "cpu")
    tile = int(config.TREE_TILE_ROWS)
    coarse = tree.coarse_for(rtol, q.dtype)
    _, _, far, work = tree.tree_pool(
        q, k_t, v_t, *nodes, own, rtol, rows, tile, coarse, series, ratio, leaves
    )
    near = ~far
    if not near.any():
        return None
    channels = 1 + v_t.shape[0]
    node_cost = config.TREE_NODE_COST + (0 if series is None else config.TREE_SERIES_NODE_COST)
    per_query = (
        work[near, 0].mean() * config.TREE_KEY_COST
        + work[near, 1].mean() * node_cost
        + work[near, 2].mean() * channels * config.TREE_SERIES_TERM_COST
    ) / 100.0
    return per_query, near.mean(), work[near, 0].mean() / k_t.shape[1]


def series_degree_bound(d):
    """The series' degree bound p (terms of degree below p) for d features (config)."""
    p = 1
    while p < min(config.TREE_SERIES_MAX_DEGREE, 170) and (
        math.comb(p + d, d) <= config.TREE_SERIES_MAX_TERMS
    ):
        p += 1
    return p


def series_build_cost(nodes, d, n_outputs):
    """What building the nodes' series costs, in streamed keys (``config.TREE_SERIES_*``):
    each node's keys times its terms times the channels (``tree_series``'s rule)."""
    start, stop = nodes[0], nodes[1]
    p_max = series_degree_bound(d)
    terms = np.array([math.comb(p - 1 + d, d) for p in range(1, p_max + 1)])
    fit = np.searchsorted(terms * config.TREE_SERIES_KEYS_PER_TERM, stop - start, side="right")
    per_node = np.where(fit > 0, terms[np.maximum(fit - 1, 0)], 0)
    ops = float(((stop - start) * per_node).sum()) * (1 + n_outputs)
    return config.TREE_SERIES_BUILD_COST / 100.0 * ops


def _tree_plan(q, k_t, v_t, nodes, own, rtol, order, leaves=None):
    """The cost model: ``(pays, series, ratio)``: whether walking the tree (built) beats
    streaming every key, and with the nodes' Taylor series (their tables) or without
    (None), from a sample of tiles of the queries in k-d order ``order`` (``config.TREE_*``;
    deterministic, no clocks). Series are built only where the sample walk without them
    sums a large share of the keys and could still pay for their build. ``leaves``: the
    tree's ``leaf_blocks``, which the walks share (None: each walk builds its own)."""
    n_queries, n_keys, d = q.shape[0], k_t.shape[1], q.shape[1]
    rows = _sample_tiles(order, int(config.TREE_TILE_ROWS), int(config.TREE_SAMPLE_QUERIES))
    ratio = config.TREE_SERIES_TERM_COST * (1 + v_t.shape[0]) / config.TREE_KEY_COST
    plain = _walk_cost(q, k_t, v_t, nodes, own, rtol, rows, None, ratio, leaves)
    if plain is None:
        return False, None, ratio
    build = _layout_cost(n_keys, n_queries)

    def total(per_query, share):  # far rows cost a full streaming pass on either path
        return build + n_queries * (share * per_query + (1.0 - share) * n_keys)

    best, series = total(*plain[:2]), None
    if (
        config.TREE_SERIES
        and d <= config.TREE_SERIES_MAX_FEATURES
        and plain[2] * 100.0 >= config.TREE_SERIES_MIN_SHARE
    ):
        build_series = series_build_cost(nodes, d, v_t.shape[0])
        exact = n_queries * n_keys
        # what trying the series costs (the layout, the sample walk just taken, their
        # build and a second walk like it) stays within what a call may lose to the
        # cost model when the exact path wins
        sample = rows.shape[0] * plain[1] * plain[0] * _serial_scale()
        trying = build + build_series + 2.0 * sample
        if (
            build + build_series < best
            and build_series <= config.TREE_SERIES_MAX_BUILD_SHARE / 100.0 * exact
            and trying <= config.TREE_MAX_OVERHEAD_SHARE / 100.0 * exact
        ):
            start, stop, _, lo, hi = nodes
            per_term = config.TREE_SERIES_KEYS_PER_TERM
            tables = kernels_for("tree_pool", "cpu").series_for(
                k_t, v_t, start, stop, lo, hi, series_degree_bound(d), per_term
            )
            walked = _walk_cost(q, k_t, v_t, nodes, own, rtol, rows, tables, ratio, leaves)
            if walked is not None and build_series + total(*walked[:2]) < best:
                best, series = build_series + total(*walked[:2]), tables
    return best <= config.TREE_MAX_COST_SHARE / 100.0 * n_queries * n_keys, series, ratio


def _serial_scale():
    """How much more a step that does not run on all the threads (the sample's few tiles)
    weighs against an exact pass than where the costs were fitted (two threads): the
    pass speeds up with the threads, the step does not."""
    return max(numba.get_num_threads(), 1) / 2.0


def _layout_cost(n_keys, n_queries):
    """The tree's layout (the keys' k-d order, nodes and packed leaves) and the queries'
    k-d order, in streamed keys (config): TREE_BUILD_COST / 100 (n log2 n + m log2 m) for
    n keys and m queries. Measured against exact streaming in as many features, a key's
    share of the layout costs about the same whatever the features (a streamed key costs
    more with each feature, the layout's work per key barely), so no factor d: the
    constant is about the most measured over 1 to 8 features (config). Its
    k-d split runs on the threads below the root (``kernels.kd_order.kd_split``), but the
    root, the copies and the nodes do not: counted as not speeding up beyond the two
    threads it was fitted on (``_serial_scale``; never less than those two's cost)."""
    sorts = n_keys * math.log2(max(n_keys, 2)) + n_queries * math.log2(max(n_queries, 2))
    return config.TREE_BUILD_COST / 100.0 * sorts * max(_serial_scale(), 1.0)


def _sample_cost(n_queries, n_keys):
    """The cost model's sample walk at worst (each sample row visits every key)."""
    n_sample = min(n_queries, int(config.TREE_SAMPLE_QUERIES) + int(config.TREE_TILE_ROWS))
    return config.TREE_SAMPLE_KEY_COST / 100.0 * n_sample * n_keys * _serial_scale()


def worth_a_tree(n_queries, n_keys, n_features) -> bool:
    """The cost model's first cut, before any tree is built (``config.TREE_*``): enough keys,
    few enough features, and trying the tree (its layout, the queries' order and the
    sample walk, at worst) costs at most ``TREE_MAX_OVERHEAD_SHARE`` percent of exact
    streaming, which is what a call loses when the sample then chooses the exact path."""
    if n_keys < config.TREE_MIN_KEYS or n_features >= config.TREE_MAX_FEATURES:
        return False
    trying = _layout_cost(n_keys, n_queries) + _sample_cost(n_queries, n_keys)
    return trying <= config.TREE_MAX_OVERHEAD_SHARE / 100.0 * n_queries * n_keys


def pool_within_rtol(q, k_t, v_t, exclude_self, rtol, decide=True):
    """``(out (n_queries, p), lse)`` within ``rtol`` (``kernels.tree_pool``) of the laid-out
    queries (n_queries, d), keys (d, n_keys) and values (p, n_keys) of
    :func:`nbattn.smoothing.regression.gaussian_pool`; None when the cost model (``decide``)
    prefers the exact streaming path."""
    n_queries, n_keys = q.shape[0], k_t.shape[1]
    if decide and not worth_a_tree(n_queries, n_keys, q.shape[1]):
        return None
    k_t, v_t, nodes, own = tree_layout(k_t, v_t, exclude_self, n_queries)
    rows = _query_order(q)
    tree = kernels_for("tree_pool", "cpu")
    leaves = tree.leaf_blocks(k_t, v_t, *nodes[:3])
    series, ratio = None, 1.0
    if decide:
        pays, series, ratio = _tree_plan(q, k_t, v_t, nodes, own, rtol, rows, leaves)
        if not pays:
            return None
    out_rows, lse_rows, far, _ = tree.tree_pool(
        q,
        k_t,
        v_t,
        *nodes,
        own,
        rtol,
        rows,
        int(config.TREE_TILE_ROWS),
        tree.coarse_for(rtol, q.dtype),
        series,
        ratio,
        leaves,
    )
    out = np.empty_like(out_rows)
    lse = np.empty_like(lse_rows)
    out[rows] = out_rows
    lse[rows] = lse_rows
    exact = kernels_for("pooling", "cpu").gaussian_pool
    for i in rows[far]:  # far from every key: the streaming kernel's far-row paths
        skip = own.shape[0] > 0
        row_out, row_lse = exact(q[i : i + 1], k_t, v_t, skip, int(own[i]) if skip else 0)
        out[i], lse[i] = row_out[0], row_lse[0]
    return out, lse
