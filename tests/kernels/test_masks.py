"""The flash kernels' mask made in one pass (``nbattn.kernels.masks``), and the entries that
hand the user's mask to it unconverted (``flash_attention``, ``attention``,
``multi_head_attention``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn._core.attn_groups import Tiles
from nbattn._core.numeric import LOG2E
from nbattn.attn.flash_args import mask_arrays
from nbattn.attn.masks import mask_input
from nbattn.kernels import flash as flash_kernels
from nbattn.kernels import masks
from tests import naive


def _live_reference(base2, block_q, block_k):
    """The open-tile table of a base-2 mask, by NumPy (``mask_tile_live``'s contract)."""
    n_m, n_l, n_s = base2.shape
    bq, bk = (block_q if n_l > 1 else 1), (block_k if n_s > 1 else 1)
    n_qt, n_kt = -(-n_l // bq), -(-n_s // bk)
    live = np.zeros((n_m, n_qt, n_kt), np.uint8)
    for qt in range(n_qt):
        for kt in range(n_kt):
            block = base2[:, qt * bq : (qt + 1) * bq, kt * bk : (kt + 1) * bk]
            live[:, qt, kt] = (block > -np.inf).any(axis=(1, 2))
    return live


def _draw_mask(rng, shape, kind, src_dtype):
    if kind == "bool":
        return rng.random(shape) > 0.6
    m = (3.0 * rng.standard_normal(shape)).astype(src_dtype)
    m[rng.random(shape) < 0.3] = -np.inf
    return m


@settings(max_examples=25)
@given(
    seed=st.integers(0, 2**31),
    n_m=st.integers(1, 3),
    n_l=st.integers(1, 9),
    n_s=st.integers(1, 11),
    block_q=st.sampled_from([1, 2, 4]),
    block_k=st.sampled_from([1, 3, 8]),
    kind=st.sampled_from(["bool", "float32", "float64"]),
    out_dtype=st.sampled_from([np.float32, np.float64]),
)
def test_mask_base2_matches_numpy(seed, n_m, n_l, n_s, block_q, block_k, kind, out_dtype):
    rng = np.random.default_rng(seed)
    mask = _draw_mask(rng, (n_m, n_l, n_s), kind, kind if kind != "bool" else None)
    if rng.random() < 0.5:
        mask[0, 0] = False if kind == "bool" else -np.inf  # a row that sees no key
    out = np.empty(mask.shape, out_dtype)
    live = np.zeros(_live_reference(np.zeros(mask.shape), block_q, block_k).shape, np.uint8)
    if kind == "bool":
        masks.bool_mask_base2(mask, out, live, block_q, block_k)
        want = np.where(mask, out_dtype(0.0), out_dtype(-np.inf))
    else:
        n_bad, largest = masks.float_mask_base2(mask, out, live, block_q, block_k)
        # the old conversion: NumPy's product in the output dtype
        want = np.multiply(mask, LOG2E, dtype=out_dtype)
        finite = np.isfinite(mask)
        assert n_bad == 0
        assert largest == (np.abs(mask[finite]).max() if finite.any() else 0.0)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(live, _live_reference(want, block_q, block_k))
    np.testing.assert_array_equal(live, flash_kernels.mask_tile_live(want, block_q, block_k))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_float_mask_with_nan_or_plus_inf_is_refused_naming_it(bad):
    mask = np.zeros((1, 4, 5))
    mask[0, 2, 3] = bad
    out = np.empty(mask.shape)
    live = np.zeros((1, 1, 1), np.uint8)
    n_bad, _ = masks.float_mask_base2(mask, out, live, 4, 5)
    assert n_bad == 1
    q = np.ones((1, 4, 2))
    with pytest.raises(ValueError, match=r"mask contains NaN or \+inf \(first at index"):
        nbattn.flash_attention(q, q[:, :1].repeat(5, 1), q[:, :1].repeat(5, 1), mask=mask[0])
    with pytest.raises(ValueError, match=r"mask contains NaN or \+inf"):
        nbattn.attention(q, q[:, :1].repeat(5, 1), q[:, :1].repeat(5, 1), mask=mask)


def test_mask_arrays_shares_its_tile_table_only_for_its_tiles(rng):
    mask = mask_input(rng.random((2, 1, 6, 9)) > 0.5, (6, 9))
    arrays = mask_arrays(mask, (2, 3), 6, 9, np.float32, None, False, Tiles(4, 4))
    assert arrays.live_for(Tiles(4, 4)) is arrays.live
    assert arrays.live_for(Tiles(4, 8)) is None
    assert arrays.mask.dtype == np.float32 and arrays.shift is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "mask_shape", [(6, 9), (1, 9), (6, 1), (3, 1, 6, 9), (1, 2, 1, 9), (9,), ()]
)
@pytest.mark.parametrize("kind", ["bool", "float32", "float64", "float16"])
def test_attention_and_flash_with_every_mask_match_naive(rng, dtype, mask_shape, kind):
    q = rng.standard_normal((3, 2, 6, 4)).astype(dtype)
    k = rng.standard_normal((3, 2, 9, 4)).astype(dtype)
    v = rng.standard_normal((3, 2, 9, 5)).astype(dtype)
    if kind == "bool":
        mask = np.asarray(rng.random(mask_shape) > 0.4) | (len(mask_shape) == 0)
    else:
        mask = np.asarray(rng.standard_normal(mask_shape)).astype(kind)
        if mask_shape:
            mask[rng.random(mask_shape) < 0.3] = -np.inf
    full = np.broadcast_to(mask, (3, 2, 6, 9)).copy()
    if mask.ndim >= 2:  # a row that sees no key: zeros, never NaN
        index = (0,) * (mask.ndim - 2) + (0, slice(None))
        mask[index] = False if kind == "bool" else -np.inf
        full = np.broadcast_to(mask, (3, 2, 6, 9)).copy()
    before = mask.copy()
    ref, _ = naive.attention(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        lambda a, b: naive.dot_scores(a, b) / 2.0,
        mask=full if kind == "bool" else full.astype(np.float64),
    )
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for out in (nbattn.attention(q, k, v, mask=mask), nbattn.flash_attention(q, k, v, mask=mask)):
        assert out.dtype == dtype
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(mask, before)  # the user's mask is never modified


def test_huge_float_mask_still_shifted_per_row(rng):
    q, k, v = (rng.standard_normal((1, 5, 3)) for _ in range(3))
    mask = rng.standard_normal((5, 5)) + 1e6  # beyond 64: shifted per row before the kernels
    mask[:, 0] = -np.inf
    mask[3] = -np.inf
    ref, _ = naive.attention(q, k, v, lambda a, b: naive.dot_scores(a, b) / np.sqrt(3), mask=mask)
    for dtype in (np.float32, np.float64):
        out = nbattn.attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), mask=mask)
        tol = 1e-8 if dtype == np.float64 else 1e-4
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_self_attention_by_one_array_is_the_three_arrays_case(rng, dtype):
    """multi_head_attention(x, x, x) projects x once; the result is that of three
    equal arrays (separate projections), and the call is repeatable bit for bit."""
    e, h = 8, 2
    x = rng.standard_normal((2, 5, e)).astype(dtype)
    w_in = rng.standard_normal((3 * e, e)).astype(dtype)
    b_in = rng.standard_normal(3 * e).astype(dtype)
    w_out = rng.standard_normal((e, e)).astype(dtype)
    mask = rng.random((5, 5)) > 0.3
    args = (h, w_in, b_in, w_out, None)
    one, _ = nbattn.multi_head_attention(x, x, x, *args, mask=mask, need_weights=False)
    again, _ = nbattn.multi_head_attention(x, x, x, *args, mask=mask, need_weights=False)
    three, _ = nbattn.multi_head_attention(
        x, x.copy(), x.copy(), *args, mask=mask, need_weights=False
    )
    np.testing.assert_array_equal(one, again)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(one, three, rtol=tol, atol=tol)
