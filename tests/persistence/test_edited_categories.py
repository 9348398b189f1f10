"""Edited model files: what the fit could not have written is refused by both readers
(nbattn.load and the command line's predictor), naming the field."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.persistence import modelfile
from nbattn.persistence.predictor import read_predictor

from .edited_files import rewrite, split


def _both_refuse(path, pattern):
    with pytest.raises(modelfile.ModelFileError, match=pattern):
        nbattn.load(path)
    with pytest.raises(modelfile.ModelFileError, match=pattern):
        read_predictor(path)


def _saved(tmp_path, n_levels=4, model=None, kind="u"):
    rng = np.random.default_rng(n_levels)
    n = 40
    X = pd.DataFrame(
        {
            "x": rng.uniform(0, 1, n),
            "town": [f"t{i}" for i in rng.integers(0, n_levels, n)],
            "size": rng.integers(0, 3, n),
        }
    )
    y = rng.normal(0, 1, n)
    model = model or nbattn.NadarayaWatsonRegressor(var_type=f"c{kind}o")
    model.fit(X, y if not hasattr(model, "predict_proba") else (y > 0).astype(int))
    path = tmp_path / "m.npz"
    nbattn.save(model, path)
    return path, X


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c[:-1] + [c[0]],  # a label twice
        lambda c: [c[0]] + c,
        lambda c: [float("nan")] + c[1:],  # NaN
        lambda c: [1] + c[1:],  # text beside a number
        lambda c: [True] + c[1:],
    ],
)
def test_edited_categories_are_refused(tmp_path, edit):
    path, _ = _saved(tmp_path)
    meta, arrays = split(path)
    cats = meta["attributes"]["categories_"]["value"]
    cats[1] = edit(cats[1])
    rewrite(path, meta, arrays)
    _both_refuse(path, r"categories_\[1\]")


@pytest.mark.parametrize(
    "cats, valid",
    [
        ([1, 1.0, 5], False),  # one number twice
        ([0, 0.0, 2], False),
        ([2, 7, 2.0], False),
        ([0, False, 2], True),  # a bool and a number are two categories, as at fit
        ([True, 1.0, 2], True),
    ],
)
def test_a_number_twice_is_refused_a_bool_beside_it_is_not(tmp_path, cats, valid):
    path, X = _saved(tmp_path)
    meta, arrays = split(path)
    meta["attributes"]["categories_"]["value"][2] = cats
    rewrite(path, meta, arrays)
    if valid:
        nbattn.load(path)
        read_predictor(path)
    else:
        _both_refuse(path, r"categories_\[2\]")


@settings(max_examples=25)
@given(st.integers(2, 9), st.sampled_from("uo"), st.floats(1e-9, 0.5))
def test_a_lambda_beyond_its_kernels_bound_is_refused(tmp_path_factory, c, kind, excess):
    tmp_path = tmp_path_factory.mktemp("lam")
    path, X = _saved(tmp_path, n_levels=c, kind=kind)
    meta, arrays = split(path)
    c = len(meta["attributes"]["categories_"]["value"][1])  # the levels the rows hold
    bound = (c - 1) / c if kind == "u" else 1.0
    # the unordered bound (the uniform kernel) is allowed and predicts; the ordered one,
    # where the Wang-van Ryzin kernel is 0 for every pair, is not
    inside = arrays["attr__bandwidth_"].copy()
    inside[1] = bound if kind == "u" else np.nextafter(1.0, 0.0)
    rewrite(path, meta, {**arrays, "attr__bandwidth_": inside})
    nbattn.load(path).predict(X)
    read_predictor(path)[0].predict(X)
    beyond = (bound + excess, bound * (1 + excess) + 1e-12, -excess)
    for bad in beyond if kind == "u" else (1.0, *beyond):
        h = arrays["attr__bandwidth_"].copy()
        h[1] = bad
        rewrite(path, meta, {**arrays, "attr__bandwidth_": h})
        _both_refuse(path, r"bandwidth_\[1\]")


@pytest.mark.parametrize("degree", [True, False, 1.0, "1", 1.5])
def test_a_degree_that_is_no_int_is_refused(tmp_path, degree):
    path, _ = _saved(tmp_path, model=nbattn.LocalPolynomialRegressor(var_type="cuo"))
    meta, arrays = split(path)
    meta["params"]["degree"] = degree
    rewrite(path, meta, arrays)
    _both_refuse(path, "'degree'")


@pytest.mark.parametrize("version", [2.0, 3.0, True, "3", [3], None, 5])
def test_a_format_version_this_reader_does_not_know_is_refused(tmp_path, version):
    path, _ = _saved(tmp_path)
    meta, arrays = split(path)
    meta["format_version"] = version
    rewrite(path, meta, arrays)
    _both_refuse(path, "format version")


@pytest.mark.parametrize("tail", [b"\0", b"x" * 100, b"PK\x03\x04" + b"\0" * 40])
def test_bytes_after_the_archive_are_refused(tmp_path, tail):
    path, _ = _saved(tmp_path)
    nbattn.load(path)
    with open(path, "ab") as fh:
        fh.write(tail)
    _both_refuse(path, "after the end of the archive")


@pytest.mark.parametrize("prefix", ["another model file", b"PK\x03\x04 anything", b"\0"])
def test_bytes_before_the_archive_are_refused(tmp_path, prefix):
    path, _ = _saved(tmp_path)
    if prefix == "another model file":
        (tmp_path / "other").mkdir()
        other, _ = _saved(tmp_path / "other", model=nbattn.NadarayaWatsonRegressor(bandwidth=0.7))
        prefix = other.read_bytes()
    data = path.read_bytes()
    path.write_bytes(prefix + data)
    # a prefix that is no archive's start fails the first check already
    _both_refuse(path, r"bytes before the archive|not an \.npz archive")
