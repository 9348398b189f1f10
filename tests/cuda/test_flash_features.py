"""The CUDA flash kernels' optional terms (simulator) against the NumPy reference.

Masks (boolean, float, key padding, per-row), grouped-query and broadcast
K/V slices, the band (causal, windows, bottom-right alignment), ALiBi,
softcap and dropout, forward and backward, called with the CPU kernel's
arguments (base-2 q, mask, slopes and softcap; ``nbattn.kernels.flash``);
and the dropout device function bit for bit against the Python-integer
reference and the CPU kernel.
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from nbattn._core.attn_groups import NO_DROPOUT, Band, Bias, Dropout, ScoreTransform, Tiles
from nbattn._core.numeric import dropout_seed, dropout_threshold
from nbattn.cuda import dropout as cuda_dropout
from nbattn.cuda import flash as cuda_flash

from .. import naive
from ..strategies import seeds
from .test_cuda_flash import assert_close_to_scale

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

LOG2E = 1.4426950408889634
TOL = {np.float64: 1e-10, np.float32: 3e-5}
FAR = 10**6  # a band side this wide is unbounded


def _close(got, ref, dtype):
    assert_close_to_scale(got, ref, TOL[dtype])


# --------------------------------------------------------------------------- dropout bits
@cuda.jit
def _keep_kernel(seed, counts, threshold, out):
    i = cuda.grid(1)
    if i < counts.size:
        out[i] = cuda_dropout.keep(seed, counts[i], threshold)


@cuda.jit
def _counter_kernel(bh, i, j, n_q, n_k, out):
    out[0] = cuda_dropout.counter(bh[0], i[0], j[0], n_q[0], n_k[0])


def _device_keep(seed, counts, threshold):
    out = np.zeros(counts.size, dtype=np.bool_)
    _keep_kernel[-(-counts.size // 64), 64](np.uint64(seed), counts, np.uint64(threshold), out)
    return out


def _counts(rng, n):
    """Counters over the whole uint64 range, with the wrap-around ends."""
    counts = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    counts[:4] = [0, 1, 2**64 - 1, 2**64 - 2]
    return counts


def test_keep_equals_the_integer_reference(rng):
    for seed, p in ((0, 0.5), (2**64 - 1, 0.1), (123456789, 0.9), (2**63, 1 / 2**24)):
        threshold = round(p * 2**24)
        counts = _counts(rng, 96)
        got = _device_keep(seed, counts, threshold)
        ref = [naive.dropout_keep(seed, int(c), threshold) for c in counts]
        np.testing.assert_array_equal(got, ref)


def test_keep_equals_the_cpu_kernel(rng):
    """Bit for bit the CPU's ``keep`` over many counters, seeds and thresholds."""
    cpu = pytest.importorskip("nbattn.kernels.dropout")
    from numba import njit

    @njit
    def cpu_keep(seed, counts, threshold):
        out = np.zeros(counts.size, dtype=np.bool_)
        for n in range(counts.size):
            out[n] = cpu.keep(seed, counts[n], threshold)
        return out

    for seed in (np.uint64(0), np.uint64(2**64 - 3), dropout_seed(7)):
        for p in (0.0, 0.25, 0.5, 0.97):
            threshold = dropout_threshold(p)
            counts = _counts(rng, 256)
            np.testing.assert_array_equal(
                _device_keep(seed, counts, threshold), cpu_keep(seed, counts, threshold)
            )


def test_counter_wraps_like_uint64():
    bh, i, j, n_q, n_k = 2**40 + 3, 2**30 + 1, 12345, 2**33, 2**20 + 7
    out = np.zeros(1, dtype=np.uint64)
    args = [np.array([x], dtype=np.uint64) for x in (bh, i, j, n_q, n_k)]
    _counter_kernel[1, 1](*args, out)
    assert int(out[0]) == ((bh * n_q + i) * n_k + j) % 2**64


def test_mul64_and_add64_wrap(rng):
    a = rng.integers(0, 2**64, size=24, dtype=np.uint64)
    b = rng.integers(0, 2**64, size=24, dtype=np.uint64)

    @cuda.jit
    def both(a, b, prod, total):
        n = cuda.grid(1)
        if n < a.size:
            prod[n] = cuda_dropout.mul64(a[n], b[n])
            total[n] = cuda_dropout.add64(a[n], b[n])

    prod = np.zeros_like(a)
    total = np.zeros_like(a)
    both[1, 32](a, b, prod, total)
    assert [int(x) for x in prod] == [int(x) * int(y) % 2**64 for x, y in zip(a, b)]
    assert [int(x) for x in total] == [(int(x) + int(y)) % 2**64 for x, y in zip(a, b)]


# --------------------------------------------------------------------------- the kernels
def _case(rng, dtype, n_bh=4, n_kv=2, n_q=7, n_k=11, d=3, d_v=2):
    q = rng.normal(size=(n_bh, n_q, d)).astype(dtype)
    k = rng.normal(size=(n_kv, n_k, d)).astype(dtype)
    v = rng.normal(size=(n_kv, n_k, d_v)).astype(dtype)
    return q, k, v


def _run(q, k, v, kv_index, scale, *, mask=None, mask_index=None, bias=None, band=None,
         softcap=None, slopes=None, dropout_p=0.0, seed=0):  # fmt: skip
    """The CUDA forward and backward through the CPU contract, and the reference's.

    ``mask``: the kernels' mask (BM, LM, SM), boolean or natural-unit float;
    ``bias``: the same expanded to (BH, L, S) for the reference.
    """
    dtype = q.dtype.type
    n_bh, n_q, _ = q.shape
    n_k = k.shape[1]
    band = (0, FAR, FAR) if band is None else band
    kernel_mask = np.zeros((0, 1, 1), dtype=dtype)
    if mask is not None:
        kernel_mask = mask if mask.dtype == np.bool_ else (mask * LOG2E).astype(dtype)
    index = np.zeros(n_bh, np.int64) if mask_index is None else mask_index
    kernel_slopes = np.zeros(0, dtype) if slopes is None else (slopes * LOG2E).astype(dtype)
    dropout = NO_DROPOUT
    drop = None
    if dropout_p > 0:
        keep_scale = 1.0 / (1.0 - dropout_p)
        dropout = Dropout(seed, round(dropout_p * 2**24), n_q, n_k, 0, 0, keep_scale)
        drop = naive.dropout_factors(seed, n_bh, n_q, n_k, dropout_p)
    cap = 0.0 if softcap is None else softcap * LOG2E
    bias_group = Bias(kernel_mask, index, None, kernel_slopes)
    args = (kv_index, bias_group, Band(*band), ScoreTransform(scale, cap), dropout, Tiles(16, 16))
    q2 = (q * (scale * LOG2E)).astype(dtype)
    out, lse = cuda_flash.flash_forward(q2, k, v, *args)
    out, lse = out.copy_to_host(), lse.copy_to_host()
    terms = dict(bias=bias, band=band, softcap=softcap, slopes=slopes, drop=drop)
    ref_out, ref_lse = naive.flash_slices(q, k, v, kv_index, scale, **terms)
    _close(out, ref_out, dtype)
    _close(lse, ref_lse, dtype)
    grad = np.random.default_rng(5).normal(size=out.shape).astype(dtype)
    grads = cuda_flash.flash_backward(q2, k, v, out, lse, grad, *args)
    ref = naive.flash_slices_backward(q, k, v, grad, kv_index, scale, **terms)
    for g, r in zip(grads, ref, strict=True):
        assert g.dtype == dtype
        _close(g.copy_to_host(), r, dtype)
    return out, lse, [g.copy_to_host() for g in grads]


GQA = np.array([0, 0, 1, 1], dtype=np.int64)  # 4 query slices, 2 K/V slices (groups of 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_boolean_mask_with_grouped_queries(rng, dtype):
    q, k, v = _case(rng, dtype)
    mask = rng.random((4, 7, 11)) < 0.6
    mask[1, 3] = False  # a row without keys: zeros, lse = -inf, zero gradients
    out, lse, (dq, _, _) = _run(
        q, k, v, GQA, 0.7, mask=mask, mask_index=np.arange(4), bias=np.where(mask, 0.0, -np.inf)
    )
    np.testing.assert_array_equal(out[1, 3], 0.0)
    assert lse[1, 3] == -np.inf
    np.testing.assert_array_equal(dq[1, 3], 0.0)


def test_key_padding_broadcast_float_mask_and_tile_skip(rng):
    """A (2, 1, S) float key-padding mask shared by heads (mask_index), its first tile
    closed for every row: the kernels never read those keys (NaN there stays out)."""
    q, k, v = _case(rng, np.float64, n_k=20)
    pad = rng.normal(size=(2, 1, 20))
    pad[:, :, :8] = -np.inf  # tiles are 8 keys (threads per block 8): one whole tile
    pad[1, :, 15:] = -np.inf
    index = np.array([0, 1, 0, 1], dtype=np.int64)
    bias = np.broadcast_to(pad[index], (4, 7, 20))
    _run(q, k, v, GQA, 0.5, mask=pad, mask_index=index, bias=bias)
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[:, :8] = np.nan
    v_nan[:, :8] = np.nan
    kernel_bias = Bias(pad * LOG2E, index, None, np.zeros(0))
    args = (
        GQA,
        kernel_bias,
        Band(0, FAR, FAR),
        ScoreTransform(0.5, 0.0),
        NO_DROPOUT,
        Tiles(16, 16),
    )
    out, lse = cuda_flash.flash_forward(q * 0.5 * LOG2E, k_nan, v_nan, *args)
    ref_out, ref_lse = naive.flash_slices(q, k, v, GQA, 0.5, bias=bias)
    _close(out.copy_to_host(), ref_out, np.float64)
    grads = cuda_flash.flash_backward(
        q * 0.5 * LOG2E, k_nan, v_nan, out, lse, np.ones_like(ref_out), *args
    )
    dq, dk, dv = (g.copy_to_host() for g in grads)
    assert np.isfinite(dq).all()
    np.testing.assert_array_equal(dk[:, :8], 0.0)
    np.testing.assert_array_equal(dv[:, :8], 0.0)


def test_mask_broadcast_over_keys(rng):
    """A (1, L, 1) mask: one bias per row (cancels in the softmax, shifts lse)."""
    q, k, v = _case(rng, np.float64, n_bh=2, n_kv=2)
    rows = rng.normal(size=(1, 7, 1))
    _run(q, k, v, np.arange(2), 0.4, mask=rows, bias=np.broadcast_to(rows, (2, 7, 11)))


@pytest.mark.parametrize(
    "band",
    [
        (0, FAR, 0),  # causal, top-left
        (4, FAR, 0),  # causal, bottom-right (S - L = 4)
        (4, 2, 1),  # window (2, 1), bottom-right
        (0, 1, FAR),  # left window only
        (-3, 0, 0),  # a diagonal band that leaves the first rows without keys
    ],
)
def test_band(rng, band):
    q, k, v = _case(rng, np.float64)
    _run(q, k, v, GQA, 0.6, band=band)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softcap_alibi_and_window(rng, dtype):
    q, k, v = _case(rng, dtype)
    q *= 3  # scores beyond the cap
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    _run(q, k, v, GQA, 1.0, band=(4, 3, 2), softcap=1.5, slopes=slopes)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dropout_forward_and_backward(rng, dtype):
    q, k, v = _case(rng, dtype)
    mask = rng.random((1, 7, 11)) < 0.8
    bias = np.broadcast_to(np.where(mask, 0.0, -np.inf), (4, 7, 11))
    _run(q, k, v, GQA, 0.8, mask=mask, bias=bias, band=(0, FAR, 2), dropout_p=0.3, seed=2**64 - 11)


def test_dropout_counters_follow_the_packed_offsets(rng):
    """The counter words (n_rows, n_cols, row0, col0): a slice of a larger packed array
    drops what the whole array drops there."""
    q, k, v = _case(rng, np.float64, n_bh=2, n_kv=2, n_q=10, n_k=12)
    seed, p = 99, 0.4
    full = naive.dropout_factors(seed, 2, 10, 12, p)
    dropout = Dropout(seed, round(p * 2**24), 10, 12, 3, 5, 1 / (1 - p))
    bias = Bias(np.zeros((0, 1, 1)), np.zeros(2, np.int64), None, np.zeros(0))
    args = (np.arange(2), bias, Band(0, FAR, FAR), ScoreTransform(1.0, 0.0), dropout, Tiles(16, 16))
    part_q, part_k, part_v = q[:, 3:8], k[:, 5:11], v[:, 5:11]
    out, lse = cuda_flash.flash_forward(part_q * LOG2E, part_k, part_v, *args)
    ref, _ = naive.flash_slices(part_q, part_k, part_v, np.arange(2), 1.0, drop=full[:, 3:8, 5:11])
    _close(out.copy_to_host(), ref, np.float64)


def test_launches_in_chunks_keep_slice_numbers(rng, monkeypatch):
    """More slices than one grid's y dimension: the chunks' kernels see absolute slice
    numbers (K/V slice, mask slice, dropout counters)."""
    from nbattn.cuda import common

    monkeypatch.setattr(common, "MAX_GRID_Y", 3)
    q, k, v = _case(rng, np.float64, n_bh=4, n_kv=2, n_q=5, n_k=6)
    mask = rng.random((4, 5, 6)) < 0.7
    _run(
        q, k, v, GQA, 0.9, mask=mask, mask_index=np.arange(4),
        bias=np.where(mask, 0.0, -np.inf), dropout_p=0.2, seed=3,
    )  # fmt: skip


@settings(max_examples=8)
@given(
    n_q=st.integers(1, 9),
    n_k=st.integers(1, 10),
    group=st.sampled_from([1, 2]),
    left=st.one_of(st.none(), st.integers(0, 4)),
    right=st.one_of(st.none(), st.integers(0, 4)),
    bottom_right=st.booleans(),
    masked=st.booleans(),
    seed=seeds,
)
def test_random_shapes_and_terms(n_q, n_k, group, left, right, bottom_right, masked, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _case(rng, np.float64, n_bh=2, n_kv=2 // group, n_q=n_q, n_k=n_k, d=2, d_v=3)
    kv_index = np.arange(2) // group
    band = (n_k - n_q if bottom_right else 0, FAR if left is None else left)
    band += (FAR if right is None else right,)
    mask = bias = None
    if masked:
        mask = rng.random((2, 1, n_k)) < 0.7
        bias = np.broadcast_to(np.where(mask, 0.0, -np.inf), (2, n_q, n_k))
    _run(q, k, v, kv_index, 0.5, mask=mask, mask_index=np.arange(2), bias=bias, band=band)
