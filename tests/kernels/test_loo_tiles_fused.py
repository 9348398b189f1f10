"""The LOO tiles on direct scores: two fused passes, two rows at a time, exp with reference 0
(kernels.loo_fused), against the plain-NumPy references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import config
from nbattn.kernels import loo_fused
from nbattn.smoothing import loo, tiled_loo

from .. import naive
from .._config import config_values
from ..strategies import sample_shapes, seeds


def _direct(boxed=False, tile_rows=8, gemm=False):
    """Direct scores on every tile (no GEMM), plain keys or boxed keys in k-d order; with
    ``gemm`` GEMM scores at any dimension instead (blocks narrow against the kernel
    unrefined, wider ones refined or direct, as in the fit)."""
    return config_values(
        LOO_TILE_ROWS=tile_rows,
        LOO_TILE_GEMM_MIN_DIMS=1 if gemm else 10**6,
        LOO_PRUNE_MIN_ROWS=16 if boxed else 10**9,
        LOO_BOXED_MAX_SHARE=1.0,
        LOO_TILE_LEAF_KEYS=8,
    )


def _check(X, y, L, loss, grad, isolated=False):
    """The loss against the float64 twin, the gradient against the extended-precision one
    (the float64 formula itself is off by up to 1e-7 of the gradient's scale on rows far
    from every other). Rows isolated at score distances of 40-700 (``isolated``) leave the
    float64 kernels, before the fused passes too, 1.2e-11 from the loss and 1.5e-9 of the
    gradient's scale from the reference (the worst draws hypothesis found); other data
    stays within 1e-15."""
    expected = naive.loo_grad_differences(X, y, components=L, dtype=np.longdouble)
    expected = expected.astype(np.float64)
    rel_loss, rel_grad = (1e-10, 1e-8) if isolated else (1e-12, 1e-11)
    assert loss == pytest.approx(naive.loo_loss(X, y, components=L), rel=rel_loss)
    scale = np.abs(expected).max() + loss  # n = 2: a zero gradient
    np.testing.assert_allclose(grad, expected, rtol=rel_grad, atol=rel_grad * scale)


@settings(max_examples=25)
@given(
    shape=sample_shapes(rows=(2, 120), features=6, outputs=3),
    k=st.integers(1, 7),
    isolated=st.sampled_from([0.0, 9.0, 9.8, 38.0, 1e4]),
    boxed=st.booleans(),
    gemm=st.booleans(),
    seed=seeds,
)
def test_fused_direct_tiles_match_naive(shape, k, isolated, boxed, gemm, seed):
    """Any shape, one to three outputs, odd and even row counts, with a quarter of the rows
    isolated in a chain at score distance about 40 or 48 (both sides of the weights' sum
    2^-64, below which a row is divided by its sum before the gradient), 722 (where every
    exp(s) of reference 0 underflows: scored again, its best subtracted) or 5e7 (far
    rows, left to the anchored kernels): the loss and gradient of the float64 contract,
    on direct scores and on GEMM scores (whose exp pass takes reference 0 too)."""
    n, d, outputs = shape
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.normal(size=(n, outputs)) if outputs > 1 else rng.normal(size=n)
    L = rng.normal(size=(k, d))
    L /= np.linalg.norm(L, axis=1, keepdims=True)
    if isolated and n > 3:
        # a chain of rows moved along a direction of unit score length, each about
        # isolated^2 / 2 in score from its neighbours
        direction = np.linalg.pinv(L)[:, 0]
        direction /= np.linalg.norm(L @ direction)
        for i in range(n // 4 + 1):
            X[i] += isolated * (i + 1) * direction
    with _direct(boxed, gemm=gemm):
        loss, grad = loo.loo_loss_and_grad(X, y, components=L)
    _check(X, y, L, loss, grad, isolated=bool(isolated))


@pytest.mark.parametrize("seed", range(3))
def test_rows_across_chunks_and_tiles(seed):
    """More keys than one chunk (each row's own key in every chunk position), tiles of an
    odd number of rows: the same sums as the references."""
    rng = np.random.default_rng(seed)
    n = loo_fused._CHUNK + 151
    X = rng.normal(size=(n, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    L = rng.normal(size=(2, 3))
    with _direct(tile_rows=7):
        loss, grad = loo.loo_loss_and_grad(X, y, components=L)
    _check(X, y, L, loss, grad)


@pytest.mark.parametrize("nearest", [30.0, 44.4, 46.0, 598.0, 600.0, 708.0, 745.0, 2000.0])
def test_rows_at_the_reference_zero_limit(nearest):
    """Pairs of points whose best score is -``nearest``, on both sides of the limits of
    reference 0 (weights exp(s) summing below 2^-64, best below about -44.4: the row is
    divided by its sum first; below e^-600: scored again with its best subtracted) and
    where exp(s) underflows: every row still gets its neighbour's value, and the loss and
    gradient of the references."""
    rng = np.random.default_rng(int(nearest))
    pairs = 12
    centres = np.arange(pairs)[:, None] * np.array([[200.0, 0.0]])
    offsets = np.zeros((pairs, 2))
    offsets[:, 1] = np.sqrt(2.0 * nearest) * (1.0 + 1e-3 * rng.uniform(size=pairs))
    X = np.concatenate([centres, centres + offsets])
    y = rng.normal(size=2 * pairs)
    L = np.eye(2)
    for gemm in (False, True):
        # GEMM scores unrefined on these wide blocks: each row's one neighbour takes all
        # its weight, so the scores' rounding cannot show
        with _direct(gemm=gemm), config_values(LOO_TILE_GEMM_MAX_RADIUS2=1 << 40):
            loss, grad = loo.loo_loss_and_grad(X, y, components=L)
        # each row's prediction is its partner's value
        partner = np.concatenate([y[pairs:], y[:pairs]])
        assert loss == pytest.approx(np.mean((partner - y) ** 2), rel=1e-12)
        _check(X, y, L, loss, grad, isolated=True)


@settings(max_examples=20)
@given(
    scale=st.sampled_from([1e-150, 1.0, 1e150]),
    offset=st.sampled_from([0.0, 1e4]),
    n=st.integers(3, 60),
    seed=seeds,
)
def test_offset_and_extreme_scales(scale, offset, n, seed):
    """Data offset by 1e4 and scaled by 1e+-150, components scaled back: the loss is the
    one of the centred data; the gradient with respect to L / scale is scale times the
    unscaled one. Inputs are not modified."""
    rng = np.random.default_rng(seed)
    X0 = rng.normal(size=(n, 3))
    y = rng.normal(size=n)
    L0 = rng.normal(size=(2, 3))
    X = (X0 + offset) * scale
    L = L0 / scale
    X_saved, y_saved, L_saved = X.copy(), y.copy(), L.copy()
    with _direct():
        loss, grad = loo.loo_loss_and_grad(X, y, components=L)
    np.testing.assert_array_equal(X, X_saved)
    np.testing.assert_array_equal(y, y_saved)
    np.testing.assert_array_equal(L, L_saved)
    assert np.all(np.isfinite(grad))
    # the reference on the data as nbattn sees it: offset removed in float64
    Xc = (X - X.mean(axis=0)) / scale
    expected_grad = naive.loo_grad_differences(Xc, y, components=L0)
    assert loss == pytest.approx(naive.loo_loss(Xc, y, components=L0), rel=1e-9)
    ref_scale = np.abs(expected_grad).max() + loss
    np.testing.assert_allclose(grad / scale, expected_grad, rtol=1e-7, atol=1e-10 * ref_scale)


@pytest.mark.parametrize("boxed", [False, True])
def test_float32_matches_float64(boxed):
    """dtype float32 (scores of float32 points, widened) agrees with float64 to float32
    rounding, on several draws."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(90, 4)) * np.array([1.0, 3.0, 0.5, 1e-2])
        y = np.cos(X[:, 0]) + 0.1 * rng.normal(size=90)
        L = rng.normal(size=(3, 4))
        with _direct(boxed):
            loss, grad = loo.loo_loss_and_grad(X, y, components=L)
            loss32, grad32 = loo.loo_loss_and_grad(X, y, components=L, dtype="float32")
        assert loss32 == pytest.approx(loss, rel=1e-4)
        np.testing.assert_allclose(grad32, grad, rtol=1e-3, atol=1e-4 * np.abs(grad).max())


@pytest.mark.parametrize("seed", range(3))
def test_diagonal_metric_on_fused_tiles(seed):
    """The diagonal metric (gradient with respect to log-widths) takes the same tiles."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(70, 3))
    y = X[:, 0] ** 2 + 0.1 * rng.normal(size=70)
    h = rng.uniform(0.3, 2.0, size=3)
    with _direct(boxed=seed == 2):
        loss, grad = loo.loo_loss_and_grad(X, y, bandwidth=h)
    expected = naive.loo_grad_differences(X, y, bandwidth=h)
    assert loss == pytest.approx(naive.loo_loss(X, y, bandwidth=h), rel=1e-11)
    np.testing.assert_allclose(grad, expected, rtol=1e-9, atol=1e-12 * np.abs(expected).max())


@settings(max_examples=20)
@given(
    n=st.integers(2, 300),
    k=st.integers(1, 6),
    scale=st.sampled_from([0.05, 1.0, 20.0]),
    seed=seeds,
)
def test_reach_share_matches_brute_force(n, k, scale, seed):
    """The pre-check of the boxed tiles (share of keys within U_i + gap of sampled rows,
    distances by a GEMM) against exact differences."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * scale
    z[: n // 5] *= 30.0  # a sparse outer shell
    rows = np.unique(np.linspace(0, n - 1, min(32, n)).astype(np.int64))
    dist = ((z[rows, None, :] - z[None, :, :]) ** 2).sum(axis=2)
    dist[np.arange(rows.size), rows] = np.inf
    reach = dist.min(axis=1) + config.PRUNE_GAP_FLOAT64
    inside = dist <= reach[:, None]
    # a key at the edge of reach may fall either side by rounding
    edge = np.abs(dist - reach[:, None]) <= 1e-9 * (1.0 + reach[:, None])
    share = tiled_loo.reach_share(z)
    assert np.mean(inside & ~edge) - 1e-12 <= share <= np.mean(inside | edge) + 1e-12
