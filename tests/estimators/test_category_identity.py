"""One identity of a category at fit and at predict: equal-but-different values (True
and 1, 1.0 and np.int64(1), False and 0) are encoded by one rule, and what a
category cannot be is refused naming the column."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn._core import columns

# values that Python's == (and a set) merges, with the category each must be
_SPELLINGS = [
    (True, ("bool", True)),
    (False, ("bool", False)),
    (np.bool_(True), ("bool", True)),
    (1, ("number", 1)),
    (1.0, ("number", 1)),
    (np.int64(1), ("number", 1)),
    (np.float32(1.0), ("number", 1)),
    (0, ("number", 0)),
    (0.0, ("number", 0)),
    (np.uint8(0), ("number", 0)),
    (2, ("number", 2)),
]


@settings(max_examples=40)
@given(
    st.lists(st.sampled_from(range(len(_SPELLINGS))), min_size=2, max_size=30),
    st.sampled_from("uo"),
)
def test_fit_and_predict_agree_on_equal_but_different_values(picks, kind):
    values = [_SPELLINGS[i][0] for i in picks]
    X = pd.DataFrame({"a": pd.Series(values, dtype=object)})
    y = np.arange(len(values), dtype=float)
    model = nbattn.NadarayaWatsonRegressor(var_type=kind, bandwidth=0.3).fit(X, y)
    expected = {_SPELLINGS[i][1] for i in picks}
    assert {columns.category_key(c) for c in model.categories_[0]} == expected
    assert len(model.categories_[0]) == len(expected)
    codes = model.X_fit_[:, 0]
    for i, pick in enumerate(picks):  # the code is the category the value is
        key = _SPELLINGS[pick][1]
        assert columns.category_key(model.categories_[0][int(codes[i])]) == key
    first = model.predict(X)  # every value of the training column is a known category
    np.testing.assert_array_equal(first, model.predict(X))
    again = nbattn.NadarayaWatsonRegressor(var_type=kind, bandwidth=0.3).fit(X, y)
    assert again.categories_ == model.categories_
    np.testing.assert_array_equal(again.X_fit_, model.X_fit_)


def test_row_order_does_not_change_the_categories():
    values = [1, True, 1.0, False, 0, np.int64(2)]
    orders = [values, values[::-1], values[2:] + values[:2]]
    keys = [
        [
            columns.category_key(c)
            for c in columns.fit_categories(pd.DataFrame({"a": pd.Series(v, dtype=object)}), "o")[0]
        ]
        for v in orders
    ]
    assert keys[0] == keys[1] == keys[2]
    assert keys[0] == [("bool", False), ("number", 0), ("bool", True), ("number", 1), ("number", 2)]


@pytest.mark.parametrize(
    "values",
    [["x", 1, "y"], [2.5, "2.5"], [True, "True"]],
)
def test_text_beside_numbers_is_refused_naming_the_column(values):
    X = pd.DataFrame({"mixed up": pd.Series(values, dtype=object)})
    with pytest.raises(ValueError, match="'mixed up' holds both text"):
        nbattn.NadarayaWatsonRegressor(var_type="u").fit(X, np.arange(len(values), dtype=float))


@pytest.mark.parametrize(
    "make",
    [
        lambda n: pd.cut(np.linspace(0, 1, n), 3),
        lambda n: pd.cut(np.linspace(0, 1, n), 4).as_ordered(),
        lambda n: pd.Categorical(pd.date_range("2020-01-01", periods=n, freq="D")),
        lambda n: pd.Categorical(
            pd.date_range("2021-03-01", periods=n, freq="h", tz="UTC"), ordered=True
        ),
        lambda n: pd.Categorical(pd.to_timedelta(np.arange(n), unit="s")),
    ],
)
def test_interval_and_timestamp_categories_are_refused_naming_the_column(make):
    n = 12
    X = pd.DataFrame({"x": np.arange(n, dtype=float), "when": make(n)})
    for estimator in (nbattn.NadarayaWatsonRegressor(), nbattn.NadarayaWatsonClassifier()):
        y = np.arange(n) % 2
        with pytest.raises(ValueError, match=r"X column 'when'.*rename_categories\(str\)"):
            estimator.fit(X, y)
    # what the message advises works, in the dtype's order
    fixed = X.assign(when=X["when"].cat.rename_categories(str))
    model = nbattn.NadarayaWatsonRegressor().fit(fixed, np.arange(n, dtype=float))
    assert model.categories_[1] == [str(c) for c in X["when"].cat.categories]


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_a_table_without_columns_is_named(tmp_path, rows):
    from nbattn.persistence.predictor import read_predictor

    # a DataFrame gets its own message; an array scikit-learn's "0 feature(s)"
    empty = {
        "DataFrame without columns": pd.DataFrame(index=range(rows)),
        r"0 (feature|sample)|, 0\)": np.empty((rows, 0)),
    }
    y = np.arange(max(rows, 2), dtype=float)
    for message, X in empty.items():
        for make in (nbattn.NadarayaWatsonRegressor, nbattn.LocalPolynomialRegressor):
            with pytest.raises(ValueError, match=message):
                make().fit(X, y[: len(X)])
    rng = np.random.default_rng(rows)
    for train in (
        pd.DataFrame({"a": rng.uniform(0, 1, 9)}),
        pd.DataFrame({"a": rng.choice(["p", "q"], 9)}),
    ):
        model = nbattn.NadarayaWatsonRegressor().fit(train, rng.normal(0, 1, 9))
        nbattn.save(model, tmp_path / "m.npz")
        predictor = read_predictor(tmp_path / "m.npz")[0]
        for message, X in empty.items():
            for reader in (model, predictor):
                with pytest.raises(ValueError, match=message):
                    reader.predict(X)
