"""``nbattn fit / predict / evaluate`` with the density models: kde, cdens, quantile.

The command's files hold what the estimator computes on the same table: the fit is
the estimator's fit (and repeatable to the bit), ``predict`` writes its methods'
values, ``evaluate`` scores them by formulas computed here (scikit-learn's pinball loss
for the quantiles), and every option that does not apply is refused by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_pinball_loss

import nbattn
from nbattn.app import batch
from nbattn.app.process import Interrupted
from nbattn.estimators import ConditionalKernelDensity, KernelDensity, KernelQuantileRegressor

ROOT = Path(__file__).resolve().parents[2]


def _table(rng, n):
    x = rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], n)
    y = 1.5 * x + (colour == "red") + rng.normal(0, 0.5, n)
    level = np.where(y > 1, "high", np.where(y < -1, "low", "mid"))
    return pd.DataFrame(
        {"id": np.arange(n) + 100, "x": x, "colour": colour, "y": y, "level": level}
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_density")
    rng = np.random.default_rng(5)
    _table(rng, 70).to_csv(folder / "train.csv", index=False)
    _table(rng, 33).to_csv(folder / "query.csv", index=False)
    return folder


#: name -> (the fit's options after DATA, the estimator the command builds, its target)
FITS = {
    "kde": (
        ["--model", "kde", "--features", "x,colour"],
        lambda: KernelDensity(),
        None,
    ),
    "kde-widths": (
        ["--model", "kde", "--features", "x,colour", "--bandwidth", "0.4,0.3", "--rtol", "1e-3"],
        lambda: KernelDensity(bandwidth=[0.4, 0.3], rtol=1e-3),
        None,
    ),
    "cdens": (
        ["--model", "cdens", "--target", "y", "--features", "x,colour", "--bandwidth", "silverman"],
        lambda: ConditionalKernelDensity(bandwidth="silverman"),
        "y",
    ),
    "cdens-level": (
        ["--model", "cdens", "--target", "level", "--features", "x,colour", "--y-bandwidth", "0.2"],
        lambda: ConditionalKernelDensity(y_bandwidth=0.2),
        "level",
    ),
    "cdens-cv-cdf": (
        ["--model", "cdens", "--target", "y", "--features", "x,colour", "--y-bandwidth", "cv_cdf"],
        lambda: ConditionalKernelDensity(y_bandwidth="cv_cdf"),
        "y",
    ),
    "quantile": (
        ["--model", "quantile", "--target", "y", "--features", "x,colour", "--quantile", "0.8"]
        + ["--bandwidth", "normal_reference", "--kernel", "epanechnikov"],
        lambda: KernelQuantileRegressor(
            quantile=0.8, bandwidth="normal_reference", kernel="epanechnikov"
        ),
        "y",
    ),
}


def _fit(nbattn_cli, files, name, output=None):
    args, _, _ = FITS[name]
    path = output or files / f"{name}.npz"
    if output is not None or not path.exists():
        code, _, err = nbattn_cli("fit", files / "train.csv", *args, "-q", "-o", path)
        assert code == 0, err
    return path


def _xy(frame, target):
    X = frame[["x", "colour"]]
    return X, None if target is None else frame[target].to_numpy()


@pytest.mark.parametrize("name", sorted(FITS))
def test_fit_is_the_estimators_fit_and_repeatable(nbattn_cli, files, tmp_path, name):
    _, make, target = FITS[name]
    path = _fit(nbattn_cli, files, name)
    again = _fit(nbattn_cli, files, name, output=tmp_path / "again.npz")
    model, twice = nbattn.load(path), nbattn.load(again)
    X, y = _xy(pd.read_csv(files / "train.csv"), target)
    direct = make().set_params(var_type="cu").fit(X, y)
    for fitted in (twice, direct):
        assert model.get_params() == fitted.get_params()
        assert model.categories_ == fitted.categories_
        assert model.sample_weight_ is fitted.sample_weight_ is None
        assert np.array_equal(model.bandwidth_, fitted.bandwidth_)
        assert np.array_equal(model.X_fit_, fitted.X_fit_)
        if target is not None:
            assert model.y_bandwidth_ == fitted.y_bandwidth_
            assert np.array_equal(model.y_fit_, fitted.y_fit_)
            assert model.y_categories_ == fitted.y_categories_


def _predict(nbattn_cli, model, data, tmp_path, *options):
    out = tmp_path / "out.parquet"
    code, _, err = nbattn_cli("predict", model, data, "-o", out, "-q", *options)
    assert code == 0, err
    return pd.read_parquet(out)


@pytest.mark.parametrize("chunksize", ["7", "100000"])
def test_predict_writes_the_estimators_values(nbattn_cli, files, tmp_path, chunksize):
    query = pd.read_csv(files / "query.csv")
    X = query[["x", "colour"]]
    chunks = ("--chunksize", chunksize)

    kde = _fit(nbattn_cli, files, "kde")
    got = _predict(nbattn_cli, kde, files / "query.csv", tmp_path, *chunks, "--id-column", "id")
    assert list(got.columns) == ["id", "log_density"]
    assert np.array_equal(got["id"], query["id"])
    assert np.array_equal(got["log_density"], nbattn.load(kde).score_samples(X))

    cdens = _fit(nbattn_cli, files, "cdens")
    got = _predict(
        nbattn_cli, cdens, files / "query.csv", tmp_path, *chunks, "--quantiles", "0.1,0.5,0.9"
    )
    model = nbattn.load(cdens)
    assert list(got.columns) == ["q0.1", "q0.5", "q0.9", "log_density"]
    assert np.array_equal(got[["q0.1", "q0.5", "q0.9"]], model.predict_quantile(X, [0.1, 0.5, 0.9]))
    assert np.array_equal(got["log_density"], model.score_samples(X, query["y"]))

    text_y = _fit(nbattn_cli, files, "cdens-level")
    got = _predict(nbattn_cli, text_y, files / "query.csv", tmp_path, *chunks)
    want = nbattn.load(text_y).score_samples(X, query["level"].to_numpy(dtype=object))
    assert list(got.columns) == ["log_density"] and np.array_equal(got["log_density"], want)

    quantile = _fit(nbattn_cli, files, "quantile")
    model = nbattn.load(quantile)
    got = _predict(
        nbattn_cli, quantile, files / "query.csv", tmp_path, *chunks, "--interval", "0.2"
    )
    lower, upper = model.predict_interval(X, 0.2).T
    assert list(got.columns) == ["prediction", "y_lower", "y_upper"]
    assert np.array_equal(got["prediction"], model.predict(X))
    assert np.array_equal(got["y_lower"], lower) and np.array_equal(got["y_upper"], upper)
    got = _predict(
        nbattn_cli, quantile, files / "query.csv", tmp_path, *chunks, "--quantiles", "0.25,0.75"
    )
    assert list(got.columns) == ["q0.25", "q0.75"]
    assert np.array_equal(got.to_numpy(), model.predict_quantile(X, [0.25, 0.75]))


def test_a_conditional_density_without_its_target_writes_quantiles_only(
    nbattn_cli, files, tmp_path
):
    cdens = _fit(nbattn_cli, files, "cdens")
    query = pd.read_csv(files / "query.csv").drop(columns=["y"])
    query.to_csv(tmp_path / "no_y.csv", index=False)
    got = _predict(nbattn_cli, cdens, tmp_path / "no_y.csv", tmp_path, "--quantiles", "0.5")
    assert list(got.columns) == ["q0.5"]
    code, _, err = nbattn_cli("predict", cdens, tmp_path / "no_y.csv", "-o", tmp_path / "o.csv")
    assert code == 1 and "--quantiles" in err and "'y'" in err, err


def test_evaluate_scores_the_estimators_values(nbattn_cli, files):
    query = pd.read_csv(files / "query.csv")
    X = query[["x", "colour"]]
    data = files / "query.csv"

    def metrics(model, *options):
        code, out, err = nbattn_cli("evaluate", model, data, "--json", *options)
        assert code == 0, err
        return json.loads(out)

    kde = _fit(nbattn_cli, files, "kde")
    got = metrics(kde)
    assert got["n"] == len(query)
    assert got["log_lik"] == pytest.approx(np.mean(nbattn.load(kde).score_samples(X)), rel=1e-12)
    cdens = _fit(nbattn_cli, files, "cdens-level")
    got = metrics(cdens, "--chunksize", "5")
    want = np.mean(nbattn.load(cdens).score_samples(X, query["level"].to_numpy(dtype=object)))
    assert got["log_lik"] == pytest.approx(want, rel=1e-12)
    quantile = _fit(nbattn_cli, files, "quantile")
    model = nbattn.load(quantile)
    got = metrics(quantile, "--alpha", "0.3", "--chunksize", "8")
    assert got["pinball"] == pytest.approx(
        mean_pinball_loss(query["y"], model.predict(X), alpha=0.8), rel=1e-12
    )
    lower, upper = model.predict_interval(X, 0.3).T
    inside = (lower <= query["y"]) & (query["y"] <= upper)
    assert got["coverage"] == pytest.approx(inside.mean(), rel=1e-12)
    assert got["width"] == pytest.approx(np.mean(upper - lower), rel=1e-12)


@pytest.mark.parametrize(
    "command, message",
    [
        (["fit", "{train}", "--model", "kde", "--bandwidth", "scott"], "--bandwidth scott"),
        (["fit", "{train}", "--target", "y", "--bandwidth", "cv_ml"], "--bandwidth cv_ml"),
        (["fit", "{train}", "--model", "kde", "--quantile", "0.3"], "--quantile does not apply"),
        (["fit", "{train}", "--target", "y", "--y-bandwidth", "0.3"], "--y-bandwidth does not"),
        (["fit", "{train}", "--model", "kde", "--kernel", "average"], "--kernel average"),
        (["fit", "{train}", "--model", "cdens", "--target", "y", "--degree", "1"], "--degree"),
        (["predict", "{nw}", "{query}", "--quantiles", "0.5"], "--quantiles is for"),
        (["predict", "{kde}", "{query}", "--quantiles", "0.5"], "--quantiles is for"),
        (["predict", "{kde}", "{query}", "--std"], "--std does not apply"),
        (["predict", "{quantile}", "{query}", "--proba"], "--proba does not apply"),
        (["predict", "{cdens}", "{query}", "--interval", "0.1"], "--interval is for"),
        (["predict", "{cdens-level}", "{query}", "--quantiles", "0.5"], "continuous y"),
        (["predict", "{kde}", "{query}", "--handle-unknown", "ignore"], "--handle-unknown"),
        (["evaluate", "{cdens}", "{query}", "--alpha", "0.1"], "--alpha is for"),
        (["evaluate", "{nw}", "{query}", "--alpha", "0.1"], "--alpha is for"),
    ],
)
def test_options_that_do_not_apply_are_refused_by_name(
    nbattn_cli, files, tmp_path, command, message
):
    for name in ("kde", "cdens", "cdens-level", "quantile"):
        _fit(nbattn_cli, files, name)
    nw = files / "nw.npz"
    if not nw.exists():
        code, _, err = nbattn_cli(
            "fit", files / "train.csv", "--target", "y", "--features", "x", "-q", "-o", nw
        )
        assert code == 0, err
    names = {
        "train": files / "train.csv",
        "query": files / "query.csv",
        **{n: files / f"{n}.npz" for n in ("nw", "kde", "cdens", "cdens-level", "quantile")},
    }
    args = [str(a).format(**{k: str(v) for k, v in names.items()}) for a in command]
    if args[0] == "fit":
        args += ["--features", "x,colour", "-o", tmp_path / "m.npz"]
    else:
        args += ["-o", tmp_path / "o.csv"] if args[0] == "predict" else []
    code, out, err = nbattn_cli(*args)
    assert code == 1 and message in err, err
    assert not (tmp_path / "m.npz").exists() and not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--model", "cdens"], "required for --model cdens: --target"),
        (["--model", "kde", "--target", "y"], "--target does not apply to --model kde"),
    ],
)
def test_the_target_is_a_usage_question(nbattn_cli, capsys, files, tmp_path, options, message):
    with pytest.raises(SystemExit) as raised:
        nbattn_cli("fit", files / "train.csv", *options, "-o", tmp_path / "m.npz")
    assert raised.value.code == 2 and message in capsys.readouterr().err


def test_cv_refuses_the_density_models(nbattn_cli, files):
    with pytest.raises(SystemExit) as raised:
        nbattn_cli("cv", files / "train.csv", "--model", "kde")
    assert raised.value.code == 2


def test_an_interrupted_density_prediction_leaves_the_older_output(
    nbattn_cli, files, tmp_path, monkeypatch
):
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
    cdens = _fit(nbattn_cli, files, "cdens")
    args = ["predict", cdens, files / "query.csv", "-o", out, "--chunksize", "10", "-q"]
    code, stdout, err = nbattn_cli(*args)
    assert (code, stdout, err) == (130, "", "nbattn: interrupted\n")
    assert len(calls) == 3 and out.read_text() == "older output\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]


def test_predict_of_a_density_model_loads_no_scikit_learn(nbattn_cli, files, tmp_path):
    """``nbattn predict`` of each density model in a fresh process loads neither
    scikit-learn nor SciPy's statistics and optimisers, nor matplotlib or Dask."""
    cases = [
        ("kde", []),
        ("cdens", ["--quantiles", "0.1,0.9"]),
        ("cdens-level", []),
        ("quantile", ["--interval", "0.1"]),
    ]
    for name, extra in cases:
        model = _fit(nbattn_cli, files, name)
        out = tmp_path / f"{name}.csv"
        args = ["predict", str(model), str(files / "query.csv"), "-o", str(out), "-q", *extra]
        code = (
            "import json, sys\n"
            "from nbattn.app.cli import main\n"
            f"rc = main({args!r})\n"
            "heavy = ('sklearn', 'matplotlib', 'dask', 'scipy.stats', 'scipy.optimize')\n"
            "loaded = [m for m in sys.modules if m in heavy or m.split('.')[0] in heavy]\n"
            "print(json.dumps([rc, sorted(loaded)]))\n"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1]) == [0, []], name
        assert len(pd.read_csv(out)) == len(pd.read_csv(files / "query.csv"))


@pytest.mark.parametrize(
    ("name", "features"), [("kde", "x"), ("kde", "x,colour"), ("cdens", "x"), ("quantile", "x")]
)
def test_plot_density_draws_the_models_figure(nbattn_cli, files, tmp_path, name, features):
    """``plot density MODEL DATA`` writes the figure density_figure draws from the loaded
    model on the file's rows: the same PNG, byte for byte."""
    from nbattn.app.density_figures import density_figure
    from nbattn.app.plotting import save_figure

    model_path = _fit(nbattn_cli, files, name)
    out = tmp_path / f"{name}.png"
    code, _, err = nbattn_cli(
        "plot", "density", model_path, files / "query.csv", "--features", features, "-o", out
    )
    if name == "kde" and features == "x,colour":  # a continuous and a categorical column
        assert code != 0 and "features" in err
        assert not out.exists()
        return
    assert code == 0, err
    assert out.stat().st_size > 0
    model = nbattn.load(model_path)
    frame = pd.read_csv(files / "query.csv")
    X, y = _xy(frame, FITS[name][2])
    reference = tmp_path / "reference.png"
    save_figure(density_figure(model, X, y, features=features.split(",")), reference)
    assert out.read_bytes() == reference.read_bytes()


def test_plot_density_refuses_other_models_and_unknown_features(nbattn_cli, files, tmp_path):
    nw = tmp_path / "nw.npz"
    code, _, err = nbattn_cli(
        "fit", files / "train.csv", "--target", "y", "--features", "x", "-q", "-o", nw
    )
    assert code == 0, err
    out = tmp_path / "fig.png"
    code, _, err = nbattn_cli("plot", "density", nw, files / "query.csv", "-o", out)
    assert code != 0 and "density model" in err and not out.exists()
    model_path = _fit(nbattn_cli, files, "cdens")
    code, _, err = nbattn_cli(
        "plot", "density", model_path, files / "query.csv", "--features", "z", "-o", out
    )
    assert code != 0 and "'z'" in err and not out.exists()
    for model, target, message in (
        ("cdens", "x", "fitted on the target 'y'"),
        ("kde", "y", "no y"),
    ):
        code, _, err = nbattn_cli(
            "plot",
            "density",
            _fit(nbattn_cli, files, model),
            files / "query.csv",
            "--target",
            target,
            "-o",
            out,
        )
        assert code != 0 and message in err and not out.exists()
