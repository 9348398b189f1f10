"""Least-squares cross-validation of a density and a conditional density
(``nbattn.distribution.ls_widths``, ``bandwidth="cv_ls"``): the criterion against
statsmodels' ``imse`` and the naive twins (quadrature of f^2), its gradient against finite
differences, and the search against dense grids, statsmodels' optimum and itself."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.distribution.density import density_layout
from nbattn.distribution.ls_widths import LeastSquaresCriterion, least_squares_cv
from nbattn.local.problem import check_columns, lambda_max
from nbattn.local.search import widths_to_theta
from nbattn.smoothing.search import BandwidthRangeWarning
from tests import naive
from tests.strategies import seeds

LS_KERNELS = ["gaussian", "epanechnikov"]


def table(seed, var_type, n):
    """Rows of the given kinds: continuous columns a mixture (30% shifted by 4), 'u' 3
    levels, 'o' 4 levels, each level at least twice (statsmodels counts the levels of the
    data, and of each leave-one-out sample in the conditional ``imse``)."""
    rng = np.random.default_rng(seed)
    cols = []
    for kind in var_type:
        if kind == "c":
            cols.append(rng.normal(size=n) * rng.uniform(0.5, 3) + (rng.random(n) < 0.3) * 4)
        else:
            count = 3 if kind == "u" else 4
            codes = rng.integers(0, count, n)
            codes[: 2 * count] = np.arange(2 * count) % count
            cols.append(rng.permutation(codes))
    return np.column_stack(cols).astype(float)


def widths_for(var_type, rng):
    """Widths inside each kernel's range: h in [0.2, 2], l in (0, lambda_max)."""
    top = lambda_max(var_type, [3 if k == "u" else 4 for k in var_type])
    return np.array(
        [
            rng.uniform(0.2, 2.0) if k == "c" else rng.uniform(0.05, 0.95) * top[c]
            for c, k in enumerate(var_type)
        ]
    )


# --------------------------------------------------------------------------- the criterion
def _statsmodels_imse(X, var_type, widths, n_response=0):
    from statsmodels.nonparametric.kernel_density import (
        KDEMultivariate,
        KDEMultivariateConditional,
    )

    widths = np.asarray(widths, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not n_response:
            return float(KDEMultivariate(X, var_type=var_type, bw=widths).imse(widths))
        r = n_response
        model = KDEMultivariateConditional(
            X[:, :r], X[:, r:], var_type[:r], var_type[r:], bw=widths
        )
        return float(model.imse(widths))


@pytest.mark.parametrize("var_type", ["c", "cc", "cou", "cu"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_criterion_is_statsmodels_imse(var_type, seed):
    """Without weights CV is statsmodels' KDEMultivariate.imse at the same widths."""
    X = table(seed, var_type, 30)
    widths = widths_for(var_type, np.random.default_rng(seed))
    ours = least_squares_cv(X, widths, var_type=var_type)
    assert ours == pytest.approx(_statsmodels_imse(X, var_type, widths), rel=1e-10)


@pytest.mark.parametrize("var_type", ["cc", "cou", "cu", "uc", "oc"])
@pytest.mark.parametrize("seed", [0, 1])
def test_conditional_criterion_is_statsmodels_imse(var_type, seed):
    """y (the first column) given x: KDEMultivariateConditional.imse at the same widths."""
    X = table(seed, var_type, 25)
    widths = widths_for(var_type, np.random.default_rng(seed))
    ours = least_squares_cv(X, widths, var_type=var_type, n_response=1)
    theirs = _statsmodels_imse(X, var_type, widths, n_response=1)
    assert ours == pytest.approx(theirs, rel=1e-10)


mixed = st.sampled_from(["c", "cc", "cu", "co", "uc", "oc"])


@settings(max_examples=25)
@given(seed=seeds, var_type=mixed, kernel=st.sampled_from(LS_KERNELS), weighted=st.booleans())
def test_criterion_matches_the_quadrature_twin(seed, var_type, kernel, weighted):
    """The convolution identity: int f^2 in closed form (Gaussian, Epanechnikov, the
    categorical kernels convolved over the codes) equals f^2 integrated on a grid (1-D and
    2-D), with and without weights; the conditional criterion likewise per row."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 14))
    X = table(seed, var_type, n) if n >= 8 else rng.normal(size=(n, len(var_type)))
    if n < 8:
        X[:, [k != "c" for k in var_type]] = rng.integers(0, 3, (n, 1))
    counts = [0 if k == "c" else (3 if k == "u" or n < 8 else 4) for k in var_type]
    widths = widths_for(var_type, rng)
    widths[[k == "o" for k in var_type]] *= 0.9
    w = rng.uniform(0.1, 3.0, n) if weighted else None
    common = {"var_type": var_type, "n_categories": counts, "kernel": kernel, "sample_weight": w}
    ours = least_squares_cv(X, widths, **common)
    twin = naive.kde_ls_cv(X, widths, var_type, counts, kernel, w)
    assert ours == pytest.approx(twin, rel=1e-9, abs=1e-12)
    if len(var_type) > 1:
        ours = least_squares_cv(X, widths, n_response=1, **common)
        with np.errstate(invalid="ignore"):
            twin = naive.kde_conditional_ls_cv(X, widths, var_type, counts, 1, kernel, w)
        if math.isnan(twin):  # a row that no other row's x reaches (compact kernel)
            assert ours == math.inf
        else:
            assert ours == pytest.approx(twin, rel=1e-9, abs=1e-12)


@settings(max_examples=15)
@given(seed=seeds, var_type=mixed, kernel=st.sampled_from(LS_KERNELS))
def test_criterion_ignores_the_total_weight(seed, var_type, kernel):
    rng = np.random.default_rng(seed)
    X = table(seed, var_type, 12)
    widths = widths_for(var_type, rng)
    w = rng.uniform(0.1, 3.0, 12)
    plain = least_squares_cv(X, widths, var_type=var_type, kernel=kernel, sample_weight=w)
    for factor in (1e-9, 1e9):
        scaled = least_squares_cv(
            X, widths, var_type=var_type, kernel=kernel, sample_weight=w * factor
        )
        assert scaled == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize(
    ("var_type", "n_response", "kernel"),
    [
        ("cou", 0, "gaussian"),
        ("cuo", 0, "epanechnikov"),
        ("cuc", 1, "gaussian"),
        ("ucu", 1, "gaussian"),
        ("oc", 1, "epanechnikov"),
        ("cco", 1, "gaussian"),
    ],
)
def test_gradient_matches_finite_differences(var_type, n_response, kernel):
    """The exact gradient of the search's criterion (in theta: log h, t) against central
    differences, with weights."""
    rng = np.random.default_rng(5)
    X = table(5, var_type, 20)
    spec, (X,) = check_columns({"X": X}, var_type=var_type, kernel=kernel)
    widths = widths_for(var_type, rng) * np.where(spec.continuous, 1.5, 1.0)
    criterion = LeastSquaresCriterion(
        density_layout(spec, X, X, widths, rng.uniform(0.2, 2.0, 20)), n_response
    )
    theta = widths_to_theta(widths, var_type, spec.n_categories) + rng.normal(0, 0.1, X.shape[1])
    _, grad = criterion.loss_and_grad(theta)
    for k in range(theta.size):
        step = np.zeros(theta.size)
        step[k] = 1e-6
        slope = (criterion._value(theta + step) - criterion._value(theta - step)) / 2e-6
        assert grad[k] == pytest.approx(slope, rel=1e-5, abs=1e-7 * np.abs(grad).max())


# --------------------------------------------------------------------------- the search
def _fit(var_type, X, sample_weight=None, kernel="gaussian", conditional=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BandwidthRangeWarning)
        if conditional:
            model = nbattn.ConditionalKernelDensity(
                bandwidth="cv_ls", var_type=var_type[1:], kernel=kernel
            )
            model.fit(X[:, 1:], X[:, 0], sample_weight=sample_weight)
            return np.concatenate(([model.y_bandwidth_], model.bandwidth_))
        model = nbattn.KernelDensity(bandwidth="cv_ls", var_type=var_type, kernel=kernel)
        return model.fit(X, sample_weight=sample_weight).bandwidth_


def hard_case(name, seed):
    """(X, var_type, n_response): data built to break a search."""
    rng = np.random.default_rng(seed)
    if name == "two clusters":  # several minima in h
        return np.r_[rng.normal(size=20), 8 + 0.3 * rng.normal(size=20)][:, None], "c", 0
    if name == "ties":
        return np.round(rng.normal(size=(40, 1)), 1), "c", 0
    x = rng.normal(size=40)
    codes = rng.integers(0, 3, 40)
    codes[:6] = np.arange(6) % 3
    if name == "deterministic u":  # x's cluster is the category: l = 0
        return np.column_stack([x + 6 * codes, codes]), "cu", 0
    if name == "irrelevant u":  # the category is independent and uniform: l = lambda_max
        return np.column_stack([x, codes]), "cu", 0
    if name == "deterministic o":
        return np.column_stack([x + 6 * codes, codes]), "co", 0
    if name == "y given relevant u":
        return np.column_stack([x[:30] + 6 * codes[:30], codes[:30]]), "cu", 1
    return np.column_stack([x[:30], codes[:30]]), "cu", 1  # y given an irrelevant u


HARD_CASES = [
    "two clusters",
    "ties",
    "deterministic u",
    "irrelevant u",
    "deterministic o",
    "y given relevant u",
    "y given irrelevant u",
]


@pytest.mark.parametrize("kernel", LS_KERNELS)
@pytest.mark.parametrize("name", HARD_CASES)
def test_cv_ls_reaches_the_minimum_of_a_dense_grid(name, kernel):
    """The search's criterion is within 1e-6 relative of the least value on a dense grid
    (or below it): log-spaced h over the search's range (1e-3 to 1e4 times the rule's; 400
    of them alone, 100 with a categorical column), times 13 shares of lambda_max from 0
    to 1 (an ordered column's l below 1 by 1e-13, the search's end) for a categorical
    column."""
    X, var_type, n_response = hard_case(name, 0)
    found = _fit(var_type, X, kernel=kernel, conditional=bool(n_response))
    spec, (X,) = check_columns({"X": X}, var_type=var_type, kernel=kernel)
    rule = nbattn.KernelDensity(var_type=var_type).fit(X).bandwidth_
    criterion = LeastSquaresCriterion(density_layout(spec, X, X, rule, None), n_response)
    h_grid = rule[0] * np.exp(np.linspace(math.log(1e-3), math.log(1e4), 400 // len(var_type) ** 2))
    top = lambda_max(var_type, spec.n_categories)
    shares = np.minimum(np.linspace(0.0, 1.0, 13), 1.0 - 1e-13) if len(var_type) > 1 else []
    best = math.inf
    for h in h_grid:
        for widths in [[h, share * top[1]] for share in shares] if len(shares) else [[h]]:
            theta = widths_to_theta(widths, var_type, spec.n_categories)
            theta[1:][np.asarray(widths[1:]) == 0.0] = -math.inf  # l = 0 exactly
            best = min(best, criterion.imse(theta))
    value = least_squares_cv(X, found, var_type=var_type, kernel=kernel, n_response=n_response)
    assert value <= best + 1e-6 * abs(best)


@pytest.mark.parametrize(
    ("name", "share"),
    [
        ("deterministic u", 0.0),
        ("deterministic o", 0.0),
        ("irrelevant u", 1.0),
        ("y given relevant u", 0.0),
    ],
)
def test_cv_ls_puts_the_smoothing_at_its_bound(name, share):
    """The cases built for it end at l = 0 (exact matching) or l = lambda_max."""
    X, var_type, n_response = hard_case(name, 0)
    found = _fit(var_type, X, conditional=bool(n_response))
    top = lambda_max(var_type, [0, 3 if var_type[1] == "u" else 4])[1]
    assert found[1] == pytest.approx(share * top, rel=1e-9, abs=1e-12)


def test_cv_ls_ties_reach_the_floor_and_warn():
    """Repeated values: CV falls without bound as h shrinks; the search stops at its
    lower bound and says so."""
    X = np.round(np.random.default_rng(0).normal(size=(40, 1)))
    with pytest.warns(BandwidthRangeWarning, match="cv_ls"):
        nbattn.KernelDensity(bandwidth="cv_ls").fit(X)


def _top(var_type):
    """Each column's largest width in :func:`table`'s data: inf for 'c', 2/3 for 'u' (3
    levels), 1 for 'o'."""
    return np.array([math.inf if k == "c" else 2 / 3 if k == "u" else 1.0 for k in var_type])


@pytest.mark.parametrize(("var_type", "seed", "n"), [("c", 0, 60), ("cu", 1, 60), ("cou", 2, 50)])
def test_cv_ls_reaches_statsmodels_optimum(var_type, seed, n):
    """statsmodels' imse at nbattn's cv_ls widths is at least as low as at statsmodels' own
    cv_ls widths (those clipped into the kernels' ranges), 1e-9 relative."""
    from statsmodels.nonparametric.kernel_density import KDEMultivariate

    X = table(seed, var_type, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = KDEMultivariate(X, var_type=var_type, bw="cv_ls").bw
    theirs = np.clip(theirs, 0.0, _top(var_type))
    reference = _statsmodels_imse(X, var_type, theirs)
    ours = _statsmodels_imse(X, var_type, _fit(var_type, X))
    assert ours <= reference + 1e-9 * abs(reference)


@pytest.mark.parametrize(("var_type", "seed"), [("cc", 0), ("cu", 1)])
def test_conditional_cv_ls_reaches_statsmodels_optimum(var_type, seed):
    from statsmodels.nonparametric.kernel_density import KDEMultivariateConditional

    X = table(seed, var_type, 25)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = KDEMultivariateConditional(
            X[:, :1], X[:, 1:], var_type[0], var_type[1:], bw="cv_ls"
        ).bw
    theirs = np.clip(theirs, 0.0, _top(var_type))
    reference = _statsmodels_imse(X, var_type, theirs, n_response=1)
    ours = _statsmodels_imse(X, var_type, _fit(var_type, X, conditional=True), n_response=1)
    assert ours <= reference + 1e-9 * abs(reference)


@pytest.mark.parametrize(
    ("var_type", "kernel", "conditional"),
    [("cou", "gaussian", False), ("cc", "epanechnikov", False), ("cu", "gaussian", True)],
)
def test_cv_ls_fits_twice_to_the_bit_and_ignores_the_total_weight(var_type, kernel, conditional):
    """Two fits give the same widths to the bit; weights scaled by 1e-9 or 1e9 the same
    widths (to the search's tolerance: the scaled weights round otherwise)."""
    X = table(3, var_type, 30)
    w = np.random.default_rng(3).exponential(size=30)
    first = _fit(var_type, X, w, kernel, conditional)
    assert _fit(var_type, X, w, kernel, conditional).tobytes() == first.tobytes()
    for factor in (1e-9, 1e9):
        scaled = _fit(var_type, X, w * factor, kernel, conditional)
        np.testing.assert_allclose(scaled, first, rtol=1e-6, atol=1e-9)


def test_cv_ls_is_never_worse_than_the_rule():
    X = table(4, "cou", 40)
    rule = nbattn.KernelDensity(var_type="cou").fit(X).bandwidth_
    found = _fit("cou", X)
    assert least_squares_cv(X, found, var_type="cou") <= least_squares_cv(X, rule, var_type="cou")


# --------------------------------------------------------------------------- the estimators
def test_cv_ls_refuses_the_tricube_kernel():
    X = table(0, "c", 20)
    with pytest.raises(ValueError, match="cv_ls.*tricube"):
        nbattn.KernelDensity(bandwidth="cv_ls", kernel="tricube").fit(X)
    with pytest.raises(ValueError, match="cv_ls.*tricube"):
        least_squares_cv(X, [1.0], kernel="tricube")


def test_cv_ls_refuses_a_given_y_bandwidth_and_one_row():
    X = table(0, "cc", 20)
    model = nbattn.ConditionalKernelDensity(bandwidth="cv_ls", y_bandwidth=0.5)
    with pytest.raises(ValueError, match="y_bandwidth must be None with bandwidth='cv_ls'"):
        model.fit(X[:, 1:], X[:, 0])
    with pytest.raises(ValueError, match="cv_ls.*at least 2 rows"):
        nbattn.KernelDensity(bandwidth="cv_ls").fit(X[:1])


def test_quantile_regressor_takes_cv_ls():
    X = table(1, "cc", 25)
    model = nbattn.KernelQuantileRegressor(bandwidth="cv_ls", y_bandwidth=None)
    model.fit(X[:, 1:], X[:, 0])
    widths = _fit("cc", X, conditional=True)
    assert model.y_bandwidth_ == widths[0]
    np.testing.assert_array_equal(model.bandwidth_, widths[1:])
    assert np.isfinite(model.predict(X[:5, 1:])).all()


def test_cv_ls_is_exact_whatever_rtol():
    """The criterion has no pruned pass: rtol > 0 gives the exact search's widths."""
    X = table(0, "cu", 40)
    exact = _fit("cu", X)
    model = nbattn.KernelDensity(bandwidth="cv_ls", var_type="cu", rtol=0.01)
    assert model.fit(X).bandwidth_.tobytes() == exact.tobytes()
