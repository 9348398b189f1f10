"""The regressors' significance_test: the statistic and its replicates against a numpy
brute force and statsmodels, calibration under the null over many data sets, power,
repeatability and the refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import nbattn
from nbattn.local.resampling import bootstrap_generator, wild_multipliers
from tests import naive

_KINDS = "cuo"


def _table(rng, n):
    """n rows: x (continuous), u (unordered, 3 levels), o (ordered, 4 levels)."""
    return pd.DataFrame(
        {
            "x": rng.uniform(-2.0, 2.0, n),
            "u": pd.Categorical(rng.integers(0, 3, n)),
            "o": pd.Categorical(rng.integers(0, 4, n), ordered=True),
        }
    )


def _codes(frame):
    return np.column_stack(
        [frame.x.to_numpy(), frame.u.cat.codes.to_numpy(float), frame.o.cat.codes.to_numpy(float)]
    )


def _naive_fits(X, keys, Y, widths, var_type, counts, degree, w=None):
    """(fits (n_q, m), slopes of the continuous columns (n_q, d_c, m)) by the numpy solve;
    at degree 0 the Gaussian softmax mean's exact derivative."""
    fit, coef, weights = naive.local_polynomial_exact(
        X, keys, Y, widths, var_type, counts, degree, sample_weight=w
    )
    cont = [c for c, kind in enumerate(var_type) if kind == "c"]
    if degree >= 1:
        return fit, coef[:, 1 : 1 + len(cont), :]
    diff = keys[None, :, cont] - X[:, None, cont]  # (n_q, n, d_c)
    resid = Y[None, :, :] - fit[:, None, :]  # (n_q, n, m)
    h2 = np.asarray(widths)[cont] ** 2
    return fit, np.einsum("qj,qjc,qjm->qcm", weights, diff / h2, resid)


def _naive_statistics(X, Y, widths, var_type, counts, degree, group, t, w=None):
    total = np.zeros(Y.shape[1])
    cont = [c for c, kind in enumerate(var_type) if kind == "c"]
    slopes = [cont.index(c) for c in group if var_type[c] == "c"]
    if slopes:
        _, grad = _naive_fits(X, X, Y, widths, var_type, counts, degree, w)
        total += t @ (grad[:, slopes, :] ** 2).sum(axis=1)
    for c in group:
        if var_type[c] == "c":
            continue
        levels = np.unique(X[:, c])
        fits = []
        for level in levels:
            Q = X.copy()
            Q[:, c] = level
            fits.append(_naive_fits(Q, X, Y, widths, var_type, counts, degree, w)[0])
        total += t @ sum((f - fits[0]) ** 2 for f in fits[1:])
    return total


def _naive_test(X, y, widths, var_type, counts, degree, group, v, w=None):
    """(I, I*) by the module's recipe with numpy fits: restricted residuals centred and
    scaled to the spread of the full model's leave-one-out residuals."""
    keep = [c for c in range(len(var_type)) if c not in group]
    t = np.full(y.shape[0], 1.0 / y.shape[0]) if w is None else w / w.sum()
    if keep:
        sub = "".join(var_type[c] for c in keep)
        g_r = naive.local_polynomial_exact(
            X[:, keep],
            X[:, keep],
            y,
            np.asarray(widths)[keep],
            sub,
            [counts[c] for c in keep],
            degree,
            sample_weight=w,
        )[0]
    else:
        g_r = np.full(y.shape, t @ y)
    loo = naive.local_polynomial_exact(
        X, X, y, widths, var_type, counts, degree, sample_weight=w, exclude_self=True
    )[0]
    u = y - loo
    r = (y - g_r) - t @ (y - g_r)
    e = r * np.sqrt(t @ (u - t @ u) ** 2) / np.sqrt(t @ r**2)
    Y = np.column_stack([y, g_r[:, None] + e[:, None] * v])
    both = _naive_statistics(X, Y, widths, var_type, counts, degree, group, t, w)
    return both[0], both[1:]


@pytest.mark.parametrize("degree", [0, 1, 2])
def test_statistic_and_replicates_match_a_numpy_brute_force(degree):
    """Every group's statistic and every replicate's against the numpy solve with the same
    multipliers, over several draws; the p-value is the count of the replicates."""
    for seed in range(3):
        rng = np.random.default_rng(seed + 10 * degree)
        frame = _table(rng, 28)
        X = _codes(frame)
        y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + rng.normal(0, 0.3, X.shape[0])
        widths = np.array([rng.uniform(0.6, 1.5), rng.uniform(0.1, 0.5), rng.uniform(0.1, 0.7)])
        model = nbattn.LocalPolynomialRegressor(degree=degree, bandwidth=widths).fit(frame, y)
        n_boot = 9
        table = model.significance_test(
            frame, y, joint=["x", "o"], columns=[0, 1, 2], n_boot=n_boot
        )
        v = wild_multipliers(bootstrap_generator(None), X.shape[0], n_boot)
        groups = [[0], [1], [2], [0, 2]]
        for label, group in zip(table.index, groups):
            stat, star = _naive_test(X, y, widths, _KINDS, [0, 3, 4], degree, group, v)
            assert table.loc[label, "statistic"] == pytest.approx(stat, rel=1e-8, abs=1e-14)
            margin = 1e-8 * max(abs(stat), 1e-12)
            if np.all(np.abs(star - stat) > margin):  # no replicate within rounding of I
                expected = (1 + np.count_nonzero(star >= stat)) / (n_boot + 1)
                assert table.loc[label, "p_value"] == expected


@pytest.mark.parametrize("model", ["nw", "lp1"])
def test_the_statistic_is_the_mean_squared_slope_and_level_change_of_the_model(model):
    """At the training rows the statistic is the model's own marginal_effects squared
    (the Gaussian Nadaraya-Watson's exact slopes: another code path) and the change of
    its predictions across the levels."""
    rng = np.random.default_rng(3)
    frame = _table(rng, 60)
    y = np.cos(frame.x.to_numpy()) + 0.5 * frame.o.cat.codes.to_numpy() + rng.normal(0, 0.2, 60)
    widths = [0.7, 0.3, 0.4]
    if model == "nw":
        continuous = frame[["x"]].assign(z=rng.normal(size=60))
        est = nbattn.NadarayaWatsonRegressor(bandwidth=[0.7, 0.9]).fit(continuous, y)
        table = est.significance_test(continuous, y, n_boot=5)
        slopes = est.marginal_effects(continuous)
        for c, name in enumerate(["x", "z"]):
            assert table.loc[name, "statistic"] == pytest.approx(
                np.mean(slopes[:, c] ** 2), rel=1e-9
            )
        return
    est = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=widths).fit(frame, y)
    table = est.significance_test(frame, y, n_boot=5)
    assert table.loc["x", "statistic"] == pytest.approx(
        np.mean(est.marginal_effects(frame)[:, 0] ** 2), rel=1e-9
    )
    levels = frame.o.cat.categories
    fits = [
        est.predict(frame.assign(o=pd.Categorical([lv] * 60, categories=levels, ordered=True)))
        for lv in levels
    ]
    change = sum(((f - fits[0]) ** 2).mean() for f in fits[1:])
    assert table.loc["o", "statistic"] == pytest.approx(change, rel=1e-9)


def test_statistics_match_statsmodels():
    """statsmodels' TestRegCoefC (local-linear, continuous) and TestRegCoefD (local
    constant, an unordered column) compute the same statistic at the same widths."""
    from statsmodels.nonparametric.kernel_regression import KernelReg, TestRegCoefC, TestRegCoefD

    rng = np.random.default_rng(7)
    for _ in range(3):
        n = 40
        X = np.column_stack([rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)])
        y = X[:, 0] ** 2 + 0.5 * X[:, 1] + rng.normal(0, 0.2, n)
        h = rng.uniform(0.3, 0.9, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sm = KernelReg(y, X, "cc", reg_type="ll", bw=h)
            expected = TestRegCoefC(sm, [1], nboot=1, rng=0).test_stat
        ours = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h).fit(X, y)
        got = ours.significance_test(X, y, columns=[1], n_boot=1).loc["x1", "statistic"]
        assert got == pytest.approx(expected, rel=1e-7)

        Z = np.column_stack([rng.uniform(-1, 1, n), rng.integers(0, 3, n)])
        yz = np.sin(2 * Z[:, 0]) + 0.4 * Z[:, 1] + rng.normal(0, 0.2, n)
        widths = np.array([rng.uniform(0.3, 0.9), rng.uniform(0.05, 0.5)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sm = KernelReg(yz, Z, "cu", reg_type="lc", bw=widths)
            expected = TestRegCoefD(sm, [1], nboot=1, rng=0).test_stat
        ours = nbattn.LocalPolynomialRegressor(degree=0, bandwidth=widths, var_type="cu").fit(Z, yz)
        got = ours.significance_test(Z, yz, columns=[1], n_boot=1).loc["x1", "statistic"]
        assert got == pytest.approx(float(np.ravel(expected)[0]), rel=1e-7)


def _rejections(kind, n_sets, alpha_levels, relevant):
    """p-values of column 1 over n_sets simulated data sets (fixed widths, 99 replicates);
    the column enters y only when ``relevant``."""
    rng = np.random.default_rng(2024 if relevant else 99)
    p = []
    for _ in range(n_sets):
        n = 80
        x0 = rng.uniform(0, 1, n)
        x1 = rng.uniform(0, 1, n) if kind == "c" else rng.integers(0, 3, n).astype(float)
        y = np.sin(2 * np.pi * x0) + rng.normal(0, 0.5, n) + (1.0 * x1 if relevant else 0.0)
        X = np.column_stack([x0, x1])
        widths = [0.12, 0.3] if kind == "c" else [0.12, 0.3]
        model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=widths, var_type="c" + kind)
        model.fit(X, y)
        p.append(
            model.significance_test(X, y, columns=[1], n_boot=99, random_state=rng).p_value.iloc[0]
        )
    p = np.asarray(p)
    return [np.mean(p <= a) for a in alpha_levels], p


@pytest.mark.parametrize("kind", ["c", "u"])
def test_under_the_null_rejections_are_within_binomial_limits(kind):
    """200 data sets where column 1 is irrelevant: the rejection rates at 1 %, 5 % and
    10 % lie within the binomial 99 % limits. (The p-values are not uniform above: the
    replicates' noise, scaled to the leave-one-out residuals, is a little louder than
    the data's, so large p-values come a little too often.)"""
    n_sets = 200
    levels = [0.01, 0.05, 0.10]
    rates, _ = _rejections(kind, n_sets, levels, relevant=False)
    for alpha, rate in zip(levels, rates):
        low, high = stats.binom.interval(0.99, n_sets, alpha)
        assert low / n_sets <= rate <= high / n_sets, (alpha, rate)


@pytest.mark.parametrize("kind", ["c", "u"])
def test_a_relevant_column_is_rejected(kind):
    rates, _ = _rejections(kind, 30, [0.05], relevant=True)
    assert rates[0] >= 0.9


def test_repeatable_seeds_and_inputs_untouched():
    rng = np.random.default_rng(5)
    frame = _table(rng, 40)
    y = frame.x.to_numpy() + rng.normal(0, 0.5, 40)
    before = frame.copy(), y.copy()
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=[0.8, 0.3, 0.5]).fit(frame, y)
    first = model.significance_test(frame, y, n_boot=49)
    second = model.significance_test(frame, y, n_boot=49)
    pd.testing.assert_frame_equal(first, second, check_exact=True)
    assert model.significance_ is not first and model.significance_.equals(second)
    pd.testing.assert_frame_equal(frame, before[0])
    np.testing.assert_array_equal(y, before[1])
    a = model.significance_test(frame, y, n_boot=49, random_state=1).p_value
    b = model.significance_test(frame, y, n_boot=49, random_state=2).p_value
    assert not np.array_equal(a, b)
    generator = np.random.default_rng(3)
    c = model.significance_test(frame, y, n_boot=49, random_state=generator).p_value
    d = model.significance_test(frame, y, n_boot=49, random_state=generator).p_value
    assert not np.array_equal(c, d)  # a Generator is advanced


def test_weights_and_rademacher_against_brute_force():
    rng = np.random.default_rng(11)
    for _ in range(3):
        n = 30
        X = np.column_stack([rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)])
        y = X[:, 0] + rng.normal(0, 0.3, n)
        w = rng.uniform(0.1, 2.0, n)
        h = rng.uniform(0.4, 1.0, 2)
        model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h).fit(X, y)
        table = model.significance_test(
            X, y, n_boot=7, method="wild_rademacher", sample_weight=w, random_state=4
        )
        v = wild_multipliers(bootstrap_generator(4), n, 7, "rademacher")
        for column in (0, 1):
            stat, star = _naive_test(X, y, h, "cc", [0, 0], 1, [column], v, w)
            assert table.statistic.iloc[column] == pytest.approx(stat, rel=1e-8)
            assert table.p_value.iloc[column] == (1 + np.count_nonzero(star >= stat)) / 8


@pytest.mark.parametrize("scale_x, scale_y", [(1e-200, 1.0), (1e200, 1e-250), (1.0, 1e300)])
def test_p_values_do_not_depend_on_the_scale_of_the_data(scale_x, scale_y):
    """x and y multiplied by powers of ten as far as float64 goes: the same p-values (the
    counts of replicates above the statistic), the statistic scaled by (scale_y /
    scale_x)^2 where float64 holds it."""
    rng = np.random.default_rng(21)
    n = 40
    X = np.column_stack([rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)])
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + rng.normal(0, 0.3, n)
    h = np.array([0.5, 0.7])
    base = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h).fit(X, y)
    expected = base.significance_test(X, y, joint=[0, 1], columns=[0, 1], n_boot=39)
    scaled = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h * scale_x)
    scaled.fit(X * scale_x, y * scale_y)
    got = scaled.significance_test(
        X * scale_x, y * scale_y, joint=[0, 1], columns=[0, 1], n_boot=39
    )
    np.testing.assert_array_equal(got.p_value, expected.p_value)
    with np.errstate(over="ignore"):  # (1 / 1e-200)^2 is beyond float64: inf is the answer
        log_factor = 2.0 * (np.log(scale_y) - np.log(scale_x))
        scaled_statistic = np.exp(np.log(expected.statistic.to_numpy()) + log_factor)
    np.testing.assert_allclose(got.statistic, scaled_statistic, rtol=1e-9)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(columns=["nope"]), "columns: 'nope' is not a column"),
        (dict(columns=[3]), "columns: position 3 is out of range"),
        (dict(columns=["x", 0]), "columns: column 'x' is listed twice"),
        (dict(joint=[]), "joint must list at least one column"),
        (dict(n_boot=0), "n_boot must be a positive integer"),
        (dict(n_boot=1.5), "n_boot must be a positive integer"),
        (dict(n_boot=True), "n_boot must be a positive integer"),
        (dict(method="pairs"), "method"),
        (dict(random_state=-1), "random_state must be"),
        (dict(sample_weight=np.zeros(20)), "sample_weight is zero everywhere"),
    ],
)
def test_refusals_name_the_argument(kwargs, message):
    rng = np.random.default_rng(0)
    frame = _table(rng, 20)
    y = rng.normal(size=20)
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=[0.8, 0.3, 0.5]).fit(frame, y)
    with pytest.raises(ValueError, match=message):
        model.significance_test(frame, y, **kwargs)


def test_refused_models_and_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 2))
    y = rng.normal(size=20)
    with pytest.raises(ValueError, match="kernel='average'"):
        nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y).significance_test(X, y)
    full = nbattn.LearnedKernelRegressor(metric="full", max_iter=2).fit(X, y)
    with pytest.raises(ValueError, match="metric='full'"):
        full.significance_test(X, y)
    model = nbattn.LocalPolynomialRegressor(bandwidth=0.8).fit(X, y)
    with pytest.raises(ValueError, match="y has 19 rows but X has 20"):
        model.significance_test(X, y[:-1])
    with pytest.raises(ValueError, match="one target"):
        model.significance_test(X, np.column_stack([y, y]))
    with pytest.raises(ValueError, match="at least 2 rows"):
        model.significance_test(X[:1], y[:1])
    frame = _table(rng, 20)
    cat = nbattn.LocalPolynomialRegressor(bandwidth=[0.8, 0.3, 0.5], handle_unknown="ignore")
    cat.fit(frame, y)
    unseen = frame.assign(u=pd.Categorical([7] * 20))
    with pytest.raises(ValueError, match="column 'u' holds a category the model was not fitted on"):
        cat.significance_test(unseen, y)
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        nbattn.LocalPolynomialRegressor().significance_test(X, y)


def test_the_table_is_a_result_not_model_state(tmp_path):
    """significance_ passes check_fitted_state, is not written to a model file, and the
    loaded model predicts as the original."""
    from nbattn.estimators import check_fitted_state

    rng = np.random.default_rng(8)
    X = rng.normal(size=(25, 2))
    y = X[:, 0] + rng.normal(size=25)
    model = nbattn.LocalPolynomialRegressor(bandwidth=0.9).fit(X, y)
    model.significance_test(X, y, n_boot=9)
    check_fitted_state(model)
    nbattn.save(model, tmp_path / "m.npz")
    loaded = nbattn.load(tmp_path / "m.npz")
    assert not hasattr(loaded, "significance_")
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
