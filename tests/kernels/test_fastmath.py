"""Accuracy and vectorisation of the inlined exp, the shared reductions and the pool row."""

import numpy as np
import pytest
from numba import njit

from nbattn import config
from nbattn.kernels.fastmath import COARSE_EXP_RTOL, coarse_exp, exp_within, fast_exp
from nbattn.kernels.pooling import pool_row
from nbattn.kernels.softmax import exp_shift_sum, row_max


@njit(fastmath=config.FASTMATH)
def _exp_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = fast_exp(x[i])


def _run(x):
    out = np.empty_like(x)
    _exp_loop(x, out)
    return out


@njit(fastmath=config.FASTMATH)
def _coarse_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = coarse_exp(x[i])


@njit(fastmath=config.FASTMATH)
def _within_loop(x, coarse, out):
    for i in range(x.shape[0]):
        out[i] = exp_within(x[i], coarse)


def _run_coarse(x):
    out = np.empty_like(x)
    _coarse_loop(x, out)
    return out


def _run_within(x, coarse):
    out = np.empty_like(x)
    _within_loop(x, coarse, out)
    return out


def test_float64_relative_error_below_1e15():
    x = np.linspace(-708.3, 709.4, 1_000_003)
    rel = np.abs(_run(x) - np.exp(x)) / np.exp(x)
    assert rel.max() < 1e-15


def test_float32_within_two_ulp():
    x = np.linspace(-87.3, 88.3, 1_000_003).astype(np.float32)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert (np.abs(_run(x).astype(np.float64) - exact) / ulp).max() <= 2.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("run", [_run, _run_coarse], ids=["fast_exp", "coarse_exp"])
def test_edges_flush_to_zero_and_overflow_to_inf(dtype, run):
    x = np.array([-np.inf, -1e4, 0.0, 1e4, np.inf], dtype=dtype)
    np.testing.assert_array_equal(run(x), [0.0, 0.0, 1.0, np.inf, np.inf])


def test_coarse_float64_within_its_stated_error_and_no_closer_than_its_degree_allows(rng):
    # the whole range, and the ends of the reduced interval |r| <= ln(2)/2 (the largest
    # truncation error) in several binades
    half = np.log(2.0) / 2.0
    ends = (np.arange(-1000, 1000)[:, None] * np.log(2.0) + np.array([-half, half])).ravel()
    ends = ends[(ends > -708.3) & (ends < 709.4)]
    x = np.concatenate(
        [
            np.linspace(-708.3, 709.4, 1_000_003),
            ends,
            ends * (1.0 - 1e-12),
            rng.uniform(-50.0, 0.0, 100_000),
        ]
    )
    rel = np.abs(_run_coarse(x) - np.exp(x)) / np.exp(x)
    assert rel.max() < COARSE_EXP_RTOL
    # the truncation of a degree-7 polynomial: about 7e-9 at the interval's ends
    assert rel.max() > 1e-9


def test_coarse_float32_is_fast_exp_bit_for_bit():
    x = np.linspace(-87.3, 88.3, 100_003).astype(np.float32)
    assert np.array_equal(_run_coarse(x), _run(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_within_picks_by_the_type_of_its_flag(rng, dtype):
    x = rng.uniform(-30.0, 5.0, 10_001).astype(dtype)
    assert np.array_equal(_run_within(x, None), _run(x))
    assert np.array_equal(_run_within(x, True), _run_coarse(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("loop", [_exp_loop, _coarse_loop], ids=["fast_exp", "coarse_exp"])
def test_loop_vectorises(dtype, loop):
    loop(np.zeros(4, dtype=dtype), np.zeros(4, dtype=dtype))
    sig = next(s for s in loop.signatures if str(s[0].dtype) == np.dtype(dtype).name)
    asm = loop.inspect_asm(sig)
    suffix = "ps" if dtype == np.float32 else "pd"
    packed_fma = [
        line
        for line in asm.splitlines()
        if "vfmadd" in line and suffix in line and ("zmm" in line or "ymm" in line)
    ]
    assert len(packed_fma) >= 8, "the exp loop did not vectorise"
    assert "exp" not in "".join(line for line in asm.splitlines() if "call" in line)


# ------------------------------------------- the shared reductions and the hot row


@njit(fastmath=config.FASTMATH)
def _reduce_rows(rows, shift):
    """softmax.row_max and exp_shift_sum over each row (a test-local kernel: never cached)."""
    maxima = np.empty(rows.shape[0], dtype=np.float64)
    sums = np.empty(rows.shape[0], dtype=np.float64)
    for i in range(rows.shape[0]):
        maxima[i] = row_max(rows[i])
        sums[i] = exp_shift_sum(rows[i], shift)
    return maxima, sums


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_max_and_exp_shift_sum_match_numpy(rng, dtype):
    rows = rng.normal(size=(50, 37)).astype(dtype) * 5
    rows[3, :] = -np.inf  # a fully masked row
    rows[7, ::3] = -np.inf
    expected_max = rows.max(axis=1).astype(np.float64)
    shift = 2.0
    expected = np.exp(rows.astype(np.float64) - shift)
    work = rows.copy()
    maxima, sums = _reduce_rows(work, shift)
    np.testing.assert_array_equal(maxima, expected_max)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(work, expected, rtol=rtol)  # the row holds the exponentials
    np.testing.assert_allclose(sums, expected.sum(axis=1), rtol=rtol)
    assert row_max(np.zeros(0, dtype=dtype)) == -np.inf


@njit(fastmath=config.FASTMATH)
def _pool_rows(queries, keys_t, values_t):
    """pooling.pool_row over each query (test-local, so inspect_asm sees fresh code)."""
    scores = np.empty(config.KEY_BLOCK, dtype=queries.dtype)
    acc = np.empty(values_t.shape[0], dtype=np.float64)
    out = np.empty(queries.shape[0])
    for i in range(queries.shape[0]):
        m, total = pool_row(queries[i], keys_t, values_t, -1, scores, acc)
        out[i] = acc[0] / total
    return out


def _packed_fma(fn, dtype):
    sig = next(s for s in fn.signatures if str(s[0].dtype) == np.dtype(dtype).name)
    asm = fn.inspect_asm(sig)
    suffix = "ps" if dtype == np.float32 else "pd"
    return [
        line
        for line in asm.splitlines()
        if "vfmadd" in line and suffix in line and ("zmm" in line or "ymm" in line)
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_and_the_pool_row_vectorise(dtype):
    """The shared reductions and pool_row (with its far-row checks) keep packed FMAs."""
    _reduce_rows(np.zeros((2, 4), dtype=dtype), 0.0)
    assert len(_packed_fma(_reduce_rows, dtype)) >= 8, "row_max / exp_shift_sum did not vectorise"
    q = np.zeros((2, 2), dtype=dtype)
    k_t = np.zeros((2, 5), dtype=dtype)
    v_t = np.ones((1, 5), dtype=dtype)
    np.testing.assert_allclose(_pool_rows(q, k_t, v_t), 1.0)
    assert len(_packed_fma(_pool_rows, dtype)) >= 8, "pool_row's loop did not vectorise"


def test_power_of_two_scale_brackets_the_magnitude():
    """magnitude / 2 < scale <= magnitude, an exact power of two; 1 for 0."""
    from nbattn._core.numeric import power_of_two_scale

    rng = np.random.default_rng(0)
    mags = np.concatenate([10.0 ** rng.uniform(-300, 300, 500), [0.0, 1.0, 2.0, 3.0, 5e-324]])
    scale = power_of_two_scale(mags)
    positive = mags > 0
    assert np.all(scale[~positive] == 1.0)
    assert np.all((mags[positive] / 2 < scale[positive]) & (scale[positive] <= mags[positive]))
    assert np.all(np.frexp(scale[positive])[0] == 0.5)
