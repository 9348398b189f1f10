"""The width rules with sample weights and at the ends of the smoothing's range: widths
that do not depend on the weights' total, and a categorical l strictly inside its domain."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.estimators.widths import effective_size, weighted_rule_bandwidth
from nbattn.local.problem import check_widths, lambda_max, rule_lambdas
from tests.naive import product_kernel_matrix

from ..strategies import seeds

RULES = ("scott", "silverman")

#: estimator factories by name: the Gaussian fast path, the engine (another kernel, a
#: local polynomial, categorical columns), the classifier
MAKERS = {
    "nw": lambda rule, kinds: nbattn.NadarayaWatsonRegressor(bandwidth=rule, var_type=kinds),
    "nw_tricube": lambda rule, kinds: nbattn.NadarayaWatsonRegressor(
        bandwidth=rule, kernel="tricube", var_type=kinds
    ),
    "local": lambda rule, kinds: nbattn.LocalPolynomialRegressor(
        degree=1, bandwidth=rule, var_type=kinds
    ),
    "classifier": lambda rule, kinds: nbattn.NadarayaWatsonClassifier(
        bandwidth=rule, var_type=kinds
    ),
}

kinds_strings = st.text(alphabet="cuo", min_size=1, max_size=4)


def _table(rng, n, kinds):
    """n rows of columns of the given kinds (codes 0..3 for a categorical one) and a target."""
    columns = [
        rng.normal(0, 10.0 ** rng.uniform(-2, 2), n) if k == "c" else rng.integers(0, 4, n)
        for k in kinds
    ]
    X = np.column_stack(columns).astype(np.float64)
    return X, X.sum(axis=1) + rng.normal(size=n)


def _fit(maker, rule, kinds, X, y, w):
    model = MAKERS[maker](rule, kinds)
    if maker == "classifier":
        y = np.where(y > np.median(y), "a", "b")
        y[:2] = ["a", "b"]
    return model.fit(X, y, sample_weight=w)


# ----------------------------------------------------------------------------- weights' scale


@settings(max_examples=60)
@given(
    seed=seeds,
    n=st.integers(2, 25),
    kinds=kinds_strings,
    rule=st.sampled_from(RULES),
    maker=st.sampled_from(sorted(MAKERS)),
    exponent=st.floats(-9, 9),
    binary=st.integers(-30, 30),
)
def test_rule_widths_do_not_change_when_all_weights_are_scaled(
    seed, n, kinds, rule, maker, exponent, binary
):
    """Weights c s give the widths of s: to rounding for c in 1e-9..1e9, exactly for c a
    power of two; on every path (fast, engine, classifier) and every mix of column kinds."""
    rng = np.random.default_rng(seed)
    X, y = _table(rng, n, kinds)
    w = rng.uniform(0, 1, n) * 10.0 ** rng.uniform(-3, 3, n)
    w[rng.uniform(size=n) < 0.2] = 0.0
    w[:2] = rng.uniform(0.5, 2, 2)  # two rows with weight (the classifier's two classes)
    base = _fit(maker, rule, kinds, X, y, w).bandwidth_
    assert np.all(np.isfinite(base)) and np.all(base >= 0)
    scaled = _fit(maker, rule, kinds, X, y, w * 10.0**exponent).bandwidth_
    np.testing.assert_allclose(scaled, base, rtol=1e-12)
    exact = _fit(maker, rule, kinds, X, y, w * 2.0**binary).bandwidth_
    np.testing.assert_array_equal(exact, base)


@pytest.mark.parametrize("total", [1.0, 1e-9, 1.0 + 1e-12, 1.0 + 2.0**-40, 0.3, 3.7, 1e9])
@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize("kinds", ["c", "cc", "co", "cuo"])
def test_equal_weights_of_any_total_give_the_unweighted_rule(total, maker, kinds):
    """Equal weights summing to 1 (shares), to 1e-9, or to just over 1 are the unweighted
    rule, over several draws."""
    rng = np.random.default_rng(int(total * 1e6) % 2**32)
    for rule in RULES:
        for n in (2, 3, 17, 60):
            X, y = _table(rng, n, kinds)
            w = np.full(n, total / n)
            weighted = _fit(maker, rule, kinds, X, y, w).bandwidth_
            plain = _fit(maker, rule, kinds, X, y, None).bandwidth_
            np.testing.assert_allclose(weighted, plain, rtol=1e-12)


@settings(max_examples=100)
@given(seed=seeds, n=st.integers(2, 40), d=st.integers(1, 4), rule=st.sampled_from(RULES))
def test_weighted_rule_is_kish_weighted_spread(seed, n, d, rule):
    """The weighted rule is factor(n_eff) times numpy's reliability-weighted spread
    (``np.cov(aweights=w, ddof=1)``: sum w (x - m)^2 / (sum w - sum w^2 / sum w))."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-3, 3, d)
    # (numpy's sum w - sum w^2 / sum w cancels when one weight dwarfs the rest: a ratio of
    # at most 1e4 keeps it to 1e-12, and the wider range has its own test below)
    w = 10.0 ** rng.uniform(-2, 2, n) * 10.0 ** rng.uniform(-100, 100)
    n_eff = w.sum() ** 2 / (w**2).sum()
    cov = np.atleast_2d(np.cov(X, rowvar=False, aweights=w, ddof=1))
    sigma = np.sqrt(np.diag(cov))
    factor = nbattn.smoothing.regression.BANDWIDTH_RULES[rule](n_eff, d)
    np.testing.assert_allclose(effective_size(w), n_eff, rtol=1e-12)
    np.testing.assert_allclose(weighted_rule_bandwidth(X, w, rule), factor * sigma, rtol=1e-9)


def test_weighted_spread_keeps_its_digits_when_one_row_holds_nearly_all_weight(rng):
    """Weights (1, eps): n_eff -> 1, and the spread tends to that of the two rows (not 0,
    not a division of rounding errors)."""
    for eps in (1e-6, 1e-12, 1e-20, 1e-300):
        X = rng.normal(size=(2, 3))
        h = weighted_rule_bandwidth(X, np.array([1.0, eps]), "scott")
        two = np.abs(X[0] - X[1]) / np.sqrt(2)
        factor = nbattn.smoothing.regression.BANDWIDTH_RULES["scott"](1.0 + 2 * eps, 3)
        np.testing.assert_allclose(h, factor * two, rtol=1e-9)


# ----------------------------------------------------------------------------- lambda's range


@settings(max_examples=300)
@given(
    n=st.one_of(st.floats(1e-3, 1e12), st.integers(1, 10**6)),
    kinds=kinds_strings,
    counts=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    rule=st.sampled_from(RULES),
)
def test_rule_lambdas_stay_strictly_inside_their_range(n, kinds, counts, rule):
    counts = counts[: len(kinds)]
    top = lambda_max(kinds, counts)
    lam = rule_lambdas(kinds, counts, n, rule)
    assert np.all(lam >= 0)
    assert np.all((lam < top) | (top == 0))
    assert np.all(lam[top == 0] == 0)
    continuous = np.array([k == "c" for k in kinds])
    check_widths(np.where(continuous, 1.0, lam), kinds, counts)  # accepted as given widths


@settings(max_examples=40)
@given(
    seed=seeds,
    n=st.integers(1, 6),
    kinds=st.sampled_from(["o", "co", "uo", "cuo", "oo"]),
    rule=st.sampled_from(RULES),
    weights=st.sampled_from(["none", "shares", "tiny", "one_heavy"]),
)
def test_fit_at_the_rule_widths_is_the_kernel_average_for_few_rows(seed, n, kinds, rule, weights):
    """One row, weights summing to 1 or less, or all the weight on one row: the rule's l stays
    below its end, and the fit is the product-kernel average (finite; an ordered column at
    l = 1 would have a zero kernel and the fit would fall back to the nearest neighbour)."""
    rng = np.random.default_rng(seed)
    X, y = _table(rng, n, kinds)
    w = {
        "none": None,
        "shares": np.full(n, 1.0 / n),
        "tiny": rng.uniform(0.1, 1, n) * 1e-9,
        "one_heavy": np.concatenate([[1.0], np.full(n - 1, 1e-12)]),
    }[weights]
    model = nbattn.NadarayaWatsonRegressor(bandwidth=rule, var_type=kinds).fit(X, y, w)
    counts = [len(c) if c is not None else 0 for c in model.categories_]
    top = lambda_max(kinds, counts)
    assert np.all((model.bandwidth_ < top) | (top == 0))
    Q = model.X_fit_.copy()
    for j, kind in enumerate(kinds):
        if kind != "c" and counts[j] > 1:  # queries at another seen level
            Q[:, j] = (Q[:, j] + 1) % counts[j]
    K = product_kernel_matrix(Q, model.X_fit_, model.bandwidth_, kinds, counts)
    if model.sample_weight_ is not None:  # (None: equal weights)
        K = K * model.sample_weight_[None, :]
    want = K @ model.y_fit_[:, 0] / K.sum(axis=1)
    assert np.all(np.isfinite(want))
    frame_q = np.column_stack(
        [
            Q[:, j] if kind == "c" else np.asarray(model.categories_[j])[Q[:, j].astype(int)]
            for j, kind in enumerate(kinds)
        ]
    ).astype(np.float64)
    np.testing.assert_allclose(model.predict(frame_q), want, rtol=1e-9)


@pytest.mark.parametrize("lam", [1.0, 1.0 + 1e-13, 2.0, 1e300])
def test_ordered_smoothing_at_or_beyond_one_is_refused(lam):
    with pytest.raises(
        ValueError, match=r"bandwidth\[1\] .* ordered column 1; it must lie in \[0, 1\)"
    ):
        check_widths([0.5, lam], "co", [0, 4])
    X = np.column_stack([np.arange(6.0), np.arange(6) % 3])
    with pytest.raises(ValueError, match=r"ordered column 1"):
        nbattn.NadarayaWatsonRegressor(bandwidth=[0.5, lam], var_type="co").fit(X, X[:, 0])


def test_smoothing_just_below_the_ends_and_the_uniform_end_are_accepted():
    """l just below 1 (ordered) and l = (c-1)/c (unordered: the uniform kernel) are widths."""
    below = np.nextafter(1.0, 0.0)
    np.testing.assert_array_equal(check_widths([below], "o", [3]), [below])
    for c in (2, 3, 7):
        np.testing.assert_array_equal(check_widths([(c - 1) / c], "u", [c]), [(c - 1) / c])
