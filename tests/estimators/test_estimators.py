"""The estimators: DataFrames, multi-output, bandwidths, errors; the shared base
(device resolved per call, float64 results, copied training data, one set of
attribute names, random_state, verbose) and check_fitted_state."""

import copy
import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.base import clone

import nbattn
from nbattn.dispatch.device import cuda_available
from nbattn.estimators import check_fitted_state, prediction
from nbattn.local import class_widths
from nbattn.smoothing import learned_metric, regression, width_search

from .. import naive
from .._scripts import run_checked
from ..strategies import seeds


@pytest.fixture
def frame(rng):
    X = pd.DataFrame(rng.uniform(0, 5, size=(120, 3)), columns=["a", "b", "c"])
    y = pd.Series(np.sin(X["a"]) + 0.1 * X["b"], name="target")
    return X, y


def test_fit_predict_matches_functional_and_naive(frame):
    X, y = frame
    model = nbattn.NadarayaWatsonRegressor(bandwidth="scott").fit(X, y)
    assert list(model.feature_names_in_) == ["a", "b", "c"]
    assert model.bandwidth_.shape == (3,)
    pred = model.predict(X.iloc[:10])
    assert pred.shape == (10,)
    ref = naive.nadaraya_watson(
        X.iloc[:10].to_numpy(), X.to_numpy(), y.to_numpy(), model.bandwidth_
    )
    np.testing.assert_allclose(pred, ref, rtol=1e-12)
    w = model.attention_weights(X.iloc[:10])
    assert w.shape == (10, 120)
    np.testing.assert_allclose(w @ y.to_numpy(), pred, rtol=1e-12)


def test_columns_matched_by_name(frame):
    X, y = frame
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    with pytest.raises(ValueError, match="feature names"):
        model.predict(X[["c", "b", "a"]])
    with pytest.raises(ValueError):
        model.predict(X[["a", "b"]])


def test_multi_output_2d_y(frame):
    X, y = frame
    Y = np.column_stack([y, 2 * y])
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, Y)
    pred = model.predict(X)
    assert pred.shape == (120, 2)
    np.testing.assert_allclose(pred[:, 1], 2 * pred[:, 0], rtol=1e-12)
    assert 0.0 < model.score(X, Y) <= 1.0


def test_per_feature_bandwidth_array(frame):
    X, y = frame
    h = np.array([0.3, 1.0, 5.0])
    model = nbattn.NadarayaWatsonRegressor(bandwidth=h).fit(X, y)
    np.testing.assert_array_equal(model.bandwidth_, h)
    ref = naive.nadaraya_watson(X.to_numpy(), X.to_numpy(), y.to_numpy(), h)
    np.testing.assert_allclose(model.predict(X), ref, rtol=1e-12)


def test_average_kernel_predicts_mean(frame):
    X, y = frame
    model = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y)
    np.testing.assert_allclose(model.predict(X.iloc[:3]), y.mean())


def test_float32_dtype(frame):
    X, y = frame
    model = nbattn.NadarayaWatsonRegressor(dtype="float32").fit(X, y)
    ref = nbattn.NadarayaWatsonRegressor().fit(X, y).predict(X)
    np.testing.assert_allclose(model.predict(X), ref, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (dict(kernel="box"), "kernel"),
        (dict(bandwidth=0.0), "bandwidth"),
        (dict(bandwidth="wide"), "bandwidth"),
        (dict(bandwidth=[1.0, -1.0, 1.0]), "bandwidth must be positive"),
        (dict(bandwidth=[1.0, 1.0]), "bandwidth has 2 entries"),
        (dict(device="tpu"), "device"),
        (dict(dtype="int8"), "dtype"),
    ],
)
def test_bad_parameters(frame, params, match):
    X, y = frame
    with pytest.raises(ValueError, match=match):
        nbattn.NadarayaWatsonRegressor(**params).fit(X, y)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda X, y: (X.assign(a=np.nan), y), "NaN"),
        (lambda X, y: (X, y.where(y > 0.5, np.inf)), "infinity|NaN"),
        (lambda X, y: (X.iloc[:0], y.iloc[:0]), "0 sample"),
        (lambda X, y: (X.assign(a=[{"k": 1}] * len(X)), y), "not a string, number or bool"),
        (lambda X, y: (X, y.iloc[:5]), "inconsistent numbers of samples"),
    ],
)
def test_bad_data(frame, mutate, match):
    X, y = mutate(*frame)
    with pytest.raises(ValueError, match=match):
        nbattn.NadarayaWatsonRegressor().fit(X, y)


def test_inputs_not_modified_and_clone(frame):
    X, y = frame
    X0, y0 = X.copy(), y.copy()
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    model.predict(X)
    pd.testing.assert_frame_equal(X, X0)
    pd.testing.assert_series_equal(y, y0)
    assert clone(model).get_params() == model.get_params()


def test_auto_device_runs_on_cpu_without_gpu(frame):
    X, y = frame
    model = nbattn.NadarayaWatsonRegressor(device="auto").fit(X, y)
    np.testing.assert_allclose(
        model.predict(X), nbattn.NadarayaWatsonRegressor().fit(X, y).predict(X), rtol=1e-15
    )


@pytest.mark.skipif(cuda_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_an_error_when_the_computation_runs(frame):
    X, y = frame
    model = nbattn.NadarayaWatsonRegressor(device="cuda").fit(X, y)  # fit only stores
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
        model.predict(X)
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
        nbattn.NadarayaWatsonRegressor(bandwidth="loo", device="cuda").fit(X, y)
    cpu = nbattn.NadarayaWatsonRegressor().fit(X, y).predict(X)
    np.testing.assert_array_equal(model.set_params(device="cpu").predict(X), cpu)


# ----------------------------------------------------------------------------- the shared base

#: One fitted configuration of each estimator and each fitted-state shape.
CONFIGS = [
    ("NadarayaWatsonRegressor", {}),
    ("NadarayaWatsonRegressor", {"kernel": "average"}),
    ("NadarayaWatsonRegressor", {"bandwidth": "loo_scale"}),
    ("NadarayaWatsonRegressor", {"bandwidth": [0.5, 2.0]}),
    ("LearnedKernelRegressor", {"metric": "scalar", "max_iter": 5}),
    ("LearnedKernelRegressor", {"metric": "diagonal", "max_iter": 5}),
    ("LearnedKernelRegressor", {"metric": "full", "max_iter": 5, "n_components": 1}),
    ("NadarayaWatsonClassifier", {}),
    ("NadarayaWatsonClassifier", {"bandwidth": "loo"}),
]
CONFIG_IDS = [f"{name}-{kwargs}" for name, kwargs in CONFIGS]

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _xy(name, seed=0, n=30, two_outputs=False):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=n)
    if name.endswith("Classifier"):
        return X, np.where(y > 0.3, "high", np.where(y > -0.3, "mid", "low"))
    return X, (np.column_stack([y, -2 * y]) if two_outputs else y)


def _fitted(name, kwargs, seed=0, **data):
    X, y = _xy(name, seed, **data)
    return getattr(nbattn, name)(**kwargs).fit(X, y), X, y


def _results(model, X):
    """Every result a fitted model gives, by method name."""
    out = {
        "attention_weights": model.attention_weights(X),
        "effective_n_neighbors": model.effective_n_neighbors(X),
    }
    if hasattr(model, "predict_proba"):
        out["predict_proba"] = model.predict_proba(X)
    else:
        out["predict"] = model.predict(X)
        out["predict_mean"], out["predict_std"] = model.predict(X, return_std=True)
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=CONFIG_IDS)
def test_every_result_is_float64(name, kwargs, dtype):
    model, X, _ = _fitted(name, {**kwargs, "dtype": dtype})
    for method, value in _results(model, X[:7]).items():
        assert value.dtype == np.float64, method
        assert np.isfinite(value).all(), method
    if dtype == "float32":  # the same computation as float64, to float32 accuracy
        ref = copy.deepcopy(model).set_params(dtype="float64")
        got, want = _results(model, X[:7]), _results(ref, X[:7])
        for method in want:
            np.testing.assert_allclose(got[method], want[method], rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=CONFIG_IDS)
def test_training_data_are_copies(name, kwargs):
    X, y = _xy(name)
    X_mine = np.array(X)  # float64, C-contiguous: what validate_data would pass through
    y_mine = np.array(y)
    model = getattr(nbattn, name)(**kwargs).fit(X_mine, y_mine)
    before = _results(model, X[:5])
    assert not np.shares_memory(model.X_fit_, X_mine)
    X_mine[:] = 0.0
    if y_mine.dtype.kind == "f":
        y_mine[:] = 0.0
    else:
        y_mine[:] = "low"
    after = _results(model, X[:5])
    for method in before:
        np.testing.assert_array_equal(after[method], before[method], err_msg=method)


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=CONFIG_IDS)
def test_one_set_of_attribute_names(name, kwargs):
    model, X, y = _fitted(name, kwargs)
    fitted = {k for k in vars(model) if k.endswith("_")}
    assert {"X_fit_", "y_fit_", "n_features_in_"} <= fitted
    assert not any(k.startswith("_") for k in vars(model)), "no private fitted state"
    assert "Y_fit_" not in vars(model) and "device_" not in vars(model)
    assert model.X_fit_.dtype == model.y_fit_.dtype == np.float64
    assert model.y_fit_.ndim == 2 and model.y_fit_.shape[0] == model.X_fit_.shape[0]
    if name.endswith("Classifier"):  # the values pooled: one-hot labels
        np.testing.assert_array_equal(model.y_fit_, y[:, None] == model.classes_[None, :])
    else:
        np.testing.assert_array_equal(model.y_fit_[:, 0], y)
        assert model.outputs_2d_ is False and model.n_outputs_ == 1


@pytest.mark.parametrize("name", ["NadarayaWatsonRegressor", "LearnedKernelRegressor"])
def test_output_shape_follows_y(name):
    kwargs = {"max_iter": 3} if name.startswith("Learned") else {}
    model, X, Y = _fitted(name, kwargs, two_outputs=True)
    assert model.outputs_2d_ is True and model.n_outputs_ == 2
    pred, std = model.predict(X[:4], return_std=True)
    assert model.predict(X[:4]).shape == pred.shape == std.shape == (4, 2)
    one = getattr(nbattn, name)(**kwargs).fit(X, Y[:, :1])  # a (n, 1) y stays 2-D
    assert one.predict(X[:4]).shape == (4, 1) and one.outputs_2d_ is True
    flat = getattr(nbattn, name)(**kwargs).fit(X, Y[:, 0])
    assert flat.predict(X[:4]).shape == flat.predict(X[:4], return_std=True)[1].shape == (4,)


class _DeviceSpy:
    """Stands in for a functional-layer function: records its keywords, runs on the CPU."""

    def __init__(self, real):
        self.real, self.devices, self.calls = real, [], []

    def __call__(self, *args, **kwargs):
        self.calls.append(dict(kwargs))
        self.devices.append(kwargs.get("device"))
        if "device" in kwargs:
            kwargs["device"] = "cpu"
        return self.real(*args, **kwargs)


class _SpecDeviceSpy(_DeviceSpy):
    """The same for a function of a LocalSpec (its first argument, holding the device)."""

    def __call__(self, spec, *args, **kwargs):
        self.calls.append(dict(kwargs))
        self.devices.append(spec.device)
        return self.real(dataclasses.replace(spec, device="cpu"), *args, **kwargs)


@pytest.fixture
def gpu_machine(monkeypatch):
    """Pretend numba sees a GPU: "auto" resolves to "cuda" in the estimators."""
    real = prediction.resolve_device

    def resolve(device):
        return "cuda" if device in ("auto", "cuda") else real(device)

    monkeypatch.setattr(prediction, "resolve_device", resolve)
    spies = {}
    for module, fname in [
        (regression, "gaussian_pool"),  # the estimators' pooling of checked arrays
        (width_search, "loo_scale"),  # and their width search
        (learned_metric, "fit_learned_kernel"),
        (class_widths, "class_loo_widths"),  # the classifier's search on the engine
    ]:
        spy = _SpecDeviceSpy if module is class_widths else _DeviceSpy
        spies[fname] = spy(getattr(module, fname))
        monkeypatch.setattr(module, fname, spies[fname])
    return spies


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=CONFIG_IDS)
def test_device_is_resolved_when_a_method_runs(name, kwargs, gpu_machine, monkeypatch, tmp_path):
    X, y = _xy(name)
    cpu_model = getattr(nbattn, name)(**kwargs).fit(X, y)
    for spy in gpu_machine.values():
        spy.devices.clear()
    model = getattr(nbattn, name)(**kwargs, device="auto").fit(X, y)
    fit_devices = [
        device
        for search in ("loo_scale", "fit_learned_kernel", "class_loo_widths")
        for device in gpu_machine[search].devices
    ]
    assert set(fit_devices) <= {"cuda"}
    searches = kwargs.get("bandwidth") in ("loo", "loo_scale") or name.startswith("Learned")
    assert len(fit_devices) == searches
    pooling = gpu_machine["gaussian_pool"].devices
    pooling.clear()
    model.predict_proba(X) if hasattr(model, "predict_proba") else model.predict(X)
    if kwargs.get("kernel") != "average":
        assert pooling == ["cuda"]  # predict and predict_proba go to the GPU
    path = nbattn.save(model, tmp_path / "m.npz")
    monkeypatch.undo()  # ... and the file is loaded on a machine without a GPU
    loaded = nbattn.load(path)
    assert loaded.device == "auto"
    got, want = _results(loaded, X[:6]), _results(cpu_model, X[:6])
    for method in want:
        np.testing.assert_allclose(got[method], want[method], rtol=1e-12, err_msg=method)


@pytest.mark.parametrize(
    "random_state",
    [None, 7, np.random.default_rng(7), np.random.RandomState(7)],
    ids=["None", "int", "Generator", "RandomState"],
)
def test_random_state_kinds_fit_and_save(random_state, tmp_path):
    X, y = _xy("LearnedKernelRegressor")
    kwargs = dict(metric="full", init="random", max_iter=3)
    model = nbattn.LearnedKernelRegressor(**kwargs, random_state=random_state).fit(X, y)
    check_fitted_state(model)
    loaded = nbattn.load(nbattn.save(model, tmp_path / "m.npz"))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.get_params()["random_state"] in (None, 7)


def test_random_state_int_and_generator_draw_the_same_start():
    X, y = _xy("LearnedKernelRegressor")
    kwargs = dict(metric="full", init="random", max_iter=3)
    for seed in range(5):
        a = nbattn.LearnedKernelRegressor(**kwargs, random_state=seed).fit(X, y)
        b = nbattn.LearnedKernelRegressor(**kwargs, random_state=np.random.default_rng(seed))
        np.testing.assert_array_equal(a.components_, b.fit(X, y).components_)
    rs = [
        nbattn.LearnedKernelRegressor(**kwargs, random_state=np.random.RandomState(3)) for _ in "ab"
    ]
    np.testing.assert_array_equal(rs[0].fit(X, y).components_, rs[1].fit(X, y).components_)
    starts = {
        nbattn.LearnedKernelRegressor(**kwargs, random_state=s).fit(X, y).loss_curve_[0]
        for s in range(5)
    }
    assert len(starts) == 5  # the seed does reach the random start


@pytest.mark.parametrize("bad", ["seven", 1.5, [1, 2]])
def test_random_state_refused(bad):
    X, y = _xy("LearnedKernelRegressor")
    with pytest.raises(ValueError, match="random_state"):
        nbattn.LearnedKernelRegressor(random_state=bad).fit(X, y)


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=CONFIG_IDS)
def test_verbose_reaches_the_search(name, kwargs, gpu_machine):
    searches = kwargs.get("bandwidth") in ("loo", "loo_scale") or name.startswith("Learned")
    X, y = _xy(name)
    getattr(nbattn, name)(**kwargs, verbose=2).fit(X, y)
    search = {"Learned": "fit_learned_kernel", "Classif": "class_loo_widths"}
    spy = gpu_machine[next((v for k, v in search.items() if k in name), "loo_scale")]
    assert [call["verbose"] for call in spy.calls] == [2] * int(searches)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("NadarayaWatsonRegressor", {"bandwidth": "loo_scale"}),
        ("LearnedKernelRegressor", {"max_iter": 3}),
        ("NadarayaWatsonClassifier", {"bandwidth": "loo"}),
    ],
)
def test_verbose_fit_reports_progress(name, kwargs, capfd):
    X, y = _xy(name)
    getattr(nbattn, name)(**kwargs, verbose=0).fit(X, y)
    assert capfd.readouterr().err == ""
    getattr(nbattn, name)(**kwargs, verbose=2).fit(X, y)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines and any(char.isdigit() for char in lines[-1]), lines  # plain lines, with numbers


@pytest.mark.parametrize("verbose", [-1, "yes", 0.5])
def test_bad_verbose(verbose):
    X, y = _xy("NadarayaWatsonRegressor")
    with pytest.raises(ValueError, match="verbose"):
        nbattn.NadarayaWatsonRegressor(verbose=verbose).fit(X, y)


# ----------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize(
    "y",
    [
        np.array([1.0, None, 2.0, 3.0, 4.0, 5.0], dtype=object),
        [1.0, 2.0, 3.0, 4.0, 5.0, None],
        pd.Series([1.0, 2.0, None, 3.0, 4.0, 5.0], dtype=object),
        np.array([1.0, 2.0, np.nan, 3.0, 4.0, 5.0], dtype=object),
        np.array([[1.0, 0.0]] * 3 + [[None, 1.0]] + [[1.0, 0.0]] * 2, dtype=object),
    ],
)
def test_regressor_refuses_missing_targets(y):
    X = np.arange(6.0)[:, None]
    rows = [i for i, v in enumerate(np.asarray(y, dtype=object).reshape(6, -1)) if pd.isna(v).any()]
    for cls in (nbattn.NadarayaWatsonRegressor, nbattn.LearnedKernelRegressor):
        with pytest.raises(ValueError, match=rf"^y .*row {rows[0]}\b"):
            cls().fit(X, y)


@pytest.mark.parametrize(
    "y",
    [
        np.array(["a", None, "b", "a", "b", "a"], dtype=object),
        np.array([1, 2, 1, 2, None, 1], dtype=object),
        pd.Series(["a", "b", "a", pd.NA, "b", "a"], dtype=object),
    ],
)
def test_classifier_refuses_missing_labels(y):
    X = np.arange(6.0)[:, None]
    row = int(np.flatnonzero(pd.isna(np.asarray(y, dtype=object)))[0])
    with pytest.raises(ValueError, match=rf"^y .*row {row}\b"):
        nbattn.NadarayaWatsonClassifier().fit(X, y)


@pytest.mark.parametrize(
    ("column", "match"),
    [
        (pd.date_range("2020-01-01", periods=8), "dates"),
        (pd.date_range("2020-01-01", periods=8, tz="UTC"), "dates"),
        (pd.to_timedelta(np.arange(8), unit="D"), "durations"),
        (np.arange(8).astype("datetime64[D]"), "dates"),
        (np.arange(8) + 1j, "complex"),
    ],
)
@pytest.mark.parametrize(("name", "kwargs"), CONFIGS[:1] + CONFIGS[4:5] + CONFIGS[7:8])
def test_date_and_complex_columns_are_named(column, match, name, kwargs):
    good = pd.DataFrame({"a": np.linspace(0, 1, 8), "when": np.linspace(2, 3, 8)})
    bad = good.assign(when=column)
    y = np.array([0, 1] * 4) if name.endswith("Classifier") else np.linspace(0, 1, 8)
    with pytest.raises(ValueError, match=rf"X column 'when' holds {match}"):
        getattr(nbattn, name)(**kwargs).fit(bad, y)
    model = getattr(nbattn, name)(**kwargs).fit(good, y)
    with pytest.raises(ValueError, match=rf"X column 'when' holds {match}"):
        model.predict(bad)


def test_complex_numpy_X_is_refused_by_name():
    with pytest.raises(ValueError, match="X holds complex numbers"):
        nbattn.NadarayaWatsonRegressor().fit(np.ones((4, 2)) + 1j, np.arange(4.0))


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 25),
    d=st.integers(1, 4),
    p=st.sampled_from([None, 1, 3]),
    n_q=st.integers(1, 6),
    seed=seeds,
    width=st.floats(0.05, 20.0),
)
def test_regressor_matches_naive_over_shapes(n, d, p, n_q, seed, width):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10, size=d)
    y = rng.normal(size=n if p is None else (n, p))
    Q = rng.normal(size=(n_q, d)) * 3
    h = width * rng.uniform(0.5, 2, size=d)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=h).fit(X, y)
    pred, std = model.predict(Q, return_std=True)
    ref = naive.nadaraya_watson(Q, X, y, h)
    np.testing.assert_allclose(pred, ref, rtol=1e-10, atol=1e-12)
    w = naive.nadaraya_watson_weights(Q, X, h)
    np.testing.assert_allclose(model.attention_weights(Q), w, rtol=1e-10, atol=1e-12)
    y2 = y.reshape(n, -1)
    ref_std = np.sqrt(np.einsum("qj,qjc->qc", w, (y2[None] - ref.reshape(n_q, -1)[:, None]) ** 2))
    np.testing.assert_allclose(std.reshape(n_q, -1), ref_std, rtol=1e-7, atol=1e-6)
    np.testing.assert_allclose(model.effective_n_neighbors(Q), 1.0 / (w**2).sum(axis=1), rtol=1e-10)
    check_fitted_state(model)


# ----------------------------------------------------------------------------- check_fitted_state


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=CONFIG_IDS)
def test_check_fitted_state_accepts_fitted_and_loaded_models(name, kwargs, tmp_path):
    model, X, _ = _fitted(name, kwargs)
    check_fitted_state(model)
    check_fitted_state(nbattn.load(nbattn.save(model, tmp_path / "m.npz")))
    frame = pd.DataFrame(X, columns=["left", "right"])
    check_fitted_state(getattr(nbattn, name)(**kwargs).fit(frame, _xy(name)[1]))


def _tamper_cases():
    """(estimator name, params, how to tamper with the fitted model, what the error names)."""
    nw, learned, clf = (
        "NadarayaWatsonRegressor",
        "LearnedKernelRegressor",
        "NadarayaWatsonClassifier",
    )

    def set_(name, value):
        return lambda m: setattr(m, name, value(m) if callable(value) else value)

    def delete(name):
        return lambda m: delattr(m, name)

    return [
        (nw, {}, set_("kernel", "evil"), "kernel"),
        (nw, {}, set_("dtype", "float16"), "dtype"),
        (nw, {}, set_("device", "tpu"), "device"),
        (nw, {}, set_("bandwidth", "wide"), "bandwidth"),
        (nw, {}, set_("verbose", -3), "verbose"),
        (learned, {"max_iter": 3}, set_("metric", "evil"), "metric"),
        (learned, {"max_iter": 3}, set_("random_state", "seed"), "random_state"),
        (nw, {}, delete("X_fit_"), "X_fit_"),
        (nw, {}, delete("bandwidth_"), "bandwidth_"),
        (nw, {}, delete("outputs_2d_"), "outputs_2d_"),
        (nw, {}, set_("X_fit_", lambda m: m.X_fit_[:-1]), "y_fit_"),
        (nw, {}, set_("y_fit_", lambda m: m.y_fit_[:-1]), "y_fit_"),
        (nw, {}, set_("X_fit_", lambda m: m.X_fit_.astype(np.float32)), "X_fit_"),
        (nw, {}, set_("X_fit_", lambda m: m.X_fit_.astype(object)), "X_fit_"),
        (nw, {}, set_("X_fit_", lambda m: m.X_fit_.tolist()), "X_fit_"),
        (nw, {}, set_("X_fit_", lambda m: np.where(m.X_fit_ > 1, np.nan, m.X_fit_)), "X_fit_"),
        (nw, {}, set_("y_fit_", lambda m: m.y_fit_[:, 0]), "y_fit_"),
        (nw, {}, set_("n_features_in_", 3), "X_fit_"),
        (nw, {}, set_("n_features_in_", 2.0), "n_features_in_"),
        (nw, {}, set_("n_features_in_", True), "n_features_in_"),
        (nw, {}, set_("n_outputs_", 2), "n_outputs_"),
        (nw, {}, set_("outputs_2d_", "no"), "outputs_2d_"),
        (nw, {}, set_("bandwidth_", lambda m: m.bandwidth_[:1]), "bandwidth_"),
        (nw, {}, set_("bandwidth_", lambda m: -m.bandwidth_), "bandwidth_"),
        (nw, {}, set_("bandwidth_", lambda m: m.bandwidth_ * np.inf), "bandwidth_"),
        (nw, {"bandwidth": 0.5}, set_("bandwidth_", np.array([0.5, 0.6])), "bandwidth_"),
        (nw, {}, set_("feature_names_in_", np.array(["a"], dtype=object)), "feature_names_in_"),
        (nw, {}, set_("feature_names_in_", np.array([1, 2], dtype=object)), "feature_names_in_"),
        (nw, {}, set_("evil_", 1), "evil_"),
        (nw, {}, set_("_y_ndim", 1), "_y_ndim"),
        (nw, {}, set_("components_", np.eye(2)), "components_"),
        (learned, {"metric": "full", "max_iter": 3}, delete("components_"), "components_"),
        (
            learned,
            {"metric": "full", "max_iter": 3},
            set_("components_", lambda m: m.components_.T[:1]),
            "components_",
        ),
        (learned, {"metric": "full", "max_iter": 3}, set_("bandwidth_", np.ones(2)), "bandwidth_"),
        (learned, {"max_iter": 3}, set_("components_", np.eye(2)), "components_"),
        (learned, {"max_iter": 3}, set_("loss_", float("nan")), "loss_"),
        (learned, {"max_iter": 3}, set_("loss_", "small"), "loss_"),
        (learned, {"max_iter": 3}, delete("loss_curve_"), "loss_curve_"),
        (learned, {"max_iter": 3}, set_("n_iter_", -1), "n_iter_"),
        (learned, {"max_iter": 3}, set_("X_fit_", lambda m: m.X_fit_[:1]), "y_fit_"),
        (clf, {}, set_("classes_", lambda m: m.classes_[:2]), "classes_"),
        (clf, {}, set_("classes_", lambda m: m.classes_[[0, 0, 1]]), "classes_"),
        (clf, {}, set_("classes_", lambda m: m.classes_.reshape(3, 1)), "classes_"),
        (clf, {}, set_("y_fit_", lambda m: 2 * m.y_fit_), "one-hot"),
        (clf, {}, set_("y_fit_", lambda m: np.ones_like(m.y_fit_)), "one-hot"),
        (clf, {}, set_("Y_fit_", lambda m: m.y_fit_), "Y_fit_"),
        (clf, {}, delete("classes_"), "classes_"),
    ]


@pytest.mark.parametrize(("name", "kwargs", "tamper", "match"), _tamper_cases())
def test_check_fitted_state_refuses_tampered_models(name, kwargs, tamper, match):
    model, X, _ = _fitted(name, kwargs)
    if match == "feature_names_in_":
        model = getattr(nbattn, name)(**kwargs).fit(
            pd.DataFrame(X, columns=["a", "b"]), _xy(name)[1]
        )
    check_fitted_state(model)
    tamper(model)
    with pytest.raises(ValueError, match=match):
        check_fitted_state(model)


def test_check_fitted_state_refuses_other_objects():
    from sklearn.linear_model import LinearRegression

    X, y = _xy("NadarayaWatsonRegressor")
    with pytest.raises(ValueError, match="not an nbattn estimator"):
        check_fitted_state(LinearRegression().fit(X, y))
    with pytest.raises(ValueError, match="X_fit_|missing"):
        check_fitted_state(nbattn.NadarayaWatsonRegressor())


@pytest.mark.filterwarnings("ignore::FutureWarning")  # statsmodels' own random-state notice
@pytest.mark.parametrize("seed", range(5))
def test_matches_statsmodels_local_constant_regression(seed):
    """statsmodels' KernelReg(reg_type="lc") is the same Nadaraya-Watson estimator."""
    nonparametric = pytest.importorskip("statsmodels.nonparametric.api")
    rng = np.random.default_rng(seed)
    d = 1 + seed % 3
    X = rng.uniform(-2, 2, size=(40, d))
    y = np.cos(X.sum(axis=1)) + 0.1 * rng.normal(size=40)
    h = rng.uniform(0.2, 1.5, size=d)
    Q = rng.uniform(-2.5, 2.5, size=(15, d))
    peer = nonparametric.KernelReg(y, X, var_type="c" * d, reg_type="lc", bw=h)
    want = peer.fit(Q)[0]
    for dtype, rtol in (("float64", 1e-10), ("float32", 1e-4)):
        model = nbattn.NadarayaWatsonRegressor(bandwidth=h, dtype=dtype).fit(X, y)
        np.testing.assert_allclose(model.predict(Q), want, rtol=rtol, atol=rtol * 1e-2)


_FIT_ON_SIMULATED_GPU = """
import sys
import warnings

import numpy as np

import nbattn
from nbattn.dispatch.device import cuda_available

assert cuda_available(), "the CUDA simulator should count as a GPU"
warnings.simplefilter("ignore")
out = sys.argv[1]
rng = np.random.default_rng(0)
# one column: the leave-one-out search takes a third of the launches of two columns
# (each a slow one on the simulator); tests/cuda checks the search of two on the GPU
X = rng.uniform(-2, 2, size=(12, 1))
y = np.sin(X[:, 0]) + 0.5 * X[:, 0]
Q = rng.uniform(-2, 2, size=(5, 1))
models = {
    "nw": nbattn.NadarayaWatsonRegressor(device="auto").fit(X, y),
    "loo": nbattn.NadarayaWatsonRegressor(bandwidth="loo", device="auto").fit(X, y),
    "learned": nbattn.LearnedKernelRegressor(max_iter=2, device="auto").fit(X, y),
    "clf": nbattn.NadarayaWatsonClassifier(device="auto").fit(X, np.where(y > 0, "up", "dn")),
}
np.save(f"{out}/queries.npy", Q)
for name, model in models.items():
    nbattn.save(model, f"{out}/{name}.npz")
    result = model.predict_proba(Q) if name == "clf" else model.predict(Q)
    np.save(f"{out}/{name}.npy", result)
"""


@pytest.mark.skipif(cuda_available(), reason="needs a machine without a GPU")
def test_fitted_on_a_gpu_machine_predicts_on_a_cpu_one(tmp_path):
    """Fit with device="auto" where numba sees a GPU (the CUDA simulator, in a process of
    its own), save; load here, where there is none: the models predict, on the CPU."""
    import os
    import sys
    from pathlib import Path

    pytest.importorskip("numba.cuda")
    root = Path(nbattn.__file__).resolve().parents[1]
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    run_checked(
        [sys.executable, "-c", _FIT_ON_SIMULATED_GPU, tmp_path], cwd=root, env=env, timeout=600
    )
    Q = np.load(tmp_path / "queries.npy")
    for name in ("nw", "loo", "learned", "clf"):
        model = nbattn.load(tmp_path / f"{name}.npz")
        assert model.device == "auto"
        got = model.predict_proba(Q) if name == "clf" else model.predict(Q)
        np.testing.assert_allclose(got, np.load(tmp_path / f"{name}.npy"), rtol=1e-12)
