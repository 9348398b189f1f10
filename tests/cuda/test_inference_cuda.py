"""The inference on the GPU engine (simulator): significance tests, bootstrap bands, AICc
and the partially linear model with device="cuda" equal device="cpu" (tiny shapes: the
simulator runs every thread in Python)."""

import os

import numpy as np
import pandas as pd
import pytest

import nbattn

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)


def _table(rng, n=14):
    return pd.DataFrame(
        {
            "x": rng.uniform(-1, 1, n),
            "z": rng.uniform(-1, 1, n),
            "c": pd.Categorical(rng.integers(0, 3, n)),
        }
    )


def _pair(cls, **params):
    return cls(device="cpu", **params), cls(device="cuda", **params)


def test_significance_and_bands_on_the_gpu_equal_the_cpu(rng):
    frame = _table(rng)
    y = np.sin(2 * frame.x.to_numpy()) + rng.normal(0, 0.2, len(frame))
    cpu, gpu = _pair(nbattn.LocalPolynomialRegressor, degree=1, bandwidth=[0.6, 0.8, 0.3])
    cpu.fit(frame, y)
    gpu.fit(frame, y)
    a = cpu.significance_test(frame, y, joint=["x", "c"], columns=None, n_boot=5)
    b = gpu.significance_test(frame, y, joint=["x", "c"], columns=None, n_boot=5)
    np.testing.assert_allclose(b.statistic, a.statistic, rtol=1e-9)
    np.testing.assert_array_equal(b.p_value, a.p_value)
    band_cpu = cpu.predict_interval(frame[:3], alpha=0.4, method="bootstrap", n_boot=7)
    band_gpu = gpu.predict_interval(frame[:3], alpha=0.4, method="bootstrap", n_boot=7)
    np.testing.assert_allclose(band_gpu, band_cpu, rtol=1e-9, atol=1e-12)


def test_aicc_widths_and_the_partially_linear_model_on_the_gpu_equal_the_cpu(rng):
    X = rng.uniform(-1, 1, (12, 2))
    y = 0.7 * X[:, 0] + np.cos(2 * X[:, 1]) + rng.normal(0, 0.1, 12)
    from nbattn.local.aicc import local_aicc

    widths = np.array([0.5, 0.7])
    cpu_value = local_aicc(X, y, widths, degree=1, device="cpu")
    gpu_value = local_aicc(X, y, widths, degree=1, device="cuda")
    assert gpu_value == pytest.approx(cpu_value, rel=1e-10)
    cpu, gpu = _pair(nbattn.PartiallyLinearRegressor, linear_columns=[0], bandwidth=0.6)
    np.testing.assert_allclose(gpu.fit(X, y).coef_, cpu.fit(X, y).coef_, rtol=1e-9)
    np.testing.assert_allclose(gpu.coef_se_, cpu.coef_se_, rtol=1e-9)
