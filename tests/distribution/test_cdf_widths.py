"""y's width by cross-validation of the conditional CDF (``y_bandwidth="cv_cdf"``,
``nbattn.distribution.cdf_widths``): the criterion against its naive twin, the search
against dense grids of y's width on curves built to break it, repeatability, scaling, and
the estimators' and model files' use of it."""

from __future__ import annotations

import numpy as np
import pytest

import nbattn
from nbattn.distribution.cdf_widths import cdf_criterion, cv_cdf_width
from nbattn.local.problem import check_columns, lambda_max
from tests import naive


def _spec(var_type, joint, kernel="gaussian", sample_weight=None):
    spec, (checked,) = check_columns({"X": joint}, var_type=var_type, kernel=kernel)
    return spec, checked


def _heteroscedastic(seed, n, ties=False):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, n)
    y = np.sin(2.0 * x) + (0.1 + 0.4 * np.abs(x)) * rng.normal(size=n)
    if ties:
        y = np.round(y, 1)  # a few dozen distinct values
    return np.column_stack([y, x])


@pytest.mark.parametrize(
    "var_type, kernel, weighted",
    [
        ("cc", "gaussian", False),
        ("cc", "epanechnikov", True),
        ("ccu", "gaussian", True),
        ("oc", "gaussian", False),
        ("uc", "gaussian", True),
    ],
)
def test_criterion_matches_the_naive_twin(var_type, kernel, weighted):
    rng = np.random.default_rng(3)
    n = 40
    joint = _heteroscedastic(4, n)
    if var_type[0] != "c":
        joint[:, 0] = np.digitize(joint[:, 0], [-0.5, 0.0, 0.6])  # 4 codes
    if var_type.endswith("u"):
        joint = np.column_stack([joint, rng.integers(0, 3, n)])
    spec, checked = _spec(var_type, joint, kernel)
    weights = rng.uniform(0.2, 2.0, n) if weighted else None
    x_widths = [0.6, 0.3][: len(var_type) - 1]
    y_widths = [0.0, 0.3, 0.7] if var_type[0] != "c" else [0.05, 0.3, 1.5]
    ours = cdf_criterion(spec, checked, [y_widths[1], *x_widths], y_widths, weights)
    for width, value in zip(y_widths, ours):
        reference = naive.conditional_cdf_cv(
            checked, [width, *x_widths], var_type, spec.n_categories, kernel, weights
        )
        assert value == pytest.approx(reference, rel=1e-12, abs=1e-15)


def _brute_force(spec, joint, widths, grid, weights=None):
    values = cdf_criterion(spec, joint, widths, grid, weights)
    return float(values.min())


@pytest.mark.parametrize("case", ["plain", "ties", "two regimes", "flat"])
def test_search_matches_a_dense_grid(case):
    rng = np.random.default_rng(5)
    n = 150
    joint = _heteroscedastic(6, n, ties=case == "ties")
    if case == "two regimes":  # half the rows nearly exact, half very noisy: two scales of y
        joint[: n // 2, 0] = np.round(joint[: n // 2, 1], 2) * 3.0
        joint[n // 2 :, 0] += 5.0 * rng.normal(size=n - n // 2)
    if case == "flat":  # y independent of x and of width: a criterion with little slope
        joint[:, 0] = rng.normal(size=n) * 1e-3 + np.repeat([0.0, 1.0], n // 2)
    spec, checked = _spec("cc", joint)
    start = [0.3, 0.25]
    ours = cv_cdf_width(spec, checked, start)
    value = float(cdf_criterion(spec, checked, start, [ours])[0])
    at_start = float(cdf_criterion(spec, checked, start, [start[0]])[0])
    assert value <= at_start  # never worse than the start
    dense = np.geomspace(start[0] / 300.0, start[0] * 5.0, 400)
    assert value <= _brute_force(spec, checked, start, dense) * (1.0 + 1e-4)
    assert cv_cdf_width(spec, checked, start) == ours  # the same bits


@pytest.mark.parametrize("kind", ["o", "u"])
def test_categorical_search_matches_a_dense_grid(kind):
    joint = _heteroscedastic(7, 120)
    joint[:, 0] = np.digitize(joint[:, 0] + 0.3 * joint[:, 1], [-1.0, -0.3, 0.3, 1.0])
    spec, checked = _spec(kind + "c", joint)
    top = float(lambda_max(kind, spec.n_categories[:1])[0])
    start = [0.5 * top, 0.3]
    ours = cv_cdf_width(spec, checked, start)
    assert 0.0 <= ours <= top
    value = float(cdf_criterion(spec, checked, start, [ours])[0])
    dense = np.linspace(0.0, top, 401)
    assert value <= _brute_force(spec, checked, start, dense) * (1.0 + 1e-4)


def test_a_constant_y_keeps_the_start():
    joint = _heteroscedastic(8, 30)
    joint[:, 0] = 2.5
    spec, checked = _spec("cc", joint)
    assert cv_cdf_width(spec, checked, [0.4, 0.3]) == 0.4


def test_the_width_scales_with_the_data():
    joint = _heteroscedastic(9, 80)
    spec, checked = _spec("cc", joint)
    base = cv_cdf_width(spec, checked, [0.3, 0.25])
    for power in (-900, 900):
        scale = 2.0**power
        spec_s, scaled = _spec("cc", joint * scale)
        assert cv_cdf_width(spec_s, scaled, [0.3 * scale, 0.25 * scale]) == base * scale


def test_quantile_regressor_chooses_y_by_the_cdf_and_round_trips(tmp_path):
    joint = _heteroscedastic(10, 200)
    X, y = joint[:, 1:], joint[:, 0]
    model = nbattn.KernelQuantileRegressor(bandwidth=[0.25]).fit(X, y)
    assert model.y_bandwidth == "cv_cdf"
    rule = nbattn.KernelQuantileRegressor(bandwidth=[0.25], y_bandwidth=None).fit(X, y)
    spec, checked = _spec("cc", joint)
    expected = cv_cdf_width(spec, checked, [rule.y_bandwidth_, 0.25])
    assert model.y_bandwidth_ == expected < rule.y_bandwidth_
    again = nbattn.KernelQuantileRegressor(bandwidth=[0.25]).fit(X, y)
    assert again.y_bandwidth_ == model.y_bandwidth_
    path = tmp_path / "quantile.nbattn"
    nbattn.save(model, path)
    loaded = nbattn.load(path)
    assert loaded.get_params()["y_bandwidth"] == "cv_cdf"
    np.testing.assert_array_equal(loaded.predict_interval(X[:20]), model.predict_interval(X[:20]))


def test_conditional_density_takes_cv_cdf_after_cv_ml():
    joint = _heteroscedastic(11, 120)
    X, y = joint[:, 1:], joint[:, 0]
    ml = nbattn.ConditionalKernelDensity(bandwidth="cv_ml").fit(X, y)
    both = nbattn.ConditionalKernelDensity(bandwidth="cv_ml", y_bandwidth="cv_cdf").fit(X, y)
    np.testing.assert_array_equal(both.bandwidth_, ml.bandwidth_)
    spec, checked = _spec("cc", joint)
    assert both.y_bandwidth_ == cv_cdf_width(spec, checked, [ml.y_bandwidth_, *ml.bandwidth_])
    with pytest.raises(ValueError, match="y_bandwidth"):
        nbattn.ConditionalKernelDensity(y_bandwidth="cv_ls").fit(X, y)


@pytest.mark.parametrize(
    "y",
    [np.r_[np.zeros(79), 1.0], np.array([0.3, 1.7]), np.round(np.linspace(-2, 2, 80))],
    ids=["one-outlier", "two-rows", "rounded"],
)
def test_the_width_stays_within_the_documented_range(y):
    """Degenerate y (one value apart, two rows, heavy ties): y's width stays within
    2^-24 .. 2^8 of its start (the module docstring's limits)."""
    x = np.linspace(0.0, 1.0, y.size)[:, None]
    options = dict(bandwidth="normal_reference")
    start = nbattn.ConditionalKernelDensity(**options).fit(x, y).y_bandwidth_
    width = nbattn.ConditionalKernelDensity(y_bandwidth="cv_cdf", **options).fit(x, y).y_bandwidth_
    assert 2.0**-24 <= width / start <= 2.0**8
