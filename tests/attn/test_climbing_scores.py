"""Scores that climb along the keys: the forward kernels' rows whose reference maximum
falls behind by more than 2**100 in one tile.

A row of the flash and flex forwards keeps its reference maximum while a tile's weights
sum to at most 2**20, raises it by a power of two up to 2**100, and beyond that scores
the row again and rebases it on its maximum; a row that climbed so takes the maximum of
its next tiles first, until a tile stays at or below its reference. Key biases that
rise or fall by tens per key (an ALiBi bias towards later keys, random walks, a
sawtooth) cross those thresholds in every direction on the 16-key tiles of
``small_flash_tiles``; every case is checked against the dense float64 formulation of
``tests/naive.py``, and a second call gives the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn.flash import flash_attention_bias
from tests import naive
from tests.flex_cases import MODS, make_args

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
H, E = 2, 8


def key_biases(rng, n_k, trend, noise):
    """(H, n_k) float64: a random walk per head, mean step ``trend`` (the second head's
    the opposite), steps' spread ``noise``."""
    steps = rng.standard_normal((H, n_k)) * noise + np.array([trend, -trend])[:, None]
    return np.cumsum(steps, axis=1)


def sawtooth(n_k, height, period):
    """(H, n_k): rises ``height`` per key for ``period`` keys, falls back, again."""
    ramp = height * (np.arange(n_k) % period)
    return np.stack([ramp, ramp[::-1]])


def tolerance(dtype, scores):
    """Rounding of the scores (magnitude up to ``scores``) in ``dtype``, as it moves the
    weights, with a margin."""
    return 64 * np.finfo(dtype).eps * (1.0 + scores)


def qkv(rng, n_q, n_k, dtype):
    return tuple(
        rng.standard_normal((1, H, n, d)).astype(dtype) for n, d in ((n_q, E), (n_k, E), (n_k, E))
    )


def check_flex(q, k, v, bias):
    """The flex forward with ``bias[h, j]`` added by the shared score_mod (its absolute
    key table), against the dense formulation; returns the largest |score|."""
    n_q, n_k = q.shape[2], k.shape[2]
    args = make_args(1, H, max(n_q, n_k), table2=bias)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **MODS, mod_args=args)
    again = nbattn.flash_attention(q, k, v, return_lse=True, **MODS, mod_args=args)
    assert all(np.array_equal(a, b) for a, b in zip((out, lse), again))
    ref, ref_lse = naive.flex_attention(q, k, v, *MODS.values(), mod_args=args)
    top = np.abs(ref_lse).max() + 1.0
    tol = tolerance(q.dtype, top)
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol * np.abs(v).max())
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=tol * top)


def check_flash(q, k, v, bias, slopes):
    """``flash_attention_bias`` (the kernel under the Nadaraya-Watson pooling) with key
    bias ``bias[h, j]`` and ALiBi ``slopes``, against the dense formulation."""
    out, lse = flash_attention_bias(
        q, k, v, key_bias=bias[None], alibi_slopes=slopes[None], return_lse=True
    )
    again = flash_attention_bias(
        q, k, v, key_bias=bias[None], alibi_slopes=slopes[None], return_lse=True
    )
    assert all(np.array_equal(a, b) for a, b in zip((out, lse), again))
    ref, ref_lse = naive.sdpa(q, k, v, key_bias=bias[None], alibi_slopes=slopes[None])
    top = np.abs(ref_lse).max() + 1.0
    tol = tolerance(q.dtype, top)
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol * np.abs(v).max())
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=tol * top)


walks = dict(
    dtype=st.sampled_from([np.float32, np.float64]),
    n_q=st.integers(1, 30),
    n_k=st.integers(1, 90),
    trend=st.floats(-40.0, 40.0),
    noise=st.floats(0.0, 40.0),
    seed=st.integers(0, 2**32 - 1),
)


@pytest.mark.usefixtures("small_flash_tiles")
@SETTINGS
@given(**walks)
def test_flex_forward_follows_key_biases_that_climb_and_fall(dtype, n_q, n_k, trend, noise, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, n_q, n_k, dtype)
    check_flex(q, k, v, key_biases(rng, n_k, trend, noise))


@pytest.mark.usefixtures("small_flash_tiles")
@SETTINGS
@given(**walks, slope=st.floats(-12.0, 12.0))
def test_flash_forward_follows_key_biases_and_alibi_that_climb(
    dtype, n_q, n_k, trend, noise, seed, slope
):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, n_q, n_k, dtype)
    slopes = np.array([slope, slope / 3.0])
    check_flash(q, k, v, key_biases(rng, n_k, trend, noise), slopes)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("height", "period"), [(10.0, 40), (6.0, 70), (30.0, 17)])
def test_a_climb_that_stops_and_starts_again(dtype, height, period):
    """A sawtooth: tiles that climb past 2**100, then one that falls (the row keeps its
    reference and leaves the climbing path), then climbs again."""
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 21, 150, dtype)
    bias = sawtooth(150, height, period)
    check_flex(q, k, v, bias)
    check_flash(q, k, v, bias, np.zeros(H))
