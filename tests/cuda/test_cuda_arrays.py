"""GPU arrays in, GPU arrays out: checks and layout on the device (simulator)."""

import os

import numpy as np
import pytest
from numba import cuda

import nbattn

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)


@pytest.mark.parametrize("bandwidth", ["scott", 0.6, [0.5, 1.5]])
def test_device_arrays_in_device_array_out(rng, bandwidth):
    q, k = rng.normal(size=(11, 2)), rng.normal(size=(19, 2)) + 100.0
    q += 100.0
    v = rng.normal(size=19)
    got = nbattn.nadaraya_watson(
        cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), bandwidth, device="cuda"
    )
    assert not isinstance(got, np.ndarray) and got.shape == (11,)
    expected = nbattn.nadaraya_watson(q, k, v, bandwidth)
    np.testing.assert_allclose(got.copy_to_host(), expected, rtol=1e-10)


def test_multi_output_float32_on_device(rng):
    q, k = rng.normal(size=(7, 3)), rng.normal(size=(13, 3))
    v = rng.normal(size=(13, 10))
    f32 = [cuda.to_device(a.astype(np.float32)) for a in (q, k, v)]
    got = nbattn.nadaraya_watson(*f32, 0.8, device="auto")
    assert got.dtype == np.float32
    ref = naive.nadaraya_watson(q, k, v, 0.8)
    np.testing.assert_allclose(got.copy_to_host(), ref, atol=1e-5 * np.abs(ref).max())


def test_nan_on_device_is_rejected_by_name(rng):
    k = rng.normal(size=(5, 1))
    k[3, 0] = np.nan
    with pytest.raises(ValueError, match="keys contains NaN"):
        nbattn.nadaraya_watson(
            cuda.to_device(k[:2]), cuda.to_device(k), np.ones(5), 1.0, device="cuda"
        )


def test_gpu_arrays_with_cpu_device_is_an_error(rng):
    x = cuda.to_device(rng.normal(size=(3, 1)))
    with pytest.raises(ValueError, match="GPU arrays need device"):
        nbattn.nadaraya_watson(x, x, np.ones(3), 1.0, device="cpu")


def test_column_moments_match_numpy(rng):
    from nbattn.cuda import layout

    x = rng.normal(size=(40, 3)) * [1.0, 10.0, 0.0] + 1e6
    mean, std = layout.column_moments(cuda.to_device(x))
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std, x.std(0, ddof=1), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("scale", [1e-170, 1e160, 1e300])
def test_column_moments_at_any_magnitude(rng, scale):
    """Columns are divided by a power of two before the squares: no overflow or underflow."""
    from nbattn.cuda import layout

    for _ in range(3):
        x = rng.normal(size=(30, 2)) * [1.0, 3.0]
        mean, std = layout.column_moments(cuda.to_device(x * scale))
        np.testing.assert_allclose(mean / scale, x.mean(0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(std / scale, x.std(0, ddof=1), rtol=1e-9)


def test_rule_widths_from_device_arrays_in_any_units(rng):
    x = rng.uniform(0, 6, size=(25, 1))
    y = np.sin(x[:, 0])
    want = nbattn.nadaraya_watson(x[:5], x, y, "scott")
    for scale in (1e-170, 1e160):
        got = nbattn.nadaraya_watson(
            cuda.to_device(x[:5] * scale),
            cuda.to_device(x * scale),
            cuda.to_device(y),
            "scott",
            device="cuda",
        ).copy_to_host()
        np.testing.assert_allclose(got, want, rtol=1e-9)
