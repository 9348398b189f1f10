"""device= on flash attention and the LOO functions, on a machine without a GPU.

The CUDA results themselves are tested under the simulator (tests/cuda) and
by scripts/bench_gpu.py on a GPU; here: "cpu" and "auto" give the CPU
results, "cuda" without a GPU says what is missing, bad names are rejected.
"""

import numpy as np
import pytest

import nbattn
from nbattn.dispatch.device import cuda_available
from nbattn.smoothing import learned_metric, loo, width_search

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
    assert loo.loo_loss(X, y, 0.8, device="auto") == loo.loo_loss(X, y, 0.8)


@needs_no_gpu
@pytest.mark.parametrize(
    "call",
    [
        lambda q: nbattn.flash_attention(q, q, q, device="cuda"),
        lambda q: nbattn.flash_attention_backward(q, q, q, q, q[..., 0], q, device="cuda"),
        lambda q: loo.loo_loss(q, q[:, 0], 1.0, device="cuda"),
        lambda q: loo.loo_loss_and_grad(q, q[:, 0], 1.0, device="cuda"),
        lambda q: width_search.loo_bandwidth(q, q[:, 0], device="cuda"),
        lambda q: learned_metric.fit_learned_kernel(q, q[:, 0], device="cuda"),
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
        loo.loo_loss(q, q[:, 0], 1.0, device="gpu")


def test_kernels_for_names_every_op_and_device():
    from nbattn.dispatch import device

    ops = {op for op, _ in device.KERNELS}
    assert {"pooling", "loo", "flash", "local", "varlen", "decode"} <= ops
    # programmable attention's kernels are built per user function from the template
    # nbattn.kernels.flex (never imported as itself) by nbattn.kernels.flex_build
    named = {"flex": "flex_build"}
    for op in sorted(op for op, where in device.KERNELS if where == "cpu"):
        module = named.get(op, op)
        assert device.kernels_for(op, "cpu").__name__ == f"nbattn.kernels.{module}"
    for op, where in device.KERNELS:  # the CUDA twins carry the same module names
        if where == "cuda":
            assert device.KERNELS[(op, where)] == f"nbattn.cuda.{op}"
    with pytest.raises(ValueError, match="has no cpu kernels"):
        device.kernels_for("layout", "cpu")  # device-side checks exist on the GPU only
    with pytest.raises(ValueError, match="unknown kernel op"):
        device.kernels_for("convolution", "cpu")


@needs_no_gpu
def test_device_for_host_and_gpu_arrays(rng):
    from nbattn.dispatch.device import device_for

    x = rng.normal(size=(3, 2))
    assert device_for("cpu", x) == "cpu"
    assert device_for("auto", x, None) == "cpu"
    with pytest.raises(ValueError, match="device must be one of"):
        device_for("gpu", x)
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
        device_for("cuda", x)


# --- numba-cuda that cannot compile with this NumPy (numba-cuda 0.30.4, numpy 2.5) ---

_ROW_STACK = "module 'numpy' has no attribute 'row_stack'"


@pytest.fixture
def fresh_numpy_check():
    """``compat.numpy_problem`` recomputed in this test (it is cached per process)."""
    from nbattn.cuda import compat

    compat.numpy_problem.cache_clear()
    yield compat
    compat.numpy_problem.cache_clear()


def _target_context_raises(exc):
    def build():
        raise exc

    return build


def test_numpy_problem_names_cause_and_fix(monkeypatch, fresh_numpy_check):
    compat = fresh_numpy_check
    monkeypatch.setattr("numba.config.ENABLE_CUDASIM", False)
    monkeypatch.setattr(
        compat, "_build_target_context", _target_context_raises(AttributeError(_ROW_STACK))
    )
    message = compat.numpy_problem()
    assert message is not None
    assert "numba-cuda" in message and f"numpy {np.__version__}" in message
    assert "row_stack" in message and "numpy<2.5" in message and "device='cpu'" in message


@pytest.mark.parametrize(
    "exc",
    [
        AttributeError("'CUDATargetContext' object has no attribute 'foo'"),  # not NumPy's
        OSError("libnvvm.so not found"),  # a missing toolkit: the compile says so itself
        ImportError("No module named 'numba.cuda.descriptor'"),
    ],
)
def test_other_failures_are_not_a_numpy_problem(monkeypatch, fresh_numpy_check, exc):
    compat = fresh_numpy_check
    monkeypatch.setattr("numba.config.ENABLE_CUDASIM", False)
    monkeypatch.setattr(compat, "_build_target_context", _target_context_raises(exc))
    assert compat.numpy_problem() is None


def test_simulator_has_no_numpy_problem(monkeypatch, fresh_numpy_check):
    compat = fresh_numpy_check
    monkeypatch.setattr("numba.config.ENABLE_CUDASIM", True)
    monkeypatch.setattr(
        compat, "_build_target_context", _target_context_raises(AttributeError(_ROW_STACK))
    )
    assert compat.numpy_problem() is None


def test_other_removed_numpy_function_gets_a_generic_fix():
    from nbattn.cuda.compat import describe_numpy_problem

    message = describe_numpy_problem("module 'numpy' has no attribute 'in1d'", "0.31.0", "2.6.0")
    assert "numba-cuda 0.31.0" in message and "numpy 2.6.0" in message and "in1d" in message
    assert "numpy<2.5" not in message and "supports numpy 2.6.0" in message


@pytest.fixture
def gpu_with_broken_numba_cuda(monkeypatch, fresh_numpy_check):
    """A machine where numba sees a GPU but numba-cuda fails on np.row_stack."""
    from nbattn.dispatch import device

    compat = fresh_numpy_check
    monkeypatch.setattr(device, "_numba_sees_gpu", lambda: True)
    monkeypatch.setattr("numba.config.ENABLE_CUDASIM", False)
    monkeypatch.setattr(
        compat, "_build_target_context", _target_context_raises(AttributeError(_ROW_STACK))
    )
    return device


def test_cuda_with_broken_numba_cuda_raises_the_cause(rng, gpu_with_broken_numba_cuda):
    device = gpu_with_broken_numba_cuda
    assert not device.cuda_available()
    assert "row_stack" in device.cuda_problem()
    q = rng.normal(size=(2, 4, 3))
    for call in (
        lambda: device.resolve_device("cuda"),
        lambda: device.kernels_for("flash", "cuda"),
        lambda: nbattn.flash_attention(q, q, q, device="cuda"),
        lambda: loo.loo_loss(q[0], q[0, :, 0], 1.0, device="cuda"),
    ):
        with pytest.raises(ValueError, match=r"row_stack.*numpy<2\.5"):
            call()


def test_auto_with_broken_numba_cuda_warns_and_runs_on_cpu(rng, gpu_with_broken_numba_cuda):
    q, k, v = (rng.normal(size=(2, 5, 3)) for _ in range(3))
    with pytest.warns(RuntimeWarning, match=r"row_stack.*Running on the CPU"):
        got = nbattn.flash_attention(q, k, v, True, device="auto")
    np.testing.assert_array_equal(got, nbattn.flash_attention(q, k, v, True))


def test_no_gpu_message_is_unchanged_and_auto_stays_silent(monkeypatch, fresh_numpy_check):
    import warnings

    from nbattn.dispatch import device

    monkeypatch.setattr(device, "_numba_sees_gpu", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device.resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
        device.resolve_device("cuda")


_REAL_NUMBA_CUDA_PROBE = """
import numpy as np
del np.row_stack  # what numpy 2.5 looks like to numba-cuda (it checks numpy >= 2.0 only)
from nbattn.cuda import compat
print(compat.numpy_problem())
"""


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("numba_cuda") is None, reason="needs numba-cuda"
)
def test_real_numba_cuda_without_row_stack_gives_the_message():
    """numba-cuda's own target context, built as its first compile builds it (no
    GPU needed), in a fresh process where NumPy lacks np.row_stack."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    result = subprocess.run(
        [sys.executable, "-c", _REAL_NUMBA_CUDA_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    assert "row_stack" in result.stdout and "numpy<2.5" in result.stdout, result.stdout
