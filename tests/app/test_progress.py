"""Progress of the long runs on stderr: ``nbattn cv``, ``plot loo``, the Dask functions.

Every line goes through :mod:`nbattn._core.progress` and ends with the elapsed time.
"""

import io
import json
import re
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import KFold

import nbattn
from nbattn._core.progress import FitProgress, format_elapsed
from nbattn.app import batch, cli

ELAPSED = re.compile(r" \[(\d+\.\d s|\d+ min \d\d s|\d+ h \d\d min)\]$")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _frame(seed=3, n=90):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 6, n)
    x2 = rng.normal(size=n)
    y = 2 * np.sin(x1) + 0.3 * x2 + rng.normal(0, 0.4, n)
    return pd.DataFrame({"x1": x1, "x2": x2, "y": y})


@pytest.fixture
def train(tmp_path):
    path = tmp_path / "train.csv"
    _frame().to_csv(path, index=False)
    return path


def _cv(train, *options):
    return ["cv", str(train), "--target", "y", "--folds", "3", "--seed", "4", *options]


# ----------------------------------------------------------------------------- the module


def test_format_elapsed():
    assert format_elapsed(0.04) == "0.0 s"
    assert format_elapsed(12.34) == "12.3 s"
    assert format_elapsed(232) == "3 min 52 s"
    assert format_elapsed(3600 + 5 * 60 + 9) == "1 h 05 min"
    assert format_elapsed(-1) == "0.0 s"


def test_fit_progress_levels(capfd, monkeypatch):
    with FitProgress(0, "work", total=2) as log:
        log.status("running")
        log.step("one")
        log.note("n")
    assert capfd.readouterr().err == ""
    with FitProgress(1, "work", total=2) as log:  # stderr is not a terminal: lines
        log.status("running")  # no line of its own
        log.step("step 1 of 2")
        log.note("a note")
    lines = capfd.readouterr().err.splitlines()
    assert [ELAPSED.sub("", line) for line in lines] == ["work: step 1 of 2", "work: a note"]
    assert all(ELAPSED.search(line) for line in lines)
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    with FitProgress(1, "work", total=2) as log:
        log.status("under way")
        assert "under way" in stream.getvalue()  # shown at once
        log.step("first", n=2)
    text = stream.getvalue()
    assert "\r" in text and "2/2" in text and "first" in text


# ----------------------------------------------------------------------------- nbattn cv


def test_cv_lines_carry_candidate_fold_criterion_and_elapsed(train, capsys):
    code = cli.main(_cv(train, "--grid", "0.3,1", "--json"))
    out, err = capsys.readouterr()  # stderr is not a terminal: one line per fit
    assert code == 0
    grid = json.loads(out)["grid"]
    lines = err.splitlines()
    assert ELAPSED.sub("", lines[0]) == "cv: 3 folds x 2 candidates on 90 rows"
    fits = lines[1:]
    assert len(fits) == 6 and all(ELAPSED.search(line) for line in fits)
    for c, (entry, width) in enumerate(zip(grid, ["0.3", "1.0"])):
        mses = [fold["mse"] for fold in entry["folds"]]
        for k, line in enumerate(fits[3 * c : 3 * c + 3], start=1):
            head, rest = ELAPSED.sub("", line).split(": mse ")
            assert head == f"cv: bandwidth {width}, fold {k}/3"
            value, mean = rest.split("; mean so far ")
            assert float(value) == pytest.approx(mses[k - 1], rel=1e-5)
            assert float(mean) == pytest.approx(np.mean(mses[:k]), rel=1e-5)
    assert cli.main(_cv(train, "--grid", "0.3,1", "--json", "-q")) == 0
    out_quiet, err_quiet = capsys.readouterr()
    assert err_quiet == "" and json.loads(out_quiet) == json.loads(out)


def test_cv_on_a_terminal_draws_one_bar_over_folds_and_candidates(train, capsys, monkeypatch):
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    assert cli.main(_cv(train, "--grid", "0.3,1,scott")) == 0
    text = stream.getvalue()
    assert "\r" in text and "9/9" in text and "bandwidth scott, fold 3/3: mse" in text
    assert "mean so far" in text and "\ncv: bandwidth" not in text  # a bar, not lines
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    assert cli.main(_cv(train, "-q")) == 0
    assert stream.getvalue() == ""


def test_cross_validate_reports_a_classifiers_log_loss(capfd):
    frame = _frame(5)
    X, labels = frame[["x1", "x2"]], np.where(frame["y"] > 1, "hi", "lo")
    model = nbattn.NadarayaWatsonClassifier(bandwidth=0.8)
    (table,) = batch.cross_validate([model], X, labels, folds=3, verbose=2)
    lines = [ELAPSED.sub("", line) for line in capfd.readouterr().err.splitlines()]
    assert lines[0] == "cv: 3 folds x 1 candidate on 90 rows"
    got = [float(line.split(": log_loss ")[1].split(";")[0]) for line in lines[1:]]
    np.testing.assert_allclose(got, table["log_loss"], rtol=1e-5)
    assert [line.split(":")[1] for line in lines[1:]] == [f" fold {k}/3" for k in (1, 2, 3)]
    again = batch.cross_validate([model], X, labels, folds=3)
    assert capfd.readouterr().err == ""
    pd.testing.assert_frame_equal(again[0], table)  # the same folds, the same numbers
    with pytest.raises(ValueError, match="labels"):
        batch.cross_validate([model], X, labels, folds=3, labels=["a", "b"])


def test_cross_validate_folds_match_a_manual_kfold():
    frame = _frame(6)
    X, y = frame[["x1", "x2"]], frame["y"].to_numpy()
    (table,) = batch.cross_validate([nbattn.NadarayaWatsonRegressor()], X, y, folds=3, seed=2)
    want = []
    for train, test in KFold(3, shuffle=True, random_state=2).split(X):
        fitted = nbattn.NadarayaWatsonRegressor().fit(X.iloc[train], y[train])
        want.append(np.mean((fitted.predict(X.iloc[test]) - y[test]) ** 2))
    np.testing.assert_allclose(table["mse"], want, rtol=1e-12)


# ----------------------------------------------------------------------------- plot loo


def test_plot_loo_bar_counts_every_width(train, tmp_path, capsys, monkeypatch):
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    out = tmp_path / "loo.png"
    assert (
        cli.main(["plot", "loo", str(train), "--target", "y", "--points", "7", "-o", str(out)]) == 0
    )
    text = stream.getvalue()
    assert "7/7" in text and "8/7" not in text and "widths" in text
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    cli.main(["plot", "loo", str(train), "--target", "y", "--points", "7", "-q", "-o", str(out)])
    assert stream.getvalue() == ""


# ----------------------------------------------------------------------------- Dask

dd = pytest.importorskip("dask.dataframe")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
nbdask = nbattn.dask


def _partition_lines(err, desc):
    lines = [line for line in err.splitlines() if line.startswith(f"{desc}: ")]
    assert all(ELAPSED.search(line) for line in lines), lines
    return [ELAPSED.sub("", line)[len(desc) + 2 :] for line in lines]


def test_dask_predict_progress_on_the_local_scheduler(capfd):
    frame = _frame(8)
    X = frame[["x1", "x2"]]
    model = nbattn.NadarayaWatsonRegressor().fit(X, frame["y"])
    lazy = nbdask.predict(model, dd.from_pandas(X, npartitions=4))
    assert capfd.readouterr().err == ""  # lazy, and quiet by default
    got = nbdask.predict(model, dd.from_pandas(X, npartitions=4), progress=True)
    lines = _partition_lines(capfd.readouterr().err, "dask.predict")
    assert lines == [f"{k}/4 partitions done" for k in range(1, 5)]
    pd.testing.assert_series_equal(got, lazy.compute())
    plain = nbattn.NadarayaWatsonRegressor().fit(X.to_numpy(), frame["y"])
    arr = nbdask.predict(plain, da.from_array(X.to_numpy(), chunks=(25, 2)), progress=2)
    assert _partition_lines(capfd.readouterr().err, "dask.predict")[-1] == "4/4 partitions done"
    np.testing.assert_array_equal(arr, plain.predict(X.to_numpy()))
    with pytest.raises(ValueError, match="verbose"):
        nbdask.predict(model, dd.from_pandas(X, npartitions=4), progress="yes")


def test_dask_progress_on_a_local_cluster(capfd):
    rng = np.random.default_rng(9)
    keys = rng.uniform(0, 6, size=(400, 2))
    values = np.sin(keys[:, 0]) + rng.normal(0, 0.2, 400)
    frame = pd.DataFrame(keys, columns=["a", "b"])
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with cluster, distributed.Client(cluster):
        capfd.readouterr()
        model = nbattn.NadarayaWatsonRegressor().fit(frame, values)
        got = nbdask.predict(model, dd.from_pandas(frame, npartitions=5), progress=1)
        lines = _partition_lines(capfd.readouterr().err, "dask.predict")
        assert lines == [f"{k}/5 partitions done" for k in range(1, 6)]
        np.testing.assert_array_equal(got.to_numpy(), model.predict(frame))

        out = nbdask.nadaraya_watson_sharded(
            keys[:50],
            da.from_array(keys, chunks=(100, 2)),
            da.from_array(values, chunks=100),
            bandwidth=0.5,
            progress=True,
        )
        lines = _partition_lines(capfd.readouterr().err, "dask.nadaraya_watson_sharded")
        assert lines == ["1/1 partitions done"]
        np.testing.assert_allclose(
            out, model.set_params(bandwidth=0.5).fit(keys, values).predict(keys[:50]), rtol=1e-10
        )

        X = dd.from_pandas(frame, npartitions=3)
        y = dd.from_pandas(pd.Series(values, name="y"), npartitions=3)
        fitted = nbdask.fit(nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale"), X, y, verbose=1)
        err = capfd.readouterr().err
        assert _partition_lines(err, "dask.fit")[-1] == "6/6 partitions done"  # X's and y's
        evaluations = _partition_lines(err, "dask.sharded_training")
        assert len(evaluations) >= 3 and evaluations[0] == "LOO evaluation 1: 3/3 row ranges done"
        n_eval = len(evaluations) - 1
        assert evaluations[-1] == f"{n_eval} evaluations, {3 * n_eval} tasks on the cluster"
        assert [e.split(":")[0] for e in evaluations[:-1]] == [
            f"LOO evaluation {k}" for k in range(1, len(evaluations))
        ]
        again = nbdask.fit(nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale"), X, y)
        assert capfd.readouterr().err == ""  # the estimator's verbose=0: quiet
        np.testing.assert_array_equal(again.bandwidth_, fitted.bandwidth_)  # repeatable
        local = nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale").fit(frame, values)
        np.testing.assert_allclose(fitted.bandwidth_, local.bandwidth_, rtol=1e-6)


def test_compute_with_progress_keeps_a_log_short(capfd):
    big = da.arange(240, chunks=2) * 2  # 120 partitions
    (got,) = nbdask.compute_with_progress(big, verbose=2, desc="work")
    np.testing.assert_array_equal(got, np.arange(240) * 2)
    lines = _partition_lines(capfd.readouterr().err, "work")
    counts = [int(line.split("/")[0]) for line in lines]
    assert (
        40 <= len(lines) <= 60
        and counts == sorted(counts)
        and lines[-1] == "120/120 partitions done"
    )
    (same,) = nbdask.compute_with_progress(big, verbose=0)
    assert capfd.readouterr().err == ""
    np.testing.assert_array_equal(same, got)


@pytest.mark.parametrize("mixed", [False, True])
def test_plot_loo_shows_the_progress_of_its_width_search(tmp_path, monkeypatch, mixed):
    """After the curve, the search for the marked width (``loo_bandwidth``, or the
    regressor's 'loo_scale' search with categorical columns) draws its bar on a terminal
    too; -q silences it (and off a terminal, as the curve's bar, nothing is written)."""
    frame = _frame()
    if mixed:
        frame["colour"] = np.where(frame.x2 > 0, "red", "blue")
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    args = ["plot", "loo", str(path), "--target", "y", "--points", "5", "-o"]
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    assert cli.main([*args, str(tmp_path / "loo.png")]) == 0
    search = "loo_scale: " if mixed else "loo_bandwidth: "
    assert "5/5" in stream.getvalue() and search in stream.getvalue(), stream.getvalue()
    for quiet, out in ((["-q"], Terminal()), ([], io.StringIO())):
        monkeypatch.setattr(sys, "stderr", out)
        assert cli.main([*args, str(tmp_path / "q.png"), *quiet]) == 0
        assert out.getvalue() == ""
