"""``missing="marginalize"`` on the density estimators: a query row's missing values are
integrated out (the product kernel integrates to 1 over a column left out), so each row's
density, CDF, conditional density and quantiles are those of a model fitted on its
observed columns alone, with the same widths. Training rows must be complete.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn.persistence.predictor import read_predictor

WIDTHS = [0.45, 0.3, 0.6]
Y_WIDTH = 0.4
COLUMNS = ["a", "b", "c"]
#: every pattern of missing columns but the complete one
PATTERNS = [
    list(missing) for size in (1, 2, 3) for missing in itertools.combinations(COLUMNS, size)
]


def _table(seed, n=80):
    """A continuous, an unordered and an ordered column, and a response."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": pd.Categorical(rng.choice(["x", "y", "z"], n)),
            "c": pd.Categorical(rng.integers(0, 4, n), categories=range(4), ordered=True),
        }
    )
    y = X["a"].to_numpy() + (X["b"] == "x").to_numpy() + rng.normal(0.0, 0.5, n)
    return X, y


def _queries(X, seed):
    """Ten rows of X, each pattern of missing columns on some of them, complete rows too."""
    rng = np.random.default_rng(seed + 100)
    Q = X.sample(len(PATTERNS) + 3, random_state=seed).reset_index(drop=True)
    Q = Q.astype({"c": "float64"}).astype({"c": X["c"].dtype})
    for row, missing in zip(rng.permutation(len(PATTERNS)), PATTERNS):
        Q.loc[row, missing] = np.nan
    return Q


def _observed(Q, row):
    return [name for name in COLUMNS if not pd.isna(Q.loc[row, name])]


def _sub_widths(kept):
    return [WIDTHS[COLUMNS.index(name)] for name in kept]


@pytest.mark.parametrize("seed", range(3))
def test_kernel_density_of_a_row_is_its_observed_columns_marginal(seed):
    """log f and F at a row with missing values equal those of a KernelDensity fitted on
    the row's observed columns (1e-12); a row with none observed has f = F = 1."""
    X, _ = _table(seed)
    Q = _queries(X, seed)
    model = nbattn.KernelDensity(bandwidth=WIDTHS, missing="marginalize").fit(X)
    log_f, cdf = model.score_samples(Q), model.cdf(Q)
    for row in range(len(Q)):
        kept = _observed(Q, row)
        if not kept:
            assert log_f[row] == 0.0 and cdf[row] == 1.0
            continue
        sub = nbattn.KernelDensity(bandwidth=_sub_widths(kept)).fit(X[kept])
        at = Q.loc[[row], kept]
        assert log_f[row] == pytest.approx(sub.score_samples(at)[0], rel=1e-12, abs=1e-12)
        assert cdf[row] == pytest.approx(sub.cdf(at)[0], rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("seed", range(3))
def test_conditional_distribution_given_the_observed_columns(seed):
    """f(y | x), F(y | x) and the quantiles at a row with missing values equal those of a
    ConditionalKernelDensity fitted on the row's observed columns; with none observed,
    f(y | x) is the KernelDensity of y alone at y's width."""
    X, y = _table(seed)
    Q = _queries(X, seed)
    at_y = y[: len(Q)]
    options = dict(y_bandwidth=Y_WIDTH, missing="marginalize")
    model = nbattn.ConditionalKernelDensity(bandwidth=WIDTHS, **options).fit(X, y)
    log_f, cdf = model.score_samples(Q, at_y), model.cdf(Q, at_y)
    quantiles = model.predict_quantile(Q, [0.1, 0.5, 0.9])
    for row in range(len(Q)):
        kept = _observed(Q, row)
        if not kept:
            alone = nbattn.KernelDensity(bandwidth=[Y_WIDTH]).fit(y[:, None])
            assert log_f[row] == pytest.approx(alone.score_samples([[at_y[row]]])[0], rel=1e-12)
            continue
        sub = nbattn.ConditionalKernelDensity(bandwidth=_sub_widths(kept), y_bandwidth=Y_WIDTH)
        sub.fit(X[kept], y)
        at = Q.loc[[row], kept]
        assert log_f[row] == pytest.approx(sub.score_samples(at, at_y[[row]])[0], rel=1e-12)
        assert cdf[row] == pytest.approx(sub.cdf(at, at_y[[row]])[0], rel=1e-12)
        np.testing.assert_allclose(
            quantiles[row], sub.predict_quantile(at, [0.1, 0.5, 0.9])[0], rtol=1e-10, atol=1e-10
        )


def test_quantile_regressor_and_draws_with_missing_values():
    """KernelQuantileRegressor predicts the conditional quantiles given the observed
    columns; ConditionalKernelDensity.sample draws per row and repeats with its seed."""
    X, y = _table(7)
    Q = _queries(X, 7)
    options = dict(bandwidth=WIDTHS, y_bandwidth=Y_WIDTH, missing="marginalize")
    regressor = nbattn.KernelQuantileRegressor(quantile=0.7, **options).fit(X, y)
    conditional = nbattn.ConditionalKernelDensity(**options).fit(X, y)
    np.testing.assert_array_equal(regressor.predict(Q), conditional.predict_quantile(Q, 0.7))
    first = conditional.sample(Q, random_state=3)
    np.testing.assert_array_equal(first, conditional.sample(Q, random_state=3))
    assert first.shape == (len(Q),) and np.isfinite(first).all()


def test_a_model_file_keeps_missing(tmp_path):
    """The saved model and its Predictor (``nbattn predict``'s reader) marginalise as
    the estimator does, bit for bit."""
    X, y = _table(2)
    Q = _queries(X, 2)
    model = nbattn.ConditionalKernelDensity(
        bandwidth=WIDTHS, y_bandwidth=Y_WIDTH, missing="marginalize"
    ).fit(X, y)
    path = nbattn.save(model, tmp_path / "cdens.nbattn")
    want = model.predict_quantile(Q, [0.25, 0.75])
    np.testing.assert_array_equal(nbattn.load(path).predict_quantile(Q, [0.25, 0.75]), want)
    np.testing.assert_array_equal(read_predictor(path)[0].predict_quantile(Q, [0.25, 0.75]), want)


@pytest.mark.parametrize("missing", ["error", "marginalize"])
@pytest.mark.parametrize("estimator", ["KernelDensity", "ConditionalKernelDensity"])
def test_an_incomplete_training_row_is_refused_by_row_and_column(estimator, missing):
    X, y = _table(1)
    X.loc[5, "a"] = np.nan
    model = getattr(nbattn, estimator)(missing=missing)
    args = (X,) if estimator == "KernelDensity" else (X, y)
    with pytest.raises(ValueError, match=r"row 5.*'a'|'a'.*row 5") as info:
        model.fit(*args)
    assert "marginalize" not in str(info.value).split(";")[-1]  # no advice that would fail


def test_a_missing_query_value_is_refused_by_default():
    X, _ = _table(1)
    Q = _queries(X, 1)
    model = nbattn.KernelDensity(bandwidth=WIDTHS).fit(X)
    with pytest.raises(ValueError, match="missing='marginalize'"):
        model.score_samples(Q)
