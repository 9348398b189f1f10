"""The regressors' ``predict_interval(kind="quantile")``: predict's value plus the
conditional quantiles of the leave-one-out residuals given x with the regressor's widths,
which KernelQuantileRegressor computes independently from the raw table and residuals of
the plain-NumPy local fit; the same from a model file's Predictor."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn._core import columns
from nbattn.persistence.predictor import read_predictor
from tests.naive import local_polynomial_exact

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


def _loo_residuals(model, keys, degree):
    """y_j - fit_{-j}(x_j) by the plain-NumPy local polynomial of the fitted model."""
    fit = local_polynomial_exact(
        keys,
        keys,
        model.y_fit_,
        model.bandwidth_ if keys is model.X_fit_ else np.ones(keys.shape[1]),
        model.var_type_ if keys is model.X_fit_ else "c" * keys.shape[1],
        columns.n_categories(model.categories_) if keys is model.X_fit_ else [0] * keys.shape[1],
        degree,
        kernel=getattr(model, "kernel", "gaussian"),
        sample_weight=model.sample_weight_,
        exclude_self=True,
    )[0]
    return model.y_fit_[:, 0] - fit[:, 0]


@pytest.mark.parametrize("name", sorted(REGRESSORS))
@settings(max_examples=6, deadline=None)
@given(seed=seeds, alpha=st.floats(0.02, 0.9), weighted=st.booleans())
def test_it_is_the_quantile_regressor_of_the_residuals(name, seed, alpha, weighted):
    rng = np.random.default_rng(seed)
    mixed = name in ("nw_loo", "lp")
    X, y = _table(rng, 50, mixed)
    w = rng.uniform(0.2, 3.0, len(y)) if weighted else None
    regressor = REGRESSORS[name]().fit(X, y, sample_weight=w)
    Q = _queries(X, rng)
    got = regressor.predict_interval(Q, alpha, kind="quantile")
    residuals = _loo_residuals(regressor, regressor.X_fit_, getattr(regressor, "degree", 0))
    reference = nbattn.KernelQuantileRegressor(
        bandwidth=regressor.bandwidth_, kernel=regressor.kernel
    ).fit(X, residuals, sample_weight=w)
    expected = reference.predict_interval(Q, alpha) + regressor.predict(Q)[:, None]
    assert got.shape == (len(Q), 2)
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-8)
    assert np.all(got[:, 0] <= got[:, 1])
    np.testing.assert_array_equal(got, regressor.predict_interval(Q, alpha, kind="quantile"))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_the_full_metric_pools_in_its_coordinates():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    y = X[:, 0] - X[:, 1] ** 2 + 0.3 * rng.normal(size=60)
    model = nbattn.LearnedKernelRegressor(metric="full", max_iter=5).fit(X, y)
    mapped = X @ model.components_.T
    residuals = _loo_residuals(model, mapped, 0)
    reference = nbattn.KernelQuantileRegressor(bandwidth=[1.0, 1.0]).fit(mapped, residuals)
    np.testing.assert_allclose(
        model.predict_interval(X[:9], 0.2, kind="quantile"),
        reference.predict_interval(mapped[:9], 0.2) + model.predict(X[:9])[:, None],
        rtol=1e-8,
        atol=1e-8,
    )


def test_the_band_widens_with_the_noise_and_covers():
    """Over many draws of a heteroscedastic design (noise sd 0.225 at x = -1.5, 0.975 at
    x = 1.5), the 80 % interval is clearly wider on the noisy side in every draw (by less
    than the noise's 4.3: y's normal-reference width adds its own spread), and covers
    between 74 % and 90 % of new points (its residuals' smoothing widens it a little)."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-2.0, 2.0, 300)
        y = x + (0.6 + 0.25 * x) * rng.normal(size=300)
        model = nbattn.NadarayaWatsonRegressor(bandwidth=0.4).fit(x[:, None], y)
        band = model.predict_interval(np.array([[-1.5], [1.5]]), 0.2, kind="quantile")
        width = band[:, 1] - band[:, 0]
        assert width[1] > 1.4 * width[0]
        x_new = rng.uniform(-2.0, 2.0, 1000)
        y_new = x_new + (0.6 + 0.25 * x_new) * rng.normal(size=1000)
        band = model.predict_interval(x_new[:, None], 0.2, kind="quantile")
        covered = np.mean((band[:, 0] <= y_new) & (y_new <= band[:, 1]))
        assert 0.74 <= covered <= 0.90, covered


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
