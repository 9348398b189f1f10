"""nadaraya_watson(..., rtol=) with Taylor series per k-d node (``nbattn.kernels.tree_series``).

With series the contract (``nbattn.kernels.tree_pool``, "Series") is two-sided on the
normaliser: the computed S lies in [(1 - rtol) S, (1 + rtol) S], each weighted sum within
rtol * S * max_j |v_j|, each prediction within rtol / (1 - rtol) * max_j |v_j - f| of the
exact f (plus the rounding the exact path carries too). The properties run the public call
at wide widths (4 and 16 times Scott's) with the cost model told to take the tree and its
series, and check through a spy on the walk that series terms were evaluated.
"""

import contextlib
import math
from unittest import mock

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.dispatch.device import kernels_for
from nbattn.kernels import tree_series
from nbattn.smoothing import pruned, regression
from tests import naive
from tests.strategies import float_dtypes, seeds

from .._config import config_values

TREE = kernels_for("tree_pool", "cpu")
#: The tree and its series at any size: small leaves, every node with coefficients, series
#: cheap against keys, builds and walks always worth it to the cost model.
_FORCE = {
    "TREE_LEAF_KEYS": 16,
    "TREE_MIN_KEYS": 1,
    "TREE_MAX_COST_SHARE": 10**9,
    "TREE_MAX_OVERHEAD_SHARE": 10**9,
    "TREE_SERIES": True,
    "TREE_SERIES_MIN_SHARE": 1,
    "TREE_SERIES_MAX_BUILD_SHARE": 10**9,
    "TREE_SERIES_KEYS_PER_TERM": 1,
    "TREE_SERIES_TERM_COST": 1,
    "TREE_SERIES_NODE_COST": 1,
    "TREE_SERIES_BUILD_COST": 1,
    "TREE_KEY_COST": 10**6,
}


@contextlib.contextmanager
def _series_walks():
    """The forced series path; yields the list of the walks' ``work`` arrays."""
    works = []
    real = TREE.tree_pool

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        works.append(result[3])
        return result

    with config_values(**_FORCE), mock.patch.object(TREE, "tree_pool", spy):
        yield works


def _problem(kind, seed, n_queries, n_keys, d, p, factor, dtype, exclude_self=False):
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.uniform(-5, 5, (3, d))
        keys = centres[rng.integers(0, 3, n_keys)] + 0.3 * rng.normal(size=(n_keys, d))
    elif kind == "duplicates":
        keys = rng.normal(size=(4, d))[rng.integers(0, 4, n_keys)]
    else:
        keys = rng.uniform(-2, 2, (n_keys, d))
    h = factor * regression.bandwidth_rule(keys)
    h = np.where(h > 0, h, factor)
    queries = keys[rng.integers(0, n_keys, n_queries)] + 0.5 * h * rng.normal(size=(n_queries, d))
    if exclude_self:
        queries = keys.copy()
    values = rng.normal(size=(n_keys, p)) + 3.0
    if kind == "far":  # a third of the queries thousands of widths from every key
        queries[::3] += 1e4 * h * (1.0 + rng.uniform(size=(queries[::3].shape[0], d)))
    scale = {"huge": 1e300, "tiny": 1e-300}.get(kind, 1.0)
    if dtype == np.float64 and kind in ("huge", "tiny"):
        values = values * scale
        queries, keys, h = queries * scale, keys * scale, h * scale
    return queries, keys, values, h


def _check(out, lse, queries, keys, values, h, rtol, dtype, exclude_self=False):
    """The contract's three bounds against the float64 reference."""
    exact = naive.nadaraya_watson(queries, keys, values, h, exclude_self)
    exact_lse = naive.nadaraya_watson_lse(queries, keys, h, exclude_self)
    top = np.abs(values).max(axis=0)
    rel = 3e-4 if dtype == np.float32 else 1e-10
    spread = np.maximum(values.max(axis=0) - exact, exact - values.min(axis=0))
    assert np.all(np.abs(out - exact) <= rtol / (1.0 - rtol) * spread + rel * top)
    lse_slack = rel * (1.0 + np.abs(exact_lse))
    assert np.all(lse <= exact_lse + np.log1p(rtol) + lse_slack)
    assert np.all(lse >= exact_lse + np.log1p(-rtol) - lse_slack)
    # the weighted sums relative to the exact S: out * Shat / S against f (lse's own
    # rounding, large for far rows, as in the lse check)
    ratio = np.exp(lse - exact_lse)[:, None]
    allowed = (rtol + rel) * top + np.abs(out) * np.expm1(np.minimum(lse_slack, 700.0))[:, None]
    assert np.all(np.abs(out * ratio - exact) <= allowed)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["uniform", "clustered", "duplicates", "far", "huge", "tiny"]),
    seed=seeds,
    n_queries=st.integers(1, 30),
    n_keys=st.integers(60, 400),
    d=st.integers(1, 3),
    p=st.integers(1, 3),
    factor=st.sampled_from([4.0, 16.0]),
    rtol=st.sampled_from([1e-8, 1e-6, 1e-3, 0.1]),
    dtype=float_dtypes,
)
def test_series_within_the_stated_bounds(kind, seed, n_queries, n_keys, d, p, factor, rtol, dtype):
    queries, keys, values, h = _problem(kind, seed, n_queries, n_keys, d, p, factor, dtype)
    with _series_walks() as works:
        out, lse = nbattn.nadaraya_watson(
            queries, keys, values, h, dtype=dtype.__name__, rtol=rtol, return_lse=True
        )
    assert out.dtype == dtype and np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    _check(out, lse, queries, keys, values, h, rtol, dtype)
    if factor == 16.0 and kind != "far" and (rtol >= 0.1 or (d <= 2 and rtol >= 1e-3)):
        # where series always fit (1e-6 in the dedicated tests below)
        assert sum(int(w[:, 2].sum()) for w in works) > 0


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    n=st.integers(60, 300),
    d=st.integers(1, 3),
    rtol=st.sampled_from([1e-6, 0.1]),
    dtype=float_dtypes,
)
def test_exclude_self_with_series(seed, n, d, rtol, dtype):
    _, keys, values, h = _problem("clustered", seed, n, n, d, 2, 16.0, dtype)
    with _series_walks() as works:
        out, lse = nbattn.nadaraya_watson(
            keys, keys, values, h, True, dtype=dtype.__name__, rtol=rtol, return_lse=True
        )
    _check(out, lse, keys, keys, values, h, rtol, dtype, exclude_self=True)
    assert sum(int(w[:, 2].sum()) for w in works) > 0


def test_series_cut_work_and_repeat_bit_for_bit():
    """Wide widths on 1-D keys: the series sum a fraction of the keys, the same bits on
    two calls and on one thread or several."""
    queries, keys, values, h = _problem("uniform", 5, 200, 3000, 1, 2, 16.0, np.float64)
    results = []
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}) * 2:
        saved = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            with _series_walks() as works:
                results.append(nbattn.nadaraya_watson(queries, keys, values, h, rtol=1e-6))
        finally:
            numba.set_num_threads(saved)
        work = works[-1]
        assert work[:, 2].mean() > 0 and work[:, 0].mean() < 0.2 * keys.shape[0]
    for other in results[1:]:
        assert np.array_equal(results[0], other)


def test_the_cost_model_takes_series_at_wide_widths_only_where_they_pay():
    """Default costs: 1-D keys at 16 times Scott's widths take the series; off, none."""
    queries, keys, values, h = _problem("uniform", 2, 6000, 20000, 1, 1, 16.0, np.float64)
    q, k_t, v_t, _ = regression._layout(queries, keys, values, h, np.float64)
    k_t, v_t, nodes, own = pruned.tree_layout(k_t, v_t, False, q.shape[0])
    rows = pruned._query_order(q)
    pays, series, _ = pruned._tree_plan(q, k_t, v_t, nodes, own, 1e-6, rows)
    assert pays and series is not None
    with config_values(TREE_SERIES=False):
        assert pruned._tree_plan(q, k_t, v_t, nodes, own, 1e-6, rows)[1] is None


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 12])
def test_truncation_bound_against_brute_force(p):
    """The per-key bound (2 A r)^p / p! exp(-max(A - r, 0)^2) against the largest error of
    the truncated series over a grid of |a|, |b| <= r and the angle between them (the
    error depends on a and b through |a|, |b| and a.b only)."""
    for r in (0.05, 0.3, 1.0, 2.5):
        big_a = np.linspace(0.0, 8.0, 161)[:, None, None]
        big_b = np.linspace(0.0, r, 41)[None, :, None]
        cos = np.linspace(-1.0, 1.0, 41)[None, None, :]
        x = 2.0 * big_a * big_b * cos
        partial = sum(x**n / math.factorial(n) for n in range(p))
        exact = np.exp(-(big_a**2) - big_b**2 + x)
        error = np.abs(exact - np.exp(-(big_a**2) - big_b**2) * partial).max(axis=(1, 2))
        rounding = 8.0 * np.finfo(np.float64).eps * exact.max(axis=(1, 2))  # the reference's
        bound = tree_series.truncation(big_a[:, 0, 0], r, p)
        assert np.all(error <= bound * (1.0 + 1e-9) + rounding)


def test_monomials_graded_and_counted():
    for d in (1, 2, 3):
        parent, var, const, deg_end = tree_series.monomials(d, 7)
        assert deg_end[-1] == math.comb(6 + d, d) == parent.shape[0]
        alpha = np.zeros((parent.shape[0], d), dtype=np.int64)
        for t in range(1, parent.shape[0]):
            alpha[t] = alpha[parent[t]]
            alpha[t, var[t]] += 1
        assert len({tuple(a) for a in alpha}) == parent.shape[0]
        degrees = alpha.sum(axis=1)
        assert np.all(np.diff(degrees) >= 0)
        assert [int((degrees < g).sum()) for g in range(8)] == list(deg_end)
        factorials = np.array([np.prod([math.factorial(e) for e in a]) for a in alpha])
        assert np.allclose(const, 2.0**degrees / factorials, rtol=1e-14)
