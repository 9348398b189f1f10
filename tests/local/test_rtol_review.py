"""local_polynomial(..., rtol=) at the edges: leaves wider than float64 squares, fallback ties.

The pruned pass (``nbattn.kernels.local_leaves``) must stay within its bound of the exact
one (rtol = 0) where a leaf's box spans more than 1e154 widths (its squared spread
overflows), and a query with no key of positive weight must take the same nearest key as
the exact path, the first of the tied ones in the original order, not in k-d order.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn.local.engine import local_loo_loss, local_polynomial
from tests.strategies import seeds

from .._config import config_values

_FORCE = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1}


def _both(*args, rtol=1e-6, **options):
    """(exact, pruned, pruned again) of local_polynomial with the leaves forced small."""
    with config_values(**_FORCE):
        exact = local_polynomial(*args, **options)
        pruned = local_polynomial(*args, rtol=rtol, **options)
        again = local_polynomial(*args, rtol=rtol, **options)
    np.testing.assert_array_equal(pruned, again)
    return exact, pruned


@pytest.mark.parametrize("degree", [0, 1])
def test_leaf_wider_than_float64_squares(degree):
    """A leaf holding the query's nearest keys and one key 1e160 widths away: its squared
    spread overflows; the leaf still counts (it was dropped at degree 0: 0 * inf)."""
    X = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1e160])[:, None]
    y = np.arange(8.0)
    exact, pruned = _both(np.array([[0.5], [0.05]]), X, y, [1.0], degree)
    assert np.all(np.isfinite(exact))
    np.testing.assert_allclose(pruned, exact, rtol=1e-5)


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("kernel", ["epanechnikov", "tricube"])
def test_fallback_ties_as_exact(degree, kernel):
    """Queries outside every support, halfway between two groups of keys: the fallback
    takes the first of the tied nearest keys in the original order, as rtol = 0 does."""
    X = np.concatenate([np.full(8, -5.0), np.full(8, 5.0)])[:, None]
    y = np.arange(16.0)
    queries = np.array([[0.0], [-7.0], [7.0]])
    exact, pruned = _both(queries, X, y, [1.0], degree, kernel=kernel)
    np.testing.assert_array_equal(exact, [0.0, 0.0, 8.0])
    np.testing.assert_array_equal(pruned, exact)


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    n=st.integers(9, 120),
    dc=st.integers(1, 2),
    width=st.sampled_from([0.25, 0.5]),
    degree=st.integers(0, 1),
    kernel=st.sampled_from(["epanechnikov", "tricube"]),
    exclude_self=st.booleans(),
)
def test_fallback_on_a_grid_as_exact(seed, n, dc, width, degree, kernel, exclude_self):
    """Distinct keys on an integer grid (ties everywhere) and supports no wider than its
    step: every query falls back, and the pruned answers equal the exact ones to the bit."""
    rng = np.random.default_rng(seed)
    side = 120 if dc == 1 else 11
    grid = np.stack(np.meshgrid(*[np.arange(side)] * dc), axis=-1).reshape(-1, dc)
    X = grid[rng.choice(grid.shape[0], n, replace=False)].astype(float)
    y = rng.normal(size=n)
    queries = X if exclude_self else X[rng.integers(0, n, 20)] + 0.5
    exact, pruned = _both(
        queries, X, y, [width] * dc, degree, kernel=kernel, exclude_self=exclude_self
    )
    np.testing.assert_array_equal(pruned, exact)


def test_loo_loss_with_fallback_ties_as_exact():
    """The leave-one-out criterion on a grid with a compact kernel narrower than its step
    (each row falls back to a neighbour, two tied): the same value with rtol > 0."""
    rng = np.random.default_rng(4)
    X = rng.permutation(30).astype(float)[:, None]
    y = rng.normal(size=30)
    with config_values(**_FORCE):
        exact = local_loo_loss(X, y, [0.5], 0, kernel="epanechnikov")
        pruned = local_loo_loss(X, y, [0.5], 0, kernel="epanechnikov", rtol=1e-6)
    assert pruned == exact
