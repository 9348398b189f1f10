"""Far rows in the CUDA leave-one-out kernels (simulator): the CPU's contract.

A row whose every other key is far (best score below -config.FAR_SCORE_<dtype>,
or every score overflowed) takes its weights from float64 scores (float32 rows)
or from scores relative to its nearest key (``nbattn.cuda.far``), as the CPU
kernels do, so it predicts its nearest key's value instead of what the
rounding of the direct scores decides (or 0/0). The CUDA kernels must give
what the CPU kernels give on the same inputs.
"""

import os

import numpy as np
import pytest

from nbattn.cuda import loo as cuda_loo
from nbattn.kernels import loo as cpu_loo
from nbattn.kernels import pooling as cpu_pooling

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
    ),
    # the simulator runs the kernels on NumPy scalars, which warn where a GPU overflows quietly
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

#: (dtype, offset of the outliers in scaled units): a float32 row redone with float64
#: scores (m ~ -1e8 > -FAR_SCORE_FLOAT64), float64 rows in the anchored form (m ~ -1e10),
#: rows whose squared distances overflow float64 (1e160), and float32 overflow (1e20).
CASES = [("float32", 1e4), ("float64", 1e5), ("float64", 1e160), ("float32", 1e20)]


def _points(rng, dtype, far, shared, n=11, k=2, p=2):
    """A cluster near 0 and two outliers far on opposite sides: each outlier's LOO row
    is far (its nearest other keys are the cluster's). ``shared``: the cluster's
    spread is 1/far, so that the far rows' scores differ by O(1) between cluster keys
    and several keys share the weight (what rounding of the direct scores gets wrong);
    else 0.5, and the nearest key takes it all."""
    z = rng.normal(scale=1.0 / far if shared else 0.5, size=(n, k))
    z[3] += far
    z[7] -= 0.7 * far
    z = z.astype(dtype)
    y = rng.normal(size=(n, p))
    return z, np.ascontiguousarray(z.T), y, np.ascontiguousarray(y.T, dtype=dtype)


def _close(got, want, dtype):
    tol = 1e-10 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1e-300, np.abs(want).max()))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("dtype", "far"), CASES)
def test_squared_error_of_far_rows_equals_cpu(rng, dtype, far, shared):
    z, z_t, y, v_t = _points(rng, dtype, far, shared)
    rows = np.arange(z.shape[0], dtype=np.int64)
    got = cuda_loo.loo_squared_error(z, z_t, v_t, y, rows)
    want = cpu_loo.loo_squared_error(z, z_t, v_t, y, rows)
    assert np.isfinite(got)
    _close(got, want, dtype)
    # the outliers alone: as on the CPU, and with a spread cluster their nearest key's value
    for r in (3, 7):
        one = np.array([r], dtype=np.int64)
        zq = np.ascontiguousarray(z[one])
        got_r = cuda_loo.loo_squared_error(zq, z_t, v_t, y[one], one)
        _close(got_r, cpu_loo.loo_squared_error(zq, z_t, v_t, y[one], one), dtype)
        if shared:
            continue
        others = np.delete(np.arange(z.shape[0]), r)
        # ||z_r - z_j||^2 - ||z_r||^2 = ||z_j||^2 - 2 z_r . z_j ranks the keys without
        # the overflow of the squares and the cancellation of the differences
        z64 = z.astype(np.float64)
        rank = (z64[others] * (z64[others] - 2.0 * z64[r])).sum(axis=1)
        nearest = others[np.argmin(rank)]
        want_r = float(((y[nearest] - y[r]) ** 2).sum())
        _close(got_r, want_r, dtype)


def _first_pass(z, z_t, y, v_t, dtype):
    f, lse = cpu_pooling.gaussian_pool(z, z_t, v_t, True, 0)
    f = f.astype(np.float64)
    return np.ascontiguousarray(f - y, dtype=dtype), np.ascontiguousarray(f, dtype=dtype), lse


def _diag_bound(z, y, f, resid):
    """sum_i sum_j w_ij |sum_c r_ic (y_jc - f_ic)| (z_if - z_jf)^2: the size of the
    terms whose sum is G_f (a far row's terms are ~|z|^2 and cancel, so G_f is only
    defined to rounding times this), with the CPU's far-aware weights."""
    z_t = np.ascontiguousarray(z.T)
    w = cpu_pooling.gaussian_weights(z, z_t, True).astype(np.float64)
    f64, z64 = f.astype(np.float64), z.astype(np.float64)
    coef = np.abs(np.einsum("ic,ijc->ij", resid.astype(np.float64), y[None] - f64[:, None]))
    with np.errstate(over="ignore"):
        dist = (z64[:, None, :] - z64[None, :, :]) ** 2
    return np.einsum("ij,ijf->f", w * coef, dist)


@pytest.mark.parametrize(("dtype", "far"), CASES)
def test_gradients_of_far_rows_equal_cpu(rng, dtype, far):
    """loo_grad_full (points of moderate size: well conditioned) to rounding, and
    loo_grad_diag to rounding of the size of its terms, with the CPU pool's f and
    lse (far rows included), the far rows' weight shared by several keys."""
    z, z_t, y, v_t = _points(rng, dtype, far, True)
    resid, f, lse = _first_pass(z, z_t, y, v_t, dtype)
    assert (lse[[3, 7]] < -1e6).all()  # the outliers' rows are far
    points = rng.normal(size=(z.shape[0], 3)).astype(dtype)
    points_t = np.ascontiguousarray(points.T)
    got = cuda_loo.loo_grad_full(z, z_t, points, points_t, v_t, resid, f, lse)
    want = cpu_loo.loo_grad_full(z, z_t, points, points_t, v_t, resid, f, lse, 0)
    assert np.isfinite(got).all()
    _close(got, want, dtype)
    got = cuda_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
    want = cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0)
    if not np.isfinite(want).all():  # squared distances beyond the dtype's range (both twins)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        return
    bound = _diag_bound(z, y, f, resid)
    if not np.isfinite(bound).all():  # weights 0 times squares beyond the range: no bound
        _close(got, want, dtype)
        return
    eps = 1e-12 if dtype == "float64" else 1e-5
    assert (np.abs(got - want) <= eps * bound).all(), (got, want, bound)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("dtype", "far"), CASES)
def test_spread_of_far_rows_equals_cpu(rng, dtype, far, shared):
    z, z_t, y, v_t = _points(rng, dtype, far, shared)
    f, lse = cpu_pooling.gaussian_pool(z, z_t, v_t, True, 0)
    got_std, got_w2 = cuda_loo.gaussian_spread(z, z_t, v_t, f, lse, True)
    want_std, want_w2 = cpu_loo.gaussian_spread(z, z_t, v_t, f, lse, True)
    assert np.isfinite(got_std).all() and np.isfinite(got_w2).all()
    _close(got_std, want_std, dtype)
    _close(got_w2, want_w2, dtype)
    if not shared:  # the outliers' rows put (nearly) all weight on one key
        np.testing.assert_allclose(got_w2[[3, 7]], 1.0, rtol=1e-6)
    else:  # and here they share it
        assert (got_w2[[3, 7]] < 0.99).all()


def test_rows_left_out_by_lse_stay_left_out(rng):
    """lse = -inf for a row whose scores do not overflow means 'contributes nothing'
    (the CPU's rule): the gradient and the spread skip it, far path or not."""
    z, z_t, y, v_t = _points(rng, "float64", 1.0, False)
    resid, f, lse = _first_pass(z, z_t, y, v_t, "float64")
    lse = lse.copy()
    lse[[2, 5]] = -np.inf
    got = cuda_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
    _close(got, cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse, 0), "float64")
    std, w2 = cuda_loo.gaussian_spread(z, z_t, v_t, f, lse, True)
    assert (std[[2, 5]] == 0).all() and (w2[[2, 5]] == 0).all()
