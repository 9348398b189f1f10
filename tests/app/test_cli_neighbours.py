"""Nearest-neighbour widths on the command line: ``nbattn fit --bandwidth-type``, its
model file through ``nbattn predict``, against the estimator fitted in Python on the
same table (bit for bit), and the refusals, each naming the option."""

import numpy as np
import pandas as pd
import pytest

import nbattn


def _table(n, seed):
    """x1, x2 continuous and y smooth in x1; every number a multiple of 1/64 (the CSV reads
    back the same bits)."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.uniform(0, 3, (n, 2)) * 64) / 64
    y = np.round((np.sin(2 * x[:, 0]) + 0.2 * rng.normal(size=n)) * 64) / 64
    return pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": y})


@pytest.mark.parametrize("bandwidth_type", ["generalized_nn", "adaptive_nn"])
def test_fit_and_predict_equal_the_estimator(nbattn_cli, tmp_path, bandwidth_type):
    """``fit --model lp --bandwidth loo --bandwidth-type T`` prints the counts with "(k)",
    saves a model whose ``predict`` gives the estimator's bits at new rows."""
    train, test = _table(40, 0), _table(10, 1)
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    model_path, out_path = tmp_path / "m.npz", tmp_path / "p.csv"
    code, out, err = nbattn_cli(
        "fit", tmp_path / "train.csv", "--target", "y", "--model", "lp", "--bandwidth", "loo",
        "--bandwidth-type", bandwidth_type, "-o", model_path,
    )  # fmt: skip
    assert code == 0, err
    model = nbattn.LocalPolynomialRegressor(bandwidth="loo", bandwidth_type=bandwidth_type)
    model.fit(train[["x1", "x2"]], train["y"].to_numpy())
    k1, k2 = (int(k) for k in model.bandwidth_)
    assert f"x1={k1} (k), x2={k2} (k)" in out
    code, _, err = nbattn_cli("predict", model_path, tmp_path / "test.csv", "-o", out_path)
    assert code == 0, err
    expected = model.predict(test[["x1", "x2"]])
    np.testing.assert_array_equal(pd.read_csv(out_path)["prediction"].to_numpy(), expected)


def test_refusals_name_the_option(nbattn_cli, tmp_path):
    """A fixed-width rule with a nearest-neighbour type, and the option on a model that
    does not take it, are errors that say what to change."""
    _table(20, 2).to_csv(tmp_path / "t.csv", index=False)
    args = ("fit", tmp_path / "t.csv", "--target", "y", "-o", tmp_path / "m.npz", "-q")
    code, _, err = nbattn_cli(*args, "--bandwidth", "scott", "--bandwidth-type", "adaptive_nn")
    assert code != 0 and "chooses fixed widths" in err
    code, _, err = nbattn_cli(*args, "--model", "learned", "--bandwidth-type", "adaptive_nn")
    assert code != 0 and "--bandwidth-type does not apply to --model learned" in err
