"""Review cases for the tree path's box-bound shift (``nbattn.kernels.tree_pool``, "Shift").

Hostile inputs: queries inside loose boxes at the flush thresholds, isolated keys skipped
by exclude_self, ties and duplicates, several output columns of very different scales,
rows of one tile far apart and in any order, and far rows whose query lies inside the
root box (every key beyond the far threshold, but no box that far).
"""

import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.dispatch.device import kernels_for
from nbattn.smoothing import regression
from nbattn.smoothing.pruned import tree_layout
from tests import naive

from .._config import config_values
from .test_rtol import _check_bound


def _force(leaf_keys):
    return config_values(
        TREE_LEAF_KEYS=leaf_keys,
        TREE_MIN_KEYS=1,
        TREE_MAX_COST_SHARE=10**9,
        TREE_MAX_OVERHEAD_SHARE=10**9,
    )


def _nw(queries, keys, values, h, dtype, rtol, leaf_keys, exclude_self=False):
    """Tree-path prediction and lse, checked repeatable and the inputs untouched."""
    before = [np.array(a, copy=True) for a in (queries, keys, values, h)]
    with _force(leaf_keys):
        runs = [
            nbattn.nadaraya_watson(
                queries,
                keys,
                values,
                h,
                exclude_self,
                dtype=dtype.__name__,
                rtol=rtol,
                return_lse=True,
            )
            for _ in range(2)
        ]
    for a, b in zip(before, (queries, keys, values, h)):
        assert np.array_equal(a, b)
    (out, lse), (out2, lse2) = runs
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    assert out.dtype == dtype and np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    return out, lse


def _walk(queries, keys, values, h, dtype, rtol, leaf_keys, rows, tile):
    with config_values(TREE_LEAF_KEYS=leaf_keys):
        q, k_t, v_t, _ = regression._layout(queries, keys, values, h, dtype)
        k_t, v_t, nodes, own = tree_layout(k_t, v_t, False, q.shape[0])
    tree = kernels_for("tree_pool", "cpu")
    return tree.tree_pool(
        q, k_t, v_t, *nodes, own, rtol, rows, tile, tree.coarse_for(rtol, q.dtype)
    )


_F32_GAPS = [55.0, 56.0, 86.5, 87.5, 103.5, 104.5, 4000.0]
_F64_GAPS = [650.0, 659.0, 708.0, 709.0, 745.0, 746.0, 2.0**24 - 100]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 2, 3, 6])
def test_a_query_at_the_centre_of_a_hypercube_of_keys(dtype, d):
    """2^d keys at the corners of a cube, the query at its centre (box bound 0, every key
    ``gap`` away): at, under and over the flush thresholds, with one leaf or many, the
    rows within their bounds, not flagged far, whatever the leaf size."""
    corners = np.array(np.meshgrid(*[[-1.0, 1.0]] * d)).reshape(d, -1).T
    values = np.stack([np.arange(2**d) + 1.0, np.full(2**d, 3.0)], axis=1)
    h = np.full(d, 1.0 / np.sqrt(2.0))
    queries = np.zeros((1, d))
    for gap in _F32_GAPS if dtype == np.float32 else _F64_GAPS:
        keys = corners * np.sqrt(gap / d) / np.sqrt(2.0)
        for leaf in (1, 4, 512):
            _, _, far, _ = _walk(queries, keys, values, h, dtype, 1e-6, leaf, np.arange(1), 1)
            assert not far.any(), (gap, leaf)
            for rtol in (1e-15, 0.9):
                out, lse = _nw(queries, keys, values, h, dtype, rtol, leaf)
                _check_bound(out.astype(np.float64), lse, queries, keys, values, h, rtol, dtype)
                assert out[0, 1] == pytest.approx(3.0, rel=1e-6)  # a constant column


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exclude_self_where_the_own_key_is_the_only_near_one(dtype):
    """Keys on a spiral, each the next's neighbour only at the flush distances: with its
    own key skipped a row's box (bound 0: it holds the query) bounds its keys loosely."""
    rng = np.random.default_rng(7)
    gaps = [86.0, 104.0, 300.0] if dtype == np.float32 else [707.0, 746.0, 1000.0]
    for d in (1, 3):
        for gap in gaps:
            n = 24
            keys = rng.normal(size=(n, d))
            keys /= np.linalg.norm(keys, axis=1, keepdims=True)
            keys *= np.sqrt(gap) * (1.0 + 0.01 * np.arange(n))[:, None] / np.sqrt(2.0)
            keys = np.vstack([keys, np.zeros((1, d))])
            values = np.stack([rng.normal(size=n + 1), np.full(n + 1, 5.0)], axis=1)
            h = np.full(d, 1.0 / np.sqrt(2.0))
            for leaf in (1, 4, 512):
                out, lse = _nw(keys, keys, values, h, dtype, 1e-9, leaf, exclude_self=True)
                _check_bound(out.astype(np.float64), lse, keys, keys, values, h, 1e-9, dtype, True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ties_duplicates_and_columns_of_every_scale(dtype):
    """A grid with every key twice, queries on the keys and at the cells' centres (ties),
    three outputs: noise, a constant, noise times 1e300 (1e30 in float32)."""
    rng = np.random.default_rng(3)
    grid = np.array(np.meshgrid(np.arange(6.0), np.arange(6.0))).reshape(2, -1).T
    keys = np.vstack([grid, grid])
    values = rng.normal(size=(keys.shape[0], 3))
    values[:, 1] = 7.0
    values[:, 2] *= 1e300 if dtype == np.float64 else 1e30
    queries = np.vstack([grid + 0.5, grid])
    for h in (0.05, 0.5, 1e6):
        for leaf in (1, 2, 512):
            for rtol in (1e-9, 0.1):
                hh = np.full(2, h)
                out, lse = _nw(queries, keys, values, hh, dtype, rtol, leaf)
                _check_bound(out.astype(np.float64), lse, queries, keys, values, hh, rtol, dtype)
                np.testing.assert_allclose(out[:, 1], 7.0, rtol=1e-6)
                out, lse = _nw(keys, keys, values, hh, dtype, rtol, leaf, exclude_self=True)
                _check_bound(out.astype(np.float64), lse, keys, keys, values, hh, rtol, dtype, True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_two_and_identical_keys(dtype):
    rng = np.random.default_rng(5)
    h = np.full(2, 0.3)
    for leaf in (1, 512):
        for n in (1, 2):
            keys, values = rng.normal(size=(n, 2)), rng.normal(size=(n, 1))
            queries = rng.normal(size=(5, 2))
            out, lse = _nw(queries, keys, values, h, dtype, 1e-6, leaf)
            _check_bound(out.astype(np.float64), lse, queries, keys, values, h, 1e-6, dtype)
        keys, values = np.ones((30, 2)), rng.normal(size=(30, 1))
        out, lse = _nw(keys, keys, values, h, dtype, 0.9, leaf, exclude_self=True)
        _check_bound(out.astype(np.float64), lse, keys, keys, values, h, 0.9, dtype, True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_tile_of_rows_far_apart_in_any_order(dtype):
    """Queries at squared distances across the flush and far thresholds from one of two
    clusters, shuffled, walked in tiles of 1, 3 and all rows: a row whose best score is
    below -far is flagged; every other row is within its bound; repeatable."""
    far_score = float(config.FAR_SCORE_FLOAT32 if dtype == np.float32 else config.FAR_SCORE_FLOAT64)
    rng = np.random.default_rng(11)
    d, n = 2, 200
    keys = np.vstack([0.1 * rng.normal(size=(n // 2, d)), 0.1 * rng.normal(size=(n // 2, d)) + 10])
    values = np.stack([rng.normal(size=n), np.full(n, 2.0)], axis=1)
    h = np.full(d, 1.0 / np.sqrt(2.0))
    dist2 = np.array([0, 50, 87, 90, 105, 700, 708, 750, far_score - 10, far_score + 50])
    queries = np.zeros((dist2.size, d))
    queries[:, 0] = -np.sqrt(dist2)
    queries = np.vstack([queries, keys[::29]])
    exact = naive.nadaraya_watson(queries, keys, values, h)
    exact_lse = naive.nadaraya_watson_lse(queries, keys, h)
    best = (-((queries[:, None, :] - keys[None]) ** 2).sum(-1) / (2.0 * h[0] ** 2)).max(axis=1)
    slack = 3e-4 if dtype == np.float32 else 1e-10
    for leaf in (1, 4, 512):
        for tile in (1, 3, queries.shape[0]):
            rows = rng.permutation(queries.shape[0])
            out, lse, far, work = _walk(queries, keys, values, h, dtype, 1e-9, leaf, rows, tile)
            again = _walk(queries, keys, values, h, dtype, 1e-9, leaf, rows, tile)
            for first, second in zip((out, lse, far, work), again):
                assert np.array_equal(first, second, equal_nan=True)
            assert np.all(far[best[rows] < -far_score])
            near = ~far
            assert np.all(np.isfinite(out[near])) and np.all(np.isfinite(lse[near]))
            err = np.abs(out[near].astype(np.float64) - exact[rows][near])
            assert np.all(err <= 1e-8 * 4 + slack * 2.0 * 2), err.max()
            lse_gap = lse[near] - exact_lse[rows][near]
            assert np.all(np.abs(lse_gap) <= 1e-8 + slack * (1 + np.abs(exact_lse[rows][near])))


@pytest.mark.parametrize(
    "dtype, h, n", [(np.float64, 1e-10, 5), (np.float64, 1e-150, 20), (np.float32, 1e-5, 200)]
)
def test_far_rows_whose_query_lies_inside_the_root_box(dtype, h, n):
    """Found in review: every key beyond the far threshold but the query inside the root
    box (a bandwidth far below the keys' spacing). The walk sums a leaf shifted by its box
    bound ~ -1e20; the scores' rounding relative to it (|s| eps >> 709) overflows a weight
    to inf, the row's sum is inf, and the row is neither re-walked nor flagged far: the
    answer is nan with lse = +inf. The exact path gives the nearest key's value."""
    rng = np.random.default_rng(0)
    for _ in range(10):
        keys = rng.uniform(-2, 2, (n, 1))
        queries = rng.uniform(-2, 2, (4, 1))
        values = rng.normal(size=n)
        with _force(4):
            out, lse = nbattn.nadaraya_watson(
                queries, keys, values, [h], dtype=dtype.__name__, rtol=1e-6, return_lse=True
            )
        exact, exact_lse = nbattn.nadaraya_watson(
            queries, keys, values, [h], dtype=dtype.__name__, return_lse=True
        )
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse)), (out, lse)
        np.testing.assert_allclose(out, exact, rtol=1e-5)
