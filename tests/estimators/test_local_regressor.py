"""LocalPolynomialRegressor and the pooling regressors: slopes at any scale of the data,
intervals at any alpha, and attention weights that are the fit's own weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.local.engine import local_prediction_interval
from tests import naive
from tests.strategies import seeds


def _columns(rng, n, var_type):
    return np.column_stack(
        [rng.normal(size=n) if k == "c" else rng.integers(0, 3, n).astype(float) for k in var_type]
    )


# --------------------------------------------------------------------------- slopes
_SLOPE_MODELS = {
    "nw": lambda h: nbattn.NadarayaWatsonRegressor(bandwidth=h),
    "nw-marginalize": lambda h: nbattn.NadarayaWatsonRegressor(bandwidth=h, missing="marginalize"),
    "lp0": lambda h: nbattn.LocalPolynomialRegressor(degree=0, bandwidth=h),
    "lp0-marginalize": lambda h: nbattn.LocalPolynomialRegressor(
        degree=0, bandwidth=h, missing="marginalize"
    ),
    "lp1": lambda h: nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h),
}


def _slopes(name, X, y, Q, h):
    model = _SLOPE_MODELS[name](h).fit(X, y)
    return model.marginal_effects(Q)


#: The random problems of the scaling tests: at most max_d columns, n_queries queries,
#: y = target(X, rng), a width drawn from h_range.
_SLOPE_PROBLEMS = {
    "noisy sines": dict(
        max_d=3,
        n_queries=6,
        target=lambda X, rng: np.sin(X).sum(axis=1) + 0.1 * rng.normal(size=len(X)),
        h_range=(0.3, 1.5),
    ),
    "cosines": dict(
        max_d=2, n_queries=5, target=lambda X, rng: np.cos(X).sum(axis=1), h_range=(0.4, 1.2)
    ),
}


def _slopes_unscaled_and_scaled(seed, name, c, *, max_d, n_queries, target, h_range):
    """The slopes of a random problem (8-39 rows, one of ``_SLOPE_PROBLEMS``) and those
    of the same problem with X, the queries and the width multiplied by c."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(8, 40)), int(rng.integers(1, max_d + 1))
    X, Q = rng.normal(size=(n, d)), rng.normal(size=(n_queries, d))
    y = target(X, rng)
    h = float(rng.uniform(*h_range))
    return _slopes(name, X, y, Q, h), _slopes(name, X * c, y, Q * c, h * c)


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    exponent=st.integers(-550, 550),
    name=st.sampled_from(sorted(_SLOPE_MODELS)),
)
def test_slopes_scale_exactly_as_one_over_c_for_powers_of_two(seed, exponent, name):
    c = math.ldexp(1.0, exponent)
    base, got = _slopes_unscaled_and_scaled(seed, name, c, **_SLOPE_PROBLEMS["noisy sines"])
    assert np.isfinite(base).all() and np.any(base != 0.0)
    # multiplying by c is exact here (no result near the ends of float64)
    np.testing.assert_array_equal(got * c, base)


@settings(max_examples=25, deadline=None)
@given(
    seed=seeds,
    log10_c=st.floats(-160.0, 160.0),
    name=st.sampled_from(sorted(_SLOPE_MODELS)),
)
def test_slopes_at_any_scale_agree_with_the_unscaled_ones(seed, log10_c, name):
    c = 10.0**log10_c
    base, got = _slopes_unscaled_and_scaled(seed, name, c, **_SLOPE_PROBLEMS["cosines"])
    scale = np.max(np.abs(base))
    np.testing.assert_allclose(got * c, base, rtol=1e-8, atol=1e-8 * scale)


@pytest.mark.parametrize("c", [1e160, 1e-165, 2.0**550, 2.0**-550])
def test_gaussian_slopes_at_extreme_scales_are_neither_zero_nor_inf(c):
    rng = np.random.default_rng(7)
    X, y = rng.normal(size=(30, 2)), rng.normal(size=30)
    for name in ("nw", "lp0"):
        base = _slopes(name, X, y, X[:4], 0.7)
        got = _slopes(name, X * c, y, X[:4] * c, 0.7 * c)
        np.testing.assert_allclose(got * c, base, rtol=1e-9, atol=1e-12 * np.abs(base).max())


# --------------------------------------------------------------------------- intervals
@settings(max_examples=15, deadline=None)
@given(seed=seeds, degree=st.integers(0, 2))
def test_intervals_are_finite_and_monotone_in_alpha_down_to_1e_300(seed, degree):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(15, 50))
    X = rng.normal(size=(n, 1))
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=n)
    Q = rng.normal(size=(4, 1))
    exponents = np.sort(rng.uniform(-300.0, math.log10(0.99), size=12))
    alphas = np.sort(np.concatenate([[1e-300], 10.0**exponents, [0.5, 0.99]]))
    model = nbattn.LocalPolynomialRegressor(degree=degree, bandwidth=0.8).fit(X, y)
    widths = []
    for alpha in alphas:
        band = model.predict_interval(Q, alpha=float(alpha))
        lower, upper = local_prediction_interval(X, y, Q, [0.8], degree, alpha=float(alpha))
        assert np.isfinite(band).all() and np.isfinite(lower).all() and np.isfinite(upper).all()
        np.testing.assert_allclose(band[:, 0], lower, rtol=1e-12, atol=1e-12)
        widths.append(band[:, 1] - band[:, 0])
    widths = np.array(widths)
    assert np.all(np.diff(widths, axis=0) <= 0.0), "narrower as alpha grows"
    # beyond 1e-17, where 1 - alpha/2 rounds to 1, the quantile keeps growing (37 at 1e-300)
    at_1e_17 = np.diff(model.predict_interval(Q, alpha=1e-17), axis=1)[:, 0]
    assert np.all(widths[0] >= 4.0 * at_1e_17)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.1"])
def test_alpha_outside_the_open_unit_interval_is_refused_by_name(alpha):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 1)), rng.normal(size=20)
    model = nbattn.LocalPolynomialRegressor(bandwidth=0.5).fit(X, y)
    with pytest.raises(ValueError, match="alpha"):
        model.predict_interval(X[:3], alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        local_prediction_interval(X, y, X[:3], [0.5], alpha=alpha)


def test_the_smallest_subnormal_alpha_gives_a_finite_interval():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(20, 1)), rng.normal(size=20)
    model = nbattn.LocalPolynomialRegressor(bandwidth=0.5).fit(X, y)
    tiny = model.predict_interval(X[:3], alpha=5e-324)
    less_tiny = model.predict_interval(X[:3], alpha=1e-300)
    assert np.isfinite(tiny).all()
    assert np.all(tiny[:, 1] - tiny[:, 0] >= less_tiny[:, 1] - less_tiny[:, 0])


# --------------------------------------------------------------------------- attention weights
@settings(max_examples=30, deadline=None)
@given(
    seed=seeds,
    degree=st.integers(0, 2),
    var_type=st.sampled_from(["c", "cc", "ccc", "cu", "cco", "cuo", "u"]),
    missing=st.sampled_from(["error", "marginalize"]),
    kernel=st.sampled_from(["gaussian", "epanechnikov"]),
)
def test_attention_weights_times_targets_is_predict(seed, degree, var_type, missing, kernel):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 60))
    X = _columns(rng, n, var_type)
    y = X.sum(axis=1) ** 2 + rng.normal(size=n)
    if missing == "marginalize" and rng.random() < 0.5:
        X[rng.integers(0, n, 3), rng.integers(0, len(var_type), 3)] = np.nan
    Q = _columns(rng, 7, var_type)
    model = nbattn.LocalPolynomialRegressor(
        degree=degree,
        bandwidth="scott",
        var_type=var_type,
        missing=missing,
        kernel=kernel,
        handle_unknown="ignore",  # a query's level may be one that no training row holds
    ).fit(X, y)
    W = model.attention_weights(Q)
    assert W.shape == (7, n)
    predicted = model.predict(Q)
    scale = max(1.0, float(np.abs(y).max()))
    # A query whose local design is nearly singular (fewer distinct neighbours in reach
    # than terms) has no well-determined fit: the prediction's solve and the weights'
    # solve may drop or keep a nearly dependent term by rounding. There the weights must
    # only be finite; elsewhere they sum to 1 and reproduce the prediction to 1e-9.
    well = np.ones(Q.shape[0], dtype=bool)
    if degree >= 1 and not np.isnan(X).any():
        counts = [
            0 if kind == "c" else int(max(X[:, c].max(), Q[:, c].max())) + 1
            for c, kind in enumerate(var_type)
        ]
        _, _, weights = naive.local_polynomial_exact(
            Q, X, y, model.bandwidth_, var_type, counts, degree, kernel=kernel
        )
        well = naive.local_design_condition(Q, X, weights, var_type, degree) < 1e6
    np.testing.assert_allclose(
        (W @ model.y_fit_[:, 0])[well], predicted[well], rtol=1e-9, atol=1e-9 * scale
    )
    assert np.isfinite(W).all()
    np.testing.assert_allclose(W.sum(axis=1)[well], 1.0, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(W, model.attention_weights(Q))


@settings(max_examples=25, deadline=None)
@given(
    seed=seeds,
    degree=st.integers(1, 2),
    var_type=st.sampled_from(["c", "cc", "ccc", "cu", "cuo"]),
)
def test_local_polynomial_weights_reproduce_linear_functions(seed, degree, var_type):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(15, 60))
    X = _columns(rng, n, var_type)
    cont = np.array([k == "c" for k in var_type])
    a, b = rng.normal(), rng.normal(size=int(cont.sum()))
    Q = _columns(rng, 6, var_type)
    model = nbattn.LocalPolynomialRegressor(
        degree=degree, bandwidth="scott", var_type=var_type, handle_unknown="ignore"
    ).fit(X, rng.normal(size=n))
    W = model.attention_weights(Q)
    # constants and linear functions are reproduced exactly up to the relative ridge (1e-12)
    # times the local design's condition number (up to 1e-6 seen at degree 2); degree-0
    # weights miss a linear function by the local trend, O(0.1) here
    np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=0, atol=1e-5)
    np.testing.assert_allclose(W @ (a + X[:, cont] @ b), a + Q[:, cont] @ b, rtol=1e-5, atol=1e-5)


def test_the_sandwich_interval_of_targets_of_both_signs_near_the_float64_limit():
    """y - fit of targets near +-1.7e308 would overflow: the residuals are taken in units
    of a power of two, so the interval is the unscaled one times the scale (an end beyond
    float64's range the infinity of its sign)."""
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 1))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=40)
    scale = 1.7e308 / np.max(np.abs(y))
    base = nbattn.LocalPolynomialRegressor(bandwidth=0.5).fit(X, y).predict_interval(X[:5])
    big = nbattn.LocalPolynomialRegressor(bandwidth=0.5).fit(X, y * scale).predict_interval(X[:5])
    with np.errstate(over="ignore"):
        representable = np.isfinite(base * scale)
    assert representable.sum() >= 5  # most ends are finite: the test tests something
    np.testing.assert_allclose(big[representable] / scale, base[representable], rtol=1e-12)
    beyond = ~representable  # an end beyond float64 is an infinity of its sign
    np.testing.assert_array_equal(big[beyond], np.sign(base[beyond]) * np.inf)
