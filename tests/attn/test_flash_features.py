"""Flash attention features on the CPU: masks on the tiles, grouped-query attention,
windows, bottom-right causal alignment, softcap and dropout, forward and backward.

Compared with torch's scaled_dot_product_attention and autograd where torch has
the feature (masks, enable_gqa, scale, is_causal; bottom-right causal and
windows as explicit masks), and with the full-matrix NumPy references in
tests/naive.py otherwise (softcap, dropout with the spec's counter hash).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.attn.flash import flash_attention, flash_attention_backward

from .. import naive
from ..strategies import seeds

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 2e-5}


# Tiles of 8 x 16 so that small inputs cross many tile boundaries, on all threads.
pytestmark = pytest.mark.usefixtures("small_flash_tiles")


def _close(actual, expected, dtype, what=""):
    """max |actual - expected| <= tol * max(1, max |expected|); both finite."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, what
    assert np.isfinite(actual).all(), what
    err = np.abs(actual - expected).max() if actual.size else 0.0
    bound = TOL[dtype] * max(1.0, np.abs(expected).max() if expected.size else 0.0)
    assert err <= bound, f"{what}: error {err:.3g} > {bound:.3g}"


def _torch_reference(q, k, v, g, mask=None, causal=False, scale=None, enable_gqa=False):
    """torch SDPA forward and autograd gradients (rows torch leaves NaN count as zeros)."""
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tm = None if mask is None else torch.tensor(np.asarray(mask))
    out = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=tm, is_causal=causal, scale=scale, enable_gqa=enable_gqa
    )
    out.backward(torch.tensor(g))
    grads = [np.nan_to_num(t.grad.numpy()) for t in (tq, tk, tv)]
    return np.nan_to_num(out.detach().numpy()), grads


def _check_against(reference, q, k, v, g, dtype, **kwargs):
    out, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
    assert out.dtype == dtype
    ref_out, ref_grads = reference
    _close(out, ref_out, dtype, "out")
    grads = flash_attention_backward(q, k, v, out, lse, g, **kwargs)
    for name, grad, ref in zip("qkv", grads, ref_grads):
        assert grad.dtype == dtype
        _close(grad, ref, dtype, f"d{name}")
    return out, lse


def _inputs(rng, q_shape, k_shape, v_width, dtype):
    q = rng.standard_normal(q_shape).astype(dtype)
    k = rng.standard_normal(k_shape).astype(dtype)
    v = rng.standard_normal(k_shape[:-1] + (v_width,)).astype(dtype)
    g = rng.standard_normal(q_shape[:-1] + (v_width,)).astype(dtype)
    return q, k, v, g


# --------------------------------------------------------------------------- against torch
def _masks(rng, B, H, L, S, dtype):
    keys = rng.random((B, 1, 1, S)) > 0.3
    keys[..., 0] = True
    return {
        "bool": rng.random((B, 1, L, S)) > 0.4,
        "float": rng.standard_normal((1, H, L, S)).astype(dtype),
        "key_padding": keys,
        "float_with_-inf": np.where(
            rng.random((L, S)) > 0.3, rng.standard_normal((L, S)), -np.inf
        ).astype(dtype),
    }


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["bool", "float", "key_padding", "float_with_-inf"])
@pytest.mark.parametrize("causal", [False, True])
def test_masks_vs_torch(rng, dtype, kind, causal):
    B, H, L, S, E = 2, 3, 29, 41, 12
    q, k, v, g = _inputs(rng, (B, H, L, E), (B, H, S, E), 10, dtype)
    mask = _masks(rng, B, H, L, S, dtype)[kind]
    tmask = mask
    if causal:  # torch refuses attn_mask with is_causal: causal goes into the mask
        tril = np.tril(np.ones((L, S), bool))
        tmask = mask & tril if mask.dtype == bool else np.where(tril, mask, -np.inf)
    reference = _torch_reference(q, k, v, g, mask=tmask)
    _check_against(reference, q, k, v, g, dtype, mask=mask, causal=causal)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa_vs_torch(rng, dtype, causal, heads):
    H, H_kv = heads
    q, k, v, g = _inputs(rng, (2, H, 23, 16), (2, H_kv, 37, 16), 8, dtype)
    reference = _torch_reference(q, k, v, g, causal=causal, enable_gqa=True)
    _check_against(reference, q, k, v, g, dtype, causal=causal, enable_gqa=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gqa_with_mask_and_scale_vs_torch(rng, dtype):
    q, k, v, g = _inputs(rng, (2, 6, 19, 8), (2, 2, 33, 8), 5, dtype)
    mask = rng.random((2, 1, 19, 33)) > 0.5
    reference = _torch_reference(q, k, v, g, mask=mask, scale=0.3, enable_gqa=True)
    _check_against(reference, q, k, v, g, dtype, mask=mask, scale=0.3, enable_gqa=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_q, n_k", [(17, 45), (45, 17), (33, 33), (1, 40), (40, 1)])
def test_bottom_right_causal_vs_explicit_mask(rng, dtype, n_q, n_k):
    q, k, v, g = _inputs(rng, (2, n_q, 16), (2, n_k, 16), 7, dtype)
    tril = np.tril(np.ones((n_q, n_k), bool), k=n_k - n_q)
    reference = _torch_reference(q, k, v, g, mask=tril)
    out, lse = _check_against(
        reference, q, k, v, g, dtype, causal=True, causal_alignment="bottom_right"
    )
    empty = ~tril.any(axis=1)  # L > S: the first L - S rows see no key
    assert np.all(lse[:, empty] == -np.inf) and np.all(out[:, empty] == 0.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "window, causal, alignment",
    [
        ((5, 3), False, "top_left"),
        ((7, None), True, "top_left"),
        ((None, 2), False, "bottom_right"),
        ((10, 0), False, "bottom_right"),
        ((0, 0), False, "top_left"),
        ((20, 20), True, "bottom_right"),
    ],
)
def test_windows_vs_band_mask(rng, dtype, window, causal, alignment):
    n_q, n_k = 37, 53
    q, k, v, g = _inputs(rng, (2, 2, n_q, 16), (2, 2, n_k, 16), 9, dtype)
    band = naive.band_mask(n_q, n_k, causal, window, alignment)
    reference = _torch_reference(q, k, v, g, mask=band)
    kwargs = dict(window=window, causal=causal, causal_alignment=alignment)
    _check_against(reference, q, k, v, g, dtype, **kwargs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_window_with_mask_and_gqa_vs_torch(rng, dtype):
    q, k, v, g = _inputs(rng, (1, 4, 40, 8), (1, 2, 40, 8), 8, dtype)
    mask = rng.standard_normal((1, 1, 40, 40)).astype(dtype)
    band = naive.band_mask(40, 40, True, (9, None))
    reference = _torch_reference(q, k, v, g, mask=np.where(band, mask, -np.inf), enable_gqa=True)
    kwargs = dict(mask=mask, window=(9, None), causal=True, enable_gqa=True)
    _check_against(reference, q, k, v, g, dtype, **kwargs)


# --------------------------------------------------------------------------- softcap
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("softcap", [0.5, 3.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_vs_naive(rng, dtype, softcap, causal):
    q, k, v, g = _inputs(rng, (2, 3, 27, 16), (2, 3, 35, 16), 6, dtype)
    q *= 3  # scores beyond the cap, where tanh bends
    mask = rng.standard_normal((27, 35))
    kwargs = dict(mask=mask, causal=causal, softcap=softcap)
    out, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
    ref_out, ref_lse = naive.flash_features(q, k, v, **kwargs)
    _close(out, ref_out, dtype, "out")
    _close(lse, ref_lse, dtype, "lse")
    grads = flash_attention_backward(q, k, v, out, lse, g, **kwargs)
    for name, grad, ref in zip("qkv", grads, naive.flash_features_backward(q, k, v, g, **kwargs)):
        _close(grad, ref, dtype, f"d{name}")


def test_softcap_gradient_matches_finite_differences(rng):
    q, k, v, g = _inputs(rng, (1, 6, 4), (1, 9, 4), 3, np.float64)
    kwargs = dict(softcap=0.7, scale=2.0)

    def loss(q_, k_):
        return float((flash_attention(q_, k_, v, **kwargs) * g).sum())

    out, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
    dq, dk, _ = flash_attention_backward(q, k, v, out, lse, g, **kwargs)
    h = 1e-6
    for idx in [(0, 0, 0), (0, 3, 2), (0, 5, 1)]:
        e = np.zeros_like(q)
        e[idx] = h
        assert abs((loss(q + e, k) - loss(q - e, k)) / (2 * h) - dq[idx]) < 1e-7
    for idx in [(0, 0, 0), (0, 8, 3)]:
        e = np.zeros_like(k)
        e[idx] = h
        assert abs((loss(q, k + e) - loss(q, k - e)) / (2 * h) - dk[idx]) < 1e-7


# --------------------------------------------------------------------------- dropout
def test_keep_matches_the_definition():
    from numba import njit

    from nbattn.kernels.dropout import keep

    @njit
    def decisions(seed, counters, threshold):
        out = np.empty(counters.size, dtype=np.bool_)
        for n in range(counters.size):
            out[n] = keep(seed, counters[n], threshold)
        return out

    rng = np.random.default_rng(5)
    counters = np.concatenate(
        [np.arange(2000, dtype=np.uint64), rng.integers(0, 2**64, 2000, dtype=np.uint64)]
    )
    counters[-1] = np.uint64(2**64 - 1)  # counter + 1 wraps
    for seed, p in [(0, 0.5), (2**64 - 1, 0.1), (123456789, 0.9), (7, 0.0)]:
        threshold = np.uint64(round(p * 2**24))
        got = decisions(np.uint64(seed), counters, threshold)
        want = [naive.dropout_keep(seed, int(c), int(threshold)) for c in counters]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_the_counter_mask(rng, dtype, causal):
    """The kernels drop exactly the weights the spec's hash drops, forward and backward."""
    q, k, v, g = _inputs(rng, (2, 2, 21, 8), (2, 2, 30, 8), 5, dtype)
    p, seed = 0.3, 2**63 + 12345
    factors = naive.dropout_factors(seed, 4, 21, 30, p).reshape(2, 2, 21, 30)
    kwargs = dict(causal=causal)
    out, lse = flash_attention(q, k, v, return_lse=True, dropout_p=p, random_state=seed, **kwargs)
    ref_out, ref_lse = naive.flash_features(q, k, v, dropout=factors, **kwargs)
    _close(out, ref_out, dtype, "out")
    _close(lse, ref_lse, dtype, "lse (before dropout)")
    grads = flash_attention_backward(q, k, v, out, lse, g, dropout_p=p, random_state=seed, **kwargs)
    refs = naive.flash_features_backward(q, k, v, g, dropout=factors, **kwargs)
    for name, grad, ref in zip("qkv", grads, refs):
        _close(grad, ref, dtype, f"d{name}")


def test_dropout_independent_of_tiles_and_threads(rng, monkeypatch):
    import numba

    q, k, v, _ = _inputs(rng, (3, 2, 40, 8), (3, 2, 50, 8), 4, np.float64)
    first = flash_attention(q, k, v, dropout_p=0.4, random_state=99)
    monkeypatch.setattr(config, "FLASH_BLOCK_Q", 16)
    monkeypatch.setattr(config, "FLASH_BLOCK_K", 8)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        again = flash_attention(q, k, v, dropout_p=0.4, random_state=99)
    finally:
        numba.set_num_threads(saved)
    np.testing.assert_allclose(again, first, rtol=1e-13, atol=1e-13)
    other = flash_attention(q, k, v, dropout_p=0.4, random_state=100)
    assert np.abs(other - first).max() > 1e-3


def test_dropout_mean_over_seeds_approaches_the_expectation(rng):
    """E[out] over seeds is the dropout-free output; the tolerance follows from the
    per-seed spread (5 standard errors of the mean, entry by entry)."""
    q, k, v, _ = _inputs(rng, (1, 12, 8), (1, 20, 8), 3, np.float64)
    plain = flash_attention(q, k, v)
    n = 400
    draws = np.stack([flash_attention(q, k, v, dropout_p=0.25, random_state=s) for s in range(n)])
    stderr = draws.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(draws.mean(axis=0) - plain) <= 5 * stderr + 1e-12)
    # and the draws do differ, with the drop rate the spec asks for
    factors = naive.dropout_factors(3, 1, 12, 20, 0.25)
    assert abs((factors == 0).mean() - 0.25) < 0.08


def test_dropout_gradient_matches_finite_differences(rng):
    q, k, v, g = _inputs(rng, (1, 7, 4), (1, 11, 4), 3, np.float64)
    kwargs = dict(dropout_p=0.3, random_state=2024, causal=True)

    def loss(q_, k_, v_):
        return float((flash_attention(q_, k_, v_, **kwargs) * g).sum())

    out, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
    grads = flash_attention_backward(q, k, v, out, lse, g, **kwargs)
    h = 1e-6
    for which, arr in enumerate((q, k, v)):
        for idx in [(0, 0, 0), (0, arr.shape[1] - 1, 2), (0, arr.shape[1] // 2, 1)]:
            args = [q, k, v]
            e = np.zeros_like(arr)
            e[idx] = h
            args[which] = arr + e
            up = loss(*args)
            args[which] = arr - e
            fd = (up - loss(*args)) / (2 * h)
            assert abs(fd - grads[which][idx]) < 1e-7


def test_dropout_backward_needs_the_int_seed(rng):
    q, k, v, g = _inputs(rng, (1, 4, 4), (1, 4, 4), 4, np.float64)
    out, lse = flash_attention(q, k, v, return_lse=True, dropout_p=0.2)  # fresh seed: allowed
    for bad in (None, np.random.default_rng(0)):
        with pytest.raises(ValueError, match="random_state"):
            flash_attention_backward(q, k, v, out, lse, g, dropout_p=0.2, random_state=bad)


def test_dropout_seed_rules():
    from nbattn._core.numeric import dropout_seed

    assert dropout_seed(5) == 5 and dropout_seed(-1) == 2**64 - 1 and dropout_seed(2**64 + 3) == 3
    assert dropout_seed(np.random.default_rng(1)) == dropout_seed(np.random.default_rng(1))
    assert dropout_seed(None) != dropout_seed(None)
    for bad in ("1", 1.5, True):
        with pytest.raises(ValueError, match="random_state"):
            dropout_seed(bad)


# --------------------------------------------------------------------------- properties
@settings(max_examples=25)
@given(
    n_q=st.sampled_from([1, 2, 9, 17, 33]),
    n_k=st.sampled_from([1, 3, 16, 31, 47]),
    e=st.sampled_from([1, 8, 64, 256]),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    mask_kind=st.sampled_from(["none", "bool", "float", "keys", "rows"]),
    window=st.sampled_from([None, (0, 0), (3, None), (None, 4), (5, 2)]),
    causal=st.booleans(),
    alignment=st.sampled_from(["top_left", "bottom_right"]),
    softcap=st.sampled_from([None, 2.0]),
    seed=seeds,
)
def test_property_features_vs_naive(
    n_q, n_k, e, heads, mask_kind, window, causal, alignment, softcap, seed
):
    rng = np.random.default_rng(seed)
    H, H_kv = heads
    q, k, v, g = _inputs(rng, (2, H, n_q, e), (2, H_kv, n_k, e), 3, np.float64)
    mask = {
        "none": None,
        "bool": rng.random((2, 1, n_q, n_k)) > 0.3,
        "float": rng.standard_normal((H, n_q, n_k)),
        "keys": rng.random((2, 1, 1, n_k)) > 0.3,
        "rows": np.where(rng.random((n_q, 1)) > 0.2, 0.5, -np.inf),
    }[mask_kind]
    kwargs = dict(
        mask=mask,
        window=window,
        causal=causal,
        softcap=softcap,
        enable_gqa=H != H_kv,
    )
    out, lse = flash_attention(q, k, v, return_lse=True, causal_alignment=alignment, **kwargs)
    ref_out, ref_lse = naive.flash_features(q, k, v, alignment=alignment, **kwargs)
    _close(out, ref_out, np.float64, "out")
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    _close(lse[finite], ref_lse[finite], np.float64, "lse")
    grads = flash_attention_backward(q, k, v, out, lse, g, causal_alignment=alignment, **kwargs)
    refs = naive.flash_features_backward(q, k, v, g, alignment=alignment, **kwargs)
    for name, grad, ref in zip("qkv", grads, refs):
        _close(grad, ref, np.float64, f"d{name}")


# --------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fully_masked_rows_are_zero_never_nan(rng, dtype):
    q, k, v, g = _inputs(rng, (2, 20, 8), (2, 24, 8), 5, dtype)
    mask = rng.random((2, 20, 24)) > 0.5
    mask[0, 3] = False
    mask[1, 10:19] = False  # a whole query tile and more
    for kwargs in (dict(mask=mask), dict(mask=mask, window=(2, 2), softcap=1.0)):
        out, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
        assert np.all(out[0, 3] == 0.0) and np.all(out[1, 10:19] == 0.0)
        assert lse[0, 3] == -np.inf and np.all(lse[1, 10:19] == -np.inf)
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, g, **kwargs)
        assert np.all(dq[0, 3] == 0.0) and np.all(dq[1, 10:19] == 0.0)
        for grad in (dq, dk, dv):
            assert np.isfinite(grad).all()
    everything = np.zeros((20, 24), bool)
    out, lse = flash_attention(q, k, v, return_lse=True, mask=everything)
    grads = flash_attention_backward(q, k, v, out, lse, g, mask=everything)
    assert np.all(out == 0.0) and np.all(lse == -np.inf)
    assert all(np.all(grad == 0.0) for grad in grads)


def test_huge_float_mask_is_shifted_exactly(rng):
    """Biases near the float64 range: the keys at a row's largest bias share its weight
    exactly as with a 0 / -inf mask, and lse carries the bias."""
    q, k, v, g = _inputs(rng, (1, 9, 4), (1, 12, 4), 3, np.float64)
    top = rng.random((9, 12)) > 0.6
    top[:, 0] = True
    huge = np.where(top, 1e300, -1e300)
    for causal in (False, True):
        ref_out, ref_lse = flash_attention(q, k, v, mask=top, return_lse=True, causal=causal)
        out, lse = flash_attention(q, k, v, mask=huge, return_lse=True, causal=causal)
        _close(out, ref_out, np.float64, "out")
        np.testing.assert_allclose(lse, ref_lse + 1e300, rtol=1e-15)
        ref_grads = flash_attention_backward(q, k, v, ref_out, ref_lse, g, mask=top, causal=causal)
        grads = flash_attention_backward(q, k, v, out, lse, g, mask=huge, causal=causal)
        for grad, ref in zip(grads, ref_grads):
            _close(grad, ref, np.float64, "gradient")
    small = rng.standard_normal((9, 12))
    for causal in (False, True):
        ref_out = flash_attention(q, k, v, mask=small, causal=causal)
        f32 = flash_attention(
            *(a.astype(np.float32) for a in (q, k, v)), mask=small + 1e6, causal=causal
        )
        _close(f32, ref_out, np.float32, "float32 out with a 1e6 bias")


def test_inputs_not_modified(rng):
    q, k, v, g = _inputs(rng, (2, 4, 9, 8), (2, 2, 11, 8), 3, np.float32)
    mask = rng.random((2, 1, 9, 11)) > 0.3
    saved = [a.copy() for a in (q, k, v, g, mask)]
    kwargs = dict(mask=mask, enable_gqa=True, window=(3, 3), softcap=2.0)
    out, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
    flash_attention_backward(q, k, v, out, lse, g, **kwargs)
    for before, after in zip(saved, (q, k, v, g, mask)):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mask=np.ones((5, 6), bool)), "mask"),
        (dict(mask=np.ones((3, 4))), "mask"),
        (dict(mask=np.ones((7, 4), dtype=np.int64)), "mask"),
        (dict(mask=np.full((4, 7), np.nan)), "mask"),
        (dict(enable_gqa=True, k_heads=3), "enable_gqa"),
        (dict(k_heads=2), "enable_gqa"),
        (dict(enable_gqa="yes"), "enable_gqa"),
        (dict(window=(-1, 2)), "window"),
        (dict(window=(1,)), "window"),
        (dict(window=(1.5, 2)), "window"),
        (dict(softcap=0.0), "softcap"),
        (dict(softcap=-2.0), "softcap"),
        (dict(softcap=np.inf), "softcap"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(dropout_p=-0.1), "dropout_p"),
        (dict(dropout_p="0.1"), "dropout_p"),
        (dict(causal_alignment="bottom"), "causal_alignment"),
        (dict(dropout_p=0.1, random_state="x"), "random_state"),
    ],
)
def test_bad_keywords_are_refused(kwargs, match):
    kwargs = dict(kwargs)
    k_heads = kwargs.pop("k_heads", 4)
    q = np.ones((1, 4, 4, 2))
    k = np.ones((1, k_heads, 7, 2))
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, k, **kwargs)


def test_public_name_takes_the_keywords(rng):
    q, k, v, _ = _inputs(rng, (1, 4, 6, 4), (1, 2, 6, 4), 4, np.float64)
    expected = flash_attention(q, k, v, enable_gqa=True, window=(1, 1))
    np.testing.assert_array_equal(
        nbattn.flash_attention(q, k, v, enable_gqa=True, window=(1, 1)), expected
    )


# --------------------------------------------------------------------------- routing
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("stacked", [False, True])
def test_multi_head_attention_grouped_kv_heads(rng, need_weights, stacked):
    """num_kv_heads: H_kv key/value projections of width d shared by H / H_kv query heads."""
    B, L, S, E, H, H_kv = 2, 9, 13, 16, 4, 2
    d = E // H
    x = rng.standard_normal((B, L, E))
    memory = rng.standard_normal((B, S, E))
    wq, wk, wv = (0.3 * rng.standard_normal((n, E)) for n in (E, H_kv * d, H_kv * d))
    wo = 0.3 * rng.standard_normal((E, E))
    bias = rng.standard_normal(E + 2 * H_kv * d)
    keys = rng.random((B, S)) > 0.3
    keys[:, 0] = True
    weights = (
        dict(in_proj_weight=np.concatenate([wq, wk, wv]))
        if stacked
        else dict(q_proj_weight=wq, k_proj_weight=wk, v_proj_weight=wv)
    )
    out, w = nbattn.multi_head_attention(
        x,
        memory,
        memory,
        H,
        in_proj_bias=bias,
        out_proj_weight=wo,
        key_mask=keys,
        causal=True,
        num_kv_heads=H_kv,
        need_weights=need_weights,
        **weights,
    )

    def heads(y, n):
        return np.swapaxes(y.reshape(y.shape[:-1] + (n, d)), -2, -3)

    qh = heads(x @ wq.T + bias[:E], H)
    kh = heads(memory @ wk.T + bias[E : E + H_kv * d], H_kv)
    vh = heads(memory @ wv.T + bias[E + H_kv * d :], H_kv)
    ref_h, _ = naive.flash_features(
        qh, kh, vh, mask=keys[:, None, None, :], causal=True, enable_gqa=True
    )
    ref = np.swapaxes(ref_h, -2, -3).reshape(B, L, E) @ wo.T
    _close(out, ref, np.float64, "out")
    if need_weights:
        assert w.shape == (B, L, S)
        np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
    else:
        assert w is None
    with pytest.raises(ValueError, match="num_kv_heads"):
        nbattn.multi_head_attention(x, memory, memory, H, num_kv_heads=3, **weights)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_masks_run_on_the_flash_tiles(rng, dtype, monkeypatch):
    """attention() with a mask and causal takes the flash path and matches torch."""
    import nbattn.attn.flash

    calls = []
    flash_attention = nbattn.flash.flash_attention_owned

    def counted(*args, **kwargs):
        calls.append(1)
        return flash_attention(*args, **kwargs)

    monkeypatch.setattr(nbattn.flash, "flash_attention_owned", counted)
    q, k, v, g = _inputs(rng, (2, 3, 17, 8), (2, 3, 17, 8), 5, dtype)
    mask = rng.random((2, 1, 17, 17)) > 0.3
    out = nbattn.attention(q, k, v, mask=mask, causal=True)
    assert calls, "attention() with a mask did not take the flash path"
    tril = np.tril(np.ones((17, 17), bool))
    ref, _ = _torch_reference(q, k, v, g, mask=mask & tril)
    _close(out, ref, dtype, "out")
