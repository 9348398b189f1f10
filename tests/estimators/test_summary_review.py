"""Review of summary(): long column names that share a start or an end stay told apart at
80 columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import nbattn


@pytest.mark.parametrize(
    "pattern",
    [
        "a_really_long_column_name_number_{i}_with_suffix",  # differ in the middle
        "measurement_of_the_patient_at_visit_{i}",  # differ at the end
        "{i}_th_measurement_of_the_patient_at_visit",  # differ at the start
    ],
)
def test_long_names_stay_distinct_and_fit_80_columns(pattern):
    rng = np.random.default_rng(0)
    n, d = 12, 12
    names = [pattern.format(i=i) for i in range(d)]
    frame = pd.DataFrame(rng.uniform(size=(n, d)), columns=names)
    y = frame.iloc[:, 0].to_numpy()
    model = nbattn.NadarayaWatsonRegressor(bandwidth=[0.5] * d).fit(frame, y)
    model.significance_test(frame, y, columns=[], joint=names[:3], n_boot=3)
    model.significance_test(frame, y, columns=[0], joint=names[1:], n_boot=3)
    lines = str(model.summary()).splitlines()
    assert max(map(len, lines)) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith("column")) + 1
    labels = [line[:24].rstrip() for line in lines[start : start + d]]
    assert len(set(labels)) == d
    for label, name in zip(labels, names):
        pieces = label.split("...")  # each kept piece is the name's, in order
        assert name.startswith(pieces[0]) and name.endswith(pieces[-1])
        assert len(label) <= 23
    joint = next(line for line in lines if line.startswith("joint"))
    assert joint[:40].rstrip().endswith(names[-1][-10:])  # the end of a long list kept


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_an_mse_beyond_float64_is_warned_about_and_r2_is_exact(scale):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 1))
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=30)
    base = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, y).summary()
    with pytest.warns(RuntimeWarning, match="beyond float64's range"):
        scaled = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, y * scale).summary()
    assert scaled.loo_mse in (0.0, np.inf)
    assert scaled.loo_r2 == pytest.approx(base.loo_r2, rel=1e-12)


def test_every_width_name_is_said_in_words():
    """Each bandwidth name a regressor takes has its words in the summary (none is
    printed as the raw option name)."""
    from nbattn.estimators.spec import REGRESSOR_BANDWIDTH_NAMES
    from nbattn.estimators.summary import _RULES

    assert set(REGRESSOR_BANDWIDTH_NAMES) <= set(_RULES)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(25, 1))
    y = X[:, 0] + 0.2 * rng.normal(size=25)
    text = str(nbattn.LocalPolynomialRegressor(bandwidth="aicc").fit(X, y).summary())
    assert "AICc of Hurvich, Simonoff and Tsai" in text
