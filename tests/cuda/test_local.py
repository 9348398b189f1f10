"""CUDA local-polynomial kernels (simulator) equal their CPU twins in nbattn.kernels.local.

Tiny shapes and 8 threads per block (tests/cuda/conftest.py), so several key
tiles and query blocks run; ``config.CUDA_MAX_OUTPUTS`` patched to 2 where a
test has more outputs, so the launches over output ranges run too. Both twins
get the same arguments, in the groups of ``nbattn._core.local_groups``.
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn._core.local_groups import LocalLeaves
from nbattn.cuda import local as cuda_local
from nbattn.kernels import local as cpu_local
from nbattn.local.engine import local_interval_sums, local_prediction_interval
from nbattn.local.leaves import exact_leaves

from .. import naive
from ..strategies import seeds

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

FIT_NAMES = ("beta", "g", "shift", "log_norm", "nearest", "mfx")


def make_problem(rng, n_q, n_k, dc, dk, n_out, *, missing=False, spread=1.0, weights=True):
    """Kernel inputs: scaled continuous columns, categorical codes with Aitchison-Aitken
    (even columns) and Wang-van Ryzin (odd columns) terms, log weights, values."""
    q_cont = rng.normal(scale=spread, size=(n_q, dc))
    keys_cont_t = rng.normal(scale=spread, size=(dc, n_k))
    n_cat = 3
    q_cat = rng.integers(0, n_cat, size=(n_q, dk)).astype(float)
    keys_cat_t = rng.integers(0, n_cat, size=(dk, n_k)).astype(float)
    if missing:
        for a in (q_cont, keys_cont_t, q_cat, keys_cat_t):
            a[rng.random(a.shape) < 0.15] = np.nan
    lam = rng.uniform(0.05, 0.6, size=dk)
    rows = []
    for k, lk in enumerate(lam):
        if k % 2 == 0:
            rows.append((np.log(1 - lk), np.log(lk / (n_cat - 1)), 0.0))
        else:
            rows.append((np.log(1 - lk), np.log((1 - lk) / 2), np.log(lk)))
    cat_params = np.array(rows, dtype=float).reshape(dk, 3)
    log_w = np.log(rng.uniform(0.2, 2.0, size=n_k)) if weights else np.zeros(n_k)
    values_t = rng.normal(size=(n_out, n_k))
    return problem_arrays(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_w, values_t)


def problem_arrays(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights, values_t):
    """The kernel inputs by name."""
    return dict(
        q_cont=q_cont,
        keys_cont_t=keys_cont_t,
        q_cat=q_cat,
        keys_cat_t=keys_cat_t,
        cat_params=cat_params,
        log_weights=log_weights,
        values_t=values_t,
    )


def groups(module, problem, *, kernel, degree, ridge, exclude_self, missing):
    """``module``'s (LocalData, LocalModel) for a problem from :func:`make_problem`."""
    names = ("q_cont", "keys_cont_t", "q_cat", "keys_cat_t", "log_weights")
    no_stretch = (np.zeros((0, 0)), np.zeros((0, 0)))  # fixed widths
    data = module.LocalData(*(problem[name] for name in names), *no_stretch)
    model = module.LocalModel(
        problem["cat_params"], kernel, degree, float(ridge), exclude_self, missing
    )
    return data, model


def both_fits(problem, *, want_mfx, **model):
    """(CUDA fit, CPU fit) of the same problem."""
    fits = []
    for module in (cuda_local, cpu_local):
        data, local_model = groups(module, problem, **model)
        leaves = exact_leaves(data)  # every key: the GPU's passes and the exact CPU ones
        fits.append(module.local_fit(data, local_model, problem["values_t"], want_mfx, leaves))
    return tuple(fits)


def assert_fits_equal(got, want, fit_rtol=1e-9):
    """Fits and softmax states to rounding; coefficients to rounding times the local
    design's conditioning (scaled by their size); the fallback keys exactly.
    ``fit_rtol``: looser for extrapolating fits (a query far outside its keys)."""
    for name, a, b in zip(FIT_NAMES, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
    beta, g, shift, log_norm, nearest, mfx = got
    np.testing.assert_array_equal(nearest, want[4])
    np.testing.assert_allclose(beta[:, 0], want[0][:, 0], rtol=fit_rtol, atol=1e-12)
    np.testing.assert_allclose(shift, want[2], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(log_norm, want[3], rtol=1e-10, atol=1e-12)
    scale = 1.0 + np.abs(want[0]).max(axis=(1, 2), initial=0.0)
    np.testing.assert_allclose(beta, want[0], atol=1e-7 * scale.max(), rtol=1e-7)
    np.testing.assert_allclose(g, want[1], atol=1e-7 * (1.0 + np.abs(want[1]).max()), rtol=1e-7)
    np.testing.assert_allclose(
        mfx, want[5], rtol=1e-7, atol=1e-9 * (1.0 + np.abs(want[5]).max(initial=0))
    )


def test_codes_and_terms_agree_with_cpu():
    assert (cuda_local.GAUSSIAN, cuda_local.EPANECHNIKOV, cuda_local.TRICUBE) == tuple(
        cpu_local.KERNEL_CODES[k] for k in ("gaussian", "epanechnikov", "tricube")
    )
    for dc in range(5):
        for degree in range(3):
            assert cuda_local.n_terms(dc, degree) == cpu_local.n_terms(dc, degree)


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "tricube"])
@pytest.mark.parametrize("degree", [0, 1, 2])
def test_fit_equals_cpu(rng, kernel, degree):
    """Two continuous and two categorical columns with missing entries, sample weights;
    compact kernels on data inside their support for most pairs (the solve is well
    conditioned). Complete data: the hypothesis test and the tests below."""
    missing = True
    code = cpu_local.KERNEL_CODES[kernel]
    spread = 1.0 if code == cpu_local.GAUSSIAN else 0.35
    problem = make_problem(rng, 11, 19, 2, 2, 2, missing=missing, spread=spread)
    flags = dict(kernel=code, degree=degree, exclude_self=False, missing=missing)
    got, want = both_fits(problem, **flags, ridge=1e-6, want_mfx=True)
    assert_fits_equal(got, want)
    assert np.isfinite(got[0]).all()


@pytest.mark.parametrize(("dc", "dk"), [(0, 2), (3, 0), (1, 1)])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_fit_column_mixes_and_leave_one_out(rng, dc, dk, exclude_self):
    """Only categorical columns, only continuous ones (degree 2: 10 terms), one of each;
    with exclude_self the queries are the keys (the exact leave-one-out fit)."""
    n = 13
    problem = make_problem(rng, n, n, dc, dk, 1)
    if exclude_self:
        problem["q_cont"] = np.ascontiguousarray(problem["keys_cont_t"].T)
        problem["q_cat"] = np.ascontiguousarray(problem["keys_cat_t"].T)
    flags = dict(kernel=0, degree=2, exclude_self=exclude_self, missing=False, ridge=1e-4)
    got, want = both_fits(problem, **flags, want_mfx=False)
    assert_fits_equal(got, want)


def test_fit_many_outputs_runs_several_launches(rng, monkeypatch):
    """Five outputs, two per launch: three launches, each with its own output range."""
    monkeypatch.setattr(config, "CUDA_MAX_OUTPUTS", 2)
    problem = make_problem(rng, 9, 17, 1, 1, 5)
    flags = dict(kernel=0, degree=0, exclude_self=False, missing=False, ridge=0.0)
    got, want = both_fits(problem, **flags, want_mfx=True)
    assert_fits_equal(got, want)
    assert np.abs(got[5]).max() > 0  # the marginal effects were computed


def test_fallbacks_and_degenerate_designs(rng):
    """Queries outside every key's support (tricube), categorical exact matching
    (lambda = 0: log 0 terms) that no key meets, a column equal in every key, a
    zero-weight key, and no key at all: nearest keys and dropped terms as on the CPU,
    never NaN."""
    n_k = 10
    keys_cont_t = np.vstack([np.linspace(-0.5, 0.5, n_k), np.full(n_k, 0.25)])
    q_cont = np.array([[0.0, 0.0], [5.0, 0.0], [0.1, 0.25], [-7.0, 3.0], [0.3, 0.2]])
    keys_cat_t = np.array([[0.0, 1.0] * (n_k // 2)])
    q_cat = np.array([[0.0], [1.0], [2.0], [1.0], [np.nan]])
    cat_params = np.array([[0.0, -np.inf, 0.0]])  # exact matching only
    log_w = np.zeros(n_k)
    log_w[3] = -np.inf
    values_t = rng.normal(size=(2, n_k))
    problem = problem_arrays(q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_w, values_t)
    for code in (cpu_local.GAUSSIAN, cpu_local.TRICUBE):
        for degree in (0, 1, 2):
            flags = dict(kernel=code, degree=degree, exclude_self=False, missing=True)
            got, want = both_fits(problem, **flags, ridge=0.0, want_mfx=True)
            assert_fits_equal(got, want, fit_rtol=1e-7)  # query 3 extrapolates
            assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
            # no key of the query's category (lambda = 0); tricube: outside every support
            fell_back = [2] if code == cpu_local.GAUSSIAN else [1, 2, 3]
            assert (got[4][fell_back] >= 0).all() and (got[3][fell_back] == -np.inf).all()
    empty = {**problem, "keys_cont_t": np.zeros((2, 0)), "keys_cat_t": np.zeros((1, 0))}
    empty |= {"log_weights": np.zeros(0), "values_t": np.zeros((2, 0))}
    got, want = both_fits(
        empty, kernel=0, degree=1, exclude_self=False, missing=True, ridge=0.0, want_mfx=False
    )
    assert_fits_equal(got, want)
    assert (got[4] == -1).all() and (got[0] == 0).all()


@pytest.mark.parametrize("kernel", [0, 2])
@pytest.mark.parametrize("degree", [0, 1, 2])
def test_second_passes_equal_cpu(rng, monkeypatch, kernel, degree):
    """The LOO gradient and the interval sums from the same first-pass state, with
    missing entries, three outputs over two launches, exclude_self."""
    monkeypatch.setattr(config, "CUDA_MAX_OUTPUTS", 2)
    n = 12
    problem = make_problem(rng, n, n, 2, 2, 3, missing=True, spread=1.0 if kernel == 0 else 0.4)
    problem["q_cont"] = np.ascontiguousarray(problem["keys_cont_t"].T)
    problem["q_cat"] = np.ascontiguousarray(problem["keys_cat_t"].T)
    flags = dict(kernel=kernel, degree=degree, exclude_self=True, missing=True, ridge=1e-5)
    data, model = groups(cpu_local, problem, **flags)
    fit = cpu_local.local_fit(data, model, problem["values_t"], False, exact_leaves(data))
    cat_dparams = rng.normal(size=(2, 3))
    out_weights = rng.normal(size=(n, 3))
    want, got = (
        module.local_loo_gradient(
            *groups(module, problem, **flags),
            fit,
            problem["values_t"],
            cat_dparams,
            out_weights,
            exact_leaves(data),
        )
        for module in (cpu_local, cuda_local)
    )
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11 * (1 + np.abs(want).max()))
    residuals_t = rng.normal(size=(3, n))
    want, got = (
        module.local_interval_sums(*groups(module, problem, **flags), fit, residuals_t)
        for module in (cpu_local, cuda_local)
    )
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-14)
    assert (got >= 0).all()


@settings(max_examples=12)
@given(
    seed=seeds,
    n_q=st.integers(1, 9),
    n_k=st.integers(1, 20),
    dc=st.integers(0, 2),
    dk=st.integers(0, 2),
    kernel=st.sampled_from([0, 1, 2]),
    degree=st.integers(0, 2),
    missing=st.booleans(),
)
def test_fit_equals_cpu_over_random_problems(seed, n_q, n_k, dc, dk, kernel, degree, missing):
    rng = np.random.default_rng(seed)
    problem = make_problem(rng, n_q, n_k, dc, dk, 2, missing=missing, spread=0.5)
    flags = dict(kernel=kernel, degree=degree, exclude_self=False, missing=missing)
    got, want = both_fits(problem, **flags, ridge=1e-3, want_mfx=True)
    assert_fits_equal(got, want)
    assert np.isfinite(got[0]).all()


def test_functional_layer_dispatches_to_cuda(rng, launches):
    """local_polynomial(device="cuda") runs these kernels through kernels_for and
    predicts what the CPU predicts, marginal effects included."""
    X = np.column_stack([rng.uniform(0, 3, 24), rng.integers(0, 3, 24)]).astype(float)
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    calls = launches(cuda_local, "local_fit")
    common = dict(var_type="cu", n_categories=[0, 3], return_gradient=True)
    fit, slope = nbattn.local_polynomial(X[:7], X, y, [0.6, 0.3], 1, device="cuda", **common)
    want_fit, want_slope = nbattn.local_polynomial(X[:7], X, y, [0.6, 0.3], 1, **common)
    assert calls
    np.testing.assert_allclose(fit, want_fit, rtol=1e-9)
    np.testing.assert_allclose(slope, want_slope, rtol=1e-7, atol=1e-9)


def test_nearly_collinear_design_drops_the_same_terms(rng):
    """A second column within 1e-5 of the first (relative pivot ~1e-10): both twins drop
    it under config.LOCAL_PIVOT_TOL, so the slopes are the first column's alone."""
    n = 15
    x1 = np.linspace(-1.0, 1.0, n)
    keys_cont_t = np.vstack([x1, x1 + 1e-5 * rng.normal(size=n)])
    problem = make_problem(rng, 5, n, 2, 0, 1)
    problem["keys_cont_t"] = keys_cont_t
    problem["q_cont"] = rng.uniform(-0.5, 0.5, size=(5, 1)) * np.ones((1, 2))
    flags = dict(kernel=0, degree=1, exclude_self=False, missing=False, ridge=0.0)
    got, want = both_fits(problem, **flags, want_mfx=False)
    assert_fits_equal(got, want)
    assert (got[0][:, 2] == 0).all() and (got[0][:, 1] != 0).all()


def _mixed_data(rng, n, counts):
    """Two continuous columns and an ordered one with ``counts[2]`` categories."""
    cont = rng.uniform(-1.0, 1.0, size=(n, 2))
    cat = rng.integers(0, counts[2], size=(n, 1)).astype(float)
    return np.hstack([cont, cat])


@pytest.mark.parametrize("kernel", ["gaussian", "tricube"])
@pytest.mark.parametrize("degree", [0, 1, 2])
def test_functional_on_cuda_equals_naive(rng, kernel, degree):
    """local_polynomial(device="cuda") against the plain-NumPy twin the CPU tests use
    (weighted least squares per query), sample weights, fits and slopes."""
    var_type, counts = "cco", [0, 0, 3]
    X = _mixed_data(rng, 30, counts)
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.3 * X[:, 2]
    Q = _mixed_data(rng, 7, counts)
    bw = np.array([0.7, 0.9, 0.4]) * (1.0 if kernel == "gaussian" else 2.0)
    w = rng.uniform(0.2, 2.0, 30)
    common = dict(var_type=var_type, n_categories=counts, kernel=kernel, sample_weight=w)
    fit, slope = nbattn.local_polynomial(
        Q, X, y, bw, degree, device="cuda", return_gradient=True, **common
    )
    ref, coef, _ = naive.local_polynomial_exact(
        Q, X, y, bw, var_type, counts, degree, kernel=kernel, sample_weight=w
    )
    np.testing.assert_allclose(fit, ref, rtol=1e-9, atol=1e-9)
    if degree >= 1:
        np.testing.assert_allclose(slope, coef[:, 1:3], rtol=1e-7, atol=1e-7)


def test_interval_sums_and_prediction_interval_on_cuda_equal_naive(rng):
    """sum_j l_ij^2 r_j^2 with the naive equivalent-kernel weights l_ij, and the
    sandwich interval of local_prediction_interval(device="cuda") built from them."""
    var_type, counts = "cco", [0, 0, 3]
    X = _mixed_data(rng, 24, counts)
    y = np.cos(2 * X[:, 0]) + X[:, 1] + 0.2 * rng.normal(size=24)
    Q = _mixed_data(rng, 6, counts)
    bw = np.array([0.8, 1.0, 0.4])
    r = rng.normal(size=24)
    common = dict(var_type=var_type, n_categories=counts)
    for degree in (0, 1):
        got = local_interval_sums(Q, X, r, bw, degree, device="cuda", **common)
        L = naive.local_equivalent_weights(Q, X, bw, var_type, counts, degree)
        np.testing.assert_allclose(got, (L**2) @ (r**2), rtol=1e-9)
    fit, lo, hi = local_prediction_interval(
        X, y, Q, bw, 1, alpha=0.1, return_fit=True, device="cuda", **common
    )
    loo, _, _ = naive.local_polynomial_exact(X, X, y, bw, var_type, counts, 1, exclude_self=True)
    L = naive.local_equivalent_weights(Q, X, bw, var_type, counts, 1)
    half = 1.6448536269514722 * np.sqrt((L**2) @ (y - loo) ** 2)
    np.testing.assert_allclose(hi - fit, half, rtol=1e-9)
    np.testing.assert_allclose(fit - lo, half, rtol=1e-9)


@pytest.mark.parametrize("degree", [0, 1])
def test_loo_loss_and_gradient_on_cuda_equal_cpu_and_naive(rng, degree):
    """The width search's criterion on device="cuda": the leave-one-out loss equals the
    naive one, and loss and exact gradient (over log h and the categorical parameter,
    with missing entries marginalised) equal the CPU's."""
    from nbattn.local.widths import local_loo_loss_and_grad, theta_to_widths

    var_type, counts = "cco", [0, 0, 3]
    X = _mixed_data(rng, 20, counts)
    y = np.sin(2 * X[:, 0]) + X[:, 1] + 0.2 * rng.normal(size=20)
    theta = np.array([np.log(0.6), np.log(0.9), 0.3])
    common = dict(var_type=var_type, n_categories=counts)
    got = local_loo_loss_and_grad(X, y, theta, degree, device="cuda", **common)
    want = local_loo_loss_and_grad(X, y, theta, degree, **common)
    widths = theta_to_widths(theta, var_type, np.array(counts))
    ref = naive.local_loo_loss_exact(X, y, widths, var_type, counts, degree)
    np.testing.assert_allclose(got[0], ref, rtol=1e-9)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-8, atol=1e-12)
    X[[2, 9], [0, 2]] = np.nan
    got = local_loo_loss_and_grad(
        X, y, theta, degree, missing="marginalize", device="cuda", **common
    )
    want = local_loo_loss_and_grad(X, y, theta, degree, missing="marginalize", **common)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-8, atol=1e-12)


def test_pruned_leaves_are_refused_on_the_gpu():
    """The GPU passes take pruned leaves as the blocks' key runs (``BlockRuns``): the CPU's
    ``LocalLeaves`` with rtol > 0 are refused, never ignored."""
    rng = np.random.default_rng(0)
    problem = make_problem(rng, 5, 8, 1, 0, 1)
    data, model = groups(
        cuda_local,
        problem,
        kernel=0,
        degree=1,
        ridge=1e-12,
        exclude_self=False,
        missing=False,
    )
    n_k, dc, dk = data.log_weights.shape[0], data.keys_cont_t.shape[0], data.keys_cat_t.shape[0]
    one = np.zeros(1)
    pruned = LocalLeaves(
        exact_leaves(data).query_start,
        np.array([0, n_k], dtype=np.int64),
        np.zeros((1, dc)),
        np.zeros((1, dc)),
        np.zeros((1, dk)),
        np.zeros((1, dk)),
        one,
        one,
        one,
        1e-6,
    )
    with pytest.raises(TypeError, match="BlockRuns"):
        cuda_local.local_fit(data, model, problem["values_t"], False, pruned)
