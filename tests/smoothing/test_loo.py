"""Leave-one-out loss, its exact gradient, the LOO bandwidth search and the spread kernel."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import config
from nbattn.smoothing import regression, width_search
from nbattn.smoothing.loo import loo_loss, loo_loss_and_grad, prepared_loss_and_grad

from .. import naive
from ..strategies import sample_shapes, seeds


def _data(rng, n, d, p=None):
    X = rng.normal(size=(n, d))
    signal = np.sin(X @ rng.normal(size=d))
    y = signal + 0.2 * rng.normal(size=n)
    if p is not None:
        y = np.column_stack([y] + [np.cos(X[:, 0] * (c + 1)) for c in range(p - 1)])
    return X, y


@pytest.mark.parametrize("d", [1, 2, 5, 8])
@pytest.mark.parametrize("p", [None, 3])
def test_loss_and_grad_match_naive_diagonal(rng, d, p):
    X, y = _data(rng, 70, d, p)
    h = rng.uniform(0.4, 2.0, size=d)
    expected = naive.loo_loss(X, y, bandwidth=h)
    assert loo_loss(X, y, h) == pytest.approx(expected, rel=1e-12)
    loss, grad = loo_loss_and_grad(X, y, h)
    assert loss == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(grad, naive.loo_grad(X, y, bandwidth=h), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("d,k", [(1, 1), (3, 3), (5, 2), (8, 8)])
def test_loss_and_grad_match_naive_full(rng, d, k):
    X, y = _data(rng, 60, d, 2)
    L = rng.normal(size=(k, d))
    expected = naive.loo_loss(X, y, components=L)
    assert loo_loss(X, y, components=L) == pytest.approx(expected, rel=1e-12)
    loss, grad = loo_loss_and_grad(X, y, components=L)
    assert loss == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(grad, naive.loo_grad(X, y, components=L), rtol=1e-9, atol=1e-13)


def _central_difference(fun, x, eps=1e-5):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = eps
        grad[idx] = (fun(x + step) - fun(x - step)) / (2 * eps)
    return grad


@pytest.mark.parametrize("d", range(1, 9))
def test_grad_matches_finite_differences(rng, d):
    """Relative error of the analytic gradient <= 1e-6 (float64), log-widths and full L."""
    X, y = _data(rng, 40, d)
    log_h = np.log(rng.uniform(0.5, 1.5, size=d))
    _, grad = loo_loss_and_grad(X, y, np.exp(log_h))
    fd = _central_difference(lambda t: loo_loss(X, y, np.exp(t)), log_h)
    assert np.linalg.norm(grad - fd) <= 1e-6 * np.linalg.norm(fd)

    L = rng.normal(size=(max(1, d - 1), d))
    _, grad_l = loo_loss_and_grad(X, y, components=L)
    fd_l = _central_difference(lambda m: loo_loss(X, y, components=m), L)
    assert np.linalg.norm(grad_l - fd_l) <= 1e-6 * np.linalg.norm(fd_l)


def test_float32_matches_float64(rng):
    X, y = _data(rng, 300, 3)
    h = np.array([0.5, 0.8, 1.2])
    loss64, grad64 = loo_loss_and_grad(X, y, h)
    loss32, grad32 = loo_loss_and_grad(X.astype(np.float32), y.astype(np.float32), h)
    assert abs(loss32 - loss64) <= 1e-5 * loss64
    assert np.max(np.abs(grad32 - grad64)) <= 1e-5 * np.max(np.abs(grad64))
    L = rng.normal(size=(2, 3))
    _, g64 = loo_loss_and_grad(X, y, components=L)
    _, g32 = loo_loss_and_grad(X, y, components=L, dtype="float32")
    assert np.max(np.abs(g32 - g64)) <= 1e-5 * np.max(np.abs(g64))


@settings(max_examples=25)
@given(
    shape=sample_shapes(rows=(2, 40), features=4, outputs=3), seed=seeds, log_h=st.floats(-2.0, 2.0)
)
def test_loss_and_grad_property(shape, seed, log_h):
    n, d, p = shape
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.normal(size=(n, p))
    h = np.exp(log_h) * rng.uniform(0.5, 2.0, size=d)
    loss, grad = loo_loss_and_grad(X, y, h)
    assert loss == pytest.approx(naive.loo_loss(X, y, bandwidth=h), rel=1e-10)
    expected = naive.loo_grad(X, y, bandwidth=h)
    np.testing.assert_allclose(grad, expected, rtol=1e-8, atol=1e-12 * (1 + np.abs(expected).max()))


def test_far_points_do_not_give_nan(rng):
    """Widths far below the spacing: every weight of the textbook formula underflows."""
    gaps = 100.0 + 10.0 * rng.permutation(19)  # distinct gaps: a unique nearest neighbour
    x = np.concatenate([[0.0], np.cumsum(gaps)])
    y = rng.normal(size=20)
    loss, grad = loo_loss_and_grad(x, y, 1e-3)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    dist = np.abs(x[:, None] - x[None, :])
    np.fill_diagonal(dist, np.inf)
    f = y[np.argmin(dist, axis=1)]  # each left-out point takes its nearest neighbour's value
    assert loss == pytest.approx(np.mean((f - y) ** 2), rel=1e-12)


def test_two_samples_and_too_few(rng):
    X = np.array([[0.0], [1.0]])
    y = np.array([1.0, 3.0])
    assert loo_loss(X, y, 1.0) == pytest.approx(4.0)  # each predicts the other
    with pytest.raises(ValueError, match="at least 2 samples"):
        loo_loss(X[:1], y[:1], 1.0)
    with pytest.raises(ValueError, match="at least 2 samples"):
        width_search.loo_bandwidth(X[:1], y[:1])


def test_bad_inputs(rng):
    X, y = _data(rng, 10, 2)
    with pytest.raises(ValueError, match="X contains NaN"):
        loo_loss(np.where(X > 1, np.nan, X), y)
    with pytest.raises(ValueError, match="y has 9 rows"):
        loo_loss(X, y[:9])
    with pytest.raises(ValueError, match="exactly one"):
        loo_loss_and_grad(X, y)
    with pytest.raises(ValueError, match="components has 3 columns"):
        loo_loss(X, y, components=np.eye(3))
    with pytest.raises(ValueError, match="bandwidth"):
        loo_loss(X, y, -1.0)
    X_before, y_before = X.copy(), y.copy()
    loo_loss_and_grad(X, y, 1.0)
    assert np.array_equal(X, X_before) and np.array_equal(y, y_before)


def test_constant_feature_follows_the_rule(rng):
    """A constant feature gets the rule's unit spread and changes no score."""
    X, y = _data(rng, 50, 2)
    Xc = np.column_stack([X, np.full(50, 3.0)])
    h = width_search.loo_bandwidth(Xc, y)
    assert np.all(np.isfinite(h)) and np.all(h > 0)
    assert loo_loss(Xc, y, h) == pytest.approx(naive.loo_loss(X, y, bandwidth=h[:2]), rel=1e-12)
    _, grad = loo_loss_and_grad(Xc, y, h)
    assert grad[2] == 0.0


def test_loo_bandwidth_is_no_worse_than_its_grid(rng):
    X, y = _data(rng, 120, 2)
    h, (factors, losses) = width_search.loo_bandwidth(X, y, return_curve=True)
    best = naive.loo_loss(X, y, bandwidth=h)
    h0 = regression.bandwidth_rule(X)
    grid_losses = [naive.loo_loss(X, y, bandwidth=c * h0) for c in width_search.LOO_GRID]
    assert best <= min(grid_losses) * (1 + 1e-12)
    assert np.all(np.diff(factors) > 0) and losses.min() == pytest.approx(best, rel=1e-12)
    # the ratio to the base widths is one shared factor
    assert np.allclose(h / h0, (h / h0)[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_loo_bandwidth_no_worse_than_statsmodels_cv_ls(seed):
    """Same data, same criterion: nbattn's LOO MSE <= statsmodels KernelReg(bw='cv_ls')'s."""
    sm = pytest.importorskip("statsmodels.nonparametric.kernel_regression")
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 6, 150))
    y = 2 * np.sin(x) + x**0.8 + rng.normal(0, 0.5, 150)
    bw_sm = sm.KernelReg(y, x, var_type="c", reg_type="lc", bw="cv_ls").bw
    h = width_search.loo_bandwidth(x, y)
    ours = naive.loo_loss(x[:, None], y, bandwidth=h)
    theirs = naive.loo_loss(x[:, None], y, bandwidth=bw_sm)
    assert ours <= theirs * (1 + 1e-9)


def test_spread_matches_naive(rng):
    X, y = _data(rng, 80, 2, 2)
    Q = rng.normal(size=(30, 2)) * 2
    h = np.array([0.4, 0.7])
    mean, std, n_eff = regression.nadaraya_watson_spread(Q, X, y, h)
    m_ref, s_ref, n_ref = naive.weighted_spread(Q, X, y, h)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(std, s_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(n_eff, n_ref, rtol=1e-12)
    assert np.all((n_eff >= 1 - 1e-12) & (n_eff <= len(X) + 1e-9))
    m1, s1, _ = regression.nadaraya_watson_spread(Q, X, y[:, 0], h)
    assert m1.shape == (30,) and np.allclose(s1, std[:, 0], rtol=1e-14)
    # float32: within 1e-5 of the output scale
    m32, s32, n32 = regression.nadaraya_watson_spread(Q, X, y, h, dtype="float32")
    scale = np.abs(y).max()
    assert np.max(np.abs(m32 - m_ref)) <= 1e-5 * scale
    assert np.max(np.abs(s32 - s_ref)) <= 1e-5 * scale
    np.testing.assert_allclose(n32, n_ref, rtol=1e-5)


def test_spread_is_well_conditioned():
    """Targets with a huge offset: the two-pass variance keeps its digits."""
    x = np.linspace(0, 1, 50)
    y = 1e8 + np.sin(6 * x)
    _, std, _ = regression.nadaraya_watson_spread(x, x, y, 0.1)
    _, std_ref, _ = regression.nadaraya_watson_spread(x, x, y - 1e8, 0.1)
    np.testing.assert_allclose(std, std_ref, rtol=1e-6)


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-12), ("float32", 1e-5)])
@pytest.mark.parametrize("h", [0.02, 0.3, 5.0])
@pytest.mark.parametrize("p", [1, 2])
def test_sorted_1d_kernel_matches_the_general_one(rng, dtype, rtol, h, p):
    """The windowed 1-D kernel of the bandwidth search, against the full kernel, with
    one output and with two."""
    from nbattn.kernels import loo_1d

    n = 400
    x = np.sort(rng.uniform(0, 6, n))
    x[10] = x[11]  # a duplicate
    y = np.column_stack([np.sin(x), np.cos(x)])[:, :p] + 0.3 * rng.normal(size=(n, p))
    zs = np.ascontiguousarray(x / (h * np.sqrt(2.0)), dtype=dtype)
    v_t = np.ascontiguousarray(y.T, dtype=dtype)
    gap = loo_1d.prune_gap_for(dtype)
    total = loo_1d.loo_squared_error_sorted_1d(zs, v_t, y, np.arange(n), gap)
    assert total / y.size == pytest.approx(naive.loo_loss(x[:, None], y, bandwidth=h), rel=rtol)
    rows = np.sort(rng.choice(n, 50, replace=False))
    sub = loo_1d.loo_squared_error_sorted_1d(zs, v_t, y, rows, gap)
    w = naive._loo_weights(x[:, None] / h)
    expected = np.sum((w[rows] @ y - y[rows]) ** 2)
    assert sub == pytest.approx(expected, rel=rtol)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("span_sq", [1e-6, 0.05, 1.0, 3.999])
@pytest.mark.parametrize("n", [2, 3, 40, 300])
def test_taylor_1d_kernel_matches_naive(rng, dtype, span_sq, n):
    """The series of the wide widths, against the full weight matrix, to 1e-12 relative
    (the float32 inputs are converted exactly; the series runs in float64), for every
    squared span up to its limit, with duplicates, unsorted points and a row subset."""
    from nbattn.kernels import loo_1d

    x = rng.uniform(0, 6, n)
    if n > 2:
        x[0] = x[-1]  # a duplicate
    y = np.column_stack([np.sin(x), np.cos(x)]) + 0.3 * rng.normal(size=(n, 2))
    h = np.ptp(x) / np.sqrt(2.0 * span_sq)
    zs = np.ascontiguousarray(x / (h * np.sqrt(2.0)), dtype=dtype)
    x_used = zs.astype(np.float64) * np.sqrt(2.0)  # what the kernel sees, times sqrt 2
    v_t = np.ascontiguousarray(y.T, dtype=dtype)
    y_used = v_t.T.astype(np.float64)
    terms = loo_1d.taylor_terms(float(np.ptp(zs.astype(np.float64))) ** 2)
    assert terms > 0
    w = naive._loo_weights(x_used[:, None])
    for rows in (np.arange(n), np.sort(rng.choice(n, max(1, n // 3), replace=False))):
        total = loo_1d.loo_squared_error_taylor_1d(zs, v_t, y, rows, terms)
        expected = np.sum((w[rows] @ y_used - y[rows]) ** 2)
        assert total == pytest.approx(expected, rel=1e-12)


def test_taylor_1d_kernel_is_used_only_where_its_series_keeps_its_digits():
    from nbattn import config
    from nbattn.kernels import loo_1d

    limit = config.LOO_TAYLOR_MAX_SPAN_SQ
    assert loo_1d.taylor_terms(limit * (1 + 1e-9)) == 0 and loo_1d.taylor_terms(np.inf) == 0
    assert loo_1d.taylor_terms(np.nan) == 0
    previous = 0
    for span_sq in (0.0, 1e-3, 0.1, 1.0, limit):  # more terms for wider spans
        terms = loo_1d.taylor_terms(span_sq)
        x = span_sq / 2
        bound = x**terms / math.factorial(terms) * math.exp(2 * x)
        assert terms >= previous and bound <= 2.0**-60
        previous = terms


@pytest.mark.parametrize("scale", [1.0, 1e-170, 1e160])
def test_loo_bandwidth_1d_series_gives_the_windowed_kernels_curve(monkeypatch, rng, scale):
    """The 1-D search with the wide widths on the Taylor series and with every width on
    the windowed kernel (series off): the same criterion at every factor (1e-12), the
    same width; at x near 1e-170 and 1e160 too."""
    from nbattn import config

    monkeypatch.setattr(config, "LOO_BOXED_MIN_WINDOW", 10**9)  # the boxed series off
    x = rng.uniform(0, 6, 300) * scale
    y = np.sin(x / scale) + 0.3 * rng.normal(size=300)
    h, (factors, losses) = width_search.loo_bandwidth(x, y, return_curve=True)
    h0 = regression.bandwidth_rule(x)[0]
    assert np.any((np.ptp(x) / (factors * h0 * np.sqrt(2.0))) ** 2 <= 4.0)  # series used
    monkeypatch.setattr(config, "LOO_TAYLOR_MAX_SPAN_SQ", -1.0)
    h_w, (factors_w, losses_w) = width_search.loo_bandwidth(x, y, return_curve=True)
    np.testing.assert_allclose(factors_w, factors, rtol=1e-12)
    np.testing.assert_allclose(losses_w, losses, rtol=1e-12)
    np.testing.assert_allclose(h_w, h, rtol=1e-12)
    assert h[0] / scale == pytest.approx(width_search.loo_bandwidth(x / scale, y)[0], rel=1e-9)


def test_loo_bandwidth_subsampled_grid_stage(rng):
    """n > grid_queries: the coarse stage estimates, the refinement stays exact."""
    for d in (1, 2):
        X, y = _data(rng, 300, d)
        exact = width_search.loo_bandwidth(X, y, grid_queries=None)
        approx = width_search.loo_bandwidth(X, y, grid_queries=100)
        loss_exact = naive.loo_loss(X, y, bandwidth=exact)
        loss_approx = naive.loo_loss(X, y, bandwidth=approx)
        assert loss_approx <= loss_exact * (1 + 1e-3)


# --------------------------------------------------------------------------- row tiles


def _tile_settings(monkeypatch, rows, gemm, radius2=64, prune=True):
    """Tiles of ``rows`` rows; GEMM scores for every metric (gemm) or for none; the
    boxed (pruned) tiles from 2 rows on, whatever they keep (prune), or the plain ones."""
    monkeypatch.setattr(config, "LOO_PRUNE_MIN_ROWS", 2 if prune else 10**9)
    monkeypatch.setattr(config, "LOO_BOXED_MAX_SHARE", 1.0)
    monkeypatch.setattr(config, "LOO_TILE_ROWS", rows)
    monkeypatch.setattr(config, "LOO_TILE_GEMM_MIN_DIMS", 1 if gemm else 10**6)
    monkeypatch.setattr(config, "LOO_TILE_GEMM_MAX_RADIUS2", radius2)


@pytest.mark.parametrize("prune", [False, True])
@pytest.mark.parametrize("gemm", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("p", [1, 3])
def test_tiles_match_naive(monkeypatch, rng, gemm, rows, p, prune):
    """Both score paths, one-row / partial / single tiles, one and several outputs, keys
    pruned or not."""
    _tile_settings(monkeypatch, rows, gemm, prune=prune)
    X, y = _data(rng, 45, 4, p if p > 1 else None)
    h = rng.uniform(0.4, 2.0, size=4)
    loss, grad = loo_loss_and_grad(X, y, h)
    assert loss == pytest.approx(naive.loo_loss(X, y, bandwidth=h), rel=1e-12)
    np.testing.assert_allclose(grad, naive.loo_grad(X, y, bandwidth=h), rtol=1e-10, atol=1e-14)
    L = rng.normal(size=(3, 4))
    loss, grad = loo_loss_and_grad(X, y, components=L)
    assert loss == pytest.approx(naive.loo_loss(X, y, components=L), rel=1e-12)
    np.testing.assert_allclose(grad, naive.loo_grad(X, y, components=L), rtol=1e-9, atol=1e-13)


def test_tiles_gemm_scores_fall_back_on_wide_blocks(monkeypatch, rng):
    """A block wider than LOO_TILE_GEMM_MAX_RADIUS2 takes the direct scores: same result,
    and the GEMM scores themselves stay within float64 rounding of the direct ones."""
    X, y = _data(rng, 80, 9)
    X[::7] *= 30.0  # some rows far out: those blocks are wide
    h = np.full(9, 0.8)
    expected = naive.loo_grad(X, y, bandwidth=h)
    for radius2 in (1, 64, 10**9):
        _tile_settings(monkeypatch, 16, True, radius2)
        loss, grad = loo_loss_and_grad(X, y, h)
        assert loss == pytest.approx(naive.loo_loss(X, y, bandwidth=h), rel=1e-10), radius2
        np.testing.assert_allclose(grad, expected, rtol=1e-8, atol=1e-12 * np.abs(expected).max())


def test_tiles_mixed_far_and_near_rows(rng):
    """An outlier whose best score is beyond FAR_SCORE_FLOAT64 in a tile with ordinary rows:
    the tile leaves it to the anchored two-pass kernels; it takes its nearest neighbour."""
    x = np.concatenate([rng.uniform(0.0, 3.0, size=30), [2.0e4, 2.3e4]])
    y = np.sin(x) + 0.1 * rng.normal(size=x.size)
    h = 0.5
    assert (2.0e4 - 3.0) ** 2 / (2 * h * h) > config.FAR_SCORE_FLOAT64
    loss, grad = loo_loss_and_grad(x, y, h)
    # the two outliers predict each other; the others by the ordinary softmax
    w = naive._loo_weights(x[:30, None] / h)
    f = np.concatenate([w @ y[:30], [y[31], y[30]]])
    assert loss == pytest.approx(np.mean((f - y) ** 2), rel=1e-12)
    near_grad = naive.loo_grad(x[:30, None], y[:30], bandwidth=h) * 30 / 32
    np.testing.assert_allclose(grad, near_grad, rtol=1e-9)


@settings(max_examples=25)
@given(
    shape=sample_shapes(rows=(2, 40), features=10, outputs=3),
    rows=st.integers(1, 12),
    gemm=st.booleans(),
    prune=st.booleans(),
    seed=seeds,
)
def test_tiles_property(shape, rows, gemm, prune, seed):
    n, d, p = shape
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.normal(size=(n, p))
    L = rng.normal(size=(max(1, d // 2), d)) / np.sqrt(d)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _tile_settings(monkeypatch, rows, gemm, prune=prune)
        loss, grad = loo_loss_and_grad(X, y, components=L)
    assert loss == pytest.approx(naive.loo_loss(X, y, components=L), rel=1e-10)
    expected = naive.loo_grad(X, y, components=L)
    np.testing.assert_allclose(grad, expected, rtol=1e-8, atol=1e-11 * (1 + np.abs(expected).max()))


@pytest.mark.parametrize("n_rows", [1, 9, 40])
def test_row_subset_loss_and_grad(rng, n_rows):
    """The criterion of the first rows against all keys (the fitting ladder's estimate):
    against the naive reference and finite differences, for both metrics."""
    X, y = _data(rng, 40, 3)
    y2 = y[:, None]
    h = rng.uniform(0.5, 1.5, size=3)
    loss, grad = prepared_loss_and_grad(X, y2, h, dtype=np.float64, device="cpu", n_rows=n_rows)
    ref_loss, ref_grad = naive.loo_loss_and_grad_rows(X, y, n_rows, bandwidth=h)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)
    L = rng.normal(size=(2, 3))
    loss, grad = prepared_loss_and_grad(
        X, y2, components=L, dtype=np.float64, device="cpu", n_rows=n_rows
    )
    ref_loss, ref_grad = naive.loo_loss_and_grad_rows(X, y, n_rows, components=L)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-9, atol=1e-13)
    fd = _central_difference(
        lambda m: naive.loo_loss_and_grad_rows(X, y, n_rows, components=m)[0], L
    )
    assert np.linalg.norm(grad - fd) <= 1e-6 * np.linalg.norm(fd)


# --------------------------------------------------------------------------- 1-D boxed series


def _boxed_case(rng, kind, n, p=1):
    """Sorted 1-D points of several shapes, with targets of p columns."""
    if kind == "uniform":
        x = rng.uniform(0, 6, n)
    elif kind == "clustered":  # dense clumps and a few isolated points
        centres = rng.uniform(0, 50, 4)
        x = np.concatenate([c + 0.05 * rng.normal(size=n // 5) for c in centres])
        x = np.concatenate([x, rng.uniform(-200, 200, n - x.size)])
    elif kind == "ties":  # many exact duplicates
        x = np.round(rng.uniform(0, 6, n), 1)
    elif kind == "offset":  # far from the origin: the differences must keep their digits
        x = 1e6 + rng.uniform(0, 6, n)
    x = np.sort(x)
    y = np.column_stack([np.sin(3 * x + c) for c in range(p)]) + 0.3 * rng.normal(size=(n, p))
    return x, y


def _exact_sse_per_row(x_used, y_used, targets, rows):
    """Per-row LOO squared errors from the full weight matrix (float64, naive twin)."""
    w = naive._loo_weights(x_used[:, None])
    return np.sum((w[rows] @ y_used - targets[rows]) ** 2, axis=1)


@pytest.mark.parametrize("kind", ["uniform", "clustered", "ties", "offset"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("p", [1, 2])
def test_boxed_1d_kernel_matches_naive(rng, kind, dtype, p):
    """The boxed Hermite series (with its direct fallback) against the full weight matrix
    over many random draws and widths from the window of a few keys to all of them: the
    sum to 1e-12 relative, every expanded row's prediction to 4 tol max|y| (the
    bound), on uniform, clustered (isolated rows: the fallback), tied and offset
    points; float32 inputs are converted exactly (the series runs in float64; the rows
    computed directly round in float32, hence 1e-6 there)."""
    from nbattn.kernels import loo_1d

    n = 240
    fallbacks = 0
    gap = loo_1d.prune_gap_for(dtype)
    rtol = 1e-12 if dtype == "float64" else 1e-6  # float32: the fallback rows' own rounding
    for _ in range(4):
        x, y = _boxed_case(rng, kind, n, p)
        span = np.ptp(x)
        for keys_per_row in (8, 40, 120, 239):  # the direct window's typical width
            h = span / keys_per_row
            zs = (x - x[0]) / (h * np.sqrt(2.0)) + (1e6 if kind == "offset" else 0.0)
            zs = np.ascontiguousarray(zs, dtype=dtype)
            # what the kernel sees, times sqrt 2 (differences from zs[0] are exact)
            x_used = (zs.astype(np.float64) - np.float64(zs[0])) * np.sqrt(2.0)
            v_t = np.ascontiguousarray(y.T, dtype=dtype)
            y_used = v_t.T.astype(np.float64)
            rows = np.arange(n)
            total, n_direct = loo_1d.loo_squared_error_boxed_rows_1d(zs, v_t, y, rows, gap)
            expected = _exact_sse_per_row(x_used, y_used, y, rows)
            assert total == pytest.approx(expected.sum(), rel=rtol)
            # rows one at a time: each expanded row's prediction within the bound
            tol = config.LOO_BOXED_TOL
            for i in rng.choice(n, 4, replace=False):
                one, direct = loo_1d.loo_squared_error_boxed_rows_1d(zs, v_t, y, np.array([i]), gap)
                f_err = abs(np.sqrt(one) - np.sqrt(expected[i]))
                if not direct:
                    assert f_err <= 4 * tol * np.abs(y_used).max() * np.sqrt(p) + 1e-15
            sub = np.sort(rng.choice(n, 30, replace=False))
            part, _ = loo_1d.loo_squared_error_boxed_rows_1d(zs, v_t, y, sub, gap)
            assert part == pytest.approx(expected[sub].sum(), rel=rtol)
            fallbacks += n_direct
    if kind == "clustered":
        assert fallbacks > 0  # isolated points were computed directly


def test_boxed_1d_kernel_is_its_naive_series(rng):
    """The compiled series is the plain-NumPy one (numpy's Hermite polynomials) on the
    rows it expands: the recurrence and the box layout, not just the final sum."""
    from nbattn.kernels import loo_1d

    for _ in range(5):
        x, y = _boxed_case(rng, "uniform", 150, 2)
        zs = np.ascontiguousarray(x / (np.ptp(x) / 60))
        v_t = np.ascontiguousarray(y.T)
        half_width, n_terms, reach, bound, omitted, tol = loo_1d.boxed_1d_plan(150)
        rows = np.arange(150)
        expanded = np.empty(150, dtype=np.bool_)
        total = loo_1d.loo_squared_error_boxed_1d(
            zs, v_t, y, rows, half_width, n_terms, reach, bound, omitted, tol, expanded
        )
        assert expanded.mean() > 0.9
        ref = naive.loo_sse_boxed_1d(zs, v_t, y, rows[expanded], half_width, n_terms, reach)
        assert total == pytest.approx(ref.sum(), rel=1e-13)


@pytest.mark.parametrize("half_width", [0.25, 0.5, 1.0])
def test_hermite_truncation_bound_holds(half_width):
    """The proven bound behind the series: for every offset |t| <= r and key distance s,
    the truncated series of exp(-(s - t)^2) is within tol * exp(-s^2 / 2) of it
    (Cramér's inequality), checked on a dense grid against numpy's Hermite polynomials."""
    from nbattn.kernels import loo_1d

    tol = 1e-13
    n_terms = loo_1d.hermite_terms(half_width, tol)
    s = np.linspace(-8.0, 8.0, 801)
    h = naive.hermite_functions(s, n_terms)
    for t in np.linspace(-half_width, half_width, 41):
        coef = np.array([t**k / math.factorial(k) for k in range(n_terms)])
        error = np.abs(coef @ h - np.exp(-((s - t) ** 2)))
        # the series' own rounding (the terms reach about 2 p eps) on top of the bound
        assert np.all(error <= tol * np.exp(-0.5 * s * s) + 1e-15)
    assert loo_1d.hermite_terms(half_width, tol * 1e-3) > n_terms  # tighter: more terms


def test_boxed_1d_far_and_isolated_rows_fall_back(rng):
    """Rows whose nearest neighbour is far (their sum without the own key is tiny, so the
    subtraction of the own key would cancel) are computed by the windowed kernel, and
    the result is still exact; so are points spaced 1e-300 apart and 1e6 apart."""
    from nbattn.kernels import loo_1d

    x = np.sort(np.concatenate([rng.uniform(0, 3, 100), [40.0, 80.0, 300.0]]))
    y = np.sin(x)[:, None]
    zs = np.ascontiguousarray(x)
    v_t = np.ascontiguousarray(y.T)
    total, n_direct = loo_1d.loo_squared_error_boxed_rows_1d(zs, v_t, y, np.arange(x.size), 50.0)
    assert n_direct >= 3
    direct = loo_1d.loo_squared_error_sorted_1d(zs, v_t, y, np.arange(x.size), 50.0)
    assert total == pytest.approx(direct, rel=1e-12) and np.isfinite(total)
    two = np.ascontiguousarray([0.0, 1e6])
    y2 = np.array([[1.0], [-1.0]])
    total, _ = loo_1d.loo_squared_error_boxed_rows_1d(
        two, np.ascontiguousarray(y2.T), y2, np.arange(2), 50.0
    )
    assert total == pytest.approx(8.0)  # each predicted by the other


@pytest.mark.parametrize("scale", [1.0, 1e-170, 1e160])
def test_loo_bandwidth_1d_boxed_series_gives_the_windowed_kernels_curve(monkeypatch, rng, scale):
    """The 1-D search with the medium widths on the boxed series and with every width on
    the windowed kernel (boxes off): the same criterion at every factor (1e-12), the same
    width, at x near 1e-170 and 1e160 too; and the boxed path was taken."""
    from nbattn.kernels import loo_1d

    x = rng.uniform(0, 6, 400) * scale
    y = np.sin(x / scale) + 0.3 * rng.normal(size=400)
    calls = []
    kernel = loo_1d.loo_squared_error_boxed_1d

    def counted(*args):
        calls.append(1)
        return kernel(*args)

    monkeypatch.setattr(loo_1d, "loo_squared_error_boxed_1d", counted)
    h, (factors, losses) = width_search.loo_bandwidth(x, y, return_curve=True)
    assert calls
    monkeypatch.setattr(config, "LOO_BOXED_MIN_WINDOW", 10**9)
    h_w, (factors_w, losses_w) = width_search.loo_bandwidth(x, y, return_curve=True)
    np.testing.assert_allclose(factors_w, factors, rtol=1e-12)
    np.testing.assert_allclose(losses_w, losses, rtol=1e-12)
    np.testing.assert_allclose(h_w, h, rtol=1e-12)


@settings(max_examples=25)
@given(
    n=st.integers(2, 300),
    log_keys=st.floats(0.0, 6.0),
    seed=seeds,
    kind=st.sampled_from(["uniform", "clustered", "ties", "offset"]),
)
def test_boxed_1d_property_against_the_windowed_kernel(n, log_keys, seed, kind):
    """Random sizes, widths from a window of one key to all of them (the switch point
    included) and point shapes: the boxed series with its fallback gives the windowed
    kernel's sum to 1e-12 relative (or 1e-300 absolute when the errors are all 0)."""
    from nbattn.kernels import loo_1d

    rng = np.random.default_rng(seed)
    x, y = _boxed_case(rng, kind, max(n, 10), 1)
    x, y = x[:n], y[:n]
    h = max(np.ptp(x), 1e-3) / math.exp(log_keys)
    zs = np.ascontiguousarray((x - x[0]) / (h * np.sqrt(2.0)) + (1e6 if kind == "offset" else 0))
    v_t = np.ascontiguousarray(y.T)
    rows = np.arange(n)
    boxed, _ = loo_1d.loo_squared_error_boxed_rows_1d(zs, v_t, y, rows, 50.0)
    direct = loo_1d.loo_squared_error_sorted_1d(zs, v_t, y, rows, 50.0)
    assert boxed == pytest.approx(direct, rel=1e-12, abs=1e-300)
