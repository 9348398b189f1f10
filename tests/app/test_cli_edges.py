"""Edges of ``nbattn predict`` and ``fit --drop`` a hostile review found: a model of two
targets, ``--drop`` given twice, the row-id warning's suggestion pasted into a shell, and an
interrupt that arrives inside numba's dispatcher."""

import shlex

import numpy as np
import pandas as pd
import pytest

import nbattn


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


def test_a_signal_inside_numbas_dispatcher_is_delivered_again_not_raised(monkeypatch):
    """Raised inside numba's dispatcher (a Python callback of its C code), the interrupt
    escapes through C that does not expect it ("returned a result with an exception
    set", or a crash): the handler schedules the signal again instead; in nbattn's own
    code it raises as before."""
    import signal
    import sys

    from nbattn.app import process
    from nbattn.app.process import Interrupted, signals_raise

    sent = []

    class Timer:  # records what would be sent, at once and on this thread
        def __init__(self, delay, function, args):
            self.delay, self.function, self.args = delay, function, args

        def start(self):
            sent.append((self.delay, self.args))

    monkeypatch.setattr(process.threading, "Timer", Timer)
    frame = sys._getframe()
    with signals_raise():
        handler = signal.getsignal(signal.SIGINT)
        for module in ("numba.core.dispatcher", "llvmlite.binding.executionengine"):
            callback = type("Frame", (), {"f_globals": {"__name__": module}})()
            handler(signal.SIGINT, callback)  # no raise: scheduled again
        assert sent == [(process.REDELIVER_AFTER_S, (process.os.getpid(), signal.SIGINT))] * 2
        with pytest.raises(Interrupted):
            handler(signal.SIGINT, frame)
