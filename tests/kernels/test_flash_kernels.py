"""The flash kernels' building blocks: the accumulating GEMM and the forward's rebasing.

``nbattn.kernels.blas.gemm`` is checked against NumPy on random shapes, every
transpose and beta, and on row ranges of larger arrays (the kernels pass such
views); its fallback for ``A B`` and ``A^T B`` (the shim onto numba's BLAS, used
where NumPy carries no OpenBLAS of its own) is called through its C ABI.

The forward keeps each row's reference maximum while a tile's weights sum to
at most ``REBASE_SUM`` (2**20); a larger sum up to ``REBASE_EXACT_SUM``
(2**100) is rebased exactly by a power of two, and beyond that (weights may
have saturated at 2**127 in float32) the row is scored again. The scores
below jump by a chosen number of bits from one key tile to the next, so each
path runs, and the results are compared with the long-double reference.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import nbattn
from nbattn.attn.flash import flash_attention_bias
from nbattn.kernels import blas, flash

from .. import naive
from ..attn.test_softmax import assert_close
from ..strategies import float_dtypes, seeds


@njit(cache=True)
def _gemm(a, b, c, trans_a, trans_b, beta):
    blas.gemm(a, b, c, trans_a, trans_b, beta)


@settings(max_examples=25)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    beta=st.sampled_from([0.0, 1.0, 0.5]),
    dtype=float_dtypes,
    pad=st.integers(0, 3),
    seed=seeds,
)
def test_gemm_matches_numpy(m, n, k, trans_a, trans_b, beta, dtype, pad, seed):
    """c <- op(a) op(b) + beta c, with c a block of a wider array (row stride > n)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    wide = rng.standard_normal((m + pad, n + 2 * pad)).astype(dtype)
    before = wide.copy()
    c = wide[pad:, pad : pad + n]
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b) + beta * c
    _gemm(a, b, c, trans_a, trans_b, beta)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol * np.abs(want).max())
    outside = np.ones(wide.shape, dtype=bool)
    outside[pad:, pad : pad + n] = False
    assert np.array_equal(wide[outside], before[outside])  # nothing written beside c


def test_gemm_ignores_what_c_held_when_beta_is_zero():
    a = np.ones((3, 2))
    c = np.full((3, 4), np.nan)
    _gemm(a, np.ones((2, 4)), c, False, False, 0.0)
    assert np.array_equal(c, np.full((3, 4), 2.0))


@pytest.mark.parametrize(
    "bits, kind, dtype", [(32, ord("s"), np.float32), (64, ord("d"), np.float64)]
)
def test_fallback_shim(rng, bits, kind, dtype):
    """The 64-bit-integer ?gemm ABI onto numba's BLAS: column-major C = A^T B + beta C."""
    shim = blas._shim(bits, kind)
    m, n, k = 5, 4, 3
    a = np.asfortranarray(rng.standard_normal((k, m)).astype(dtype))  # A (k x m), lda = k
    b = np.asfortranarray(rng.standard_normal((k, n)).astype(dtype))
    c = np.asfortranarray(rng.standard_normal((m, n)).astype(dtype))
    want = a.T.astype(np.float64) @ b + 0.5 * c
    ints = [ctypes.c_int64(x) for x in (m, n, k, k, k, m)]
    alpha, beta = (np.array([x], dtype=dtype) for x in (1.0, 0.5))
    function = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 13))(shim.address)
    trans, no_trans = ctypes.c_char(b"T"), ctypes.c_char(b"N")
    function(
        ctypes.addressof(trans),
        ctypes.addressof(no_trans),
        *(ctypes.addressof(x) for x in ints[:3]),
        alpha.ctypes.data,
        a.ctypes.data,
        ctypes.addressof(ints[3]),
        b.ctypes.data,
        ctypes.addressof(ints[4]),
        beta.ctypes.data,
        c.ctypes.data,
        ctypes.addressof(ints[5]),
    )
    np.testing.assert_allclose(c, want, rtol=1e-5 if bits == 32 else 1e-12)


def test_library_is_reported():
    assert isinstance(blas.ON_NUMPY_BLAS, bool)
    assert flash.REBASE_SUM < flash.REBASE_EXACT_SUM <= 2.0**120  # below float32 saturation


def _jumping_scores(rng, n_q, tiles, jump_bits, down_first):
    """q (n_q, 1), k (16 tiles, 1): row i's scores rise by about q_i * jump_bits bits per
    key tile (16 keys), with a spread of +-2 inside each tile; centred on 0."""
    q = rng.uniform(0.5, 1.0, size=(n_q, 1))
    base = (np.arange(tiles) - (tiles - 1) / 2) * jump_bits * np.log(2.0)
    if down_first:  # the first tile high, then a drop, then the rise
        base[0] = base[-1] + 1.0
    k = np.repeat(base, 16)[:, None] + rng.uniform(-2.0, 2.0, size=(16 * tiles, 1))
    return q, k


@pytest.mark.usefixtures("small_flash_tiles")
@settings(max_examples=25)
@given(
    jump_bits=st.sampled_from([5.0, 30.0, 90.0, 160.0, 400.0]),
    tiles=st.integers(2, 3),
    n_q=st.integers(1, 20),
    down_first=st.booleans(),
    masked=st.booleans(),
    dtype=float_dtypes,
    seed=seeds,
)
def test_forward_rebases_on_jumping_maxima(jump_bits, tiles, n_q, down_first, masked, dtype, seed):
    """Each rebase path (kept, exact power of two, scored again) against long double."""
    if dtype == np.float32 and jump_bits * (tiles - 1) > 200:
        tiles = 2  # float32 scores of +-70 keep 1e-5 of the output (their rounding)
    rng = np.random.default_rng(seed)
    q, k = _jumping_scores(rng, n_q, tiles, jump_bits, down_first)
    v = rng.standard_normal((k.shape[0], 3))
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    key_bias = None
    if masked:  # the mask path fuses a per-key bias into the exponentials
        key_bias = np.where(rng.random(k.shape[0]) < 0.2, -np.inf, rng.uniform(-1, 1, k.shape[0]))
        key_bias[-1] = 0.0  # at least one admissible key in the last tile
    out, lse = flash_attention_bias(q, k, v, key_bias=key_bias, scale=1.0, return_lse=True)
    ref, ref_lse = naive.sdpa_extended(q, k, v, scale=1.0, key_bias=key_bias)
    assert_close(out, ref, dtype)
    assert_close(lse, ref_lse, dtype)


@pytest.mark.usefixtures("small_flash_tiles")
def test_forward_rebases_with_dropout_and_causal(rng):
    """Rebased rows under the causal band and under dropout (the spec's counter mask);
    the backward from the rebased lse matches the reference."""
    q, k = _jumping_scores(rng, 48, 3, 150.0, False)
    v = rng.standard_normal((48, 4))
    out, lse = nbattn.flash_attention(q, k, v, causal=True, scale=1.0, return_lse=True)
    ref, ref_lse = naive.sdpa_extended(q, k, v, causal=True, scale=1.0)
    assert_close(out, ref)
    assert_close(lse, ref_lse)
    g = rng.standard_normal(out.shape)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=True, scale=1.0)
    for got, want in zip(grads, naive.sdpa_backward(q, k, v, g, causal=True, scale=1.0)):
        assert_close(got, want)
    # dropout: the spec's counter mask applied to the rebased weights
    p = 0.3
    dropped = nbattn.flash_attention(q, k, v, scale=1.0, dropout_p=p, random_state=7)
    factors = naive.dropout_factors(7, 1, q.shape[0], k.shape[0], p)[0].astype(np.longdouble)
    weights = naive.softmax_extended(np.longdouble(1.0) * (q @ k.T))
    assert_close(dropped, ((weights * factors) @ v).astype(np.float64))
