"""CUDA Nadaraya-Watson (simulator) equals the CPU kernel and the naive reference."""

import os

import numpy as np
import pytest

import nbattn
from nbattn.cuda import pooling as cuda_pooling
from nbattn.kernels import pooling as cpu_pooling

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    ("n_queries", "n_keys", "d", "n_outputs"), [(1, 1, 1, 1), (19, 21, 2, 3), (9, 17, 3, 10)]
)
def test_kernel_equals_cpu_kernel(rng, dtype, n_queries, n_keys, d, n_outputs):
    q = rng.normal(size=(n_queries, d)).astype(dtype)
    k_t = rng.normal(size=(d, n_keys)).astype(dtype)
    v_t = rng.normal(size=(n_outputs, n_keys)).astype(dtype)
    out, lse = cuda_pooling.gaussian_pool(q, k_t, v_t, False)
    ref_out, ref_lse = cpu_pooling.gaussian_pool(q, k_t, v_t, False, 0)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(out.copy_to_host(), ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse.copy_to_host(), ref_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [1, 2, 13])
def test_exclude_self_equals_cpu(rng, n):
    x = rng.normal(size=(n, 2))
    v = rng.normal(size=n)
    got, lse = nbattn.nadaraya_watson(
        x, x, v, 0.7, exclude_self=True, device="cuda", return_lse=True
    )
    if n == 1:
        assert got[0] == 0.0 and lse[0] == -np.inf
        return
    np.testing.assert_allclose(got, naive.nadaraya_watson(x, x, v, 0.7, True), rtol=1e-12)


def test_estimator_on_cuda_equals_cpu(rng, launches):
    X = rng.uniform(0, 3, size=(30, 2))
    y = np.sin(X[:, 0]) + X[:, 1]
    gpu = nbattn.NadarayaWatsonRegressor(device="cuda").fit(X, y)
    cpu = nbattn.NadarayaWatsonRegressor().fit(X, y)
    calls = launches(cuda_pooling, "gaussian_pool")
    np.testing.assert_allclose(gpu.predict(X[:11]), cpu.predict(X[:11]), rtol=1e-12)
    assert calls  # the prediction ran the CUDA kernel


def test_far_query_gets_nearest_value(rng):
    keys = np.array([[0.0], [1.0], [2.0]])
    got = nbattn.nadaraya_watson([[-1e4], [1e4]], keys, [10.0, 20.0, 30.0], 1.0, device="cuda")
    np.testing.assert_array_equal(got, [10.0, 30.0])


# the simulator runs the kernels on NumPy scalars, which warn where a GPU overflows quietly
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    ("dtype", "far"), [("float64", 1e160), ("float64", 1e30), ("float32", 1e30), ("float32", 1e8)]
)
def test_queries_whose_scores_overflow_get_the_nearest_value(dtype, far):
    """Far rows (beyond config.FAR_SCORE_<dtype>, or every score overflowed) are
    recomputed relative to the nearest key, as on the CPU: host and device arrays."""
    from numba import cuda

    keys = np.array([[0.0], [1.0], [2.0]])
    values = np.array([10.0, 20.0, 30.0])
    queries = np.array([[-far], [far], [1.2]])
    want = nbattn.nadaraya_watson(queries[2:], keys, values, 1.0)[0]
    from_host = nbattn.nadaraya_watson(queries, keys, values, 1.0, dtype=dtype, device="cuda")
    from_device = nbattn.nadaraya_watson(
        cuda.to_device(queries.astype(dtype)),
        cuda.to_device(keys.astype(dtype)),
        cuda.to_device(values.astype(dtype)),
        1.0,
        device="cuda",
    ).copy_to_host()
    for got in (from_host, from_device):
        np.testing.assert_array_equal(got[:2], [10.0, 30.0])
        np.testing.assert_allclose(got[2], want, rtol=1e-5 if dtype == "float32" else 1e-12)
