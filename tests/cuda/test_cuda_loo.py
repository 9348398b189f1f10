"""CUDA leave-one-out kernels (simulator) equal the CPU kernels and the naive reference."""

import os

import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.cuda import loo as cuda_loo
from nbattn.kernels import loo as cpu_loo
from nbattn.kernels import pooling as cpu_pooling
from nbattn.smoothing import loo, width_search

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

TOL = {np.float64: 1e-10, np.float32: 2e-5}


def _layout(rng, n, k, p, dtype):
    z = rng.normal(size=(n, k)).astype(dtype)
    y = rng.normal(size=(n, p))
    z_t = np.ascontiguousarray(z.T)
    v_t = np.ascontiguousarray(y.T, dtype=dtype)
    return z, z_t, y, v_t


def _close(got, ref, dtype):
    scale = max(np.abs(ref).max(), 1e-300)
    assert np.abs(np.asarray(got) - ref).max() <= TOL[dtype] * scale


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("n", "k", "p"), [(1, 1, 1), (13, 2, 1), (10, 3, 10)])
def test_squared_error_equals_cpu(rng, dtype, n, k, p):
    """Full LOO sum, partial tiles (TPB 8), n = 1 (no admissible key), p > CUDA_MAX_OUTPUTS."""
    z, z_t, y, v_t = _layout(rng, n, k, p, dtype)
    rows = np.arange(n, dtype=np.int64)
    got = cuda_loo.loo_squared_error(z, z_t, v_t, y, rows)
    _close(got, cpu_loo.loo_squared_error(z, z_t, v_t, y, rows), dtype)


def test_squared_error_subset_equals_cpu(rng):
    z, z_t, y, v_t = _layout(rng, 17, 2, 1, np.float64)
    rows = np.array([0, 5, 9, 16], dtype=np.int64)
    zq = np.ascontiguousarray(z[rows])
    got = cuda_loo.loo_squared_error(zq, z_t, v_t, y[rows], rows)
    _close(got, cpu_loo.loo_squared_error(zq, z_t, v_t, y[rows], rows), np.float64)


def _pass_one(z, z_t, y, v_t, dtype):
    f, lse = cpu_pooling.gaussian_pool(z, z_t, v_t, True, 0)
    f = f.astype(np.float64)
    return np.ascontiguousarray(f - y, dtype=dtype), np.ascontiguousarray(f, dtype=dtype), lse


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_grad_diag_equals_cpu(rng, dtype):
    z, z_t, y, v_t = _layout(rng, 11, 3, 2, dtype)
    resid, f, lse = _pass_one(z, z_t, y, v_t, dtype)
    got = cuda_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
    assert got.dtype == np.float64 and got.shape == (3,)
    _close(got, cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0), dtype)


def test_grad_diag_more_features_than_max_acc(rng, monkeypatch):
    """Features beyond config.CUDA_MAX_GRAD_ENTRIES run in further launches."""
    monkeypatch.setattr(config, "CUDA_MAX_GRAD_ENTRIES", 2)  # read by the wrapper at each call
    z, z_t, y, v_t = _layout(rng, 9, 5, 1, np.float64)
    resid, f, lse = _pass_one(z, z_t, y, v_t, np.float64)
    got = cuda_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
    _close(got, cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0), np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_grad_full_equals_the_dense_sums(rng, dtype):
    """k = 2 components of d = 3 points; the d x d result is symmetric. The reference is
    NumPy (naive.loo_grad_sums_full, float64): the CPU's loo_grad_full runs in no CPU
    path (the CPU fits on loo tiles), so comparing with it compiled it here, in the
    simulator's process, on every cold run (worst over 10 seeds against the dense
    sums: float64 9e-16, float32 8e-7 of the largest entry)."""
    n, d = 11, 3
    x = rng.normal(size=(n, d))
    L = rng.normal(size=(2, d))
    z = np.ascontiguousarray(x @ L.T / np.sqrt(2.0), dtype=dtype)
    z_t = np.ascontiguousarray(z.T)
    y = rng.normal(size=(n, 2))
    v_t = np.ascontiguousarray(y.T, dtype=dtype)
    resid, f, lse = _pass_one(z, z_t, y, v_t, dtype)
    pts = np.ascontiguousarray(x, dtype=dtype)
    pts_t = np.ascontiguousarray(pts.T)
    got = cuda_loo.loo_grad_full(z, z_t, pts, pts_t, v_t, resid, f, lse)
    ref = naive.loo_grad_sums_full(z, pts, v_t, resid, f, lse)
    assert got.shape == (d, d)
    np.testing.assert_array_equal(got, got.T)
    _close(got, ref, dtype)


def test_skipped_query_with_no_key(rng):
    """lse = -inf (no admissible key) contributes nothing, as on the CPU."""
    z, z_t, y, v_t = _layout(rng, 6, 2, 1, np.float64)
    resid, f, lse = _pass_one(z, z_t, y, v_t, np.float64)
    lse[2] = -np.inf
    got = cuda_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
    _close(got, cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0), np.float64)


@pytest.mark.parametrize("metric", ["diagonal", "full"])
def test_loss_and_grad_on_cuda_equal_cpu_and_naive(rng, metric):
    X = rng.normal(size=(12, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=12)
    kwargs = {"bandwidth": np.array([0.7, 1.3])} if metric == "diagonal" else {}
    if metric == "full":
        kwargs["components"] = rng.normal(size=(2, 2))
    loss, grad = loo.loo_loss_and_grad(X, y, device="cuda", **kwargs)
    ref_loss, ref_grad = loo.loo_loss_and_grad(X, y, **kwargs)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)
    if metric == "diagonal":
        expected = naive.loo_grad(X, y, bandwidth=kwargs["bandwidth"])
        np.testing.assert_allclose(grad, expected, rtol=1e-9)
        assert loo.loo_loss(X, y, kwargs["bandwidth"], device="cuda") == pytest.approx(
            naive.loo_loss(X, y, bandwidth=kwargs["bandwidth"]), rel=1e-10
        )


def test_loo_bandwidth_on_cuda_equals_cpu_in_1d(rng):
    """1-D: the GPU evaluates the full kernel where the CPU uses the sorted window."""
    x = rng.uniform(0, 4, size=12)
    y = np.sin(2 * x) + 0.2 * rng.normal(size=12)
    grid = [0.5, 2.0]
    got = width_search.loo_bandwidth(x, y, grid=grid, xatol=0.3, device="cuda")
    ref = width_search.loo_bandwidth(x, y, grid=grid, xatol=0.3)
    np.testing.assert_allclose(got, ref, rtol=1e-8)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_learned_kernel_regressor_on_cuda(rng, launches):
    X = rng.normal(size=(14, 2))
    y = X[:, 0] ** 2
    calls = launches(cuda_loo, "loo_grad_diag")
    gpu = nbattn.LearnedKernelRegressor(max_iter=2, device="cuda").fit(X, y)
    assert calls  # the fit ran the CUDA gradient kernel
    cpu = nbattn.LearnedKernelRegressor(max_iter=2).fit(X, y)
    np.testing.assert_allclose(gpu.bandwidth_, cpu.bandwidth_, rtol=1e-8)
    np.testing.assert_allclose(gpu.predict(X[:3]), cpu.predict(X[:3]), rtol=1e-8)


def test_loo_bandwidth_regressor_on_cuda(rng):
    X = rng.normal(size=(12, 2))
    y = X[:, 0] - X[:, 1] ** 2
    gpu = nbattn.NadarayaWatsonRegressor(bandwidth="loo", device="cuda").fit(X, y)
    cpu = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(X, y)
    np.testing.assert_allclose(gpu.bandwidth_, cpu.bandwidth_, rtol=1e-8)


def test_tiles_smaller_than_the_block(rng, monkeypatch):
    """A small shared-memory budget gives key tiles of 2 or 3 for blocks of 8 threads."""
    from nbattn import config
    from nbattn.cuda import pooling as cuda_pooling

    monkeypatch.setattr(config, "CUDA_SHARED_MEMORY_BYTES", 2 * 5 * 8)
    z, z_t, y, v_t = _layout(rng, 11, 3, 2, np.float64)
    rows = np.arange(11, dtype=np.int64)
    got = cuda_loo.loo_squared_error(z, z_t, v_t, y, rows)
    _close(got, cpu_loo.loo_squared_error(z, z_t, v_t, y, rows), np.float64)
    resid, f, lse = _pass_one(z, z_t, y, v_t, np.float64)
    got = cuda_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
    _close(got, cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0), np.float64)
    out, lse_gpu = cuda_pooling.gaussian_pool(z, z_t, v_t, True)
    ref_out, ref_lse = cpu_pooling.gaussian_pool(z, z_t, v_t, True, 0)
    _close(out.copy_to_host(), ref_out, np.float64)
    _close(lse_gpu.copy_to_host(), ref_lse, np.float64)


def test_self_offset_blocks_sum_to_the_whole(rng):
    """Query rows a:b with self_offset=a (the CPU contract for partitioned sums):
    the pool's rows and the gradients' block sums equal the whole-range CPU results."""
    from nbattn.cuda import pooling as cuda_pooling

    n, a = 12, 5
    z, z_t, y, v_t = _layout(rng, n, 2, 2, np.float64)
    x = rng.normal(size=(n, 3))
    resid, f, lse = _pass_one(z, z_t, y, v_t, np.float64)
    out, lse_part = cuda_pooling.gaussian_pool(z[a:], z_t, v_t, True, a)
    _close(out.copy_to_host(), f[a:], np.float64)
    _close(lse_part.copy_to_host(), lse[a:], np.float64)
    diag = sum(
        cuda_loo.loo_grad_diag(z[lo:hi], z_t, v_t, resid[lo:hi], f[lo:hi], lse[lo:hi], lo)
        for lo, hi in ((0, a), (a, n))
    )
    _close(diag, cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0), np.float64)
    x_t = np.ascontiguousarray(x.T)
    full = sum(
        cuda_loo.loo_grad_full(
            z[lo:hi], z_t, x[lo:hi], x_t, v_t, resid[lo:hi], f[lo:hi], lse[lo:hi], lo
        )
        for lo, hi in ((0, a), (a, n))
    )
    _close(full, cpu_loo.loo_grad_full(z, z_t, x, x_t, v_t, resid, f, lse, 0), np.float64)
