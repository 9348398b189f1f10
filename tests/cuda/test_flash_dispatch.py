"""flash_attention(device="cuda") with every keyword equals device="cpu" (simulator).

The functional layer lays the arrays out once and calls
``kernels_for("flash", device)`` with the same arguments on both devices and
copies the GPU twin's results back to the host.
"""

import os

import numpy as np
import pytest

import nbattn

from .test_cuda_flash import assert_close_to_scale

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

TOL = {np.float64: 1e-10, np.float32: 3e-5}


def _close(got, ref, dtype):
    assert_close_to_scale(got, ref, TOL[dtype])


def _both(q, k, v, dtype, **keywords):
    """Forward and backward on both devices, compared."""
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, device="cuda", **keywords)
    ref_out, ref_lse = nbattn.flash_attention(q, k, v, return_lse=True, **keywords)
    assert isinstance(out, np.ndarray) and out.dtype == dtype
    _close(out, ref_out, dtype)
    _close(lse, ref_lse, dtype)
    grad = np.random.default_rng(1).normal(size=out.shape).astype(dtype)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, grad, device="cuda", **keywords)
    ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, grad, **keywords)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == dtype
        _close(g, r, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_key_padding_gqa_window_bottom_right(rng, dtype):
    q = rng.normal(size=(2, 4, 6, 3)).astype(dtype)
    k = rng.normal(size=(2, 2, 9, 3)).astype(dtype)
    v = rng.normal(size=(2, 2, 9, 2)).astype(dtype)
    pad = rng.random((2, 1, 1, 9)) < 0.7
    _both(
        q, k, v, dtype, mask=pad, enable_gqa=True, window=(2, 1),
        causal_alignment="bottom_right", causal=True,
    )  # fmt: skip


def test_float_mask_softcap_dropout(rng):
    q = rng.normal(size=(3, 5, 4)) * 2
    k = rng.normal(size=(3, 7, 4))
    v = rng.normal(size=(3, 7, 3))
    mask = rng.normal(size=(5, 7))
    mask[2] = -np.inf  # a row without keys
    _both(q, k, v, np.float64, mask=mask, softcap=2.0, dropout_p=0.25, random_state=11)


@pytest.mark.parametrize(
    "keywords, name",
    [
        ({"window": (1, 1)}, "window"),
        ({"softcap": 3.0}, "softcap"),
        ({"dropout_p": 0.5, "random_state": 3}, "dropout_p"),
        ({"causal_alignment": "bottom_right"}, "causal_alignment"),
    ],
)
def test_gpu_arrays_refuse_the_keywords_they_do_not_take(rng, keywords, name):
    """GPU arrays are used in place for plain attention only: a clear error names the keyword."""
    from numba import cuda

    q = cuda.to_device(rng.normal(size=(2, 3, 4)))
    with pytest.raises(ValueError, match=f"GPU arrays do not support {name}"):
        nbattn.flash_attention(q, q, q, device="cuda", **keywords)
    with pytest.raises(ValueError, match=f"GPU arrays do not support {name}"):
        nbattn.flash_attention_backward(q, q, q, q, q[:, :, 0], q, device="cuda", **keywords)


def test_gpu_arrays_still_run_plain_causal_attention(rng):
    from numba import cuda

    q, k, v = (rng.normal(size=(2, 5, 3)) for _ in range(3))
    out = nbattn.flash_attention(*map(cuda.to_device, (q, k, v)), causal=True, device="cuda")
    _close(out.copy_to_host(), nbattn.flash_attention(q, k, v, causal=True), np.float64)
