"""Review of PartiallyLinearRegressor: the edges a hostile or new user reaches (a width
array of X's length instead of z's, coefficients below float64's range, two rows, an
interrupted fit, unseen categories through the model file) and the coverage of its
intervals at leave-one-out widths."""

from unittest import mock

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import nbattn
import nbattn.estimators.partially_linear as partially_linear
from nbattn.persistence.predictor import read_predictor

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BETA = np.array([1.5, -2.0])


def _data(rng, n):
    """X = [x1, z, x2], x correlated with z; y = 1.5 x1 - 2 x2 + sin(2 z) + e,
    heteroskedastic e."""
    z = rng.uniform(-2.0, 2.0, n)
    x1 = z + rng.normal(size=n)
    x2 = np.cos(z) + rng.normal(size=n)
    sd = 0.5 * (1.0 + 0.5 * np.abs(z))
    y = x1 * BETA[0] + x2 * BETA[1] + np.sin(2.0 * z) + rng.normal(size=n) * sd
    return np.column_stack([x1, z, x2]), y


def test_a_width_array_counts_z_columns_and_says_so():
    """An array bandwidth holds one width per z column; one per column of X is refused
    with a message naming z's columns (it used to speak of 'the data' having 1 column)."""
    X, y = _data(np.random.default_rng(0), 30)
    frame = pd.DataFrame(X, columns=["x1", "z", "x2"])
    model = nbattn.PartiallyLinearRegressor(linear_columns=["x1", "x2"], bandwidth=[0.5] * 3)
    with pytest.raises(ValueError, match=r"3 widths but z has 1 \(X's column 'z'"):
        model.fit(frame, y)
    ok = model.set_params(bandwidth=np.array([0.5])).fit(frame, y)
    assert ok.bandwidth_.tolist() == [0.5]


def test_coefficients_below_float64_are_an_error_not_zero():
    """x near 1e300 and y near 1e-300: beta near 1e-600 reads 0 in float64; an error, not
    a coefficient and standard error of exactly 0. Within range, the scaling is exact."""
    rng = np.random.default_rng(3)
    X, y = _data(rng, 40)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.5)
    base = model.fit(X, y)
    coef, se = base.coef_.copy(), base.coef_se_.copy()
    big = X.copy()
    big[:, [0, 2]] = np.ldexp(big[:, [0, 2]], 1000)
    with pytest.raises(ValueError, match="below float64's range"):
        model.fit(big, np.ldexp(y, -1000))
    model.fit(big, np.ldexp(y, -20))  # beta near 2**-1020: subnormal, still exact
    np.testing.assert_array_equal(model.coef_, np.ldexp(coef, -1020))
    np.testing.assert_array_equal(model.coef_se_, np.ldexp(se, -1020))


def test_two_rows_are_refused():
    """Each of two rows' leave-one-out fit is the other row: the least squares is exact
    and the standard error 0 (was returned as 2e-16 or 0); three rows fit."""
    X, y = _data(np.random.default_rng(1), 3)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0], bandwidth=0.5)
    with pytest.raises(ValueError, match="at least 3 samples"):
        model.fit(X[:2, :2], y[:2])
    with pytest.raises(ValueError, match="at least 3 samples"):
        model.fit(X[:, :2], y, sample_weight=np.array([1.0, 0.0, 2.0]))
    assert np.isfinite(model.fit(X[:, :2], y).coef_).all()


def test_an_interrupted_refit_leaves_the_fitted_model_as_it_was():
    rng = np.random.default_rng(2)
    X, y = _data(rng, 30)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.5).fit(X, y)
    before = {k: np.asarray(v).tobytes() for k, v in vars(model).items() if k.endswith("_")}
    want = model.predict(X[:5])
    with mock.patch.object(partially_linear, "_sandwich", side_effect=KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            model.fit(X[:20], y[:20] * 3.0)
    after = {k: np.asarray(v).tobytes() for k, v in vars(model).items() if k.endswith("_")}
    assert after == before
    assert model.predict(X[:5]).tobytes() == want.tobytes()


def test_unseen_categories_in_z_through_the_model_file(tmp_path):
    """handle_unknown="ignore": an unseen category of a z column gets the mismatch
    weight, the same bits from the estimator, the loaded model and the Predictor; a
    missing value in a linear column is refused at predict with its name."""
    rng = np.random.default_rng(4)
    X, y = _data(rng, 40)
    colour = rng.choice(["red", "blue", "green"], 40)
    frame = pd.DataFrame({"x1": X[:, 0], "z": X[:, 1], "c": pd.Categorical(colour)})
    frame["x2"] = X[:, 2]
    model = nbattn.PartiallyLinearRegressor(
        linear_columns=["x2", "x1"], handle_unknown="ignore", missing="marginalize"
    ).fit(frame, y + (colour == "red"))
    queries = frame.iloc[:4].copy()
    queries["c"] = pd.Categorical(["purple", "red", "blue", "grey"])
    queries.loc[2, "z"] = np.nan
    want = model.predict(queries)
    assert np.isfinite(want).all()
    path = nbattn.save(model, tmp_path / "pl.npz")
    predictor, _ = read_predictor(path)
    assert nbattn.load(path).predict(queries).tobytes() == want.tobytes()
    assert predictor.predict(queries).tobytes() == want.tobytes()
    queries.loc[3, "x1"] = np.nan
    with pytest.raises(ValueError, match="linear column 0 at row 3"):
        predictor.predict(queries)


def test_coverage_at_leave_one_out_widths():
    """beta +- 1.96 se covers the true beta near 95 % of the time with the widths
    searched per regression ("loo"), not only at fixed widths (99 % binomial limits)."""
    rng = np.random.default_rng(11)
    reps, n = 60, 80
    covered = 0
    for _ in range(reps):
        X, y = _data(rng, n)
        model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2]).fit(X, y)
        covered += int(np.sum(np.abs(model.coef_ - BETA) <= 1.96 * model.coef_se_))
    low, high = stats.binom.interval(0.99, 2 * reps, 0.95)
    assert low <= covered <= high, (covered, low, high)


def test_too_few_rows_for_the_linear_columns_are_refused():
    """p linear columns need p + 2 rows: with p + 1 the leave-one-out residuals (one
    dimension fewer, as they nearly sum to 0) are fitted exactly and se would read 0."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3, 3))
    y = rng.normal(size=3)
    with pytest.raises(ValueError, match="needs at least 4 samples for 2 linear column"):
        nbattn.PartiallyLinearRegressor(linear_columns=[0, 1], bandwidth=0.5).fit(X, y)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0], bandwidth=0.5).fit(X, y)
    assert model.coef_se_[0] > 0
