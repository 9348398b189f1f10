"""Tables in the estimators: column kinds, category codes, mixed kernels, sample weights,
missing values, marginal effects, prediction intervals, pipelines."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

import nbattn
from nbattn._core import columns
from nbattn.app.datasets import interval_coverage
from tests.naive import local_polynomial_exact

from ..strategies import seeds

KINDS = {"c": "continuous", "u": "unordered", "o": "ordered"}


def _frame(rng, n=60, kinds="cuo"):
    """A DataFrame whose column j has kind kinds[j] by its dtype, and a target using all."""
    data, y = {}, np.zeros(n)
    for j, kind in enumerate(kinds):
        name = f"{kind}{j}"
        if kind == "c":
            x = rng.normal(size=n)
            data[name], y = x, y + np.sin(x)
        elif kind == "u":
            codes = rng.integers(0, 3, n)
            data[name] = np.array(["red", "green", "blue"])[codes]
            y = y + (codes == 1)
        else:
            codes = rng.integers(0, 4, n)
            data[name] = pd.Categorical.from_codes(codes, ["xs", "s", "m", "l"], ordered=True)
            y = y + 0.3 * codes
    return pd.DataFrame(data), y + 0.1 * rng.normal(size=n)


def _reference(model, frame_or_codes, degree=0):
    """The plain-NumPy fit of a fitted model at already-encoded queries: (fit (n, m),
    slopes (n, m, d_continuous))."""
    fit, coef, _ = local_polynomial_exact(
        frame_or_codes,
        model.X_fit_,
        model.y_fit_,
        model.bandwidth_,
        model.var_type_,
        columns.n_categories(model.categories_),
        degree,
        kernel=model.kernel if model.kernel != "average" else "gaussian",
        sample_weight=model.sample_weight_,
    )
    return fit, np.swapaxes(coef[:, 1:, :], 1, 2)


# ----------------------------------------------------------------------------- column kinds


def test_kinds_from_dtypes():
    frame = pd.DataFrame(
        {
            "num": [1.0, 2.0, 3.0],
            "int": [1, 2, 3],
            "text": ["a", "b", "a"],
            "string": pd.array(["x", "y", "x"], dtype="string"),
            "flag": [True, False, True],
            "cat": pd.Categorical(["p", "q", "p"]),
            "ordered": pd.Categorical(["lo", "hi", "lo"], ["lo", "hi"], ordered=True),
        }
    )
    assert columns.infer_var_type(frame) == "ccuuuuo"
    assert columns.infer_var_type(np.zeros((3, 4))) == "cccc"
    assert columns.resolve_var_type(frame, "ccuuuuu") == "ccuuuuu"


@pytest.mark.parametrize(
    ("var_type", "match"),
    [("cu", "2 letters but X has 3 columns"), ("cux", "holds .x."), (3, "var_type")],
)
def test_bad_var_type_is_refused(var_type, match):
    X = np.zeros((4, 3))
    with pytest.raises(ValueError, match=match):
        nbattn.NadarayaWatsonRegressor(var_type=var_type).fit(X, np.arange(4.0))


def test_categories_are_plain_lists_in_dtype_order():
    frame = pd.DataFrame(
        {
            "size": pd.Categorical(["m", "s"], ["s", "m", "l"], ordered=True),
            "city": ["Paris", "Oslo"],
            "code": np.array([3, 1]),
        }
    )
    model = nbattn.NadarayaWatsonRegressor(var_type="ouu").fit(frame, [1.0, 2.0])
    assert model.categories_ == [["s", "m", "l"], ["Oslo", "Paris"], [1, 3]]
    assert all(type(v) in (str, int) for c in model.categories_ for v in c)
    np.testing.assert_array_equal(model.X_fit_, [[1, 1, 1], [0, 0, 0]])


def test_text_in_a_continuous_column_names_the_column():
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "town": ["a", "b", "c"]})
    with pytest.raises(ValueError, match="column 'town' holds text.*'a' in row 0, counting from 0"):
        nbattn.NadarayaWatsonRegressor(var_type="cc").fit(frame, [1.0, 2.0, 3.0])


def test_unseen_category_names_column_and_value(rng):
    frame, y = _frame(rng, kinds="cu")
    model = nbattn.NadarayaWatsonRegressor().fit(frame, y)
    query = frame.iloc[:2].copy()
    query.iloc[1, 1] = "purple"
    with pytest.raises(ValueError, match="column 'u1' holds the category 'purple' .row 1."):
        model.predict(query)


def test_ignored_unseen_category_leaves_its_column_out(rng):
    """handle_unknown='ignore': every key gets the same mismatch weight in that column,
    which cancels in the softmax: the fit equals the product kernel without that column."""
    frame, y = _frame(rng, kinds="cuo")
    model = nbattn.NadarayaWatsonRegressor(handle_unknown="ignore").fit(frame, y)
    query = frame.iloc[:5].copy()
    query["u1"] = "purple"
    codes = model.X_fit_[:5].copy()
    codes[:, 1] = np.nan  # the reference leaves a NaN column out
    want = _reference(model, codes)[0][:, 0]
    np.testing.assert_allclose(model.predict(query), want, rtol=1e-10)


def test_inputs_are_not_modified(rng):
    frame, y = _frame(rng, kinds="cuo")
    before, y_before = frame.copy(), y.copy()
    model = nbattn.LocalPolynomialRegressor(bandwidth="scott").fit(frame, y)
    model.predict(frame)
    pd.testing.assert_frame_equal(frame, before)
    np.testing.assert_array_equal(y, y_before)


# ----------------------------------------------------------------------------- mixed fits


@settings(max_examples=15)
@given(
    kinds=st.text(alphabet="cuo", min_size=1, max_size=4),
    n=st.integers(5, 40),
    seed=seeds,
    kernel=st.sampled_from(["gaussian", "epanechnikov", "tricube"]),
)
def test_mixed_regressor_matches_naive(kinds, n, seed, kernel):
    rng = np.random.default_rng(seed)
    frame, y = _frame(rng, n=n, kinds=kinds)
    model = nbattn.NadarayaWatsonRegressor(kernel=kernel).fit(frame, y)
    assert model.var_type_ == kinds
    if kernel != "gaussian":
        # compact kernels: keep every query inside some key's support (the naive
        # reference has no nearest-key fallback)
        model.bandwidth_ = np.where(np.array(list(kinds)) == "c", 50.0, model.bandwidth_)
    want = _reference(model, model.X_fit_)[0][:, 0]
    np.testing.assert_allclose(model.predict(frame), want, rtol=1e-9, atol=1e-12)


@settings(max_examples=10)
@given(kinds=st.text(alphabet="cuo", min_size=1, max_size=3), seed=seeds)
def test_local_linear_matches_naive(kinds, seed):
    rng = np.random.default_rng(seed)
    frame, y = _frame(rng, n=40, kinds="c" + kinds)
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth="scott").fit(frame, y)
    fit, slopes = _reference(model, model.X_fit_[:8], degree=1)
    np.testing.assert_allclose(model.predict(frame.iloc[:8]), fit[:, 0], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(
        model.marginal_effects(frame.iloc[:8]), slopes[:, 0, :], rtol=1e-6, atol=1e-8
    )


def test_mixed_classifier_matches_naive(rng):
    frame, y = _frame(rng, n=80, kinds="cuo")
    labels = np.where(y > np.median(y), "high", "low")
    model = nbattn.NadarayaWatsonClassifier().fit(frame, labels)
    proba = model.predict_proba(frame)
    want = _reference(model, model.X_fit_)[0]
    np.testing.assert_allclose(proba, want, rtol=1e-9, atol=1e-12)
    assert np.mean(model.predict(frame) == labels) > 0.8


def test_all_numeric_frame_keeps_the_fast_path(rng):
    """A numeric DataFrame and its array give the same model, on the streaming kernel."""
    X = rng.normal(size=(50, 2))
    y = X[:, 0] ** 2
    frame = pd.DataFrame(X, columns=["a", "b"])
    from_frame = nbattn.NadarayaWatsonRegressor().fit(frame, y)
    from_array = nbattn.NadarayaWatsonRegressor().fit(X, y)
    assert not from_frame._uses_engine()
    # (a DataFrame converts to a Fortran-ordered array: sums may differ in the last bit)
    np.testing.assert_allclose(from_frame.predict(frame), from_array.predict(X), rtol=1e-14)
    want = nbattn.nadaraya_watson(X, X, y, from_array.bandwidth_)
    np.testing.assert_allclose(from_array.predict(X), want, rtol=1e-14)


# ----------------------------------------------------------------------------- weights


@pytest.mark.parametrize(
    "make",
    [
        lambda: nbattn.NadarayaWatsonRegressor(),
        lambda: nbattn.NadarayaWatsonRegressor(bandwidth="silverman", kernel="tricube"),
        lambda: nbattn.LocalPolynomialRegressor(bandwidth="scott"),
        lambda: nbattn.NadarayaWatsonRegressor(var_type="cu"),
    ],
)
def test_integer_weights_equal_repeated_rows(make):
    """Over many draws: at given widths, weights 0..3 give the model of the rows repeated that
    often. (The rules' widths differ: they count Kish's effective rows, (sum w)^2 / sum w^2,
    so that they do not change when every weight is multiplied by one constant, and rows
    given twice are more rows than a weight of 2; tests/estimators/test_width_rules.py.)"""
    rng = np.random.default_rng(7)
    for _ in range(10):
        n = int(rng.integers(6, 30))
        X = np.column_stack([rng.normal(size=n), rng.integers(0, 3, n)])
        y = X[:, 0] + X[:, 1] + rng.normal(0, 0.1, n)
        w = rng.integers(0, 4, n)
        w[0] = 1
        weighted = make().fit(X, y, sample_weight=w)
        repeated = make().set_params(bandwidth=weighted.bandwidth_)
        repeated.fit(np.repeat(X, w, axis=0), np.repeat(y, w))
        # the local solve's relative ridge (1e-12) sees the weighted and repeated moment
        # matrices through different roundings: agreement to about 1e-12 x its condition
        kept = X[w > 0]  # a category seen only in rows of weight 0 is unseen
        np.testing.assert_allclose(weighted.predict(kept), repeated.predict(kept), rtol=1e-7)


def test_weighted_classifier_equals_repeated_rows(rng):
    X = rng.normal(size=(30, 2))
    labels = np.where(X[:, 0] > 0, "a", "b")
    w = rng.integers(0, 3, 30)
    w[:2] = 1
    weighted = nbattn.NadarayaWatsonClassifier().fit(X, labels, sample_weight=w)
    repeated = nbattn.NadarayaWatsonClassifier(bandwidth=weighted.bandwidth_)
    repeated.fit(np.repeat(X, w, axis=0), np.repeat(labels, w))
    np.testing.assert_allclose(weighted.predict_proba(X), repeated.predict_proba(X), rtol=1e-9)


@pytest.mark.parametrize("bad, match", [(-1.0, "(?i)negative"), (np.nan, "NaN")])
def test_bad_sample_weight_is_refused(rng, bad, match):
    X = rng.normal(size=(5, 1))
    w = np.ones(5)
    w[2] = bad
    with pytest.raises(ValueError, match=match):
        nbattn.NadarayaWatsonRegressor().fit(X, X[:, 0], sample_weight=w)


def test_weighted_spread_matches_weighted_moments(rng):
    X = rng.normal(size=(25, 1))
    y = X[:, 0] + rng.normal(size=25)
    w = rng.uniform(0.5, 3, 25)
    model = nbattn.NadarayaWatsonRegressor().fit(X, y, sample_weight=w)
    mean, std = model.predict(X[:6], return_std=True)
    weights = model.attention_weights(X[:6])
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(mean, weights @ y, rtol=1e-10)
    want = np.sqrt(np.sum(weights * (y[None, :] - mean[:, None]) ** 2, axis=1))
    np.testing.assert_allclose(std, want, rtol=1e-8)


# ----------------------------------------------------------------------------- missing values


def test_missing_value_error_names_column_and_row(rng):
    frame, y = _frame(rng, kinds="cu")
    frame.iloc[4, 1] = None
    missing = r"column 'u1' has a missing value .* in row 4 \(counting from 0\)"
    with pytest.raises(ValueError, match=missing):
        nbattn.NadarayaWatsonRegressor().fit(frame, y)


def test_marginalize_leaves_the_column_out_of_that_pair(rng):
    frame, y = _frame(rng, n=50, kinds="cuc")
    frame.iloc[3, 0] = np.nan
    frame.iloc[7, 1] = None
    model = nbattn.NadarayaWatsonRegressor(missing="marginalize").fit(frame, y)
    assert len(model.X_fit_) == 50 and np.isnan(model.X_fit_[3, 0])
    query = frame.iloc[:10].copy()
    query.iloc[0, 2] = np.nan
    codes = model.X_fit_[:10].copy()
    codes[0, 2] = np.nan
    want = _reference(model, codes)[0][:, 0]
    np.testing.assert_allclose(model.predict(query), want, rtol=1e-9)


# ----------------------------------------------------------------------------- marginal effects


def test_nadaraya_watson_marginal_effects_are_the_derivative(rng):
    """Exact slopes of the Gaussian pooling against central differences of predict and
    the engine's analytic degree-0 gradient, for the fast path and a mixed table."""
    frame, y = _frame(rng, n=60, kinds="ccu")
    for X in (frame[["c0", "c1"]], frame):
        model = nbattn.NadarayaWatsonRegressor().fit(X, y)
        slopes = model.marginal_effects(X.iloc[:6])
        assert slopes.shape == (6, 2)
        for d, name in enumerate(["c0", "c1"]):
            step = 1e-5 * model.bandwidth_[d]
            up, down = X.iloc[:6].copy(), X.iloc[:6].copy()
            up[name] += step
            down[name] -= step
            numeric = (model.predict(up) - model.predict(down)) / (2 * step)
            np.testing.assert_allclose(slopes[:, d], numeric, rtol=1e-5, atol=1e-7)
        engine = nbattn.local_polynomial(
            model._check_queries(X.iloc[:6]),
            model.X_fit_,
            model.y_fit_[:, 0],
            model.bandwidth_,
            0,
            var_type=model.var_type_,
            n_categories=columns.n_categories(model.categories_),
            return_gradient=True,
        )[1]
        np.testing.assert_allclose(slopes, engine, rtol=1e-8, atol=1e-10)


def test_local_linear_recovers_a_plane_with_categories(rng):
    frame, _ = _frame(rng, n=80, kinds="ccu")
    y = 2.0 * frame.c0 - 0.5 * frame.c1 + (frame.u2 == "red") * 3.0
    # lambda = 0: each colour its own plane, which the local-linear fit reproduces
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=[0.5, 0.5, 0.0]).fit(frame, y)
    slopes = model.marginal_effects(frame.iloc[:10])
    np.testing.assert_allclose(slopes, np.tile([2.0, -0.5], (10, 1)), atol=1e-6)


def test_marginal_effects_need_a_continuous_column(rng):
    frame, y = _frame(rng, kinds="uo")
    model = nbattn.NadarayaWatsonRegressor().fit(frame, y)
    with pytest.raises(ValueError, match="continuous column"):
        model.marginal_effects(frame)


# ----------------------------------------------------------------------------- intervals


@pytest.mark.parametrize("kind", ["mean", "observation"])
def test_interval_coverage_by_simulation(kind):
    """Over 300 simulated data sets, the 90% interval of a local-linear fit of a line
    (no smoothing bias) covers the true mean (kind="mean") or a new observation
    (kind="observation") about 90% of the time. Tolerance: 4 binomial standard
    errors of 300 independent data sets (queries within a set are correlated)."""
    draws, alpha = 300, 0.1
    coverage = interval_coverage(kind, draws=draws, alpha=alpha)
    tolerance = 4 * np.sqrt(alpha * (1 - alpha) / draws)
    assert abs(coverage - (1 - alpha)) < tolerance, coverage


def test_interval_shape_and_order(rng):
    frame, y = _frame(rng, n=50, kinds="cu")
    model = nbattn.NadarayaWatsonRegressor().fit(frame, y)
    band = model.predict_interval(frame.iloc[:5])
    fit = model.predict(frame.iloc[:5])
    assert band.shape == (5, 2)
    assert np.all(band[:, 0] < fit) and np.all(fit < band[:, 1])
    wide = model.predict_interval(frame.iloc[:5], kind="observation")
    assert np.all(wide[:, 1] - wide[:, 0] > band[:, 1] - band[:, 0])


# ----------------------------------------------------------------------------- pipelines


def test_pipeline_and_grid_search_on_a_mixed_table(rng):
    frame, y = _frame(rng, n=90, kinds="cuo")
    pipe = Pipeline([("model", nbattn.LocalPolynomialRegressor(bandwidth="scott"))])
    search = GridSearchCV(
        pipe, {"model__degree": [0, 1], "model__kernel": ["gaussian", "tricube"]}, cv=3
    ).fit(frame, y)
    assert set(search.best_params_) == {"model__degree", "model__kernel"}
    assert search.best_estimator_.named_steps["model"].var_type_ == "cuo"
    assert search.score(frame, y) > 0.5
