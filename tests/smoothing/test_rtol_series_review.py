"""Review of the Taylor-series nodes of ``rtol > 0`` (``nbattn.kernels.tree_series``).

* ``series_value`` sums |a|^2 in the loop that stores the scratch ``a``: from d = 4 on
  (reachable with ``config.TREE_SERIES_MAX_FEATURES >= 4``) LLVM vectorises that loop
  behind a runtime distance check, so the series' bits depend on where ``a`` lies after
  the query row or the node's centre row (the class of bug of ``tests/_vector_order.py``);
  the sum now has a loop of its own, and the first three tests guard it.
* Degenerate geometry (zero-radius nodes, keys on a line in 3-D, ties) with the forced
  series path, leave-one-out included: the contract's bounds hold (a regression guard).
"""

import numpy as np
import pytest

import nbattn
from nbattn.kernels import tree_series
from nbattn.smoothing import pruned, regression
from tests._vector_order import address_dependent_sums, adjacent_after, fresh_ir

from .._config import config_values
from .test_rtol_series import _series_walks


def _tables(d, n=3000, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, d))
    h = 16.0 * regression.bandwidth_rule(keys)
    values = rng.normal(size=(n, 1))
    q, k_t, v_t, _ = regression._layout(1.7 * keys[:60] + 0.3 * h, keys, values, h, np.float64)
    tree = pruned.kernels_for("tree_pool", "cpu")
    with config_values(TREE_LEAF_KEYS=16):
        k_t, v_t, nodes, _ = pruned.tree_layout(k_t, v_t, False, q.shape[0])
    start, stop, _, lo, hi = nodes
    return q, tree.series_for(k_t, v_t, start, stop, lo, hi, 3, 1)


def _value(q64, node, series, mono, a, acc):
    degree, offset, centre, _, coef, parent, var, deg_end = series
    p = int(degree[node])
    w = tree_series.series_value(
        q64, 0, node, p, 0.0, degree, offset, centre, parent, var, deg_end, coef, mono, a, acc
    )
    return w, acc.copy()


@pytest.mark.parametrize("d", [4, 8])
def test_series_value_bits_do_not_depend_on_where_its_scratch_lies(d):
    q, series = _tables(d)
    degree, deg_end = series[0], series[7]
    differ = 0
    for i in range(q.shape[0]):
        q64 = np.ascontiguousarray(q[i : i + 1])
        for node in np.flatnonzero(degree > 0)[:10]:
            mono = np.empty(deg_end[-1])
            apart = _value(q64, node, series, mono, np.empty(d), np.zeros(1))
            q_adj, a_adj = adjacent_after(q64, (d,))  # a right after the query row
            near = _value(q_adj, node, series, mono, a_adj, np.zeros(1))
            differ += apart[0] != near[0] or not np.array_equal(apart[1], near[1])
    assert differ == 0, f"{differ} series values changed bits with the scratch's address"


def test_series_value_keeps_no_float_sum_behind_a_distance_check():
    q, series = _tables(8)
    degree, offset, centre, _, coef, parent, var, deg_end = series
    node = int(np.flatnonzero(degree > 0)[0])
    ir = fresh_ir(
        tree_series.series_value,
        np.ascontiguousarray(q[:1]),
        0,
        node,
        int(degree[node]),
        0.0,
        degree,
        offset,
        centre,
        parent,
        var,
        deg_end,
        coef,
        np.empty(deg_end[-1]),
        np.empty(8),
        np.zeros(1),
    )
    assert address_dependent_sums(ir) == []


def _reference(queries, keys, values, h, exclude_self):
    q, k, v = (np.asarray(x, dtype=np.longdouble) for x in (queries, keys, values))
    h = np.asarray(h, dtype=np.longdouble)
    out = np.empty((q.shape[0], v.shape[1]))
    lse = np.empty(q.shape[0])
    spread = np.empty_like(out)
    for i in range(q.shape[0]):
        s = -0.5 * (((q[i] - k) / h) ** 2).sum(axis=1)
        if exclude_self:
            s[i] = -np.inf
        m = s.max()
        w = np.exp(s - m)
        f = (w[:, None] * v).sum(axis=0) / w.sum()
        out[i], lse[i] = f, m + np.log(w.sum())
        spread[i] = np.abs(v - f).max(axis=0)
    return out, lse, spread


@pytest.mark.parametrize("kind", ["identical", "line", "ties"])
@pytest.mark.parametrize("exclude_self", [False, True])
@pytest.mark.parametrize("rtol", [1e-9, 1e-3, 0.5])
def test_degenerate_nodes_within_the_bounds(kind, exclude_self, rtol):
    rng = np.random.default_rng(7)
    n, d = 400, 3
    if kind == "identical":
        keys = np.tile(rng.normal(size=d), (n, 1))
    elif kind == "line":
        keys = np.outer(rng.normal(size=n), [1.0, 2.0, -1.0]) + 5.0
    else:
        keys = rng.integers(0, 3, (n, d)).astype(float)
    h = np.full(d, 2.0)
    queries = keys if exclude_self else keys[:40] + 0.5 * rng.normal(size=(40, d))
    values = np.c_[rng.normal(size=n) + 3.0, 1e3 * rng.normal(size=n)]
    with _series_walks() as works:
        out, lse = nbattn.nadaraya_watson(
            queries, keys, values, h, exclude_self, rtol=rtol, return_lse=True
        )
    if rtol >= 1e-3 or kind != "ties":  # ties at 1e-9: no node's series fits
        assert sum(int(w[:, 2].sum()) for w in works) > 0
    f, exact_lse, spread = _reference(queries, keys, values, h, exclude_self)
    top = np.abs(values).max(axis=0)
    assert np.all(np.abs(out - f) <= rtol / (1 - rtol) * spread + 1e-12 * top)
    slack = 1e-12 * (1 + np.abs(exact_lse)) + 1e-8
    assert np.all(lse <= exact_lse + np.log1p(rtol) + slack)
    assert np.all(lse >= exact_lse + np.log1p(-rtol) - slack)
