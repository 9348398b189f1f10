"""KernelDensity, the scikit-learn estimator of a mixed-type kernel density: draws from
the fitted density (shape, repeatability, tables, moments, category frequencies), its
argument errors, scikit-learn's checks, and agreement with the functions it wraps."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.utils.estimator_checks import check_estimator, check_fit2d_1sample

import nbattn
from nbattn.distribution.density import kernel_cdf, kernel_density
from tests import naive
from tests.distribution.test_density import kernels, mixed_cases
from tests.strategies import seeds, sizes

#: The second moment of each kernel's density (h = 1): the variance a draw adds.
KERNEL_VARIANCE = {"gaussian": 1.0, "epanechnikov": 1.0 / 5.0, "tricube": 35.0 / 243.0}


def positive_weights(case):
    """The case with its weights of 0 made 0.5 (rows of weight 0 are dropped at fit,
    test_rows_of_weight_zero_are_dropped_at_fit's subject)."""
    if case.sample_weight is None:
        return case
    return case._replace(sample_weight=np.where(case.sample_weight > 0, case.sample_weight, 0.5))


def fitted(case, kernel="gaussian"):
    """The model of the case's widths on its keys (their weights of 0 made 0.5: the
    estimator drops rows of weight 0, and with them maybe a category)."""
    case = positive_weights(case)
    model = nbattn.KernelDensity(bandwidth=case.widths, kernel=kernel, var_type=case.var_type)
    return model.fit(case.keys, sample_weight=case.sample_weight)


# --------------------------------------------------------------------------- the functions
@settings(max_examples=25)
@given(case=mixed_cases(min_count=1), kernel=kernels)
def test_the_estimator_gives_the_functions_values(case, kernel):
    """On codes 0 .. c - 1 (every one present: the estimator counts the categories it
    sees), score_samples, pdf and cdf are kernel_density (log), its exp and kernel_cdf;
    score is the sum of score_samples."""
    case = positive_weights(case)  # as fitted() fits
    args = (case.queries, case.keys, case.widths)
    common = dict(var_type=case.var_type, kernel=kernel, sample_weight=case.sample_weight)
    model = fitted(case, kernel)
    log_f = kernel_density(*args, log=True, **common)
    np.testing.assert_array_equal(model.score_samples(case.queries), log_f)
    np.testing.assert_array_equal(model.pdf(case.queries), np.exp(log_f))
    np.testing.assert_array_equal(model.cdf(case.queries), kernel_cdf(*args, **common))
    assert model.score(case.queries) == float(np.sum(model.score_samples(case.queries)))


def test_rows_of_weight_zero_are_dropped_at_fit():
    """Fitting with some weights 0 is fitting the other rows: the same rule widths, the same
    densities."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=60), rng.integers(0, 3, 60)])
    w = rng.exponential(size=60) * (rng.random(60) < 0.7)
    w[:3] = 1.0
    X[w == 0, 0] += 100  # rows that would move the spread (and the rule) if they counted
    kept = w > 0
    a = nbattn.KernelDensity(var_type="cu").fit(X, sample_weight=w)
    b = nbattn.KernelDensity(var_type="cu").fit(X[kept], sample_weight=w[kept])
    np.testing.assert_array_equal(a.bandwidth_, b.bandwidth_)
    np.testing.assert_array_equal(a.score_samples(X[kept]), b.score_samples(X[kept]))


def test_a_table_reads_as_codes_and_kinds():
    """A DataFrame with an unordered and an ordered category column is its codes with
    var_type 'cuo' (the categories' order as codes), in the densities and the CDF."""
    rng = np.random.default_rng(1)
    n = 80
    x = rng.normal(size=n)
    u = rng.integers(0, 3, n)
    o = rng.integers(0, 4, n)
    frame = pd.DataFrame(
        {
            "x": x,
            "colour": pd.Categorical.from_codes(u, ["red", "green", "blue"]),
            "size": pd.Categorical.from_codes(o, ["S", "M", "L", "XL"], ordered=True),
        }
    )
    codes = np.column_stack([x, u, o]).astype(float)
    widths = [0.4, 0.3, 0.5]
    a = nbattn.KernelDensity(bandwidth=widths).fit(frame)
    b = nbattn.KernelDensity(bandwidth=widths, var_type="cuo").fit(codes)
    assert a.var_type_ == "cuo"
    np.testing.assert_array_equal(a.score_samples(frame), b.score_samples(codes))
    np.testing.assert_array_equal(a.cdf(frame), b.cdf(codes))


# --------------------------------------------------------------------------- sample
@settings(max_examples=25)
@given(case=mixed_cases(min_count=1), n_samples=sizes(60), state=seeds)
def test_sample_shape_codes_and_repeatability(case, n_samples, state):
    """(n_samples, d) float64 rows, category codes integers in 0 .. c - 1; the same
    random_state, the same rows; another, other rows (where a continuous column makes a
    tie impossible)."""
    model = fitted(case)
    rows = model.sample(n_samples, random_state=state)
    assert rows.shape == (n_samples, case.keys.shape[1]) and rows.dtype == np.float64
    assert np.all(np.isfinite(rows))
    for c, kind in enumerate(case.var_type):
        if kind != "c":
            codes = rows[:, c]
            assert np.all(
                (codes == np.round(codes)) & (codes >= 0) & (codes < case.n_categories[c])
            )
    np.testing.assert_array_equal(model.sample(n_samples, random_state=state), rows)
    if "c" in case.var_type:
        other = (state + 1) % 2**32
        assert not np.array_equal(model.sample(n_samples, random_state=other), rows)


def test_a_table_samples_as_a_table_of_its_categories():
    """A model fitted on a DataFrame draws a DataFrame: the same columns, float64 for the
    continuous one, categoricals of the fitted categories (ordered where they were),
    each category drawn at least once in 3000 rows."""
    rng = np.random.default_rng(2)
    n = 50
    frame = pd.DataFrame(
        {
            "x": rng.normal(size=n),
            "colour": pd.Categorical(rng.choice(["red", "green", "blue"], n)),
            "size": pd.Categorical(rng.choice(["S", "M", "L"], n), ["S", "M", "L"], ordered=True),
        }
    )
    model = nbattn.KernelDensity(bandwidth=[0.5, 0.4, 0.5]).fit(frame)
    drawn = model.sample(3000, random_state=0)
    assert isinstance(drawn, pd.DataFrame) and list(drawn.columns) == list(frame.columns)
    assert drawn["x"].dtype == np.float64
    for name in ("colour", "size"):
        assert isinstance(drawn[name].dtype, pd.CategoricalDtype)
        assert list(drawn[name].cat.categories) == list(frame[name].cat.categories)
        assert drawn[name].cat.ordered == frame[name].cat.ordered
        assert drawn[name].notna().all()
        assert set(drawn[name]) == set(frame[name].cat.categories)
    pd.testing.assert_frame_equal(model.sample(3000, random_state=0), drawn)


@settings(max_examples=20)
@given(seed=seeds, n=sizes(30), kernel=kernels, weighted=st.booleans())
def test_a_1d_sample_has_the_density_mean_and_variance(seed, n, kernel, weighted):
    """20000 draws of a 1-D density: the mean is the keys' weighted mean, the variance
    their weighted variance plus h^2 times the kernel's second moment, each within 5
    standard errors."""
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=n) * rng.uniform(0.1, 10) + rng.normal() * 10
    h = float(rng.uniform(0.2, 2) * max(keys.std(), 1e-3 * abs(keys).max(), 1e-3))
    w = rng.exponential(size=n) + 0.01 if weighted else np.ones(n)
    model = nbattn.KernelDensity(bandwidth=h, kernel=kernel).fit(keys[:, None], sample_weight=w)
    draws = model.sample(20_000, random_state=seed)[:, 0]
    N = draws.size
    mean = w @ keys / w.sum()
    var = w @ (keys - mean) ** 2 / w.sum() + h**2 * KERNEL_VARIANCE[kernel]
    assert abs(draws.mean() - mean) <= 5 * math.sqrt(var / N)
    centred = draws - draws.mean()
    fourth = np.mean(centred**4)
    assert abs(centred.var() - var) <= 5 * math.sqrt(max(fourth - var**2, 0.0) / N) + 1e-12 * var


@settings(max_examples=20)
@given(seed=seeds, n=sizes((5, 30)), count=st.integers(2, 5), weighted=st.booleans())
def test_an_unordered_sample_has_the_density_marginal(seed, n, count, weighted):
    """One 'u' column (Aitchison-Aitken): the density at code v is
    P(v) = (1 - l) p_v + l / (c - 1) (1 - p_v), p_v the keys' weighted share of v; these
    sum to 1 and 20000 draws hit each v with frequency P(v) within 5 standard errors."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, count, n).astype(float)
    keys[:count] = np.arange(count)  # the model counts the categories it sees
    lam = float(rng.uniform(0, (count - 1) / count))
    w = rng.exponential(size=n) + 0.01 if weighted else np.ones(n)
    model = nbattn.KernelDensity(bandwidth=lam, var_type="u").fit(keys[:, None], sample_weight=w)
    levels = np.arange(count, dtype=float)
    share = np.array([w[keys == v].sum() for v in levels]) / w.sum()
    P = (1 - lam) * share + lam / (count - 1) * (1 - share)
    np.testing.assert_allclose(model.pdf(levels[:, None]), P, rtol=1e-12, atol=1e-15)
    assert P.sum() == pytest.approx(1.0, abs=1e-12)
    draws = model.sample(20_000, random_state=seed)[:, 0]
    freq = np.array([(draws == v).mean() for v in levels])
    assert np.all(np.abs(freq - P) <= 5 * np.sqrt(P * (1 - P) / draws.size) + 1e-12)


@settings(max_examples=20)
@given(seed=seeds, n=sizes((5, 30)), count=st.integers(2, 5), weighted=st.booleans())
def test_an_ordered_sample_follows_the_pdf_over_the_codes(seed, n, count, weighted):
    """One 'o' column (Wang-van Ryzin, which sums to less than 1 over c codes): the
    frequency of v is the pdf normalised over the codes, sum_j w_j L(v, x_j) / sum_u
    sum_j w_j L(u, x_j), within 5 standard errors over 20000 draws."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, count, n).astype(float)
    keys[:count] = np.arange(count)
    lam = float(rng.uniform(0, 0.99))
    w = rng.exponential(size=n) + 0.01 if weighted else np.ones(n)
    model = nbattn.KernelDensity(bandwidth=lam, var_type="o").fit(keys[:, None], sample_weight=w)
    levels = np.arange(count, dtype=float)
    L = naive._category_pdf("o", levels[None, :], keys[:, None], lam, count)
    P = w @ L
    P = P / P.sum()
    draws = model.sample(20_000, random_state=seed)[:, 0]
    freq = np.array([(draws == v).mean() for v in levels])
    assert np.all(np.abs(freq - P) <= 5 * np.sqrt(P * (1 - P) / draws.size) + 1e-12)


def test_an_array_sample_lies_where_the_data_lie():
    """A model fitted on an array whose unordered column holds the labels 2.0 and 5.0:
    its draws hold those labels, and score_samples takes them."""
    rng = np.random.default_rng(4)
    X = np.column_stack([rng.normal(size=30), np.where(np.arange(30) % 2, 5.0, 2.0)])
    model = nbattn.KernelDensity(var_type="cu").fit(X)
    drawn = model.sample(200, random_state=0)
    assert set(np.unique(drawn[:, 1])) <= {2.0, 5.0}
    assert np.all(np.isfinite(model.score_samples(drawn)))


# --------------------------------------------------------------------------- errors
X2 = np.random.default_rng(3).normal(size=(20, 2))
XU = np.column_stack([X2[:, 0], np.arange(20) % 3])


@pytest.mark.parametrize(
    ("params", "X", "match"),
    [
        (dict(bandwidth="scott_rule"), X2, "bandwidth"),
        (dict(bandwidth=-1.0), X2, "bandwidth"),
        (dict(bandwidth=[1.0, -0.5]), X2, "bandwidth"),
        (dict(bandwidth=[1.0, 0.0]), X2, "bandwidth"),
        (dict(bandwidth=[1.0, 1.0, 1.0]), X2, "bandwidth"),
        (dict(bandwidth=[1.0, 0.7], var_type="cu"), XU, r"bandwidth\[1\]"),
        (dict(bandwidth=[1.0, -0.1], var_type="cu"), XU, r"bandwidth\[1\]"),
        (dict(bandwidth=[1.0, 1.0], var_type="co"), XU, r"bandwidth\[1\]"),
        (dict(bandwidth="cv_ml"), X2[:1], "cv_ml"),
        (dict(kernel="cosine"), X2, "kernel"),
        (dict(var_type="cuc"), X2, "var_type"),
        (dict(), np.where(np.arange(40).reshape(20, 2) == 7, np.nan, X2), "NaN"),
    ],
)
def test_fit_errors_name_the_argument(params, X, match):
    with pytest.raises(ValueError, match=match):
        nbattn.KernelDensity(**params).fit(X)


def test_bad_sample_weight_is_named():
    with pytest.raises(ValueError, match="sample_weight"):
        nbattn.KernelDensity().fit(X2, sample_weight=-np.ones(20))
    with pytest.raises(ValueError, match="sample_weight"):
        nbattn.KernelDensity().fit(X2, sample_weight=np.ones(19))


@pytest.mark.parametrize("n_samples", [0, -3, 2.5, True, "10"])
def test_sample_needs_a_positive_int(n_samples):
    model = nbattn.KernelDensity().fit(X2)
    with pytest.raises(ValueError, match="n_samples"):
        model.sample(n_samples)


def test_score_time_errors_are_clear():
    """NaN in X, the wrong number of columns, a code beyond the fitted categories, and a
    DataFrame category unseen at fit: each a ValueError that says what is wrong."""
    model = nbattn.KernelDensity(var_type="cu").fit(XU)
    with pytest.raises(ValueError, match="(?i)missing value|nan"):
        model.score_samples(np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="feature"):
        model.score_samples(np.zeros((1, 3)))
    for method in (model.score_samples, model.cdf):
        with pytest.raises(ValueError, match="categor"):
            method(np.array([[0.0, 3.0]]))
    frame = pd.DataFrame({"x": X2[:, 0], "g": pd.Categorical(np.where(X2[:, 1] > 0, "a", "b"))})
    fitted_frame = nbattn.KernelDensity().fit(frame)
    unseen = pd.DataFrame({"x": [0.0], "g": pd.Categorical(["c"])})
    with pytest.raises(ValueError, match="'c'.*not seen at fit"):
        fitted_frame.score_samples(unseen)


def test_the_advice_of_input_errors_can_be_followed():
    """Every keyword an unseen category's or a missing value's error suggests is a
    parameter of the density models (they have neither handle_unknown nor missing)."""
    frame = pd.DataFrame({"x": X2[:, 0], "g": pd.Categorical(np.where(X2[:, 1] > 0, "a", "b"))})
    model = nbattn.KernelDensity().fit(frame)
    y = X2[:, 0] + 1.0
    conditional = nbattn.ConditionalKernelDensity(bandwidth=[0.5, 0.3], y_bandwidth=0.4)
    conditional.fit(frame, y)
    bad = [
        pd.DataFrame({"x": [0.0], "g": pd.Categorical(["c"])}),
        pd.DataFrame({"x": [0.0], "g": pd.Categorical([None], categories=["a", "b"])}),
    ]
    for queries in bad:
        for method in (model.score_samples, lambda q: conditional.pdf(q, [1.0])):
            with pytest.raises(ValueError) as error:
                method(queries)
            for option in ("handle_unknown", "missing"):
                if f"{option}=" in str(error.value):
                    assert option in model.get_params()


# --------------------------------------------------------------------------- scikit-learn
@pytest.mark.parametrize(
    "estimator",
    [nbattn.KernelDensity(), nbattn.KernelDensity(bandwidth=0.7, kernel="epanechnikov")],
    ids=["default", "epanechnikov"],
)
def test_scikit_learn_checks(estimator):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # SkipTestWarning and kin
        check_estimator(estimator)


def test_scikit_learn_one_sample_check_with_cv_ml():
    check_fit2d_1sample("KernelDensity", nbattn.KernelDensity(bandwidth="cv_ml"))
