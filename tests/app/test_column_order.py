"""Categorical columns keep their order and their type through every reader: the command
line on CSV and Parquet, nbattn.dask, model files; and the command line fits what the
library fits on the same table."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.app import cli, io

pytest.importorskip("pyarrow")

_SETTINGS = settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def ordered_levels(draw):
    """(levels in their order, the values of a table column): integers (where text order
    differs from numeric order), floats, or words in an order of their own."""
    kind = draw(st.sampled_from(["int", "float", "text"]))
    k = draw(st.integers(3, 9))
    if kind == "int":
        levels = sorted(draw(st.sets(st.integers(-30, 300), min_size=k, max_size=k)))
    elif kind == "float":
        levels = sorted(draw(st.sets(st.integers(-999, 999), min_size=k, max_size=k)), key=int)
        levels = [v / 8 for v in levels]
    else:
        words = draw(
            st.lists(
                st.text("abcdefghij", min_size=1, max_size=4), min_size=k, max_size=k, unique=True
            )
        )
        levels = draw(st.permutations(words))
    seed = draw(st.integers(0, 2**32 - 1))
    return kind, list(levels), seed


def _table(levels, seed, n=60):
    rng = np.random.default_rng(seed)
    codes = np.concatenate([np.arange(len(levels)), rng.integers(0, len(levels), n)])
    values = [levels[c] for c in codes]
    y = codes * 0.5 + rng.normal(0, 0.1, len(codes))
    return values, codes, y


def _cli_fit(folder, data, *extra):
    out = folder / "m.npz"
    args = ["fit", str(data), "--target", "y", "-q", "-o", str(out), "--bandwidth", "0.4"]
    assert cli.main(args + list(extra)) == 0
    return nbattn.load(out)


def _cli_predict(folder, model_path, data):
    out = folder / "p.csv"
    assert cli.main(["predict", str(model_path), str(data), "-q", "-o", str(out)]) == 0
    return pd.read_csv(out)["prediction"].to_numpy()


@_SETTINGS
@given(ordered_levels())
def test_csv_ordered_column_keeps_its_values_order(tmp_path, drawn):
    kind, levels, seed = drawn
    values, codes, y = _table(levels, seed)
    pd.DataFrame({"lev": values, "y": y}).to_csv(tmp_path / "t.csv", index=False)
    model = _cli_fit(tmp_path, tmp_path / "t.csv", "--var-type", "o")
    expected = sorted(levels) if kind == "text" else levels
    assert model.categories_ == [expected]
    # the library on the same file read by pandas
    frame = pd.read_csv(tmp_path / "t.csv")
    lib = nbattn.NadarayaWatsonRegressor(var_type="o", bandwidth=0.4).fit(
        frame[["lev"]], frame["y"]
    )
    assert lib.categories_ == model.categories_
    got = _cli_predict(tmp_path, tmp_path / "m.npz", tmp_path / "t.csv")
    np.testing.assert_array_equal(got, lib.predict(frame[["lev"]]))


@_SETTINGS
@given(ordered_levels())
def test_parquet_ordered_categorical_keeps_its_dtype_order(tmp_path, drawn):
    kind, levels, seed = drawn
    values, codes, y = _table(levels, seed)
    cat = pd.Categorical(values, categories=levels, ordered=True)
    frame = pd.DataFrame({"lev": cat, "y": y})
    frame.to_parquet(tmp_path / "t.parquet")
    read = pd.read_parquet(tmp_path / "t.parquet")
    # Parquet keeps a text categorical's dtype (ordered, its order); numbers come back as
    # plain numbers (pandas and pyarrow alike), which --var-type o orders numerically
    extra, var_type = ([], None) if kind == "text" else (["--var-type", "o"], "o")
    model = _cli_fit(tmp_path, tmp_path / "t.parquet", *extra)
    assert model.var_type_ == "o" and model.categories_ == [levels]
    lib = nbattn.NadarayaWatsonRegressor(bandwidth=0.4, var_type=var_type)
    lib.fit(read[["lev"]], read["y"])
    assert lib.var_type_ == "o" and lib.categories_ == [levels]
    got = _cli_predict(tmp_path, tmp_path / "m.npz", tmp_path / "t.parquet")
    np.testing.assert_array_equal(got, lib.predict(read[["lev"]]))
    # and the model file keeps the order and the values' types
    nbattn.save(lib, tmp_path / "lib.npz")
    back = nbattn.load(tmp_path / "lib.npz")
    assert back.categories_ == [levels]
    assert [type(v) for v in back.categories_[0]] == [type(v) for v in levels]


@_SETTINGS
@given(ordered_levels())
def test_dask_fit_keeps_the_order(drawn):
    dd = pytest.importorskip("dask.dataframe")
    from nbattn.app import dask as nbdask

    _, levels, seed = drawn
    values, codes, y = _table(levels, seed)
    X = pd.DataFrame({"lev": pd.Categorical(values, categories=levels, ordered=True)})
    make = lambda: nbattn.NadarayaWatsonRegressor(bandwidth=0.4)  # noqa: E731
    model = nbdask.fit(
        make(),
        dd.from_pandas(X, npartitions=3),
        dd.from_pandas(pd.Series(y, name="y"), npartitions=3),
    )
    assert model.var_type_ == "o" and model.categories_ == [levels]
    got = nbdask.predict(model, dd.from_pandas(X, npartitions=2)).compute(scheduler="sync")
    np.testing.assert_array_equal(got.to_numpy(), make().fit(X, y).predict(X))


def test_cli_types_int_and_bool_columns_as_the_library(tmp_path):
    rng = np.random.default_rng(3)
    n = 80
    frame = pd.DataFrame(
        {
            "flag": rng.choice([True, False], n),
            "count": rng.integers(0, 5, n),
            "x": rng.uniform(0, 1, n),
        }
    )
    frame["y"] = frame["flag"] * 1.0 + frame["count"] * 0.3 + frame["x"] + rng.normal(0, 0.1, n)
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    features = ["flag", "count", "x"]
    for name, read in (("t.csv", pd.read_csv), ("t.parquet", pd.read_parquet)):
        table = read(tmp_path / name)
        lib = nbattn.NadarayaWatsonRegressor(bandwidth=0.4).fit(table[features], table["y"])
        model = _cli_fit(tmp_path, tmp_path / name)
        assert model.var_type_ == lib.var_type_ == "ucc"
        assert model.categories_ == lib.categories_ == [[False, True], None, None]
        got = _cli_predict(tmp_path, tmp_path / "m.npz", tmp_path / name)
        np.testing.assert_array_equal(got, lib.predict(table[features]))


@pytest.mark.parametrize(
    "categories",
    [[1, 2, 3], [1.5, 2.25, 7.0], [False, True], ["1", "2", "x"]],
)
def test_cli_predicts_with_a_model_fitted_in_python_on_typed_categories(tmp_path, categories):
    rng = np.random.default_rng(len(categories))
    n = 60
    values = [categories[i] for i in rng.integers(0, len(categories), n)]
    X = pd.DataFrame({"c": pd.Series(values, dtype=object), "x": rng.uniform(0, 1, n)})
    y = rng.normal(0, 1, n)
    for var_type in ("uc", "oc"):
        model = nbattn.NadarayaWatsonRegressor(var_type=var_type, bandwidth=0.3).fit(X, y)
        nbattn.save(model, tmp_path / "m.npz")
        X.to_csv(tmp_path / "q.csv", index=False)
        got = _cli_predict(tmp_path, tmp_path / "m.npz", tmp_path / "q.csv")
        np.testing.assert_array_equal(got, model.predict(X))


def test_category_values_types_a_whole_column_alike_in_every_chunk():
    text = pd.Series(["12", "9", None, "10", "1"], dtype=object)
    assert io.category_values(text).tolist() == [12, 9, None, 10, 1]
    for chunk in (text.iloc[:2], text.iloc[2:]):
        typed = io.category_values(chunk, [1, 9, 10, 12]).tolist()
        assert typed == [None if v is None else int(v) for v in chunk]
    mixed = pd.Series(["1", "x"], dtype=object)
    assert io.category_values(mixed).tolist() == ["1", "x"]
    assert io.category_values(mixed, ["1", "x"]).tolist() == ["1", "x"]
    assert io.category_values(pd.Series(["True", "false"])).tolist() == [True, False]
