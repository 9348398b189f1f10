"""CUDA density kernels (simulator) equal their CPU twins in nbattn.kernels.density.

Tiny shapes (at most 30 keys, 8 queries) and 8 threads per block
(tests/cuda/conftest.py), so several key tiles and query blocks run. Both twins get
the same arguments, built by the functional layer from random tables (continuous,
ordered and unordered columns, sample weights); the sums are compared in log space
(1e-12 absolute on a log: 1e-12 relative on the sum), the quantiles within a few
times their tolerance, the estimators with device="cuda" against device="cpu" and
the CDF against tests/naive.py's brute-force twin.
"""

import os

import numpy as np
import pytest

from nbattn import ConditionalKernelDensity, KernelDensity, KernelQuantileRegressor
from nbattn._core.local_groups import KERNEL_CODES
from nbattn.cuda import density as cuda_density
from nbattn.distribution import conditional as conditional_module
from nbattn.distribution import density as density_module
from nbattn.distribution.density import kernel_cdf
from nbattn.kernels import density as cpu_density

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

KERNELS = ("gaussian", "epanechnikov", "tricube")
COUNTS = {"o": 4, "u": 3}


def _table(rng, n, var_type):
    columns = [
        rng.normal(size=n) if kind == "c" else rng.integers(0, COUNTS[kind], n).astype(float)
        for kind in var_type
    ]
    return np.column_stack(columns)


def _problem(rng, var_type, kernel, n_q=7, n_k=23, weighted=True, spread=1.0):
    """The functional layer's density problem of a random table (the CPU spec)."""
    keys, queries = _table(rng, n_k, var_type), _table(rng, n_q, var_type)
    queries[:, [k == "c" for k in var_type]] *= spread
    weights = rng.uniform(0.2, 2.0, n_k) if weighted else None
    counts = [COUNTS.get(kind, 0) for kind in var_type]
    widths = [rng.uniform(0.4, 1.2) if kind == "c" else rng.uniform(0.1, 0.5) for kind in var_type]
    return density_module._prepare(
        queries, keys, widths, weights, var_type=var_type, n_categories=counts, kernel=kernel
    )


def _sums_args(problem, cont_integrated, cat_integrated):
    kinds, lambdas, counts = density_module._categorical_columns(problem.spec, problem.widths)
    return (
        problem.q_cont,
        problem.keys_cont_t,
        problem.q_cat,
        problem.keys_cat_t,
        np.asarray(cont_integrated, dtype=bool),
        np.asarray(cat_integrated, dtype=bool),
        problem.cat_params,
        kinds,
        lambdas,
        counts,
        problem.log_weights,
        KERNEL_CODES[problem.spec.kernel],
    )


def _assert_same_logs(got, want):
    assert got.shape == want.shape
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=1e-12)


@pytest.mark.parametrize("var_type", ["c", "cc", "cou", "cu"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_log_kernel_sums_equal_the_cpu(var_type, kernel):
    """Every column integrated (the joint CDF), none (the normaliser) and a random mix
    (a conditional CDF's numerator), over several draws, weighted and not."""
    rng = np.random.default_rng([KERNELS.index(kernel), *map(ord, var_type)])
    for draw in range(3):
        problem = _problem(rng, var_type, kernel, weighted=draw != 1, spread=1.0 + draw)
        dc, dk = problem.keys_cont_t.shape[0], problem.keys_cat_t.shape[0]
        for flags in (
            (np.ones(dc, bool), np.ones(dk, bool)),
            (np.zeros(dc, bool), np.zeros(dk, bool)),
            (rng.random(dc) < 0.5, rng.random(dk) < 0.5),
        ):
            args = _sums_args(problem, *flags)
            _assert_same_logs(
                cuda_density.log_kernel_sums(*args), cpu_density.log_kernel_sums(*args)
            )


def test_log_kernel_sums_far_below_every_key_and_out_of_reach():
    """The Gaussian CDF far in the lower tail (Mills' ratio's series: no underflow to -inf)
    and compact kernels out of every key's reach (-inf) agree with the CPU."""
    rng = np.random.default_rng(7)
    for kernel, shift in (("gaussian", -60.0), ("epanechnikov", 40.0), ("tricube", -40.0)):
        problem = _problem(rng, "cc", kernel)
        problem.q_cont[:3] += shift
        for flags in (
            (np.ones(2, bool), np.zeros(0, bool)),
            (np.zeros(2, bool), np.zeros(0, bool)),
        ):
            args = _sums_args(problem, *flags)
            want = cpu_density.log_kernel_sums(*args)
            _assert_same_logs(cuda_density.log_kernel_sums(*args), want)
        if kernel == "gaussian":
            assert np.all(np.isfinite(want))


def _quantile_args(joint, levels):
    levels = np.sort(levels, axis=1)
    z = conditional_module._inverse_integrated_kernel(levels, joint.spec.kernel)
    marginal = conditional_module.marginal_problem(joint, 1)
    return (
        marginal.q_cont,
        marginal.keys_cont_t,
        marginal.q_cat,
        marginal.keys_cat_t,
        marginal.cat_params,
        marginal.log_weights,
        np.ascontiguousarray(joint.keys_cont_t[0]),
        np.ascontiguousarray(levels),
        np.ascontiguousarray(z),
        KERNEL_CODES[joint.spec.kernel],
        conditional_module.QUANTILE_XTOL,
    )


# every kernel and column mix, with and without weights, and a row out of reach, in four
# cases: the simulator runs the host-driven root finder's kernel launches slowly
@pytest.mark.parametrize(
    ("var_type", "kernel", "weighted"),
    [
        ("cc", "gaussian", True),
        ("cou", "epanechnikov", True),
        ("cu", "tricube", False),
        ("cc", "tricube", False),
    ],
)
def test_quantile_roots_equal_the_cpu(var_type, kernel, weighted):
    """The roots of F(u | x) = tau (y the first column) agree within a few times the
    tolerance (both within QUANTILE_XTOL of the one root), rows out of reach NaN on both."""
    rng = np.random.default_rng([7, KERNELS.index(kernel), *map(ord, var_type)])
    joint = _problem(rng, var_type, kernel, n_q=5, n_k=17, weighted=weighted)
    if kernel != "gaussian" and var_type == "cc":
        joint.q_cont[0, 1] += 50.0  # x out of every key's reach
    levels = rng.uniform(0.02, 0.98, size=(5, 3))
    args = _quantile_args(joint, levels)
    want = cpu_density.conditional_quantile_roots(*args)
    got = cuda_density.conditional_quantile_roots(*args)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=1e-8)
    assert np.all(np.diff(got[finite[:, 0]], axis=1) >= 0)


def test_the_gpu_cdf_is_the_naive_cdf():
    """kernel_cdf(device="cuda") against the brute-force sum of tests/naive.py."""
    rng = np.random.default_rng(11)
    for var_type in ("c", "cou"):
        keys, queries = _table(rng, 25, var_type), _table(rng, 6, var_type)
        weights = rng.uniform(0.2, 2.0, 25)
        counts = [COUNTS.get(kind, 0) for kind in var_type]
        widths = [0.7 if kind == "c" else 0.3 for kind in var_type]
        for kernel in KERNELS:
            options = dict(var_type=var_type, n_categories=counts, kernel=kernel)
            got = kernel_cdf(queries, keys, widths, sample_weight=weights, device="cuda", **options)
            want = naive.kde_cdf(queries, keys, widths, var_type, counts, kernel, weights)
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-300)


def _mixed(rng, n, var_type):
    X = _table(rng, n, var_type)
    y = X[:, 0] + 0.5 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize("var_type", ["cou"])  # every column kind in one (7 s a case)
def test_the_estimators_on_the_gpu_equal_the_cpu(var_type):
    """KernelDensity (pdf, cdf), ConditionalKernelDensity (pdf, cdf, quantiles) and
    KernelQuantileRegressor with device="cuda" give device="cpu"'s values."""
    rng = np.random.default_rng(3)
    X, y = _mixed(rng, 24, var_type)
    Q, yq = _table(rng, 6, var_type), rng.normal(size=6)
    w = rng.uniform(0.5, 2.0, 24)
    options = dict(var_type=var_type, kernel="epanechnikov")
    models = {
        device: (
            KernelDensity(**options, device=device).fit(X, sample_weight=w),
            ConditionalKernelDensity(**options, device=device).fit(X, y),
            # y's width given: cv_cdf's search runs the engine's pooling, which the
            # pooling tests cover on the GPU, at many candidate widths (slow here)
            KernelQuantileRegressor(
                bandwidth="normal_reference",
                y_bandwidth=0.4,
                quantile=0.3,
                device=device,
                **options,
            ).fit(X, y),
        )
        for device in ("cpu", "cuda")
    }
    (cpu_joint, cpu_cond, cpu_reg), (gpu_joint, gpu_cond, gpu_reg) = models["cpu"], models["cuda"]
    np.testing.assert_allclose(gpu_joint.pdf(Q), cpu_joint.pdf(Q), rtol=1e-12)
    np.testing.assert_allclose(gpu_joint.cdf(Q), cpu_joint.cdf(Q), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(gpu_cond.pdf(Q, yq), cpu_cond.pdf(Q, yq), rtol=1e-12)
    np.testing.assert_allclose(gpu_cond.cdf(Q, yq), cpu_cond.cdf(Q, yq), rtol=1e-12, atol=1e-300)
    h = cpu_cond.y_bandwidth_
    levels = [0.1, 0.5, 0.8]
    np.testing.assert_allclose(
        gpu_cond.predict_quantile(Q, levels), cpu_cond.predict_quantile(Q, levels), atol=1e-8 * h
    )
    np.testing.assert_allclose(gpu_reg.predict(Q), cpu_reg.predict(Q), atol=1e-8 * h)


def test_device_auto_picks_the_gpu_here(launches):
    """Under the simulator numba sees a GPU: device="auto" runs the density kernels there."""
    rng = np.random.default_rng(5)
    X, y = _mixed(rng, 20, "cu")
    calls = launches(cuda_density, "sums_kernel")
    model = ConditionalKernelDensity(var_type="cu", device="auto").fit(X, y)
    model.cdf(X[:4], y[:4])
    model.predict_quantile(X[:3], 0.5)
    assert calls.count("sums_kernel") >= 3
