"""CUDA twins of the diagnostics (simulator): the weight matrix and the spread.

``nbattn.cuda.pooling.gaussian_weights`` and ``nbattn.cuda.loo.gaussian_spread``
equal their CPU kernels and the full-matrix references of tests/naive.py, and
the estimators with device="cuda" run them.
"""

import os

import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.cuda import loo as cuda_loo
from nbattn.cuda import pooling as cuda_pooling
from nbattn.kernels import loo as cpu_loo
from nbattn.kernels import pooling as cpu_pooling
from nbattn.smoothing import regression

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

SHAPES = [(1, 1, 1), (7, 5, 1), (12, 19, 2), (17, 9, 3)]  # (n_queries, n_keys, d)
DRAWS = 4


def _tol(dtype):
    return 1e-12 if dtype == np.float64 else 2e-5


def _layout(queries, keys, h, dtype):
    """The kernels' layout: rows scaled by 1 / (h sqrt 2), keys feature-major."""
    scale = 1.0 / (h * np.sqrt(2.0))
    q = np.ascontiguousarray(queries * scale, dtype=dtype)
    k_t = np.ascontiguousarray((keys * scale).T, dtype=dtype)
    return q, k_t


def _draw(rng, n_queries, n_keys, d, self_queries):
    keys = rng.normal(size=(n_keys, d))
    queries = keys[:n_queries].copy() if self_queries else rng.normal(size=(n_queries, d))
    return queries, keys, float(rng.uniform(0.3, 1.5))


# ------------------------------------------------------------------ weights


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("n_queries", "n_keys", "d"), SHAPES)
@pytest.mark.parametrize("exclude_self", [False, True])
def test_weights_equal_cpu_kernel_and_naive(rng, dtype, n_queries, n_keys, d, exclude_self):
    for _ in range(DRAWS):
        queries, keys, h = _draw(rng, n_queries, n_keys, d, exclude_self and n_queries <= n_keys)
        q, k_t = _layout(queries, keys, h, dtype)
        got = cuda_pooling.gaussian_weights(q, k_t, exclude_self)
        assert isinstance(got, np.ndarray) and got.dtype == dtype
        assert got.shape == (n_queries, n_keys)
        cpu = cpu_pooling.gaussian_weights(q, k_t, exclude_self)
        ref = naive.nadaraya_watson_weights(
            q.astype(np.float64), k_t.T.astype(np.float64), np.sqrt(0.5), exclude_self
        )
        tol = _tol(dtype)
        np.testing.assert_allclose(got, cpu, rtol=tol, atol=tol)
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_weights_exclude_self_with_more_queries_than_keys(rng):
    """Only the pairs (i, i) with i < n_keys are left out, as on the CPU."""
    for _ in range(DRAWS):
        q, k_t = _layout(rng.normal(size=(9, 2)), rng.normal(size=(4, 2)), 0.8, np.float64)
        got = cuda_pooling.gaussian_weights(q, k_t, True)
        np.testing.assert_allclose(got, cpu_pooling.gaussian_weights(q, k_t, True), rtol=1e-12)
        assert np.all(got[np.arange(4), np.arange(4)] == 0.0)
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-12)


def test_weights_over_several_query_launches(rng, monkeypatch):
    """More queries than the grid's y dimension takes run in several launches."""
    from nbattn.cuda import common

    monkeypatch.setattr(common, "MAX_GRID_Y", 3)
    for _ in range(DRAWS):
        x = rng.normal(size=(10, 2))
        q, k_t = _layout(x, x, 0.9, np.float64)
        for exclude_self in (False, True):
            got = cuda_pooling.gaussian_weights(q, k_t, exclude_self)
            want = cpu_pooling.gaussian_weights(q, k_t, exclude_self)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_weights_row_without_admissible_key_is_zero():
    q = np.array([[0.3]])
    got = cuda_pooling.gaussian_weights(q, np.ascontiguousarray(q.T), True)
    np.testing.assert_array_equal(got, [[0.0]])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_weights_of_far_queries(dtype):
    """Far from every key: all weight on the nearest key, and a tie between two
    equally near keys splits it in halves (in float32 too, where the shift by
    lse = m + log 2 would round away the log 2)."""
    keys = np.array([[-1.0, 0.0], [1.0, 0.0], [30.0, 0.0]])
    queries = np.array([[-1e4, 0.0], [1e4, 0.0], [0.0, 1e4]])
    q, k_t = _layout(queries, keys, 1.0, dtype)
    got = cuda_pooling.gaussian_weights(q, k_t, False)
    np.testing.assert_array_equal(got[:2], [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(got[2], [0.5, 0.5, 0.0], rtol=_tol(dtype), atol=1e-30)
    np.testing.assert_allclose(got, cpu_pooling.gaussian_weights(q, k_t, False), rtol=_tol(dtype))


def test_weights_public_function_on_cuda_equals_cpu(rng):
    for _ in range(DRAWS):
        x = rng.normal(size=(11, 2))
        queries = rng.normal(size=(6, 2))
        for exclude_self, q in ((False, queries), (True, x)):
            cpu = nbattn.smoothing.regression.gaussian_attention_weights(q, x, 0.6, exclude_self)
            gpu = nbattn.smoothing.regression.gaussian_attention_weights(
                q, x, 0.6, exclude_self, device="cuda"
            )
            np.testing.assert_allclose(gpu, cpu, rtol=1e-12, atol=1e-15)
            ref = naive.nadaraya_watson_weights(q, x, 0.6, exclude_self)
            np.testing.assert_allclose(gpu, ref, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------- spread


def _naive_spread(queries, keys, values_2d, h, exclude_self):
    """var_ic = sum_j w_ij (v_jc - f_ic)^2 and sum_j w_ij^2 from the full weight matrix."""
    w = naive.nadaraya_watson_weights(queries, keys, h, exclude_self)
    f = w @ values_2d
    var = np.einsum("ij,ijc->ic", w, (values_2d[None, :, :] - f[:, None, :]) ** 2)
    return var, np.sum(w**2, axis=1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("n_queries", "n_keys", "d"), SHAPES)
@pytest.mark.parametrize("n_outputs", [1, 3])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_spread_equals_cpu_kernel_and_naive(
    rng, dtype, n_queries, n_keys, d, n_outputs, exclude_self
):
    for _ in range(DRAWS):
        queries, keys, h = _draw(rng, n_queries, n_keys, d, exclude_self and n_queries <= n_keys)
        values = rng.normal(size=(n_keys, n_outputs)) * 3.0 + 1.0
        q, k_t = _layout(queries, keys, h, dtype)
        v_t = np.ascontiguousarray(values.T, dtype=dtype)
        mean, lse = cpu_pooling.gaussian_pool(q, k_t, v_t, exclude_self, 0)
        got_std, got_w2 = cuda_loo.gaussian_spread(q, k_t, v_t, mean, lse, exclude_self)
        for got in (got_std, got_w2):
            assert isinstance(got, np.ndarray) and got.dtype == np.float64
        assert got_std.shape == (n_queries, n_outputs) and got_w2.shape == (n_queries,)
        cpu_std, cpu_w2 = cpu_loo.gaussian_spread(q, k_t, v_t, mean, lse, exclude_self)
        # compared as variances: the square root magnifies rounding near 0
        got_var, cpu_var = got_std**2, cpu_std**2
        tol = _tol(dtype)
        scale = float(np.max(np.abs(cpu_var), initial=1.0))
        np.testing.assert_allclose(got_var, cpu_var, rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(got_w2, cpu_w2, rtol=tol, atol=tol)
        ref_var, ref_w2 = _naive_spread(
            q.astype(np.float64), k_t.T.astype(np.float64), values, np.sqrt(0.5), exclude_self
        )
        if dtype == np.float64:
            np.testing.assert_allclose(got_var, ref_var, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(got_w2, ref_w2, rtol=1e-10, atol=1e-12)
        else:  # float32 inputs: values and centers rounded to float32
            np.testing.assert_allclose(got_var, ref_var, rtol=1e-4, atol=1e-4 * scale)
            np.testing.assert_allclose(got_w2, ref_w2, rtol=1e-4, atol=1e-5)


def test_spread_without_admissible_key_is_zero():
    q = np.array([[0.2, -0.4]])
    k_t = np.ascontiguousarray(q.T)
    v_t = np.array([[5.0]])
    mean, lse = cpu_pooling.gaussian_pool(q, k_t, v_t, True, 0)
    assert lse[0] == -np.inf
    std, sum_w2 = cuda_loo.gaussian_spread(q, k_t, v_t, mean, lse, True)
    np.testing.assert_array_equal(std, [[0.0]])
    np.testing.assert_array_equal(sum_w2, [0.0])


def test_spread_of_a_far_query_is_its_nearest_key():
    keys = np.array([[0.0], [1.0], [2.0]])
    q, k_t = _layout(np.array([[-1e4], [1e4]]), keys, 1.0, np.float64)
    v_t = np.array([[10.0, 20.0, 30.0]])
    mean, lse = cpu_pooling.gaussian_pool(q, k_t, v_t, False, 0)
    std, sum_w2 = cuda_loo.gaussian_spread(q, k_t, v_t, mean, lse, False)
    np.testing.assert_array_equal(std, [[0.0], [0.0]])
    np.testing.assert_allclose(sum_w2, [1.0, 1.0], rtol=1e-12)


def test_spread_over_several_launches_and_from_device_pool(rng, monkeypatch):
    """More outputs than config.CUDA_MAX_OUTPUTS run in several launches; the
    centers and lse may come straight from the CUDA pool (device arrays)."""
    monkeypatch.setattr(config, "CUDA_MAX_OUTPUTS", 2)
    for _ in range(DRAWS):
        q, k_t = _layout(rng.normal(size=(10, 2)), rng.normal(size=(13, 2)), 0.7, np.float64)
        v_t = rng.normal(size=(5, 13))
        mean, lse = cuda_pooling.gaussian_pool(q, k_t, v_t, False)
        std, sum_w2 = cuda_loo.gaussian_spread(q, k_t, v_t, mean, lse, False)
        cpu_mean, cpu_lse = cpu_pooling.gaussian_pool(q, k_t, v_t, False, 0)
        cpu_std, cpu_w2 = cpu_loo.gaussian_spread(q, k_t, v_t, cpu_mean, cpu_lse, False)
        np.testing.assert_allclose(std**2, cpu_std**2, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(sum_w2, cpu_w2, rtol=1e-12)


@pytest.mark.parametrize("n_outputs", [None, 2])
def test_spread_public_function_on_cuda_equals_cpu(rng, n_outputs):
    for _ in range(DRAWS):
        x = rng.normal(size=(15, 2))
        queries = rng.normal(size=(7, 2))
        y = rng.normal(size=15 if n_outputs is None else (15, n_outputs))
        gpu = regression.nadaraya_watson_spread(queries, x, y, 0.5, device="cuda")
        cpu = regression.nadaraya_watson_spread(queries, x, y, 0.5)
        ref = naive.weighted_spread(queries, x, y, 0.5)
        for got, want, expected in zip(gpu, cpu, ref):
            assert isinstance(got, np.ndarray) and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------- estimators


def test_estimator_diagnostics_on_cuda_equal_cpu(rng, launches):
    X = rng.uniform(0, 3, size=(25, 2))
    y = np.sin(X[:, 0]) + X[:, 1]
    gpu = nbattn.NadarayaWatsonRegressor(device="cuda").fit(X, y)
    cpu = nbattn.NadarayaWatsonRegressor().fit(X, y)
    launches(cuda_pooling, "gaussian_weights")
    calls = launches(cuda_loo, "gaussian_spread")
    queries = X[:9] + 0.1

    np.testing.assert_allclose(
        gpu.attention_weights(queries), cpu.attention_weights(queries), rtol=1e-12, atol=1e-15
    )
    assert calls == ["gaussian_weights"]
    mean, std = gpu.predict(queries, return_std=True)
    cpu_mean, cpu_std = cpu.predict(queries, return_std=True)
    np.testing.assert_allclose(mean, cpu_mean, rtol=1e-12)
    np.testing.assert_allclose(std, cpu_std, rtol=1e-10, atol=1e-14)
    assert calls == ["gaussian_weights", "gaussian_spread"]
    np.testing.assert_allclose(
        gpu.effective_n_neighbors(queries), cpu.effective_n_neighbors(queries), rtol=1e-12
    )
    assert calls == ["gaussian_weights", "gaussian_spread", "gaussian_spread"]


def test_spread_of_huge_values_keeps_its_scale(rng):
    """Values near 1e200: the deviations are scaled by a power of two before squaring."""
    for _ in range(DRAWS):
        q, k_t = _layout(rng.normal(size=(6, 2)), rng.normal(size=(9, 2)), 0.8, np.float64)
        v_t = rng.normal(size=(2, 9))
        mean, lse = cpu_pooling.gaussian_pool(q, k_t, v_t, False, 0)
        small, _ = cuda_loo.gaussian_spread(q, k_t, v_t, mean, lse, False)
        huge, _ = cuda_loo.gaussian_spread(q, k_t, v_t * 1e200, mean * 1e200, lse, False)
        assert np.isfinite(huge).all()
        np.testing.assert_allclose(huge, small * 1e200, rtol=1e-10)
