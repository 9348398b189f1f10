"""ConditionalKernelDensity and KernelQuantileRegressor: the conditional density, CDF and
quantiles of y given mixed X against statsmodels' ``KDEMultivariateConditional`` and a
naive reference written here from the formulas, the cv_ml criterion (its gradient, its
equality with statsmodels' leave-one-out likelihood, its search), the estimators'
sampling and errors, and scikit-learn's estimator checks."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from sklearn.utils.estimator_checks import parametrize_with_checks

from nbattn import ConditionalKernelDensity, KernelQuantileRegressor
from nbattn.distribution.density_widths import LikelihoodCriterion, _loo_problem
from nbattn.local.problem import LocalSpec
from nbattn.local.search import widths_to_theta
from nbattn.smoothing.search import BandwidthRangeWarning

from ..strategies import seeds

kernel_density = pytest.importorskip("statsmodels.nonparametric.kernel_density")

# statsmodels' notice that its default random state will change (it draws nothing here)
pytestmark = pytest.mark.filterwarnings("ignore:After 0.17:FutureWarning")

KERNELS = ("gaussian", "epanechnikov", "tricube")


# --------------------------------------------------------------------------- data
def _columns(rng, n, var_type, repeats=2):
    """X (n, d) of ``var_type``: continuous columns of random scale; categorical ones codes
    0 .. c-1 (c from 2 to 4), each code at least ``repeats`` times, in random order."""
    cols, counts = [], []
    for kind in var_type:
        if kind == "c":
            cols.append(rng.normal(size=n) * rng.uniform(0.5, 3.0) + rng.uniform(-5, 5))
            counts.append(0)
        else:
            c = int(rng.integers(2, 5))
            codes = np.r_[np.repeat(np.arange(c), repeats), rng.integers(0, c, n - repeats * c)]
            cols.append(rng.permutation(codes).astype(float))
            counts.append(c)
    return np.column_stack(cols), counts


def _response(rng, X):
    """A continuous y that depends on every column of X."""
    return 0.5 * X @ rng.uniform(-1.0, 1.0, X.shape[1]) + rng.normal(size=X.shape[0])


def _response_of_kind(rng, X, kind, low, high):
    """(y, its width, its category count): continuous (``_response``, h a share from low to
    high of its spread) or codes 0 .. c-1 (each at least twice) with l inside its range."""
    if kind == "c":
        y = _response(rng, X)
        return y, y.std() * rng.uniform(low, high), 0
    y, counts = _columns(rng, X.shape[0], kind)
    return y[:, 0], _widths(rng, y, kind, counts)[0], counts[0]


def _widths(rng, X, var_type, counts, low=0.3, high=1.5):
    """Random interior widths: h a share of the column's spread, l inside (0, lambda_max)."""
    out = np.empty(len(var_type))
    for p, kind in enumerate(var_type):
        if kind == "c":
            out[p] = X[:, p].std() * rng.uniform(low, high)
        else:
            top = (counts[p] - 1) / counts[p] if kind == "u" else 1.0
            out[p] = top * rng.uniform(0.05, 0.95)
    return out


def _queries(rng, m, X, var_type, counts, widths):
    """m queries near the training rows (within half a width of one in each continuous
    column, so that a compact kernel reaches them) with random categories."""
    Q = X[rng.integers(0, X.shape[0], m)].copy()
    for p, kind in enumerate(var_type):
        if kind == "c":
            Q[:, p] += rng.uniform(-0.5, 0.5, m) * widths[p]
        else:
            Q[:, p] = rng.integers(0, counts[p], m)
    return Q


def _statsmodels(y, X, dep_type, indep_type, bw):
    return kernel_density.KDEMultivariateConditional(
        endog=y,
        exog=X,
        dep_type=dep_type,
        indep_type=indep_type,
        bw=bw if isinstance(bw, str) else np.asarray(bw),
    )


# --------------------------------------------------------------------------- naive reference
def _kernel(u, kernel):
    """The continuous kernel, normalised to integrate to 1 (h the half-width of a compact
    kernel's support)."""
    if kernel == "gaussian":
        return math.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    a = abs(u)
    if a >= 1.0:
        return 0.0
    if kernel == "epanechnikov":
        return 0.75 * (1.0 - u * u)
    return 70.0 / 81.0 * (1.0 - a**3) ** 3


def _integrated(z, kernel):
    """G(z), the integral of the kernel from -inf to z."""
    if kernel == "gaussian":
        return 0.5 * math.erfc(-z / math.sqrt(2.0))
    if z <= -1.0:
        return 0.0
    if z >= 1.0:
        return 1.0
    if kernel == "epanechnikov":
        return 0.5 + 0.75 * (z - z**3 / 3.0)
    a = abs(z)
    half = 70.0 / 81.0 * (a - 0.75 * a**4 + 3.0 / 7.0 * a**7 - 0.1 * a**10)
    return 0.5 + math.copysign(half, z)


def _category(a, b, kind, lam, count):
    """Aitchison-Aitken ('u') or Wang-van Ryzin ('o')."""
    if a == b:
        return 1.0 - lam
    if kind == "u":
        return lam / (count - 1)
    return 0.5 * (1.0 - lam) * lam ** abs(a - b)


def _naive(Q, yq, data, x_spec, y_spec, kernel):
    """(f(y|x), F(y|x)) per query by loops: sum_j w_j Kx Ky / sum_j w_j Kx and
    sum_j w_j Kx G / sum_j w_j Kx (a categorical y: its kernel, summed over the codes
    up to y's for F). ``data`` (X, y, w), ``x_spec`` (kinds, widths, counts) and
    ``y_spec`` (kind, width, count)."""
    X, y, w = data
    x_type, x_widths, x_counts = x_spec
    y_type, y_width, y_count = y_spec
    pdf, cdf = [], []
    for xq, yv in zip(Q, yq):
        num = cum = den = 0.0
        for xj, yj, wj in zip(X, y, w):
            kx = wj
            for p, kind in enumerate(x_type):
                if kind == "c":
                    kx *= _kernel((xq[p] - xj[p]) / x_widths[p], kernel) / x_widths[p]
                else:
                    kx *= _category(xq[p], xj[p], kind, x_widths[p], x_counts[p])
            den += kx
            if y_type == "c":
                num += kx * _kernel((yv - yj) / y_width, kernel) / y_width
                cum += kx * _integrated((yv - yj) / y_width, kernel)
            else:
                num += kx * _category(yv, yj, y_type, y_width, y_count)
                below = sum(_category(v, yj, y_type, y_width, y_count) for v in range(int(yv) + 1))
                cum += kx * below
        pdf.append(num / den)
        cdf.append(cum / den)
    return np.array(pdf), np.array(cdf)


def _inverse_integrated(tau, kernel):
    """G^-1(tau) by a root-finder on the naive G."""
    span = 40.0 if kernel == "gaussian" else 1.0
    return brentq(lambda z: _integrated(z, kernel) - tau, -span, span, xtol=1e-15, rtol=1e-15)


def _categorical_y(codes, count, ordered):
    return pd.Series(pd.Categorical(codes, categories=list(range(count)), ordered=ordered))


# --------------------------------------------------------------------------- 1. statsmodels
@pytest.mark.parametrize("indep_type", ["c", "cc", "cou", "uc"])
@settings(max_examples=20, deadline=None)
@given(seed=seeds)
def test_pdf_and_cdf_match_statsmodels(indep_type, seed):
    """At the same widths (y's first), pdf and cdf are statsmodels' at random queries."""
    rng = np.random.default_rng(seed)
    X, counts = _columns(rng, int(rng.integers(15, 40)), indep_type)
    y = _response(rng, X)
    x_widths = _widths(rng, X, indep_type, counts)
    y_width = y.std() * rng.uniform(0.2, 1.5)
    model = ConditionalKernelDensity(
        bandwidth=x_widths, y_bandwidth=y_width, var_type=indep_type
    ).fit(X, y)
    Q = _queries(rng, 12, X, indep_type, counts, 4.0 * x_widths)
    yq = rng.choice(y, 12) + rng.normal(size=12) * y.std()
    peer = _statsmodels(y, X, "c", indep_type, np.r_[y_width, x_widths])
    np.testing.assert_allclose(model.pdf(Q, yq), peer.pdf(yq, Q), rtol=1e-10, atol=0)
    np.testing.assert_allclose(model.cdf(Q, yq), peer.cdf(yq, Q), rtol=0, atol=1e-10)


@pytest.mark.parametrize("dep_type", ["o", "u"])
@settings(max_examples=20, deadline=None)
@given(seed=seeds, indep_type=st.sampled_from(["c", "cu", "oc"]))
def test_categorical_response_matches_statsmodels(dep_type, seed, indep_type):
    """y a pandas (un)ordered Categorical of the codes 0 .. c-1: statsmodels' dep_type 'o'
    and 'u' on the codes, every code at every query."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(15, 40))
    X, counts = _columns(rng, n, indep_type)
    count = int(rng.integers(2, 6))
    codes = rng.permutation(np.r_[np.arange(count), rng.integers(0, count, n - count)])
    x_widths = _widths(rng, X, indep_type, counts)
    top = (count - 1) / count if dep_type == "u" else 1.0
    y_width = top * rng.uniform(0.05, 0.95)
    model = ConditionalKernelDensity(
        bandwidth=x_widths, y_bandwidth=y_width, var_type=indep_type
    ).fit(X, _categorical_y(codes, count, dep_type == "o"))
    assert model.y_type_ == dep_type
    assert list(model.y_categories_) == list(range(count))
    Q = np.repeat(_queries(rng, 5, X, indep_type, counts, 2.0 * x_widths), count, axis=0)
    yq = np.tile(np.arange(count), 5)
    peer = _statsmodels(codes.astype(float), X, dep_type, indep_type, np.r_[y_width, x_widths])
    labels = _categorical_y(yq, count, dep_type == "o")
    np.testing.assert_allclose(model.pdf(Q, labels), peer.pdf(yq, Q), rtol=1e-10, atol=0)
    np.testing.assert_allclose(model.cdf(Q, labels), peer.cdf(yq, Q), rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- 2. naive
@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=20, deadline=None)
@given(
    seed=seeds,
    x_type=st.sampled_from(["c", "cu", "co", "uoc"]),
    y_type=st.sampled_from(["c", "c", "u", "o"]),
    weighted=st.booleans(),
)
def test_matches_naive_reference(kernel, seed, x_type, y_type, weighted):
    """pdf and cdf are the loops of the formulas, for every kernel, with and without
    sample weights, for a continuous and a categorical y."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    X, counts = _columns(rng, n, x_type, repeats=1)
    x_widths = _widths(rng, X, x_type, counts)
    w = rng.uniform(0.05, 3.0, n) if weighted else np.ones(n)
    Q = _queries(rng, 8, X, x_type, counts, x_widths)
    if y_type == "c":
        y = _response(rng, X)
        y_width, y_count = y.std() * rng.uniform(0.2, 1.5), 0
        y_fit, yq = y, rng.choice(y, 8) + rng.normal(size=8) * y_width
        y_query = yq
    else:
        y_count = int(rng.integers(2, 5))
        y = rng.permutation(np.r_[np.arange(y_count), rng.integers(0, y_count, n - y_count)])
        y_fit = _categorical_y(y, y_count, y_type == "o")
        y_width = ((y_count - 1) / y_count if y_type == "u" else 1.0) * rng.uniform(0.05, 0.95)
        yq = rng.integers(0, y_count, 8)
        y_query = _categorical_y(yq, y_count, y_type == "o")
    model = ConditionalKernelDensity(
        bandwidth=x_widths, y_bandwidth=y_width, kernel=kernel, var_type=x_type
    ).fit(X, y_fit, sample_weight=w if weighted else None)
    data = (X, np.asarray(y, dtype=float), w)
    pdf, cdf = _naive(Q, yq, data, (x_type, x_widths, counts), (y_type, y_width, y_count), kernel)
    np.testing.assert_allclose(model.pdf(Q, y_query), pdf, rtol=1e-10, atol=0)
    np.testing.assert_allclose(model.cdf(Q, y_query), cdf, rtol=0, atol=1e-10)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, kernel=st.sampled_from(KERNELS), scale=st.floats(1e-3, 1e3))
def test_weights_total_and_rows_of_weight_zero(seed, kernel, scale):
    """Only the weights' ratios matter, and a row of weight 0 is a row left out: pdf, cdf
    and quantiles at fixed widths, and the cv_ml criterion."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 40))
    X, counts = _columns(rng, n, "cu", repeats=3)
    y = _response(rng, X)
    w = rng.uniform(0.1, 3.0, n)
    w[rng.choice(n, 2, replace=False)] = 0.0
    keep = w > 0
    x_widths = _widths(rng, X, "cu", counts)
    y_width = y.std() * rng.uniform(0.3, 1.0)
    options = dict(bandwidth=x_widths, y_bandwidth=y_width, kernel=kernel, var_type="cu")
    base, scaled, dropped = (
        ConditionalKernelDensity(**options).fit(X_, y_, sample_weight=w_)
        for X_, y_, w_ in ((X, y, w), (X, y, scale * w), (X[keep], y[keep], w[keep]))
    )
    Q = _queries(rng, 8, X[keep], "cu", counts, x_widths)
    yq = rng.choice(y, 8) + rng.normal(size=8) * y_width
    levels = [0.1, 0.5, 0.9]
    for other in (scaled, dropped):
        np.testing.assert_allclose(other.pdf(Q, yq), base.pdf(Q, yq), rtol=1e-12, atol=0)
        np.testing.assert_allclose(other.cdf(Q, yq), base.cdf(Q, yq), rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            other.predict_quantile(Q, levels),
            base.predict_quantile(Q, levels),
            rtol=0,
            atol=2e-9 * y_width,
        )
    widths = np.r_[y_width, x_widths]
    values = [
        _criterion(X_, y_, "cu", counts, widths, kernel, w_)
        for X_, y_, w_ in ((X, y, w), (X, y, scale * w), (X[keep], y[keep], w[keep]))
    ]
    losses = [criterion.loss(theta) for criterion, theta in values]
    assert losses[1] == pytest.approx(losses[0], rel=1e-12)
    assert losses[2] == pytest.approx(losses[0], rel=1e-12)


# --------------------------------------------------------------------------- 3. quantiles
def _quantile_setup(rng, kernel, x_type="cu", n_queries=10, weighted=False):
    n = int(rng.integers(10, 40))
    X, counts = _columns(rng, n, x_type)
    y = _response(rng, X)
    x_widths = _widths(rng, X, x_type, counts)
    y_width = y.std() * rng.uniform(0.1, 1.0)
    w = rng.uniform(0.05, 3.0, n) if weighted else None
    options = dict(bandwidth=x_widths, y_bandwidth=y_width, kernel=kernel, var_type=x_type)
    model = ConditionalKernelDensity(**options).fit(X, y, sample_weight=w)
    Q = _queries(rng, n_queries, X, x_type, counts, x_widths)
    return model, X, y, w, Q, options


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=20, deadline=None)
@given(seed=seeds, weighted=st.booleans())
def test_quantiles_solve_the_cdf(kernel, seed, weighted):
    """F(q_tau(x) | x) = tau to 1e-9 at random levels, by the model's cdf and (Gaussian,
    unweighted) by statsmodels'."""
    rng = np.random.default_rng(seed)
    model, X, y, w, Q, _ = _quantile_setup(rng, kernel, weighted=weighted)
    levels = rng.uniform(0.002, 0.998, 5)
    q = model.predict_quantile(Q, levels)
    assert q.shape == (Q.shape[0], levels.size)
    assert np.isfinite(q).all()
    rows = np.repeat(Q, levels.size, axis=0)
    expected = np.tile(levels, Q.shape[0])
    np.testing.assert_allclose(model.cdf(rows, q.ravel()), expected, rtol=0, atol=1e-9)
    if kernel == "gaussian" and not weighted:
        bw = np.r_[model.y_bandwidth_, model.bandwidth_]
        peer = _statsmodels(y, X, "c", "cu", bw)
        np.testing.assert_allclose(peer.cdf(q.ravel(), rows), expected, rtol=0, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, kernel=st.sampled_from(KERNELS))
def test_quantiles_never_cross(seed, kernel):
    """Levels unsorted and repeated: along the increasing levels the quantiles never
    decrease; a level asked alone, or twice, gives its column's quantile."""
    rng = np.random.default_rng(seed)
    model, X, y, w, Q, _ = _quantile_setup(rng, kernel)
    base = rng.uniform(0.01, 0.99, 4)
    levels = rng.permutation(np.r_[base, base[:2], 0.5])
    q = model.predict_quantile(Q, levels.tolist())
    order = np.argsort(levels, kind="stable")
    assert np.all(np.diff(q[:, order], axis=1) >= 0.0)
    tolerance = 2e-9 * model.y_bandwidth_
    for level in (base[0], base[1]):
        same = np.flatnonzero(levels == level)
        np.testing.assert_allclose(q[:, same[0]], q[:, same[1]], rtol=0, atol=tolerance)
    median = model.predict_quantile(Q, 0.5)
    assert median.shape == (Q.shape[0],)
    three = model.predict_quantile(Q, [0.1, 0.5, 0.9])
    assert three.shape == (Q.shape[0], 3)
    np.testing.assert_allclose(median, three[:, 1], rtol=0, atol=tolerance)
    np.testing.assert_allclose(median, q[:, levels == 0.5][:, 0], rtol=0, atol=tolerance)


@settings(max_examples=20, deadline=None)
@given(
    seed=seeds,
    kernel=st.sampled_from(KERNELS),
    tau=st.floats(0.01, 0.99),
    alpha=st.floats(0.01, 0.99),
    weighted=st.booleans(),
)
def test_regressor_is_the_conditional_quantile(seed, kernel, tau, alpha, weighted):
    """KernelQuantileRegressor(quantile=tau) at the same widths predicts the conditional
    density's quantile at tau; predict_interval is the pair at alpha/2, 1 - alpha/2."""
    rng = np.random.default_rng(seed)
    model, X, y, w, Q, options = _quantile_setup(rng, kernel, weighted=weighted)
    regressor = KernelQuantileRegressor(quantile=tau, **options).fit(X, y, sample_weight=w)
    np.testing.assert_array_equal(regressor.bandwidth_, model.bandwidth_)
    assert regressor.y_bandwidth_ == model.y_bandwidth_
    np.testing.assert_array_equal(regressor.predict(Q), model.predict_quantile(Q, tau))
    interval = regressor.predict_interval(Q, alpha)
    both = model.predict_quantile(Q, [alpha / 2.0, 1.0 - alpha / 2.0])
    assert interval.shape == (Q.shape[0], 2)
    np.testing.assert_array_equal(interval, both)
    assert np.all(interval[:, 0] <= interval[:, 1])
    np.testing.assert_array_equal(
        regressor.predict_quantile(Q, [tau, alpha]), model.predict_quantile(Q, [tau, alpha])
    )


@pytest.mark.parametrize("kernel", ["epanechnikov", "tricube"])
@settings(max_examples=20, deadline=None)
@given(seed=seeds, distance=st.floats(1.5, 1e4))
def test_compact_kernel_quantiles_far_from_every_key(kernel, seed, distance):
    """A query that no key reaches (compact kernel) takes its nearest key's y alone:
    finite quantiles y_nearest + h_y G^-1(tau), which the cdf there gives back."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 30))
    x = rng.normal(size=n)
    y = 2.0 * x + rng.normal(size=n)
    h, h_y = x.std() * rng.uniform(0.05, 0.5), y.std() * rng.uniform(0.05, 1.0)
    model = ConditionalKernelDensity(bandwidth=h, y_bandwidth=h_y, kernel=kernel)
    model.fit(x[:, None], y)
    Q = np.array([[x.max() + distance * h], [x.min() - distance * h]])
    levels = np.sort(rng.uniform(0.01, 0.99, 3))
    q = model.predict_quantile(Q, levels)
    assert np.isfinite(q).all()
    offsets = h_y * np.array([_inverse_integrated(t, kernel) for t in levels])
    nearest = y[[np.argmax(x), np.argmin(x)]]
    np.testing.assert_allclose(q, nearest[:, None] + offsets, rtol=1e-12, atol=1e-9 * h_y)
    rows = np.repeat(Q, levels.size, axis=0)
    F = model.cdf(rows, q.ravel())
    np.testing.assert_allclose(F, np.tile(levels, 2), rtol=0, atol=1e-9)
    assert np.all(np.isfinite(model.score_samples(rows, q.ravel())))


def _far_reference(x, y, h, h_y, at):
    """The weights p_j(at) of one continuous x far from every key, in log space without
    cancellation: log p_j - log p_m = -(d_j - d_m)(d_j + d_m) / 2, m the nearest key."""
    m = np.argmin(np.abs(at - x))
    log_p = -0.5 * ((x[m] - x) / h) * ((2.0 * at - x - x[m]) / h)
    p = np.exp(log_p - log_p.max())
    return p / p.sum()


def _pooled_cdf(u, p, y, h_y, tau=0.0):
    """sum_j p_j G((u - y_j) / h_y) - tau (Gaussian)."""
    return p @ np.array([_integrated((u - yj) / h_y, "gaussian") for yj in y]) - tau


def _far_queries(rng, n):
    x = rng.normal(size=n)
    y = 2.0 * x + rng.normal(size=n)
    h, h_y = x.std() * rng.uniform(0.1, 0.5), y.std() * rng.uniform(0.1, 1.0)
    return x, y, h, h_y


@settings(max_examples=20, deadline=None)
@given(seed=seeds, exponent=st.floats(2.0, 9.0))
def test_gaussian_quantiles_far_from_every_key(seed, exponent):
    """Gaussian kernel, a query 10^2 .. 10^9 widths from every key: the quantiles are the
    roots of the conditional CDF computed without cancellation."""
    rng = np.random.default_rng(seed)
    x, y, h, h_y = _far_queries(rng, int(rng.integers(2, 30)))
    model = ConditionalKernelDensity(bandwidth=h, y_bandwidth=h_y).fit(x[:, None], y)
    levels = np.sort(rng.uniform(0.01, 0.99, 3))
    for at in (x.max() + 10.0**exponent * h, x.min() - 10.0**exponent * h):
        p = _far_reference(x, y, h, h_y, at)
        q = model.predict_quantile(np.array([[at]]), levels)[0]
        for tau, root in zip(levels, q):
            span = y.min() - 10 * h_y, y.max() + 10 * h_y
            expected = brentq(_pooled_cdf, *span, args=(p, y, h_y, tau), xtol=1e-14 * h_y)
            assert root == pytest.approx(expected, rel=1e-12, abs=1e-9 * h_y)


def test_gaussian_pdf_and_cdf_far_from_every_key():
    """Gaussian kernel, a query 10^3 .. 10^9 widths from every key: pdf and cdf are the
    pooling of y's kernel over x's weights computed without cancellation."""
    worst_pdf = worst_cdf = 0.0
    for seed in range(5):
        rng = np.random.default_rng(seed)
        x, y, h, h_y = _far_queries(rng, 20)
        model = ConditionalKernelDensity(bandwidth=h, y_bandwidth=h_y).fit(x[:, None], y)
        for exponent in range(3, 10):
            for at in (x.max() + 10.0**exponent * h, x.min() - 10.0**exponent * h):
                p = _far_reference(x, y, h, h_y, at)
                yq = rng.choice(y, 5) + rng.normal(size=5) * h_y
                pdf = [p @ [_kernel((v - yj) / h_y, "gaussian") / h_y for yj in y] for v in yq]
                cdf = [_pooled_cdf(v, p, y, h_y) for v in yq]
                rows = np.full((5, 1), at)
                worst_pdf = max(worst_pdf, np.max(np.abs(model.pdf(rows, yq) / pdf - 1.0)))
                worst_cdf = max(worst_cdf, np.max(np.abs(model.cdf(rows, yq) - cdf)))
    assert worst_pdf <= 1e-9 and worst_cdf <= 1e-9, (worst_pdf, worst_cdf)


def test_far_rows_with_weights_and_categories():
    """Two continuous x columns and an unordered one, sample weights, queries 1e4 .. 1e8
    widths away along a random direction: pdf and cdf are x's weights (computed by exact
    differences, log p_j - log p_m = log w_j - log w_m - (d_j - d_m) . (d_j + d_m) / 2
    + the category terms) pooling y's kernel, over several draws."""
    from scipy.special import ndtr

    for seed in range(4):
        rng = np.random.default_rng(seed)
        n = 25
        X = np.column_stack([rng.normal(size=n), rng.normal(size=n), rng.integers(0, 3, n)])
        y = X[:, 0] - X[:, 1] + 0.5 * rng.normal(size=n)
        w = rng.uniform(0.2, 3.0, n)
        h, lam, h_y = np.array([0.4, 0.6]), 0.3, 0.5
        model = ConditionalKernelDensity(bandwidth=[*h, lam], y_bandwidth=h_y, var_type="ccu").fit(
            X, y, sample_weight=w
        )
        direction = rng.normal(size=2)
        for exponent in (4, 6, 8):
            q = X[0, :2] + 10.0**exponent * h * direction / np.linalg.norm(direction)
            category = float(rng.integers(0, 3))
            d = (X[:, :2] - q) / h
            m = int(np.argmin(np.sum(d * d, axis=1) - 2 * np.log(w)))
            log_p = np.log(w) - 0.5 * np.sum((d - d[m]) * (d + d[m]), axis=1)
            log_p += np.where(X[:, 2] == category, np.log(1 - lam), np.log(lam / 2))
            p = np.exp(log_p - log_p.max())
            p /= p.sum()
            yq = y[:4] + 0.3
            rows = np.tile([*q, category], (4, 1))
            pdf = (
                p
                @ (np.exp(-0.5 * ((yq[None, :] - y[:, None]) / h_y) ** 2))
                / (h_y * np.sqrt(2 * np.pi))
            )
            cdf = p @ ndtr((yq[None, :] - y[:, None]) / h_y)
            np.testing.assert_allclose(model.pdf(rows, yq), pdf, rtol=1e-9)
            np.testing.assert_allclose(model.cdf(rows, yq), cdf, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_queries_beyond_1e15_widths_take_the_nearest_keys_y(kernel):
    """At 1e15 .. 1e300 widths along x's first column, the squared distances round to one
    value: the key that weighs (the largest first coordinate, the only one left) is found
    through differences of squares, so pdf, cdf and the quantiles are its y's kernel, for
    the Gaussian kernel (pooled about it) and a compact one (its fallback) alike."""
    from scipy.special import ndtr

    for seed in range(3):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(40, 2))
        y = X[:, 0] + rng.normal(size=40)
        model = ConditionalKernelDensity(bandwidth=[1.0, 1.0], y_bandwidth=1.0, kernel=kernel)
        model.fit(X, y)
        top = int(np.argmax(X[:, 0]))
        for distance in (1e15, 1e16, 1e17, 1e100, 1e300):
            rows = np.tile([distance, X[top, 1] + 0.1], (3, 1))
            yq = y[top] + np.array([-0.5, 0.0, 0.3])
            if kernel == "gaussian":
                pdf = np.exp(-0.5 * (yq - y[top]) ** 2) / np.sqrt(2 * np.pi)
                cdf = ndtr(yq - y[top])
            else:
                pdf = 0.75 * (1 - (yq - y[top]) ** 2)
                z = yq - y[top]
                cdf = (1 + z) ** 2 * (2 - z) / 4
            np.testing.assert_allclose(model.pdf(rows, yq), pdf, rtol=1e-12)
            np.testing.assert_allclose(model.cdf(rows, yq), cdf, rtol=1e-12)
            np.testing.assert_allclose(model.predict_quantile(rows[:1], 0.5), y[top], rtol=1e-9)


# --------------------------------------------------------------------------- 4. cv_ml
def _criterion(
    X, y, x_type, counts, widths, kernel="gaussian", sample_weight=None, y_spec=("c", 0)
):
    """The conditional leave-one-out criterion of (y, X) and theta at ``widths`` (y's first);
    ``y_spec`` y's kind and category count."""
    var_type = y_spec[0] + x_type
    spec = LocalSpec(var_type=var_type, n_categories=(y_spec[1], *counts), kernel=kernel)
    joint = np.column_stack([y, X])
    criterion = LikelihoodCriterion(
        _loo_problem(spec, joint, np.asarray(widths, float), sample_weight), n_response=1
    )
    return criterion, widths_to_theta(widths, var_type, spec.n_categories)


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
@settings(max_examples=25, deadline=None)
@given(
    seed=seeds,
    x_type=st.sampled_from(["c", "cu", "co", "cuo", "uc", "oc"]),
    y_type=st.sampled_from(["c", "c", "u", "o"]),
    weighted=st.booleans(),
)
def test_cv_ml_gradient_matches_finite_differences(kernel, seed, x_type, y_type, weighted):
    """loss_and_grad's gradient of the conditional criterion is the central difference
    of its loss, at random interior widths (theta: log h, the categorical sigmoid), for a
    continuous y (and an unordered or ordered one)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 40))
    X, counts = _columns(rng, n, x_type)
    low, high = (0.4, 1.5) if kernel == "gaussian" else (1.2, 3.0)
    y, y_width, y_count = _response_of_kind(rng, X, y_type, low, high)
    widths = np.r_[y_width, _widths(rng, X, x_type, counts, low, high)]
    w = rng.uniform(0.1, 3.0, n) if weighted else None
    criterion, theta = _criterion(X, y, x_type, counts, widths, kernel, w, (y_type, y_count))
    reference = criterion._value(theta)
    assume(math.isfinite(reference))  # every row within reach of another (compact kernel)
    value, grad = criterion.loss_and_grad(theta)
    assert value == pytest.approx(reference, rel=1e-12)
    fd = np.empty(theta.size)
    for k in range(theta.size):
        # a compact kernel's criterion has kinks where a pair crosses the support's edge:
        # where the one-sided differences disagree (a kink inside the step), a 100x
        # smaller step
        for eps in (1e-5, 1e-7):
            step = np.zeros(theta.size)
            step[k] = eps
            up, down = criterion._value(theta + step), criterion._value(theta - step)
            fd[k] = (up - down) / (2 * eps)
            right, left = (up - value) / eps, (value - down) / eps
            if abs(right - left) <= 1e-3 * max(abs(right), abs(left), 1e-3):
                break
    assert np.isfinite(fd).all()
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())


@settings(max_examples=20, deadline=None)
@given(
    seed=seeds,
    x_type=st.sampled_from(["c", "cc", "cu", "co", "cuo", "uc"]),
    y_type=st.sampled_from(["c", "c", "u", "o"]),
)
def test_criterion_is_statsmodels_loo_likelihood(seed, x_type, y_type):
    """n CV(widths) is statsmodels' loo_likelihood(bw, func=np.log) (-sum log f_-i(y_i | x_i)),
    for a continuous y (and dep_type 'u' or 'o')."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 40))
    X, counts = _columns(rng, n, x_type)  # every code twice: statsmodels counts the others'
    y, y_width, y_count = _response_of_kind(rng, X, y_type, 0.2, 1.5)
    widths = np.r_[y_width, _widths(rng, X, x_type, counts)]
    criterion, theta = _criterion(X, y, x_type, counts, widths, y_spec=(y_type, y_count))
    peer = _statsmodels(y, X, y_type, x_type, widths)
    expected = peer.loo_likelihood(widths, func=np.log)
    assert n * criterion.loss(theta) == pytest.approx(expected, rel=1e-9)


def _statsmodels_designs():
    """Two small data sets on which statsmodels' cv_ml is quick: (x_type, X, y)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=120)
    yield "c", x[:, None], np.sin(2 * x) + 0.4 * rng.normal(size=120)
    rng = np.random.default_rng(4)
    x = rng.normal(size=100)
    u = rng.permutation(np.r_[[0, 0, 1, 1, 2, 2], rng.integers(0, 3, 94)]).astype(float)
    yield "cu", np.column_stack([x, u]), np.sin(2 * x) + (u == 1) + 0.4 * rng.normal(size=100)


@pytest.mark.parametrize("design", range(2))
def test_cv_ml_reaches_statsmodels_optimum(design):
    """The fitted widths' leave-one-out likelihood, by statsmodels' own objective, is at
    least as good as statsmodels' cv_ml optimum."""
    x_type, X, y = list(_statsmodels_designs())[design]
    peer = _statsmodels(y, X, "c", x_type, "cv_ml")
    categorical = [p for p, kind in enumerate(x_type) if kind != "c"]
    top = np.array([1.0 - 1.0 / len(np.unique(X[:, p])) for p in categorical])
    lambdas = peer.bw[1:][categorical]
    if np.any((lambdas < 0) | (lambdas > top)):
        pytest.skip(f"statsmodels' lambdas {lambdas} leave their kernels' range")
    model = ConditionalKernelDensity(bandwidth="cv_ml", var_type=x_type).fit(X, y)
    ours = np.r_[model.y_bandwidth_, model.bandwidth_]
    theirs = peer.loo_likelihood(peer.bw, func=np.log)
    assert peer.loo_likelihood(ours, func=np.log) <= theirs + 1e-7 * abs(theirs)


_SUBTRACT_WARNING = "invalid value encountered in subtract"


def test_cv_ml_compact_kernel_fit_warns_nothing():
    """A cv_ml fit with a compact kernel raises no RuntimeWarning: the rows out of reach
    make the criterion +inf, nothing else."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for seed in range(20):
            rng = np.random.default_rng(seed)
            x = rng.normal(size=40)
            y = x + rng.normal(size=40)
            model = ConditionalKernelDensity(bandwidth="cv_ml", kernel="epanechnikov")
            model.fit(x[:, None], y)
            assert np.isfinite(model.bandwidth_).all()


def _hard_designs():
    """(name, x_type, X, y) built to trouble a search: ties in x, an irrelevant
    categorical column, two far clusters, 3 and 5 rows."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 5, 60).astype(float)
        yield f"ties-{seed}", "c", x[:, None], x + rng.normal(size=60)
        x = rng.normal(size=50)
        noise = rng.integers(0, 3, 50).astype(float)
        yield (
            f"irrelevant-{seed}",
            "cu",
            np.column_stack([x, noise]),
            np.sin(x) + rng.normal(scale=0.3, size=50),
        )
        x = np.r_[rng.normal(size=25), 1e3 + rng.normal(size=25)]
        y = np.r_[rng.normal(size=25), -500.0 + rng.normal(size=25)]
        yield f"clusters-{seed}", "c", x[:, None], y
        for n in (3, 5):
            yield f"n{n}-{seed}", "c", rng.normal(size=(n, 1)), rng.normal(size=n)


# the spurious warning of test_cv_ml_compact_kernel_fit_warns_nothing, left aside here
@pytest.mark.filterwarnings(f"ignore:{_SUBTRACT_WARNING}:RuntimeWarning")
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_cv_ml_never_worse_than_the_rule(kernel):
    """On each hard design the cv_ml widths' criterion is at most the normal reference
    rule's."""
    for name, x_type, X, y in _hard_designs():
        counts = [0 if k == "c" else len(np.unique(X[:, p])) for p, k in enumerate(x_type)]
        options = dict(kernel=kernel, var_type=x_type)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BandwidthRangeWarning)
            fitted = ConditionalKernelDensity(bandwidth="cv_ml", **options).fit(X, y)
        rule = ConditionalKernelDensity(bandwidth="normal_reference", **options).fit(X, y)
        at_fit, theta_fit = _criterion(
            X, y, x_type, counts, np.r_[fitted.y_bandwidth_, fitted.bandwidth_], kernel
        )
        at_rule, theta_rule = _criterion(
            X, y, x_type, counts, np.r_[rule.y_bandwidth_, rule.bandwidth_], kernel
        )
        value, reference = at_fit.loss(theta_fit), at_rule.loss(theta_rule)
        assert np.isfinite(fitted.bandwidth_).all() and np.isfinite(fitted.y_bandwidth_), name
        assert value <= reference + 1e-12 * abs(reference), (name, value, reference)


@pytest.mark.parametrize("kernel", KERNELS)
def test_cv_ml_is_repeatable(kernel):
    """Two cv_ml fits on the same data give bit-identical widths."""
    rng = np.random.default_rng(7)
    X, counts = _columns(rng, 80, "cuo")
    y = _response(rng, X)
    fits = [
        ConditionalKernelDensity(bandwidth="cv_ml", kernel=kernel, var_type="cuo").fit(X, y)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(fits[0].bandwidth_, fits[1].bandwidth_)
    assert fits[0].y_bandwidth_ == fits[1].y_bandwidth_


# --------------------------------------------------------------------------- 5. estimators
def _fitted(rng, kernel="gaussian", y_type="c", n=40):
    X, counts = _columns(rng, n, "cu")
    x_widths = _widths(rng, X, "cu", counts)
    if y_type == "c":
        y = _response(rng, X)
        y_width = y.std() * rng.uniform(0.2, 1.0)
    else:
        count = 4
        codes = rng.permutation(np.r_[np.arange(count), rng.integers(0, count, n - count)])
        y = _categorical_y(codes, count, y_type == "o")
        y_width = (0.75 if y_type == "u" else 1.0) * rng.uniform(0.05, 0.9)
    model = ConditionalKernelDensity(
        bandwidth=x_widths, y_bandwidth=y_width, kernel=kernel, var_type="cu"
    ).fit(X, y)
    return model, X, y, counts, x_widths


@pytest.mark.parametrize("y_type", ["c", "u", "o"])
def test_sample_is_reproducible(y_type):
    rng = np.random.default_rng(3)
    model, X, y, counts, widths = _fitted(rng, y_type=y_type)
    first = model.sample(X, random_state=11)
    np.testing.assert_array_equal(first, model.sample(X, random_state=11))
    np.testing.assert_array_equal(
        model.sample(X, random_state=np.random.default_rng(5)),
        model.sample(X, random_state=np.random.default_rng(5)),
    )
    assert first.shape == (X.shape[0],)
    assert not np.array_equal(first, model.sample(X, random_state=12))


@pytest.mark.parametrize("kernel", KERNELS)
def test_continuous_samples_follow_the_cdf(kernel):
    """20000 draws at one x: the empirical CDF is the model's within 4 standard errors."""
    rng = np.random.default_rng(21)
    model, X, y, counts, widths = _fitted(rng, kernel)
    N = 20_000
    for row in (0, 1):
        at = np.repeat(X[row : row + 1], N, axis=0)
        draws = model.sample(at, random_state=100 + row)
        assert np.isfinite(draws).all()
        points = np.quantile(y, [0.1, 0.3, 0.5, 0.7, 0.9])
        F = model.cdf(at[: points.size], points)
        empirical = (draws[:, None] <= points).mean(axis=0)
        error = 4.0 * np.sqrt(F * (1.0 - F) / N)
        assert np.all(np.abs(empirical - F) <= error), (empirical, F)


@pytest.mark.parametrize("y_type", ["u", "o"])
def test_categorical_samples_follow_the_pdf(y_type):
    """Draws of a categorical y at one x: each category's frequency is its pdf (over the
    pdfs' sum: the ordered kernel's sum over the codes is below 1) within 4 standard
    errors; the draws are the fitted categories' values."""
    rng = np.random.default_rng(8)
    model, X, y, counts, widths = _fitted(rng, y_type=y_type)
    N = 20_000
    for row in (0, 5):
        at = np.repeat(X[row : row + 1], N, axis=0)
        draws = model.sample(at, random_state=row)
        assert set(draws.tolist()) <= set(model.y_categories_)
        codes = np.arange(4)
        pdf = model.pdf(at[:4], _categorical_y(codes, 4, y_type == "o"))
        if y_type == "u":
            assert pdf.sum() == pytest.approx(1.0, rel=1e-12)
        p = pdf / pdf.sum()
        frequency = np.array([np.mean(draws == c) for c in codes])
        assert np.all(np.abs(frequency - p) <= 4.0 * np.sqrt(p * (1.0 - p) / N) + 1e-12)


@pytest.mark.parametrize("y_type", ["c", "u", "o"])
def test_score_is_the_sum_of_score_samples(y_type):
    rng = np.random.default_rng(2)
    model, X, y, counts, widths = _fitted(rng, y_type=y_type)
    rows = model.score_samples(X, y)
    assert np.isfinite(rows).all()
    assert model.score(X, y) == pytest.approx(rows.sum(), rel=1e-12)
    np.testing.assert_allclose(model.pdf(X, y), np.exp(rows), rtol=1e-15)


def test_errors():
    rng = np.random.default_rng(1)
    model, X, y, counts, widths = _fitted(rng)
    with pytest.raises(ValueError, match="y_bandwidth"):
        ConditionalKernelDensity(bandwidth="cv_ml", y_bandwidth=0.5, var_type="cu").fit(X, y)
    with pytest.raises(ValueError, match="y_bandwidth"):
        KernelQuantileRegressor(y_bandwidth=0.5, var_type="cu").fit(X, y)
    for bad in (0.0, 1.0, -0.1, 1.5, [0.5, 1.0], [0.0, 0.5], float("nan"), [], "0.5", ["0.5"]):
        with pytest.raises(ValueError, match=r"\bq\b"):
            model.predict_quantile(X, bad)
    regressor = KernelQuantileRegressor(bandwidth="normal_reference", var_type="cu").fit(X, y)
    for bad in (0.0, 1.0, 1.2, -0.5, [0.3, 2.0]):
        with pytest.raises(ValueError, match=r"\bq\b"):
            regressor.predict_quantile(X, bad)
    # 1e-17: 1 - alpha/2 rounds to 1, whose quantile is +inf
    for bad in (0.0, 1.0, 1.5, -0.1, float("nan"), True, "0.1", 1e-17):
        with pytest.raises(ValueError, match="alpha"):
            regressor.predict_interval(X, bad)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="quantile"):
            KernelQuantileRegressor(quantile=bad, var_type="cu").fit(X, y)
    categorical, Xc, yc, _, _ = _fitted(rng, y_type="u")
    with pytest.raises(ValueError, match="continuous"):
        categorical.predict_quantile(Xc, 0.5)
    with_nan = np.asarray(y, dtype=float).copy()
    with_nan[3] = np.nan
    with pytest.raises(ValueError):
        ConditionalKernelDensity(var_type="cu").fit(X, with_nan)
    with pytest.raises(ValueError):
        KernelQuantileRegressor(var_type="cu").fit(X, with_nan)
    with pytest.raises(ValueError):
        ConditionalKernelDensity(var_type="cu").fit(X, y[:-1])
    with pytest.raises(ValueError):
        model.pdf(X, y[:-1])
    with pytest.raises(ValueError):
        model.cdf(X[:-2], y)


# --------------------------------------------------------------------------- 6. sklearn
_WEIGHTS = (
    "leave-one-out widths leave one row out where a repeated row stays in; a width rule "
    "counts Kish's effective rows (sum w)^2 / sum w^2: weights 2 and a row given twice "
    "choose different widths"
)


@parametrize_with_checks(
    [
        KernelQuantileRegressor(),
        KernelQuantileRegressor(bandwidth="normal_reference", quantile=0.3),
    ],
    expected_failed_checks=lambda estimator: {
        "check_sample_weight_equivalence_on_dense_data": _WEIGHTS
    },
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_a_quantile_regressor_refuses_a_categorical_y_at_fit():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 1))
    levels = ["low", "mid", "high"]
    for y in (
        np.array(levels)[rng.integers(0, 3, 30)],
        pd.Categorical.from_codes(rng.integers(0, 3, 30), levels, ordered=True),
    ):
        with pytest.raises(ValueError, match="continuous y"):
            KernelQuantileRegressor(bandwidth="normal_reference").fit(X, y)


def test_y_width_errors_and_warnings_name_y():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 1))
    text = np.array(["a", "b"])[rng.integers(0, 2, 40)]
    with pytest.raises(ValueError, match=r"^y_bandwidth\[0\] is the smoothing l"):
        ConditionalKernelDensity(y_bandwidth=0.9).fit(X, text)
    with pytest.raises(ValueError, match="^y_bandwidth must be positive"):
        ConditionalKernelDensity(y_bandwidth=0.0).fit(X, rng.normal(size=40))
    tied = np.round(rng.normal(size=40))
    with pytest.warns(BandwidthRangeWarning, match="y's width reached") as caught:
        ConditionalKernelDensity(bandwidth="cv_ls").fit(X, tied)
    assert not any("X column 0's width" in str(w.message) for w in caught)


def test_infinite_y_gives_the_limits():
    """F(+inf | x) = 1, F(-inf | x) = 0 and f(+-inf | x) = 0, beside finite rows computed as
    alone, for the Gaussian and a compact kernel."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(40, 1))
    y = X[:, 0] + rng.normal(size=40)
    for kernel in ("gaussian", "epanechnikov"):
        model = ConditionalKernelDensity(bandwidth=[0.6], y_bandwidth=0.5, kernel=kernel)
        model.fit(X, y)
        values = np.array([np.inf, -np.inf, 0.3, -0.2])
        np.testing.assert_array_equal(model.cdf(X[:4], values)[:2], [1.0, 0.0])
        np.testing.assert_array_equal(model.pdf(X[:4], values)[:2], [0.0, 0.0])
        np.testing.assert_array_equal(model.cdf(X[:4], values)[2:], model.cdf(X[2:4], values[2:]))
        np.testing.assert_array_equal(model.pdf(X[:4], values)[2:], model.pdf(X[2:4], values[2:]))


def test_response_errors_name_y():
    """A conditional model's response is named y in its errors (not an X column), without
    the features' handle_unknown hint; y=None is refused where y is evaluated; a bare
    ordered pandas Categorical stays ordered."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(40, 1))
    y = np.array(["low", "mid", "high"])[rng.integers(0, 3, 40)]
    model = ConditionalKernelDensity(bandwidth=[0.5], y_bandwidth=0.2).fit(X, y)
    with pytest.raises(ValueError, match=r"^y holds the category 'top'") as info:
        model.pdf(X[:2], ["low", "top"])
    assert "handle_unknown" not in str(info.value) and "X column" not in str(info.value)
    for method in (model.pdf, model.score_samples, model.cdf):
        with pytest.raises(ValueError, match="needs y"):
            method(X[:2], None)
    levels = ["small", "medium", "large"]
    ordered = pd.Categorical.from_codes(rng.integers(0, 3, 40), levels, ordered=True)
    as_array = ConditionalKernelDensity(bandwidth=[0.5], y_bandwidth=0.2).fit(X, ordered)
    as_series = ConditionalKernelDensity(bandwidth=[0.5], y_bandwidth=0.2).fit(
        X, pd.Series(ordered)
    )
    assert as_array.y_type_ == as_series.y_type_ == "o"
    assert as_array.y_categories_ == levels
    np.testing.assert_array_equal(as_array.pdf(X, ordered), as_series.pdf(X, ordered))
