"""NadarayaWatsonRegressor: DataFrames, multi-output, bandwidths, errors."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

import nbattn

from . import naive


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
        (dict(kernel="epanechnikov"), "kernel"),
        (dict(bandwidth=0.0), "bandwidth"),
        (dict(bandwidth="wide"), "bandwidth"),
        (dict(bandwidth=[1.0, -1.0, 1.0]), "bandwidth must be positive"),
        (dict(bandwidth=[1.0, 1.0]), "bandwidth has 2 entries"),
        (dict(device="tpu"), "device"),
        (dict(device="cuda"), "device='cuda' needs a CUDA GPU"),
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
        (lambda X, y: (X.assign(a="text"), y), "could not convert|numeric"),
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
    assert model.device_ == "cpu"
    np.testing.assert_allclose(
        model.predict(X), nbattn.NadarayaWatsonRegressor().fit(X, y).predict(X), rtol=1e-15
    )
