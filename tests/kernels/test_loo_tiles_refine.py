"""The LOO tiles' refined GEMM scores, tile shape and boxed-share estimate (kernels.loo_tiles)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import config
from nbattn.kernels import kd_order, loo_tiles
from nbattn.smoothing import loo, tiled_loo

from .. import naive
from .._config import config_values
from ..strategies import sample_shapes, seeds


def _refined(boxed=False):
    """GEMM scores on every block, every block in the refined band."""
    return config_values(
        LOO_TILE_ROWS=8,
        LOO_TILE_GEMM_MIN_DIMS=1,
        LOO_TILE_GEMM_MAX_RADIUS2=0,
        LOO_TILE_GEMM_REFINE_MAX_RADIUS2=1 << 20,
        LOO_PRUNE_MIN_ROWS=16 if boxed else 10**9,
        LOO_BOXED_MAX_SHARE=1.0,
        LOO_TILE_LEAF_KEYS=8,
    )


@settings(max_examples=25)
@given(
    shape=sample_shapes(rows=(2, 90), features=6, outputs=2),
    k=st.integers(1, 6),
    spread=st.sampled_from([0.3, 3.0, 30.0]),
    boxed=st.booleans(),
    seed=seeds,
)
def test_refined_gemm_scores_match_naive(shape, k, spread, boxed, seed):
    """Wide blocks (radius far beyond LOO_TILE_GEMM_MAX_RADIUS2) on refined GEMM scores
    (plain keys; the boxed keys, which take the direct scores there, meet the same contract):
    the loss and gradient of the float64 contract against the plain-NumPy reference."""
    n, d, outputs = shape
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 1.0, size=d)
    X[: n // 3] += spread  # a cluster far from the rest: blocks wide against the kernel
    y = rng.normal(size=(n, outputs)) if outputs > 1 else rng.normal(size=n)
    L = rng.normal(size=(k, d))
    with _refined(boxed):
        loss, grad = loo.loo_loss_and_grad(X, y, components=L)
    expected = naive.loo_grad(X, y, components=L)
    assert loss == pytest.approx(naive.loo_loss(X, y, components=L), rel=1e-11)
    # the gradient's scale: n = 2 (each row predicts the other) has a zero gradient
    scale = np.abs(expected).max() + loss
    np.testing.assert_allclose(grad, expected, rtol=1e-9, atol=1e-12 * scale)


@pytest.mark.parametrize("seed", range(6))
def test_refined_and_direct_scores_agree_in_both_kernels(seed):
    """The one tile body on direct scores and on refined GEMM scores, plain and boxed
    keys: the same sums to float64 rounding over several draws."""
    rng = np.random.default_rng(seed)
    n, k, d = 150, 9, 4
    z = rng.normal(size=(n, k)) * 2.0
    z[::5] += 15.0  # wide blocks
    points = rng.normal(size=(n, d))
    y = rng.normal(size=(n, 2))
    rows = np.sort(rng.choice(n, size=100, replace=False)).astype(np.int64)
    z_t = np.ascontiguousarray(z.T)
    common = (z_t, points, np.ascontiguousarray(y.T), np.ascontiguousarray(y[rows]), rows, 8)
    direct = loo_tiles.loo_tiles(*common, False, 0.0)
    refined = loo_tiles.loo_tiles(*common, True, 0.0, float(1 << 20))
    order, starts = kd_order.kd_order(z, 8)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    zb_t = np.ascontiguousarray(z[order].T)
    box_lo, box_hi = kd_order.leaf_boxes(zb_t, starts)
    rows_b = np.sort(rank[rows])
    boxed = loo_tiles.loo_tiles_boxed(
        zb_t,
        np.ascontiguousarray(points[order]),
        np.ascontiguousarray(y[order].T),
        np.ascontiguousarray(y[order][rows_b]),
        rows_b,
        8,
        True,
        0.0,
        starts,
        box_lo,
        box_hi,
        40.0,
        refine_max_radius2=float(1 << 20),
    )
    for other in (refined, boxed):
        assert other[0] == pytest.approx(direct[0], rel=1e-12)
        scale = np.abs(direct[1]).max()
        np.testing.assert_allclose(other[1], direct[1], rtol=1e-10, atol=1e-12 * scale)
    np.testing.assert_allclose(refined[2], direct[2], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(boxed[2][rank], direct[2], rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("seed", range(8))
def test_refine_rescores_every_key_near_the_best(seed):
    """Brute force: after the refinement every key within the gap of the exact best holds
    its exact score, and the returned best is the exact maximum, on rows built to break
    it: near-ties at the gap's edge, GEMM scores perturbed by float32-sized noise."""
    rng = np.random.default_rng(seed)
    k, width = 3, 400
    own_point = rng.normal(size=(k, 1))
    # every key at squared distance in [1.5, 200], many of them within the gap
    directions = rng.normal(size=(k, width))
    directions /= np.sqrt(np.sum(directions**2, axis=0))
    keys = own_point + directions * np.sqrt(rng.uniform(1.5, 200.0, size=width))
    # key 0 the best, at squared distance 1; keys 1-5 right at the gap's edge of it
    for t, dist2 in enumerate((1.0, 36.9, 37.0, 37.1, 37.9, 38.1)):
        direction = rng.normal(size=k)
        keys[:, t] = own_point[:, 0] + direction * np.sqrt(dist2 / np.sum(direction**2))
    exact = -np.sum((keys - own_point) ** 2, axis=0)
    exact_best = exact.max()
    assert exact_best == pytest.approx(-1.0)
    z_t = np.concatenate([own_point, keys], axis=1)  # the row's own point is key 0 of z_t
    noisy = exact + rng.uniform(-0.4, 0.4, size=width)  # GEMM error below the slack
    row = noisy.copy()
    near = np.empty(width, dtype=np.int64)
    dist = np.empty(width)
    best = loo_tiles._refine_near_best(
        np.ascontiguousarray(z_t),
        0,
        np.ascontiguousarray(keys),
        width,
        row,
        noisy.max(),
        near,
        dist,
    )
    assert best == pytest.approx(exact_best, rel=1e-14, abs=1e-12)
    inside = exact >= exact_best - 36.0
    np.testing.assert_allclose(row[inside], exact[inside], rtol=1e-14, atol=1e-12)
    untouched = ~np.isclose(row, exact, rtol=1e-14, atol=1e-12)
    assert np.all(row[untouched] == noisy[untouched])
    assert np.all(exact[untouched] < exact_best - 36.0)


def test_float32_fit_on_refined_scores_matches_float64():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, 5))
    X[:20] += 12.0
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=80)
    L = rng.normal(size=(9, 5))
    with _refined():
        loss32, grad32 = loo.loo_loss_and_grad(
            X.astype(np.float32), y.astype(np.float32), components=L, dtype="float32"
        )
    ref_loss = naive.loo_loss(X, y, components=L)
    assert loss32 == pytest.approx(ref_loss, rel=1e-4)
    expected = naive.loo_grad(X, y, components=L)
    np.testing.assert_allclose(grad32, expected, atol=1e-3 * np.abs(expected).max())


def test_tile_rows_cap_to_the_cache_only_for_every_key():
    n = 4000
    rows = tiled_loo.tile_rows(n)
    assert rows == min(config.LOO_TILE_ROWS, config.LOO_TILE_BYTES // (8 * n))
    capped = tiled_loo.tile_rows(n, every_key=True)
    assert capped == max(8, min(rows, config.LOO_TILE_CACHE_BYTES // (8 * n)))
    assert 8 <= capped <= rows
    assert tiled_loo.tile_rows(10**8, every_key=True) == tiled_loo.tile_rows(10**8)
    assert tiled_loo.tile_rows(50, every_key=True) == tiled_loo.tile_rows(50)


def _share_brute_force(keys, n_sample=64):
    """The estimate row by row: each sampled row's bound U over its 8 neighbours in the
    order, the leaves whose box lies within U + gap, their keys' share."""
    _, (leaf_start, box_lo, box_hi, gap), _, z_t, _, _ = keys
    n = z_t.shape[1]
    positions = np.unique(np.linspace(0, n - 1, min(n_sample, n)).astype(np.int64))
    total = 0.0
    for i in positions:
        q = z_t[:, i]
        near = [j for j in range(max(i - 4, 0), min(i + 5, n)) if j != i]
        bound = min((float(np.sum((z_t[:, j] - q) ** 2)) for j in near), default=np.inf)
        kept = 0
        for leaf in range(len(leaf_start) - 1):
            outside = np.maximum(np.maximum(box_lo[leaf] - q, q - box_hi[leaf]), 0.0)
            if np.sum(outside**2) <= bound + gap:
                kept += leaf_start[leaf + 1] - leaf_start[leaf]
        total += kept / n
    return total / positions.size


@settings(max_examples=20)
@given(
    n=st.integers(1, 400),
    k=st.integers(1, 5),
    scale=st.sampled_from([0.01, 1.0, 30.0]),
    seed=seeds,
)
def test_boxed_share_matches_brute_force(n, k, scale, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * scale * rng.uniform(0.1, 1.0, size=k)
    with config_values(LOO_TILE_LEAF_KEYS=8):
        keys = tiled_loo.boxed_keys(z, z, rng.normal(size=(n, 1)))
    assert tiled_loo.boxed_share(keys) == pytest.approx(_share_brute_force(keys), abs=1e-12)
