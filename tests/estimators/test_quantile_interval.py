"""The regressors' ``predict_interval(kind="quantile")``: the conditional quantiles of y
given x with the regressor's widths, which KernelQuantileRegressor computes independently
from the raw table; the same from a model file's Predictor."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.persistence.predictor import read_predictor

from ..strategies import seeds


def _table(rng, n, mixed):
    x = rng.normal(size=n)
    y = np.sin(x) + (0.2 + 0.3 * np.abs(x)) * rng.normal(size=n)
    if not mixed:
        return x[:, None], y
    colour = np.array(["red", "green", "blue"])[rng.integers(0, 3, n)]
    size = pd.Categorical.from_codes(rng.integers(0, 4, n), ["xs", "s", "m", "l"], ordered=True)
    frame = pd.DataFrame({"x": x, "colour": colour, "size": size})
    return frame, y + (colour == "red") + 0.2 * size.codes


def _queries(X, rng, n_q=7):
    picked = rng.choice(len(X), n_q)
    return X.iloc[picked].reset_index(drop=True) if hasattr(X, "iloc") else X[picked] + 0.1


REGRESSORS = {
    "nw": lambda: nbattn.NadarayaWatsonRegressor(bandwidth="scott"),
    "nw_loo": lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo"),
    "lp": lambda: nbattn.LocalPolynomialRegressor(degree=1, bandwidth=[0.5, 0.3, 0.4]),
    "epanechnikov": lambda: nbattn.NadarayaWatsonRegressor(bandwidth=1.2, kernel="epanechnikov"),
}


@pytest.mark.parametrize("name", sorted(REGRESSORS))
@settings(max_examples=6, deadline=None)
@given(seed=seeds, alpha=st.floats(0.02, 0.9), weighted=st.booleans())
def test_it_is_the_quantile_regressor_at_the_same_widths(name, seed, alpha, weighted):
    rng = np.random.default_rng(seed)
    mixed = name in ("nw_loo", "lp")
    X, y = _table(rng, 50, mixed)
    w = rng.uniform(0.2, 3.0, len(y)) if weighted else None
    regressor = REGRESSORS[name]().fit(X, y, sample_weight=w)
    Q = _queries(X, rng)
    got = regressor.predict_interval(Q, alpha, kind="quantile")
    reference = nbattn.KernelQuantileRegressor(
        bandwidth=regressor.bandwidth_, kernel=regressor.kernel
    ).fit(X, y, sample_weight=w)
    assert got.shape == (len(Q), 2)
    np.testing.assert_array_equal(got, reference.predict_interval(Q, alpha))
    assert np.all(got[:, 0] <= got[:, 1])
    np.testing.assert_array_equal(got, regressor.predict_interval(Q, alpha, kind="quantile"))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_the_full_metric_pools_in_its_coordinates():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    y = X[:, 0] - X[:, 1] ** 2 + 0.3 * rng.normal(size=60)
    model = nbattn.LearnedKernelRegressor(metric="full", max_iter=5).fit(X, y)
    L = model.components_
    reference = nbattn.KernelQuantileRegressor(bandwidth=[1.0, 1.0]).fit(X @ L.T, y)
    np.testing.assert_array_equal(
        model.predict_interval(X[:9], 0.2, kind="quantile"),
        reference.predict_interval(X[:9] @ L.T, 0.2),
    )


def test_the_band_widens_with_the_noise():
    """Over many draws of a heteroscedastic design (noise sd 0.225 at x = -1.5, 0.975 at
    x = 1.5), the 80 % interval is clearly wider on the noisy side in every draw (by less
    than the noise's 4.3: y's normal-reference width adds its own spread)."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-2.0, 2.0, 300)
        y = x + (0.6 + 0.25 * x) * rng.normal(size=300)
        model = nbattn.NadarayaWatsonRegressor(bandwidth=0.4).fit(x[:, None], y)
        band = model.predict_interval(np.array([[-1.5], [1.5]]), 0.2, kind="quantile")
        width = band[:, 1] - band[:, 0]
        assert width[1] > 1.4 * width[0]


def test_the_predictor_gives_the_same_interval(tmp_path):
    rng = np.random.default_rng(5)
    X, y = _table(rng, 40, mixed=True)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=[0.6, 0.3, 0.2]).fit(X, y)
    path = nbattn.save(model, tmp_path / "m.nbattn")
    predictor, _ = read_predictor(path)
    Q = _queries(X, rng)
    np.testing.assert_array_equal(
        predictor.predict_interval(Q, 0.1, kind="quantile"),
        model.predict_interval(Q, 0.1, kind="quantile"),
    )


def test_errors_name_the_problem():
    rng = np.random.default_rng(0)
    X, y = _table(rng, 30, mixed=False)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, y)
    with pytest.raises(ValueError, match="quantile"):
        model.predict_interval(X, 0.1, kind="quantiles")
    for bad in (0.0, 1.0, 1e-17, "0.1", True):
        with pytest.raises(ValueError, match="alpha"):
            model.predict_interval(X, bad, kind="quantile")
    two = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, np.column_stack([y, y]))
    with pytest.raises(ValueError, match="one target"):
        two.predict_interval(X, 0.1, kind="quantile")
    gappy = nbattn.NadarayaWatsonRegressor(bandwidth=0.5, missing="marginalize").fit(X, y)
    with pytest.raises(ValueError, match="missing"):
        gappy.predict_interval(np.array([[np.nan]]), 0.1, kind="quantile")
    average = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y)
    with pytest.raises(ValueError, match="kernel"):
        average.predict_interval(X, 0.1, kind="quantile")
