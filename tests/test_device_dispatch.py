"""device= on flash attention and the LOO functions, on a machine without a GPU.

The CUDA results themselves are tested under the simulator (tests/cuda) and
by scripts/bench_gpu.py on a GPU; here: "cpu" and "auto" give the CPU
results, "cuda" without a GPU says what is missing, bad names are rejected.
"""

import numpy as np
import pytest

import nbattn
from nbattn import learning
from nbattn.device import cuda_available

needs_no_gpu = pytest.mark.skipif(cuda_available(), reason="a GPU (or the simulator) is present")


@needs_no_gpu
def test_auto_is_cpu_without_gpu(rng):
    q, k, v = (rng.normal(size=(2, 5, 3)) for _ in range(3))
    out, lse = nbattn.flash_attention(q, k, v, True, return_lse=True, device="auto")
    ref_out, ref_lse = nbattn.flash_attention(q, k, v, True, return_lse=True)
    np.testing.assert_array_equal(out, ref_out)
    g = rng.normal(size=out.shape)
    got = nbattn.flash_attention_backward(q, k, v, out, lse, g, True, device="auto")
    ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, True)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a, b)
    X, y = rng.normal(size=(9, 2)), rng.normal(size=9)
    assert learning.loo_loss(X, y, 0.8, device="auto") == learning.loo_loss(X, y, 0.8)


@needs_no_gpu
@pytest.mark.parametrize(
    "call",
    [
        lambda q: nbattn.flash_attention(q, q, q, device="cuda"),
        lambda q: nbattn.flash_attention_backward(q, q, q, q, q[..., 0], q, device="cuda"),
        lambda q: learning.loo_loss(q, q[:, 0], 1.0, device="cuda"),
        lambda q: learning.loo_loss_and_grad(q, q[:, 0], 1.0, device="cuda"),
        lambda q: learning.loo_bandwidth(q, q[:, 0], device="cuda"),
        lambda q: learning.fit_learned_kernel(q, q[:, 0], device="cuda"),
    ],
)
def test_cuda_without_gpu_says_what_is_missing(rng, call):
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
        call(rng.normal(size=(4, 3)))


def test_unknown_device_is_rejected(rng):
    q = rng.normal(size=(3, 2))
    with pytest.raises(ValueError, match="device must be one of"):
        nbattn.flash_attention(q, q, q, device="tpu")
    with pytest.raises(ValueError, match="device must be one of"):
        learning.loo_loss(q, q[:, 0], 1.0, device="gpu")


def test_kernels_for_names_every_op_and_device():
    from nbattn import device

    ops = {op for op, _ in device.KERNELS}
    assert {"pooling", "loo", "flash", "local", "varlen", "decode"} <= ops
    for op in sorted(ops):
        assert device.kernels_for(op, "cpu").__name__ == f"nbattn.kernels.{op}"
    with pytest.raises(ValueError, match="unknown kernel op"):
        device.kernels_for("convolution", "cpu")


@needs_no_gpu
def test_device_for_host_and_gpu_arrays(rng):
    from nbattn.device import device_for

    x = rng.normal(size=(3, 2))
    assert device_for("cpu", x) == "cpu"
    assert device_for("auto", x, None) == "cpu"
    with pytest.raises(ValueError, match="device must be one of"):
        device_for("gpu", x)
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
        device_for("cuda", x)
