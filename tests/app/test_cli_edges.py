"""Edges of ``nbattn predict`` and ``fit --drop`` a hostile review found: a model of two
targets, ``--drop`` given twice, the row-id warning's suggestion pasted into a shell, and an
interrupt that arrives inside numba's dispatcher."""

import json
import shlex
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.app import io


def _table(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 5, n)
    x2 = rng.normal(size=n)
    return pd.DataFrame(
        {"x1": x1, "x2": x2, "y": np.sin(x1) + 0.1 * x2, "y2": np.cos(x1) + 0.1 * x2}
    )


def test_predict_of_a_two_target_model_writes_one_column_per_target(tmp_path, nbattn_cli):
    """A model of two targets saved from Python predicts on the command line
    (today: ``Per-column arrays must each be 1-dimensional`` and exit 1)."""
    frame = _table()
    frame.to_csv(tmp_path / "d.csv", index=False)
    model = nbattn.NadarayaWatsonRegressor().fit(frame[["x1", "x2"]], frame[["y", "y2"]])
    nbattn.save(model, tmp_path / "m.npz")
    code, _, err = nbattn_cli(
        "predict", tmp_path / "m.npz", tmp_path / "d.csv", "-q", "-o", tmp_path / "p.csv"
    )
    assert code == 0, err
    out = pd.read_csv(tmp_path / "p.csv")
    expected = model.predict(frame[["x1", "x2"]])
    assert out.shape == (len(frame), 2)
    np.testing.assert_array_equal(out.to_numpy(), expected)


def test_drop_given_twice_drops_both(tmp_path, fit_csv):
    """``--drop a --drop b`` leaves both out (today the second replaces the first,
    silently: 'a' is fitted as a feature)."""
    frame = _table()
    frame.insert(0, "row", np.arange(len(frame)))
    frame.to_csv(tmp_path / "d.csv", index=False)
    options = ("--drop", "row", "--drop", "y2", "-o", tmp_path / "m.npz")
    code, _, err = fit_csv(tmp_path / "d.csv", *options)
    assert code == 0, err
    assert list(nbattn.load(tmp_path / "m.npz").feature_names_in_) == ["x1", "x2"]


def test_row_id_warning_suggests_a_command_line_that_works(tmp_path, fit_csv):
    """The warning's ``--drop NAME`` is quoted for the shell when the name needs it
    (pandas' ``Unnamed: 0`` from ``to_csv`` with the index)."""
    frame = _table()
    frame.to_csv(tmp_path / "d.csv")  # the index is written as the column 'Unnamed: 0'
    code, _, err = fit_csv(tmp_path / "d.csv", "--drop", "y2", "-o", tmp_path / "m.npz")
    assert code == 0, err
    line = next(x for x in err.splitlines() if "RowIdWarning" in x)
    suggestion = line.split("leave it out with ")[1]
    assert shlex.split(suggestion) == ["--drop", "Unnamed: 0"], line


def _next_step(log):
    log.append("next step")


def _numba_callback(name="numba.core.serialize"):
    """A function whose module is ``name`` (as numba's ``_numba_unpickle``, which compiled
    code calls back at the end of a kernel): it delivers ``handler(signum, frame)`` inside
    itself, as a signal that arrived during the kernel is, and records that it finished."""
    code = (
        "def callback(handler, signum, log):\n"
        "    handler(signum, sys._getframe())\n"
        "    log.append('callback finished')\n"
    )
    space = {"__name__": name, "sys": __import__("sys")}
    exec(code, space)
    return space["callback"]


@pytest.mark.parametrize("module", ["numba.core.serialize", "llvmlite.binding.executionengine"])
def test_a_signal_inside_numba_is_raised_when_python_leaves_numbas_code(monkeypatch, module):
    """A signal that arrives inside numba's or llvmlite's code (a Python callback of compiled
    or C code) is not raised there: the callback finishes, and the interrupt is raised
    in nbattn's code that called the kernel. (It was delivered again 50 ms later instead;
    a long kernel that calls back at its end caught every delivery there, so that Ctrl-C
    and SIGTERM never stopped a 20000-row ``fit --model learned``.)"""
    import signal

    from nbattn.app import process
    from nbattn.app.process import Interrupted, signals_raise

    sent = []

    class Timer:  # a signal sent again by a timer is recorded, never sent
        def __init__(self, delay, function, args):
            self.args = args

        def start(self):
            sent.append(self.args)

    monkeypatch.setattr(process.threading, "Timer", Timer)
    callback = _numba_callback(module)
    log = []
    with signals_raise():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(Interrupted):
            for _ in range(3):  # three kernels, each calling back at its end
                callback(handler, signal.SIGINT, log)
                _next_step(log)
    assert log == ["callback finished"]  # raised when nbattn's code goes on, not in numba
    assert sys.gettrace() is None  # the watch is removed once it has raised
    assert sent == []


def test_a_signal_outside_numba_is_raised_at_once():
    """In nbattn's own code the handler raises where the signal arrived."""
    import signal

    from nbattn.app.process import Interrupted, signals_raise

    with signals_raise():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(Interrupted):
            handler(signal.SIGINT, sys._getframe())


def test_a_deferred_signal_restores_the_trace_function_it_replaced():
    """A debugger's or coverage tool's trace function is back once the interrupt is raised."""
    import signal

    from nbattn.app.process import Interrupted, signals_raise

    calls = []

    def tool(frame, event, arg):
        calls.append(event)

    previous = sys.gettrace()
    sys.settrace(tool)
    try:
        with signals_raise():
            handler = signal.getsignal(signal.SIGINT)
            with pytest.raises(Interrupted):
                _numba_callback()(handler, signal.SIGINT, [])
                _next_step([])
        assert sys.gettrace() is tool
    finally:
        sys.settrace(previous)


def _mixed_files(tmp_path):
    """train.csv (x1, colour, y; 'red'/'blue') and a query file whose data row 5 (line 6)
    holds an unseen colour and whose data row 4 (line 5) misses x1."""
    frame = _table()
    frame["colour"] = np.where(np.arange(len(frame)) % 2, "red", "blue")
    frame[["x1", "colour", "y"]].to_csv(tmp_path / "train.csv", index=False)
    query = frame[["x1", "colour"]].iloc[:6].copy()
    query.loc[4, "colour"] = "green"
    query.loc[3, "x1"] = np.nan
    query.to_csv(tmp_path / "query.csv", index=False)
    query.drop(index=3).to_csv(tmp_path / "unseen.csv", index=False)
    return tmp_path / "train.csv", tmp_path / "query.csv", tmp_path / "unseen.csv"


@pytest.mark.parametrize("command", ["predict", "heatmap"])
def test_a_missing_value_the_model_cannot_marginalise_names_the_file_row(
    tmp_path, fit_csv, nbattn_cli, command
):
    """``--on-nan marginalize`` on a model fitted without it: the data row of the file
    (1-based, the header not counted) and the value's column, in the command's words
    (the model itself could name only the row of the chunk, counted from 0, and the
    value as ``np.float64(nan)``)."""
    train, query, _ = _mixed_files(tmp_path)
    assert fit_csv(train, "--features", "x1,colour", "-o", tmp_path / "m.npz")[0] == 0
    if command == "predict":
        head, tail = ["predict"], ["--chunksize", "2", "-o", tmp_path / "p.csv"]
    else:
        head, tail = ["plot", "heatmap"], ["-o", tmp_path / "h.png"]
    code, _, err = nbattn_cli(*head, tmp_path / "m.npz", query, "--on-nan", "marginalize", *tail)
    assert code == 1
    assert "query.csv: data row 4 (line 5 of the file): column 'x1' is missing" in err, err
    assert "--on-nan marginalize" in err and "np." not in err


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_an_unseen_category_names_the_file_row_not_the_chunks(
    tmp_path, fit_csv, nbattn_cli, command
):
    """An unseen category in the third chunk of two rows: its data row in the file
    (the model would say 'row 0', the row of the chunk counted from 0)."""
    train, _, unseen = _mixed_files(tmp_path)
    if command == "evaluate":
        frame = pd.read_csv(unseen)
        frame["y"] = 1.0
        frame.to_csv(unseen, index=False)
    assert fit_csv(train, "--features", "x1,colour", "-o", tmp_path / "m.npz")[0] == 0
    out = ["-o", tmp_path / "p.csv"] if command == "predict" else []
    args = [command, tmp_path / "m.npz", unseen, "--chunksize", "2", *out]
    code, _, err = nbattn_cli(*args)
    assert code == 1
    assert "unseen.csv: data row 4 (line 5 of the file): column 'colour' holds the category " in err
    assert "'green'" in err and "--handle-unknown ignore" in err and "(row 0)" not in err, err
    code, _, err = nbattn_cli(*args, "--handle-unknown", "ignore")
    assert code == 0, err


def _awkward_names(tmp_path):
    """A CSV whose header has a name with a comma ('id, row', a row id), one with spaces at
    its ends (' x1 '), another with a comma ('b, c'), a plain one and the target."""
    rng = np.random.default_rng(0)
    n = 40
    frame = pd.DataFrame(
        {
            "id, row": np.arange(n),
            " x1 ": rng.normal(size=n),
            "b, c": rng.normal(size=n),
            "x2": rng.normal(size=n),
            "y": rng.normal(size=n),
        }
    )
    frame.to_csv(tmp_path / "names.csv", index=False)
    return tmp_path / "names.csv"


@pytest.mark.parametrize(
    ("options", "features"),
    [
        (["--drop", '"id, row"', "--drop", '" x1 "'], ["b, c", "x2"]),
        (["--drop", '"id, row", " x1 "'], ["b, c", "x2"]),
        (["--features", '" x1 ", "b, c"'], [" x1 ", "b, c"]),
        (["--features", 'x2 , "b, c"', "--drop", "x2"], ["b, c"]),
    ],
)
def test_names_with_commas_or_spaces_are_given_in_double_quotes(
    tmp_path, fit_csv, options, features
):
    """--features and --drop take names separated by commas, spaces around each ignored;
    a name in double quotes is taken as it is, commas and spaces at its ends included."""
    data = _awkward_names(tmp_path)
    code, _, err = fit_csv(data, *options, "-o", tmp_path / "m.npz")
    assert code == 0, err
    assert list(nbattn.load(tmp_path / "m.npz").feature_names_in_) == features


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--drop", "id, row"], "--drop column 'id' not found (did you mean '\"id, row\"'?)"),
        (["--features", " x1 "], "feature column 'x1' not found (did you mean '\" x1 \"'?)"),
        (["--drop", "X2"], "--drop column 'X2' not found (did you mean x2?)"),
    ],
)
def test_a_name_not_found_lists_the_near_ones_as_the_option_spells_them(
    tmp_path, fit_csv, options, words
):
    code, _, err = fit_csv(_awkward_names(tmp_path), *options, "-o", tmp_path / "m.npz")
    assert code == 1 and words in err, err


def test_an_unclosed_quote_is_a_usage_error(tmp_path, fit_csv, capsys):
    with pytest.raises(SystemExit) as info:
        fit_csv(_awkward_names(tmp_path), "--drop", '"id, row', "-o", tmp_path / "m.npz")
    assert info.value.code == 2
    assert "argument --drop: the quote at character 1 of '\"id, row' is not closed" in (
        capsys.readouterr().err
    )


def test_the_row_id_warning_spells_a_name_with_a_comma_as_the_option_reads_it(tmp_path, fit_csv):
    """The warning's --drop, pasted into a shell, leaves out 'id, row' (and only it)."""
    data = _awkward_names(tmp_path)
    code, out, err = fit_csv(data, "-o", tmp_path / "m.npz")
    line = next(x for x in err.splitlines() if "RowIdWarning" in x)
    suggestion = shlex.split(line.split("leave it out with ")[1])
    assert suggestion == ["--drop", '"id, row"'], line
    code, _, err = fit_csv(data, *suggestion, "-o", tmp_path / "m.npz")
    assert code == 0, err
    assert list(nbattn.load(tmp_path / "m.npz").feature_names_in_) == [" x1 ", "b, c", "x2"]


@settings(max_examples=60)
@given(names=st.lists(st.text(st.sampled_from(' ,"ab'), min_size=1, max_size=6), min_size=1))
def test_an_options_names_read_back_as_written(names):
    """Any names, each spelled by column_option and joined by commas, read back as they
    are (an empty or all-space name is quoted, so it too comes back)."""
    text = ",".join(io.column_option(name) for name in names)
    assert io.split_columns(text) == names


def test_cv_json_lists_the_fold_sizes_and_averages_only_the_metrics(tmp_path, nbattn_cli):
    """43 rows in 5 folds: sizes [9, 9, 9, 8, 8] as a list (not 8.6 +- 0.55); the mean and
    the standard deviation are the metrics' alone, here and in each grid entry; the text
    output shows no mean of the sizes either."""
    frame = _table(n=43)
    frame.to_csv(tmp_path / "d.csv", index=False)
    cv = ["cv", tmp_path / "d.csv", "--target", "y", "--features", "x1,x2", "-q"]
    code, out, err = nbattn_cli(*cv, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["fold_sizes"] == [9, 9, 9, 8, 8]
    assert [fold["n"] for fold in got["folds"]] == got["fold_sizes"]
    assert "n" not in got["mean"] and "n" not in got["std"]
    assert got["mean"]["mse"] == pytest.approx(np.mean([f["mse"] for f in got["folds"]]))
    code, out, err = nbattn_cli(*cv, "--json", "--grid", "0.5,1")
    assert code == 0, err
    for entry in json.loads(out)["grid"]:
        assert entry["fold_sizes"] == [9, 9, 9, 8, 8] and "n" not in entry["mean"]
    code, out, err = nbattn_cli(*cv)
    assert code == 0, err
    mean_row = next(line for line in out.splitlines() if line.startswith("mean"))
    assert "8.6" not in mean_row and len(mean_row.split()) == 4, out  # mean, mse, mae, r2


def test_counts_of_one_are_singular(tmp_path, nbattn_cli):
    """'1 feature', '1 row', not '1 features', '1 rows', in what fit and predict print."""
    frame = _table(n=12)
    frame.loc[3, "x1"] = np.nan
    frame.to_csv(tmp_path / "d.csv", index=False)
    fit = ["fit", tmp_path / "d.csv", "--target", "y", "--features", "x1", "--on-nan", "drop"]
    code, out, err = nbattn_cli(*fit, "-o", tmp_path / "m.npz")
    assert code == 0, err
    assert "on 11 rows x 1 feature (dropped 1 row with missing values)" in out, out
    frame.iloc[:2].to_csv(tmp_path / "one.csv", index=False)
    frame.iloc[[3]].to_csv(tmp_path / "one.csv", mode="a", header=False, index=False)
    code, out, err = nbattn_cli(
        "predict",
        tmp_path / "m.npz",
        tmp_path / "one.csv",
        "--on-nan",
        "drop",
        "-o",
        tmp_path / "p.csv",
    )
    assert code == 0, err
    assert out.startswith("predicted 2 rows (dropped 1 row with missing values)"), out


@pytest.mark.parametrize(("n", "text"), [(0, "0 rows"), (1, "1 row"), (2, "2 rows")])
def test_plural_counts(n, text):
    from nbattn._core.validation import plural

    assert plural(n, "row") == text
    assert plural(n, "process", "processes") == text.replace("rows", "processes").replace(
        "row", "process"
    )
