"""NadarayaWatsonRegressor(rtol=) and NadarayaWatsonClassifier(rtol=): the pruned paths
within their stated bounds, the width searches never worse than the rule, and rtol kept
in model files and on the command line.

Bounds (the classes' docstrings): on the streaming path each prediction moves by at most
rtol / (1 - rtol) times the spread of the targets about the exact one
(``nadaraya_watson``); on the mixed-type engine, degree 0, by at most 2 rtol / (1 - rtol)
times it (``local_polynomial`` with g = e_1); a class probability by at most
2 rtol / (1 - rtol). The tree paths are forced at these small sizes (small leaves, the
cost models told to take them).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.estimators import prediction
from nbattn.local import class_widths
from nbattn.local.problem import LocalSpec, rule_widths
from nbattn.local.widths import _training_problem, widths_to_theta
from nbattn.persistence.predictor import read_predictor

from .._config import config_values
from ..persistence.test_io import _rewrite, _split
from ..strategies import seeds

#: every pruned path at any size: the streaming k-d tree and the engine's leaves
_FORCE = {
    "TREE_LEAF_KEYS": 4,
    "TREE_MIN_KEYS": 1,
    "TREE_MAX_COST_SHARE": 10**9,
    "TREE_MAX_OVERHEAD_SHARE": 10**9,
    "LOCAL_LEAF_KEYS": 4,
    "LOCAL_TREE_MIN_KEYS": 1,
    "LOCAL_TREE_MAX_SHARE": 100,
}
KINDS = ["clustered", "uniform", "duplicates", "far"]


def pruned_always():
    return config_values(**_FORCE)


@pytest.fixture
def pruned():
    with pruned_always():
        yield


def _table(kind, seed, n=120, n_queries=30, mixed=False):
    """(X, y, queries): two continuous columns (and an unordered one with ``mixed``)."""
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.uniform(-5, 5, (4, 2))
        cont = centres[rng.integers(0, 4, n)] + 0.2 * rng.normal(size=(n, 2))
    elif kind == "duplicates":
        cont = rng.normal(size=(3, 2))[rng.integers(0, 3, n)]
    else:
        cont = rng.uniform(-2, 2, (n, 2))
    y = np.sin(2 * cont[:, 0]) + cont[:, 1] + 0.1 * rng.normal(size=n) + 3.0
    queries = cont[rng.integers(0, n, n_queries)] + 0.3 * rng.normal(size=(n_queries, 2))
    if kind == "far":  # a third of the queries thousands of widths from every key
        queries[::3] += 1e4
    X = pd.DataFrame(cont, columns=["a", "b"])
    Q = pd.DataFrame(queries, columns=["a", "b"])
    if mixed:
        X["k"] = pd.Categorical(rng.integers(0, 3, n))
        Q["k"] = pd.Categorical(rng.integers(0, 3, n_queries), categories=[0, 1, 2])
    return X, y, Q


def _spread(y, f):
    """max_j |y_j - f_i| per query: the scale of the prediction bound."""
    return np.maximum(y.max() - f, f - y.min())


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    seed=seeds,
    mixed=st.booleans(),
    rtol=st.sampled_from([1e-8, 1e-4, 1e-2, 0.3]),
    dtype=st.sampled_from(["float64", "float32"]),
    weighted=st.booleans(),
)
def test_regressor_predictions_within_the_bound(kind, seed, mixed, rtol, dtype, weighted):
    X, y, Q = _table(kind, seed, mixed=mixed)
    # weights over many decades: the streaming tree bounds the kernel mass, not the weighted
    sw = np.exp(8.0 * np.random.default_rng(seed).normal(size=len(y))) if weighted else None
    params = {"bandwidth": 0.4, "dtype": dtype}
    exact = nbattn.NadarayaWatsonRegressor(**params).fit(X, y, sample_weight=sw).predict(Q)
    with pruned_always():
        model = nbattn.NadarayaWatsonRegressor(rtol=rtol, **params).fit(X, y, sample_weight=sw)
        got = model.predict(Q)
    factor = 2.0 if model._uses_engine() else 1.0
    slack = (3e-4 if dtype == "float32" else 1e-10) * np.abs(y).max()
    allowed = factor * rtol / (1.0 - rtol) * _spread(y, exact) + slack
    assert np.all(np.abs(got - exact) <= allowed), np.abs(got - exact).max()


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    seed=seeds,
    mixed=st.booleans(),
    rtol=st.sampled_from([1e-8, 1e-3, 0.3]),
    bandwidth=st.sampled_from(["scott", "loo_scale"]),
)
def test_classifier_probabilities_within_the_bound(kind, seed, mixed, rtol, bandwidth):
    """At the exact model's widths and prior (copied over), the pruned probabilities."""
    X, y, Q = _table(kind, seed, n=90, mixed=mixed)
    labels = np.digitize(y, np.quantile(y, [0.3, 0.7]))
    exact = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth).fit(X, labels)
    with pruned_always():
        model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth, rtol=rtol).fit(X, labels)
        model.bandwidth_, model.prior_count_ = exact.bandwidth_, exact.prior_count_
        got = model.predict_proba(Q)
    allowed = 2.0 * rtol / (1.0 - rtol) + 1e-12
    assert np.all(np.abs(got - exact.predict_proba(Q)) <= allowed)


def _regressor_loss(model, X, y, widths):
    """The exact LOO MSE of the regressor's engine at ``widths``."""
    from nbattn.estimators.widths import engine_loo_loss

    exact = nbattn.NadarayaWatsonRegressor(**{**model.get_params(), "rtol": 0.0})
    Xc, Y, _, _ = exact._validate_regression_data(X, y, None)
    return engine_loo_loss(exact, Xc, Y, widths, None, 0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bandwidth", ["loo", "loo_scale"])
def test_regressor_searches_never_worse_than_the_rule(pruned, seed, bandwidth):
    """rtol = 0.3 makes the pruned criterion far from the exact one; the answer is still
    no worse than Scott's widths by the exact criterion, and a second fit repeats it."""
    X, y, _ = _table(KINDS[seed], seed, n=150, mixed=True)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=bandwidth, rtol=0.3).fit(X, y)
    again = nbattn.NadarayaWatsonRegressor(bandwidth=bandwidth, rtol=0.3).fit(X, y)
    np.testing.assert_array_equal(model.bandwidth_, again.bandwidth_)
    rule = nbattn.NadarayaWatsonRegressor(bandwidth="scott").fit(X, y).bandwidth_
    assert _regressor_loss(model, X, y, model.bandwidth_) <= _regressor_loss(model, X, y, rule)


def _class_loss(X, labels, widths):
    """The exact smoothed LOO log-loss of the classifier at ``widths`` (alpha profiled)."""
    model = nbattn.NadarayaWatsonClassifier(bandwidth=widths).fit(X, labels)
    spec = LocalSpec(var_type=model.var_type_, n_categories=tuple(model._n_categories()))
    Y = (labels[:, None] == model.classes_[None, :]).astype(np.float64)
    criterion = class_widths.LogLossCriterion(
        _training_problem(spec, model.X_fit_, Y, 0, None, np.asarray(widths))
    )
    return criterion.profile(widths_to_theta(widths, spec.var_type, spec.n_categories))[0]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("bandwidth", ["loo", "loo_scale"])
def test_classifier_searches_never_worse_than_the_rule(pruned, seed, bandwidth):
    X, y, _ = _table(KINDS[seed], seed, n=120, mixed=True)
    labels = np.digitize(y, np.quantile(y, [0.3, 0.7]))
    model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth, rtol=0.3).fit(X, labels)
    again = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth, rtol=0.3).fit(X, labels)
    np.testing.assert_array_equal(model.bandwidth_, again.bandwidth_)
    assert model.prior_count_ == again.prior_count_
    rule = nbattn.NadarayaWatsonClassifier(bandwidth="scott").fit(X, labels).bandwidth_
    assert _class_loss(X, labels, model.bandwidth_) <= _class_loss(X, labels, rule)


def test_loo_scale_guard_returns_the_rule_when_the_search_is_worse(monkeypatch):
    """A pruned one-factor search that lands far off (forced here) is caught by the exact
    comparison: the rule's widths come back."""
    from nbattn.estimators import widths
    from nbattn.smoothing.search import minimize_log_scale

    def lost(*args, **kwargs):
        return dataclasses.replace(minimize_log_scale(*args, **kwargs), t=12.0)

    X, y, _ = _table("clustered", 0, n=150, mixed=True)
    monkeypatch.setattr(widths, "minimize_log_scale", lost)
    model = nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale", rtol=1e-6).fit(X, y)
    rule = nbattn.NadarayaWatsonRegressor(bandwidth="scott").fit(X, y).bandwidth_
    np.testing.assert_array_equal(model.bandwidth_, rule)
    # exact (rtol = 0): the search is trusted as it is
    exact = nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale").fit(X, y)
    assert not np.array_equal(exact.bandwidth_, rule)


def test_classifier_guard_returns_the_rule_when_the_search_is_worse(monkeypatch):
    X, y, _ = _table("clustered", 1, n=120, mixed=True)
    labels = np.digitize(y, np.quantile(y, [0.3, 0.7]))
    spec_rule = nbattn.NadarayaWatsonClassifier(bandwidth="scott").fit(X, labels).bandwidth_

    def lost(criterion, start, per_column=True):
        spec = criterion.base.spec
        theta = widths_to_theta(start, spec.var_type, spec.n_categories)
        return theta - 9.0  # every width at e^-9 times the rule's: worse than the rule

    monkeypatch.setattr(class_widths, "search_widths", lost)
    model = nbattn.NadarayaWatsonClassifier(bandwidth="loo", rtol=1e-6).fit(X, labels)
    np.testing.assert_allclose(model.bandwidth_, spec_rule, rtol=1e-12)


@pytest.mark.parametrize(
    "name", ["NadarayaWatsonRegressor", "NadarayaWatsonClassifier", "LearnedKernelRegressor"]
)
def test_model_file_keeps_rtol_and_the_predictor_uses_it(tmp_path, pruned, name):
    X, y, Q = _table("clustered", 3)
    target = y if "Regressor" in name else np.digitize(y, [np.median(y)])
    model = getattr(nbattn, name)(rtol=0.01).fit(X, target)
    if name == "LearnedKernelRegressor":  # its learned widths are too narrow to prune here
        model.bandwidth_ = np.full(2, 0.4)
    path = nbattn.save(model, tmp_path / "m.npz")
    loaded = nbattn.load(path)
    assert loaded.get_params()["rtol"] == 0.01
    method = "predict" if "Regressor" in name else "predict_proba"
    want = getattr(model, method)(Q)
    np.testing.assert_array_equal(getattr(loaded, method)(Q), want)
    np.testing.assert_array_equal(getattr(read_predictor(path)[0], method)(Q), want)
    exact = getattr(nbattn, name)().fit(X, target)
    if name == "LearnedKernelRegressor":  # the same widths, to see the predictions alone
        exact.bandwidth_ = model.bandwidth_.copy()
    assert not np.array_equal(want, getattr(exact, method)(Q))  # rtol reached the predictions


def test_a_file_from_before_rtol_loads_as_exact(tmp_path):
    X, y, Q = _table("uniform", 4)
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz")
    meta, arrays = _split(path)
    del meta["params"]["rtol"]
    _rewrite(path, meta, arrays)
    loaded = nbattn.load(path)
    assert loaded.rtol == 0.0
    np.testing.assert_array_equal(loaded.predict(Q), model.predict(Q))
    np.testing.assert_array_equal(read_predictor(path)[0].predict(Q), model.predict(Q))


@pytest.mark.parametrize("bad", [-1e-3, 1.0, float("nan"), float("inf"), "1e-6", True])
@pytest.mark.parametrize(
    "name", ["NadarayaWatsonRegressor", "NadarayaWatsonClassifier", "LearnedKernelRegressor"]
)
def test_bad_rtol_is_refused_by_name(name, bad):
    X, y, _ = _table("uniform", 0, n=20)
    with pytest.raises(ValueError, match="rtol"):
        getattr(nbattn, name)(rtol=bad).fit(X, y > y.mean())


def test_rtol_on_the_gpu_is_refused_and_auto_stays_on_the_cpu(monkeypatch):
    X, y, Q = _table("uniform", 5, n=40)
    monkeypatch.setattr(prediction, "resolve_device", lambda device: "cuda")  # a GPU machine
    auto = nbattn.NadarayaWatsonRegressor(rtol=1e-6, device="auto").fit(X, y)
    assert auto._device() == "cpu"
    auto.predict(Q)
    forced = nbattn.NadarayaWatsonRegressor(rtol=1e-6, device="cuda").fit(X, y)
    with pytest.raises(NotImplementedError, match="CPU only"):
        forced.predict(Q)


def test_command_line_rtol_for_nadaraya_watson(tmp_path, capsys):
    from nbattn.app import cli

    X, y, Q = _table("clustered", 6)
    frame = X.assign(y=y)
    frame.to_csv(tmp_path / "train.csv", index=False)
    out = tmp_path / "m.npz"
    code = cli.main(
        ["fit", str(tmp_path / "train.csv"), "--target", "y", "--model", "nw", "--rtol", "1e-6"]
        + ["-q", "-o", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    assert nbattn.load(out).rtol == 1e-6
    code = cli.main(
        ["fit", str(tmp_path / "train.csv"), "--target", "y", "--model", "learned"]
        + ["--rtol", "1e-6", "-q", "-o", str(tmp_path / "l.npz")]
    )
    assert code == 0, capsys.readouterr().err
    assert nbattn.load(tmp_path / "l.npz").rtol == 1e-6


def test_rule_widths_are_what_the_guard_compares_with():
    """The regressor's guard compares with Scott's widths: the engine's rule for the
    spec, which the 'scott' estimator also fits (so the tests above compare like with
    like)."""
    X, y, _ = _table("clustered", 7, mixed=True)
    model = nbattn.NadarayaWatsonRegressor(bandwidth="scott").fit(X, y)
    spec = model._local_spec()
    np.testing.assert_array_equal(rule_widths(spec, model.X_fit_, "scott"), model.bandwidth_)


@pytest.mark.parametrize("name", ["NadarayaWatsonRegressor", "NadarayaWatsonClassifier"])
def test_heavy_weights_on_far_keys_stay_within_the_bound(pruned, name):
    """Eight keys far from the query hold nearly all the weight: a tree that bounds only
    the kernel mass drops them and moves the prediction by a quarter (found in review)."""
    X = np.linspace(0.0, 1.0, 50)[:, None]
    X[-8:] = 4.0
    y = np.where(np.arange(50) >= 42, 1.0, 0.0)
    target = y if name == "NadarayaWatsonRegressor" else y.astype(int)
    sw = np.where(np.arange(50) >= 42, 1e12, 1.0)
    Q = np.array([[0.6], [0.2]])
    method = "predict" if name == "NadarayaWatsonRegressor" else "predict_proba"
    exact = getattr(getattr(nbattn, name)(bandwidth=0.5).fit(X, target, sw), method)(Q)
    model = getattr(nbattn, name)(bandwidth=0.5, rtol=1e-6).fit(X, target, sample_weight=sw)
    np.testing.assert_allclose(getattr(model, method)(Q), exact, rtol=0, atol=4e-6)


@pytest.mark.parametrize("mixed", [False, True])
def test_return_std_mean_is_predict(pruned, mixed):
    X, y, Q = _table("clustered", 8, mixed=mixed)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.4, rtol=0.3).fit(X, y)
    mean, std = model.predict(Q, return_std=True)
    np.testing.assert_array_equal(mean, model.predict(Q))
    exact_mean, exact_std = (
        nbattn.NadarayaWatsonRegressor(bandwidth=0.4).fit(X, y).predict(Q, return_std=True)
    )
    assert not np.array_equal(mean, exact_mean)  # pruned alike
    assert np.all(np.isfinite(std)) and np.all(std >= 0)


@pytest.mark.parametrize(
    "name", ["NadarayaWatsonRegressor", "NadarayaWatsonClassifier", "LocalPolynomialRegressor"]
)
def test_rtol_false_is_refused_at_fit(name):
    """False passes the number range (it is 0) but is no tolerance: refused at fit, as
    at predict, naming rtol."""
    X, y, _ = _table("uniform", 0, n=20)
    with pytest.raises(ValueError, match="rtol"):
        getattr(nbattn, name)(rtol=False, bandwidth="scott").fit(X, y > y.mean())


def test_rtol_false_is_refused_at_fit_of_the_learned_kernel():
    X, y, _ = _table("uniform", 0, n=20)
    with pytest.raises(ValueError, match="rtol"):
        nbattn.LearnedKernelRegressor(rtol=False).fit(X, y)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
def test_interval_is_centred_on_predict(pruned, mixed, weighted):
    """The interval runs the engine while the streaming path predicts: with rtol > 0 it is
    moved onto predict's value (it was up to 0.36 away at rtol 0.1, found in review)."""
    X, y, Q = _table("clustered", 9, mixed=mixed)
    sw = np.exp(4.0 * np.random.default_rng(9).normal(size=len(y))) if weighted else None
    model = nbattn.NadarayaWatsonRegressor(rtol=0.1).fit(X, y, sample_weight=sw)
    band = model.predict_interval(Q)
    centre = band.mean(axis=-1)
    np.testing.assert_allclose(centre, model.predict(Q), rtol=1e-12, atol=1e-12)
    exact = nbattn.NadarayaWatsonRegressor().fit(X, y, sample_weight=sw).predict_interval(Q)
    np.testing.assert_allclose(np.diff(band, axis=-1), np.diff(exact, axis=-1), rtol=0.5)
