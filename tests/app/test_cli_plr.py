"""The partially linear model on the command line: ``nbattn fit --model plr
--linear-columns A,B`` and the other commands on its model file, against
``PartiallyLinearRegressor`` fitted in Python on the same table (bit for bit), and the
refusals, each naming the option or the column."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.app import cli, plot_commands

#: the linear columns as the command takes them: a plain name and a quoted one with a comma
LINEAR = 'a,"b, c"'
LINEAR_NAMES = ["a", "b, c"]


def _table(n=36, seed=0):
    """z1 (continuous), grp (text), a and "b, c" (the linear columns), id, y; every number
    a multiple of 1/64 (exact in float64 and in its shortest decimal, so that the CSV reads
    back the same bits whatever parser), y = 2 a - 1.5 b + sin(2 z1) + [grp = hi] + noise."""
    rng = np.random.default_rng(seed)

    def dyadic(values):
        return np.round(np.asarray(values) * 64) / 64

    z1 = dyadic(rng.uniform(0, 3, n))
    grp = rng.choice(["lo", "mid", "hi"], n)
    a = dyadic(rng.normal(size=n) + np.sin(z1))
    b = dyadic(rng.normal(size=n))
    y = dyadic(2 * a - 1.5 * b + np.sin(2 * z1) + (grp == "hi") + 0.2 * rng.normal(size=n))
    return pd.DataFrame({"z1": z1, "grp": grp, "a": a, "b, c": b, "id": np.arange(n), "y": y})


def _python_model(frame, bandwidth, **options):
    """The estimator ``nbattn fit --drop id --model plr`` builds, fitted in Python."""
    X = frame.drop(columns=["id", "y"])
    model = nbattn.PartiallyLinearRegressor(
        linear_columns=LINEAR_NAMES, bandwidth=bandwidth, var_type="cucc", **options
    )
    return model.fit(X, frame["y"].to_numpy())


def _read(path):
    return pd.read_csv(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plr")
    train, test = _table(36, seed=0), _table(12, seed=1)
    train.to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)
    return folder, train, test


def _fit(nbattn_cli, folder, *options, name="m.npz"):
    base = ["fit", folder / "train.csv", "--target", "y", "--drop", "id", "--model", "plr"]
    return nbattn_cli(*base, "--linear-columns", LINEAR, *options, "-o", folder / name)


def test_fit_predict_equal_the_estimator_bit_for_bit(nbattn_cli, data):
    """Default widths (the leave-one-out search of each regression on z) and widths given
    per z column: the saved model's coefficients, the printed report and the predictions
    of ``nbattn predict`` are those of the estimator fitted in Python, twice the same."""
    folder, train, test = data
    for bandwidth, options in (("loo", ()), ([0.7, 0.3], ("--bandwidth", "0.7,0.3"))):
        expected = _python_model(train, bandwidth)
        code, out, err = _fit(nbattn_cli, folder, *options)
        assert code == 0, err
        saved = nbattn.load(folder / "m.npz")
        assert saved.coef_.tobytes() == expected.coef_.tobytes()
        assert saved.coef_se_.tobytes() == expected.coef_se_.tobytes()
        assert saved.bandwidth_.tobytes() == expected.bandwidth_.tobytes()
        coefs = ", ".join(
            f"{name}={b:.6g} (se {se:.3g})"
            for name, b, se in zip(["a", '"b, c"'], expected.coef_, expected.coef_se_)
        )
        assert f"coefficients: {coefs}\n" in out
        h, lam = expected.bandwidth_  # z = (z1, grp): the linear columns have no width
        assert f"bandwidth (z): z1={h:.6g}, grp={lam:.6g} (lambda)\n" in out
        runs = []
        for _ in range(2):
            code, _, err = nbattn_cli(
                "predict",
                folder / "m.npz",
                folder / "test.csv",
                "-o",
                folder / "p.csv",
                "--id-column",
                "id",
                "-q",
            )
            assert code == 0, err
            runs.append(_read(folder / "p.csv"))
        want = expected.predict(test.drop(columns=["id", "y"]))
        assert runs[0]["prediction"].to_numpy().tobytes() == want.tobytes()
        assert runs[1].equals(runs[0])
        assert runs[0]["id"].tolist() == test["id"].tolist()


def test_summary_and_evaluate(nbattn_cli, data):
    """``--summary`` prints the estimator's summary; ``evaluate`` the MSE, MAE and R^2 of
    its predictions."""
    folder, train, test = data
    expected = _python_model(train, [0.7, 0.3])
    code, out, err = _fit(nbattn_cli, folder, "--bandwidth", "0.7,0.3", "--summary", "-q")
    assert code == 0, err
    assert str(expected.summary()) in out
    code, out, err = nbattn_cli("evaluate", folder / "m.npz", folder / "test.csv", "--json")
    assert code == 0, err
    got = json.loads(out)
    y = test["y"].to_numpy()
    residual = y - expected.predict(test.drop(columns=["id", "y"]))
    assert got["n"] == len(y)
    np.testing.assert_allclose(got["mse"], np.mean(residual**2), rtol=1e-12)
    np.testing.assert_allclose(got["mae"], np.mean(np.abs(residual)), rtol=1e-12)
    r2 = 1 - np.sum(residual**2) / np.sum((y - y.mean()) ** 2)
    np.testing.assert_allclose(got["r2"], r2, rtol=1e-12)


def test_cv_equals_kfold_of_the_estimator(nbattn_cli, data):
    """``cv --model plr`` scores each fold of scikit-learn's shuffled KFold (seed 0) as the
    estimator fitted on the other folds does; ``--grid`` runs it for each bandwidth."""
    from sklearn.model_selection import KFold

    folder, train, _ = data
    base = ["cv", folder / "train.csv", "--target", "y", "--drop", "id", "--model", "plr"]
    code, out, err = nbattn_cli(
        *base, "--linear-columns", LINEAR, "--folds", "3", "--bandwidth", "0.7,0.3", "--json", "-q"
    )
    assert code == 0, err
    folds = json.loads(out)["folds"]
    X, y = train.drop(columns=["id", "y"]), train["y"].to_numpy()
    split = KFold(n_splits=3, shuffle=True, random_state=0).split(X, y)
    for got, (fit_rows, test_rows) in zip(folds, split, strict=True):
        model = nbattn.PartiallyLinearRegressor(
            linear_columns=LINEAR_NAMES, bandwidth=[0.7, 0.3], var_type="cucc"
        ).fit(X.iloc[fit_rows], y[fit_rows])
        mse = np.mean((y[test_rows] - model.predict(X.iloc[test_rows])) ** 2)
        np.testing.assert_allclose(got["mse"], mse, rtol=1e-12)
    code, out, err = nbattn_cli(
        *base, "--linear-columns", LINEAR, "--folds", "3", "--grid", "0.4,1", "-q"
    )
    assert code == 0, err
    assert "best by mean mse: bandwidth" in out


def test_plots(nbattn_cli, data):
    """``plot fit`` draws a panel per feature (the linear ones straight lines of slope
    coef_) without a band, and refuses ``--band``; ``plot widths`` shows z's widths only."""
    folder, train, _ = data
    assert _fit(nbattn_cli, folder, "--bandwidth", "0.7,0.3", "-q")[0] == 0
    expected = _python_model(train, [0.7, 0.3])
    code, out, err = nbattn_cli(
        "plot", "fit", folder / "m.npz", folder / "train.csv", "-o", folder / "fit.png"
    )
    assert code == 0, err
    assert (folder / "fit.png").stat().st_size > 0
    args = cli.build_parser().parse_args(
        ["plot", "fit", str(folder / "m.npz"), str(folder / "train.csv"), "-o", "x.png"]
    )
    fig = plot_commands.figure(args)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_xlabel() for ax in axes] == ["z1", "grp", "a", "b, c"]
    assert all(not ax.collections[1:] for ax in axes)  # the data's scatter only: no band
    for ax, coef in zip(axes[2:], expected.coef_):
        x, curve = ax.lines[0].get_data()
        np.testing.assert_allclose(np.diff(curve) / np.diff(x), coef, rtol=1e-9)
    code, _, err = nbattn_cli(
        "plot",
        "fit",
        folder / "m.npz",
        folder / "train.csv",
        "-o",
        folder / "b.png",
        "--band",
        "bootstrap",
    )
    assert code == 1 and "--band bootstrap" in err and "PartiallyLinearRegressor" in err
    assert not (folder / "b.png").exists()
    args = cli.build_parser().parse_args(["plot", "widths", str(folder / "m.npz"), "-o", "w.png"])
    fig = plot_commands.figure(args)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert [label.split()[0] for label in labels] == ["z1", "grp"]
    code, _, err = nbattn_cli("plot", "widths", folder / "m.npz", "-o", folder / "w.png")
    assert code == 0, err


@pytest.mark.parametrize(
    "options, wanted",
    [
        (
            ["--linear-columns", "a,nope"],
            ["--linear-columns 'nope' is not one of the features", 'z1, grp, a, "b, c"'],
        ),
        (["--linear-columns", "a,y"], ["--linear-columns 'y' is the target column"]),
        (["--linear-columns", "a,id"], ["--linear-columns 'id' is left out by --drop"]),
        (["--linear-columns", "grp"], ["linear column 'grp' is categorical"]),
        (["--linear-columns", "a,a"], ["--linear-columns names the column 'a' twice"]),
        (["--linear-columns", 'z1,grp,a,"b, c"'], ["--linear-columns names every feature"]),
        (
            ["--linear-columns", LINEAR, "--bandwidth", "1,2,3"],
            ["--bandwidth gives 3 widths, one per feature not in --linear-columns", "z1, grp"],
        ),
        (
            ["--model", "lp", "--linear-columns", "a"],
            ["--linear-columns does not apply to --model lp"],
        ),
    ],
)
def test_fit_refusals_name_the_option_or_column(nbattn_cli, data, options, wanted):
    folder, _, _ = data
    base = ["fit", folder / "train.csv", "--target", "y", "--drop", "id", "--model", "plr"]
    code, out, err = nbattn_cli(*base, *options, "-o", folder / "refused.npz")
    assert code == 1 and out == ""
    for text in wanted:
        assert text in err
    assert not (folder / "refused.npz").exists()


def test_plr_needs_linear_columns(data, capsys):
    """A usage error (exit 2) naming the option, for fit and cv."""
    folder, _, _ = data
    for command in ("fit", "cv"):
        output = ["-o", str(folder / "x.npz")] if command == "fit" else []
        argv = [command, str(folder / "train.csv"), "--target", "y", "--model", "plr", *output]
        with pytest.raises(SystemExit) as raised:
            cli.main(argv)
        assert raised.value.code == 2
        assert "--model plr needs --linear-columns" in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--std"], ["--interval", "0.1"], ["--marginal-effects"]])
def test_predict_refuses_what_the_model_does_not_offer(nbattn_cli, data, option):
    folder, _, _ = data
    assert _fit(nbattn_cli, folder, "--bandwidth", "0.7,0.3", "-q", name="r.npz")[0] == 0
    code, _, err = nbattn_cli(
        "predict", folder / "r.npz", folder / "test.csv", "-o", folder / "refused.csv", *option
    )
    assert code == 1
    assert f"{option[0]} does not apply to a PartiallyLinearRegressor model" in err
    assert not (folder / "refused.csv").exists()


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(8, 24),
    seed=st.integers(0, 2**16),
    linear=st.sampled_from([["a"], ["b, c"], ["b, c", "a"], ["z1", "a"]]),
    degree=st.integers(0, 2),
)
def test_any_linear_subset_matches_python(tmp_path_factory, n, seed, linear, degree):
    """Over random tables, subsets and orders of linear columns (by name) and degrees, the
    command's predictions on its training file are the estimator's, bit for bit."""
    folder = tmp_path_factory.mktemp("prop")
    frame = _table(n, seed)
    frame.to_csv(folder / "d.csv", index=False)
    quoted = ",".join(f'"{c}"' if "," in c else c for c in linear)
    z = [c for c in ("z1", "grp", "a", "b, c") if c not in linear]
    widths = [0.9 if c != "grp" else 0.4 for c in z]
    code = cli.main(
        [
            "fit",
            str(folder / "d.csv"),
            "--target",
            "y",
            "--drop",
            "id",
            "--model",
            "plr",
            "--linear-columns",
            quoted,
            "--degree",
            str(degree),
            "--bandwidth",
            ",".join(map(str, widths)),
            "-q",
            "-o",
            str(folder / "m.npz"),
        ]
    )
    assert code == 0
    code = cli.main(
        ["predict", str(folder / "m.npz"), str(folder / "d.csv"), "-q", "-o", str(folder / "p.csv")]
    )
    assert code == 0
    X = frame.drop(columns=["id", "y"])
    model = nbattn.PartiallyLinearRegressor(
        linear_columns=linear, bandwidth=widths, degree=degree, var_type="cucc"
    ).fit(X, frame["y"].to_numpy())
    got = _read(folder / "p.csv")["prediction"].to_numpy()
    assert got.tobytes() == model.predict(X).tobytes()
