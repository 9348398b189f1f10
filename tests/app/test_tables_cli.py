"""Mixed tables through the command line, batch prediction, Dask and the figures."""

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn.app import batch, cli, io, plotting


def _mixed(rng, n=90):
    size = rng.choice(["small", "large"], n)
    town = rng.choice(["Oslo", "Lima", "Pune"], n)
    x = rng.uniform(0, 4, n)
    y = np.sin(x) + (size == "large") * 1.5 + (town == "Lima") * 0.7 + rng.normal(0, 0.1, n)
    return pd.DataFrame({"x": x, "size": size, "town": town, "y": y})


@pytest.fixture
def mixed(tmp_path):
    frame = _mixed(np.random.default_rng(5))
    frame.to_csv(tmp_path / "train.csv", index=False)
    return tmp_path, frame


def _fit(folder, *extra):
    code = cli.main(
        ["fit", str(folder / "train.csv"), "--target", "y", "-q", "-o", str(folder / "m.npz")]
        + [str(e) for e in extra]
    )
    assert code == 0
    return nbattn.load(folder / "m.npz")


def test_fit_reads_text_columns_as_categories(mixed):
    folder, frame = mixed
    model = _fit(folder, "--model", "lp", "--degree", "1", "--bandwidth", "scott")
    assert isinstance(model, nbattn.LocalPolynomialRegressor) and model.degree == 1
    assert model.var_type_ == "cuu"
    assert model.categories_[1:] == [["large", "small"], ["Lima", "Oslo", "Pune"]]
    same = nbattn.LocalPolynomialRegressor(bandwidth="scott", var_type="cuu").fit(
        frame[["x", "size", "town"]], frame["y"]
    )
    X = frame[["x", "size", "town"]]
    np.testing.assert_allclose(model.predict(X), same.predict(X), rtol=1e-12)


def test_predict_and_evaluate_a_mixed_file(mixed, capsys):
    folder, frame = mixed
    model = _fit(folder, "--kernel", "tricube", "--var-type", "cuo")
    assert model.var_type_ == "cuo" and model.kernel == "tricube"
    code = cli.main(
        ["predict", str(folder / "m.npz"), str(folder / "train.csv"), "-q"]
        + ["--chunksize", "17", "-o", str(folder / "out.csv")]
    )
    assert code == 0
    out = pd.read_csv(folder / "out.csv")
    np.testing.assert_allclose(
        out["prediction"], model.predict(frame[["x", "size", "town"]]), rtol=1e-12
    )
    capsys.readouterr()
    assert cli.main(["evaluate", str(folder / "m.npz"), str(folder / "train.csv"), "--json"]) == 0
    assert '"mse"' in capsys.readouterr().out


def test_on_nan_marginalize_keeps_rows(mixed, capsys):
    folder, frame = mixed
    frame.loc[3, "x"] = np.nan
    frame.loc[5, "town"] = None
    frame.to_csv(folder / "train.csv", index=False)
    code = cli.main(
        ["fit", str(folder / "train.csv"), "--target", "y", "-o", str(folder / "m.npz")]
    )
    assert code != 0
    assert "missing" in capsys.readouterr().err
    model = _fit(folder, "--on-nan", "marginalize")
    assert model.missing == "marginalize" and len(model.X_fit_) == len(frame)
    code = cli.main(
        ["predict", str(folder / "m.npz"), str(folder / "train.csv"), "-q"]
        + ["--on-nan", "marginalize", "-o", str(folder / "out.csv")]
    )
    assert code == 0
    out = pd.read_csv(folder / "out.csv")
    assert len(out) == len(frame) and np.isfinite(out["prediction"]).all()


def test_unseen_category_in_a_file_names_column_and_value(mixed, capsys):
    folder, frame = mixed
    _fit(folder)
    frame.loc[0, "town"] = "Rome"
    frame.to_csv(folder / "new.csv", index=False)
    code = cli.main(
        ["predict", str(folder / "m.npz"), str(folder / "new.csv"), "-o", str(folder / "o.csv")]
    )
    assert code != 0
    assert "'Rome'" in capsys.readouterr().err


def test_feature_block_reads_kinds(mixed):
    _, frame = mixed
    assert io.text_kinds(frame, ["x", "size", "town"]) == "cuu"
    block, keep = io.feature_block(frame, ["x", "town"], "cu")
    assert block["x"].dtype == np.float64 and block["town"].tolist() == frame["town"].tolist()
    assert keep.all()


def test_dask_predict_with_mixed_columns(mixed):
    pytest.importorskip("dask.dataframe")
    import dask.dataframe as dd

    from nbattn.app import dask as nbdask

    _, frame = mixed
    X = frame[["x", "size", "town"]]
    model = nbattn.NadarayaWatsonRegressor().fit(X, frame["y"])
    ddf = dd.from_pandas(X, npartitions=3)
    got = nbdask.predict(model, ddf).compute()
    np.testing.assert_allclose(np.asarray(got), model.predict(X), rtol=1e-12)


# ----------------------------------------------------------------------------- figures


def test_fit_figure_draws_band_and_one_panel_per_feature(mixed):
    pytest.importorskip("matplotlib")
    _, frame = mixed
    X = frame[["x", "size", "town"]]
    model = nbattn.LocalPolynomialRegressor(bandwidth="scott").fit(X, frame["y"])
    fig = plotting.fit_figure(model, X, frame["y"].to_numpy(), "y")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3
    assert visible[0].collections, "the continuous panel has no band"
    assert [t.get_text() for t in visible[2].get_xticklabels()] == ["Lima", "Oslo", "Pune"]


def test_relative_widths(mixed):
    _, frame = mixed
    X = frame[["x", "size", "town"]]
    model = nbattn.NadarayaWatsonRegressor(bandwidth=[0.5, 0.25, 0.4]).fit(X, frame["y"])
    ratios = plotting.relative_widths(model)
    np.testing.assert_allclose(ratios[0], 0.5 / np.std(frame["x"], ddof=1))
    np.testing.assert_allclose(ratios[1:], [0.25 / 0.5, 0.4 / (2 / 3)])


def test_heatmap_orders_by_prediction(mixed):
    pytest.importorskip("matplotlib")
    _, frame = mixed
    X = frame[["x", "size", "town"]]
    model = nbattn.NadarayaWatsonRegressor().fit(X, frame["y"])
    fig = plotting.attention_figure(model, X.iloc[:20])
    assert "by prediction" in fig.axes[0].get_xlabel()


def test_batch_load_xy_returns_kinds(mixed):
    folder, _ = mixed
    X, y, dropped, kinds = batch.load_xy(
        folder / "train.csv", ["x", "size", "town"], "y", classifier=False
    )
    assert kinds == "cuu" and dropped == 0 and X["size"].map(type).eq(str).all()


def test_a_stray_word_in_a_numeric_column_is_an_error_not_a_category():
    frame = pd.DataFrame({"x": ["1.5", "2", "abc", "4"], "town": ["a", "b", "a", "7"]})
    assert io.text_kinds(frame, ["x", "town"]) == "cu"
    with pytest.raises(ValueError, match="column 'x' holds 'abc'"):
        io.feature_block(frame, ["x", "town"], "cu")
