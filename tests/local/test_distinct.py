"""The local fit on tied keys and tied queries (``nbattn.local.distinct``): the merged
keys and the queries fitted once give the fit of every row, checked against the naive
formula and against the engine with the pooling switched off, over many tied tables."""

import numpy as np
import pytest

from nbattn import LocalPolynomialRegressor
from nbattn.local import engine
from nbattn.local.distinct import Distinct, distinct_problem
from nbattn.local.engine import local_polynomial
from tests import naive


def _tied(rng, n, var_type, levels=4):
    """n rows drawn from few distinct values per column (heavy ties)."""
    columns = []
    for kind in var_type:
        codes = rng.integers(0, levels, n)
        columns.append(codes * 0.7 + 0.1 if kind == "c" else codes)
    return np.column_stack(columns).astype(float)


def _unpooled(monkeypatch):
    monkeypatch.setattr(
        engine, "distinct_problem", lambda problem: Distinct(problem, False, None, None)
    )


@pytest.mark.parametrize("degree", [0, 1, 2])
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_tied_tables_match_the_unpooled_engine_and_the_naive_fit(degree, kernel, monkeypatch):
    var_type = "ccu"
    for seed in range(12):
        rng = np.random.default_rng(seed)
        X = _tied(rng, 120, var_type)
        Q = np.vstack([_tied(rng, 30, var_type), X[:10], X[:10]])  # tied queries too
        y = np.column_stack([np.sin(X[:, 0]) + rng.normal(size=120), rng.normal(size=120)])
        weights = rng.uniform(0.1, 3.0, 120) if seed % 2 else None
        widths = np.array([rng.uniform(0.4, 1.5), rng.uniform(0.4, 1.5), rng.uniform(0, 0.6)])
        kw = dict(var_type=var_type, kernel=kernel, sample_weight=weights)
        fit, grad = local_polynomial(Q, X, y, widths, degree, return_gradient=True, **kw)
        with monkeypatch.context() as patch:
            _unpooled(patch)
            plain, plain_grad = local_polynomial(
                Q, X, y, widths, degree, return_gradient=True, **kw
            )
        scale = 1.0 + np.abs(y).max()
        np.testing.assert_allclose(fit, plain, rtol=0, atol=1e-9 * scale)
        np.testing.assert_allclose(grad, plain_grad, rtol=0, atol=1e-7 * scale)
        if weights is None:
            counts = [0, 0, int(X[:, 2].max()) + 1]
            ref, _, _ = naive.local_polynomial_exact(
                Q, X, y[:, 0], widths, var_type, counts, degree, kernel=kernel
            )
            well_posed = np.isfinite(ref)
            np.testing.assert_allclose(fit[well_posed, 0], ref[well_posed], atol=1e-7 * scale)


def test_a_query_gets_the_same_bits_alone_or_with_its_ties():
    rng = np.random.default_rng(3)
    X = _tied(rng, 200, "cco")
    y = rng.normal(size=200)
    Q = np.vstack([X[:40], X[:40], _tied(rng, 20, "cco")])
    widths = np.array([0.8, 0.6, 0.3])
    together = local_polynomial(Q, X, y, widths, 1, var_type="cco")
    for i in (0, 45, 79, 85):
        alone = local_polynomial(Q[i : i + 1], X, y, widths, 1, var_type="cco")
        assert alone[0] == together[i]
    np.testing.assert_array_equal(together[:40], together[40:80])


def test_a_query_no_key_reaches_takes_the_first_of_its_tied_nearest_keys():
    """A compact kernel and a query beyond every key's reach: the nearest key's value,
    the first of its ties (``nbattn.kernels.local``), not the merged group's mean."""
    X = np.array([[0.0], [1.0], [1.0], [1.0]])
    y = np.array([5.0, 1.0, 2.0, 4.0])
    fit = local_polynomial([[10.0], [1.0]], X, y, [0.5], 0, kernel="epanechnikov")
    assert fit[0] == 1.0  # the first of the three tied keys at 1
    np.testing.assert_allclose(fit[1], 7.0 / 3.0)  # reached: the mean of the three


def test_merged_keys_keep_extreme_weights_and_values():
    """Weights 1e-300 and 1e300 in one group, values near 1.7e308: the merged key's
    weight and value are the group's, no overflow and no underflow to 0."""
    X = np.array([[0.0], [0.0], [0.0], [2.0], [2.0]])
    y = np.array([1.7e308, 1.6e308, -1.0e308, 1.0, 3.0])
    weights = np.array([1e300, 1e-300, 1e300, 1e-300, 3e-300])
    fit = local_polynomial([[0.0], [2.0], [1.0]], X, y, [0.02], 0, sample_weight=weights)
    assert np.isfinite(fit).all()
    np.testing.assert_allclose(fit[0], (1.7e308 - 1.0e308) / 2, rtol=1e-12)
    np.testing.assert_allclose(fit[1], (1.0 + 9.0) / 4.0, rtol=1e-12)


def test_zero_weight_groups_and_the_leave_one_out_path_are_left_alone():
    X = np.array([[0.0], [0.0], [1.0], [1.0], [3.0]])
    y = np.array([1.0, 2.0, 3.0, 5.0, 7.0])
    weights = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    fit = local_polynomial([[0.0], [1.0]], X, y, [0.7], 0, sample_weight=weights)
    want = naive.local_polynomial_exact([[0.0], [1.0]], X[2:], y[2:], np.array([0.7]), "c", [0], 0)[
        0
    ]
    np.testing.assert_allclose(fit, want, rtol=1e-12)
    from nbattn.local.problem import prepare

    loo = prepare(X, X, y, [0.7], 0, exclude_self=True)
    assert distinct_problem(loo).problem is loo


def test_the_estimator_predicts_a_tied_table_as_the_unpooled_engine(monkeypatch):
    rng = np.random.default_rng(5)
    X = _tied(rng, 400, "cuu", levels=5)
    y = X[:, 0] + X[:, 1] * 0.3 + rng.normal(size=400)
    model = LocalPolynomialRegressor(bandwidth=[0.9, 0.2, 0.3], var_type="cuu").fit(X, y)
    got = model.predict(X)
    again = LocalPolynomialRegressor(bandwidth=[0.9, 0.2, 0.3], var_type="cuu").fit(X, y)
    np.testing.assert_array_equal(got, again.predict(X))
    _unpooled(monkeypatch)
    np.testing.assert_allclose(got, model.predict(X), rtol=0, atol=1e-10 * np.abs(y).max())
