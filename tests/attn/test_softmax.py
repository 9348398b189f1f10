"""softmax, log_softmax, masked_softmax and the online-softmax state merge vs tests/naive.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn.softmax import merge_attention_states

from .. import naive
from ..strategies import huge_values, seeds


def assert_close(actual, expected, dtype=np.float64):
    expected = np.asarray(expected, dtype=np.float64)
    assert np.shape(actual) == expected.shape
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), finite)
    assert np.array_equal(actual[~finite], expected[~finite])
    scale = max(1.0, float(np.abs(expected[finite]).max())) if finite.any() else 1.0
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_matches_naive(rng, dtype, axis):
    x = (rng.normal(size=(3, 5, 7)) * 4).astype(dtype)
    out = nbattn.softmax(x, axis=axis)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, naive.softmax(x, axis), dtype)
    assert_close(nbattn.log_softmax(x, axis=axis), naive.log_softmax(x, axis), dtype)


def test_softmax_is_stable_for_large_scores():
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -1e4]])
    assert_close(nbattn.softmax(x), naive.softmax(x))
    assert_close(nbattn.log_softmax(x), naive.log_softmax(x))


def test_softmax_single_entry_and_1d():
    assert_close(nbattn.softmax(np.array([[3.0]])), [[1.0]])
    x = np.array([0.5, -1.0, 2.0])
    assert_close(nbattn.softmax(x), naive.softmax(x))


def test_softmax_boolean_and_float_masks(rng):
    x = rng.normal(size=(4, 6))
    mask = rng.random((4, 6)) > 0.4
    mask[2] = False  # a fully masked row
    out = nbattn.softmax(x, mask=mask)
    expected = naive.softmax(np.where(mask, x, -np.inf))
    assert_close(out, expected)
    assert not np.isnan(out).any() and np.all(out[2] == 0)
    fmask = rng.normal(size=(6,))
    assert_close(nbattn.softmax(x, mask=fmask), naive.softmax(x + fmask))
    lsm = nbattn.log_softmax(x, mask=mask)
    assert_close(lsm, naive.log_softmax(np.where(mask, x, -np.inf)))
    assert np.all(lsm[2] == -np.inf)


def test_inputs_not_modified(rng):
    x = rng.normal(size=(3, 4))
    x0 = x.copy()
    nbattn.softmax(x)
    nbattn.log_softmax(x)
    nbattn.masked_softmax(x, np.array([1, 2, 3]))
    assert np.array_equal(x, x0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_masked_softmax_per_batch_and_per_row(rng, dtype):
    x = rng.normal(size=(3, 4, 5)).astype(dtype)
    lens = np.array([2, 0, 5])
    out = nbattn.masked_softmax(x, lens)
    assert out.dtype == dtype
    assert_close(out, naive.masked_softmax(x, lens), dtype)
    assert np.all(out[1] == 0) and not np.isnan(out).any()
    lens2 = rng.integers(0, 6, size=(3, 4))
    assert_close(nbattn.masked_softmax(x, lens2), naive.masked_softmax(x, lens2), dtype)
    # no lengths: plain softmax
    assert_close(nbattn.masked_softmax(x), naive.softmax(x), dtype)


def test_masked_softmax_with_mask(rng):
    x = rng.normal(size=(2, 3, 4))
    mask = rng.random((3, 4)) > 0.3
    out = nbattn.masked_softmax(x, np.array([3, 1]), mask=mask)
    assert_close(out, naive.masked_softmax(np.where(mask, x, -np.inf), np.array([3, 1])))


@pytest.mark.parametrize(
    "lens, match",
    [
        (np.array([1, 6]), "valid_lens must lie"),
        (np.array([-1, 2]), "valid_lens must lie"),
        (np.array([1, 2, 3]), "valid_lens has shape"),
        (np.array([1.5, 2.0]), "valid_lens must hold whole"),
        (np.array(["a", "b"]), "valid_lens must be an integer"),
    ],
)
def test_masked_softmax_rejects_bad_lengths(lens, match):
    with pytest.raises(ValueError, match=match):
        nbattn.masked_softmax(np.zeros((2, 3, 5)), lens)


def test_softmax_rejects_bad_input():
    with pytest.raises(ValueError, match="x contains NaN"):
        nbattn.softmax(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        nbattn.softmax(np.array([[1.0, np.inf]]))
    with pytest.raises(ValueError, match="axis"):
        nbattn.softmax(np.zeros((2, 3)), axis=2)
    with pytest.raises(ValueError, match="mask has shape"):
        nbattn.softmax(np.zeros((2, 3)), mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        nbattn.softmax(np.zeros((2, 3)), mask=np.ones((2, 3), int))
    with pytest.raises(ValueError, match="mask .* NaN"):
        nbattn.softmax(np.zeros((2, 3)), mask=np.full((2, 3), np.nan))


def test_softmax_matches_torch(rng):
    torch = pytest.importorskip("torch")
    x = rng.normal(size=(3, 4, 9)) * 3
    for axis in (-1, 1):
        t = torch.softmax(torch.tensor(x), dim=axis).numpy()
        np.testing.assert_allclose(nbattn.softmax(x, axis=axis), t, rtol=1e-12, atol=1e-15)
        t = torch.log_softmax(torch.tensor(x), dim=axis).numpy()
        np.testing.assert_allclose(nbattn.log_softmax(x, axis=axis), t, rtol=1e-12, atol=1e-12)


def _state(s, v):
    """Naive (out, lse) of scores s (n, m) over values v (m, d)."""
    w = naive.softmax_rows(s)
    m = s.max(axis=1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        lse = safe + np.log(np.exp(s - safe[:, None]).sum(axis=1))
    return w @ v, lse


def test_merge_states_equals_attention_over_all_keys(rng):
    s = rng.normal(size=(6, 10)) * 5
    s[1, :4] = -np.inf  # first part empty for row 1
    s[2, 4:] = -np.inf  # second part empty for row 2
    s[3] = -np.inf  # nothing at all for row 3
    v = rng.normal(size=(10, 3))
    out_a, lse_a = _state(s[:, :4], v[:4])
    out_b, lse_b = _state(s[:, 4:], v[4:])
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    full_out, full_lse = _state(s, v)
    assert_close(out, full_out)
    assert_close(lse, full_lse)
    assert np.all(out[3] == 0) and lse[3] == -np.inf


def test_merge_states_rejects_bad_shapes():
    with pytest.raises(ValueError, match="lse_a"):
        merge_attention_states(np.zeros((2, 3)), np.zeros(3), np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(ValueError, match="out_a"):
        merge_attention_states(np.zeros((2, 3)), np.zeros(2), np.zeros((2, 4)), np.zeros(2))


@settings(max_examples=25)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    seed=seeds,
    scale=st.floats(0.1, 50.0),
    f32=st.booleans(),
)
def test_softmax_property(shape, seed, scale, f32):
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    x = (rng.normal(size=shape) * scale).astype(dtype)
    axis = int(rng.integers(-len(shape), len(shape)))
    out = nbattn.softmax(x, axis=axis)
    assert_close(out, naive.softmax(x, axis), dtype)
    np.testing.assert_allclose(out.sum(axis=axis), 1.0, rtol=1e-5 if f32 else 1e-12)
    assert_close(nbattn.log_softmax(x, axis=axis), naive.log_softmax(x, axis), dtype)
    lens = rng.integers(0, shape[-1] + 1, size=shape[:1]) if len(shape) > 1 else None
    if lens is not None:
        assert_close(nbattn.masked_softmax(x, lens), naive.masked_softmax(x, lens), dtype)


# --------------------------------------------------------------------------- extreme magnitudes
@settings(max_examples=60)
@given(
    exponent=st.sampled_from([0, 2, 100, 300, 307, 308]),
    n=st.integers(1, 7),
    f32=st.booleans(),
    seed=seeds,
)
def test_huge_additive_masks_match_long_double(exponent, n, f32, seed):
    """x + mask at any magnitude up to the float64 range: the long-double answer, never NaN."""
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    x = (rng.uniform(-1, 1, size=(4, n)) * 10.0 ** min(exponent, 37 if f32 else 308)).astype(dtype)
    mask = huge_values(rng, (4, n), exponent)
    mask[0] = -np.inf  # a fully masked row
    total = x.astype(np.longdouble) + mask.astype(np.longdouble)
    ref = naive.softmax_extended(total).astype(np.float64)
    out = nbattn.softmax(x, mask=mask)
    assert out.dtype == dtype and not np.isnan(out).any()
    assert_close(out, ref, dtype)
    top = total.max(axis=1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lse = safe + np.log(np.exp(total - safe).sum(axis=1, keepdims=True))
        # beyond the dtype's range a log-probability rounds to -inf
        log_ref = np.where(np.isfinite(lse), total - lse, -np.inf).astype(dtype)
    log_out = nbattn.log_softmax(x, mask=mask)
    assert not np.isnan(log_out).any()
    finite = np.isfinite(log_ref) & (np.abs(log_ref) < np.finfo(dtype).max / 4)
    assert np.array_equal(np.isneginf(log_out[~finite]), np.isneginf(log_ref[~finite]))
    np.testing.assert_allclose(
        log_out[finite], log_ref[finite], rtol=1e-5 if f32 else 1e-12, atol=1e-5 if f32 else 1e-12
    )
    lens = rng.integers(0, n + 1, size=4)
    masked = nbattn.masked_softmax(x, lens, mask=mask)
    keep = np.arange(n)[None, :] < lens[:, None]
    ref_masked = naive.softmax_extended(np.where(keep, total, -np.inf)).astype(np.float64)
    assert_close(masked, ref_masked, dtype)


@pytest.mark.parametrize("scale", [1e10, 1e150, 1e300, 1e308])
def test_ties_at_huge_magnitudes(rng, scale):
    """x = a s, mask = b s with small integers a, b: uniform over the maxima of a + b.

    Crosses the overflow boundary (a + b = 2 at s = 1e308 is beyond float64)."""
    a = rng.integers(-1, 2, size=(200, 5)).astype(float)
    b = rng.integers(-1, 2, size=(200, 5)).astype(float)
    total = a + b
    top = total == total.max(axis=1, keepdims=True)
    expected = top / top.sum(axis=1, keepdims=True)
    assert_close(nbattn.softmax(a * scale, mask=b * scale), expected)
    # float32 scores with a float64 mask: a power of two keeps a s exact in both
    scale32 = 2.0 ** round(np.log2(min(scale, 1e37)))
    out32 = nbattn.softmax((a * scale32).astype(np.float32), mask=b * scale32)
    assert_close(out32, expected, np.float32)
