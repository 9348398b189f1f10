"""Local-polynomial regression with the mixed-type product kernel (nbattn.local.engine)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import config
from nbattn.app.datasets import seed_data
from nbattn.local.engine import (
    default_widths,
    local_interval_sums,
    local_loo_loss,
    local_polynomial,
    local_prediction_interval,
)
from nbattn.local.widths import local_loo_widths
from nbattn.smoothing.regression import nadaraya_watson
from tests import naive
from tests._scripts import load_script
from tests.strategies import seeds

KernelReg = pytest.importorskip("statsmodels.nonparametric.kernel_regression").KernelReg


def _mixed(rng, n, var_type, n_categories):
    cols = []
    for kind, c in zip(var_type, n_categories):
        if kind == "c":
            cols.append(rng.normal(size=n))
        else:
            cols.append(rng.integers(0, c, n).astype(float))
    return np.column_stack(cols)


def _data(rng, var_type, n_categories, n, n_queries):
    """Training rows X (n of them) of the given column kinds, their targets y, and queries Q."""
    X = _mixed(rng, n, var_type, n_categories)
    y = _target(X, var_type, rng)
    return X, y, _mixed(rng, n_queries, var_type, n_categories)


def _target(X, var_type, rng):
    y = np.zeros(X.shape[0])
    for c, kind in enumerate(var_type):
        y += np.sin(1.5 * X[:, c]) if kind == "c" else 0.4 * X[:, c]
    return y + 0.1 * rng.normal(size=X.shape[0])


# --------------------------------------------------------------------------- statsmodels
@pytest.mark.parametrize("d", [1, 3])
def test_local_linear_matches_statsmodels(d):
    rng = np.random.default_rng(d)
    X = rng.normal(size=(70, d))
    y = np.sin(X).sum(axis=1) + 0.1 * rng.normal(size=70)
    Q = rng.normal(size=(15, d))
    bw = rng.uniform(0.4, 1.2, d)
    mean, mfx = KernelReg(y, X, "c" * d, reg_type="ll", bw=bw).fit(Q)
    fit, slope = local_polynomial(Q, X, y, bw, 1, return_gradient=True)
    np.testing.assert_allclose(fit, mean, rtol=1e-10, atol=1e-10 * np.abs(mean).max())
    np.testing.assert_allclose(slope, mfx.reshape(slope.shape), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("var_type", ["cu", "co", "cuo", "uo"])
def test_local_constant_mixed_matches_statsmodels(var_type):
    rng = np.random.default_rng(len(var_type))
    counts = [0 if k == "c" else 3 + i for i, k in enumerate(var_type)]
    X = _mixed(rng, 80, var_type, counts)
    for c, kind in enumerate(var_type):  # every level present, as statsmodels counts them
        if kind != "c":
            X[: counts[c], c] = np.arange(counts[c])
    y = _target(X, var_type, rng)
    Q = _mixed(rng, 12, var_type, counts)
    bw = np.array([0.6 if k == "c" else 0.3 for k in var_type])
    mean, _ = KernelReg(y, X, var_type, reg_type="lc", bw=bw).fit(Q)
    fit = local_polynomial(Q, X, y, bw, 0, var_type=var_type, n_categories=counts)
    np.testing.assert_allclose(fit, mean, rtol=1e-12, atol=1e-12)


def test_product_kernel_reference_matches_statsmodels_gpke():
    """The naive twin's product kernel is statsmodels' gpke up to a constant per query,
    so the local-linear test against the twin with categorical columns checks
    statsmodels' kernels (its ll design would hold the category codes, np's does not)."""
    from statsmodels.nonparametric._kernel_base import gpke

    rng = np.random.default_rng(5)
    var_type, counts = "cuoc", [0, 3, 4, 0]
    X = _mixed(rng, 40, var_type, counts)
    for c in (1, 2):
        X[: counts[c], c] = np.arange(counts[c])
    Q = _mixed(rng, 6, var_type, counts)
    bw = np.array([0.7, 0.25, 0.4, 1.1])
    K = naive.product_kernel_matrix(Q, X, bw, var_type, counts)
    for i in range(Q.shape[0]):
        ref = gpke(bw, X, Q[i], var_type, tosum=False)
        ratio = ref / K[i]
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)


@pytest.mark.parametrize("degree", [0, 1, 2])
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "tricube"])
@pytest.mark.parametrize("ridge", [None, 0.05])
def test_mixed_local_polynomial_matches_reference(degree, kernel, ridge):
    rng = np.random.default_rng(degree + 10 * len(kernel))
    var_type, counts = "cuco", [0, 3, 0, 4]
    X = _mixed(rng, 60, var_type, counts)
    y = np.column_stack([_target(X, var_type, rng), rng.normal(size=60)])
    Q = _mixed(rng, 20, var_type, counts)
    scale = 1.0 if kernel == "gaussian" else 2.5
    bw = np.array([0.8 * scale, 0.3, 1.0 * scale, 0.5])
    w = rng.uniform(0.2, 2.0, 60)
    fit, grad = local_polynomial(
        Q,
        X,
        y,
        bw,
        degree,
        var_type=var_type,
        n_categories=counts,
        kernel=kernel,
        sample_weight=w,
        ridge=ridge,
        return_gradient=True,
    )
    ref, coef, _ = naive.local_polynomial_exact(
        Q,
        X,
        y,
        bw,
        var_type,
        counts,
        degree,
        kernel=kernel,
        sample_weight=w,
        ridge=1e-12 if ridge is None else ridge,
    )
    np.testing.assert_allclose(fit, ref, rtol=1e-9, atol=1e-9)
    assert grad.shape == (20, 2, 2)
    if degree >= 1:
        np.testing.assert_allclose(grad, coef[:, 1:3, :], rtol=1e-7, atol=1e-7)


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "tricube"])
@pytest.mark.parametrize("degree", [0, 1])
def test_marginal_effects_match_finite_differences(kernel, degree):
    rng = np.random.default_rng(3)
    var_type, counts = "ccu", [0, 0, 3]
    X, y, Q = _data(rng, var_type, counts, 50, 10)
    Q = Q * np.array([0.5, 0.5, 1.0])
    bw = np.array([0.9, 1.1, 0.2]) * (1.0 if kernel == "gaussian" else 2.5)
    fit, grad = local_polynomial(
        Q, X, y, bw, degree, var_type=var_type, kernel=kernel, return_gradient=True
    )
    eps = 1e-6
    for c in range(2):
        step = np.zeros(3)
        step[c] = eps
        up = local_polynomial(Q + step, X, y, bw, degree, var_type=var_type, kernel=kernel)
        down = local_polynomial(Q - step, X, y, bw, degree, var_type=var_type, kernel=kernel)
        fd = (up - down) / (2 * eps)
        if degree == 0:  # the analytic derivative of the fit itself
            np.testing.assert_allclose(grad[:, c], fd, rtol=1e-5, atol=1e-6)
        else:  # the local slope estimates the derivative: close to it, not equal
            assert np.median(np.abs(grad[:, c] - fd)) < 0.5 * np.median(np.abs(fd)) + 0.05


@pytest.mark.parametrize("degree", [0, 1, 2])
@pytest.mark.parametrize("missing", [False, True])
def test_loo_gradient_matches_finite_differences(degree, missing):
    from nbattn.local.widths import local_loo_loss_and_grad

    rng = np.random.default_rng(degree)
    var_type, counts = "cuo", [0, 3, 4]
    X = _mixed(rng, 50, var_type, counts)
    y = _target(X, var_type, rng)
    if missing:
        X[rng.random(X.shape) < 0.1] = np.nan
    w = rng.uniform(0.5, 2.0, 50)
    theta = np.array([np.log(0.7), -0.4, 0.6])
    kw = dict(var_type=var_type, n_categories=counts, sample_weight=w, ridge=1e-3)
    if missing:
        kw["missing"] = "marginalize"
    value, grad = local_loo_loss_and_grad(X, y, theta, degree, **kw)
    ref = naive.local_loo_loss_exact(
        X,
        y,
        np.array([0.7, 2 / 3 / (1 + np.exp(0.4)), 1 / (1 + np.exp(-0.6))]),
        var_type,
        counts,
        degree,
        sample_weight=w,
        ridge=1e-3,
    )
    assert value == pytest.approx(ref, rel=1e-10)
    eps = 1e-6
    for t in range(3):
        step = np.zeros(3)
        step[t] = eps
        up = local_loo_loss_and_grad(X, y, theta + step, degree, **kw)[0]
        down = local_loo_loss_and_grad(X, y, theta - step, degree, **kw)[0]
        assert grad[t] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8)


# --------------------------------------------------------------------------- property tests
@st.composite
def _problems(draw):
    d = draw(st.integers(1, 4))
    var_type = "".join(draw(st.sampled_from("cuo")) for _ in range(d))
    counts = [0 if k == "c" else draw(st.sampled_from([1, 2, 5])) for k in var_type]
    n = draw(st.integers(2, 30))
    seed = draw(seeds)
    degree = draw(st.integers(0, 2))
    kernel = draw(st.sampled_from(["gaussian", "epanechnikov", "tricube"]))
    degenerate = draw(st.sampled_from(["none", "constant_column", "one_row_per_category"]))
    return var_type, counts, n, seed, degree, kernel, degenerate


@settings(max_examples=25)
@given(_problems())
def test_local_polynomial_property(problem):
    var_type, counts, n, seed, degree, kernel, degenerate = problem
    rng = np.random.default_rng(seed)
    X = _mixed(rng, n, var_type, counts)
    if degenerate == "constant_column" and "c" in var_type:
        X[:, var_type.index("c")] = 1.5
    if degenerate == "one_row_per_category":
        for c, kind in enumerate(var_type):
            if kind != "c":
                X[:, c] = np.arange(n) % counts[c]
    y = _target(X, var_type, rng)
    Q = np.vstack([_mixed(rng, 5, var_type, counts), X[:3]])
    widths = np.array(
        [
            rng.uniform(0.3, 2.0)
            if k == "c"
            else rng.uniform(0, 1) * (1 if k == "o" else (c - 1) / c)
            for k, c in zip(var_type, counts)
        ]
    )
    kw = dict(var_type=var_type, n_categories=counts, kernel=kernel)
    fit = local_polynomial(Q, X, y, widths, degree, **kw)
    ref, _, W = naive.local_polynomial_exact(
        Q, X, y, widths, var_type, counts, degree, kernel=kernel
    )
    assert np.isfinite(fit).all()
    # A local design with fewer distinct neighbours than terms (or nearly so) has no
    # unique fit: its nearly dependent terms are dropped or kept by rounding (pivot
    # tolerance 1e-8), so there the fit must only be finite (the constant-column test
    # checks what a dependent term gives). Well-conditioned designs (Jacobi-scaled
    # condition number below 1e6) agree to 1e-9.
    cond = naive.local_design_condition(Q, X, W, var_type, degree)
    scale = 1 + np.abs(y).max()
    for i in range(Q.shape[0]):
        if cond[i] < 1e6:
            assert abs(fit[i] - ref[i]) <= 1e-9 * scale, (i, cond[i], fit[i], ref[i])
    # the fit is a weighted average (degree 0) or stays within the data's reach
    if degree == 0:
        assert (fit >= y.min() - 1e-9).all() and (fit <= y.max() + 1e-9).all()


@pytest.mark.parametrize("degree", [1, 2])
def test_constant_column_drops_out_of_the_design(degree):
    """Keys constant in a column: its kernel factor is one number (cancels) and its
    design terms are collinear with the intercept (dropped), so the fit is the fit
    without that column, at any query coordinate."""
    rng = np.random.default_rng(18)
    X = _mixed(rng, 40, "ccu", [0, 0, 3])
    X[:, 1] = 2.0
    y = _target(X, "ccu", rng)
    Q = _mixed(rng, 9, "ccu", [0, 0, 3])
    bw = np.array([0.7, 0.5, 0.3])
    fit = local_polynomial(Q, X, y, bw, degree, var_type="ccu", n_categories=[0, 0, 3])
    keep = [0, 2]
    alone = local_polynomial(
        Q[:, keep], X[:, keep], y, bw[keep], degree, var_type="cu", n_categories=[0, 3]
    )
    np.testing.assert_allclose(fit, alone, rtol=1e-9, atol=1e-9)


def test_integer_sample_weights_equal_repeated_rows():
    rng = np.random.default_rng(7)
    var_type, counts = "cou", [0, 4, 3]
    X, y, Q = _data(rng, var_type, counts, 30, 8)
    w = rng.integers(0, 4, 30)
    w[0] = 1
    bw = np.array([0.8, 0.4, 0.3])
    for degree in (0, 1):
        weighted = local_polynomial(
            Q, X, y, bw, degree, var_type=var_type, n_categories=counts, sample_weight=w
        )
        repeated = local_polynomial(
            Q,
            np.repeat(X, w, axis=0),
            np.repeat(y, w),
            bw,
            degree,
            var_type=var_type,
            n_categories=counts,
        )
        np.testing.assert_allclose(weighted, repeated, rtol=1e-10, atol=1e-12)


def test_missing_values_marginalize_their_column():
    rng = np.random.default_rng(8)
    var_type, counts = "ccu", [0, 0, 3]
    X, y, Q = _data(rng, var_type, counts, 40, 6)
    Xm, Qm = X.copy(), Q.copy()
    Xm[rng.random(X.shape) < 0.15] = np.nan
    Qm[0, 1] = np.nan
    Qm[1, 2] = np.nan
    bw = np.array([0.7, 0.9, 0.3])
    with pytest.raises(ValueError, match="keys contains NaN"):
        local_polynomial(Q, Xm, y, bw, 1, var_type=var_type)
    for degree in (0, 1):
        fit, grad = local_polynomial(
            Qm, Xm, y, bw, degree, var_type=var_type, missing="marginalize", return_gradient=True
        )
        ref, coef, _ = naive.local_polynomial_exact(Qm, Xm, y, bw, var_type, counts, degree)
        assert np.isfinite(fit).all() and np.isfinite(grad).all()
        np.testing.assert_allclose(fit, ref, rtol=1e-9, atol=1e-9)
        if degree == 1:
            assert grad[0, 1] == 0.0  # the query has no coordinate in column 1
    # a query missing every column is the (weighted) mean
    Qall = np.full((1, 3), np.nan)
    fit = local_polynomial(Qall, X, y, bw, 1, var_type=var_type, missing="marginalize")
    assert fit[0] == pytest.approx(y.mean(), rel=1e-12)


@pytest.mark.parametrize("d", [3, 4])
def test_missing_values_local_linear_in_three_and_four_columns(d):
    """Local-linear with one output and 3-4 continuous columns (the one-pass moment sums
    over 4-5 terms) reads every column's differences where entries are missing."""
    rng = np.random.default_rng(18)
    var_type, counts = "c" * d, [0] * d
    X = rng.normal(size=(60, d))
    y = X @ np.arange(1.0, d + 1.0) + 0.1 * np.sin(3 * X[:, 0])
    Q = rng.normal(scale=0.5, size=(7, d))
    Xm = X.copy()
    Xm[rng.random(X.shape) < 0.1] = np.nan
    bw = np.full(d, 1.2)
    fit, grad = local_polynomial(
        Q, Xm, y, bw, 1, var_type=var_type, missing="marginalize", return_gradient=True
    )
    ref, coef, _ = naive.local_polynomial_exact(Q, Xm, y, bw, var_type, counts, 1)
    np.testing.assert_allclose(fit, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(grad, coef[:, 1:], rtol=1e-7, atol=1e-7)


# --------------------------------------------------------------------------- exactness
def test_exclude_self_is_the_leave_one_out_fit():
    rng = np.random.default_rng(9)
    X = _mixed(rng, 25, "cu", [0, 3])
    y = _target(X, "cu", rng)
    bw = np.array([0.6, 0.2])
    loo = local_polynomial(X, X, y, bw, 1, var_type="cu", exclude_self=True)
    for i in (0, 7, 24):
        rest = np.delete(np.arange(25), i)
        alone = local_polynomial(X[i : i + 1], X[rest], y[rest], bw, 1, var_type="cu")
        assert loo[i] == pytest.approx(alone[0], rel=1e-12, abs=1e-12)
    ref = naive.local_loo_loss_exact(X, y, bw, "cu", [0, 3], 1)
    assert local_loo_loss(X, y, bw, 1, var_type="cu") == pytest.approx(ref, rel=1e-10)


def test_interval_sums_match_equivalent_kernel():
    rng = np.random.default_rng(11)
    var_type, counts = "cco", [0, 0, 3]
    X = _mixed(rng, 40, var_type, counts)
    r = rng.normal(size=40)
    Q = _mixed(rng, 9, var_type, counts)
    bw = np.array([0.8, 1.0, 0.4])
    for degree in (0, 1, 2):
        got = local_interval_sums(Q, X, r, bw, degree, var_type=var_type, n_categories=counts)
        L = naive.local_equivalent_weights(Q, X, bw, var_type, counts, degree)
        np.testing.assert_allclose(got, (L**2) @ (r**2), rtol=1e-9)


def test_prediction_interval_is_the_sandwich():
    rng = np.random.default_rng(12)
    X = rng.uniform(0, 5, size=(60, 1))
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=60)
    Q = np.linspace(0.5, 4.5, 7)[:, None]
    fit, lo, hi = local_prediction_interval(X, y, Q, 0.6, 1, alpha=0.1, return_fit=True)
    loo, _, _ = naive.local_polynomial_exact(X, X, y, [0.6], "c", [0], 1, exclude_self=True)
    r = y - loo
    L = naive.local_equivalent_weights(Q, X, [0.6], "c", [0], 1)
    _, _, P = naive.local_polynomial_exact(Q, X, y, [0.6], "c", [0], 0)
    z = 1.6448536269514722
    np.testing.assert_allclose(hi - fit, z * np.sqrt((L**2) @ r**2), rtol=1e-9)
    np.testing.assert_allclose(fit - lo, z * np.sqrt((L**2) @ r**2), rtol=1e-9)
    lo2, hi2 = local_prediction_interval(X, y, Q, 0.6, 1, alpha=0.1, kind="observation")
    np.testing.assert_allclose(hi2 - lo2, 2 * z * np.sqrt((L**2) @ r**2 + P @ r**2), rtol=1e-9)


def test_local_linear_removes_the_boundary_bias():
    """On the walk-through's data, local-linear beats Nadaraya-Watson at both ends of the
    test grid in most draws (a binomial count, not one lucky draw)."""
    wins, draws = 0, 60
    for seed in range(draws):
        data = seed_data(n_train=50, random_state=seed)
        ends = np.r_[data.x_test[:4], data.x_test[-4:]]
        truth = np.r_[data.y_test[:4], data.y_test[-4:]]
        h = 0.5
        nw = nadaraya_watson(ends, data.x_train, data.y_train, h)
        ll = local_polynomial(ends, data.x_train, data.y_train, h, 1)
        wins += np.mean((ll - truth) ** 2) < np.mean((nw - truth) ** 2)
    # under "no better than a coin" the count exceeds 40 of 60 with probability < 0.7%
    assert wins > 40, wins


# --------------------------------------------------------------------------- extremes
@pytest.mark.parametrize("degree", [0, 1, 2])
def test_far_queries_get_the_nearest_side(degree):
    rng = np.random.default_rng(13)
    X = rng.uniform(0, 1, size=(30, 1))
    y = 3.0 * X[:, 0] + 0.1 * rng.normal(size=30)
    Q = np.array([[1e4], [-1e4]])
    fit = local_polynomial(Q, X, y, 0.1, degree)
    assert np.isfinite(fit).all()
    # the local fit collapses onto the nearest key (the others weigh exp(-1e9) less)
    np.testing.assert_allclose(fit, [y[np.argmax(X[:, 0])], y[np.argmin(X[:, 0])]], rtol=1e-9)
    for kernel in ("epanechnikov", "tricube"):
        fit = local_polynomial(Q, X, y, 0.1, degree, kernel=kernel)
        np.testing.assert_allclose(fit, [y[np.argmax(X[:, 0])], y[np.argmin(X[:, 0])]])


@pytest.mark.parametrize("scale", [1e-170, 1.0, 1e160])
def test_units_do_not_matter(scale):
    rng = np.random.default_rng(14)
    X, y, Q = _data(rng, "cuc", [0, 3, 0], 40, 7)
    bw = np.array([0.7, 0.3, 0.9])
    units = np.array([scale, 1.0, 1.0 / scale if scale != 1.0 else 1.0])
    base = local_polynomial(Q, X, y, bw, 1, var_type="cuc")
    scaled = local_polynomial(Q * units, X * units, y, bw * units, 1, var_type="cuc")
    np.testing.assert_allclose(scaled, base, rtol=1e-9, atol=1e-12)


def test_float32_inputs_give_float32_close_to_float64():
    rng = np.random.default_rng(15)
    X = rng.normal(size=(80, 2)) + 1e4
    y = np.sin(X[:, 0]) + X[:, 1]
    Q = rng.normal(size=(10, 2)) + 1e4
    ref = local_polynomial(Q, X, y, 0.8, 1)
    got = local_polynomial(Q.astype(np.float32), X.astype(np.float32), y.astype(np.float32), 0.8, 1)
    assert got.dtype == np.float32
    # float32 inputs carry the data to ~1e4 * 6e-8: compare on that scale
    ref32 = local_polynomial(
        Q.astype(np.float32).astype(float),
        X.astype(np.float32).astype(float),
        y.astype(np.float32).astype(float),
        0.8,
        1,
    )
    np.testing.assert_allclose(got, ref32, rtol=1e-6, atol=1e-5)
    assert np.abs(got - ref).max() < 0.05


def test_lambda_zero_is_exact_matching_and_no_match_falls_back():
    rng = np.random.default_rng(16)
    X = np.column_stack([rng.normal(size=20), np.r_[np.zeros(10), np.ones(10)]])
    y = np.r_[np.zeros(10), np.ones(10)] + 0.01 * rng.normal(size=20)
    Q = np.array([[0.0, 0.0], [0.0, 1.0]])
    for kind in "uo":
        fit = local_polynomial(Q, X, y, [0.5, 0.0], 0, var_type="c" + kind, n_categories=[0, 3])
        assert abs(fit[0]) < 0.05 and abs(fit[1] - 1) < 0.05
        # code 2 is in no key: every weight is 0, the nearest key (fewest unequal) decides
        fit = local_polynomial(
            [[0.0, 2.0]], X, y, [0.5, 0.0], 0, var_type="c" + kind, n_categories=[0, 3]
        )
        assert np.isfinite(fit).all()


# --------------------------------------------------------------------------- validation
def test_bad_inputs_name_the_argument():
    X = np.column_stack([np.arange(5.0), [0, 1, 2, 1, 0]])
    y = np.arange(5.0)
    with pytest.raises(ValueError, match="var_type letter 1"):
        local_polynomial(X, X, y, [1, 0.2], var_type="cx")
    with pytest.raises(ValueError, match="var_type has 1 letter but"):
        local_polynomial(X, X, y, [1, 0.2], var_type="c")
    with pytest.raises(ValueError, match=r"bandwidth\[1\]"):
        local_polynomial(X, X, y, [1, 0.9], var_type="cu", n_categories=[0, 3])
    with pytest.raises(ValueError, match="keys column 1 is categorical"):
        local_polynomial(X, X + 0.5, y, [1, 0.2], var_type="cu")
    with pytest.raises(ValueError, match="kernel must be one of"):
        local_polynomial(X, X, y, [1, 0.2], var_type="cu", kernel="cosine")
    with pytest.raises(ValueError, match="degree must be"):
        local_polynomial(X, X, y, [1, 0.2], 3, var_type="cu")
    with pytest.raises(ValueError, match="sample_weight must be >= 0"):
        local_polynomial(X, X, y, [1, 0.2], var_type="cu", sample_weight=-np.ones(5))
    with pytest.raises(ValueError, match="missing must be one of"):
        local_polynomial(X, X, y, [1, 0.2], var_type="cu", missing="drop")
    with pytest.raises(ValueError, match="values has 4 rows"):
        local_polynomial(X, X, y[:4], [1, 0.2], var_type="cu")
    before = X.copy()
    local_polynomial(X, X, y, "scott", var_type="cu")
    np.testing.assert_array_equal(X, before)


def test_default_widths():
    rng = np.random.default_rng(17)
    X = _mixed(rng, 200, "cuo", [0, 4, 3])
    w = default_widths(X, "cuo")
    factor = 200 ** (-1 / 7)
    assert w[0] == pytest.approx(factor * X[:, 0].std(ddof=1), rel=1e-12)
    assert w[1] == pytest.approx(0.75 * factor) and w[2] == pytest.approx(factor)


# --------------------------------------------------------------------------- widths
def _searched(X, y, degree, **kw):
    """The widths the LOO search picks, and the LOO error at them."""
    widths = local_loo_widths(X, y, degree, **kw)
    return widths, local_loo_loss(X, y, widths, degree, **kw)


def _cv_ls_comparison(seed, n, reg):

    rng = np.random.default_rng(seed)
    var_type, counts = ("cuo", [0, 3, 4]) if reg == "lc" else ("cc", [0, 0])
    X = _mixed(rng, n, var_type, counts)
    for c, kind in enumerate(var_type):
        if kind != "c":
            X[: counts[c], c] = np.arange(counts[c])
    y = _target(X, var_type, rng)
    if reg == "ll":
        y += 0.8 * X[:, 1]
    degree = 0 if reg == "lc" else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kr = KernelReg(y, X, var_type, reg_type=reg, bw="cv_ls")
    # statsmodels' Nelder-Mead is unbounded: a smoothing l outside its kernel's
    # domain is clipped to it here (nbattn's search stays inside)
    top = np.array(
        [0 if k == "c" else (1.0 if k == "o" else (c - 1) / c) for k, c in zip(var_type, counts)]
    )
    sm_bw = np.where(top > 0, np.clip(kr.bw, 0, top), np.abs(kr.bw))
    sm = local_loo_loss(X, y, sm_bw, degree, var_type=var_type, n_categories=counts)
    _, ours = _searched(X, y, degree, var_type=var_type, n_categories=counts)
    return ours, sm


@pytest.mark.parametrize("reg", ["lc", "ll"])
def test_loo_widths_match_or_beat_statsmodels_cv_ls(reg):
    for seed in range(2):
        ours, sm = _cv_ls_comparison(seed, 50, reg)
        assert ours <= sm * (1 + 1e-6), (seed, ours, sm)


@pytest.mark.slow
@pytest.mark.parametrize("reg", ["lc", "ll"])
def test_loo_widths_match_or_beat_statsmodels_cv_ls_n150(reg):
    for seed in range(3):
        ours, sm = _cv_ls_comparison(seed, 150, reg)
        assert ours <= sm * (1 + 1e-6), (seed, ours, sm)


def test_degree_zero_gaussian_is_nadaraya_watson():
    rng = np.random.default_rng(19)
    X = rng.normal(size=(60, 3))
    y = np.column_stack([np.sin(X[:, 0]), X[:, 1] ** 2])
    Q = rng.normal(size=(20, 3)) * 2
    h = np.array([0.5, 0.8, 1.3])
    np.testing.assert_allclose(
        local_polynomial(Q, X, y, h, 0), nadaraya_watson(Q, X, y, h), rtol=1e-12, atol=1e-13
    )
    np.testing.assert_allclose(
        local_polynomial(X, X, y, h, 0, exclude_self=True),
        nadaraya_watson(X, X, y, h, exclude_self=True),
        rtol=1e-12,
        atol=1e-13,
    )


def _grid_minimum(X, y, degree, var_type, counts, h_grid, lam_grid):
    """The smallest LOO error over a brute-force grid of (h, lambda)."""
    best = np.inf
    for h in h_grid:
        for lam in lam_grid:
            loss = local_loo_loss(X, y, [h, lam], degree, var_type=var_type, n_categories=counts)
            best = min(best, loss)
    return best


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize(
    "case",
    [
        "wiggly",  # several local minima in h (a fast wiggle on a slow trend)
        "irrelevant category",  # the best lambda is at the end of its range
        "pure noise",  # a flat criterion: the best h is at the wide end
        "ties",  # a continuous column with few distinct values: plateaus in h, and the best
        # point (small h, lambda = 0) at the end of a valley only a joint move reaches
    ],
)
def test_loo_widths_no_worse_than_a_brute_force_grid(case, degree):
    """On curves built to break it, the search is never worse than a dense grid of
    (h, lambda), over several draws."""
    var_type, counts = "cu", [0, 3]
    for seed in range(3):
        X, y = _curve_to_break(case, seed)
        widths, ours = _searched(X, y, degree, var_type=var_type, n_categories=counts)
        grid = _grid_minimum(X, y, degree, var_type, counts, *_BRUTE_FORCE_GRID)
        assert ours <= grid * (1 + 1e-6), (case, seed, ours, grid, widths)


#: The (h, lambda) grid of the brute-force comparisons (lambda up to its top, 2/3).
_BRUTE_FORCE_GRID = (np.geomspace(0.01, 100.0, 41), np.linspace(0.0, 2.0 / 3.0, 13))


def _curve_to_break(case, seed, n=60, seed_base=1000):
    """(X, y), n rows of a continuous and a 3-level column, of one of the brute-force
    comparisons' cases (several minima, an irrelevant category, a flat criterion, tied
    x), drawn from the generator of ``seed_base + seed``."""
    rng = np.random.default_rng(seed_base + seed)
    x = rng.uniform(0, 4, n)
    cat = rng.integers(0, 3, n).astype(float)
    noise = 0.2 * rng.normal(size=n)
    if case == "wiggly":
        y = 0.5 * x + np.sin(6 * x) + noise
    elif case == "irrelevant category":
        y = np.sin(x) + noise
    elif case == "pure noise":
        y = rng.normal(size=n)
    else:
        x = np.round(x)
        y = np.cos(x) + 0.5 * cat + noise
    return np.column_stack([x, cat]), y


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("case", ["wiggly", "irrelevant category", "pure noise", "ties"])
def test_loo_widths_with_rtol_no_worse_than_a_brute_force_grid(case, degree):
    """The search on the pruned criterion (rtol = 1e-6, the leaves forced at 60 rows), its
    answer judged by the exact criterion: never worse than the dense grid beyond the
    pruning's share, and the same widths from two identical calls."""
    from tests._config import config_values

    var_type, counts = "cu", [0, 3]
    kw = dict(var_type=var_type, n_categories=counts)
    forced = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}
    for seed in range(3):
        X, y = _curve_to_break(case, seed)
        with config_values(**forced):
            widths = local_loo_widths(X, y, degree, rtol=1e-6, **kw)
            again = local_loo_widths(X, y, degree, rtol=1e-6, **kw)
        np.testing.assert_array_equal(widths, again)
        ours = local_loo_loss(X, y, widths, degree, **kw)
        grid = _grid_minimum(X, y, degree, var_type, counts, *_BRUTE_FORCE_GRID)
        assert ours <= grid * (1 + 1e-4), (case, seed, ours, grid, widths)


def _tied_columns(rng, n, *levels):
    """x on the integers 0 to 4 (n rows, many tied), then a categorical column (codes as
    floats) of each number of ``levels``, drawn from ``rng`` in that order."""
    x = np.round(rng.uniform(0, 4, n))
    return x, *(rng.integers(0, m, n).astype(float) for m in levels)


@pytest.mark.parametrize("degree", [0, 1])
def test_loo_widths_joint_stage_with_two_categorical_columns(degree):
    """Tied x with one relevant and one irrelevant categorical column: the best point has
    l = 0 in the relevant column (exact matching, a corner only a joint move in (h, l)
    reaches) and l near its top in the other. The search is never worse than a brute-force
    grid over (h, l_1, l_2) that includes both ends of each l, over several draws."""
    var_type, counts = "cuu", [0, 3, 4]
    h_grid = np.geomspace(0.02, 50.0, 21)
    lam1 = np.linspace(0.0, 2.0 / 3.0, 5)
    lam2 = np.linspace(0.0, 3.0 / 4.0, 5)
    kw = dict(var_type=var_type, n_categories=counts)
    for seed in range(3):
        rng = np.random.default_rng(2000 + seed)
        n = 60
        x, relevant, irrelevant = _tied_columns(rng, n, 3, 4)
        y = np.cos(x) + 0.5 * relevant + 0.2 * rng.normal(size=n)
        X = np.column_stack([x, relevant, irrelevant])
        widths, ours = _searched(X, y, degree, **kw)
        grid = min(
            local_loo_loss(X, y, [h, a, b], degree, **kw)
            for h in h_grid
            for a in lam1
            for b in lam2
        )
        # within the search's equality tolerance: on the exact-matching plateau the
        # neighbouring x still weigh exp(-1/(2 h^2)), a slope of a few 1e-6 that the search
        # rightly calls flat (config.LOO_RTOL)
        assert ours <= grid * (1 + config.LOO_RTOL), (seed, ours, grid, widths)
        assert 0.0 <= widths[1] <= 2.0 / 3.0 and 0.0 <= widths[2] <= 3.0 / 4.0


def test_loo_widths_reach_exact_matching():
    """On tied x where each (x, category) cell explains y, the search does at least as well
    as the exact-matching cell fits (l = 0 exactly, h from tiny to a third of the spacing
    of x): t within +-30 alone cannot reach them, l would stay above 1e-14, which at
    h = 0.1 still outweighs the neighbouring x (exp(-50))."""
    var_type, counts = "cu", [0, 3]
    kw = dict(var_type=var_type, n_categories=counts)
    for seed in range(4):
        rng = np.random.default_rng(3000 + seed)
        n = 90
        x, cat = _tied_columns(rng, n, 3)
        y = np.cos(2.0 * x) + cat + 0.05 * rng.normal(size=n)
        X = np.column_stack([x, cat])
        widths, ours = _searched(X, y, 0, **kw)
        cells = min(local_loo_loss(X, y, [h, 0.0], 0, **kw) for h in np.geomspace(0.01, 0.3, 8))
        assert ours <= cells * (1 + 1e-6), (seed, ours, cells, widths)


def test_loo_widths_no_worse_than_multistart_descents():
    """Mixed data with several continuous columns can hold separate basins (the benchmark's
    recipe, scripts/bench_mixed.py; draw 2 at n = 200 has the common scale's basin 5% above
    the rule's, which the search once missed): the search is never worse than scipy's
    L-BFGS-B run from the rule and from the rule's h halved and doubled, over four draws."""
    from scipy.optimize import minimize

    from nbattn.local.widths import local_loo_loss_and_grad, theta_to_widths, widths_to_theta

    bench = load_script("bench_mixed")
    var_type, counts = bench.VAR_TYPE, bench.COUNTS
    kw = dict(var_type=var_type, n_categories=counts)
    for seed in range(4):
        X, y = bench.mixed_data(200, np.random.default_rng(seed))
        _, ours = _searched(X, y, 0, **kw)
        rule = default_widths(X, var_type, counts)
        for factor in (0.5, 1.0, 2.0):
            start = rule * np.array([factor, factor, factor, 1.0, 1.0])
            result = minimize(
                lambda t, X=X, y=y: local_loo_loss_and_grad(X, y, t, 0, **kw),
                widths_to_theta(start, var_type, counts),
                jac=True,
                method="L-BFGS-B",
            )
            theirs = local_loo_loss(X, y, theta_to_widths(result.x, var_type, counts), 0, **kw)
            assert ours <= theirs * (1 + 1e-6), (seed, factor, ours, theirs)


@settings(max_examples=30)
@given(
    d=st.integers(1, 5),
    degree=st.integers(0, 2),
    kernel=st.sampled_from(["gaussian", "epanechnikov", "tricube"]),
    missing=st.booleans(),
    weighted=st.booleans(),
    seed=seeds,
)
def test_each_moment_path_gives_the_fit_of_the_others(d, degree, kernel, missing, weighted, seed):
    """The first pass sums the moments by one of several paths, chosen by the type of an
    argument: the fused sums of p = 2 to 5 terms for one output, the local constant's
    pass, the general design path (several outputs, or more terms). One target alone
    and the same target beside a second one (the design path) give the same fit,
    the marginal-effects pass included (degree 0), over random shapes, kernels, missing
    entries and weights; queries out of every key's reach fall back to the same key."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 80))  # enough keys in reach for a well-posed local design
    X = rng.normal(size=(n, d))
    Q = np.vstack([rng.normal(size=(6, d)), X[:2], X[:1] + 50.0])  # the last: no key in reach
    if missing:
        X[rng.random(X.shape) < 0.15] = np.nan
        Q[:-1][rng.random(Q[:-1].shape) < 0.15] = np.nan
    y = np.sin(np.nan_to_num(X).sum(axis=1)) + 0.1 * rng.normal(size=n)
    second = rng.normal(size=n)
    widths = rng.uniform(0.5, 2.5, d)
    kw = dict(
        kernel=kernel,
        missing="marginalize" if missing else "error",
        sample_weight=rng.uniform(0.1, 3.0, n) if weighted else None,
    )
    alone = local_polynomial(Q, X, y, widths, degree, **kw)
    beside = local_polynomial(Q, X, np.column_stack([y, second]), widths, degree, **kw)
    assert np.isfinite(alone).all() and np.isfinite(beside).all()
    scale = 1.0 + np.abs(y).max()
    # the paths differ in the order of their sums only; the far query's fit is its
    # nearest key's value with a compact kernel (or, with missing entries, an average
    # over the keys missing that column), an extrapolation of a nearly singular design
    # with the Gaussian one, where the order's rounding shows
    reach = slice(None) if kernel != "gaussian" else slice(-1)
    np.testing.assert_allclose(alone[reach], beside[reach, 0], rtol=0, atol=1e-9 * scale)
    if degree == 0:
        _, grad = local_polynomial(Q, X, y, widths, 0, return_gradient=True, **kw)
        _, grad2 = local_polynomial(
            Q, X, np.column_stack([y, second]), widths, 0, return_gradient=True, **kw
        )
        np.testing.assert_allclose(grad[reach], grad2[reach, :, 0], rtol=0, atol=1e-9 * scale)
