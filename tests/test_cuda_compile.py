"""Every CUDA kernel compiles for a real GPU (sm_90 PTX), without a GPU.

The simulator suite (tests/cuda) runs the kernels as Python and so misses
what only the CUDA compiler rejects (an overload that does not compile as a
device function, a type that does not unify). ``numba.cuda.compile_ptx``
needs libNVVM (the CUDA toolkit) but no GPU and no driver; the test skips
where libNVVM is missing. ptxas, when found, assembles the PTX as well.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs the real CUDA compiler"
)

F32_1 = "float32[::1]"
CC = (9, 0)


class _FakeDevice:
    compute_capability = CC


@pytest.fixture
def compile_ptx(monkeypatch):
    from numba import cuda

    try:
        import numba.cuda.dispatcher as dispatcher

        def trivial(x):
            x[0] = 1.0

        cuda.compile_ptx(trivial, f"void({F32_1})", cc=CC)
    except Exception as exc:  # no libNVVM, or a numba without CUDA support
        pytest.skip(f"numba cannot compile CUDA here: {type(exc).__name__}: {exc}")
    # device functions (imin, imax) are compiled for the current device's
    # compute capability; there is none without a GPU
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: _FakeDevice(), raising=False)
    ptxas = shutil.which("ptxas") or (
        "/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None
    )

    def run(kernel, signature, tmp_path):
        try:
            fastmath = kernel.targetoptions.get("fastmath", False)
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=CC, fastmath=fastmath)
        except Exception as exc:
            if type(exc).__name__ == "CudaSupportError":  # a numba that wants a driver here
                pytest.skip(f"device functions need a CUDA driver with this numba: {exc}")
            raise
        assert ".entry" in ptx
        if ptxas is not None:
            path = tmp_path / "kernel.ptx"
            path.write_text(ptx)
            done = subprocess.run(
                [ptxas, f"-arch=sm_{CC[0]}{CC[1]}", str(path), "-o", os.devnull],
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, done.stderr
        return ptx

    return run


def _sig(*args):
    return "void(" + ", ".join(args) + ")"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_flash_kernels_compile(compile_ptx, tmp_path, dtype):
    from nbattn.cuda import flash

    a3, a2 = f"{dtype}[:,:,::1]", f"{dtype}[:,::1]"
    fwd, dq, dk, dv = flash._make_kernels(np.dtype(dtype).type, 8, 4)
    fwd_ptx = compile_ptx(
        fwd, _sig(a3, a3, a3, "float64", "boolean", "int64", a3, "float64[:,::1]"), tmp_path
    )
    if dtype == "float32":  # weights through the fast exp; K and V rows read 4 floats at a time
        assert "ex2.approx" in fwd_ptx
        assert "ld.shared.v4.f32" in fwd_ptx
    dq_ptx = compile_ptx(
        dq,
        _sig(a3, a3, a3, a3, "float64[:,::1]", a3, "float64", "boolean", "int64", a3, a2),
        tmp_path,
    )
    # the rows-without-keys test (lse != -inf) is compiled in
    assert "0dFFF0000000000000" in dq_ptx
    for kernel in (dk, dv):
        compile_ptx(
            kernel,
            _sig(a3, a3, a3, "float64[:,::1]", a3, a2, "float64", "boolean", "int64", a3, a3),
            tmp_path,
        )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pooling_and_loo_kernels_compile(compile_ptx, tmp_path, dtype):
    from nbattn.cuda import loo, pooling

    a2 = f"{dtype}[:,::1]"
    f64_1, f64_2, i64_1 = "float64[::1]", "float64[:,::1]", "int64[::1]"
    pool = pooling.gaussian_pool_kernel(dtype, 3, 2)
    compile_ptx(pool, _sig(a2, a2, a2, "boolean", "int64", "int64", a2, f64_1), tmp_path)
    loss = loo.loss_kernel(dtype, 3, 2)
    diag, full = loo.grad_kernels(dtype, 3)
    compile_ptx(loss, _sig(a2, a2, a2, f64_2, i64_1, "int64", f64_1), tmp_path)
    sig = _sig(a2, a2, a2, a2, a2, f64_1, "int64", "int64", "int64", f64_1)
    compile_ptx(diag, sig, tmp_path)
    compile_ptx(
        full,
        _sig(a2, a2, a2, a2, a2, a2, a2, f64_1, "int64", i64_1, i64_1, "int64", f64_1),
        tmp_path,
    )


def test_layout_kernels_compile(compile_ptx, tmp_path):
    from nbattn.cuda import layout

    f2, f1 = "float64[:,::1]", "float64[::1]"
    compile_ptx(layout._count_nonfinite_kernel, _sig(f2, "int64[::1]"), tmp_path)
    compile_ptx(layout._count_nan_or_posinf_kernel, _sig(f2, "int64[::1]"), tmp_path)
    compile_ptx(layout._column_sums_kernel, _sig(f2, f1, f1, f1), tmp_path)
    compile_ptx(layout._scaled_transpose_kernel, _sig(f2, f1, "float32[:,::1]"), tmp_path)
    compile_ptx(layout._scaled_copy_kernel, _sig(f2, f1, "float32[:,::1]"), tmp_path)
