"""flash_attention_varlen and flash_decode with device="cuda" equal device="cpu"
(simulator): the functional layer calls ``kernels_for("varlen" | "decode", device)``
with the same arguments and brings the device results back."""

import os

import numpy as np
import pytest

import nbattn

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)


def test_varlen_forward_and_backward(rng):
    cu_q = np.array([0, 2, 2, 7])
    cu_k = np.array([0, 4, 6, 11])
    q = rng.normal(size=(4, 7, 3))
    k = rng.normal(size=(2, 11, 3))
    v = rng.normal(size=(2, 11, 2))
    kw = dict(causal=True, causal_alignment="bottom_right", enable_gqa=True, softcap=2.0)
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, device="cuda", **kw
    )
    ref_out, ref_lse = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-12)
    grad = rng.normal(size=out.shape)
    args = (q, k, v, ref_out, ref_lse, grad, cu_q, cu_k)
    got = nbattn.flash_attention_varlen_backward(*args, device="cuda", **kw)
    ref = nbattn.flash_attention_varlen_backward(*args, **kw)
    for g, r in zip(got, ref, strict=True):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-12)


def test_decode_step(rng):
    """B = 3 rows with 0, 5 and 17 cached keys, one new token each, GQA."""
    lengths = np.array([0, 5, 17])
    q = rng.normal(size=(3, 4, 1, 3))
    k_new = rng.normal(size=(3, 2, 1, 3))
    v_new = rng.normal(size=(3, 2, 1, 2))
    caches = [rng.normal(size=(3, 2, 20, 3)), rng.normal(size=(3, 2, 20, 2))]

    def step(device):
        k_cache, v_cache = (c.copy() for c in caches)
        return nbattn.flash_decode(
            q, k_cache, v_cache, lengths, k_new, v_new, return_lse=True, enable_gqa=True,
            window=(6, None), device=device,
        )  # fmt: skip

    out, lse = step("cuda")
    ref_out, ref_lse = step("cpu")
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-12)


def test_varlen_float32_window_dropout(rng):
    """float32 stays float32 through the GPU path; dropout draws the CPU's bits."""
    cu_q = np.array([0, 3, 8])
    cu_k = np.array([0, 6, 10])
    q, k = (rng.normal(size=(2, n, 4)).astype(np.float32) for n in (8, 10))
    v = rng.normal(size=(2, 10, 3)).astype(np.float32)
    kw = dict(window=(2, 1), dropout_p=0.3, random_state=5)
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, device="cuda", **kw
    )
    ref_out, ref_lse = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    assert out.dtype == np.float32 and isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=3e-5 * np.abs(ref_out).max())
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=3e-5 * np.abs(ref_lse).max())
    grad = rng.normal(size=out.shape).astype(np.float32)
    args = (q, k, v, ref_out, ref_lse, grad, cu_q, cu_k)
    got = nbattn.flash_attention_varlen_backward(*args, device="cuda", **kw)
    ref = nbattn.flash_attention_varlen_backward(*args, **kw)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=0, atol=3e-5 * np.abs(r).max())
