"""The nbattn command, end to end: in-process ``main([...])`` for most cases and
real subprocesses for exit codes, the demo, and the 1,000,000-row streaming run."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score
from sklearn.model_selection import KFold

import nbattn
from nbattn.app import batch, cli, plotting
from nbattn.app.metrics import Metrics

from .. import naive
from .._scripts import run_checked

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd=None):
    """``python -m nbattn.app.cli ARGS`` in a subprocess with this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "nbattn.app.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


def call(capsys, *args):
    """``nbattn.app.cli.main(ARGS)`` in this process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def fit_train(capsys, folder, *options):
    """``nbattn fit`` on the work folder's train.csv, target y, with ``options``."""
    return call(capsys, "fit", folder / "train.csv", "--target", "y", *options)


def use_model(capsys, folder, command, data, *options):
    """``nbattn COMMAND`` (predict, evaluate) with the work folder's model.npz on the
    folder's file ``data``, with ``options``."""
    return call(capsys, command, folder / "model.npz", folder / data, *options)


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
    code, out, _ = fit_train(
        capsys, folder, "--features", "x1,x2", "--bandwidth", "0.3,0.8", "-o", folder / "m2.npz"
    )
    assert code == 0 and "x1=0.3, x2=0.8" in out
    np.testing.assert_array_equal(nbattn.load(folder / "m2.npz").bandwidth_, [0.3, 0.8])
    code, _, _ = fit_train(
        capsys, folder, "--features", "x1", "--kernel", "average", "-q", "-o", folder / "m3.npz"
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
    code, out, err = use_model(
        capsys,
        folder,
        "predict",
        "train.csv",
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


def test_predict_std_on_average_kernel(work, capsys):
    folder, frame = work
    model, out = folder / "avg.npz", folder / "avg.csv"
    assert fit_train(capsys, folder, "--kernel", "average", "-q", "-o", model)[0] == 0
    code, _, err = call(capsys, "predict", model, folder / "train.csv", "--std", "-q", "-o", out)
    assert code == 0, err
    pred = pd.read_csv(out)
    np.testing.assert_allclose(pred["prediction"], frame["y"].mean(), rtol=1e-14)
    np.testing.assert_allclose(pred["std"], frame["y"].std(ddof=0), rtol=1e-12)


def test_predict_chunking_does_not_change_results(work, capsys):
    folder, _ = work
    for size in (1, 13, 1000):
        assert (
            use_model(
                capsys,
                folder,
                "predict",
                "train.csv",
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
        code, _, err = use_model(
            capsys,
            folder,
            "predict",
            src,
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
    code, _, err = use_model(capsys, folder, "predict", "nan.csv", "-o", out)
    assert code == 1 and "data row 4 (line 5 of the file): column 'x2' is missing" in err
    assert not out.exists()
    code, stdout, _ = use_model(
        capsys,
        folder,
        "predict",
        "nan.csv",
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
    code, out, _ = use_model(
        capsys,
        folder,
        "evaluate",
        "train.csv",
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
    code, out, _ = use_model(capsys, folder, "evaluate", "train.csv")
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
    metrics = Metrics(classifier=True, classes=classes)
    for part in np.array_split(np.arange(50), 4):
        metrics.add_classification(y[part], proba[part])
    got = metrics.result()
    np.testing.assert_allclose(got["accuracy"], accuracy_score(y, classes[proba.argmax(1)]))
    np.testing.assert_allclose(got["log_loss"], log_loss(y, proba, labels=classes), rtol=1e-12)
    with pytest.raises(ValueError, match="^row 9: label 'z' is not one of the model's classes"):
        metrics.add_classification(np.array(["a", "z"]), proba[:2], where=lambda i: f"row {i + 8}")
    with pytest.raises(ValueError, match="label 1 is not one"):  # another type: unknown, no crash
        metrics.add_classification(np.array([1], dtype=object), proba[:1])


# ----------------------------------------------------------------------------- other models


@pytest.mark.parametrize(
    "model, option, value",
    [
        ("nw", "--metric", "full"),
        ("nw", "--max-iter", "3"),
        ("learned", "--bandwidth", "0.5"),
        ("learned", "--kernel", "average"),
        ("classifier", "--metric", "scalar"),
    ],
)
def test_options_that_do_not_apply_are_refused(work, capsys, model, option, value):
    folder, _ = work
    out = folder / "x.npz"
    code, _, err = fit_train(capsys, folder, "--model", model, option, value, "-o", out)
    _one_line_error(code, err)
    assert f"{option} does not apply to --model {model}" in err
    assert not out.exists()


@pytest.mark.parametrize("metric", ["scalar", "diagonal", "full"])
def test_learned_end_to_end(work, capsys, metric):
    folder, frame = work
    options = ["--model", "learned", "--metric", metric, "-q", "-o", folder / "l.npz"]
    code, _, err = fit_train(capsys, folder, "--features", "x1,x2", *options)
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
    folder, frame = work
    code, _, err = fit_train(
        capsys, folder, "--features", "x1,x2", "--bandwidth", "loo", "-q", "-o", folder / "m.npz"
    )
    assert code == 0, err
    ref = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(frame[["x1", "x2"]], frame["y"])
    np.testing.assert_allclose(nbattn.load(folder / "m.npz").bandwidth_, ref.bandwidth_)


def test_classifier_end_to_end(tmp_path, rng, capsys):
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
    if ext == "svg":  # the drawing does not depend on the format: one figure shows the save
        cases = {"widths": cases["widths"]}
    for kind, args in cases.items():
        out = folder / f"{kind}.{ext}"
        code, _, err = call(capsys, "plot", *args, "-o", out, "-q")
        assert code == 0, err
        head = out.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if ext == "png" else b"<svg" in head
    code, _, err = call(
        capsys, "plot", "fit", folder / "model.npz", folder / "train.csv", "-o", folder / "two.png"
    )
    assert code == 0, err  # one partial-dependence panel per feature
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
    np.testing.assert_allclose(plotting.loo_curve(X, y, base, scales), want, rtol=1e-10)


def test_info(capsys):
    code, out, _ = call(capsys, "info")
    assert code == 0
    assert "numba" in out and "threading layer" in out and "CUDA usable" in out
    assert f"version {nbattn.app.io.FORMAT_VERSION}" in out
    for lib in ("driver", "nvvm", "nvrtc", "cudart", "cudadevrt"):  # found or not, never fails
        assert re.search(rf"^  {lib}: (found at |not found: )", out, re.M), out


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
    code, _, err = use_model(
        capsys,
        folder,
        "predict",
        "late.csv",
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
    code, _, err = use_model(capsys, folder, "predict", "train.csv", "-o", folder / "train.csv")
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
    """Peak RSS (MB) of ``python -m nbattn.app.cli ARGS`` run as the only child of a wrapper."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", _PEAK_RSS, sys.executable, "-m", "nbattn.app.cli", *map(str, args)]
    return int(run_checked(cmd, env=env).stdout.split()[-1]) / 1024


@pytest.mark.ru_maxrss
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


# ----------------------------------------------------------------------------- figures


def test_fit_figure_draws_one_partial_dependence_panel_per_feature(work):
    folder, frame = work
    model = nbattn.load(folder / "model.npz")
    X = frame[["x1", "x2"]]
    fig = plotting.fit_figure(model, X, frame["y"].to_numpy(), "y")
    try:
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_xlabel() for ax in axes] == ["x1", "x2"]
        medians = X.median().to_numpy()
        for f, ax in enumerate(axes):
            grid, curve = ax.lines[0].get_data()
            queries = np.tile(medians, (len(grid), 1))
            queries[:, f] = grid
            want = model.predict(pd.DataFrame(queries, columns=["x1", "x2"]))
            np.testing.assert_allclose(curve, want, rtol=1e-12)
            assert grid.min() == X.iloc[:, f].min() and grid.max() == X.iloc[:, f].max()
    finally:
        plotting.pyplot().close(fig)


# ----------------------------------------------------------------------------- cv --grid


def test_cv_grid_compares_widths_on_the_same_folds(work, capsys):
    folder, frame = work
    args = ["cv", folder / "train.csv", "--target", "y", "--features", "x1,x2", "--folds", "4"]
    code, out, err = call(capsys, *args, "--seed", "5", "--grid", "0.2,1,scott", "--json")
    assert code == 0, err
    got = json.loads(out)
    X, y = frame[["x1", "x2"]], frame["y"].to_numpy()
    means = []
    for entry, width in zip(got["grid"], [0.2, 1.0, "scott"]):
        assert entry["bandwidth"] == width
        want = []
        for train, test in KFold(4, shuffle=True, random_state=5).split(X):
            model = nbattn.NadarayaWatsonRegressor(bandwidth=width).fit(X.iloc[train], y[train])
            want.append(mean_squared_error(y[test], model.predict(X.iloc[test])))
        np.testing.assert_allclose([f["mse"] for f in entry["folds"]], want, rtol=1e-12)
        means.append(np.mean(want))
    assert got["criterion"] == "mse" and got["best"] == [0.2, 1.0, "scott"][int(np.argmin(means))]
    code, out, _ = call(capsys, *args, "--grid", "0.2,1")
    assert code == 0 and "one row per bandwidth" in out and "best by mean mse" in out
    code, _, err = call(capsys, *args, "--grid", "0.2,1", "--bandwidth", "0.5")
    _one_line_error(code, err)
    assert "--grid" in err


@pytest.mark.parametrize("seed", ["-1", "4294967296", "x"])
def test_cv_bad_seed_is_a_usage_error(capsys, seed):
    with pytest.raises(SystemExit) as info:
        cli.main(["cv", "d.csv", "--target", "y", "--seed", seed])
    assert info.value.code == 2 and "--seed" in capsys.readouterr().err


# ----------------------------------------------------------------------------- hostile files


def test_row_with_more_fields_than_the_header_names_its_line(work, capsys):
    folder, frame = work
    lines = frame.to_csv(index=False).splitlines()
    for bad_line in (2, 61):  # the first data row (pandas would take an index) and a later one
        rows = list(lines)
        rows[bad_line - 1] += ",7"
        path = folder / f"extra{bad_line}.csv"
        path.write_text("\n".join(rows) + "\n")
        for command in (
            ["predict", folder / "model.npz", path, "--chunksize", "25", "-o", folder / "p.csv"],
            ["evaluate", folder / "model.npz", path, "--chunksize", "25"],
            ["fit", path, "--target", "y", "--features", "x1", "-o", folder / "m.npz"],
        ):
            code, _, err = call(capsys, *command)
            _one_line_error(code, err)
            assert f"line {bad_line} has 5 fields" in err or f"line {bad_line} has more" in err, err
    assert not (folder / "p.csv").exists() and not (folder / "m.npz").exists()


def test_duplicated_column_names_are_refused(work, capsys):
    folder, frame = work
    path = folder / "dup.csv"
    text = frame.to_csv(index=False).replace("id,x1,x2,y", "id,x1,x1,y", 1)
    path.write_text(text)
    for command in (
        ["fit", path, "--target", "y", "-o", folder / "m.npz"],
        ["predict", folder / "model.npz", path, "-o", folder / "p.csv"],
    ):
        code, _, err = call(capsys, *command)
        _one_line_error(code, err)
        assert "column name 'x1' appears more than once" in err


def test_a_huge_cell_gives_a_short_error_line(work, capsys):
    folder, frame = work
    bad = frame.astype({"x2": object})
    bad.loc[3, "x2"] = "z" * 2_000_000
    bad.to_csv(folder / "huge.csv", index=False)
    code, _, err = use_model(capsys, folder, "predict", "huge.csv", "-o", folder / "p.csv")
    _one_line_error(code, err)
    assert len(err) < 400 and "data row 4 (line 5 of the file): column 'x2' holds 'zzz" in err
    assert "(2000002 characters)" in err


@pytest.mark.parametrize(
    "exc", [FloatingPointError("overflow encountered"), KeyError("x"), RuntimeError("")]
)
def test_every_error_type_is_one_line(work, capsys, monkeypatch, exc):
    folder, _ = work

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(batch, "predict_file", fail)
    code, out, err = use_model(capsys, folder, "predict", "train.csv", "-o", "p")
    _one_line_error(code, err)
    assert err.startswith(f"nbattn: error: {type(exc).__name__}") and out == ""


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_normal_runs_warn_nothing(work, capsys):
    folder, frame = work
    data, model = folder / "train.csv", folder / "model.npz"
    learned, classifier, labelled = folder / "l.npz", folder / "c.npz", folder / "labels.csv"
    frame.assign(label=np.where(frame["y"] > 1.5, "hi", "lo")).drop(columns="y").to_csv(
        labelled, index=False
    )
    for args in (
        [
            "fit",
            data,
            "--target",
            "y",
            "--drop",
            "id",
            "--bandwidth",
            "loo",
            "-o",
            folder / "m.npz",
        ],
        ["predict", model, data, "--std", "-o", folder / "p.csv"],
        ["predict", model, data, "--interval", "0.1", "--marginal-effects", "-o", folder / "i.csv"],
        ["evaluate", model, data],
        ["cv", data, "--target", "y", "--drop", "id", "--folds", "3", "--grid", "0.1,1"],
        ["plot", "fit", model, data, "-o", folder / "f.png"],
        ["plot", "loo", data, "--target", "y", "--points", "5", "-o", folder / "l.png"],
        ["plot", "heatmap", model, data, "-o", folder / "h.png"],
        ["fit", data, "--target", "y", "--drop", "id", "--model", "learned", "--max-iter", "20"]
        + ["-o", learned],
        ["plot", "widths", learned, "-o", folder / "w.png"],
        ["fit", labelled, "--target", "label", "--drop", "id", "--model", "classifier"]
        + ["-o", classifier],
        ["predict", classifier, labelled, "--proba", "-o", folder / "c.csv"],
        ["evaluate", classifier, labelled],
    ):
        code, _, err = call(capsys, *args)
        if args[0] == "cv":  # cv's progress: a line per fit off a terminal
            err = "".join(line for line in err.splitlines(True) if not line.startswith("cv: "))
        assert code == 0 and err == "", err


def test_output_keeps_its_mode_and_symlinks_are_written_through(work, capsys):
    folder, _ = work
    out = folder / "p.csv"
    out.write_text("old\n")
    out.chmod(0o640)
    link = folder / "link.csv"
    link.symlink_to(out)
    for target in (out, link):
        code, _, err = use_model(capsys, folder, "predict", "train.csv", "-q", "-o", target)
        assert code == 0, err
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
        assert link.is_symlink() and os.readlink(link) == str(out)
        assert out.read_text().startswith("prediction")
    assert not [n for n in os.listdir(folder) if n.endswith(".part")]


def _labelled(folder, labels, name):
    rng = np.random.default_rng(len(labels))
    frame = pd.DataFrame({"x": rng.normal(size=len(labels)), "label": labels})
    frame.to_csv(folder / name, index=False)
    return folder / name


def test_evaluate_names_the_row_of_an_unseen_label(tmp_path, capsys):
    train = _labelled(tmp_path, ["a", "b"] * 10, "train.csv")
    model = tmp_path / "c.npz"
    fit = ["fit", train, "--target", "label", "--model", "classifier", "-q", "-o", model]
    assert call(capsys, *fit)[0] == 0
    test = _labelled(tmp_path, ["a", "b", "a", "b", "a", "b", "c", "a"], "test.csv")
    code, _, err = call(capsys, "evaluate", model, test, "--chunksize", "3")
    _one_line_error(code, err)
    assert "data row 7 (line 8 of the file): label 'c' is not one of the model's classes" in err


def test_label_types_do_not_depend_on_chunk_boundaries(tmp_path, capsys):
    # "1" and "2" alone would read as integers in a chunk without "x"
    labels = ["1", "2", "x"] + ["1", "2"] * 20
    train = _labelled(tmp_path, labels, "train.csv")
    model = tmp_path / "c.npz"
    fit = ["fit", train, "--target", "label", "--model", "classifier", "-q", "-o", model]
    assert call(capsys, *fit)[0] == 0
    assert list(nbattn.load(model).classes_) == ["1", "2", "x"]
    results = []
    for size in ("2", "1000"):
        code, out, err = call(capsys, "evaluate", model, train, "--chunksize", size, "--json")
        assert code == 0, err
        results.append(json.loads(out))
    assert results[0]["n"] == results[1]["n"] == 43
    assert results[0]["accuracy"] == results[1]["accuracy"]
    assert results[0]["log_loss"] == pytest.approx(results[1]["log_loss"], rel=1e-12)
    ints = _labelled(tmp_path, [3, 1, 2] * 10, "ints.csv")
    assert (
        call(capsys, "fit", ints, "--target", "label", "--model", "classifier", "-q", "-o", model)[
            0
        ]
        == 0
    )
    assert nbattn.load(model).classes_.tolist() == [1, 2, 3]
    code, out, err = call(capsys, "evaluate", model, ints, "--chunksize", "4", "--json")
    assert code == 0 and json.loads(out)["n"] == 30, err


@pytest.mark.parametrize("seed", range(4))
def test_a_continuous_target_is_refused_by_the_classifier_as_in_the_library(tmp_path, capsys, seed):
    rng = np.random.default_rng(seed)
    values = np.round(rng.normal(0, 10.0 ** rng.integers(-3, 4), 60), int(rng.integers(1, 4)))
    train = _labelled(tmp_path, values, "train.csv")
    with pytest.raises(ValueError, match="continuous") as library:
        nbattn.NadarayaWatsonClassifier().fit(
            pd.read_csv(train)[["x"]], pd.read_csv(train)["label"]
        )
    fit = [
        "fit",
        train,
        "--target",
        "label",
        "--model",
        "classifier",
        "-q",
        "-o",
        tmp_path / "c.npz",
    ]
    code, out, err = call(capsys, *fit)
    assert code == 1 and "Unknown label type: continuous" in err and str(library.value)[:40] in err
    assert not (tmp_path / "c.npz").exists()


def test_whole_numbers_written_as_floats_are_classes(tmp_path, capsys):
    train = _labelled(tmp_path, ["1.0", "2.0", "5.0"] * 10, "train.csv")
    model = tmp_path / "c.npz"
    fit = ["fit", train, "--target", "label", "--model", "classifier", "-q", "-o", model]
    assert call(capsys, *fit)[0] == 0
    assert nbattn.load(model).classes_.tolist() == [1.0, 2.0, 5.0]
    code, out, err = call(capsys, "evaluate", model, train, "--chunksize", "7", "--json")
    assert code == 0 and json.loads(out)["n"] == 30, err


@pytest.mark.parametrize("at", ["fit", "predict"])
def test_unseen_categories_take_the_mismatch_weight_when_asked(tmp_path, capsys, at):
    rng = np.random.default_rng(5)
    n = 80
    train = pd.DataFrame(
        {"x": rng.normal(size=n), "g": rng.choice(["a", "b", "c"], n), "y": rng.normal(size=n)}
    )
    test = pd.DataFrame(
        {"x": rng.normal(size=9), "g": ["a", "z", "b", "zz", "c", "z", "a", "q", "b"]}
    )
    train.to_csv(tmp_path / "train.csv", index=False)
    test.assign(y=0.0).to_csv(tmp_path / "test.csv", index=False)
    model, out = tmp_path / "m.npz", tmp_path / "p.csv"
    fit = ["fit", tmp_path / "train.csv", "--target", "y", "-q", "-o", model]
    ignore = ["--handle-unknown", "ignore"]
    assert call(capsys, *fit, *(ignore if at == "fit" else []))[0] == 0
    predict = ["predict", model, tmp_path / "test.csv", "-q", "-o", out]
    if at == "predict":  # the model says error: one unseen level stops the file, naming the option
        code, _, err = call(capsys, *predict)
        assert code == 1 and "'z'" in err and "--handle-unknown ignore" in err and not out.exists()
    code, _, err = call(capsys, *predict, *(ignore if at == "predict" else []))
    assert code == 0, err
    library = nbattn.NadarayaWatsonRegressor(handle_unknown="ignore")
    library.set_params(var_type="cu").fit(train[["x", "g"]], train["y"])
    expected = library.predict(test)
    np.testing.assert_allclose(pd.read_csv(out)["prediction"], expected, rtol=1e-12, atol=0)
    evaluate = ["evaluate", model, tmp_path / "test.csv", "--json"]
    code, out_text, err = call(capsys, *evaluate, *(ignore if at == "predict" else []))
    assert code == 0 and json.loads(out_text)["n"] == 9, err


# ----------------------------------------------------------------------------- signals

_SLOW_PREDICT_ROWS = 300_000


@pytest.fixture(scope="module")
def slow_predict(tmp_path_factory):
    """A model and a file whose prediction takes seconds, in chunks of 2,000 rows."""
    folder = tmp_path_factory.mktemp("signals")
    rng = np.random.default_rng(0)
    train = pd.DataFrame({"a": rng.normal(size=3000), "b": rng.normal(size=3000)})
    train["y"] = train["a"] + rng.normal(size=3000)
    train.to_csv(folder / "train.csv", index=False)
    assert (
        cli.main(
            ["fit", str(folder / "train.csv"), "--target", "y", "-q", "-o", str(folder / "m.npz")]
        )
        == 0
    )
    n = _SLOW_PREDICT_ROWS
    pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n)}).to_csv(
        folder / "big.csv", index=False
    )
    return folder


@pytest.mark.parametrize(
    "signum, code",
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
)
def test_interrupted_predict_leaves_no_trace(slow_predict, signum, code):
    folder = slow_predict
    out = folder / "pred.csv"
    out.write_text("older output\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "nbattn.app.cli",
        "predict",
        str(folder / "m.npz"),
        str(folder / "big.csv"),
        "--chunksize",
        "2000",
        "-o",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not any(n.endswith(".part") for n in os.listdir(folder)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr, stdout) == (code, "nbattn: interrupted\n", "")
    assert out.read_text() == "older output\n"
    assert not [n for n in os.listdir(folder) if n.endswith(".part")]


# ----------------------------------------------------------------------------- verbose, layering


def test_fit_verbose_passes_verbose_to_the_estimator(work, capsys):
    # needs the estimators' verbose= parameter
    folder, _ = work
    assert cli.make_estimator("learned", verbose=True, max_iter=3).verbose == 1
    options = ["--model", "learned", "--max-iter", "3", "--verbose", "-q", "-o", folder / "v.npz"]
    code, out, err = fit_train(capsys, folder, *options)
    assert code == 0, err
    assert nbattn.load(folder / "v.npz").verbose == 1
    assert err.count("\n") >= 1 and "\r" not in err and out == ""  # plain lines, not a bar


def test_command_layer_calls_no_private_names():
    import ast

    tree = ast.parse((ROOT / "nbattn" / "app" / "cli.py").read_text())
    private = [
        f"{ast.unparse(node.value)}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]
    assert private == []
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert imported == []


def test_warnings_are_one_line(work, capsys, monkeypatch):
    folder, _ = work

    def warn(*args, **kwargs):
        import warnings

        warnings.warn("the search stopped\nat its edge", UserWarning, stacklevel=1)
        return 3, 0

    monkeypatch.setattr(batch, "predict_file", warn)
    code, _, err = use_model(capsys, folder, "predict", "train.csv", "-o", "p")
    assert code == 0
    assert err == "nbattn: warning: UserWarning: the search stopped at its edge\n"


def test_info_never_fails_on_cuda_lookups(capsys, monkeypatch):
    from numba.cuda.cudadrv import libs

    def broken(*args, **kwargs):
        raise RuntimeError("lookup exploded")

    for name in ("locate_driver_and_loader", "open_cudalib", "get_cudalib"):
        monkeypatch.setattr(libs, name, broken)
    code, out, err = call(capsys, "info")
    assert code == 0 and err == ""
    for lib in ("driver", "nvvm", "nvrtc", "cudart", "cudadevrt"):
        assert f"  {lib}: not found: lookup exploded" in out


@pytest.mark.parametrize("seed", range(3))
def test_a_heatmap_with_negative_weights_is_centred_on_zero(seed):
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(seed)
    softmax = rng.dirichlet(np.ones(9), size=5)
    signed = softmax - rng.uniform(0, 0.2) * rng.random((5, 9))
    image = plotting.plot_heatmap(softmax).images[0]
    assert image.get_cmap().name == "Reds"
    image = plotting.plot_heatmap(signed).images[0]
    low, high = image.get_clim()
    assert low == -high and high >= max(-signed.min(), signed.max())
    assert image.get_cmap().name == "RdBu_r"
