"""Review of significance_test: a constant target, a shifted target, and statistics
beyond float64's range."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import nbattn

_MODELS = [
    (nbattn.NadarayaWatsonRegressor, {"bandwidth": [0.4, 0.5, 0.3]}),
    (nbattn.LocalPolynomialRegressor, {"degree": 1, "bandwidth": [0.4, 0.5, 0.3]}),
    (nbattn.LocalPolynomialRegressor, {"degree": 2, "kernel": "epanechnikov"}),
]


def _frame(rng, n):
    return pd.DataFrame(
        {
            "x": rng.uniform(-1.0, 1.0, n),
            "u": pd.Categorical(rng.integers(0, 3, n)),
            "z": rng.uniform(-1.0, 1.0, n),
        }
    )


@pytest.mark.parametrize(("cls", "params"), _MODELS)
def test_a_constant_target_gives_statistic_0_and_p_value_1(cls, params):
    """No column can matter to a constant y: I = 0 and every I* = 0, so p = 1 exactly,
    at any magnitude (was: rounding noise of the fits, p-values like 0.8, and inf)."""
    rng = np.random.default_rng(1)
    frame = _frame(rng, 25)
    for value in (1.0, -3.7, 1e300, -1e-300, 5e-324):
        y = np.full(25, value)
        model = cls(**params).fit(frame, y)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = model.significance_test(frame, y, joint=["x", "u"], n_boot=19)
        assert np.all(table["statistic"].to_numpy() == 0.0), value
        assert np.all(table["p_value"].to_numpy() == 1.0), value


@pytest.mark.parametrize(("cls", "params"), _MODELS[:2])
def test_p_values_do_not_move_when_the_target_is_shifted(cls, params):
    """Every fit reproduces constants, so y + c has the statistic and p-values of y (up to
    the rounding of y + c itself), over random draws and shifts."""
    rng = np.random.default_rng(2)
    for _ in range(3):
        frame = _frame(rng, 30)
        y = 0.5 * frame.x.to_numpy() + rng.normal(size=30)
        base = cls(**params).fit(frame, y).significance_test(frame, y, n_boot=39)
        for shift in (1e3, -1e8):
            shifted = y + shift
            other = cls(**params).fit(frame, shifted).significance_test(frame, shifted, n_boot=39)
            np.testing.assert_allclose(other["statistic"], base["statistic"], rtol=1e-6)
            np.testing.assert_array_equal(other["p_value"], base["p_value"])


def test_a_statistic_beyond_float64_warns_and_keeps_its_p_value():
    """x near 1e300 makes the squared slopes near 1e-600: reported as 0 with a warning that
    names the column, the p-values those of the rescaled data."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1.0, 1.0, (25, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=25)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=[0.4, 0.4])
    base = model.fit(X, y).significance_test(X, y, n_boot=19)
    for scale, shown in ((2.0**1000, 0.0), (2.0**-1000, np.inf)):
        big = nbattn.NadarayaWatsonRegressor(bandwidth=[0.4 * scale] * 2).fit(X * scale, y)
        with pytest.warns(RuntimeWarning, match=r"\['x0', 'x1'\].*beyond float64"):
            table = big.significance_test(X * scale, y, n_boot=19)
        assert np.all(table["statistic"].to_numpy() == shown)
        np.testing.assert_array_equal(table["p_value"], base["p_value"])
