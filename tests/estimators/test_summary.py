"""``summary()`` of every estimator and ``nbattn fit --summary``: the figures against brute
force on small tables (an explicit softmax matrix for n_eff, explicit leave-one-out sums
for the criteria, statsmodels' cv_loo), the table's scaled widths, the text, repeats."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning, NotFittedError

import nbattn
from nbattn.estimators import summary as summary_module
from tests.naive import local_loo_loss_exact, product_kernel_matrix

#: short fits of the learned metric stop at max_iter on purpose
short_fits = pytest.mark.filterwarnings(
    f"ignore::{ConvergenceWarning.__module__}.ConvergenceWarning"
)
#: statsmodels' estimators draw with pandas' random state, which warns of a future default
statsmodels_warns = pytest.mark.filterwarnings("ignore::FutureWarning")


def _table(rng, n=40):
    """A mixed table (a continuous, an unordered of 3 and an ordered of 4 categories) and
    a target that uses all three."""
    x = rng.normal(size=n)
    u = rng.integers(0, 3, n)
    o = rng.integers(0, 4, n)
    frame = pd.DataFrame(
        {
            "speed": x,
            "colour": pd.Categorical.from_codes(u, ["red", "green", "blue"]),
            "size": pd.Categorical.from_codes(o, ["xs", "s", "m", "l"], ordered=True),
        }
    )
    return frame, np.sin(x) + (u == 1) + 0.3 * o + 0.2 * rng.normal(size=n)


def _fitted(cls, rng, n=40, **params):
    X, y = _table(rng, n)
    if cls is nbattn.NadarayaWatsonClassifier:
        return cls(**params).fit(X, (y > np.median(y)).astype(int)), X
    if cls is nbattn.KernelDensity:
        return cls(**params).fit(X), X
    return cls(**params).fit(X, y), X


def _softmax(model, queries=None):
    """p_ij (n_q, n) from the product kernel matrix in numpy, times the sample weights."""
    keys = model.X_fit_
    queries = keys if queries is None else queries
    counts = [0 if c is None else len(c) for c in model.categories_]
    K = product_kernel_matrix(
        queries, keys, model.bandwidth_, model.var_type_, counts, model.kernel
    )
    if model.sample_weight_ is not None:
        K = K * model.sample_weight_[None, :]
    return K / K.sum(axis=1, keepdims=True)


def _n_eff_figures(p):
    n_eff = 1.0 / np.sum(p * p, axis=1)
    return np.quantile(n_eff, [0.05, 0.5, 0.95])


def _check_n_eff(s, p):
    low, median, high = _n_eff_figures(p)
    np.testing.assert_allclose(
        [s.n_eff_low, s.n_eff_median, s.n_eff_high], [low, median, high], rtol=1e-10
    )


# ----------------------------------------------------------------------------- n_eff


@pytest.mark.parametrize(
    "cls, params",
    [
        (nbattn.NadarayaWatsonRegressor, {}),
        (nbattn.LocalPolynomialRegressor, {"bandwidth": "scott", "degree": 1}),
        (nbattn.NadarayaWatsonClassifier, {"kernel": "epanechnikov"}),
        (nbattn.KernelDensity, {}),
    ],
)
def test_n_eff_is_kish_of_the_softmax(cls, params):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        model, _ = _fitted(cls, rng, **params)
        _check_n_eff(model.summary(), _softmax(model))


def test_n_eff_of_a_conditional_model_is_x_kernel_weights():
    rng = np.random.default_rng(4)
    model, _ = _fitted(nbattn.ConditionalKernelDensity, rng)
    _check_n_eff(model.summary(), _softmax(model))


@short_fits
def test_n_eff_weighted_gaussian_fast_path_and_full_metric():
    for seed in range(3):
        rng = np.random.default_rng(10 + seed)
        X = rng.normal(size=(30, 2))
        y = X[:, 0] + 0.1 * rng.normal(size=30)
        w = rng.uniform(0.1, 3.0, size=30)
        model = nbattn.NadarayaWatsonRegressor().fit(X, y, sample_weight=w)
        _check_n_eff(model.summary(), _softmax(model))
        full = nbattn.LearnedKernelRegressor(metric="full", max_iter=5).fit(X, y)
        Z = X @ full.components_.T
        K = np.exp(-0.5 * ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(axis=2))
        _check_n_eff(full.summary(), K / K.sum(axis=1, keepdims=True))


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(2, 30),
    d=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
    weighted=st.booleans(),
)
def test_n_eff_over_random_shapes(n, d, seed, weighted):
    """1 <= n_eff <= n, and the brute-force quantiles, at any shape."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10.0, d)
    w = rng.uniform(0.1, 5.0, n) if weighted else None
    model = nbattn.NadarayaWatsonRegressor().fit(X, rng.normal(size=n), sample_weight=w)
    s = model.summary()
    _check_n_eff(s, _softmax(model))
    assert 1.0 - 1e-12 <= s.n_eff_low <= s.n_eff_median <= s.n_eff_high <= n * (1 + 1e-12)


def test_average_pooling_n_eff_is_kish_of_the_weights():
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(25, 2)), rng.normal(size=25)
    w = rng.uniform(0.5, 2.0, 25)
    s = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y, sample_weight=w).summary()
    kish = w.sum() ** 2 / (w * w).sum()
    assert s.n_eff_median == pytest.approx(kish, rel=1e-12)
    assert s.n_weighted == pytest.approx(kish, rel=1e-12)
    assert s.weight_sum == pytest.approx(w.sum(), rel=1e-12)
    # the LOO mean of the others' weighted targets
    fits = np.array([np.delete(w * y, i).sum() / np.delete(w, i).sum() for i in range(25)])
    mse = float((w / w.sum()) @ (fits - y) ** 2)
    assert s.loo_mse == pytest.approx(mse, rel=1e-10)


def test_n_eff_subsampled_above_the_limit(monkeypatch):
    monkeypatch.setattr(summary_module, "N_EFF_QUERIES", 15)
    rng = np.random.default_rng(6)
    model, _ = _fitted(nbattn.NadarayaWatsonRegressor, rng, n=40)
    s = model.summary()
    assert s.n_eff_rows == 15
    rows = np.sort(np.random.default_rng(summary_module.N_EFF_SEED).choice(40, 15, replace=False))
    _check_n_eff(s, _softmax(model, model.X_fit_[rows]))
    assert "15 training rows drawn" in str(s)


# ----------------------------------------------------------------------------- criteria


def _loo_brute(model):
    counts = [0 if c is None else len(c) for c in model.categories_]
    return local_loo_loss_exact(
        model.X_fit_,
        model.y_fit_,
        model.bandwidth_,
        model.var_type_,
        counts,
        getattr(model, "degree", 0),
        kernel=getattr(model, "kernel", "gaussian"),
        sample_weight=model.sample_weight_,
    )


@pytest.mark.parametrize(
    "cls, params",
    [
        (nbattn.NadarayaWatsonRegressor, {}),
        (nbattn.LocalPolynomialRegressor, {"bandwidth": "scott", "degree": 1}),
        (nbattn.LocalPolynomialRegressor, {"bandwidth": "scott", "kernel": "tricube"}),
    ],
)
def test_loo_mse_and_r2_against_explicit_leave_one_out(cls, params):
    for seed in range(3):
        rng = np.random.default_rng(20 + seed)
        X, y = _table(rng, 35)
        w = rng.uniform(0.2, 2.0, 35) if seed == 2 else None
        model = cls(**params).fit(X, y, sample_weight=w)
        s = model.summary()
        mse = _loo_brute(model)
        u = np.full(35, 1 / 35) if w is None else w / w.sum()
        variance = u @ (y - u @ y) ** 2
        assert s.loo_mse == pytest.approx(mse, rel=1e-8)
        assert s.loo_r2 == pytest.approx(1 - mse / variance, rel=1e-8, abs=1e-12)


@statsmodels_warns
def test_loo_mse_by_refits_and_statsmodels():
    """Each row left out by refitting on the others (continuous columns: refits keep the
    columns' kinds), and statsmodels' KernelReg.cv_loo at the same widths."""
    from statsmodels.nonparametric.kernel_regression import KernelReg

    rng = np.random.default_rng(30)
    X = rng.normal(size=(25, 2))
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=25)
    model = nbattn.LocalPolynomialRegressor(bandwidth="scott", degree=1).fit(X, y)
    refits = []
    for i in range(25):
        keep = np.arange(25) != i
        other = nbattn.LocalPolynomialRegressor(bandwidth=model.bandwidth_, degree=1)
        refits.append(other.fit(X[keep], y[keep]).predict(X[i : i + 1])[0])
    mse = float(np.mean((np.array(refits) - y) ** 2))
    s = model.summary()
    assert s.loo_mse == pytest.approx(mse, rel=1e-9)
    reg = KernelReg(y, X, var_type="cc", reg_type="ll", bw=model.bandwidth_)
    assert s.loo_mse == pytest.approx(reg.cv_loo(model.bandwidth_, reg.est["ll"]), rel=1e-7)


def test_learned_loss_is_the_explicit_loo():
    rng = np.random.default_rng(31)
    X = rng.normal(size=(30, 2))
    y = X[:, 0] + 0.2 * rng.normal(size=30)
    model = nbattn.LearnedKernelRegressor(max_iter=10).fit(X, y)
    assert model.summary().loo_mse == pytest.approx(_loo_brute(model), rel=1e-8)


def test_two_outputs_mean_over_outputs():
    rng = np.random.default_rng(32)
    X, y = _table(rng, 30)
    Y = np.column_stack([y, 2 * y + rng.normal(size=30)])
    model = nbattn.NadarayaWatsonRegressor().fit(X, Y)
    s = model.summary()
    assert s.loo_mse == pytest.approx(_loo_brute(model) / 2, rel=1e-8)
    assert s.loo_r2 == pytest.approx(1 - _loo_brute(model) / Y.var(axis=0).sum(), rel=1e-8)


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_classifier_loo_accuracy_and_log_loss(alpha):
    for seed in range(3):
        rng = np.random.default_rng(40 + seed)
        X, y = _table(rng, 40)
        labels = np.digitize(y, np.quantile(y, [0.33, 0.66]))
        w = rng.uniform(0.3, 2.0, 40) if seed == 1 else None
        model = nbattn.NadarayaWatsonClassifier().fit(X, labels, sample_weight=w)
        model.prior_count_ = alpha
        s = model.summary()
        r = np.ones(40) if w is None else w / w.mean()
        K = (
            product_kernel_matrix(
                model.X_fit_, model.X_fit_, model.bandwidth_, model.var_type_, [0, 3, 4], "gaussian"
            )
            * r[None, :]
        )
        np.fill_diagonal(K, 0.0)
        Y = model.y_fit_
        S_c, S = K @ Y, K.sum(axis=1)
        counts = r @ Y
        prior = (counts[None, :] - r[:, None] * Y + 1) / (counts.sum() - r + 3)[:, None]
        P = (S_c + alpha * prior) / (S + alpha)[:, None]
        own = P[np.arange(40), labels]
        u = r / r.sum()
        assert s.loo_accuracy == pytest.approx(u @ (P.argmax(axis=1) == labels), abs=1e-12)
        assert s.loo_log_loss == pytest.approx(-(u @ np.log(own)), rel=1e-9)


def _density_brute(model, conditional):
    counts = [0 if c is None else len(c) for c in model.categories_]
    w = np.ones(len(model.X_fit_)) if model.sample_weight_ is None else model.sample_weight_
    Kx = product_kernel_matrix(
        model.X_fit_, model.X_fit_, model.bandwidth_, model.var_type_, counts, "gaussian"
    )
    h = model.bandwidth_[0]  # the continuous column's kernel constant
    Kx = Kx / (h * math.sqrt(2 * math.pi))
    if conditional:
        hy = model.y_bandwidth_
        dy = (model.y_fit_[:, None] - model.y_fit_[None, :]) / hy
        Ky = np.exp(-0.5 * dy**2) / (hy * math.sqrt(2 * math.pi))
        top, bottom = Kx * Ky * w[None, :], Kx * w[None, :]
        np.fill_diagonal(top, 0.0)
        np.fill_diagonal(bottom, 0.0)
        logs = np.log(top.sum(axis=1) / bottom.sum(axis=1))
    else:
        Kw = Kx * w[None, :]
        np.fill_diagonal(Kw, 0.0)
        logs = np.log(Kw.sum(axis=1) / (w.sum() - w))
    return float((w / w.sum()) @ logs)


@pytest.mark.parametrize("conditional", [False, True])
def test_density_loo_log_likelihood(conditional):
    for seed in range(3):
        rng = np.random.default_rng(50 + seed)
        X, y = _table(rng, 35)
        w = rng.uniform(0.3, 2.0, 35) if seed == 2 else None
        if conditional:
            model = nbattn.ConditionalKernelDensity().fit(X, y, sample_weight=w)
        else:
            model = nbattn.KernelDensity().fit(X, sample_weight=w)
        brute = _density_brute(model, conditional)
        assert model.summary().loo_log_likelihood == pytest.approx(brute, rel=1e-9)


@statsmodels_warns
def test_density_loo_against_statsmodels():
    from statsmodels.nonparametric.kernel_density import KDEMultivariate

    rng = np.random.default_rng(55)
    X = rng.normal(size=(30, 2))
    model = nbattn.KernelDensity().fit(X)
    kde = KDEMultivariate(X, var_type="cc", bw=model.bandwidth_)
    # statsmodels sums the other rows' kernels without dividing by their number, n - 1
    total = kde.loo_likelihood(model.bandwidth_, np.log)  # -sum_i log sum_j K_ij
    expected = -(total + 30 * math.log(29)) / 30
    assert model.summary().loo_log_likelihood == pytest.approx(expected, rel=1e-9)


# ----------------------------------------------------------------------------- the table


def test_scaled_widths():
    for seed in range(3):
        rng = np.random.default_rng(60 + seed)
        model, X = _fitted(nbattn.LocalPolynomialRegressor, rng, bandwidth="scott")
        table = model.summary().table
        assert list(table["name"]) == ["speed", "colour", "size"]
        assert list(table["kind"]) == ["continuous", "unordered", "ordered"]
        np.testing.assert_array_equal(table["width"], model.bandwidth_)
        h, lam_u, lam_o = model.bandwidth_
        expected = [h / np.std(X["speed"], ddof=1), lam_u / (2 / 3), lam_o / 1.0]
        np.testing.assert_allclose(table["scaled"], expected, rtol=1e-13)


def test_scaled_widths_at_extreme_magnitudes():
    rng = np.random.default_rng(61)
    X = rng.normal(size=(30, 2))
    y = X[:, 0] + 0.3 * rng.normal(size=30)
    plain = nbattn.NadarayaWatsonRegressor().fit(X, y).summary()
    for scale in (2.0**900, 2.0**-900):
        s = nbattn.NadarayaWatsonRegressor().fit(X * scale, y * 2.0**500).summary()
        np.testing.assert_allclose(s.table["scaled"], plain.table["scaled"], rtol=1e-13)
        assert s.loo_r2 == pytest.approx(plain.loo_r2, rel=1e-12)
        assert s.loo_mse == pytest.approx(plain.loo_mse * 2.0**1000, rel=1e-12)
        assert s.n_eff_median == pytest.approx(plain.n_eff_median, rel=1e-12)


def test_y_row_of_conditional_models():
    rng = np.random.default_rng(62)
    model, _ = _fitted(nbattn.ConditionalKernelDensity, rng)
    table = model.summary().table
    assert table["name"].iloc[0] == "y"
    assert table["width"].iloc[0] == model.y_bandwidth_
    sd = np.std(model.y_fit_, ddof=1)
    assert table["scaled"].iloc[0] == pytest.approx(model.y_bandwidth_ / sd, rel=1e-13)


ALL = [
    (nbattn.NadarayaWatsonRegressor, {}),
    (nbattn.LearnedKernelRegressor, {"max_iter": 5}),
    (nbattn.LocalPolynomialRegressor, {"bandwidth": "scott"}),
    (nbattn.NadarayaWatsonClassifier, {}),
    (nbattn.KernelDensity, {}),
    (nbattn.ConditionalKernelDensity, {}),
    (nbattn.KernelQuantileRegressor, {"bandwidth": "normal_reference"}),
]


@short_fits
@pytest.mark.parametrize("cls, params", ALL, ids=[c.__name__ for c, _ in ALL])
def test_every_estimator_has_a_summary(cls, params):
    rng = np.random.default_rng(70)
    with pytest.raises(NotFittedError):
        cls(**params).summary()
    model, X = _fitted(cls, rng, **params)
    before = {k: np.copy(v) for k, v in vars(model).items() if isinstance(v, np.ndarray)}
    first, second = model.summary(), model.summary()
    text = str(first)
    assert text == str(second)
    pd.testing.assert_frame_equal(first.table, second.table, check_exact=True)
    assert first.criteria == second.criteria
    for line in text.splitlines():
        assert len(line) <= 80, line
    for name in X.columns:
        assert name in text
    assert cls.__name__ in text
    assert str(first.n_samples) in text
    assert f"{first.n_eff_median:.4g}" in text
    for value in first.criteria.values():
        assert math.isfinite(value)
        assert f"{value:.4g}" in text
    for k, v in before.items():  # the model is not changed
        np.testing.assert_array_equal(getattr(model, k), v)


@short_fits
def test_full_metric_has_no_width_per_column():
    rng = np.random.default_rng(71)
    X = rng.normal(size=(25, 2))
    model = nbattn.LearnedKernelRegressor(metric="full", max_iter=5).fit(X, X[:, 0])
    s = model.summary()
    assert s.table["width"].isna().all()
    assert "full learned metric" in str(s)
    assert s.loo_mse == pytest.approx(model.loss_, rel=0)


def test_significance_shown_when_set():
    rng = np.random.default_rng(72)
    model, _ = _fitted(nbattn.NadarayaWatsonRegressor, rng)
    model.significance_ = pd.DataFrame(
        {"statistic": [3.5, 0.2, 1.1, 7.0], "p_value": [0.0, 0.62, 0.031, 0.004]},
        index=["speed", "colour", "size", "speed+size"],
    )
    s = model.summary()
    np.testing.assert_array_equal(s.table["p_value"], [0.0, 0.62, 0.031])
    text = str(s)
    assert "p-value" in text and "0.6200" in text and "<1e-4" in text
    assert "speed+size" in text and "0.0040" in text
    assert list(s.tests.index) == ["speed+size"]
    for line in text.splitlines():
        assert len(line) <= 80, line


# ----------------------------------------------------------------------------- the command


def test_cli_fit_summary(tmp_path, capsys):
    from nbattn.app import cli

    rng = np.random.default_rng(80)
    X, y = _table(rng, 30)
    frame = X.assign(y=y)
    frame.to_csv(tmp_path / "train.csv", index=False)
    args = ["fit", tmp_path / "train.csv", "--target", "y", "--model", "nw", "-q"]
    code = cli.main([str(a) for a in [*args, "-o", tmp_path / "m.npz", "--summary"]])
    out = capsys.readouterr().out
    assert code == 0
    assert "NadarayaWatsonRegressor summary" in out and "LOO MSE" in out
    for name in ("speed", "colour", "size"):
        assert name in out
    code = cli.main([str(a) for a in [*args, "-o", tmp_path / "n.npz"]])
    assert code == 0 and "summary" not in capsys.readouterr().out
