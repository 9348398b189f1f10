"""Hostile cases of ``nbattn fit --model plr`` and the commands on its model file:
``--linear-columns`` given more than once, and an error of the model on one row of a
file (x . beta beyond float64's range) named at that row of the file, whatever the
chunk size and the rows dropped before it."""

import numpy as np
import pandas as pd
import pytest

import nbattn


def _table(n, seed):
    """z (continuous), a and "b, c" (linear), y = 2 a - b + sin z + noise."""
    rng = np.random.default_rng(seed)
    z, a, b = rng.uniform(0, 3, n), rng.normal(size=n), rng.normal(size=n)
    y = 2 * a - b + np.sin(z) + 0.1 * rng.normal(size=n)
    return pd.DataFrame({"z": z, "a": a, "b, c": b, "y": y})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plr_review")
    _table(30, 0).to_csv(folder / "train.csv", index=False)
    return folder


def _fit(nbattn_cli, folder, *linear, name="m.npz"):
    options = [x for columns in linear for x in ("--linear-columns", columns)]
    base = ["fit", folder / "train.csv", "--target", "y", "--model", "plr", "-q"]
    return nbattn_cli(*base, "--bandwidth", "0.5", *options, "-o", folder / name)


def test_linear_columns_given_twice_add_up(nbattn_cli, folder):
    """``--linear-columns a --linear-columns '"b, c"'`` is ``--linear-columns a,"b, c"``
    (the estimator fitted in Python on both), not the last one alone; a column named in
    two of them is refused by name."""
    code, _, err = _fit(nbattn_cli, folder, "a", '"b, c"', name="two.npz")
    assert code == 0, err
    frame = pd.read_csv(folder / "train.csv")
    expected = nbattn.PartiallyLinearRegressor(linear_columns=["a", "b, c"], bandwidth=0.5)
    expected.fit(frame.drop(columns="y"), frame["y"].to_numpy())
    saved = nbattn.load(folder / "two.npz")
    assert saved.linear_columns_.tolist() == [1, 2]
    assert saved.coef_.tobytes() == expected.coef_.tobytes()
    code, _, err = _fit(nbattn_cli, folder, "a", "z,a", name="x.npz")
    assert code == 1 and "--linear-columns names the column 'a' twice" in err
    assert not (folder / "x.npz").exists()


def test_row_errors_name_the_file_row(nbattn_cli, folder):
    """A row whose x . beta leaves float64's range (a = 1e308) stops predict and evaluate
    with an error naming its data row in the file (1-based, its CSV line), over random
    positions, chunk sizes and a row with a missing value dropped before or after it; no
    output file is left."""
    code, _, err = _fit(nbattn_cli, folder, 'a,"b, c"')
    assert code == 0, err
    rng = np.random.default_rng(1)
    for draw in range(4):
        frame = _table(20, 10 + draw)
        bad, gap = rng.choice(20, 2, replace=False)
        frame.loc[bad, "a"] = 1e308
        frame.loc[gap, "z"] = np.nan
        frame.to_csv(folder / "test.csv", index=False)
        chunk = str(rng.integers(3, 25))
        expected = f"test.csv: data row {bad + 1} (line {bad + 2} of the file): "
        out = folder / "p.csv"
        for command in (
            ["predict", folder / "m.npz", folder / "test.csv", "-o", out],
            ["evaluate", folder / "m.npz", folder / "test.csv"],
        ):
            code, _, err = nbattn_cli(*command, "--chunksize", chunk, "--on-nan", "drop", "-q")
            assert code == 1
            assert expected in err and "beyond float64's range" in err, (draw, err)
            assert " at row " not in err
            assert not out.exists()
