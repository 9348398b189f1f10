"""Review of ``pooling.fused_range`` with the last two features inline in the fused loop
and the others through ``buf``.

The previous implementation (every feature but the last through ``buf``) is kept below
as ``_fused_range_buffered``, compiled
with the library's fastmath flags, and both are run on the same ranges: d = 1..8
features, 1..4 outputs, float32 and float64, ranges of 0..33 keys inside a larger
array, keys at extreme magnitudes (squared distances overflowing to inf, subnormal
differences), exact ties and signed zeros, shifts, ``coarse`` None / True / False.

What was found: with one output and d >= 2 the two are NOT bit-identical when compiled
in isolation under ``config.FASTMATH`` ("contract" lets LLVM fuse a different product
into an FMA), but they agree to rounding and never disagree on inf / NaN / 0; with one
feature or several outputs the arithmetic is the same and so are the bits. The public
exact path (``nadaraya_watson``) gave the same bits at both commits on every case tried.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import nbattn
from nbattn import config
from nbattn.kernels import pooling
from nbattn.kernels.fastmath import exp_within, like

from .. import naive


@njit(fastmath=config.FASTMATH, inline="always")
def _fused_range_buffered(query_row, keys_t, values_t, a, b, shift, buf, acc, coarse):
    """``pooling.fused_range`` as it was (all features but the last through buf)."""
    n = b - a
    d = keys_t.shape[0]
    n_outputs = values_t.shape[0]
    last = keys_t[d - 1, a:b]
    q_last = query_row[d - 1]
    if d > 1:
        keys_f = keys_t[0, a:b]
        q0 = query_row[0]
        for j in range(n):
            diff = keys_f[j] - q0
            buf[j] = diff * diff
        for f in range(1, d - 1):
            keys_f = keys_t[f, a:b]
            qf = query_row[f]
            for j in range(n):
                diff = keys_f[j] - qf
                buf[j] += diff * diff
    s = like(shift, buf)
    total = like(0.0, buf)
    if n_outputs == 1:
        values_row = values_t[0, a:b]
        weighted = like(0.0, buf)
        if d == 1:
            for j in range(n):
                diff = last[j] - q_last
                w = exp_within(-(diff * diff) - s, coarse)
                total += w
                weighted += w * values_row[j]
        else:
            for j in range(n):
                diff = last[j] - q_last
                w = exp_within(-(buf[j] + diff * diff) - s, coarse)
                total += w
                weighted += w * values_row[j]
        acc[0] += weighted
        return total
    for j in range(n):
        diff = last[j] - q_last
        dist = diff * diff
        if d > 1:
            dist += buf[j]
        w = exp_within(-dist - s, coarse)
        buf[j] = w
        total += w
    for c in range(n_outputs):
        values_c = values_t[c, a:b]
        weighted = like(0.0, buf)
        for j in range(n):
            weighted += buf[j] * values_c[j]
        acc[c] += weighted
    return total


@njit(fastmath=config.FASTMATH)
def _run_new(q, k_t, v_t, a, b, shift, buf, acc, coarse):
    return pooling.fused_range(q, k_t, v_t, a, b, shift, buf, acc, coarse)


@njit(fastmath=config.FASTMATH)
def _run_old(q, k_t, v_t, a, b, shift, buf, acc, coarse):
    return _fused_range_buffered(q, k_t, v_t, a, b, shift, buf, acc, coarse)


def _keys(kind, rng, d, n, dtype):
    if kind == "normal":
        return rng.normal(size=(d, n)), rng.normal(size=d)
    if kind == "huge":  # squared distances overflow to inf
        s = 1e150 if dtype == np.float64 else 1e19
        return rng.normal(size=(d, n)) * s, rng.normal(size=d) * s
    if kind == "subnormal":
        tiny = float(np.finfo(dtype).smallest_subnormal)
        return rng.integers(-5, 6, (d, n)) * tiny, rng.integers(-5, 6, d) * tiny
    if kind == "ties":
        k = np.tile(rng.normal(size=(d, 1)), (1, n))
        return k, k[:, 0].copy()
    if kind == "signed_zeros":
        return np.where(rng.random((d, n)) < 0.5, 0.0, -0.0), np.full(d, -0.0)
    assert kind == "mixed"  # magnitudes over many decades, some distances overflowing
    big = 150 if dtype == np.float64 else 18
    k = rng.normal(size=(d, n)) * 10.0 ** rng.integers(-big, big, (d, n)).astype(float)
    return k, rng.normal(size=d)


def _both(q, k_t, v_t, a, b, shift, coarse):
    got = []
    for run in (_run_new, _run_old):
        buf = np.full(max(b - a, 1) + 3, np.nan, dtype=k_t.dtype)
        acc = np.zeros(v_t.shape[0])
        total = np.float64(run(q, k_t, v_t, a, b, shift, buf, acc, coarse))
        got.append((total, acc))
    return got


def _kind(x):
    x = np.asarray(x)
    return np.isnan(x), np.isinf(x), x == 0, np.signbit(x) & np.isinf(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["normal", "huge", "subnormal", "ties", "signed_zeros", "mixed"])
def test_fused_range_agrees_with_the_buffered_original(dtype, kind):
    """Every d, output count, range length, shift and ``coarse``: the same inf / NaN / 0
    pattern as before, the same bits where the arithmetic is unchanged (one feature, or
    several outputs), and otherwise agreement to rounding of the weighted sums."""
    kinds = ["normal", "huge", "subnormal", "ties", "signed_zeros", "mixed"]
    rng = np.random.default_rng(kinds.index(kind) + 10 * (dtype == np.float32))
    eps = float(np.finfo(dtype).eps)
    for d in range(1, 9):
        for n_outputs in (1, 2, 4):
            for length in (0, 1, 2, 7, 8, 9, 31, 33):
                n = length + 5
                keys, query = _keys(kind, rng, d, n, dtype)
                with np.errstate(all="ignore"):
                    k_t = np.ascontiguousarray(keys.astype(dtype))
                    q = query.astype(dtype)
                v_t = np.ascontiguousarray(rng.normal(size=(n_outputs, n)).astype(dtype))
                for coarse in (None, True, False):
                    for shift in (0.0, -3.0, 1e-3):
                        (t_new, a_new), (t_old, a_old) = _both(
                            q, k_t, v_t, 2, 2 + length, shift, coarse
                        )
                        case = (d, n_outputs, length, coarse, shift)
                        for x, y in ((t_new, t_old), (a_new, a_old)):
                            for mask_new, mask_old in zip(_kind(x), _kind(y)):
                                np.testing.assert_array_equal(mask_new, mask_old, err_msg=str(case))
                        if d == 1 or n_outputs > 1:
                            assert t_new == t_old or (np.isnan(t_new) and np.isnan(t_old)), case
                            np.testing.assert_array_equal(a_new, a_old, err_msg=str(case))
                            continue
                        # one output, d >= 2: a few ulps of each squared distance, times
                        # the exponent's size (exp amplifies an absolute error of its
                        # argument), summed over the range; the weighted sum may cancel,
                        # so its scale is the sum of |w v| <= total * max |v|
                        with np.errstate(all="ignore"):
                            d2 = ((k_t[:, 2 : 2 + length].astype(np.float64).T - q) ** 2).sum(1)
                        cap = 110.0 if dtype == np.float32 else 750.0  # beyond: weight 0
                        live = d2[np.isfinite(d2) & (d2 <= cap)]
                        grow = 1.0 + (live.max() if live.size else 0.0) + abs(shift)
                        bound = 8 * max(length, 1) * eps * grow * max(abs(t_old), 1e-300)
                        assert abs(t_new - t_old) <= bound, case
                        v_max = float(np.abs(v_t).max()) if length else 0.0
                        assert abs(a_new[0] - a_old[0]) <= bound * v_max, case


def test_fused_range_empty_range_touches_nothing():
    """a == b: zero total, acc and buf untouched (d = 1..4, one and two outputs)."""
    for d in range(1, 5):
        for n_outputs in (1, 2):
            k_t = np.ones((d, 4))
            v_t = np.ones((n_outputs, 4))
            buf = np.full(4, 7.0)
            acc = np.full(n_outputs, 3.0)
            assert _run_new(np.zeros(d), k_t, v_t, 2, 2, 0.0, buf, acc, None) == 0.0
            np.testing.assert_array_equal(acc, 3.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n_outputs", [1, 3])
def test_exact_and_leave_one_out_against_naive_across_key_blocks(dtype, d, n_outputs):
    """The public exact path (one_pass_row / one_pass_rows) against tests/naive.py, with
    leave-one-out over more keys than a block, so that the excluded key falls at the
    first and the last position of a block (``config.KEY_BLOCK``)."""
    rng = np.random.default_rng(d * 10 + n_outputs)
    n = config.KEY_BLOCK + 2  # own = KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 1: block edges
    keys = rng.normal(size=(n, d))
    values = rng.normal(size=(n, n_outputs))
    queries = rng.normal(size=(40, d))
    h = 0.4
    tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    got = nbattn.nadaraya_watson(queries, keys, values, h, dtype=dtype)
    np.testing.assert_allclose(got, naive.nadaraya_watson(queries, keys, values, h), **tol)
    rows = np.r_[0, 1, config.KEY_BLOCK - 1, config.KEY_BLOCK, config.KEY_BLOCK + 1]
    loo = nbattn.nadaraya_watson(keys, keys, values, h, dtype=dtype, exclude_self=True)
    ref = naive.nadaraya_watson(keys, keys, values, h, exclude_self=True)
    np.testing.assert_allclose(loo[rows], ref[rows], **tol)
    np.testing.assert_allclose(loo, ref, **tol)


def test_exact_path_with_overflowing_distances_and_ties():
    """Keys far apart enough that squared distances overflow (far rows) and exact ties:
    finite predictions equal to the naive ones (the nearest key's value for a far
    query, the mean of tied keys)."""
    keys = np.array([[0.0, 0.0, 0.0], [1e200, 0.0, 0.0], [0.0, -1e200, 0.0], [0.0, 0.0, 0.0]])
    values = np.array([1.0, 2.0, 3.0, 5.0])
    queries = np.array(
        [[0.0, 0.0, 0.0], [9e199, 1.0, 0.0], [0.0, -1.1e200, 0.0], [-0.0, -0.0, -0.0]]
    )
    got = nbattn.nadaraya_watson(queries, keys, values, 1.0)
    np.testing.assert_array_equal(got, [3.0, 2.0, 3.0, 3.0])
