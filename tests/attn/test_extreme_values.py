"""Attention with values near the top (and bottom) of the floating-point range.

The output is a convex combination of value rows, so it is finite whenever the
values are; the kernels sum weights times values before normalising, and the
entries scale the values by a power of two per slice where that sum could
overflow. Every entry that pools values is compared with the long-double
reference of ``tests/naive.py`` (normalised weights, no overflow).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn.flash import flash_attention_bias
from nbattn.attn.multihead import multi_head_attention

from .. import naive
from ..strategies import float_dtypes, seeds

#: Output error allowed, relative to max |v| (the values' scale).
TOL = {np.float64: 1e-12, np.float32: 2e-5}

#: Magnitudes near the top of each dtype's range (the largest is finfo.max itself).
TOPS = {
    np.float32: [1e30, 1e34, 1e36, 1e37, 1e38, float(np.finfo(np.float32).max)],
    np.float64: [1e295, 1e300, 1e305, 1e307, 1e308, float(np.finfo(np.float64).max)],
}
KEY_COUNTS = [1, 9, 300, 1500]


def _problem(rng, dtype, top, n_keys, signed, heads=2, n_q=3, e=4, e_v=3):
    """Small scores (the weights near uniform: the largest unnormalised sums) and values
    with max |v| = ``top`` exactly (one entry of every head set to it)."""
    q = (0.2 * rng.standard_normal((1, heads, n_q, e))).astype(dtype)
    k = (0.2 * rng.standard_normal((1, heads, n_keys, e))).astype(dtype)
    low = -1.0 if signed else 0.5
    v = rng.uniform(low, 1.0, (1, heads, n_keys, e_v)) * top
    v = np.clip(v, -top, top).astype(dtype)
    v[..., 0, 0] = dtype(top)
    return q, k, v


def _check(out, ref, v, dtype):
    assert np.isfinite(out).all()
    scale = float(np.abs(v.astype(np.float64)).max())
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=TOL[dtype] * scale)


def _reference(q, k, v, **kw):
    return naive.sdpa_extended(q, k, v, **kw)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_keys", KEY_COUNTS)
@pytest.mark.parametrize("signed", [False, True])
def test_flash_and_attention_are_finite_and_right_near_the_top(rng, dtype, n_keys, signed):
    for top in TOPS[dtype]:
        q, k, v = _problem(rng, dtype, top, n_keys, signed)
        saved = v.copy()
        ref = _reference(q, k, v)
        _check(nbattn.flash_attention(q, k, v), ref, v, dtype)
        _check(nbattn.attention(q, k, v), ref, v, dtype)
        out, weights = nbattn.attention(q, k, v, return_weights=True)
        _check(out, ref, v, dtype)
        causal = _reference(q, k, v, causal=True)
        _check(nbattn.flash_attention(q, k, v, causal=True), causal, v, dtype)
        assert np.array_equal(v, saved)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flash_keywords_and_gqa_near_the_top(rng, dtype):
    top = TOPS[dtype][-2]
    q, k, v = _problem(rng, dtype, top, 700, signed=False, heads=4)
    k2, v2 = k[:, :2], v[:, :2]
    ref = _reference(q, np.repeat(k2, 2, axis=1), np.repeat(v2, 2, axis=1))
    _check(nbattn.flash_attention(q, k2, v2, enable_gqa=True), ref, v2, dtype)
    keep = rng.random(700) < 0.7
    keep[0] = True
    ref = _reference(q[..., :, :], k[..., keep, :], v[..., keep, :])
    _check(nbattn.flash_attention(q, k, v, mask=keep[None, :]), ref, v, dtype)
    with_bias = flash_attention_bias(q, k, v, key_bias=np.where(keep, 0.0, -np.inf))
    _check(with_bias, ref, v, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_varlen_near_the_top(rng, dtype):
    lengths = [1, 400, 37, 1200]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    parts = [_problem(rng, dtype, TOPS[dtype][i + 1], n, False) for i, n in enumerate(lengths)]
    q = np.concatenate([p[0][0] for p in parts], axis=1)
    k = np.concatenate([p[1][0] for p in parts], axis=1)
    v = np.concatenate([p[2][0] for p in parts], axis=1)
    cu_q = 3 * np.arange(len(lengths) + 1)
    out = nbattn.flash_attention_varlen(q, k, v, cu_q, cu)
    for s, (qs, ks, vs) in enumerate(parts):
        _check(out[:, cu_q[s] : cu_q[s + 1]], _reference(qs, ks, vs)[0], vs[0], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_keys", [5, 600, 2000])
def test_decode_near_the_top(rng, dtype, n_keys):
    for top in TOPS[dtype]:
        q, k, v = _problem(rng, dtype, top, n_keys, signed=False, n_q=1)
        k_cache = np.zeros((1, 2, n_keys + 3, 4), dtype=dtype)
        v_cache = np.zeros((1, 2, n_keys + 3, 3), dtype=dtype)
        k_cache[:, :, : n_keys - 1] = k[:, :, :-1]
        v_cache[:, :, : n_keys - 1] = v[:, :, :-1]
        out = nbattn.flash_decode(
            q, k_cache, v_cache, np.array([n_keys - 1]), k[:, :, -1:], v[:, :, -1:]
        )
        _check(out, _reference(q, k, v), v, dtype)
        assert np.array_equal(v_cache[:, :, :n_keys], v)  # the cache holds the values as given


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multi_head_attention_near_the_top(rng, dtype):
    # identity value and output projections: the heads' outputs are the layer's output
    n_keys, width, heads = 800, 6, 2
    top = TOPS[dtype][-2]
    x = rng.uniform(0.5, 1.0, (1, n_keys, width)) * top
    x = x.astype(dtype)
    small = (0.05 * rng.standard_normal((width, width))).astype(dtype)
    eye, zero = np.eye(width, dtype=dtype), np.zeros(width, dtype=dtype)
    query = rng.standard_normal((1, 5, width)).astype(dtype)
    key = rng.standard_normal((1, n_keys, width)).astype(dtype)
    ref = naive.multi_head_attention(
        query, key, x, heads, small, small, eye, zero, zero, zero, eye, zero
    )
    in_proj = np.concatenate([small, small, eye])
    in_bias = np.zeros(3 * width, dtype=dtype)
    for need_weights in (False, True):
        out = multi_head_attention(
            query, key, x, heads, in_proj, in_bias, eye, zero, need_weights=need_weights
        )
        out = out[0] if isinstance(out, tuple) else out
        _check(out, ref[0], x, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_subnormal_values_are_not_flushed(rng, dtype):
    tiny = float(np.finfo(dtype).smallest_normal)
    for factor in (1.0, 2.0**-5, 2.0**-15):
        q, k, v = _problem(rng, dtype, tiny * factor, 200, signed=False)
        # one head tiny, the other near the top: the scaling is per slice
        v[:, 1] = _problem(rng, dtype, TOPS[dtype][-1], 200, signed=False)[2][:, 1]
        ref = _reference(q, k, v)
        spacing = float(np.finfo(dtype).smallest_subnormal)
        for out in (nbattn.flash_attention(q, k, v), nbattn.attention(q, k, v)):
            assert (out[:, 0] != 0).all()
            # a few spacings per key from rounding each subnormal product
            np.testing.assert_allclose(out[:, 0], ref[:, 0], rtol=1e-3, atol=200 * 4 * spacing)
            _check(out[:, 1:], ref[:, 1:], v[:, 1:], dtype)


@settings(max_examples=30)
@given(
    seed=seeds,
    dtype=float_dtypes,
    n_keys=st.integers(1, 1200),
    shift=st.integers(0, 40),
    causal=st.booleans(),
)
def test_property_powers_of_two_pass_through_exactly(seed, dtype, n_keys, shift, causal):
    """out(2**e v) == 2**e out(v) bit for bit, for v whose outputs are normal: where the
    unscaled values fit the kernels, the scaled call gives exactly the same numbers."""
    rng = np.random.default_rng(seed)
    top_exp = np.finfo(dtype).maxexp - 1 - shift  # max|v| = 2**top_exp, near the top
    q, k, _ = _problem(rng, dtype, 1.0, n_keys, signed=False)
    v = rng.uniform(0.5, 1.0, (1, 2, n_keys, 3)).astype(dtype)
    big = v * dtype(2.0**top_exp)
    low = big * dtype(2.0**-top_exp)  # == v
    for run in (
        lambda vv: nbattn.flash_attention(q, k, vv, causal=causal),
        lambda vv: nbattn.attention(q, k, vv, causal=causal, return_weights=True)[0],
        lambda vv: nbattn.flash_attention_varlen(q[0], k[0], vv[0], [0, 3], [0, n_keys]),
    ):
        out_big, out_low = run(big), run(low)
        assert np.isfinite(out_big).all()
        assert np.array_equal(out_big, out_low * dtype(2.0**top_exp))
    # repeatable
    assert np.array_equal(nbattn.flash_attention(q, k, big), nbattn.flash_attention(q, k, big))


@pytest.mark.parametrize("dtype, size", [(np.float64, 1e20), (np.float32, 1e30)])
def test_backward_weights_stay_at_most_one_at_huge_scores(rng, dtype, size):
    """Scores of 1e20 (float64) or 1e30 (float32): the backward rebuilds its weights as
    2**(s - lse), and lse's rounding there is far above 1 in the exponent. The weights
    must stay in [0, 1] (so |dV_j| <= sum_i |dO_i|, every gradient finite), never
    2**(rounding) or inf. (Which key of a row keeps weight 1 is beyond lse's precision
    there: the forward's one-hot weights are not promised.)"""
    for _ in range(20):
        n_q, n_k, e = (int(n) for n in rng.integers(1, 12, size=3))
        q = (rng.normal(size=(1, 2, n_q, e)) * size).astype(dtype)
        k, v = (rng.normal(size=(1, 2, n_k, e)).astype(dtype) for _ in range(2))
        g = rng.normal(size=(1, 2, n_q, e)).astype(dtype)
        out, lse = nbattn.flash_attention(q, k, v, return_lse=True)
        dq, dk, dv = nbattn.flash_attention_backward(q, k, v, out, lse, g)
        assert all(np.isfinite(x).all() for x in (dq, dk, dv))
        bound = np.abs(g.astype(np.float64)).sum(axis=2, keepdims=True)
        assert (np.abs(dv) <= bound * (1 + 1e-6)).all()
