"""bandwidth="loo" (a width per column, on every path) and "loo_scale" (one factor of
Scott's widths) in the estimators."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.local.problem import LocalSpec, rule_widths

from .. import naive
from ..strategies import seeds


def _r_np_reference():
    """statsmodels' copy of R np's test case (test_kernel_regression.py, 60 rows): y on two
    normal columns with different slopes, and R's npregbw(bwmethod="cv.ls") widths."""
    rs = np.random.RandomState(123456)
    n = 60
    rs.binomial(2, 0.7, size=(n, 1))
    rs.binomial(3, 0.7, size=(n, 1))
    c1 = rs.normal(size=(n, 1))
    c2 = rs.normal(10, 1, size=(n, 1))
    rs.normal(10, 2, size=(n, 1))
    noise = rs.normal(size=(n, 1))
    y = (0.3 + 1.2 * c1 + 3.7 * c2 + noise).ravel()
    return np.column_stack([c1, c2]), y, np.array([0.6163835, 0.1649656])


def test_loo_reaches_r_np_cv_ls_optimum():
    X, y, r_widths = _r_np_reference()
    r_loss = nbattn.loo_loss(X, y, r_widths)
    model = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(X, y)
    assert nbattn.loo_loss(X, y, model.bandwidth_) <= r_loss * (1 + 1e-3)
    np.testing.assert_allclose(model.bandwidth_, r_widths, rtol=1e-3)
    # one factor of Scott's widths cannot give the two columns their own widths
    scaled = nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale").fit(X, y)
    assert nbattn.loo_loss(X, y, scaled.bandwidth_) > r_loss * 1.05
    again = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(X, y)
    np.testing.assert_array_equal(again.bandwidth_, model.bandwidth_)


@settings(max_examples=20)
@given(
    seed=seeds,
    n=st.integers(8, 60),
    d=st.integers(1, 3),
    case=st.sampled_from(["plain", "irrelevant", "scales", "weights"]),
)
def test_loo_is_never_worse_than_loo_scale(seed, n, d, case):
    """Over random tables, including one irrelevant column and columns of very different
    scales: the per-column search's LOO MSE is at most the one-factor search's (to the
    searches' tolerance), and a second fit gives the same widths bit for bit."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    w = None
    if case == "irrelevant":
        X = np.column_stack([X, rng.normal(size=n)])
    elif case == "scales":
        X = X * 10.0 ** rng.uniform(-4, 4, d)
    elif case == "weights":
        w = rng.uniform(0.1, 3, n)
    fits = {
        bw: nbattn.NadarayaWatsonRegressor(bandwidth=bw).fit(X, y, sample_weight=w)
        for bw in ("loo", "loo_scale")
    }
    losses = {
        bw: nbattn.estimators.widths.engine_loo_loss(m, X, y[:, None], m.bandwidth_, w, 0)
        for bw, m in fits.items()
    }
    assert losses["loo"] <= losses["loo_scale"] * (1 + 10 * config.LOO_RTOL)
    again = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(X, y, sample_weight=w)
    np.testing.assert_array_equal(again.bandwidth_, fits["loo"].bandwidth_)


@pytest.mark.parametrize("kinds", ["cc", "cu", "co"])
def test_loo_scale_is_one_factor_of_the_rule_on_every_path(rng, kinds):
    """ "loo_scale" multiplies every h of Scott's rule by one factor (the categorical l at the
    rule's), on the fast path and on the engine's, for each estimator."""
    for _ in range(3):
        n = 40
        X = np.column_stack([rng.normal(size=n), rng.integers(0, 3, n)]).astype(float)
        y = X[:, 0] + 0.5 * X[:, 1] + 0.1 * rng.normal(size=n)
        for model in (
            nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale", var_type=kinds),
            nbattn.LocalPolynomialRegressor(bandwidth="loo_scale", var_type=kinds),
        ):
            model.fit(X, y)
            counts = [0 if c is None else len(c) for c in model.categories_]
            rule = rule_widths(LocalSpec(kinds, tuple(counts)), model.X_fit_)
            cont = np.array([k == "c" for k in kinds])
            ratio = model.bandwidth_[cont] / rule[cont]
            np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
            np.testing.assert_array_equal(model.bandwidth_[~cont], rule[~cont])


def test_classifier_loo_learns_each_width_and_is_never_worse_than_one_factor(rng):
    """Labels set by the first column alone: the per-column search widens the second
    column far beyond the one-factor search's, and scores no worse on the smoothed
    leave-one-out log-loss (the naive formula)."""
    X = rng.normal(size=(50, 2)) * [1.0, 30.0]
    labels = np.where(X[:, 0] > 0, "a", "b")
    loo = nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X, labels)
    scaled = nbattn.NadarayaWatsonClassifier(bandwidth="loo_scale").fit(X, labels)
    onehot = np.eye(2)[(labels == "b").astype(int)]

    def score(model):
        return naive.smoothed_class_loo_log_loss(
            X, onehot, model.bandwidth_, "cc", [0, 0], model.prior_count_
        )

    assert score(loo) <= score(scaled)
    ratio = loo.bandwidth_[1] / loo.bandwidth_[0]
    assert ratio > 5 * scaled.bandwidth_[1] / scaled.bandwidth_[0]


@pytest.mark.parametrize("bandwidth", ["loo", "loo_scale"])
@pytest.mark.parametrize(
    "make",
    [
        lambda bw: nbattn.NadarayaWatsonRegressor(bandwidth=bw),
        lambda bw: nbattn.NadarayaWatsonRegressor(bandwidth=bw, var_type="cu"),
        lambda bw: nbattn.LocalPolynomialRegressor(bandwidth=bw),
        lambda bw: nbattn.LocalPolynomialRegressor(bandwidth=bw, degree=0, kernel="tricube"),
    ],
)
def test_a_leave_one_out_width_needs_two_rows_on_every_path(make, bandwidth):
    """One row (or one row of positive weight) leaves nothing to leave one out: every
    estimator and search refuses it by the same words, none returns widths of 1."""
    X = np.array([[0.5, 1.0]])
    with pytest.raises(ValueError, match=f"bandwidth='{bandwidth}' needs at least 2 samples"):
        make(bandwidth).fit(X, np.array([3.0]))
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=40), rng.integers(0, 2, 40)])
    weights = np.zeros(40)
    weights[7] = 1.0
    with pytest.raises(ValueError, match=r"n_samples=1 \(rows of weight 0 are left out\)"):
        make(bandwidth).fit(X, rng.normal(size=40), sample_weight=weights)


def test_learned_loss_is_the_mean_over_outputs_on_both_paths():
    """loss_ is (1 / (n p)) sum ||f_-i - y_i||^2 whichever way the widths are learned:
    L-BFGS on the streaming tiles, or the engine (here: sample weights)."""
    from nbattn.local.engine import local_loo_loss

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    Y = X + 0.3 * rng.normal(size=(40, 2))
    lbfgs = nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, Y)
    assert lbfgs.loss_ == pytest.approx(local_loo_loss(X, Y, lbfgs.bandwidth_, 0) / 2, rel=1e-9)
    w = np.ones(40)
    w[0] = 2.0
    engine = nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, Y, sample_weight=w)
    expected = local_loo_loss(X, Y, engine.bandwidth_, 0, sample_weight=w) / 2
    assert engine.loss_ == pytest.approx(expected, rel=1e-12)
