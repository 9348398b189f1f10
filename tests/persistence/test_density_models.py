"""Model files of the density estimators: KernelDensity, ConditionalKernelDensity and
KernelQuantileRegressor saved, loaded and predicted from without scikit-learn.

A loaded model computes bit for bit what the fitted one computes, the Predictor
(``nbattn predict``'s reader) too, and an edited file is refused as the regressors'
files are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn.estimators import (
    ConditionalKernelDensity,
    KernelDensity,
    KernelQuantileRegressor,
    fitted_state,
    spec,
)
from nbattn.persistence.modelfile import FORMAT_VERSION, ModelFileError
from nbattn.persistence.predictor import read_predictor

from .edited_files import rewrite, split

ROOT = Path(__file__).resolve().parents[2]


def _table(rng, n=50):
    """A continuous, an unordered (text) and an ordered column, a continuous response."""
    x = rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], n)
    size = pd.Categorical(rng.choice(["S", "M", "L"], n), categories=["S", "M", "L"], ordered=True)
    X = pd.DataFrame({"x": x, "colour": colour, "size": size})
    y = 1.5 * x + (colour == "red") + rng.normal(0, 0.5, n)
    return X, y


#: name -> (estimator, response: "none", "number" or "text")
MODELS = {
    "kde": (lambda: KernelDensity(), "none"),
    "kde-widths": (lambda: KernelDensity(bandwidth=[0.6, 0.3, 0.2]), "none"),
    "kde-epanechnikov": (lambda: KernelDensity(kernel="epanechnikov"), "none"),
    "cdens": (lambda: ConditionalKernelDensity(), "number"),
    "cdens-text-y": (lambda: ConditionalKernelDensity(y_bandwidth=0.2), "text"),
    "quantile": (
        lambda: KernelQuantileRegressor(quantile=0.8, bandwidth="normal_reference"),
        "number",
    ),
    "quantile-widths": (
        lambda: KernelQuantileRegressor(bandwidth=[0.5, 0.3, 0.2], y_bandwidth=0.4),
        "number",
    ),
}


def _response(rng, y, kind):
    if kind == "none":
        return None
    if kind == "text":
        return np.where(y > np.median(y), "high", np.where(y < -1, "low", "mid")).astype(object)
    return y


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """name -> (fitted model, its file, query table, query response)."""
    folder = tmp_path_factory.mktemp("density_models")
    rng = np.random.default_rng(11)
    X, y = _table(rng)
    Xq, yq = _table(rng, n=20)
    weights = rng.uniform(0.3, 3.0, len(y))
    out = {}
    for name, (make, kind) in MODELS.items():
        model = make().fit(X, _response(rng, y, kind), sample_weight=weights)
        path = folder / f"{name}.npz"
        nbattn.save(model, path)
        out[name] = (model, path, Xq, _response(rng, yq, kind))
    return out


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_loaded_model_computes_what_the_fitted_one_does(fitted, name):
    model, path, Xq, yq = fitted[name]
    loaded = nbattn.load(path)
    assert type(loaded) is type(model)
    assert loaded.get_params() == model.get_params()
    if isinstance(model, KernelDensity):
        for method in ("pdf", "cdf", "score_samples"):
            _same(getattr(loaded, method)(Xq), getattr(model, method)(Xq))
        assert loaded.score(Xq) == model.score(Xq)
        pd.testing.assert_frame_equal(
            loaded.sample(30, random_state=0), model.sample(30, random_state=0)
        )
        return
    if isinstance(model, ConditionalKernelDensity):
        for method in ("pdf", "cdf", "score_samples"):
            _same(getattr(loaded, method)(Xq, yq), getattr(model, method)(Xq, yq))
        assert loaded.score(Xq, yq) == model.score(Xq, yq)
        _same(loaded.sample(Xq, random_state=0), model.sample(Xq, random_state=0))
        assert loaded.y_categories_ == model.y_categories_
        if model.y_type_ == "c":
            _same(loaded.predict_quantile(Xq, [0.1, 0.9]), model.predict_quantile(Xq, [0.1, 0.9]))
        return
    _same(loaded.predict(Xq), model.predict(Xq))
    _same(loaded.predict_quantile(Xq, [0.1, 0.5, 0.9]), model.predict_quantile(Xq, [0.1, 0.5, 0.9]))
    _same(loaded.predict_interval(Xq, 0.2), model.predict_interval(Xq, 0.2))
    assert loaded.score(Xq, yq) == model.score(Xq, yq)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_predictor_computes_what_the_estimator_does(fitted, name):
    model, path, Xq, yq = fitted[name]
    predictor, meta = read_predictor(path)
    assert meta["format_version"] == FORMAT_VERSION
    assert predictor.is_density and not predictor.is_classifier
    if isinstance(model, KernelDensity):
        _same(predictor.score_samples(Xq), model.score_samples(Xq))
        _same(predictor.cdf(Xq), model.cdf(Xq))
        with pytest.raises(AttributeError, match="no predict"):
            predictor.predict(Xq)
        return
    if isinstance(model, ConditionalKernelDensity):
        _same(predictor.score_samples(Xq, yq), model.score_samples(Xq, yq))
        _same(predictor.cdf(Xq, yq), model.cdf(Xq, yq))
        with pytest.raises(ValueError, match="needs y"):
            predictor.score_samples(Xq)
        if model.y_type_ != "c":
            for reader in (predictor, model):
                with pytest.raises(ValueError, match="continuous y"):
                    reader.predict_quantile(Xq, 0.5)
        return
    _same(predictor.predict(Xq), model.predict(Xq))
    levels = [0.1, 0.5, 0.9]
    _same(predictor.predict_quantile(Xq, levels), model.predict_quantile(Xq, levels))
    _same(predictor.predict_quantile(Xq, 0.3), model.predict_quantile(Xq, 0.3))
    _same(predictor.predict_interval(Xq, 0.2), model.predict_interval(Xq, 0.2))
    for method in ("marginal_effects", "predict_proba", "score_samples"):
        with pytest.raises(AttributeError, match=method):
            getattr(predictor, method)(Xq)


def test_the_registry_holds_the_densities():
    """One registry: the model files' whitelist, the Predictor's tables and the densities'
    specs agree."""
    assert set(spec.DENSITY_SPECS) <= set(spec.SPECS)
    assert set(spec.SPECS) == set(spec.POOLING_SPECS) | set(spec.DENSITY_SPECS)
    assert set(fitted_state.DENSITIES) == set(spec.DENSITY_SPECS)
    assert set(fitted_state.ESTIMATORS) == set(spec.SPECS)


def _edit(tmp_path, path, change):
    meta, arrays = split(path)
    change(meta, arrays)
    edited = tmp_path / "edited.npz"
    rewrite(edited, meta, arrays)
    return edited


def _set_json(name, value):
    def change(meta, arrays):
        meta["attributes"][name]["value"] = value

    return change


def _set_array(name, edit):
    def change(meta, arrays):
        arrays["attr__" + name] = edit(arrays["attr__" + name].copy())

    return change


def _drop(name):
    def change(meta, arrays):
        info = meta["attributes"].pop(name)
        if info["kind"] == "array":
            arrays.pop("attr__" + name)

    return change


def _add_json(name, value):
    def change(meta, arrays):
        meta["attributes"][name] = {"kind": "json", "value": value}

    return change


def _set_param(name, value):
    def change(meta, arrays):
        meta["params"][name] = value

    return change


def _negate_first(a):
    a[0] = -a[0]
    return a


def _code_out_of_range(a):
    a[0] = 7.0
    return a


def _lambda_too_large(a):
    a[1] = 0.99
    return a


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("kde", _set_array("bandwidth_", _negate_first), "bandwidth_"),
        ("kde", _set_array("bandwidth_", _lambda_too_large), "bandwidth_"),
        ("kde", _drop("bandwidth_"), "'bandwidth_' is missing"),
        ("kde", _add_json("y_type_", "c"), "'y_type_' is not a fitted attribute"),
        ("kde", _set_param("bandwidth", "cv_mle"), "'bandwidth' parameter"),
        ("kde-widths", _set_param("bandwidth", [0.6, 0.3, 0.3]), "numeric bandwidth"),
        ("cdens", _set_json("y_bandwidth_", -1.0), r"y_bandwidth_"),
        ("cdens", _set_json("y_type_", "x"), "y_type_"),
        ("cdens", _set_json("y_categories_", ["a", "b"]), "y_categories_ must be None"),
        ("cdens", _drop("y_fit_"), "'y_fit_' is missing"),
        ("cdens-text-y", _set_array("y_fit_", _code_out_of_range), "outside y_categories_"),
        ("cdens-text-y", _set_json("y_categories_", ["a", "a", "b"]), "y_categories_"),
        ("cdens-text-y", _set_json("y_bandwidth_", 0.9), "y_bandwidth_"),
        ("cdens-text-y", _set_param("y_bandwidth", 0.3), "y_bandwidth parameter"),
        ("quantile", _set_param("quantile", 1.5), "'quantile' parameter"),
        ("quantile", _set_array("y_fit_", lambda a: a[:-1]), "y_fit_"),
        ("quantile", _add_json("classes_", [0, 1]), "'classes_' is not a fitted attribute"),
    ],
)
def test_edited_files_are_refused_by_both_readers(fitted, tmp_path, name, change, message):
    edited = _edit(tmp_path, fitted[name][1], change)
    with pytest.raises(ModelFileError, match=message):
        nbattn.load(edited)
    with pytest.raises(ModelFileError, match=message):
        read_predictor(edited)


def test_the_predictor_never_imports_scikit_learn(fitted):
    """The density models' light path loads no scikit-learn (nor SciPy's statistics)."""
    code = f"""
import sys, numpy as np, pandas as pd
from nbattn.persistence.predictor import read_predictor
X = pd.DataFrame({{"x": [0.1, -0.4], "colour": ["red", "blue"],
                   "size": pd.Categorical(["S", "L"], categories=["S", "M", "L"], ordered=True)}})
kde = read_predictor({str(fitted["kde"][1])!r})[0]
quantile = read_predictor({str(fitted["quantile"][1])!r})[0]
cdens = read_predictor({str(fitted["cdens"][1])!r})[0]
assert np.all(np.isfinite(kde.score_samples(X)))
assert np.all(np.isfinite(quantile.predict_quantile(X, [0.1, 0.9])))
assert np.all(np.isfinite(cdens.score_samples(X, np.array([0.0, 1.0]))))
bad = sorted(m for m in sys.modules if m.split(".")[0] == "sklearn" or m == "scipy.stats")
assert not bad, bad
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
