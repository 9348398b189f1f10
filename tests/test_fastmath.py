"""Accuracy and vectorisation of the inlined exp."""

import numpy as np
import pytest
from numba import njit

from nbattn import config
from nbattn.kernels.fastmath import fast_exp


@njit(fastmath=config.FASTMATH)
def _exp_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = fast_exp(x[i])


def _run(x):
    out = np.empty_like(x)
    _exp_loop(x, out)
    return out


def test_float64_relative_error_below_1e15():
    x = np.linspace(-708.3, 709.4, 1_000_003)
    rel = np.abs(_run(x) - np.exp(x)) / np.exp(x)
    assert rel.max() < 1e-15


def test_float32_within_two_ulp():
    x = np.linspace(-87.3, 88.3, 1_000_003).astype(np.float32)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert (np.abs(_run(x).astype(np.float64) - exact) / ulp).max() <= 2.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_edges_flush_to_zero_and_overflow_to_inf(dtype):
    x = np.array([-np.inf, -1e4, 0.0, 1e4, np.inf], dtype=dtype)
    np.testing.assert_array_equal(_run(x), [0.0, 0.0, 1.0, np.inf, np.inf])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_loop_vectorises(dtype):
    _run(np.zeros(4, dtype=dtype))
    sig = next(s for s in _exp_loop.signatures if str(s[0].dtype) == np.dtype(dtype).name)
    asm = _exp_loop.inspect_asm(sig)
    suffix = "ps" if dtype == np.float32 else "pd"
    packed_fma = [
        line
        for line in asm.splitlines()
        if "vfmadd" in line and suffix in line and ("zmm" in line or "ymm" in line)
    ]
    assert len(packed_fma) >= 8, "the exp loop did not vectorise"
    assert "exp" not in "".join(line for line in asm.splitlines() if "call" in line)
