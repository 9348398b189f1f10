"""nadaraya_watson(..., rtol=): the k-d tree path within its stated bound.

The contract (``nbattn.kernels.tree_pool``): each normaliser S loses at most rtol * S,
so lse lies in [lse_exact + log(1 - rtol), lse_exact] and each prediction within
rtol / (1 - rtol) * max_j |v_j - f| of the exact one f (plus the rounding both share).
Where the leaves' weights are the coarse exponential's (float64, rtol >= 16 eps), S may
also gain up to eps * S: lse lies in [lse_exact + log(1 - rtol), lse_exact + eps].
The properties force the tree path at small sizes (small leaves, the cost model told to
take it) and compare against the plain-NumPy reference.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.dispatch.device import kernels_for
from nbattn.kernels.fastmath import COARSE_EXP_RTOL
from nbattn.smoothing import regression
from nbattn.smoothing.pruned import tree_layout
from tests import naive
from tests.strategies import float_dtypes, seeds

from .._config import config_values

KINDS = ["uniform", "clustered", "duplicates", "far", "huge", "tiny"]


def _tree_always():
    """The tree path at any size: leaves of 4 keys, the cost model told to take it."""
    return config_values(**_FORCE)


_FORCE = {
    "TREE_LEAF_KEYS": 4,
    "TREE_MIN_KEYS": 1,
    "TREE_MAX_COST_SHARE": 10**9,
    "TREE_MAX_OVERHEAD_SHARE": 10**9,
}


@pytest.fixture
def tree_always():
    with _tree_always():
        yield


def _problem(kind, seed, n_queries, n_keys, d, p, dtype):
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.uniform(-5, 5, (4, d))
        keys = centres[rng.integers(0, 4, n_keys)] + 0.2 * rng.normal(size=(n_keys, d))
    elif kind == "duplicates":
        keys = rng.normal(size=(3, d))[rng.integers(0, 3, n_keys)]
    else:
        keys = rng.uniform(-2, 2, (n_keys, d))
    queries = keys[rng.integers(0, n_keys, n_queries)] + 0.3 * rng.normal(size=(n_queries, d))
    values = rng.normal(size=(n_keys, p)) + 3.0
    h = 0.4 * np.ones(d)
    if kind == "far":  # half the queries thousands of widths from every key
        queries[::2] += 1e4 * (1.0 + rng.uniform(size=(queries[::2].shape[0], d)))
    scale = {"huge": 1e300, "tiny": 1e-300}.get(kind, 1.0)
    if dtype == np.float64 and kind in ("huge", "tiny"):
        values = values * scale
    return queries * scale, keys * scale, values, h * scale


def _check_bound(out, lse, queries, keys, values, h, rtol, dtype, exclude_self=False):
    exact = naive.nadaraya_watson(queries, keys, values, h, exclude_self)
    exact_lse = naive.nadaraya_watson_lse(queries, keys, h, exclude_self)
    top = np.abs(values).max()
    slack = (3e-4 if dtype == np.float32 else 1e-10) * top
    spread = np.maximum(values.max(axis=0) - exact, exact - values.min(axis=0))
    allowed = rtol / (1.0 - rtol) * spread + slack
    assert np.all(np.abs(out - exact) <= allowed), np.abs(out - exact).max()
    lse_slack = (3e-4 if dtype == np.float32 else 1e-10) * (1.0 + np.abs(exact_lse))
    coarse = kernels_for("tree_pool", "cpu").coarse_for(rtol, dtype) is not None
    assert np.all(lse <= exact_lse + (COARSE_EXP_RTOL if coarse else 0.0) + lse_slack)
    assert np.all(lse >= exact_lse + np.log1p(-rtol) - lse_slack)


@settings(max_examples=60)
@given(
    kind=st.sampled_from(KINDS),
    seed=seeds,
    n_queries=st.integers(1, 40),
    n_keys=st.integers(1, 300),
    d=st.integers(1, 4),
    p=st.integers(1, 2),
    rtol=st.sampled_from([1e-9, 1e-6, 1e-3, 0.1, 0.5]),
    dtype=float_dtypes,
)
def test_predictions_within_the_stated_bound(kind, seed, n_queries, n_keys, d, p, rtol, dtype):
    queries, keys, values, h = _problem(kind, seed, n_queries, n_keys, d, p, dtype)
    with _tree_always():
        out, lse = nbattn.nadaraya_watson(
            queries, keys, values, h, dtype=dtype.__name__, rtol=rtol, return_lse=True
        )
    assert out.dtype == dtype and np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    _check_bound(out, lse, queries, keys, values, h, rtol, dtype)


@settings(max_examples=20)
@given(seed=seeds, n=st.integers(2, 200), rtol=st.sampled_from([1e-6, 0.1]), dtype=float_dtypes)
def test_exclude_self_within_the_bound(seed, n, rtol, dtype):
    queries, keys, values, h = _problem("clustered", seed, n, n, 2, 1, dtype)
    with _tree_always():
        out, lse = nbattn.nadaraya_watson(
            keys, keys, values, h, True, dtype=dtype.__name__, rtol=rtol, return_lse=True
        )
    _check_bound(out, lse, keys, keys, values, h, rtol, dtype, exclude_self=True)


def test_one_key_excluded_gives_zeros_and_minus_inf(tree_always):
    out, lse = nbattn.nadaraya_watson([[1.0]], [[1.0]], [2.0], 1.0, True, rtol=0.1, return_lse=True)
    assert out[0] == 0.0 and lse[0] == -np.inf


def test_the_tree_prunes_and_stays_within_the_bound():
    """Clustered keys at a narrow width: most keys are dropped, the bound still holds."""
    queries, keys, values, h = _problem("clustered", 3, 64, 4000, 2, 1, np.float64)
    h = h / 4
    q, k_t, v_t, _ = regression._layout(queries, keys, values, h, np.float64)
    k_t, v_t, nodes, own = tree_layout(k_t, v_t, False, q.shape[0])
    tree = kernels_for("tree_pool", "cpu")
    out, lse, far, work = tree.tree_pool(
        q, k_t, v_t, *nodes, own, 1e-6, np.arange(q.shape[0]), 16, tree.coarse_for(1e-6, q.dtype)
    )
    assert not far.any()
    assert work[:, 0].mean() < 0.5 * keys.shape[0]  # keys summed per query
    _check_bound(out, lse, queries, keys, values, h, 1e-6, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_far_queries_get_the_nearest_keys_value(tree_always, dtype):
    keys = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]])
    values = np.arange(6.0)
    queries = np.array([[-1e7], [1e7], [2.0 + 1e-9]])
    out = nbattn.nadaraya_watson(queries, keys, values, 0.01, dtype=dtype.__name__, rtol=0.1)
    np.testing.assert_allclose(out, [0.0, 5.0, 2.0], atol=1e-6)


def test_rtol_zero_is_the_exact_path_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(0)
    keys, values, queries = (
        rng.normal(size=(500, 2)),
        rng.normal(size=500),
        rng.normal(size=(50, 2)),
    )
    exact = nbattn.nadaraya_watson(queries, keys, values)
    monkeypatch.setattr(config, "TREE_MIN_KEYS", 1)
    monkeypatch.setattr(config, "TREE_MAX_COST_SHARE", 10**9)
    monkeypatch.setattr(config, "TREE_MAX_OVERHEAD_SHARE", 10**9)
    assert np.array_equal(nbattn.nadaraya_watson(queries, keys, values, rtol=0.0), exact)
    assert np.array_equal(nbattn.nadaraya_watson(queries, keys, values, rtol=0), exact)
    # and the tree path with rtol > 0 is a different computation (so the test could fail)
    assert not np.array_equal(nbattn.nadaraya_watson(queries, keys, values, rtol=0.5), exact)


def test_small_problems_take_the_exact_path():
    """The cost model: a few hundred keys never pay for a tree."""
    rng = np.random.default_rng(1)
    keys, values, queries = (
        rng.normal(size=(300, 3)),
        rng.normal(size=300),
        rng.normal(size=(40, 3)),
    )
    exact = nbattn.nadaraya_watson(queries, keys, values)
    assert np.array_equal(nbattn.nadaraya_watson(queries, keys, values, rtol=1e-3), exact)


def test_the_cost_model_takes_the_tree_where_it_prunes(monkeypatch):
    """Many clustered keys at a narrow width: the sample finds little to sum, the tree runs
    (the result differs from the exact one, within the bound). Enough queries that
    trying the tree costs at most ``TREE_MAX_OVERHEAD_SHARE`` of exact streaming."""
    queries, keys, values, h = _problem("clustered", 5, 8000, 6000, 2, 1, np.float64)
    h = h / 8
    exact = nbattn.nadaraya_watson(queries, keys, values, h)
    out, lse = nbattn.nadaraya_watson(queries, keys, values, h, rtol=1e-3, return_lse=True)
    assert not np.array_equal(out, exact)
    _check_bound(out, lse, queries, keys, values, h, 1e-3, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_two_identical_calls_are_bit_equal(tree_always, dtype):
    queries, keys, values, h = _problem("clustered", 7, 100, 400, 3, 2, dtype)
    first = nbattn.nadaraya_watson(queries, keys, values, h, dtype=dtype.__name__, rtol=1e-4)
    second = nbattn.nadaraya_watson(queries, keys, values, h, dtype=dtype.__name__, rtol=1e-4)
    assert np.array_equal(first, second)


@pytest.mark.parametrize("rtol", [-0.1, 1.0, 2.0, np.nan, np.inf, "0.1", None, True, [0.1]])
def test_a_bad_rtol_is_refused_by_name(rtol):
    with pytest.raises(ValueError, match="rtol"):
        nbattn.nadaraya_watson([[0.0]], [[0.0], [1.0]], [1.0, 2.0], 1.0, rtol=rtol)


def test_rtol_on_the_gpu_is_not_implemented(monkeypatch):
    monkeypatch.setattr(regression, "device_for", lambda device, *arrays: "cuda")
    with pytest.raises(NotImplementedError, match="rtol"):
        nbattn.nadaraya_watson([[0.0]], [[0.0], [1.0]], [1.0, 2.0], 1.0, rtol=1e-3, device="cuda")


# --------------------------------------------------------------------------- tiles
# The kernel walks the tree once per tile of rows: a node is dropped for the tile only
# when each row may drop it, and each row keeps or drops each leaf by itself. The rows of
# a tile are normally neighbours in k-d order; here they are anything.


def _tree_call(queries, keys, values, h, dtype, rtol, rows, tile, exclude_self=False):
    q, k_t, v_t, _ = regression._layout(queries, keys, values, h, dtype)
    k_t, v_t, nodes, own = tree_layout(k_t, v_t, exclude_self, q.shape[0])
    tree = kernels_for("tree_pool", "cpu")
    return tree.tree_pool(
        q, k_t, v_t, *nodes, own, rtol, rows, tile, tree.coarse_for(rtol, q.dtype)
    )


@settings(max_examples=40)
@given(
    kind=st.sampled_from(["uniform", "clustered", "duplicates", "far"]),
    seed=seeds,
    n_queries=st.integers(1, 50),
    n_keys=st.integers(2, 300),
    d=st.integers(1, 3),
    tile=st.integers(1, 20),
    shuffle=st.booleans(),
    exclude_self=st.booleans(),
    rtol=st.sampled_from([1e-6, 1e-2, 0.3]),
    dtype=float_dtypes,
)
def test_every_tile_shape_keeps_each_row_within_its_bound(
    kind, seed, n_queries, n_keys, d, tile, shuffle, exclude_self, rtol, dtype
):
    """Any tile size (one row, a part-filled last tile, more rows than the tile), rows in
    any order (far apart in one tile, far and near rows mixed): each row within its bound,
    only the far rows flagged, and a second call bit-equal."""
    queries, keys, values, h = _problem(kind, seed, n_queries, n_keys, d, 2, dtype)
    if exclude_self:
        queries = keys[:n_queries] if n_queries <= n_keys else keys
    rows = np.arange(queries.shape[0])
    if shuffle:
        rows = np.random.default_rng(seed).permutation(rows)
    with _tree_always():
        out, lse, far, work = _tree_call(
            queries, keys, values, h, dtype, rtol, rows, tile, exclude_self
        )
        again = _tree_call(queries, keys, values, h, dtype, rtol, rows, tile, exclude_self)
    for first, second in zip((out, lse, far, work), again):
        assert np.array_equal(first, second, equal_nan=True)
    # back in the queries' order (query i skips key i with exclude_self)
    out[rows], lse[rows], far[rows] = out.copy(), lse.copy(), far.copy()
    exact_lse = naive.nadaraya_watson_lse(queries, keys, h, exclude_self)
    exact_best = exact_lse - np.log(keys.shape[0])  # at most the best score
    limit = config.FAR_SCORE_FLOAT32 if dtype == np.float32 else config.FAR_SCORE_FLOAT64
    assert np.all(exact_best[far] < -limit * 0.99)  # a flagged row is far from every key
    near = ~far
    if exclude_self:  # queries are keys: none is far, and the check needs every row
        assert near.all()
    _check_bound(
        out[near].astype(np.float64),
        lse[near],
        queries[near],
        keys,
        values,
        h,
        rtol,
        dtype,
        exclude_self,
    )


def test_a_tile_of_rows_far_apart_sums_each_rows_own_leaves(tree_always):
    """Two rows in one tile, each in its own cluster 100 widths from the other: the walk
    goes down both sides, but each row sums only the leaves near it, and gets what it
    gets alone."""
    rng = np.random.default_rng(4)
    keys = np.concatenate([rng.uniform(0, 10, (500, 2)), rng.uniform(100, 110, (500, 2))])
    values = np.concatenate([np.zeros(500), np.ones(500)]) + rng.normal(0, 0.1, 1000)
    queries = np.array([[5.0, 5.0], [105.0, 105.0], [5.5, 4.5]])
    h = np.ones(2)
    rows = np.arange(3)
    out, lse, far, work = _tree_call(queries, keys, values[:, None], h, np.float64, 1e-6, rows, 3)
    assert not far.any()
    assert np.all(work[:, 0] < 500)  # no row sums the other cluster (nor all of its own)
    for r in range(3):
        alone = _tree_call(
            queries[r : r + 1], keys, values[:, None], h, np.float64, 1e-6, rows[:1], 1
        )
        np.testing.assert_allclose(out[r], alone[0][0], rtol=1e-5)
    _check_bound(out, lse, queries, keys, values[:, None], h, 1e-6, np.float64)
    assert out[0, 0] < 0.5 < out[1, 0]


def test_tiles_share_the_walk():
    """Neighbouring rows in k-d order walking together see fewer nodes per tile than one
    at a time would in total (each node of the shared walk is counted once per row)."""
    queries, keys, values, h = _problem("clustered", 11, 256, 4000, 2, 1, np.float64)
    with _tree_always():
        rows = np.arange(queries.shape[0])
        one = _tree_call(queries, keys, values, h / 4, np.float64, 1e-6, rows, 1)
        tiled = _tree_call(queries, keys, values, h / 4, np.float64, 1e-6, rows, 16)
    assert not one[2].any() and not tiled[2].any()
    np.testing.assert_allclose(one[0], tiled[0], rtol=1e-5)
    # the tile is one walk: rows see the union of their walks, so not fewer nodes each
    assert tiled[3][:, 1].sum() >= one[3][:, 1].sum()


@settings(max_examples=15)
@given(
    seed=seeds,
    n_keys=st.integers(1, 400),
    d=st.integers(1, 3),
    n_outputs=st.integers(1, 3),
    exclude_self=st.booleans(),
    dtype=float_dtypes,
)
def test_leaf_blocks_built_once_give_the_walk_its_own_bits(
    seed, n_keys, d, n_outputs, exclude_self, dtype
):
    """One tree's leaf_blocks, shared by its walks, give the bits of a walk that builds
    them itself; a pack of another tree is refused, not read past its end."""
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n_keys, d))
    decades = 30 if np.dtype(dtype) == np.float32 else 300
    values = rng.normal(size=(n_keys, n_outputs)) * 10.0 ** rng.integers(-decades, decades)
    queries = keys[rng.integers(0, n_keys, 30)] + 0.1 * rng.normal(size=(30, d))
    with _tree_always():
        q, k_t, v_t, _ = regression._layout(queries, keys, values, 0.3, dtype)
        k_t, v_t, nodes, own = tree_layout(k_t, v_t, exclude_self, q.shape[0])
        tree = kernels_for("tree_pool", "cpu")
        rows = np.arange(q.shape[0])
        shared = tree.leaf_blocks(k_t, v_t, *nodes[:3])
        for rtol in (1e-6, 1e-2):
            coarse = tree.coarse_for(rtol, q.dtype)
            own_walk = tree.tree_pool(q, k_t, v_t, *nodes, own, rtol, rows, 4, coarse)
            given_walk = tree.tree_pool(
                q, k_t, v_t, *nodes, own, rtol, rows, 4, coarse, None, 1.0, shared
            )
            for a, b in zip(own_walk, given_walk):
                np.testing.assert_array_equal(a, b)
        other = tree.leaf_blocks(k_t[:, :-1], v_t[:, :-1], *tree.kd_nodes(k_t[:, :-1], 4)[:3])
        with pytest.raises(ValueError, match="leaves"):
            tree.tree_pool(q, k_t, v_t, *nodes, own, 1e-6, rows, 4, None, None, 1.0, other)
        if n_keys > 4:  # the same keys in leaves of up to 64: another tree
            coarser = tree.leaf_blocks(k_t, v_t, *tree.kd_nodes(k_t, 64)[:3])
            with pytest.raises(ValueError, match="another tree"):
                tree.tree_pool(q, k_t, v_t, *nodes, own, 1e-6, rows, 4, None, None, 1.0, coarser)
