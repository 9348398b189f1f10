"""Exact at extreme magnitudes: one section per class of failure, then the properties.

The promise (the design notes, "Numerics"): a query far from every key gets
the nearest key's value; nothing is NaN where the mathematics is finite;
results do not depend on the units. Each case below is a minimal reproducer
with the answer it must give, from first principles (the nearest key's value)
or from the scale-safe references in ``tests/naive.py`` (exact fractions for
the scores, so nothing overflows or cancels there).

Classes:

1. far queries: every score overflows (1e160), or the direct differences lose
   every digit (1e8 in float32, 1e17 in float64); the pool, the weight
   matrix, the classifier, the spread and the LOO kernels;
2. widths from data at 1e-170 and 1e160 (Scott's and Silverman's rules);
3. the spread (``return_std``) of targets near 1e200 and 1e-200.

To add a case: put the smallest input that shows the failure in its class's
section, with the answer worked out by hand or by a ``naive.*_exact``
reference, in both dtypes where the magnitude is representable.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from nbattn import config
from nbattn.estimators import NadarayaWatsonClassifier
from nbattn.kernels import loo, loo_1d, pooling
from nbattn.smoothing import regression
from nbattn.smoothing.loo import loo_loss

from . import naive
from .strategies import seeds

KEYS = np.array([0.0, 1.0, 2.0])
VALUES = np.array([10.0, 20.0, 30.0])
PROPERTY = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------- 1. far queries


@pytest.mark.parametrize(
    "dtype,far",
    [
        ("float64", 1e160),  # the squared scaled distance overflows to inf
        ("float64", 1e17),  # q - k rounds to q for every key
        ("float32", 1e30),  # overflows float32
        ("float32", 1e8),  # float32 differences lose every digit
    ],
)
def test_far_query_gets_the_nearest_key(dtype, far):
    queries = np.array([far, -far, 1.0])
    got = regression.nadaraya_watson(queries, KEYS, VALUES, 0.5, dtype=dtype)
    expected = naive.nadaraya_watson_exact(queries, KEYS, VALUES, 0.5)
    np.testing.assert_allclose(expected[:2], [30.0, 10.0])
    np.testing.assert_allclose(got, expected, rtol=1e-6 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_far_query_shares_between_tied_nearest_keys(dtype):
    """Two keys at the same distance from a far query split the weight evenly."""
    keys = np.array([[0.0, 1.0], [0.0, -1.0], [-1.0, 0.0]])
    values = np.array([10.0, 30.0, 100.0])
    got = regression.nadaraya_watson(np.array([[1e20, 0.0]]), keys, values, 0.5, dtype=dtype)
    np.testing.assert_allclose(got, [20.0], rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_far_query_keeps_the_relative_weights_of_close_keys(dtype):
    """Keys 1e-9 apart seen from 1e9 away: score gap 2 q dk / (2 h^2) = 2, exactly weighed."""
    keys = np.array([0.0, 1e-9])
    values = np.array([0.0, 1.0])
    q = np.array([1e9])
    got = regression.nadaraya_watson(q, keys, values, np.sqrt(0.5), dtype="float64")
    expected = naive.nadaraya_watson_exact(q, keys, values, np.sqrt(0.5))
    np.testing.assert_allclose(expected, [1.0 / (1.0 + np.exp(-2.0))], rtol=1e-6)
    np.testing.assert_allclose(got, expected, rtol=1e-9)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_far_query_lse_is_the_exact_log_normaliser(dtype):
    """lse = s_a + log sum_j exp(s_j - s_a): -inf only where s_a itself overflows."""
    far = 1e8 if dtype == "float32" else 1e17
    q = np.array([far])
    _, lse = regression.nadaraya_watson(q, KEYS, VALUES, 0.5, dtype=dtype, return_lse=True)
    s_a = -0.5 * ((far - 2.0) / 0.5) ** 2
    assert lse[0] == pytest.approx(s_a, rel=1e-6)
    _, lse = regression.nadaraya_watson([1e160], KEYS, VALUES, 0.5, return_lse=True)
    assert lse[0] == -np.inf


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_far_row_of_the_weight_matrix_is_one_hot(dtype):
    far = 1e30 if dtype == "float32" else 1e160
    w = regression.gaussian_attention_weights([far, -far, 0.9], KEYS, 0.5, dtype=dtype)
    np.testing.assert_array_equal(w[:2], [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    expected = naive.nadaraya_watson_exact_weights([0.9], KEYS, 0.5)
    np.testing.assert_allclose(w[2], expected[0], rtol=1e-5 if dtype == "float32" else 1e-12)


def test_classifier_far_query_gets_the_nearest_class_not_nan():
    X = np.array([[0.0], [1.0], [2.0], [3.0]])
    y = np.array(["a", "a", "b", "b"])
    model = NadarayaWatsonClassifier(bandwidth=0.5).fit(X, y)
    proba = model.predict_proba([[1e160], [-1e160]])
    np.testing.assert_array_equal(proba, [[0.0, 1.0], [1.0, 0.0]])
    assert list(model.predict([[1e160], [-1e160]])) == ["b", "a"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_spread_of_a_far_query_is_that_of_its_nearest_key(dtype):
    far = 1e30 if dtype == "float32" else 1e160
    mean, std, n_eff = regression.nadaraya_watson_spread([far], KEYS, VALUES, 0.5, dtype=dtype)
    np.testing.assert_allclose(mean, [30.0])
    np.testing.assert_array_equal(std, [0.0])
    np.testing.assert_allclose(n_eff, [1.0])


def _loo_kernels(z, y, dtype):
    """The LOO kernels on scaled points z: (pass-one sse, fused sse, diagonal gradient sums)."""
    z = np.ascontiguousarray(z, dtype=dtype)
    z_t = np.ascontiguousarray(z.T)
    y2 = np.asarray(y, dtype=np.float64)[:, None]
    v_t = np.ascontiguousarray(y2.T, dtype=dtype)
    fused = loo.loo_squared_error(z, z_t, v_t, y2, np.arange(len(z)))
    f, lse = pooling.gaussian_pool(z, z_t, v_t, True, 0)
    f = f.astype(np.float64)
    resid = f - y2
    grad = loo.loo_grad_diag(
        z,
        z_t,
        v_t,
        np.ascontiguousarray(resid, dtype=dtype),
        np.ascontiguousarray(f, dtype=dtype),
        lse,
        0,
    )
    return float(np.sum(resid**2)), fused, grad


@pytest.mark.parametrize(
    "dtype,far", [("float32", 1e3), ("float32", 1e30), ("float64", 1e5), ("float64", 1e160)]
)
def test_loo_with_a_far_outlier_predicts_its_nearest_neighbour(dtype, far):
    """The outlier's LOO prediction is its nearest neighbour's value, not 0."""
    x = np.array([0.0, 0.5, 1.0, 1.5, far])
    y = np.array([1.0, 2.0, 3.0, 4.0, 50.0])
    assert naive.nadaraya_watson_exact(x[4:], x[:4], y[:4], 0.5)[0] == 4.0
    z = (x / (0.5 * np.sqrt(2.0))).astype(dtype)[:, None]
    expected = naive.loo_loss_exact(z.astype(np.float64), y, np.sqrt(0.5)) * len(x)
    sse, fused, grad = _loo_kernels(z, y, dtype)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    assert sse == pytest.approx(expected, rel=rtol)
    assert fused == pytest.approx(expected, rel=rtol)
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_loo_gradient_with_a_far_point_matches_the_close_data(dtype):
    """A point 1e8 (float32) / 1e17 (float64) widths away takes all its LOO weight
    from its nearest neighbour, and gives none to the others: it adds its own
    (constant) error to the loss and nothing to the gradient sums."""
    rng = np.random.default_rng(5)
    z = rng.normal(size=(30, 2))
    y = np.sin(z[:, 0]) + 0.1 * rng.normal(size=30)
    far = 1e8 if dtype == "float32" else 1e17
    zf = np.vstack([z, [[far, 0.0]]]).astype(dtype).astype(np.float64)
    yf = np.append(y, 3.0)
    sse, fused, grad = _loo_kernels(zf, yf, dtype)
    pred = naive.nadaraya_watson_exact(zf, zf, yf, np.sqrt(0.5), exclude_self=True)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    assert sse == pytest.approx(np.sum((pred - yf) ** 2), rel=rtol)
    assert fused == pytest.approx(sse, rel=rtol)
    _, _, grad_close = _loo_kernels(zf[:30], y, "float64")
    np.testing.assert_allclose(grad, grad_close, rtol=1e-4 if dtype == "float32" else 1e-10)


def test_loo_loss_of_data_with_a_far_outlier():
    x = np.array([0.0, 0.5, 1.0, 1.5, 1e30])
    y = np.array([1.0, 2.0, 3.0, 4.0, 50.0])
    assert loo_loss(x, y, 0.5) == pytest.approx(naive.loo_loss_exact(x, y, 0.5), rel=1e-12)


@pytest.mark.parametrize(
    "dtype,far",
    # float32 rows recomputed with float64 scores, then anchored ones; float64 anchored
    [("float32", 1e3), ("float32", 1e30), ("float64", 1e5), ("float64", 1e160)],
)
def test_sorted_1d_loo_kernel_with_far_rows(dtype, far):
    """The windowed 1-D kernel of the bandwidth search: outliers at both ends."""
    x = np.array([-far, 0.0, 0.3, 0.4, 1.0, far / 2, far])
    y = np.array([5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0])
    zs = np.ascontiguousarray(x / (0.5 * np.sqrt(2.0)), dtype=dtype)
    v_t = np.ascontiguousarray(y[None, :], dtype=dtype)
    total = loo_1d.loo_squared_error_sorted_1d(
        zs, v_t, y[:, None], np.arange(x.size), loo_1d.prune_gap_for(dtype)
    )
    # the reference on the kernel's own (scaled, rounded) inputs: x[5] sits within
    # rounding of the midpoint of its neighbours, so the scaling decides that row
    expected = naive.loo_loss_exact(zs.astype(np.float64), y, np.sqrt(0.5)) * x.size
    assert total == pytest.approx(expected, rel=1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_far_rows_switch_at_the_configured_score(dtype):
    """Rows just inside and just beyond FAR_SCORE agree (both paths are exact there)."""
    limit = {"float32": config.FAR_SCORE_FLOAT32, "float64": config.FAR_SCORE_FLOAT64}[dtype]
    d = np.sqrt(limit)
    q = np.array([[d * 0.999, 0.0], [d * 1.001, 0.0]], dtype=dtype)
    k_t = np.array([[0.0, -0.5, 0.1], [0.0, 0.2, -0.3]], dtype=dtype)
    v_t = np.array([[1.0, 2.0, 3.0]], dtype=dtype)
    out, lse = pooling.gaussian_pool(q, k_t, v_t, False, 0)
    ref = naive.nadaraya_watson_exact(
        q.astype(np.float64), k_t.T.astype(np.float64), v_t[0], np.sqrt(0.5)
    )
    rtol = 1e-4 if dtype == "float32" else 1e-9
    np.testing.assert_allclose(out[:, 0], ref, rtol=rtol)
    assert np.all(np.isfinite(lse))


# ----------------------------------------------------------------- 2. widths at extremes


@pytest.mark.parametrize("scale", [1e-170, 1e-300, 1e160, 1e300])
@pytest.mark.parametrize("rule", ["scott", "silverman"])
def test_bandwidth_rule_scales_with_the_data(scale, rule):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3))
    np.testing.assert_allclose(
        regression.bandwidth_rule(X * scale, rule),
        regression.bandwidth_rule(X, rule) * scale,
        rtol=1e-12,
    )


def test_bandwidth_rule_refuses_a_subnormal_width():
    X = np.column_stack([np.arange(5.0), np.arange(5.0) * 1e-310])
    with pytest.raises(ValueError, match="column 1"):
        regression.bandwidth_rule(X)


@pytest.mark.parametrize("scale", [1e-170, 1e160])
def test_scott_predictions_do_not_depend_on_the_units(scale):
    """Data at 1e-170 is not constant and data at 1e160 not infinitely wide."""
    rng = np.random.default_rng(2)
    X = rng.uniform(0, 4, size=40)
    y = np.sin(X)
    Q = np.linspace(0, 4, 9)
    expected = regression.nadaraya_watson(Q, X, y)
    got = regression.nadaraya_watson(Q * scale, X * scale, y)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    assert np.ptp(got) > 0.5  # not the plain average


# ----------------------------------------------------------------- 3. spread at extremes


@pytest.mark.parametrize(
    "dtype,scale",
    # squares of the deviations would overflow / underflow in the dtype
    [
        ("float64", 1e200),
        ("float64", 1e-200),
        ("float64", 1e300),
        ("float32", 1e30),
        ("float32", 1e-30),
    ],
)
def test_return_std_scales_with_the_targets(dtype, scale):
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 4, size=40)
    y = np.sin(X) + 0.3 * rng.normal(size=40)
    Q = np.linspace(0, 4, 7)
    mean, std, n_eff = regression.nadaraya_watson_spread(Q, X, y * scale, 0.4, dtype=dtype)
    m_ref, s_ref, n_ref = naive.weighted_spread_exact(Q, X, y * scale, 0.4)
    rtol = 2e-5 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(mean, m_ref, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(std, s_ref, rtol=rtol)
    np.testing.assert_allclose(n_eff, n_ref, rtol=rtol)
    _, std_unit, _ = regression.nadaraya_watson_spread(Q, X, y, 0.4)
    np.testing.assert_allclose(std / scale, std_unit, rtol=rtol)


def test_predict_return_std_of_targets_near_1e200():
    """The estimator path of the spread (``predict(return_std=True)``)."""
    from nbattn import NadarayaWatsonRegressor

    rng = np.random.default_rng(4)
    X = rng.uniform(0, 4, size=(40, 1))
    y = (np.sin(X[:, 0]) + 0.3 * rng.normal(size=40)) * 1e200
    Q = np.linspace(0, 4, 5)[:, None]
    mean, std = NadarayaWatsonRegressor(bandwidth=0.4).fit(X, y).predict(Q, return_std=True)
    m_ref, s_ref, _ = naive.weighted_spread_exact(Q, X, y, 0.4)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-10, atol=1e-10 * 1e200)
    np.testing.assert_allclose(std, s_ref, rtol=1e-10)
    assert np.all(std > 1e199)


# ----------------------------------------------------------------- properties


def _dataset(data, max_d=3):
    n = data.draw(st.integers(2, 12), label="n")
    d = data.draw(st.integers(1, max_d), label="d")
    seed = data.draw(seeds, label="seed")
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if data.draw(st.booleans(), label="ties"):
        X[n // 2 :] = X[: n - n // 2]  # duplicated rows
    y = rng.normal(size=n)
    Q = rng.normal(size=(4, d)) * 3
    return X, y, Q, rng


@PROPERTY
@given(data=st.data(), exponent=st.sampled_from([-150, 150, -300, 300]))
def test_scaling_the_inputs_scales_nothing_but_the_widths(data, exponent):
    X, y, Q, _ = _dataset(data)
    scale = 10.0**exponent
    h = regression.bandwidth_rule(X)
    constant = np.ptp(X, axis=0) == 0  # no spread: width in the feature's own units
    np.testing.assert_allclose(
        regression.bandwidth_rule(X * scale), np.where(constant, h, h * scale), rtol=1e-12
    )
    expected = regression.nadaraya_watson(Q, X, y)
    got = regression.nadaraya_watson(Q * scale, X * scale, y)
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-7 * np.abs(y).max())


@PROPERTY
@given(data=st.data(), exponent=st.sampled_from([-200, -150, 150, 200]))
def test_scaling_the_targets_scales_mean_and_std(data, exponent):
    X, y, Q, _ = _dataset(data)
    scale = 10.0**exponent
    h = regression.bandwidth_rule(X)
    mean, std, n_eff = regression.nadaraya_watson_spread(Q, X, y, h)
    mean_s, std_s, n_eff_s = regression.nadaraya_watson_spread(Q, X, y * scale, h)
    big = np.abs(y).max()
    np.testing.assert_allclose(mean_s / scale, mean, rtol=1e-9, atol=1e-12 * big)
    np.testing.assert_allclose(std_s / scale, std, rtol=1e-9, atol=1e-12 * big)
    np.testing.assert_allclose(n_eff_s, n_eff, rtol=1e-12)


@PROPERTY
@given(
    data=st.data(),
    exponents=st.lists(st.integers(-300, 300), min_size=3, max_size=3),
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_nothing_is_nan_and_every_output_is_a_convex_combination(data, exponents, dtype):
    """Keys, queries and widths of any magnitude: outputs lie within [min v, max v]."""
    X, y, Q, rng = _dataset(data)
    e_keys, e_query, e_width = exponents
    e_width = e_width // 2  # widths are accepted within [1.5e-154, 1.3e154]
    if dtype == "float32":  # keep z = x / h and x within the float32 range
        e_keys, e_query, e_width = (int(e) * 30 // 300 for e in exponents)
    # the scaled inputs x / h must be representable (refusing them is the layout's job)
    assume(max(e_keys, e_query) - e_width <= (300 if dtype == "float64" else 30))
    X = X * 10.0**e_keys
    Q = Q * 10.0**e_query
    h = 10.0**e_width
    out = regression.nadaraya_watson(Q, X, y, h, dtype=dtype)
    assert np.all(np.isfinite(out))
    slack = 1e-6 * np.abs(y).max()
    assert np.all(out >= y.min() - slack) and np.all(out <= y.max() + slack)
    mean, std, n_eff = regression.nadaraya_watson_spread(Q, X, y, h, dtype=dtype)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(std))
    # float32 scores of size |s| carry an absolute error of about |s| * 6e-8, so the
    # weights (and 1 / sum w^2) of a query tens of widths away are good to ~1e-5
    rtol = 1e-5 if dtype == "float64" else 1e-4
    assert np.all((n_eff >= 1 - rtol) & (n_eff <= len(X) * (1 + rtol)))


@PROPERTY
@given(
    data=st.data(),
    log_distance=st.floats(2.0, 30.0),
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_far_queries_get_the_nearest_key(data, log_distance, dtype):
    """Queries 1e2 .. 1e30 widths away: the softmax of the scores, never 0/0.

    In float64, the exact softmax of the exact scores: the nearest key's value
    where one key holds the weight (most draws), an exact blend where keys tie
    or nearly tie. Inputs are float32 numbers and the width sqrt(1/2), so the
    kernel's scaled inputs are the given numbers in both dtypes. In float32 a
    score s is known only to about |s| eps32 (the rounding of the differences
    and squares), so keys whose exact scores lie within a few of those of the
    best may share the weight in any proportion: the answer is a blend of the
    values of the keys that can weigh, and the nearest key's value where no
    other comes that close.
    """
    X, y, _, rng = _dataset(data)
    direction = rng.normal(size=X.shape[1])
    direction /= np.linalg.norm(direction)
    q = (direction * 10.0**log_distance)[None, :].astype(np.float32).astype(np.float64)
    X = X.astype(np.float32).astype(np.float64)
    h = np.sqrt(0.5)
    got = regression.nadaraya_watson(q, X, y, h, dtype=dtype)
    if dtype == "float64":
        w = naive.nadaraya_watson_exact_weights(q, X, h)[0]
        assert got[0] == pytest.approx(w @ y, rel=1e-6, abs=1e-6)
        if w.max() == 1.0:
            assert got[0] == pytest.approx(y[np.argmax(w)], rel=1e-6, abs=1e-6)
        return
    # the scores -|q - x|^2 (h = sqrt(1/2)), exact in float64 up to 1e-16 relative
    scores = -np.sum((q - X) ** 2, axis=1)
    # keys beyond 20 + that rounding of the best weigh < e^-20 of it: out of the blend
    reach = 20.0 + 8 * np.finfo(np.float32).eps * np.abs(scores).max()
    near = scores >= scores.max() - reach
    slack = 1e-6 * max(1.0, float(np.abs(y).max()))
    assert y[near].min() - slack <= got[0] <= y[near].max() + slack


@pytest.mark.parametrize("offset", [1e8, -3e9, 1e12])
def test_float32_data_far_from_the_origin_keeps_its_digits(rng, offset):
    """Keys at offset + small spread: float32 pooling equals float64 (the layout centres first)."""
    for _ in range(5):
        keys = offset + rng.uniform(0, 3, size=(20, 1))
        queries = offset + rng.uniform(0, 3, size=(7, 1))
        values = rng.normal(size=20)
        ref = naive.nadaraya_watson(queries - offset, keys - offset, values, 0.4)
        got = regression.nadaraya_watson(
            queries.astype(np.float64), keys, values, 0.4, dtype="float32"
        )
        np.testing.assert_allclose(got, ref, atol=1e-4 * np.abs(values).max())


@pytest.mark.parametrize("bandwidth", ["scott", "silverman", "loo"])
def test_estimators_give_the_same_answers_in_any_units(rng, bandwidth):
    """Data at 1e-170 and at 1e160 (widths and all) predict what data at 1 predicts."""
    from nbattn.estimators import NadarayaWatsonRegressor

    for _ in range(3):
        X = rng.uniform(0, 6, size=(40, 2))
        y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=40)
        Q = rng.uniform(0, 6, size=(5, 2))
        ref = NadarayaWatsonRegressor(bandwidth=bandwidth).fit(X, y)
        mean_ref, std_ref = ref.predict(Q, return_std=True)
        for scale in (1e-170, 1e160):
            model = NadarayaWatsonRegressor(bandwidth=bandwidth).fit(X * scale, y)
            np.testing.assert_allclose(model.bandwidth_ / scale, ref.bandwidth_, rtol=1e-9)
            mean, std = model.predict(Q * scale, return_std=True)
            np.testing.assert_allclose(mean, mean_ref, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(std, std_ref, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- any target, any weight
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=seeds,
    exponent=st.sampled_from([-1000, -600, -540, 0, 510, 600, 1000]),
    degree=st.integers(0, 2),
)
def test_one_factor_widths_and_intervals_scale_with_the_targets(seed, exponent, degree):
    """y times 2**e (exact): the same "loo_scale" widths and the interval times 2**e, where
    the squared residuals of y beyond 2**+-500 would overflow or vanish."""
    from nbattn.estimators import LocalPolynomialRegressor

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, 2))
    y = X[:, 0] ** 2 + 0.1 * rng.normal(size=40)
    c = 2.0**exponent
    ref = LocalPolynomialRegressor(degree=degree, bandwidth="loo_scale").fit(X, y)
    got = LocalPolynomialRegressor(degree=degree, bandwidth="loo_scale").fit(X, y * c)
    np.testing.assert_array_equal(got.bandwidth_, ref.bandwidth_)
    for kind in ("mean", "observation"):
        expected = ref.predict_interval(X[:5], kind=kind)
        np.testing.assert_allclose(got.predict_interval(X[:5], kind=kind) / c, expected, rtol=1e-12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=seeds,
    weight=st.sampled_from([5e-324, 1e-300, 1e-46, 1e-9, 1.0, 1e39, 1e300, 1.7e308]),
    model=st.sampled_from(["scott", "scott float32", "average", "loo", "loo mixed"]),
)
@example(seed=1, weight=5e-324, model="loo")  # an irrelevant column's flat criterion
def test_predictions_do_not_depend_on_a_constant_weight(seed, weight, model):
    """Every row weighted by the same constant, from the smallest subnormal to near the
    largest float64: the unweighted fit, widths and predictions (a weighted mean is
    scale-free)."""
    from nbattn.estimators import NadarayaWatsonRegressor

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=40)
    options = {
        "scott": {},
        "scott float32": {"dtype": "float32"},
        "average": {"kernel": "average"},
        "loo": {"bandwidth": "loo"},
        "loo mixed": {"bandwidth": "loo", "var_type": "cu"},
    }[model]
    if model == "loo mixed":
        X[:, 1] = rng.integers(0, 3, size=40)
    ref = NadarayaWatsonRegressor(**options).fit(X, y)
    got = NadarayaWatsonRegressor(**options).fit(X, y, sample_weight=np.full(40, weight))
    # equal weights are the unweighted fit, bit for bit
    np.testing.assert_array_equal(got.bandwidth_, ref.bandwidth_)
    rtol = 1e-5 if model == "scott float32" else 1e-9
    np.testing.assert_allclose(got.predict(X[:5]), ref.predict(X[:5]), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("exponent", [1023, 1000, -1000, -1060])
@pytest.mark.parametrize(
    "params",
    [
        {"model": "nw", "kernel": "tricube"},
        {"model": "nw", "missing": "marginalize"},
        {"model": "lp", "degree": 1},
        {"model": "lp", "degree": 2, "kernel": "epanechnikov"},
    ],
)
def test_engine_fits_targets_near_the_ends_of_float64(seed, exponent, params):
    """Targets near 1.7e308 (their moment sums overflowed: inf where the fit is finite) or
    subnormal: the engine's fit is its fit of the targets brought to unit size, scaled
    back (a power of two: exact), never inf or NaN."""
    from nbattn import LocalPolynomialRegressor, NadarayaWatsonRegressor

    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 3, size=(30, 2))
    unit_y = rng.uniform(-1.0, 1.0, size=30) * 0.999
    Q = rng.uniform(0, 3, size=(7, 2))
    params = dict(params)
    cls = NadarayaWatsonRegressor if params.pop("model") == "nw" else LocalPolynomialRegressor
    y = np.ldexp(unit_y, exponent)  # (subnormal ones lose digits here, once)
    got = cls(bandwidth=1.5, **params).fit(X, y).predict(Q)
    unit = cls(bandwidth=1.5, **params).fit(X, np.ldexp(y, -exponent)).predict(Q)  # exact
    with np.errstate(over="ignore"):  # a fit beyond float64 is inf in both
        want = np.ldexp(unit, exponent)  # rounds once, as the scaled-back fit does
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got[np.isfinite(want)], want[np.isfinite(want)])


@pytest.mark.parametrize("degree", [0, 1, 2])
def test_engine_keeps_each_output_at_its_own_scale(degree):
    """A target column near 1e308 beside one near 1e-300 and one of unit size: each
    output's fit is the unit-size fit times its power of two (scaling is per output: one
    shared divisor wiped the small column out, found in review)."""
    from nbattn import local_polynomial

    rng = np.random.default_rng(degree)
    X, Q = rng.normal(size=(60, 2)), rng.normal(size=(7, 2))
    b = np.sin(X[:, 0]) + 0.3 * X[:, 1]
    exponents = np.array([1020, -1000, 0])
    Y = np.column_stack([np.ldexp(b, e) for e in exponents])
    fit, grad = local_polynomial(Q, X, Y, [1.0, 1.0], degree, return_gradient=True)
    unit_Y = np.column_stack([b, b, b])
    unit_fit, unit_grad = local_polynomial(Q, X, unit_Y, [1.0, 1.0], degree, return_gradient=True)
    np.testing.assert_array_equal(fit, np.ldexp(unit_fit, exponents))
    np.testing.assert_array_equal(grad, np.ldexp(unit_grad, exponents))
    assert np.all(np.abs(fit[:, 1]) > 0)


@pytest.mark.parametrize("rest", [1e-6, 1e-12, 1e-200])
def test_one_huge_target_costs_the_others_no_digit(rest):
    """One target near 1e308 outside the compact kernel's reach of the queries: the fit
    there is exactly the fit with that target replaced by 0 (its weight is 0)."""
    from nbattn import local_polynomial

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (200, 1))
    X[0] = 0.0
    y = rest * (np.sin(X[:, 0]) + 2.0)
    Q = np.linspace(3.0, 9.0, 9)[:, None]
    huge = y.copy()
    huge[0] = 1e308
    zero = y.copy()
    zero[0] = 0.0
    for degree in (0, 1):
        got = local_polynomial(Q, X, huge, [0.8], degree, kernel="tricube")
        want = local_polynomial(Q, X, zero, [0.8], degree, kernel="tricube")
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("exponent", [1023, 1000, -1000])
@pytest.mark.parametrize("params", [{"kernel": "tricube"}, {"missing": "marginalize"}])
def test_engine_spread_of_targets_near_the_ends_of_float64(seed, exponent, params):
    """predict(return_std=True) on the engine pools the squared targets: near 1.7e308 they
    overflowed (a NaN or inf std where the true one is about 0.35 2**1023). The spread is
    the unit-size targets' spread times their power of two, to rounding."""
    from nbattn import NadarayaWatsonRegressor

    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 3, size=(30, 2))
    unit_y = rng.uniform(-1.0, 1.0, size=30) * 0.999
    Q = rng.uniform(0, 3, size=(7, 2))
    y = np.ldexp(unit_y, exponent)
    mean, std = NadarayaWatsonRegressor(bandwidth=1.5, **params).fit(X, y).predict(Q, True)
    unit_mean, unit_std = (
        NadarayaWatsonRegressor(bandwidth=1.5, **params).fit(X, unit_y).predict(Q, True)
    )
    assert np.all(np.isfinite(std)) and np.all(std > 0)
    np.testing.assert_allclose(np.ldexp(std, -exponent), unit_std, rtol=1e-12)
    np.testing.assert_allclose(np.ldexp(mean, -exponent), unit_mean, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_effective_neighbours_within_one_and_n_far_from_the_keys(dtype):
    """Queries tens of widths from a tight cluster of keys: the scores are near -500, where
    a float32 lse is good to one ulp (3e-5); the spread pass renormalises its own weights,
    so 1 / sum w^2 stays within [1, n] to float rounding (it drifted by 2e-4 before), and
    the std agrees with the weighted std of the normalised weights in float64."""
    worst = 0.0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        n, d = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        X = rng.normal(size=(n, d)) * 1e8
        Q = rng.normal(size=(5, d)) * 10.0 ** rng.integers(13, 16)
        y = rng.normal(size=n)
        mean, std, n_eff = regression.nadaraya_watson_spread(Q, X, y, 1e14, dtype=dtype)
        worst = max(worst, float(np.max(n_eff / n - 1)), float(np.max(1 - n_eff)))
        W = naive.nadaraya_watson_weights(Q, X, 1e14)
        want = np.sqrt(np.sum(W * (y[None, :] - mean[:, None]) ** 2, axis=1))
        np.testing.assert_allclose(std, want, rtol=1e-3, atol=1e-6 * np.abs(y).max())
    assert worst <= (1e-6 if dtype == "float32" else 1e-12), worst
