"""Inputs a hostile review of the command tried on public tables: CSV rows cut short,
column names that are near misses (Unicode normalization, a column already in use, a
feature named twice), outputs that cannot be written, targets near the float64 limit,
and column names with commas in a figure's titles."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.app import batch, io
from nbattn.app.metrics import Metrics


def _table(n=30, seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 5, n)
    x2 = rng.normal(size=n)
    return pd.DataFrame({"x1": x1, "x2": x2, "y": np.sin(x1) + 0.1 * x2})


# ----------------------------------------------------------------------------- short rows


def _lines(n, short_at, blank_every, crlf, bom):
    """A CSV text of n data rows (a, b, y), row ``short_at`` (0-based; None: none) cut to
    two fields, a blank line after every ``blank_every``-th row (0: none), a quoted cell
    over two lines in row 1, and rows whose last field is present but empty."""
    end = "\r\n" if crlf else "\n"
    out = ["\ufeff" * bom + "a,b,y"]
    for i in range(n):
        if i == short_at:
            out.append(f"{i},{i % 3}")
        elif i == 1:
            out.append(f'{i},"{i % 3}",{i}')
        elif i % 4 == 3:
            out.append(f"{i},{i % 3},")  # three fields, the last empty: not short
        else:
            out.append(f"{i},{i % 3},{2 * i}")
        if blank_every and i % blank_every == blank_every - 1:
            out.append("")
    return end.join(out) + end


def _line_of(text, row):
    """The 1-based file line on which data row ``row`` (0-based) starts."""
    lines = text.replace("\r\n", "\n").split("\n")
    data = [k for k, line in enumerate(lines[1:], start=2) if line.strip()]
    return data[row]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(3, 30),
    data=st.data(),
    chunksize=st.integers(1, 12),
    blank_every=st.integers(0, 4),
    crlf=st.booleans(),
    bom=st.booleans(),
)
def test_a_row_with_fewer_fields_than_the_header_is_an_error_naming_its_line(
    tmp_path_factory, n, data, chunksize, blank_every, crlf, bom
):
    """pandas fills a row cut short with NaN: it passed for a row with a missing value
    (``--on-nan drop`` dropped it without a word). Every chunking names its line."""
    short_at = data.draw(st.one_of(st.none(), st.integers(0, n - 1)))
    text = _lines(n, short_at, blank_every, crlf, bom)
    path = tmp_path_factory.mktemp("short") / "t.csv"
    path.write_bytes(text.encode())
    chunks, _, _ = io.iter_chunks(path, ["a", "b", "y"], chunksize)
    if short_at is None:
        frame = pd.concat([c for c, _, _ in chunks], ignore_index=True)
        pd.testing.assert_frame_equal(frame, pd.read_csv(path), check_dtype=False)
        return
    with pytest.raises(ValueError) as caught:
        for _ in chunks:
            pass
    line = _line_of(text, short_at)
    assert str(caught.value) == f"{path}: line {line} has 2 fields; the header has 3"


@pytest.mark.parametrize("on_nan", ["error", "drop", "marginalize"])
def test_fit_refuses_a_short_row_whatever_on_nan(tmp_path, fit_csv, on_nan):
    text = _lines(20, 6, 0, False, False)
    (tmp_path / "t.csv").write_text(text)
    code, _, err = fit_csv(tmp_path / "t.csv", "--on-nan", on_nan, "-o", tmp_path / "m.npz")
    assert code == 1 and "line 8 has 2 fields; the header has 3" in err, err
    assert not (tmp_path / "m.npz").exists()


def test_predict_refuses_a_short_row_and_writes_nothing(tmp_path, fit_csv, nbattn_cli):
    _table().rename(columns={"x1": "a", "x2": "b"}).to_csv(tmp_path / "d.csv", index=False)
    assert fit_csv(tmp_path / "d.csv", "-o", tmp_path / "m.npz")[0] == 0
    (tmp_path / "q.csv").write_text("a,b\n1,2\n3\n4,5\n")
    code, _, err = nbattn_cli(
        "predict", tmp_path / "m.npz", tmp_path / "q.csv", "--on-nan", "drop", "-q",
        "-o", tmp_path / "p.csv",
    )  # fmt: skip
    assert code == 1 and "line 3 has 1 field; the header has 2" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "m.npz", "q.csv"]


# ----------------------------------------------------------------------------- names


def test_a_missing_column_is_never_matched_to_a_column_in_use():
    """A file that lost the feature 'rm' suggested 'crim', another feature of the model."""
    with pytest.raises(ValueError) as caught:
        io.check_columns("q.csv", ["crim", "lstat"], ["crim", "rm", "lstat"], "feature column")
    message = str(caught.value)
    assert "feature column 'rm' not found;" in message and "did you mean" not in message


def test_a_name_in_another_unicode_normalization_is_said_to_look_the_same():
    """'é' typed as 'e' and a combining accent: the hint showed the file's name, which
    looks exactly like the one typed."""
    typed = "tempe\u0301rature"
    with pytest.raises(ValueError) as caught:
        io.check_columns("t.csv", ["temp\u00e9rature", "y"], [typed], "feature column")
    message = str(caught.value)
    assert "'tempe\\u0301rature' not found" in message
    assert "'temp\\xe9rature' looks the same" in message


@pytest.mark.parametrize(
    "options, message",
    [
        (["--features", "x1,x1"], "--features names the column 'x1' twice"),
        (["--features", "x1,y"], "--features names the target column 'y'"),
        (["--drop", "x1,x2"], "--drop leaves no feature columns (it names all 2 features)"),
    ],
)
def test_feature_lists_that_cannot_be_meant_are_refused(tmp_path, fit_csv, options, message):
    """``--features x1,x1`` fitted one feature and reported two."""
    _table().to_csv(tmp_path / "t.csv", index=False)
    code, _, err = fit_csv(tmp_path / "t.csv", *options, "-o", tmp_path / "m.npz")
    assert code == 1 and message in err, err
    assert not (tmp_path / "m.npz").exists()


# ----------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
@pytest.mark.parametrize(
    "command",
    [
        ["fit", "{data}", "--target", "y"],
        ["plot", "loo", "{data}", "--target", "y", "--points", "3"],
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_work(
    tmp_path, nbattn_cli, monkeypatch, where, command
):
    """A fit (or a leave-one-out curve) ran to the end before the output's folder was
    found missing."""
    _table().to_csv(tmp_path / "t.csv", index=False)

    def read(*args, **kwargs):
        raise AssertionError("the data was read before the output was checked")

    monkeypatch.setattr(batch, "load_xy", read)
    output = tmp_path / "nowhere" / "out.png"
    if where == "a folder":
        output = tmp_path / "out.png"
        output.mkdir()
    args = [a.format(data=tmp_path / "t.csv") for a in command]
    code, _, err = nbattn_cli(*args, "-q", "-o", output)
    expected = "does not exist" if where == "missing folder" else "is a folder"
    assert code == 1 and expected in err, err


# ----------------------------------------------------------------------------- huge targets


def test_metrics_of_targets_near_the_float64_limit_are_inf_not_an_error():
    """Sums of squares of 1e300 overflow: ``cv`` stopped with
    'OverflowError: (34, 'Numerical result out of range')'."""
    y = np.linspace(1, 2, 10) * 1e300
    metrics = Metrics(False)
    metrics.add_regression(y[:5], y[:5] * 0.5)
    metrics.add_regression(y[5:], y[5:] * 0.5)
    result = metrics.result()
    assert result["n"] == 10 and result["mse"] == np.inf
    assert result["mae"] == pytest.approx(np.mean(y) * 0.5)


@pytest.mark.parametrize("scale", [2.0**1000, 2.0**-1000])
def test_r2_of_targets_at_any_scale_is_the_unscaled_one(scale):
    """The sums are kept in units of a power of two: R^2 of targets near 1e300 or 1e-300
    is the bits of the unscaled R^2 (it was NaN from inf / inf or 0 / 0), whatever the
    chunks; the MSE is its scaled value where float64 holds it."""
    rng = np.random.default_rng(1)
    y = rng.normal(size=40)
    pred = y + 0.3 * rng.normal(size=40)
    base = Metrics(False)
    base.add_regression(y, pred)
    for cut in (0, 7, 39):
        metrics = Metrics(False)
        metrics.add_regression(y[:cut] * scale, pred[:cut] * scale)
        metrics.add_regression(y[cut:] * scale, pred[cut:] * scale)
        result = metrics.result()
        assert result["r2"] == pytest.approx(base.result()["r2"], rel=1e-14)
        with np.errstate(over="ignore", under="ignore"):
            expected_mse = base.result()["mse"] * scale * scale
        assert result["mse"] == pytest.approx(expected_mse, rel=1e-14)


def test_cv_of_targets_near_the_float64_limit_reports_null_mse(tmp_path, nbattn_cli):
    frame = _table()
    frame["y"] = (frame["y"] + 2) * 1e300
    frame.to_csv(tmp_path / "t.csv", index=False)
    code, out, err = nbattn_cli("cv", tmp_path / "t.csv", "--target", "y", "--json", "-q")
    assert code == 0, err
    result = json.loads(out)
    assert result["mean"]["mse"] is None and result["mean"]["mae"] > 1e299


# ----------------------------------------------------------------------------- figures


def test_held_values_quote_names_with_commas_and_spaces():
    """'others held at a, b = 1.45,  sp  = 1' read as three features; the names are
    written as --features reads them."""
    from nbattn.app.plotting import held_at

    reference = pd.Series({"a, b": 1.45, " sp ": 1.0, "colour": "red, dark", "y": 0.0})
    title = held_at(reference, "cuc", ["a, b", "colour", " sp "], "y", width=200)
    assert title == 'others held at "a, b" = 1.45, colour = "red, dark", " sp " = 1'


def test_fit_on_names_with_commas_round_trips_through_the_printed_names(tmp_path, fit_csv):
    """The names ``fit`` prints are the ones ``--features`` reads back."""
    frame = _table().rename(columns={"x1": "a, b", "x2": ' say "hi" '})
    frame.to_csv(tmp_path / "t.csv", index=False)
    code, out, err = fit_csv(tmp_path / "t.csv", "-o", tmp_path / "m.npz")
    assert code == 0, err
    names = list(nbattn.load(tmp_path / "m.npz").feature_names_in_)
    spelled = ",".join(io.column_option(c) for c in names)
    assert io.split_columns(spelled) == names == ["a, b", ' say "hi" ']


# ----------------------------------------------------------------------------- encodings


@pytest.mark.parametrize("rows_before", [0, 5000])
def test_a_file_that_is_not_utf8_names_the_line(tmp_path, fit_csv, rows_before):
    """A Latin-1 file stopped with 'cannot read as CSV: 'utf-8' codec can't decode byte
    0xe9 in position 4: invalid continuation byte' (a position in pandas' read buffer)."""
    body = b"".join(f"{i},{i % 3},{2 * i}\n".encode() for i in range(rows_before))
    text = b"a,b,y\n" + body + "5,caf\u00e9,1\n".encode("latin-1") + b"6,1,2\n"
    (tmp_path / "t.csv").write_bytes(text)
    code, _, err = fit_csv(tmp_path / "t.csv", "-o", tmp_path / "m.npz")
    line = rows_before + 2
    expected = f"line {line} is not UTF-8 text (its byte 6 is 0xe9); save the file as UTF-8"
    assert code == 1 and expected in err, err
    assert not (tmp_path / "m.npz").exists()


# ----------------------------------------------------------------------------- per-feature options


_VAR_TYPE = (["--var-type", "u"], "--var-type gives 1 letter, one per feature, but there are 2")
_WIDTHS = (["--bandwidth", "1,2,3"], "--bandwidth gives 3 widths, one per feature, but there are 2")


@pytest.mark.parametrize(
    "command, option, message",
    [
        (["fit"], *_VAR_TYPE),
        (["fit"], *_WIDTHS),
        (["cv"], *_VAR_TYPE),
        (["cv"], *_WIDTHS),
        (["plot", "loo"], *_VAR_TYPE),  # plot loo has no --bandwidth
    ],
)
def test_an_option_of_one_value_per_feature_is_checked_against_the_features(
    tmp_path, nbattn_cli, command, option, message
):
    """It was 'var_type has 1 letter but X has 2 columns' (the Python parameter and an X
    the command never shows), or 'bandwidth has 3 entries', after the file was read."""
    _table().to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / ("f.png" if command[0] == "plot" else "m.npz")
    extra = ["-o", out] if command[0] != "cv" else []
    code, _, err = nbattn_cli(*command, tmp_path / "t.csv", "--target", "y", *option, *extra)
    assert code == 1 and f"{message} features: x1, x2" in err, err
    assert not out.exists()


# ----------------------------------------------------------------------------- cells


@pytest.mark.parametrize(
    "cell, what",
    [
        ("", "is missing (an empty cell, NA or nan)"),
        ("NA", "is missing (an empty cell, NA or nan)"),
        ("1e400", "is infinite (inf, or a number beyond ±1.8e308 such as 1e400)"),
        ("-inf", "is infinite (-inf, or a number beyond ±1.8e308 such as -1e400)"),
    ],
)
def test_a_cell_that_is_not_finite_says_which_it_is(tmp_path, fit_csv, cell, what):
    """1e400 was reported as 'missing or not finite (inf)', a value the file does not hold."""
    text = "x1,x2,y\n" + "".join(f"{i},{i % 3},{i}\n" for i in range(6))
    (tmp_path / "t.csv").write_text(text + f"7,{cell},1\n")
    code, _, err = fit_csv(tmp_path / "t.csv", "-o", tmp_path / "m.npz")
    assert code == 1 and f"data row 7 (line 8 of the file): column 'x2' {what}" in err, err
