"""The tree path's shift (``nbattn.kernels.tree_pool``, "Shift"): each leaf is summed in one
fused pass relative to its box's bound, and a row whose boxes bound its keys so loosely
that its weights could flush to zero walks the tree again shifted by its best score.

The cases put queries inside boxes whose keys lie far from them: two clusters in one
leaf, the query between them, at distances where float32 (e^-87) and float64 (e^-708)
flush the weights relative to the box's bound.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.dispatch.device import kernels_for
from nbattn.smoothing import regression
from nbattn.smoothing.pruned import tree_layout
from tests import naive
from tests.strategies import float_dtypes, seeds

from .._config import config_values
from .test_rtol import _check_bound


def _walk(queries, keys, values, h, dtype, rtol, leaf_keys):
    with config_values(TREE_LEAF_KEYS=leaf_keys):
        q, k_t, v_t, _ = regression._layout(queries, keys, values, h, dtype)
        k_t, v_t, nodes, own = tree_layout(k_t, v_t, False, q.shape[0])
    rows = np.arange(q.shape[0])
    tree = kernels_for("tree_pool", "cpu")
    return tree.tree_pool(q, k_t, v_t, *nodes, own, rtol, rows, 4, tree.coarse_for(rtol, q.dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gap", [0.5, 30.0, 100.0, 800.0, 3000.0])
def test_a_query_inside_a_box_far_from_its_keys(dtype, gap):
    """Four keys at the corners of a square, one leaf, the query at its centre: the box's
    bound is 0 and every key lies ``gap`` (squared, scaled) away. Where the weights
    relative to the box flush to zero, the row walks again (each key summed twice) and is
    still within its bound, not flagged far."""
    a = np.sqrt(gap)  # scaled by 1/(h sqrt 2) with h = 1/sqrt 2: squared distance 2 a^2 / 2
    keys = np.array([[-a, -a], [-a, a], [a, -a], [a, a]]) / np.sqrt(2.0)
    values = np.array([[1.0], [2.0], [3.0], [4.0]])
    h = np.full(2, 1.0 / np.sqrt(2.0))
    queries = np.zeros((1, 2))
    out, lse, far, work = _walk(queries, keys.astype(dtype), values, h, dtype, 1e-6, 8)
    assert not far.any()
    flushes = gap > (87.0 if dtype == np.float32 else 708.0) - np.log(4.0)
    assert work[0, 0] == (8 if flushes else 4)
    _check_bound(out.astype(np.float64), lse, queries, keys, values, h, 1e-6, dtype)
    again = _walk(queries, keys.astype(dtype), values, h, dtype, 1e-6, 8)
    for first, second in zip((out, lse, far, work), again):
        assert np.array_equal(first, second, equal_nan=True)


@settings(max_examples=40)
@given(
    seed=seeds,
    separation=st.floats(0.0, 60.0),
    n_keys=st.integers(2, 200),
    n_queries=st.integers(1, 30),
    d=st.integers(1, 3),
    leaf_keys=st.sampled_from([4, 64, 1000]),
    rtol=st.sampled_from([1e-9, 1e-6, 0.1]),
    exclude_self=st.booleans(),
    dtype=float_dtypes,
)
def test_queries_between_two_clusters_within_the_bound(
    seed, separation, n_keys, n_queries, d, leaf_keys, rtol, exclude_self, dtype
):
    """Two tight clusters ``separation`` widths apart along a random direction, queries
    anywhere between them (or the keys themselves, each skipping its own): every row
    within its bound and none flagged far, whatever the leaves' sizes."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=d)
    direction /= max(np.linalg.norm(direction), 1e-12)
    side = rng.integers(0, 2, n_keys) * 2 - 1
    keys = 0.5 * separation * side[:, None] * direction + 0.01 * rng.normal(size=(n_keys, d))
    values = rng.normal(size=(n_keys, 1)) + side[:, None]
    if exclude_self:
        queries = keys
    else:
        t = rng.uniform(-0.5, 0.5, n_queries)
        queries = separation * t[:, None] * direction + 0.01 * rng.normal(size=(n_queries, d))
    h = np.ones(d)
    force = {
        "TREE_LEAF_KEYS": leaf_keys,
        "TREE_MIN_KEYS": 1,
        "TREE_MAX_COST_SHARE": 10**9,
        "TREE_MAX_OVERHEAD_SHARE": 10**9,
    }
    with config_values(**force):
        out, lse = nbattn.nadaraya_watson(
            queries,
            keys,
            values,
            h,
            exclude_self,
            dtype=dtype.__name__,
            rtol=rtol,
            return_lse=True,
        )
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    _check_bound(out.astype(np.float64), lse, queries, keys, values, h, rtol, dtype, exclude_self)


def test_the_far_rows_threshold_still_holds():
    """A row whose every key lies beyond the far threshold (relative to its own box) is
    still flagged and recomputed: the prediction is the nearest key's value."""
    limit = float(config.FAR_SCORE_FLOAT32)
    a = np.sqrt(2.0 * limit)  # squared scaled distance 2 * limit from the centre
    keys = np.array([[-a, 0.0], [a + 1.0, 0.0]]) / np.sqrt(2.0)
    values = np.array([[1.0], [2.0]])
    h = np.full(2, 1.0 / np.sqrt(2.0))
    queries = np.zeros((1, 2))
    _, _, far, _ = _walk(queries, keys.astype(np.float32), values, h, np.float32, 1e-6, 8)
    assert far.all()
    with config_values(
        TREE_LEAF_KEYS=8, TREE_MIN_KEYS=1, TREE_MAX_COST_SHARE=10**9, TREE_MAX_OVERHEAD_SHARE=10**9
    ):
        out = nbattn.nadaraya_watson(queries, keys, values, h, dtype="float32", rtol=1e-6)
    exact = naive.nadaraya_watson(queries, keys, values, h)
    np.testing.assert_allclose(out, exact, rtol=1e-5)
    assert out[0, 0] == pytest.approx(1.0, rel=1e-5)
