"""``nbattn predict --interval / --marginal-effects`` and ``nbattn fit``'s row-id warning
and ``--drop``: real CSV files, compared with the Python estimator."""

import re
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.app import batch, cli
from nbattn.app.process import Interrupted

ROOT = Path(__file__).resolve().parents[2]
FEATURES = ["x1", "colour", "x2"]


def call(capsys, *args):
    """``nbattn ARGS`` in this process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _table(rng, n):
    x1 = rng.uniform(0, 6, n)
    x2 = rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], n)
    y = 2 * np.sin(x1) + 0.3 * x2 + (colour == "red") + rng.normal(0, 0.3, n)
    return pd.DataFrame(
        {"id": np.arange(500, 500 + n), "x1": x1, "colour": colour, "x2": x2, "y": y}
    )


def _read(path):
    return pd.read_csv(path)  # pandas reads back the digits it wrote, exactly


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """train.csv (80 rows) and query.csv (230 rows: more than two chunks of 100)."""
    folder = tmp_path_factory.mktemp("outputs")
    rng = np.random.default_rng(11)
    _table(rng, 80).to_csv(folder / "train.csv", index=False)
    _table(rng, 230).to_csv(folder / "query.csv", index=False)
    return folder


#: name -> the model options of ``nbattn fit`` (features given by each case)
MODELS = {
    "nw": ["--features", "x1,x2"],
    "mixed-lp": ["--features", "x1,colour,x2", "--model", "lp", "--bandwidth", "scott"],
    "learned-full": ["--features", "x1,x2", "--model", "learned", "--metric", "full"]
    + ["--max-iter", "4"],
    "average": ["--features", "x1,x2", "--kernel", "average"],
    "classifier": ["--features", "x1,x2", "--model", "classifier", "--target", "colour"],
    "categories-only": ["--features", "colour"],
}


def _model(folder, name):
    path = folder / f"{name}.npz"
    if not path.exists():
        target = [] if "--target" in MODELS[name] else ["--target", "y"]
        args = ["fit", folder / "train.csv", *target, *MODELS[name], "-q", "-o", path]
        assert cli.main([str(a) for a in args]) == 0
    return path


def _queries(path, data):
    model, features, _ = batch.read_model(path)
    kinds, cats = batch.model_kinds(model, features), batch.model_categories(model, features)
    return batch.first_rows(data, features, 10_000, kinds=kinds, categories=cats)


# ----------------------------------------------------------------------------- predict


def test_predict_file_writes_predict_columns_and_refuses_a_keyword_it_lacks(files, tmp_path):
    """predict_file's output keywords are predict_columns' own: the file holds what
    predict_columns gives for the same keywords, and a keyword that predict_columns
    lacks is refused by name before anything is written."""
    model, features, _ = batch.read_model(_model(files, "mixed-lp"))
    out = tmp_path / "p.csv"
    options = {"std": True, "interval": 0.2, "kind": "observation", "effects": ["x1"]}
    batch.predict_file(model, features, files / "query.csv", out, name="y", **options)
    want = batch.predict_columns(
        model, _queries(_model(files, "mixed-lp"), files / "query.csv"), name="y", **options
    )
    written = _read(out)
    assert list(written.columns) == list(want)
    for column, values in want.items():
        np.testing.assert_allclose(written[column], values, rtol=1e-15)
    with pytest.raises(TypeError, match="intervals"):
        batch.predict_file(model, features, files / "query.csv", tmp_path / "q.csv", intervals=0.1)
    assert not (tmp_path / "q.csv").exists()


@pytest.mark.parametrize("name", ["nw", "mixed-lp", "learned-full"])
@pytest.mark.parametrize("kind", [None, "observation"])
def test_intervals_and_slopes_are_the_estimators(files, capsys, name, kind):
    """Chunks of 100 rows, written to CSV and read back: the estimator's
    ``predict_interval`` and ``marginal_effects`` on the whole file, to the bit (the
    prediction and std: the estimator's on the same chunks)."""
    path, out = _model(files, name), files / f"{name}-{kind}.csv"
    capsys.readouterr()
    args = ["predict", path, files / "query.csv", "-o", out, "--chunksize", "100"]
    args += ["--interval", "0.1", "--marginal-effects", "--id-column", "id", "--std", "-q"]
    args += [] if kind is None else ["--kind", kind]
    code, stdout, err = call(capsys, *args)
    assert (code, stdout, err) == (0, "", "")
    written = _read(out)
    estimator = nbattn.load(path)
    X = _queries(path, files / "query.csv")
    continuous = [f for f, k in zip(estimator.feature_names_in_, estimator.var_type_) if k == "c"]
    slope_columns = [f"d_y_d_{f}" for f in continuous]
    assert list(written.columns) == ["id", "prediction", "std", "y_lower", "y_upper"] + (
        slope_columns
    )
    assert written["id"].tolist() == list(range(500, 730))
    band = estimator.predict_interval(X, alpha=0.1, kind=kind or "mean")
    np.testing.assert_array_equal(written["y_lower"], band[:, 0])
    np.testing.assert_array_equal(written["y_upper"], band[:, 1])
    np.testing.assert_array_equal(written[slope_columns], estimator.marginal_effects(X))
    chunks = [estimator.predict(X.iloc[i : i + 100], return_std=True) for i in (0, 100, 200)]
    np.testing.assert_array_equal(written["prediction"], np.concatenate([c[0] for c in chunks]))
    np.testing.assert_array_equal(written["std"], np.concatenate([c[1] for c in chunks]))
    assert np.all(written["y_lower"] < written["prediction"])
    assert np.all(written["prediction"] < written["y_upper"])


def test_an_observation_interval_is_wider_and_alpha_narrows_it(files, capsys):
    path = _model(files, "nw")
    widths = {}
    for alpha, kind in ((0.05, "mean"), (0.05, "observation"), (0.5, "mean")):
        out = files / f"w-{alpha}-{kind}.csv"
        args = ["predict", path, files / "query.csv", "-o", out, "-q"]
        assert call(capsys, *args, "--interval", alpha, "--kind", kind)[0] == 0
        written = _read(out)
        widths[alpha, kind] = (written["y_upper"] - written["y_lower"]).to_numpy()
    assert np.all(widths[0.05, "observation"] > widths[0.05, "mean"])
    assert np.all(widths[0.5, "mean"] < widths[0.05, "mean"])


def test_a_model_saved_without_a_target_names_its_columns_prediction(files, tmp_path, capsys):
    frame = pd.read_csv(files / "train.csv")
    model = nbattn.NadarayaWatsonRegressor().fit(frame[["x1", "x2"]], frame["y"])
    nbattn.save(model, tmp_path / "m.npz")
    out = tmp_path / "p.csv"
    args = ["predict", tmp_path / "m.npz", files / "query.csv", "-o", out, "-q"]
    assert call(capsys, *args, "--interval", "0.2", "--marginal-effects")[0] == 0
    assert list(_read(out).columns) == [
        "prediction",
        "prediction_lower",
        "prediction_upper",
        "d_prediction_d_x1",
        "d_prediction_d_x2",
    ]


def test_a_model_of_two_targets_is_refused(files, tmp_path, capsys):
    frame = pd.read_csv(files / "train.csv")
    model = nbattn.NadarayaWatsonRegressor().fit(
        frame[["x1", "x2"]], np.column_stack([frame["y"], -frame["y"]])
    )
    nbattn.save(model, tmp_path / "m.npz")
    out = tmp_path / "p.csv"
    args = ["predict", tmp_path / "m.npz", files / "query.csv", "-o", out]
    for option in (["--interval", "0.1"], ["--marginal-effects"]):
        code, _, err = call(capsys, *args, *option)
        assert code == 1 and "need a model of one target" in err and not out.exists(), err


def test_average_pooling_has_flat_slopes(files, capsys):
    path, out = _model(files, "average"), files / "average.csv"
    args = ["predict", path, files / "query.csv", "-o", out, "-q", "--marginal-effects"]
    assert call(capsys, *args)[0] == 0
    written = _read(out)
    assert (written[["d_y_d_x1", "d_y_d_x2"]].to_numpy() == 0).all()


@pytest.mark.parametrize(
    "model, options, message",
    [
        ("classifier", ["--interval", "0.1"], "--interval is for regressors"),
        ("classifier", ["--marginal-effects"], "--marginal-effects is for regressors"),
        ("nw", ["--kind", "mean"], "--kind chooses the kind of interval; it needs --interval"),
        ("average", ["--interval", "0.1"], "--interval needs a kernel"),
        ("categories-only", ["--marginal-effects"], "needs a continuous feature"),
        ("nw", ["--interval", "0.1", "--id-column", "y"], None),
        ("nw", ["--interval", "0.1", "--id-column", "y_lower"], "--id-column 'y_lower'"),
    ],
)
def test_what_does_not_apply_is_refused(files, tmp_path, capsys, model, options, message):
    data = tmp_path / "query.csv"
    pd.read_csv(files / "query.csv").assign(y_lower=1.0).to_csv(data, index=False)
    out = tmp_path / "p.csv"
    code, stdout, err = call(capsys, "predict", _model(files, model), data, "-o", out, *options)
    if message is None:  # an id column of another name than the outputs is fine
        assert code == 0 and list(_read(out).columns)[:2] == ["y", "prediction"]
        return
    assert (code, stdout) == (1, "")
    assert err.count("\n") == 1 and err.startswith("nbattn: error: ") and message in err, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["query.csv"]


@pytest.mark.parametrize("alpha", ["0", "1", "-0.1", "1.5", "nan", "inf", "1e-400", "five"])
def test_a_bad_alpha_is_a_usage_error_naming_the_option(files, capsys, alpha):
    args = ["predict", _model(files, "nw"), files / "query.csv", "-o", files / "never.csv"]
    with pytest.raises(SystemExit) as info:
        cli.main([str(a) for a in args] + ["--interval", alpha])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "argument --interval: expected a number between 0 and 1" in err, err
    assert not (files / "never.csv").exists()


def test_a_bad_kind_is_a_usage_error(files, capsys):
    args = ["predict", _model(files, "nw"), files / "query.csv", "-o", files / "never.csv"]
    with pytest.raises(SystemExit) as info:
        cli.main([str(a) for a in args] + ["--interval", "0.1", "--kind", "median"])
    assert info.value.code == 2 and "argument --kind" in capsys.readouterr().err


def test_a_late_failure_leaves_the_older_output(files, tmp_path, capsys):
    data = tmp_path / "late.csv"
    frame = pd.read_csv(files / "query.csv")
    frame["x2"] = frame["x2"].astype(object)
    frame.loc[210, "x2"] = "oops"
    frame.to_csv(data, index=False)
    out = tmp_path / "p.csv"
    out.write_text("older output\n")
    args = ["predict", _model(files, "nw"), data, "-o", out, "--chunksize", "100"]
    code, stdout, err = call(capsys, *args, "--interval", "0.1", "--marginal-effects")
    assert (code, stdout) == (1, "") and "data row 211" in err and "'oops'" in err, err
    assert out.read_text() == "older output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.csv", "p.csv"]


def test_an_interrupted_run_leaves_the_older_output(files, tmp_path, capsys, monkeypatch):
    """SIGINT arriving while the third chunk's interval is computed: the command ends
    with 130 and leaves no partial file."""
    calls = []
    real = batch.predict_columns

    def interrupted_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Interrupted(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "predict_columns", interrupted_third)
    out = tmp_path / "p.csv"
    out.write_text("older output\n")
    args = ["predict", _model(files, "mixed-lp"), files / "query.csv", "-o", out]
    code, stdout, err = call(capsys, *args, "--chunksize", "100", "--interval", "0.1", "-q")
    assert (code, stdout, err) == (130, "", "nbattn: interrupted\n")
    assert len(calls) == 3 and out.read_text() == "older output\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]


# ----------------------------------------------------------------------------- fit: row ids


def _with_ids(rng, n=60, order="sorted"):
    frame = _table(rng, n)
    if order == "shuffled":
        frame["id"] = rng.permutation(frame["id"].to_numpy())
    frame.insert(1, "name", [f"row-{i:03d}" for i in rng.permutation(n)])
    return frame


def _warnings(err):
    return [line for line in err.splitlines() if "RowIdWarning" in line]


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_fit_warns_of_columns_that_look_like_row_ids(tmp_path, rng, capsys, order):
    _with_ids(rng, order=order).to_csv(tmp_path / "t.csv", index=False)
    args = ["fit", tmp_path / "t.csv", "--target", "y", "-q", "-o", tmp_path / "m.npz"]
    code, _, err = call(capsys, *args)
    assert code == 0
    lines = _warnings(err)
    assert lines == err.splitlines() and len(lines) == 2, err
    assert lines[0].startswith("nbattn: warning: RowIdWarning: feature 'id' looks like a row id")
    assert lines[0].endswith("leave it out with --drop id")
    assert "500 to 559" in lines[0] if order == "shuffled" else "in order" in lines[0]
    assert lines[1].startswith("nbattn: warning: RowIdWarning: feature 'name' looks like")
    assert "as a category it matches no other" in lines[1]


def test_drop_leaves_the_columns_out(tmp_path, rng, capsys):
    """``--drop id,name`` fits what ``--features`` with the other columns fits, bit for
    bit and twice alike, without a warning."""
    _with_ids(rng).to_csv(tmp_path / "t.csv", index=False)
    fit = ["fit", tmp_path / "t.csv", "--target", "y", "-q", "--bandwidth", "loo"]
    for name in ("a", "b"):
        code, _, err = call(capsys, *fit, "--drop", "id,name", "-o", tmp_path / f"{name}.npz")
        assert (code, err) == (0, "")
    code, _, err = call(capsys, *fit, "--features", "x1,colour,x2", "-o", tmp_path / "c.npz")
    assert (code, err) == (0, "")
    a, b, c = (nbattn.load(tmp_path / f"{n}.npz") for n in "abc")
    assert list(a.feature_names_in_) == FEATURES
    for other in (b, c):
        np.testing.assert_array_equal(a.bandwidth_, other.bandwidth_)
        np.testing.assert_array_equal(a.X_fit_, other.X_fit_)
    # with --features too: dropping one of them
    code, _, err = call(
        capsys, *fit, "--features", "id,x1", "--drop", "id", "-o", tmp_path / "d.npz"
    )
    assert (code, err) == (0, "")
    assert list(nbattn.load(tmp_path / "d.npz").feature_names_in_) == ["x1"]


def test_cv_warns_once_per_column_and_takes_drop(tmp_path, rng, capsys):
    _with_ids(rng).drop(columns="name").to_csv(tmp_path / "t.csv", index=False)
    cv = ["cv", tmp_path / "t.csv", "--target", "y", "--folds", "3", "--json"]
    code, _, err = call(capsys, *cv, "--grid", "0.5,1")
    assert code == 0 and len(_warnings(err)) == 1 and "feature 'id'" in err, err
    code, _, err = call(capsys, *cv, "--drop", "id")
    assert code == 0 and not _warnings(err), err  # stderr holds cv's progress lines only
    assert all(line.startswith("cv: ") for line in err.splitlines()), err


@pytest.mark.parametrize(
    "options, message",
    [
        (["--drop", "nope"], "--drop column 'nope' not found"),
        (["--drop", "y"], "--drop names the target column 'y'"),
        (["--features", "x1,x2", "--drop", "id"], "--drop 'id' is not one of the features"),
        (["--drop", "id,name,x1,colour,x2"], "no feature columns"),
    ],
)
def test_bad_drops_are_refused(tmp_path, rng, capsys, options, message):
    _with_ids(rng).to_csv(tmp_path / "t.csv", index=False)
    code, stdout, err = call(
        capsys, "fit", tmp_path / "t.csv", "--target", "y", *options, "-o", tmp_path / "m.npz"
    )
    assert (code, stdout) == (1, "") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "m.npz").exists()


def _kinds_table(columns):
    frame = pd.DataFrame(columns)
    return frame, "".join("c" if frame[c].dtype.kind == "f" else "u" for c in frame)


@settings(max_examples=60)
@given(
    n=st.integers(batch.ROW_ID_MIN_ROWS, 300),
    start=st.integers(-(10**6), 10**6),
    seed=st.integers(0, 2**32 - 1),
)
def test_row_ids_are_told_from_features(n, start, seed):
    """Flagged: n consecutive whole numbers in any order, sorted distinct whole numbers,
    distinct text. Not flagged: a repeated value, fractions, fewer rows than the floor."""
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n, dtype=np.float64)
    gaps = np.cumsum(rng.integers(1, 50, n)).astype(np.float64)
    repeated = rng.permutation(ids)
    i, j = rng.choice(n, 2, replace=False)
    repeated[i] = repeated[j]
    frame, kinds = _kinds_table(
        {
            "shuffled": rng.permutation(ids),
            "gaps": gaps[::-1].copy() if seed % 2 else gaps,
            "text": np.array([f"k{i}" for i in rng.permutation(n)], dtype=object),
            "repeated": repeated,
            "fractions": rng.permutation(ids) + 0.5,
            "words": rng.choice(np.array(["a", "b"], dtype=object), n),
        }
    )
    assert [c for c, _ in batch.row_id_columns(frame, kinds)] == ["shuffled", "gaps", "text"]
    few = frame.iloc[: batch.ROW_ID_MIN_ROWS - 1]
    assert batch.row_id_columns(few, kinds) == []


def test_a_missing_value_is_no_row_id():
    frame, kinds = _kinds_table({"id": np.r_[np.arange(20.0), np.nan]})
    assert batch.row_id_columns(frame, kinds) == []
    assert [c for c, _ in batch.row_id_columns(frame.dropna(), kinds)] == ["id"]


# ----------------------------------------------------------------------------- the README


def _readme_command_section():
    text = (ROOT / "README.md").read_text()
    start = text.index("## The `nbattn` command")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize("command", ["fit", "predict", "evaluate", "cv"])
def test_the_readme_lists_every_option(command):
    """Each option of these subcommands' ``--help`` appears in the README's section on
    the command (as ``--option``)."""
    section = _readme_command_section()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    options = {o for a in sub._actions for o in a.option_strings if o.startswith("--")}
    options -= {"--help"}
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"\b", section))
    assert not missing, f"README's command section does not mention {missing} of {command}"


def test_intervals_and_slopes_on_a_dask_cluster_equal_a_local_run(files, tmp_path, capsys):
    """``--scheduler``: the chunks' intervals and slopes computed on the cluster's
    workers are written in input order, as a local run writes them."""
    distributed = pytest.importorskip("distributed")
    path = _model(files, "mixed-lp")
    common = [path, files / "query.csv", "--chunksize", "60", "--id-column", "id", "-q"]
    common += ["--interval", "0.1", "--kind", "observation", "--marginal-effects"]
    assert call(capsys, "predict", *common, "-o", tmp_path / "local.csv")[0] == 0
    with distributed.Client(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as client:
        address = client.scheduler.address
        out = tmp_path / "dask.csv"
        assert call(capsys, "predict", *common, "--scheduler", address, "-o", out)[0] == 0
    local, remote = _read(tmp_path / "local.csv"), _read(out)
    assert "y_lower" in remote and "d_y_d_x2" in remote
    pd.testing.assert_frame_equal(local, remote, check_exact=True)
