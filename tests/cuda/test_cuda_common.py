"""The shared CUDA pieces (simulator): device views, the kernel cache, launches, the
one online-softmax walk that pooling and the LOO loss both run."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from nbattn import config
from nbattn.cuda import common, loo, pooling
from nbattn.kernels import loo as cpu_loo
from nbattn.kernels import pooling as cpu_pooling

from ..strategies import float_dtypes, pooling_shapes, seeds

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)


def test_to_device_copies_host_arrays_and_keeps_device_arrays(rng):
    x = rng.normal(size=(4, 3))[:, ::2]  # not contiguous: copied contiguous
    device_x = common.to_device(x)
    np.testing.assert_array_equal(device_x.copy_to_host(), x)
    assert common.to_device(device_x) is device_x
    x_before = x.copy()
    device_x[0, 0] = 99.0  # the device copy does not alias the host array
    np.testing.assert_array_equal(x, x_before)


def test_compiled_builds_once_per_key():
    calls = []

    def make():
        calls.append(1)
        return object()

    first = common.compiled(("test-only", 1), make)
    assert common.compiled(("test-only", 1), make) is first
    assert common.compiled(("test-only", 2), make) is not first
    assert len(calls) == 2


def test_kernels_are_shared_per_compile_time_sizes():
    assert pooling.gaussian_pool_kernel(np.float32, 3, 2) is pooling.gaussian_pool_kernel(
        "float32", 3, 2
    )
    assert pooling.gaussian_pool_kernel(np.float32, 3, 2) is not pooling.gaussian_pool_kernel(
        np.float64, 3, 2
    )
    # the loss kernel runs the very device function pooling runs
    assert pooling.pool_row_function(np.float64, 2, 1) is pooling.pool_row_function("float64", 2, 1)


@pytest.mark.parametrize("n_items", [1, 7, 8, 9, 100])
def test_launch_covers_every_row_once(n_items):
    @cuda.jit
    def count_kernel(counts):
        i = cuda.grid(1)
        if i < counts.shape[0]:
            counts[i] += 1

    counts = cuda.to_device(np.zeros(n_items, dtype=np.int64))
    common.launch(count_kernel, n_items, (counts,))
    np.testing.assert_array_equal(counts.copy_to_host(), 1)


def test_launch_in_slices_covers_every_slice(monkeypatch):
    monkeypatch.setattr(common, "MAX_GRID_Y", 2)

    @cuda.jit
    def mark_kernel(marks):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < marks.shape[1]:
            marks[cuda.blockIdx.y, i] += 1

    marks = cuda.to_device(np.zeros((5, 11), dtype=np.int64))
    common.launch(mark_kernel, 11, lambda b0, b1: (marks[b0:b1],), n_slices=5)
    np.testing.assert_array_equal(marks.copy_to_host(), 1)


def test_tile_rows_and_shared_bytes(monkeypatch):
    monkeypatch.setattr(config, "CUDA_THREADS_PER_BLOCK", 128)
    monkeypatch.setattr(config, "CUDA_SHARED_MEMORY_BYTES", 1000)
    assert common.tile_rows(5, 8) == 25  # 1000 // 40
    assert common.tile_rows(1, 4) == 128  # capped by the threads per block
    assert common.tile_rows(1000, 8) == 1  # at least one row
    assert common.shared_bytes(5, 4) == 32  # 20 bytes rounded up to 16-byte units
    assert common.shared_bytes(8, 4) == 32


@settings(max_examples=12)
@given(
    shape=pooling_shapes(queries=11, keys=19, features=3, outputs=4),
    per_launch=st.integers(1, 3),
    dtype=float_dtypes,
    seed=seeds,
)
def test_pooling_and_loss_equal_cpu_over_random_shapes(shape, per_launch, dtype, seed):
    """Both users of the shared online-softmax walk equal their CPU twins, for any
    number of queries, keys, features, outputs and outputs per launch."""
    n_queries, n_keys, d, n_outputs = shape
    rng = np.random.default_rng(seed)
    old = config.CUDA_MAX_OUTPUTS
    config.CUDA_MAX_OUTPUTS = per_launch  # read at each call
    try:
        q = (2.0 * rng.normal(size=(n_queries, d))).astype(dtype)
        k_t = (2.0 * rng.normal(size=(d, n_keys))).astype(dtype)
        v_t = rng.normal(size=(n_outputs, n_keys)).astype(dtype)
        exclude = bool(rng.integers(2))
        out, lse = pooling.gaussian_pool(q, k_t, v_t, exclude)
        ref_out, ref_lse = cpu_pooling.gaussian_pool(q, k_t, v_t, exclude, 0)
        tol = 1e-12 if dtype == np.float64 else 2e-5
        np.testing.assert_allclose(out.copy_to_host(), ref_out, rtol=tol, atol=tol)
        np.testing.assert_allclose(lse.copy_to_host(), ref_lse, rtol=tol, atol=tol)
        targets = rng.normal(size=(n_queries, n_outputs))
        own = rng.integers(-1, n_keys, size=n_queries).astype(np.int64)
        got = loo.loo_squared_error(q, k_t, v_t, targets, own)
        ref = cpu_loo.loo_squared_error(q, k_t, v_t, targets, own)
        assert abs(got - ref) <= tol * max(1.0, abs(ref))
    finally:
        config.CUDA_MAX_OUTPUTS = old


def test_the_caching_decorator_runs_under_the_simulator():
    """``common.jit`` passes ``cache=True`` to numba's ``cuda.jit``; the simulator
    takes it and runs kernels and device functions as they are (bare and with
    options)."""

    @common.jit(device=True, inline=True)
    def twice(x):
        return 2.0 * x

    @common.jit
    def kernel(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = twice(x[i])

    x = np.arange(5, dtype=np.float64)
    out = cuda.to_device(np.zeros(5))
    kernel[1, 8](cuda.to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), 2.0 * x)
