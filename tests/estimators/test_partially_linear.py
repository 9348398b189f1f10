"""PartiallyLinearRegressor: Robinson's double residual against a brute force, statsmodels'
OLS where z carries nothing, coverage of its intervals, repeatability, model files and
bad input."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

import nbattn
from nbattn.persistence.predictor import read_predictor
from tests import naive

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BETA = np.array([1.5, -2.0])


def _data(rng, n, hetero=True):
    """X = [x1, z, x2], x correlated with z; y = 1.5 x1 - 2 x2 + sin(2 z) + e."""
    z = rng.uniform(-2.0, 2.0, n)
    x1 = z + rng.normal(size=n)
    x2 = np.cos(z) + rng.normal(size=n)
    sd = 0.5 * (1.0 + 0.5 * np.abs(z)) if hetero else 0.5
    y = x1 * BETA[0] + x2 * BETA[1] + np.sin(2.0 * z) + rng.normal(size=n) * sd
    return np.column_stack([x1, z, x2]), y


def test_coverage_of_the_hc0_interval_within_binomial_limits():
    """beta +- 1.96 se covers the true beta in about 95 % of simulated data sets."""
    rng = np.random.default_rng(20)
    reps, n = 300, 120
    covered = 0
    for _ in range(reps):
        X, y = _data(rng, n)
        model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.35).fit(X, y)
        covered += int(np.sum(np.abs(model.coef_ - BETA) <= 1.96 * model.coef_se_))
    low, high = stats.binom.interval(0.99, 2 * reps, 0.95)
    assert low <= covered <= high, (covered, low, high)


@pytest.mark.parametrize("weighted", [False, True])
def test_without_signal_in_z_and_one_width_for_all_it_is_ols_with_an_intercept(weighted):
    """Degree 0 at a huge width: every leave-one-out fit is the mean of the other rows,
    (y_i - ybar) n / (n - 1), one factor on y~ and x~ alike, so beta and its HC0 standard
    errors are those of the OLS of y on [x_lin, 1] (statsmodels, cov_type="HC0"); with
    weights the factors differ per row, and beta and se are WLS's up to O(1/n)."""
    rng = np.random.default_rng(5)
    for _ in range(4):
        X, y = _data(rng, 40)
        sw = rng.uniform(0.5, 2.0, 40) if weighted else None
        model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], degree=0, bandwidth=1e8)
        model.fit(X, y, sample_weight=sw)
        design = np.column_stack([X[:, [0, 2]], np.ones(40)])
        if weighted:
            ref = sm.WLS(y, design, weights=sw).fit(cov_type="HC0")
            np.testing.assert_allclose(model.coef_, ref.params[:2], rtol=0.1)
            np.testing.assert_allclose(model.coef_se_, ref.bse[:2], rtol=0.2)
        else:
            ref = sm.OLS(y, design).fit(cov_type="HC0")
            np.testing.assert_allclose(model.coef_, ref.params[:2], rtol=1e-9)
            np.testing.assert_allclose(model.coef_se_, ref.bse[:2], rtol=1e-9)


def _brute_force(X, y, lin, widths, kinds, counts, degree, sw, queries):
    """Robinson's steps with numpy: leave-one-out local polynomials (tests.naive), the
    WLS slope, the HC0 sandwich, g at the queries."""
    z = [j for j in range(X.shape[1]) if j not in lin]
    Z = X[:, z]
    targets = np.column_stack([y, X[:, lin]])
    fits = np.column_stack(
        [
            naive.local_polynomial_exact(
                Z,
                Z,
                targets[:, k],
                widths[k],
                kinds,
                counts,
                degree,
                sample_weight=sw,
                exclude_self=True,
            )[0]
            for k in range(targets.shape[1])
        ]
    )
    r = targets - fits
    s = np.ones(len(y)) if sw is None else sw
    xt, yt = r[:, 1:], r[:, 0]
    A = xt.T @ (s[:, None] * xt)
    beta = np.linalg.solve(A, xt.T @ (s * yt))
    e = yt - xt @ beta
    meat = (xt * (s * e)[:, None]).T @ (xt * (s * e)[:, None])
    cov = np.linalg.solve(A, np.linalg.solve(A, meat).T)
    g = naive.local_polynomial_exact(
        queries[:, z], Z, y - X[:, lin] @ beta, widths[0], kinds, counts, degree, sample_weight=sw
    )[0]
    return beta, np.sqrt(np.diag(cov)), queries[:, lin] @ beta + g


@pytest.mark.parametrize("degree", [0, 1])
def test_against_a_numpy_brute_force_with_a_categorical_z(degree):
    rng = np.random.default_rng(degree)
    n = 50
    X, y = _data(rng, n)
    colour = rng.integers(0, 3, n)
    y = y + 0.7 * colour
    X = np.column_stack([X, colour])
    sw = rng.uniform(0.2, 3.0, n)
    widths = np.array([0.6, 0.3])
    model = nbattn.PartiallyLinearRegressor(
        linear_columns=[2, 0], degree=degree, bandwidth=widths, var_type="cccu"
    ).fit(X, y, sample_weight=sw)
    queries = X[:7] + np.array([0.1, -0.2, 0.3, 0.0])
    beta, se, pred = _brute_force(X, y, [2, 0], [widths] * 3, "cu", [0, 3], degree, sw, queries)
    np.testing.assert_allclose(model.coef_, beta, rtol=1e-9)
    np.testing.assert_allclose(model.coef_se_, se, rtol=1e-9)
    np.testing.assert_allclose(model.predict(queries), pred, rtol=1e-9, atol=1e-12)
    assert model.linear_columns_.tolist() == [2, 0]


def test_loo_searches_each_regression_as_the_local_polynomial_regressor_does():
    rng = np.random.default_rng(9)
    X, y = _data(rng, 60)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2]).fit(X, y)
    Z = X[:, [1]]
    for target, widths in zip((y, X[:, 0], X[:, 2]), (model.bandwidth_, *model.linear_bandwidths_)):
        alone = nbattn.LocalPolynomialRegressor().fit(Z, target)
        np.testing.assert_array_equal(widths, alone.bandwidth_)


def test_fit_twice_gives_the_same_bits_and_inputs_are_not_modified():
    rng = np.random.default_rng(1)
    X, y = _data(rng, 60)
    X0, y0 = X.copy(), y.copy()
    a = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth="loo_scale").fit(X, y)
    b = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth="loo_scale").fit(X, y)
    for name in ("coef_", "coef_se_", "bandwidth_", "linear_bandwidths_"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes()
    assert a.predict(X).tobytes() == b.predict(X).tobytes()
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)


@pytest.mark.parametrize("power", [-900, 900])
def test_extreme_magnitudes_scale_exactly(power):
    """y times 2**power: coef_, coef_se_ and predictions times 2**power, to the bit."""
    rng = np.random.default_rng(2)
    X, y = _data(rng, 40)
    base = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.5).fit(X, y)
    big = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.5)
    big.fit(X, np.ldexp(y, power))
    np.testing.assert_array_equal(big.coef_, np.ldexp(base.coef_, power))
    np.testing.assert_array_equal(big.coef_se_, np.ldexp(base.coef_se_, power))
    np.testing.assert_allclose(big.predict(X), np.ldexp(base.predict(X), power), rtol=1e-12)


def test_coefficients_beyond_float64_are_an_error():
    rng = np.random.default_rng(2)
    X, y = _data(rng, 40)
    X[:, [0, 2]] *= 1e-300
    with pytest.raises(ValueError, match="beyond float64's range"):
        nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.5).fit(X, y * 1e300)


def test_model_file_round_trip_and_predictor(tmp_path):
    rng = np.random.default_rng(4)
    X, y = _data(rng, 50)
    frame = pd.DataFrame({"x1": X[:, 0], "z": X[:, 1], "x2": X[:, 2]})
    frame["colour"] = pd.Categorical(rng.choice(["red", "blue"], 50))
    model = nbattn.PartiallyLinearRegressor(linear_columns=["x2", "x1"], bandwidth="scott")
    model.fit(frame, y, sample_weight=rng.uniform(0.5, 2.0, 50))
    path = nbattn.save(model, tmp_path / "pl.npz")
    loaded = nbattn.load(path)
    predictor, _ = read_predictor(path)
    want = model.predict(frame)
    assert loaded.predict(frame).tobytes() == want.tobytes()
    assert predictor.predict(frame).tobytes() == want.tobytes()
    np.testing.assert_array_equal(loaded.coef_, model.coef_)
    with pytest.raises(AttributeError, match="marginal_effects"):
        predictor.marginal_effects(frame)
    text = str(model.summary())
    assert "x2" in text and "se (HC0)" in text


def test_summary_table():
    rng = np.random.default_rng(6)
    X, y = _data(rng, 60)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.4).fit(X, y)
    table = model.summary().coefficients
    np.testing.assert_array_equal(table["t"], model.coef_ / model.coef_se_)
    np.testing.assert_allclose(
        table["p_value"], 2 * stats.norm.sf(np.abs(model.coef_ / model.coef_se_)), rtol=1e-12
    )


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        (None, "needs linear_columns"),
        ([], "linear_columns is empty"),
        ([5], "linear_columns: position 5 is out of range"),
        (["x9"], "linear_columns: 'x9' is not a column"),
        ([0, "z"], "linear_columns: 'z' is not a column"),
        ([0, 0.5], "linear_columns holds 0.5"),
        ([0, 0], "twice"),
        ([0, 1, 2], "every column"),
    ],
)
def test_bad_linear_columns(columns, match):
    X, y = _data(np.random.default_rng(0), 30)
    with pytest.raises(ValueError, match=match):
        nbattn.PartiallyLinearRegressor(linear_columns=columns, bandwidth=0.5).fit(X, y)


def test_unidentified_and_categorical_linear_columns_are_refused():
    rng = np.random.default_rng(0)
    X, y = _data(rng, 40)
    model = nbattn.PartiallyLinearRegressor(linear_columns=[0], bandwidth=0.5)
    with pytest.raises(ValueError, match="constant"):
        model.fit(np.column_stack([np.full(40, 3.0), X[:, 1]]), y)
    with pytest.raises(ValueError, match="function of z"):  # a local line reproduces z
        model.fit(np.column_stack([2.0 * X[:, 1] + 1.0, X[:, 1]]), y)
    collinear = np.column_stack([X[:, 0], X[:, 1], 2.0 * X[:, 0] - X[:, 1]])
    with pytest.raises(ValueError, match="collinear"):
        nbattn.PartiallyLinearRegressor(linear_columns=[0, 2], bandwidth=0.5).fit(collinear, y)
    frame = pd.DataFrame({"z": X[:, 1], "c": pd.Categorical(rng.choice(["a", "b"], 40))})
    with pytest.raises(ValueError, match="is categorical"):
        nbattn.PartiallyLinearRegressor(linear_columns=["c"], bandwidth=0.5).fit(frame, y)
    with pytest.raises(ValueError, match="1d array"):
        model.fit(X, np.column_stack([y, y]))


def test_missing_values_are_marginalised_in_z_only_and_edited_files_are_refused():
    from nbattn.persistence.predictor import Predictor

    rng = np.random.default_rng(8)
    X, y = _data(rng, 40)
    model = nbattn.PartiallyLinearRegressor(
        linear_columns=[0, 2], bandwidth=0.5, missing="marginalize"
    ).fit(X, y)
    queries = X[:3].copy()
    queries[1, 1] = np.nan
    assert np.isfinite(model.predict(queries)).all()
    queries[2, 0] = np.nan
    with pytest.raises(ValueError, match="linear column 0 at row 2"):
        model.predict(queries)
    params = model.get_params()
    state = {k: v for k, v in vars(model).items() if k not in params}
    for name, value, match in [
        ("linear_columns_", np.array([0, 1, 2]), "linear_columns_ must hold"),
        ("coef_", np.array([1.0]), "coef_ has shape"),
        ("coef_se_", np.array([-1.0, 1.0]), "non-negative"),
        ("linear_bandwidths_", np.zeros((2, 1)), "linear_bandwidths_"),
    ]:
        with pytest.raises(ValueError, match=match):
            Predictor("PartiallyLinearRegressor", params, {**state, name: value})
