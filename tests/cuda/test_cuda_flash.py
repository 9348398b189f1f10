"""CUDA flash attention (simulator) equals the CPU kernels and the naive reference."""

import os

import numpy as np
import pytest
from numba import cuda

import nbattn
from nbattn.cuda import common
from nbattn.cuda import flash as cuda_flash

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

TOL = {np.float64: 1e-10, np.float32: 2e-5}


def assert_close_to_scale(got, ref, tol):
    """Equal non-finite entries; finite ones within ``tol`` times the reference's largest entry."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_array_equal(got[~finite], ref[~finite])
    scale = max(np.abs(ref[finite]).max(initial=0.0), 1e-30)
    assert np.abs(got[finite] - ref[finite]).max(initial=0.0) <= tol * scale


def _close(got, ref, dtype):
    assert_close_to_scale(got, ref, TOL[dtype])


def _qkv(rng, shape_q, n_keys, d_v, dtype):
    *lead, n_q, d = shape_q
    q = rng.normal(size=shape_q).astype(dtype)
    k = rng.normal(size=(*lead, n_keys, d)).astype(dtype)
    v = rng.normal(size=(*lead, n_keys, d_v)).astype(dtype)
    return q, k, v


# (q shape, S, Dv): partial tiles (TPB 8), L != S both ways, N = 1, batch and heads
SHAPES = [((2, 11, 3), 13, 2), ((1, 2, 13, 4), 5, 3), ((1, 1, 3), 1, 1), ((9, 2), 17, 5)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("shape_q", "n_keys", "d_v"), SHAPES)
def test_forward_and_backward_equal_cpu(rng, dtype, causal, shape_q, n_keys, d_v):
    q, k, v = _qkv(rng, shape_q, n_keys, d_v, dtype)
    out, lse = nbattn.flash_attention(q, k, v, causal, return_lse=True, device="cuda")
    ref_out, ref_lse = nbattn.flash_attention(q, k, v, causal, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == dtype and lse.dtype == np.float64
    _close(out, ref_out, dtype)
    _close(lse, ref_lse, dtype)
    grad = rng.normal(size=out.shape).astype(dtype)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, causal, device="cuda")
    ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, grad, causal)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == dtype
        _close(g, r, dtype)


def test_against_naive_with_scale(rng):
    q, k, v = _qkv(rng, (2, 10, 3), 9, 4, np.float64)
    out, lse = nbattn.flash_attention(q, k, v, True, 0.3, return_lse=True, device="cuda")
    ref_out, ref_lse = naive.sdpa(q, k, v, causal=True, scale=0.3)
    _close(out, ref_out, np.float64)
    _close(lse, ref_lse, np.float64)
    grad = rng.normal(size=out.shape)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, True, 0.3, device="cuda")
    for g, r in zip(got, naive.sdpa_backward(q, k, v, grad, True, 0.3), strict=True):
        _close(g, r, np.float64)


def test_rows_without_keys(rng):
    """lse = -inf rows (what a fully masked row gives) get zero gradients, as on the CPU;
    the forward kernel writes zeros and lse = -inf when a row has no key at all."""
    q, k, v = _qkv(rng, (1, 6, 2), 7, 2, np.float64)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True)
    out[0, 2], lse[0, 2] = 0.0, -np.inf
    grad = rng.normal(size=out.shape)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, device="cuda")
    ref = nbattn.flash_attention_backward(q, k, v, out, lse, grad)
    np.testing.assert_array_equal(got[0][0, 2], 0.0)
    for g, r in zip(got, ref, strict=True):
        _close(g, r, np.float64)
    empty_out, empty_lse = cuda_flash.flash_forward(q[:, :, :], k[:, :0], v[:, :0], 1.0, False)
    np.testing.assert_array_equal(empty_out.copy_to_host(), 0.0)
    np.testing.assert_array_equal(empty_lse.copy_to_host(), -np.inf)


def test_broadcast_leading_dimensions(rng):
    q = rng.normal(size=(2, 3, 5, 4))
    k = rng.normal(size=(1, 3, 6, 4))
    v = rng.normal(size=(6, 2))
    out = nbattn.flash_attention(q, k, v, device="cuda")
    _close(out, nbattn.flash_attention(q, k, v), np.float64)
    grad = rng.normal(size=out.shape)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, device="cuda")
    ref = nbattn.flash_attention_backward(q, k, v, out, lse, grad)
    for g, r in zip(got, ref, strict=True):
        _close(g, r, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_device_arrays_in_device_arrays_out(rng, dtype):
    q, k, v = _qkv(rng, (2, 9, 3), 10, 2, dtype)
    dq_, dk_, dv_ = (cuda.to_device(a) for a in (q, k, v))
    out, lse = nbattn.flash_attention(dq_, dk_, dv_, True, return_lse=True, device="auto")
    assert not isinstance(out, np.ndarray) and out.shape == (2, 9, 2) and lse.shape == (2, 9)
    ref_out, ref_lse = nbattn.flash_attention(q, k, v, True, return_lse=True)
    _close(out.copy_to_host(), ref_out, dtype)
    _close(lse.copy_to_host(), ref_lse, dtype)
    grad = rng.normal(size=ref_out.shape).astype(dtype)
    got = nbattn.flash_attention_backward(
        dq_, dk_, dv_, out, lse, cuda.to_device(grad), True, device="cuda"
    )
    ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, grad, True)
    for g, r in zip(got, ref, strict=True):
        assert not isinstance(g, np.ndarray)
        _close(g.copy_to_host(), r, dtype)


def test_device_input_errors(rng):
    q = rng.normal(size=(1, 4, 3))
    with pytest.raises(ValueError, match="GPU arrays need device"):
        nbattn.flash_attention(cuda.to_device(q), q, q, device="cpu")
    bad = q.copy()
    bad[0, 1, 2] = np.inf
    with pytest.raises(ValueError, match="k contains NaN or inf"):
        nbattn.flash_attention(
            cuda.to_device(q), cuda.to_device(bad), cuda.to_device(q), device="cuda"
        )
    with pytest.raises(ValueError, match="share one dtype"):
        nbattn.flash_attention(
            cuda.to_device(q),
            cuda.to_device(q.astype(np.float32)),
            cuda.to_device(q),
            device="cuda",
        )
    with pytest.raises(ValueError, match="equal leading dimensions"):
        nbattn.flash_attention(
            cuda.to_device(q), cuda.to_device(q[0]), cuda.to_device(q[0]), device="cuda"
        )


def test_head_dimension_limit(rng):
    q = rng.normal(size=(1, cuda_flash.MAX_HEAD_DIM + 1))
    with pytest.raises(ValueError, match="head dimensions up to"):
        nbattn.flash_attention(q, q, q, device="cuda")


def test_head_dimension_limit_is_read_at_call_time(rng, monkeypatch):
    from nbattn import config

    monkeypatch.setattr(config, "CUDA_MAX_HEAD_DIM", 4)
    assert cuda_flash.MAX_HEAD_DIM == 4
    q = rng.normal(size=(1, 5))
    with pytest.raises(ValueError, match="head dimensions up to 4"):
        nbattn.flash_attention(q, q, q, device="cuda")
    with pytest.raises(ValueError, match="up to 4"):
        cuda_flash.flash_forward(q[None], q[None], q[None], 1.0, False)


def test_tiles_smaller_than_the_block(rng, monkeypatch):
    """A small shared-memory budget gives tiles of 3 rows for blocks of 8 threads."""
    from nbattn import config

    q, k, v = _qkv(rng, (1, 10, 4), 11, 4, np.float64)
    monkeypatch.setattr(config, "CUDA_SHARED_MEMORY_BYTES", 3 * (4 + 4 + 2) * 8)
    for causal in (False, True):
        out, lse = nbattn.flash_attention(q, k, v, causal, return_lse=True, device="cuda")
        ref_out, ref_lse = naive.sdpa(q, k, v, causal)
        _close(out, ref_out, np.float64)
        grad = rng.normal(size=out.shape)
        got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, causal, device="cuda")
        for g, r in zip(got, naive.sdpa_backward(q, k, v, grad, causal), strict=True):
            _close(g, r, np.float64)


def test_slices_in_several_launches(rng, monkeypatch):
    """More (batch, head) slices than one grid's y dimension: launched in chunks."""
    monkeypatch.setattr(common, "MAX_GRID_Y", 2)
    q, k, v = _qkv(rng, (5, 6, 3), 7, 2, np.float64)
    out, lse = nbattn.flash_attention(q, k, v, True, return_lse=True, device="cuda")
    ref_out, ref_lse = naive.sdpa(q, k, v, causal=True)
    _close(out, ref_out, np.float64)
    grad = rng.normal(size=out.shape)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, True, device="cuda")
    for g, r in zip(got, naive.sdpa_backward(q, k, v, grad, causal=True), strict=True):
        _close(g, r, np.float64)


def test_short_sequences_get_smaller_blocks(monkeypatch):
    from nbattn import config

    monkeypatch.setattr(config, "CUDA_THREADS_PER_BLOCK", 128)
    monkeypatch.setattr(common, "multiprocessors", lambda: 100)
    assert common.threads_for(1024, 8) == 32  # 8 x 8 blocks of 128 < 200: halve twice
    assert common.threads_for(16384, 8) == 128
    assert common.threads_for(2400, 8) == 64  # 19 x 8 < 200 <= 38 x 8
    assert common.threads_for(100_000) == 128
