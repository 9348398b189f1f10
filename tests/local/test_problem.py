"""The local fit's inputs are checked once (nbattn.local.problem): by the public
functions, or by the estimator that hands the engine its own checked data."""

import dataclasses
import sys

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn.local.engine import local_polynomial
from nbattn.local.problem import LocalSpec, check_columns, check_data, check_spec
from nbattn.local.widths import local_loo_widths

#: The functions that check or convert a table of rows; each call on X is an X check.
CHECKERS = (
    "as_float_array",
    "as_columns",
    "as_data_columns",
    "check_array",
    "check_X_y",
    "validate_data",
    "check_pooling_inputs",
    "check_xy",
    "prepare_xy",
    "check_columns",
    "check_data",
)


def _rows_of(arg, shape):
    if isinstance(arg, dict):  # check_columns' {name: array}
        return any(_rows_of(value, shape) for value in arg.values())
    return isinstance(arg, (np.ndarray, pd.DataFrame)) and arg.shape == shape


@pytest.fixture
def x_checks(monkeypatch):
    """``watch(shape)`` starts recording the checks of arrays of that shape, in every
    nbattn module that holds a checker; returns the list the calls are appended to."""

    def watch(shape):
        seen = []
        for name, module in list(sys.modules.items()):
            if not name.startswith("nbattn"):
                continue
            for attr in CHECKERS:
                checker = module.__dict__.get(attr)
                if not callable(checker):
                    continue

                def counted(*args, _checker=checker, _attr=attr, **kwargs):
                    if not kwargs.get("skip_check_array") and any(
                        _rows_of(arg, shape) for arg in args[:3]
                    ):
                        seen.append(_attr)
                    return _checker(*args, **kwargs)

                monkeypatch.setattr(module, attr, counted)
        return seen

    return watch


def _mixed_table(rng, n):
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.uniform(size=n),
            "c": pd.Categorical(rng.choice(["x", "y", "z"], n)),
        }
    )


def _target(frame, rng):
    codes = frame["c"].cat.codes.to_numpy()
    return np.sin(2 * frame["a"].to_numpy()) + 0.5 * codes + 0.1 * rng.normal(size=len(frame))


@pytest.mark.parametrize(
    "make",
    [
        lambda: nbattn.LocalPolynomialRegressor(bandwidth="loo", degree=1),
        lambda: nbattn.LocalPolynomialRegressor(bandwidth="scott", degree=2),
        lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo"),
        lambda: nbattn.NadarayaWatsonRegressor(bandwidth="silverman", kernel="tricube"),
    ],
)
@pytest.mark.parametrize("table", [False, True])
def test_fit_and_predict_check_x_once(make, table, x_checks):
    """X is checked once in fit, and the queries once in predict."""
    rng = np.random.default_rng(3)
    frame = _mixed_table(rng, 60)
    y = _target(frame, rng)
    X = frame if table else frame[["a", "b"]].to_numpy()
    queries = X.iloc[:7] if table else X[:7]
    make().fit(X, y).predict(queries)  # imports and compiles what the calls need
    seen = x_checks(X.shape)
    model = make().fit(X, y)
    assert len(seen) == 1, seen
    seen_predict = x_checks(queries.shape)
    model.predict(queries)
    assert len(seen_predict) == 1, seen_predict


def test_the_count_sees_the_public_checks(x_checks):
    """The public function checks its queries and keys: the count is not blind."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 2))
    local_polynomial(X, X, X[:, 0], "scott", 1)
    seen = x_checks(X.shape)
    local_polynomial(X, X, X[:, 0], "scott", 1)
    assert len(seen) >= 2, seen


@pytest.mark.parametrize("seed", range(6))
def test_estimator_equals_the_public_functions(seed):
    """The estimator's checked path and the public functions' give the same bits."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 70))
    X = np.column_stack([rng.normal(size=n), rng.integers(0, 3, n), rng.uniform(size=n)])
    y = X[:, 0] ** 2 + X[:, 1] + 0.1 * rng.normal(size=n)
    degree = int(rng.integers(0, 3))
    weights = rng.uniform(0.5, 2.0, n) if seed % 2 else None
    kw = dict(var_type="cuc", n_categories=[0, 3, 0], sample_weight=weights)
    model = nbattn.LocalPolynomialRegressor(bandwidth="loo", degree=degree, var_type="cuc")
    model.fit(pd.DataFrame(X).astype({1: int}).astype({1: "category"}), y, sample_weight=weights)
    # the model's categories are the codes 0, 1, 2 in their order, as the public call's
    widths = local_loo_widths(X, y, degree, **kw)
    assert np.array_equal(model.bandwidth_, widths)
    queries = X[: n // 2]
    frame = pd.DataFrame(queries).astype({1: int}).astype({1: "category"})
    frame[1] = frame[1].cat.set_categories(model.categories_[1])
    want = local_polynomial(queries, X, y, widths, degree, **kw)
    assert np.array_equal(model.predict(frame), want)


def test_spec_is_frozen_and_checked():
    spec = check_spec(3, var_type="cuo", n_categories=[0, 4, 5])
    assert spec == LocalSpec("cuo", (0, 4, 5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.kernel = "tricube"
    for options, word in [
        (dict(kernel="box"), "kernel"),
        (dict(missing="drop"), "missing"),
        (dict(ridge=-1.0), "ridge"),
        (dict(var_type="cx"), "var_type"),
        (dict(var_type="cu", n_categories=[0, 1.5]), "n_categories"),
    ]:
        with pytest.raises(ValueError, match=word):
            check_spec(2, **options)


def test_data_checked_against_the_spec_name_the_argument_and_column():
    X = np.array([[0.1, 0.0], [0.2, 1.0], [0.3, 2.0]])
    spec, (keys,) = check_columns({"keys": X}, var_type="cu")
    assert spec.n_categories == (0, 3)
    assert np.array_equal(check_data(spec, X[:2], "queries"), X[:2])
    with pytest.raises(ValueError, match="queries column 1 .* 3 categories"):
        check_data(spec, [[0.1, 3.0]], "queries")
    with pytest.raises(ValueError, match="queries has 3 features"):
        check_data(spec, np.ones((2, 3)), "queries")
    with pytest.raises(ValueError, match="queries has 1 features but keys has 2"):
        check_columns({"keys": X, "queries": np.ones((2, 1))}, var_type="cu")
    with pytest.raises(ValueError, match="X"):
        check_columns({"X": [[np.nan, 0.0]]}, var_type="cu")


def test_a_query_code_outside_the_keys_categories_is_refused():
    """The categories are the keys': a query's unseen code is an error (not a larger c,
    which would change the fit at every other query)."""
    keys = np.array([[0.0, 0.0], [0.5, 1.0], [1.0, 2.0], [0.2, 0.0]])
    values = np.arange(4.0)
    for code in (-1.0, 3.0, 7.0, 2.5):
        with pytest.raises(ValueError, match="queries column 1 .* 3 categories"):
            local_polynomial([[0.0, code]], keys, values, [0.5, 0.3], var_type="cu")
    alone = local_polynomial([[0.0, 2.0]], keys, values, [0.5, 0.3], var_type="cu")
    together = local_polynomial([[0.0, 2.0], [0.3, 0.0]], keys, values, [0.5, 0.3], var_type="cu")
    assert together[0] == alone[0]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_loo_widths_of_huge_and_tiny_targets(seed, scale):
    """The LOO search divides y near 1e+-300 by a power of two (its squares would overflow
    or underflow): its widths are as good for y itself as the widths found on y, and the
    fit scales with y."""
    from nbattn.local.engine import local_loo_loss

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=50)
    plain = nbattn.LocalPolynomialRegressor(bandwidth="loo").fit(X, y)
    scaled = nbattn.LocalPolynomialRegressor(bandwidth="loo").fit(X, y * scale)
    # L-BFGS-B's stopping test depends on the criterion's scale, so the search on c y stops
    # within its tolerance of the search on y, for any c (not only near 1e+-300)
    best = local_loo_loss(X, y, plain.bandwidth_, 1)
    assert local_loo_loss(X, y, scaled.bandwidth_, 1) <= best * (1 + 1e-2)
    prediction = scaled.predict(X[:9])
    assert np.isfinite(prediction).all()
    same_widths = local_polynomial(X[:9], X, y, scaled.bandwidth_, 1)
    np.testing.assert_allclose(prediction / scale, same_widths, rtol=1e-9, atol=1e-12)
