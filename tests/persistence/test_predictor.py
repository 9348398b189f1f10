"""``nbattn predict`` without scikit-learn: nbattn.persistence.predictor and fitted_state.

The light path must predict bit for bit what the loaded estimator predicts,
on every model kind the command line fits, refuse every model file that
``nbattn.load`` refuses, and never import scikit-learn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import is_classifier

import nbattn
from nbattn import estimators
from nbattn.app import batch, cli, io
from nbattn.estimators import fitted_state, spec
from nbattn.persistence import modelfile
from nbattn.persistence.predictor import read_predictor

from .edited_files import rewrite, split

ROOT = Path(__file__).resolve().parents[2]


def _table(rng, n=60, missing=False):
    x1 = rng.uniform(0, 6, n)
    x2 = rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], n)
    y = 2 * np.sin(x1) + 0.3 * x2 + (colour == "red") + rng.normal(0, 0.3, n)
    label = np.where(y > np.median(y), "high", "low")
    label[rng.random(n) < 0.15] = "mid"
    frame = pd.DataFrame({"x1": x1, "x2": x2, "colour": colour, "y": y, "label": label})
    if missing:
        frame.loc[rng.choice(n, 6, replace=False), "x1"] = np.nan
        frame.loc[rng.choice(n, 6, replace=False), "colour"] = None
    return frame


#: name -> (fit arguments after DATA, whether the table has missing values)
KINDS = {
    "nw": (["--target", "y", "--features", "x1,x2"], False),
    "nw-loo": (["--target", "y", "--features", "x1,x2", "--bandwidth", "loo"], False),
    "nw-widths": (["--target", "y", "--features", "x1,x2", "--bandwidth", "0.5,0.7"], False),
    "nw-average": (["--target", "y", "--features", "x1,x2", "--kernel", "average"], False),
    "nw-epanechnikov": (
        ["--target", "y", "--features", "x1,x2", "--kernel", "epanechnikov"],
        False,
    ),
    "lp-0": (["--target", "y", "--features", "x1,x2", "--model", "lp", "--degree", "0"], False),
    "lp-1": (
        ["--target", "y", "--features", "x1,x2", "--model", "lp", "--bandwidth", "scott"],
        False,
    ),
    "lp-2-tricube": (
        ["--target", "y", "--features", "x1", "--model", "lp", "--degree", "2"]
        + ["--bandwidth", "1.5", "--kernel", "tricube"],
        False,
    ),
    "classifier": (["--target", "label", "--features", "x1,x2", "--model", "classifier"], False),
    "learned-scalar": (
        ["--target", "y", "--features", "x1,x2", "--model", "learned", "--metric", "scalar"]
        + ["--max-iter", "5"],
        False,
    ),
    "learned-diagonal": (
        ["--target", "y", "--features", "x1,x2", "--model", "learned", "--max-iter", "5"],
        False,
    ),
    "learned-full": (
        ["--target", "y", "--features", "x1,x2", "--model", "learned", "--metric", "full"]
        + ["--max-iter", "5"],
        False,
    ),
    "mixed-nw": (["--target", "y", "--features", "x1,colour,x2"], False),
    "mixed-lp": (
        ["--target", "y", "--features", "x1,colour", "--model", "lp", "--bandwidth", "scott"],
        False,
    ),
    "mixed-classifier": (
        ["--target", "label", "--features", "colour,x1", "--model", "classifier"],
        False,
    ),
    "mixed-learned": (
        ["--target", "y", "--features", "x1,colour", "--model", "learned", "--max-iter", "3"],
        False,
    ),
    "ordered": (["--target", "y", "--features", "x1,colour", "--var-type", "co"], False),
    "marginalize-nw": (
        ["--target", "y", "--features", "x1,colour,x2", "--on-nan", "marginalize"],
        True,
    ),
    "marginalize-lp": (
        ["--target", "y", "--features", "x1,x2", "--model", "lp", "--bandwidth", "scott"]
        + ["--on-nan", "marginalize"],
        True,
    ),
}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predictor")
    rng = np.random.default_rng(7)
    for name, missing in (("complete", False), ("missing", True)):
        _table(rng, missing=missing).to_csv(folder / f"{name}.csv", index=False)
        # queries: new rows, including a category unseen at fit for handle_unknown checks
        _table(rng, n=25, missing=missing).to_csv(folder / f"{name}_q.csv", index=False)
    return folder


def _fitted(folder, kind):
    args, missing = KINDS[kind]
    data = folder / ("missing.csv" if missing else "complete.csv")
    path = folder / f"{kind}.npz"
    if not path.exists():
        assert cli.main(["fit", str(data), *args, "-q", "-o", str(path)]) == 0
    on_nan = "marginalize" if missing else "error"
    return path, folder / ("missing_q.csv" if missing else "complete_q.csv"), on_nan


def _queries(model_path, data, on_nan):
    """The chunk ``nbattn predict`` hands to the model (nbattn.app.batch reads it)."""
    model, features, _ = batch.read_model(model_path)
    kinds = batch.model_kinds(model, features)
    cats = batch.model_categories(model, features)
    return batch.first_rows(data, features, 1000, on_nan=on_nan, kinds=kinds, categories=cats)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_predictions_are_the_estimators_bit_for_bit(tables, kind):
    path, data, on_nan = _fitted(tables, kind)
    X = _queries(path, data, on_nan)
    estimator = nbattn.load(path)
    predictor, meta = read_predictor(path)
    assert predictor.estimator == type(estimator).__name__
    assert predictor.var_type_ == estimator.var_type_
    if predictor.is_classifier:
        assert np.array_equal(predictor.predict_proba(X), estimator.predict_proba(X))
        assert np.array_equal(predictor.predict(X), estimator.predict(X))
        assert np.array_equal(predictor.classes_, estimator.classes_)
        return
    got, want = predictor.predict(X), estimator.predict(X)
    assert got.dtype == want.dtype == np.float64 and np.array_equal(got, want)
    got_f, got_s = predictor.predict(X, return_std=True)
    want_f, want_s = estimator.predict(X, return_std=True)
    assert np.array_equal(got_f, want_f) and np.array_equal(got_s, want_s)
    _same_slopes_and_intervals(predictor, estimator, X)


def _same_slopes_and_intervals(predictor, estimator, X):
    """The Predictor's marginal effects and intervals are the estimator's, bit for bit,
    and so are its refusals (average pooling has no interval)."""
    if "c" in estimator.var_type_:
        got, want = predictor.marginal_effects(X), estimator.marginal_effects(X)
        assert got.dtype == want.dtype == np.float64 and np.array_equal(got, want)
        assert got.shape[-1] == estimator.var_type_.count("c")
    if getattr(estimator, "kernel", None) == "average":
        for model in (predictor, estimator):
            with pytest.raises(ValueError, match="kernel='average' has none"):
                model.predict_interval(X)
        return
    for alpha, kind in ((0.05, "mean"), (0.2, "observation")):
        got = predictor.predict_interval(X, alpha=alpha, kind=kind)
        want = estimator.predict_interval(X, alpha=alpha, kind=kind)
        assert got.dtype == want.dtype == np.float64 and np.array_equal(got, want), kind
        assert np.all(got[..., 0] <= got[..., 1])


def test_average_pooling_has_zero_slopes(tables):
    """Average pooling predicts one constant wherever x is: its marginal effects are 0
    (they were the covariance of y and x over the training set)."""
    path, data, on_nan = _fitted(tables, "nw-average")
    X = _queries(path, data, on_nan)
    estimator = nbattn.load(path)
    slopes = estimator.marginal_effects(X)
    assert slopes.shape == (len(X), 2) and np.array_equal(slopes, np.zeros_like(slopes))
    moved = X.assign(x1=X["x1"] + 0.5)
    assert np.array_equal(estimator.predict(moved), estimator.predict(X))


def test_a_classifier_has_no_slopes_or_intervals(tables):
    path, data, on_nan = _fitted(tables, "classifier")
    predictor, _ = read_predictor(path)
    X = _queries(path, data, on_nan)
    for method in ("marginal_effects", "predict_interval"):
        assert not hasattr(nbattn.load(path), method)
        with pytest.raises(AttributeError, match=method):
            getattr(predictor, method)(X)


def _weighted(rng, cls, X, y, **params):
    sw = rng.uniform(0.2, 3.0, len(y))
    return cls(**params).fit(X, y, sample_weight=sw)


@pytest.mark.parametrize(
    "make",
    [
        lambda X, y, c, rng: _weighted(rng, estimators.NadarayaWatsonRegressor, X, y),
        lambda X, y, c, rng: _weighted(
            rng, estimators.NadarayaWatsonRegressor, X, y, kernel="average"
        ),
        lambda X, y, c, rng: _weighted(rng, estimators.NadarayaWatsonClassifier, X, c),
        lambda X, y, c, rng: _weighted(
            rng, estimators.LocalPolynomialRegressor, X, y, bandwidth="scott"
        ),
        lambda X, y, c, rng: estimators.NadarayaWatsonRegressor(dtype="float32").fit(X, y),
        lambda X, y, c, rng: estimators.NadarayaWatsonRegressor(
            handle_unknown="ignore", var_type="cuc"
        ).fit(X, y),
        lambda X, y, c, rng: estimators.NadarayaWatsonRegressor().fit(
            X[["x1", "x2"]], np.column_stack([y, -y])
        ),
    ],
    ids=["nw", "average", "classifier", "lp", "float32", "unknown-ignored", "two-outputs"],
)
def test_python_only_options_too(tmp_path, make):
    """Sample weights, float32, unseen categories ignored, 2-D targets (not reachable from
    the command line) give the estimator's predictions as well."""
    rng = np.random.default_rng(3)
    frame = _table(rng)
    X, y, c = frame[["x1", "colour", "x2"]], frame["y"].to_numpy(), frame["label"].to_numpy()
    model = make(X, y, c, rng)
    path = io.save(model, tmp_path / "m.npz")
    queries = _table(rng, n=20)
    queries.loc[3, "colour"] = "purple"  # unseen: ignored where the model says so
    names = list(model.feature_names_in_)
    Q = queries[names]
    estimator, (predictor, _) = nbattn.load(path), read_predictor(path)
    if getattr(model, "handle_unknown", "error") != "ignore":
        Q = Q.drop(index=3).reset_index(drop=True)
    if predictor.is_classifier:
        assert np.array_equal(predictor.predict_proba(Q), estimator.predict_proba(Q))
        assert np.array_equal(predictor.predict(Q), estimator.predict(Q))
        return
    assert np.array_equal(predictor.predict(Q), estimator.predict(Q))
    for got, want in zip(predictor.predict(Q, return_std=True), estimator.predict(Q, True)):
        assert np.array_equal(got, want)
    _same_slopes_and_intervals(predictor, estimator, Q)


def test_queries_are_checked_like_the_estimators(tables):
    path, data, on_nan = _fitted(tables, "mixed-nw")
    predictor, _ = read_predictor(path)
    X = _queries(path, data, on_nan)
    with pytest.raises(ValueError, match="columns"):
        predictor.predict(X[["x2", "colour", "x1"]])
    bad = X.copy()
    bad.loc[2, "colour"] = "purple"
    with pytest.raises(ValueError, match="purple"):
        predictor.predict(bad)
    bad = X.copy()
    bad.loc[1, "x1"] = np.inf
    with pytest.raises(ValueError, match="row 1"):
        predictor.predict(bad)
    with pytest.raises(ValueError, match="return_std is for regressors"):
        read_predictor(_fitted(tables, "classifier")[0])[0].predict(X, return_std=True)


# ----------------------------------------------------------------------------- edited files


def _set_param(name, value):
    def edit(meta, arrays):
        meta["params"][name] = value

    return edit


def _set_array(name, value):
    def edit(meta, arrays):
        arrays["attr__" + name] = value
        meta["attributes"][name] = {
            "kind": "array",
            "dtype": value.dtype.str,
            "shape": list(value.shape),
            "object": False,
            "scalar": False,
        }

    return edit


def _set_json(name, value):
    def edit(meta, arrays):
        meta["attributes"][name] = {"kind": "json", "value": value}

    return edit


def _drop(name):
    def edit(meta, arrays):
        meta["attributes"].pop(name)
        arrays.pop("attr__" + name, None)

    return edit


def _rename(estimator):
    def edit(meta, arrays):
        meta["estimator"] = estimator

    return edit


EDITS = {
    "kernel evil": ("mixed-nw", _set_param("kernel", "evil")),
    "alpha is no parameter": ("nw", _set_param("alpha", 1.0)),
    "device": ("nw", _set_param("device", "tpu")),
    "degree 3": ("lp-1", _set_param("degree", 3)),
    "degree text": ("lp-1", _set_param("degree", "1")),
    "verbose -1": ("nw", _set_param("verbose", -1)),
    "n_components 0": ("learned-full", _set_param("n_components", 0)),
    "bandwidth number differs": ("nw-widths", _set_param("bandwidth", [0.5, 0.8])),
    "bandwidth_ shape": ("nw", _set_array("bandwidth_", np.ones(5))),
    "bandwidth_ negative": ("nw", _set_array("bandwidth_", -np.ones(2))),
    "bandwidth_ NaN": ("nw", _set_array("bandwidth_", np.array([np.nan, 1.0]))),
    "lambda above 1": ("mixed-nw", _set_array("bandwidth_", np.array([1.0, 1.5, 1.0]))),
    "X_fit_ inf": ("nw", _set_array("X_fit_", np.full((60, 2), np.inf))),
    "y_fit_ rows": ("nw", _set_array("y_fit_", np.ones((3, 1)))),
    "X_fit_ float32": ("nw", _set_array("X_fit_", np.ones((60, 2), np.float32))),
    "codes outside": ("mixed-nw", _set_array("X_fit_", np.full((60, 3), 7.0))),
    "var_type_ letters": ("mixed-nw", _set_json("var_type_", "cxc")),
    "categories_ short": ("mixed-nw", _set_json("categories_", [None, ["a"]])),
    "sample weights": ("nw", _set_array("sample_weight_", -np.ones(60))),
    "n_outputs_": ("nw", _set_json("n_outputs_", 2)),
    "outputs_2d_": ("nw", _set_json("outputs_2d_", "no")),
    "n_features_in_": ("nw", _set_json("n_features_in_", 0)),
    "classes_ one": ("classifier", _set_array("classes_", np.array(["a", "a", "b"]))),
    "y_fit_ not one-hot": ("classifier", _set_array("y_fit_", np.full((60, 3), 0.5))),
    "loss_": ("learned-diagonal", _set_json("loss_", -1.0)),
    "components_ shape": ("learned-full", _set_array("components_", np.ones((3, 3)))),
    "no bandwidth_": ("nw", _drop("bandwidth_")),
    "no n_outputs_": ("nw", _drop("n_outputs_")),
    "no classes_": ("classifier", _drop("classes_")),
    "extra attribute": ("nw", _set_json("secret_", 1)),
    "private attribute": ("nw", _set_json("_cache", 1)),
    "estimator foreign": ("nw", _rename("LinearRegression")),
    "estimator with a dot": ("nw", _rename("os.system")),
}


#: edits of the parameters or the class name, which the two readers word differently
PARAMETER_EDITS = {
    "kernel evil",
    "alpha is no parameter",
    "device",
    "degree 3",
    "degree text",
    "verbose -1",
    "n_components 0",
    "estimator foreign",
    "estimator with a dot",
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edited_files_are_refused_as_load_refuses_them(tables, tmp_path, edit):
    kind, change = EDITS[edit]
    source, _, _ = _fitted(tables, kind)
    meta, arrays = split(source)
    change(meta, arrays)
    path = tmp_path / "edited.npz"
    rewrite(path, meta, arrays)
    with pytest.raises(modelfile.ModelFileError) as by_load:
        nbattn.load(path)
    with pytest.raises(modelfile.ModelFileError) as by_predictor:
        read_predictor(path)
    for error in (by_load.value, by_predictor.value):
        assert str(error).startswith(f"{path}: ")
    if edit in PARAMETER_EDITS:  # scikit-learn words its constraints its own way
        word = edit.split()[0]
        assert word in str(by_load.value) and word in str(by_predictor.value)
    else:  # the fitted attributes: the same checks, the same message
        assert str(by_load.value) == str(by_predictor.value)


def test_version_2_files_predict_too(tables, tmp_path):
    source, data, on_nan = _fitted(tables, "nw")
    meta, arrays = split(source)
    meta["format_version"] = 2
    for name in ("var_type_", "categories_", "sample_weight_"):
        meta["attributes"].pop(name)
    for name in ("missing", "handle_unknown", "var_type", "kernel"):  # newer than version 2
        meta["params"].pop(name)
    path = tmp_path / "v2.npz"
    rewrite(path, meta, arrays)
    X = _queries(source, data, on_nan)
    assert np.array_equal(read_predictor(path)[0].predict(X), nbattn.load(path).predict(X))


# ----------------------------------------------------------------------------- the tables


def test_the_parameter_tables_are_the_estimators():
    classes = {n: getattr(estimators, n) for n in estimators.__all__}
    classes = {n: c for n, c in classes.items() if isinstance(c, type)}
    assert set(fitted_state.ESTIMATORS) == set(classes)
    for name, cls in classes.items():
        assert set(fitted_state.ESTIMATORS[name]) == set(cls().get_params(deep=False)), name
        assert fitted_state.DEFAULTS[name] == cls().get_params(deep=False), name
        assert (name in fitted_state.CLASSIFIERS) == is_classifier(cls())
        for param, rules in fitted_state.ESTIMATORS[name].items():
            for rule in rules.allowed:
                if isinstance(rule, spec.Options):
                    constraints = cls._parameter_constraints[param]
                    (options,) = [c for c in constraints if hasattr(c, "options")]
                    assert set(rule.values) == set(options.options), (name, param)


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["scott", "loo", "silverman", "gaussian", "average", "tricube", "float32", "cpu", "auto"]
        + ["full", "diagonal", "random", "marginalize", "ignore", "cu", "", "evil", "1"]
    ),
    st.lists(st.floats(0.1, 3.0), min_size=1, max_size=3),
)


@settings(max_examples=25)
@given(
    name=st.sampled_from(sorted(fitted_state.ESTIMATORS)),
    param_index=st.integers(0, 20),
    value=_VALUES,
)
def test_parameter_checks_never_accept_what_scikit_learn_refuses(name, param_index, value):
    """Every value the light check accepts, scikit-learn's constraints accept too, and on
    the values a model file can hold (strings, numbers) they agree."""
    cls = getattr(estimators, name)
    params = cls().get_params(deep=False)
    param = sorted(params)[param_index % len(params)]
    params[param] = value
    try:
        cls(**params)._validate_params()
        sklearn_ok = True
    except ValueError:
        sklearn_ok = False
    try:
        fitted_state.check_params(name, params)
        light_ok = True
    except ValueError:
        light_ok = False
    assert not light_ok or sklearn_ok, (param, value)
    if not isinstance(value, (bool, list)):  # sklearn accepts True as 1 and lists as arrays
        assert light_ok == sklearn_ok, (param, value)


# ----------------------------------------------------------------------------- the command


def test_the_command_never_imports_scikit_learn(tables, tmp_path):
    """``nbattn predict`` in a fresh process: the predictions are written and neither
    scikit-learn nor matplotlib nor SciPy's statistics and optimisers were loaded (an
    interval's normal quantile comes from SciPy's statistics, which load its optimisers)."""
    cases = (
        ("mixed-nw", ["--std"]),
        ("classifier", ["--proba"]),
        ("mixed-lp", ["--interval", "0.1", "--marginal-effects"]),
    )
    for kind, extra in cases:
        heavy = ("sklearn", "matplotlib", "dask")
        if "--interval" not in extra:
            heavy += ("scipy.stats", "scipy.optimize")
        path, data, on_nan = _fitted(tables, kind)
        out = tmp_path / f"{kind}.csv"
        args = ["predict", str(path), str(data), "-o", str(out), "-q", "--on-nan", on_nan, *extra]
        code = (
            "import json, sys\n"
            "from nbattn.app.cli import main\n"
            f"rc = main({args!r})\n"
            f"heavy = {heavy!r}\n"
            "loaded = [m for m in sys.modules if m in heavy or m.split('.')[0] in heavy]\n"
            "print(json.dumps([rc, sorted(loaded)]))\n"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr
        rc, loaded = json.loads(result.stdout.strip().splitlines()[-1])
        assert rc == 0 and loaded == [], loaded
        written = pd.read_csv(out)
        X = _queries(path, data, on_nan)
        estimator = nbattn.load(path)
        want = batch.predict_columns(
            estimator,
            X,
            std="--std" in extra,
            proba="--proba" in extra,
            interval=0.1 if "--interval" in extra else None,
            effects=["x1"] if "--marginal-effects" in extra else None,
            name="y",
        )
        assert list(written.columns) == list(want)
        for column, values in want.items():
            if column == "prediction" and is_classifier(estimator):
                assert written[column].astype(str).tolist() == [str(v) for v in values]
            else:
                # Another process, so possibly another build of the same kernel: a
                # freshly compiled numba kernel and the one loaded from the cache can
                # round differently in the last bit (measured: 1 ulp, cold cache only).
                np.testing.assert_allclose(
                    written[column].to_numpy(),
                    values,
                    rtol=4 * np.finfo(float).eps,
                    atol=0,
                    err_msg=column,
                )
