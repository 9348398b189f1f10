"""The nbattn command, end to end: in-process ``main([...])`` for most cases and
real subprocesses for exit codes, the demo, and the 1,000,000-row streaming run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score
from sklearn.model_selection import KFold

import nbattn
from nbattn import cli

from . import naive

ROOT = Path(__file__).resolve().parent.parent


def run(*args, cwd=None):
    """``python -m nbattn.cli ARGS`` in a subprocess with this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "nbattn.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


def call(capsys, *args):
    """``nbattn.cli.main(ARGS)`` in this process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _frame(rng, n=120):
    x1 = rng.uniform(0, 6, n)
    x2 = rng.normal(size=n)
    y = 2 * np.sin(x1) + x1**0.8 + 0.3 * x2 + rng.normal(0, 0.5, n)
    return pd.DataFrame({"id": np.arange(1000, 1000 + n), "x1": x1, "x2": x2, "y": y})


@pytest.fixture
def work(tmp_path, rng):
    """A folder with train.csv (id, x1, x2, y) and a model fitted on x1, x2."""
    frame = _frame(rng)
    frame.to_csv(tmp_path / "train.csv", index=False)
    code = cli.main(
        ["fit", str(tmp_path / "train.csv"), "--target", "y", "--features", "x1,x2", "-q"]
        + ["-o", str(tmp_path / "model.npz")]
    )
    assert code == 0
    return tmp_path, frame


def _reference(frame, **params):
    return nbattn.NadarayaWatsonRegressor(**params).fit(frame[["x1", "x2"]], frame["y"])


def _listing(folder):
    return sorted(os.listdir(folder))


# ----------------------------------------------------------------------------- fit


def test_fit_matches_the_estimator(work):
    folder, frame = work
    model = nbattn.load(folder / "model.npz")
    ref = _reference(frame)
    np.testing.assert_array_equal(model.bandwidth_, ref.bandwidth_)
    X = frame[["x1", "x2"]]
    np.testing.assert_array_equal(model.predict(X), ref.predict(X))


def test_fit_options(work, capsys):
    folder, frame = work
    code, out, _ = call(
        capsys,
        "fit",
        folder / "train.csv",
        "--target",
        "y",
        "--features",
        "x1,x2",
        "--bandwidth",
        "0.3,0.8",
        "-o",
        folder / "m2.npz",
    )
    assert code == 0 and "x1=0.3, x2=0.8" in out
    np.testing.assert_array_equal(nbattn.load(folder / "m2.npz").bandwidth_, [0.3, 0.8])
    code, _, _ = call(
        capsys,
        "fit",
        folder / "train.csv",
        "--target",
        "y",
        "--features",
        "x1",
        "--kernel",
        "average",
        "-q",
        "-o",
        folder / "m3.npz",
    )
    model = nbattn.load(folder / "m3.npz")
    assert code == 0 and model.kernel == "average"
    np.testing.assert_allclose(model.predict(frame[["x1"]]), frame["y"].mean(), rtol=1e-14)


def test_default_features_are_all_but_the_target(tmp_path, rng, capsys):
    frame = _frame(rng).drop(columns="id")
    frame.to_csv(tmp_path / "t.csv", index=False)
    code, _, _ = call(capsys, "fit", tmp_path / "t.csv", "--target", "y", "-o", tmp_path / "m.npz")
    assert code == 0
    assert list(nbattn.load(tmp_path / "m.npz").feature_names_in_) == ["x1", "x2"]


# ----------------------------------------------------------------------------- predict


def test_predict_csv_with_id_and_std(work, capsys):
    folder, frame = work
    code, out, err = call(
        capsys,
        "predict",
        folder / "model.npz",
        folder / "train.csv",
        "-o",
        folder / "pred.csv",
        "--id-column",
        "id",
        "--std",
        "--chunksize",
        "7",
    )
    assert code == 0 and err == "" and "predicted 120 rows" in out
    pred = pd.read_csv(folder / "pred.csv")
    assert list(pred.columns) == ["id", "prediction", "std"]
    assert pred["id"].tolist() == frame["id"].tolist()
    ref = _reference(frame)
    X = frame[["x1", "x2"]].to_numpy()
    np.testing.assert_allclose(pred["prediction"], ref.predict(frame[["x1", "x2"]]), rtol=1e-12)
    want = naive.nadaraya_watson_std(X, X, frame["y"].to_numpy(), ref.bandwidth_)
    np.testing.assert_allclose(pred["std"], want, rtol=1e-7, atol=1e-9 * frame["y"].std())


def test_predict_std_on_average_kernel(rng):
    X, y = rng.normal(size=(30, 2)), rng.normal(size=30)
    model = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y)
    mean, std = cli.predict_std(model, X[:5])
    np.testing.assert_allclose(mean, y.mean(), rtol=1e-14)
    np.testing.assert_allclose(std, y.std(), rtol=1e-14)


def test_predict_chunking_does_not_change_results(work, capsys):
    folder, _ = work
    for size in (1, 13, 1000):
        assert (
            call(
                capsys,
                "predict",
                folder / "model.npz",
                folder / "train.csv",
                "-q",
                "-o",
                folder / f"p{size}.csv",
                "--chunksize",
                size,
            )[0]
            == 0
        )
    a, b, c = (pd.read_csv(folder / f"p{s}.csv") for s in (1, 13, 1000))
    pd.testing.assert_frame_equal(a, c)
    pd.testing.assert_frame_equal(b, c)


def test_parquet_round_trip(work, capsys):
    pytest.importorskip("pyarrow")
    folder, frame = work
    frame.to_parquet(folder / "train.parquet")
    for src, dst in [
        ("train.csv", "a.parquet"),
        ("train.parquet", "b.parquet"),
        ("train.parquet", "c.csv"),
    ]:
        code, _, err = call(
            capsys,
            "predict",
            folder / "model.npz",
            folder / src,
            "-o",
            folder / dst,
            "--id-column",
            "id",
            "--chunksize",
            "50",
        )
        assert code == 0, err
    a = pd.read_parquet(folder / "a.parquet")
    b = pd.read_parquet(folder / "b.parquet")
    c = pd.read_csv(folder / "c.csv")
    assert a["id"].dtype == np.int64
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(a, c)
    np.testing.assert_array_equal(a["id"], frame["id"])
    ref = _reference(frame).predict(frame[["x1", "x2"]])
    np.testing.assert_allclose(a["prediction"], ref, rtol=1e-12)


def test_nan_rows_dropped_on_request(work, capsys):
    folder, frame = work
    bad = frame.copy()
    bad.loc[[3, 50], "x2"] = np.nan
    bad.to_csv(folder / "nan.csv", index=False)
    out = folder / "p.csv"
    code, _, err = call(capsys, "predict", folder / "model.npz", folder / "nan.csv", "-o", out)
    assert code == 1 and "data row 4 (line 5 of the file): column 'x2' is missing" in err
    assert not out.exists()
    code, stdout, _ = call(
        capsys,
        "predict",
        folder / "model.npz",
        folder / "nan.csv",
        "-o",
        out,
        "--id-column",
        "id",
        "--on-nan",
        "drop",
        "--chunksize",
        "20",
    )
    assert code == 0 and "dropped 2 rows" in stdout
    pred = pd.read_csv(out)
    assert pred["id"].tolist() == frame["id"].drop(index=[3, 50]).tolist()
    code, _, _ = call(
        capsys,
        "fit",
        folder / "nan.csv",
        "--target",
        "y",
        "--features",
        "x1,x2",
        "--on-nan",
        "drop",
        "-q",
        "-o",
        folder / "m.npz",
    )
    assert code == 0
    assert nbattn.load(folder / "m.npz").X_fit_.shape == (118, 2)


# ----------------------------------------------------------------------------- evaluate, cv


def test_evaluate_matches_sklearn_metrics(work, capsys):
    folder, frame = work
    code, out, _ = call(
        capsys,
        "evaluate",
        folder / "model.npz",
        folder / "train.csv",
        "--json",
        "--chunksize",
        "17",
    )
    assert code == 0
    got = json.loads(out)
    pred = _reference(frame).predict(frame[["x1", "x2"]])
    y = frame["y"]
    assert got["n"] == 120
    np.testing.assert_allclose(got["mse"], mean_squared_error(y, pred), rtol=1e-12)
    np.testing.assert_allclose(got["mae"], mean_absolute_error(y, pred), rtol=1e-12)
    np.testing.assert_allclose(got["r2"], r2_score(y, pred), rtol=1e-12)
    code, out, _ = call(capsys, "evaluate", folder / "model.npz", folder / "train.csv")
    assert code == 0 and out.splitlines()[1].startswith("mse") and "r2" in out


def test_cv_matches_manual_kfold(work, capsys):
    folder, frame = work
    code, out, _ = call(
        capsys,
        "cv",
        folder / "train.csv",
        "--target",
        "y",
        "--features",
        "x1,x2",
        "--folds",
        "4",
        "--seed",
        "3",
        "--json",
    )
    assert code == 0
    got = json.loads(out)
    X, y = frame[["x1", "x2"]], frame["y"].to_numpy()
    want = []
    for train, test in KFold(4, shuffle=True, random_state=3).split(X):
        model = nbattn.NadarayaWatsonRegressor().fit(X.iloc[train], y[train])
        want.append(mean_squared_error(y[test], model.predict(X.iloc[test])))
    np.testing.assert_allclose([f["mse"] for f in got["folds"]], want, rtol=1e-12)
    np.testing.assert_allclose(got["mean"]["mse"], np.mean(want), rtol=1e-12)
    code, out, _ = call(capsys, "cv", folder / "train.csv", "--target", "y", "--folds", "3")
    assert code == 0 and "mean" in out and "std" in out


def test_streaming_metrics_match_sklearn_for_classifiers(rng):
    from sklearn.metrics import accuracy_score, log_loss

    classes = np.array(["a", "b", "c"])
    y = rng.choice(classes, 50)
    proba = rng.dirichlet(np.ones(3), 50)
    metrics = cli.Metrics(classifier=True, classes=classes)
    for part in np.array_split(np.arange(50), 4):
        metrics.add_classification(y[part], proba[part])
    got = metrics.result()
    np.testing.assert_allclose(got["accuracy"], accuracy_score(y, classes[proba.argmax(1)]))
    np.testing.assert_allclose(got["log_loss"], log_loss(y, proba, labels=classes), rtol=1e-12)
    with pytest.raises(ValueError, match="'z' is not one of the model's classes"):
        metrics.add_classification(np.array(["z"]), proba[:1])


# ----------------------------------------------------------------------------- other models


def test_missing_estimators_give_a_clear_error(work, capsys):
    folder, _ = work
    for key, name in cli.MODELS.items():
        if hasattr(nbattn, name):
            continue
        code, _, err = call(
            capsys,
            "fit",
            folder / "train.csv",
            "--target",
            "y",
            "--model",
            key,
            "-o",
            folder / "x.npz",
        )
        assert code == 1 and f"requires nbattn.{name}" in err
    if not cli._accepts_loo(nbattn.NadarayaWatsonRegressor):
        code, _, err = call(
            capsys,
            "fit",
            folder / "train.csv",
            "--target",
            "y",
            "--bandwidth",
            "loo",
            "-o",
            folder / "x.npz",
        )
        assert code == 1 and "--bandwidth loo requires" in err
    code, _, err = call(
        capsys,
        "fit",
        folder / "train.csv",
        "--target",
        "y",
        "--metric",
        "full",
        "-o",
        folder / "x.npz",
    )
    assert code == 1 and "--metric applies to --model learned" in err
    assert not (folder / "x.npz").exists()


@pytest.mark.parametrize("metric", ["scalar", "diagonal", "full"])
def test_learned_end_to_end(work, capsys, metric):
    if not hasattr(nbattn, "LearnedKernelRegressor"):
        pytest.skip("nbattn.LearnedKernelRegressor is not in this branch yet")
    folder, frame = work
    code, _, err = call(
        capsys,
        "fit",
        folder / "train.csv",
        "--target",
        "y",
        "--features",
        "x1,x2",
        "--model",
        "learned",
        "--metric",
        metric,
        "-q",
        "-o",
        folder / "l.npz",
    )
    assert code == 0, err
    ref = nbattn.LearnedKernelRegressor(metric=metric).fit(frame[["x1", "x2"]], frame["y"])
    code, _, err = call(
        capsys, "predict", folder / "l.npz", folder / "train.csv", "-o", folder / "l.csv"
    )
    assert code == 0, err
    np.testing.assert_allclose(
        pd.read_csv(folder / "l.csv")["prediction"], ref.predict(frame[["x1", "x2"]]), rtol=1e-9
    )
    code, _, err = call(capsys, "plot", "widths", folder / "l.npz", "-o", folder / "w.png")
    assert code == 0, err


def test_loo_bandwidth_end_to_end(work, capsys):
    if not cli._accepts_loo(nbattn.NadarayaWatsonRegressor):
        pytest.skip("bandwidth='loo' is not in this branch yet")
    folder, frame = work
    code, _, err = call(
        capsys,
        "fit",
        folder / "train.csv",
        "--target",
        "y",
        "--features",
        "x1,x2",
        "--bandwidth",
        "loo",
        "-q",
        "-o",
        folder / "m.npz",
    )
    assert code == 0, err
    ref = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(frame[["x1", "x2"]], frame["y"])
    np.testing.assert_allclose(nbattn.load(folder / "m.npz").bandwidth_, ref.bandwidth_)


def test_classifier_end_to_end(tmp_path, rng, capsys):
    if not hasattr(nbattn, "NadarayaWatsonClassifier"):
        pytest.skip("nbattn.NadarayaWatsonClassifier is not in this branch yet")
    from sklearn.metrics import accuracy_score, log_loss

    frame = _frame(rng)
    frame["label"] = np.where(frame["y"] > frame["y"].median(), "high", "low")
    frame.drop(columns="y").to_csv(tmp_path / "c.csv", index=False)
    code, _, err = call(
        capsys,
        "fit",
        tmp_path / "c.csv",
        "--target",
        "label",
        "--features",
        "x1,x2",
        "--model",
        "classifier",
        "-q",
        "-o",
        tmp_path / "c.npz",
    )
    assert code == 0, err
    code, out, err = call(capsys, "evaluate", tmp_path / "c.npz", tmp_path / "c.csv", "--json")
    assert code == 0, err
    got = json.loads(out)
    ref = nbattn.NadarayaWatsonClassifier().fit(frame[["x1", "x2"]], frame["label"])
    proba = ref.predict_proba(frame[["x1", "x2"]])
    np.testing.assert_allclose(
        got["accuracy"], accuracy_score(frame["label"], ref.predict(frame[["x1", "x2"]]))
    )
    np.testing.assert_allclose(
        got["log_loss"], log_loss(frame["label"], proba, labels=ref.classes_), rtol=1e-9
    )
    code, _, err = call(
        capsys,
        "predict",
        tmp_path / "c.npz",
        tmp_path / "c.csv",
        "--proba",
        "-o",
        tmp_path / "p.csv",
    )
    assert code == 0, err
    assert {"prediction", "proba_high", "proba_low"} <= set(pd.read_csv(tmp_path / "p.csv"))


# ----------------------------------------------------------------------------- plots, info


@pytest.mark.parametrize("ext", ["png", "svg"])
def test_plots(work, capsys, ext):
    folder, frame = work
    frame[["x1", "y"]].to_csv(folder / "one.csv", index=False)
    assert (
        call(capsys, "fit", folder / "one.csv", "--target", "y", "-q", "-o", folder / "one.npz")[0]
        == 0
    )
    cases = {
        "fit": ["fit", folder / "one.npz", folder / "one.csv"],
        "heatmap": ["heatmap", folder / "model.npz", folder / "train.csv", "--rows", "20"],
        "loo": ["loo", folder / "train.csv", "--target", "y", "--features", "x1", "--points", "5"],
        "widths": ["widths", folder / "model.npz"],
    }
    for kind, args in cases.items():
        out = folder / f"{kind}.{ext}"
        code, _, err = call(capsys, "plot", *args, "-o", out, "-q")
        assert code == 0, err
        head = out.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if ext == "png" else b"<svg" in head
    code, _, err = call(
        capsys, "plot", "fit", folder / "model.npz", folder / "train.csv", "-o", folder / "two.png"
    )
    assert code == 1 and "one feature" in err and not (folder / "two.png").exists()
    code, _, err = call(capsys, "plot", "widths", folder / "model.npz", "-o", folder / "w.jpg")
    assert code == 1 and ".png or .svg" in err and not (folder / "w.jpg").exists()


def test_loo_curve_matches_naive(rng):
    X = rng.normal(size=(40, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=40)
    base = np.array([0.4, 0.9])
    scales = np.array([0.3, 1.0, 3.0])
    want = [
        np.mean((naive.nadaraya_watson(X, X, y, base * s, exclude_self=True) - y) ** 2)
        for s in scales
    ]
    np.testing.assert_allclose(cli.loo_curve(X, y, base, scales), want, rtol=1e-10)


def test_info(capsys):
    code, out, _ = call(capsys, "info")
    assert code == 0
    assert "numba" in out and "threading layer" in out and "CUDA usable" in out
    assert f"version {nbattn.io.FORMAT_VERSION}" in out


def test_demo_in_a_subprocess(tmp_path):
    result = run("demo", "--outdir", tmp_path / "figs")
    assert result.returncode == 0, result.stderr
    assert "nadaraya_watson" in result.stdout
    for name in ("data", "average_pooling", "nadaraya_watson", "heatmap_nadaraya_watson"):
        assert (tmp_path / "figs" / f"{name}.png").stat().st_size > 1000


# ----------------------------------------------------------------------------- bad input


def _one_line_error(code, err):
    assert code == 1
    assert err.startswith("nbattn: error: ") and err.endswith("\n") and err.count("\n") == 1


def _bad_files(folder, frame):
    """name -> content of the bad data files of the issue."""
    text = frame.to_csv(index=False).splitlines()
    row = text[5].split(",")
    row[2] = "abc"  # x2 of data row 5
    text[5] = ",".join(row)
    nan = frame.copy()
    nan.loc[7, "x1"] = np.nan
    return {
        "notarget.csv": frame.drop(columns="y").to_csv(index=False),
        "text.csv": "\n".join(text) + "\n",
        "empty.csv": "",
        "header.csv": "id,x1,x2,y\n",
        "nan.csv": nan.to_csv(index=False),
    }


BAD_DATA = {
    "notarget.csv": "target column 'y' not found",
    "text.csv": "data row 5 (line 6 of the file): column 'x2' holds 'abc'",
    "empty.csv": "the file is empty",
    "header.csv": "no data rows",
    "nan.csv": "data row 8 (line 9 of the file): column 'x1' is missing",
}


@pytest.mark.parametrize("name", sorted(BAD_DATA))
@pytest.mark.parametrize("command", ["fit", "predict", "evaluate", "cv"])
def test_bad_data(work, capsys, name, command):
    folder, frame = work
    path = folder / name
    path.write_text(_bad_files(folder, frame)[name])
    before = path.read_bytes()
    out = folder / ("out.npz" if command == "fit" else "out.csv")
    args = {
        "fit": ["fit", path, "--target", "y", "--features", "x1,x2", "-o", out],
        "predict": ["predict", folder / "model.npz", path, "-o", out, "--id-column", "id"],
        "evaluate": ["evaluate", folder / "model.npz", path],
        "cv": ["cv", path, "--target", "y", "--features", "x1,x2", "--folds", "3"],
    }[command]
    listing = _listing(folder)
    code, stdout, err = call(capsys, *args)
    expected = BAD_DATA[name]
    if command == "predict" and name == "notarget.csv":
        assert code == 0  # predict needs no target
        return
    _one_line_error(code, err)
    assert expected in err, err
    assert stdout == ""
    assert _listing(folder) == listing  # no output, no temporary file
    assert path.read_bytes() == before


def _model_files(folder):
    data = (folder / "model.npz").read_bytes()
    np.savez(folder / "plain.npz", a=np.arange(3))
    return {
        "missing.npz": None,
        "truncated.npz": data[: len(data) // 2],
        "csv.npz": (folder / "train.csv").read_bytes(),
        "plain.npz": (folder / "plain.npz").read_bytes(),
        "empty.npz": b"",
    }


@pytest.mark.parametrize("command", ["predict", "evaluate", "plot"])
def test_unreadable_or_foreign_model(work, capsys, command):
    folder, _ = work
    for name, content in _model_files(folder).items():
        model = folder / name
        if content is not None:
            model.write_bytes(content)
        out = folder / ("out.csv" if command != "plot" else "out.png")
        args = {
            "predict": ["predict", model, folder / "train.csv", "-o", out],
            "evaluate": ["evaluate", model, folder / "train.csv"],
            "plot": ["plot", "widths", model, "-o", out],
        }[command]
        listing = _listing(folder)
        code, stdout, err = call(capsys, *args)
        _one_line_error(code, err)
        assert ("No such file" if content is None else "model file") in err, err
        assert _listing(folder) == listing and stdout == ""


def test_failure_late_in_the_stream_leaves_no_output(work, capsys, rng):
    folder, _ = work
    big = _frame(rng, n=1000)
    big["x2"] = big["x2"].astype(object)
    big.loc[950, "x2"] = "oops"
    big.to_csv(folder / "late.csv", index=False)
    out = folder / "pred.csv"
    out.write_text("previous result\n")
    listing = _listing(folder)
    code, _, err = call(
        capsys,
        "predict",
        folder / "model.npz",
        folder / "late.csv",
        "-o",
        out,
        "--chunksize",
        "100",
    )
    _one_line_error(code, err)
    assert "data row 951 (line 952 of the file): column 'x2' holds 'oops'" in err
    assert out.read_text() == "previous result\n"  # the old output is untouched
    assert _listing(folder) == listing


def test_output_that_is_an_input_is_refused(work, capsys):
    folder, _ = work
    before = (folder / "train.csv").read_bytes()
    code, _, err = call(
        capsys, "predict", folder / "model.npz", folder / "train.csv", "-o", folder / "train.csv"
    )
    _one_line_error(code, err)
    assert "is an input file" in err and (folder / "train.csv").read_bytes() == before


def test_bad_output_names(work, capsys):
    folder, _ = work
    base = ["predict", folder / "model.npz", folder / "train.csv", "-o"]
    code, _, err = call(capsys, *base, folder / "p.xlsx")
    _one_line_error(code, err)
    assert ".csv, .parquet or .pq" in err
    code, _, err = call(capsys, *base, folder / "nowhere" / "p.csv")
    _one_line_error(code, err)
    assert "does not exist" in err and not (folder / "nowhere").exists()


def test_exit_codes_of_the_real_process(work):
    folder, _ = work
    ok = run("predict", folder / "model.npz", folder / "train.csv", "-o", folder / "p.csv", "-q")
    assert ok.returncode == 0 and ok.stderr == "" and ok.stdout == ""
    bad = run("fit", folder / "train.csv", "--target", "nope", "-o", folder / "m.npz")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        f"nbattn: error: {folder / 'train.csv'}: target column 'nope' not found; "
        "the columns are 'id', 'x1', 'x2', 'y'"
    ]
    usage = run("fit", "d.csv", "--target", "y", "--bandwidth", "wide", "-o", "m.npz")
    assert usage.returncode == 2 and "usage: nbattn fit" in usage.stderr
    assert "expected scott, silverman, loo" in usage.stderr and "'wide'" in usage.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["fit", "d.csv"],
        ["predict", "m"],
        ["fit", "d.csv", "--target", "y", "--bandwidth", "-1", "-o", "m.npz"],
        ["predict", "m", "d", "-o", "o.csv", "--chunksize", "0"],
        ["predict", "m", "d", "-o", "o.csv", "--on-nan", "ignore"],
        ["plot", "surface", "m", "-o", "f.png"],
    ],
)
def test_usage_errors_exit_2(capsys, args):
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    assert info.value.code == 2
    assert "usage: nbattn" in capsys.readouterr().err


# ----------------------------------------------------------------------------- memory

_PEAK_RSS = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)


def _peak_rss_mb(*args):
    """Peak RSS (MB) of ``python -m nbattn.cli ARGS`` run as the only child of a wrapper."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", _PEAK_RSS, sys.executable, "-m", "nbattn.cli", *map(str, args)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1]) / 1024


def test_million_rows_in_flat_memory(tmp_path, rng, capsys):
    n = 1_000_000
    train = _frame(rng, n=200)
    train.to_csv(tmp_path / "train.csv", index=False)
    assert (
        call(
            capsys,
            "fit",
            tmp_path / "train.csv",
            "--target",
            "y",
            "--features",
            "x1,x2",
            "-q",
            "-o",
            tmp_path / "m.npz",
        )[0]
        == 0
    )
    big = pd.DataFrame({"id": np.arange(n), "x1": rng.uniform(0, 6, n), "x2": rng.normal(size=n)})
    big.to_csv(tmp_path / "big.csv", index=False)
    big.head(1000).to_csv(tmp_path / "small.csv", index=False)
    common = ["--id-column", "id", "--chunksize", "100000", "-q"]
    base = _peak_rss_mb(
        "predict",
        tmp_path / "m.npz",
        tmp_path / "small.csv",
        "-o",
        tmp_path / "small_out.csv",
        *common,
    )
    peak = _peak_rss_mb(
        "predict", tmp_path / "m.npz", tmp_path / "big.csv", "-o", tmp_path / "big_out.csv", *common
    )
    model_mb = (tmp_path / "m.npz").stat().st_size / 2**20
    with capsys.disabled():
        print(
            f"\n1,000,000-row predict: peak RSS {peak:.0f} MB, 1,000-row run {base:.0f} MB, "
            f"growth {peak - base:.0f} MB (model file {model_mb:.2f} MB)"
        )
    assert peak - base < 300
    out = pd.read_csv(tmp_path / "big_out.csv")
    assert len(out) == n
    np.testing.assert_array_equal(out["id"].to_numpy(), big["id"].to_numpy())
    model = nbattn.load(tmp_path / "m.npz")
    pick = rng.choice(n, 2000, replace=False)
    np.testing.assert_allclose(
        out["prediction"].to_numpy()[pick], model.predict(big.iloc[pick][["x1", "x2"]]), rtol=1e-12
    )
