"""Kernel densities and joint CDFs of mixed data (``nbattn.distribution.density``):
against the naive twins (``tests.naive.kde_pdf``, ``kde_cdf``) over random shapes, column
kinds, widths, kernels and weights; against statsmodels' ``KDEMultivariate``; and their
properties (a density integrates to 1, a CDF is the integral of the density, weights
only count relative to each other, exact logs far from every key and at any magnitude
of the data, ``rtol``'s bound, the CPU-only CDF)."""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.dispatch.device import cuda_available
from nbattn.distribution.density import kernel_cdf, kernel_density
from tests import naive
from tests.strategies import seeds, sizes

KERNELS = ("gaussian", "epanechnikov", "tricube")
kernels = st.sampled_from(KERNELS)


class MixedCase(NamedTuple):
    """Keys (n, d), queries (n_q, d), widths (d,), the column kinds and counts, weights."""

    keys: np.ndarray
    queries: np.ndarray
    widths: np.ndarray
    var_type: str
    n_categories: tuple
    sample_weight: np.ndarray | None


def mixed_case(seed, n, n_q, var_type, weighted, min_count=0) -> MixedCase:
    """Random keys of the given column kinds, queries near and away from them, widths drawn
    inside each kernel's range (both ends of a categorical range included) and, with
    ``weighted``, non-negative weights (some 0, one at least positive).

    Continuous columns: an offset and a scale from 1e-2 to 1e2, some rounded (ties);
    categorical ones: c from 1 to 5 categories; with ``min_count`` > 0 every code occurs
    at least that many times among the keys (c from 2 where n allows, c <= n / min_count:
    statsmodels counts the levels from the data)."""
    rng = np.random.default_rng(seed)
    d = len(var_type)
    keys, queries = np.empty((n, d)), np.empty((n_q, d))
    widths, counts = np.empty(d), []
    for c, kind in enumerate(var_type):
        if kind == "c":
            scale = 10.0 ** rng.uniform(-2, 2)
            centre = rng.normal() * 10 * scale
            col = centre + scale * rng.standard_normal(n)
            if rng.random() < 0.3:
                col = np.round(col / scale, 1) * scale
            keys[:, c] = col
            near = col[rng.integers(0, n, n_q)] + scale * rng.normal(size=n_q) * 0.5
            far = centre + 4 * scale * rng.standard_normal(n_q)
            queries[:, c] = np.where(rng.random(n_q) < 0.7, near, far)
            widths[c] = scale * 10.0 ** rng.uniform(-1.3, 0.7)
            counts.append(0)
            continue
        if min_count:
            most = max(1, min(5, n // min_count))
            count = int(rng.integers(min(2, most), most + 1))
        else:
            count = int(rng.integers(1, 6))
        codes = rng.integers(0, count, n)
        if min_count:
            codes[: count * min_count] = np.repeat(np.arange(count), min_count)
            codes = rng.permutation(codes)
        keys[:, c] = codes
        queries[:, c] = rng.integers(0, count, n_q)
        top = (count - 1) / count if kind == "u" else 0.999
        u = rng.random()
        widths[c] = 0.0 if u < 0.15 else (top if u > 0.85 and kind == "u" else rng.uniform(0, top))
        counts.append(count)
    weights = None
    if weighted:
        weights = rng.exponential(size=n) * (rng.random(n) < 0.8)
        weights[rng.integers(0, n)] = rng.exponential() + 0.1
    return MixedCase(keys, queries, widths, var_type, tuple(counts), weights)


def mixed_cases(max_rows=40, max_queries=12, max_features=4, min_count=0):
    """MixedCase draws: n from 1 to ``max_rows`` keys, d from 1 to ``max_features``
    columns of random kinds, with and without weights (``min_count``: mixed_case's)."""
    return st.builds(
        mixed_case,
        seeds,
        sizes(max_rows),
        sizes(max_queries),
        st.text(alphabet="cuo", min_size=1, max_size=max_features),
        st.booleans(),
        st.just(min_count),
    )


def options(case: MixedCase, kernel="gaussian", **extra):
    return dict(
        var_type=case.var_type,
        n_categories=case.n_categories,
        kernel=kernel,
        sample_weight=case.sample_weight,
        **extra,
    )


def naive_args(case: MixedCase, kernel="gaussian"):
    return dict(kernel=kernel, sample_weight=case.sample_weight)


# --------------------------------------------------------------------------- naive twins
@settings(max_examples=40)
@given(case=mixed_cases(), kernel=kernels)
def test_pdf_matches_the_naive_twin(case, kernel):
    """f within 1e-12 relative of the twin wherever it is above 1e-200 (the products of
    the twin underflow below); log f -inf exactly where the log-space twin is (every key
    out of a compact kernel's reach, or l = 0 and no key in the query's cell), else
    within 1e-12 relative of it (finite where f underflows); f is exp(log f)."""
    args = (case.queries, case.keys, case.widths)
    got = kernel_density(*args, **options(case, kernel))
    log_got = kernel_density(*args, log=True, **options(case, kernel))
    twin_args = (*args, case.var_type, case.n_categories, kernel, case.sample_weight)
    want = naive.kde_pdf(*twin_args)
    log_want = naive.kde_log_pdf(*twin_args)
    assert got.dtype == np.float64 and got.shape == (case.queries.shape[0],)
    assert np.all(np.isfinite(got)) and np.all(got >= 0)
    big = want > 1e-200
    np.testing.assert_allclose(got[big], want[big], rtol=1e-12, atol=0)
    np.testing.assert_array_equal(got[want == 0], 0.0)
    reached = log_want > -np.inf
    np.testing.assert_array_equal(log_got > -np.inf, reached)
    scale = np.maximum(1.0, np.abs(log_want[reached]))
    assert np.all(np.abs(log_got[reached] - log_want[reached]) <= 1e-12 * scale)
    np.testing.assert_array_equal(got, np.exp(log_got))


@settings(max_examples=40)
@given(case=mixed_cases(), kernel=kernels)
def test_cdf_matches_the_naive_twin(case, kernel):
    """F within 1e-10 of the twin's (each continuous kernel integrated, each categorical
    kernel summed over the codes up to the query's), in [0, 1]."""
    got = kernel_cdf(case.queries, case.keys, case.widths, **options(case, kernel))
    want = naive.kde_cdf(
        case.queries,
        case.keys,
        case.widths,
        case.var_type,
        case.n_categories,
        kernel,
        case.sample_weight,
    )
    assert got.dtype == np.float64 and got.shape == (case.queries.shape[0],)
    assert np.all((got >= 0) & (got <= 1))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- statsmodels
def _statsmodels(keys, var_type, widths):
    from statsmodels.nonparametric.kernel_density import KDEMultivariate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return KDEMultivariate(keys, var_type=var_type, bw=np.asarray(widths, dtype=float))


@settings(max_examples=30)
@given(seed=seeds, n=sizes((5, 60)), var_type=st.sampled_from(["c", "cc", "cou"]))
def test_pdf_and_cdf_match_statsmodels(seed, n, var_type):
    """statsmodels' KDEMultivariate at the same widths (every category present among the
    keys, as it counts the levels from the data): pdf within 1e-10 relative, cdf within
    1e-8."""
    case = mixed_case(seed, n, 15, var_type, weighted=False, min_count=1)
    # statsmodels reads n_categories from the data; leave nbattn to count them too
    ours = dict(var_type=var_type)
    reference = _statsmodels(case.keys, var_type, case.widths)
    pdf = kernel_density(case.queries, case.keys, case.widths, **ours)
    want = reference.pdf(case.queries)
    big = want > 1e-200
    np.testing.assert_allclose(pdf[big], want[big], rtol=1e-10, atol=0)
    np.testing.assert_allclose(
        kernel_cdf(case.queries, case.keys, case.widths, **ours),
        reference.cdf(case.queries),
        rtol=0,
        atol=1e-8,
    )


@settings(max_examples=25)
@given(seed=seeds, n=sizes((6, 60)), var_type=st.sampled_from(["c", "cc", "cou", "ccuo"]))
def test_normal_reference_widths_are_statsmodels(seed, n, var_type):
    """The normal reference rule of the continuous columns is statsmodels'
    1.06 sigma n^(-1/(4 + d)) (d every column), 1e-12 relative; the categorical columns'
    l lie inside their ranges (where statsmodels applies the same rule to the codes)."""
    case = mixed_case(seed, n, 1, var_type, weighted=False, min_count=1)
    cont = np.array([kind == "c" for kind in var_type])
    from nbattn.distribution.density import density_rule_widths
    from nbattn.local.problem import check_columns

    spec, (keys,) = check_columns({"X": case.keys}, var_type=var_type)
    ours = density_rule_widths(spec, keys, "normal_reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from statsmodels.nonparametric.kernel_density import KDEMultivariate

        theirs = KDEMultivariate(case.keys, var_type=var_type, bw="normal_reference").bw
    np.testing.assert_allclose(ours[cont], theirs[cont], rtol=1e-12)
    model = nbattn.KernelDensity(var_type=var_type).fit(case.keys)
    np.testing.assert_array_equal(model.bandwidth_, ours)
    for c, kind in enumerate(var_type):
        top = (case.n_categories[c] - 1) / case.n_categories[c] if kind == "u" else 1.0
        assert kind == "c" or 0.0 <= ours[c] <= top and (kind == "u" or ours[c] < 1.0)


# --------------------------------------------------------------------------- properties
def _one_d(seed, n, kernel, weighted):
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=n) * rng.uniform(0.5, 2) + rng.normal() * 5
    h = float(10.0 ** rng.uniform(-0.7, 0.3))
    weights = rng.exponential(size=n) + 0.01 if weighted else None
    return keys, h, weights


@settings(max_examples=25)
@given(seed=seeds, n=sizes(20), kernel=kernels, weighted=st.booleans())
def test_a_1d_density_integrates_to_one(seed, n, kernel, weighted):
    """The trapezoid rule on [min - 12 h, max + 12 h] with steps of h / 2000."""
    keys, h, weights = _one_d(seed, n, kernel, weighted)
    grid = np.arange(keys.min() - 12 * h, keys.max() + 12 * h, h / 2000)
    f = kernel_density(grid, keys, h, kernel=kernel, sample_weight=weights)
    assert np.trapezoid(f, grid) == pytest.approx(1.0, abs=1e-6)


@settings(max_examples=25)
@given(seed=seeds, n=sizes(20), kernel=kernels, weighted=st.booleans())
def test_a_1d_cdf_is_the_integral_of_the_density(seed, n, kernel, weighted):
    """F at every point of a fine grid is the trapezoid integral of f from the grid's
    start (where F is below 1e-30) within 1e-6."""
    keys, h, weights = _one_d(seed, n, kernel, weighted)
    grid = np.arange(keys.min() - 12 * h, keys.max() + 12 * h, h / 2000)
    f = kernel_density(grid, keys, h, kernel=kernel, sample_weight=weights)
    F = kernel_cdf(grid, keys, h, kernel=kernel, sample_weight=weights)
    assert F[0] < 1e-30
    integral = np.concatenate(([0.0], np.cumsum(0.5 * (f[1:] + f[:-1]) * np.diff(grid))))
    np.testing.assert_allclose(F, integral, rtol=0, atol=1e-6)


@settings(max_examples=25)
@given(
    seed=seeds,
    n=sizes(30),
    var_type=st.sampled_from(["c", "cc", "ccc"]),
    kernel=kernels,
    weighted=st.booleans(),
)
def test_a_cdf_rises_along_a_continuous_column_from_0_to_1(seed, n, var_type, kernel, weighted):
    """F along one continuous column (the others held at random values) never decreases
    (beyond rounding); it is below 1e-12 far below every key and, with every column far
    above, above 1 - 1e-12."""
    case = mixed_case(seed, n, 1, var_type, weighted)
    rng = np.random.default_rng(seed)
    column = int(rng.integers(0, len(var_type)))
    lo = case.keys.min(axis=0) - 40 * case.widths
    hi = case.keys.max(axis=0) + 40 * case.widths
    line = np.linspace(lo[column], hi[column], 2001)
    queries = np.repeat(case.queries, line.size, axis=0)
    queries[:, column] = line
    F = kernel_cdf(queries, case.keys, case.widths, **options(case, kernel))
    assert np.all(np.diff(F) >= -1e-15)
    assert F[0] < 1e-12
    top = kernel_cdf(hi[None, :], case.keys, case.widths, **options(case, kernel))
    assert 1 - 1e-12 < top[0] <= 1.0


@settings(max_examples=25)
@given(case=mixed_cases(), kernel=kernels, factor=st.sampled_from([1e-200, 1e200]))
def test_weights_count_only_relative_to_each_other(case, kernel, factor):
    """Every weight times 1e-200 or 1e200: the same densities, logs and CDFs (1e-12
    relative; the logs 1e-12 absolute near 0)."""
    weights = case.sample_weight if case.sample_weight is not None else np.ones(len(case.keys))
    scaled = case._replace(sample_weight=weights * factor)
    plain = case._replace(sample_weight=weights)
    for log in (False, True):
        a = kernel_density(case.queries, case.keys, case.widths, log=log, **options(plain, kernel))
        b = kernel_density(case.queries, case.keys, case.widths, log=log, **options(scaled, kernel))
        # f to 1e-12 relative is log f to 1e-12 absolute (or relative, where |log f| > 1)
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12 if log else 0)
    np.testing.assert_allclose(
        kernel_cdf(case.queries, case.keys, case.widths, **options(scaled, kernel)),
        kernel_cdf(case.queries, case.keys, case.widths, **options(plain, kernel)),
        rtol=1e-12,
        atol=1e-300,
    )


@settings(max_examples=25)
@given(case=mixed_cases(max_rows=15), kernel=kernels)
def test_integer_weights_are_repeated_rows(case, kernel):
    """Weights 0 .. 3 give the density (1e-12 relative) and CDF (1e-12 relative, 1e-15
    absolute: a compact kernel's G near -1 is 1/2 less nearly 1/2) of the keys each
    repeated that many times."""
    rng = np.random.default_rng(len(case.keys))
    counts = rng.integers(0, 4, len(case.keys))
    counts[0] = max(counts[0], 1)
    weighted = case._replace(sample_weight=counts.astype(float))
    repeated = case._replace(keys=np.repeat(case.keys, counts, axis=0), sample_weight=None)
    for function, atol in ((kernel_density, 1e-300), (kernel_cdf, 1e-15)):
        np.testing.assert_allclose(
            function(case.queries, weighted.keys, case.widths, **options(weighted, kernel)),
            function(case.queries, repeated.keys, case.widths, **options(repeated, kernel)),
            rtol=1e-12,
            atol=atol,
        )


@pytest.mark.parametrize("distance", [40.0, 1e3, 1e8])
def test_far_from_a_single_key_the_log_density_is_exact(distance):
    """Key 0, h = 1: log f(x) = log phi(x), however far; log F(-x) = log Phi(-x) (mpmath);
    finite, never -inf from an underflowed f."""
    keys = np.zeros((1, 1))
    query = np.array([[distance]])
    want = -0.5 * distance**2 - 0.5 * math.log(2 * math.pi)
    got = kernel_density(query, keys, 1.0, log=True)[0]
    assert got == pytest.approx(want, rel=1e-12)
    model = nbattn.KernelDensity(bandwidth=1.0).fit(keys)
    assert model.score_samples(query)[0] == pytest.approx(want, rel=1e-12)
    log_cdf = kernel_cdf(-query, keys, 1.0, log=True)[0]
    with mpmath.workdps(40):
        exact = float(mpmath.log(mpmath.ncdf(-distance)))
    assert log_cdf == pytest.approx(exact, rel=1e-12)


@settings(max_examples=25)
@given(seed=seeds, n=sizes(20), d=sizes(3), weighted=st.booleans())
def test_far_from_every_key_the_log_density_is_a_log_sum_exp(seed, n, d, weighted):
    """Queries 50 to 1e4 widths away from keys with a spread of their own: log f is
    log sum_j w_j exp(-|u_j|^2 / 2) - log W - d log(sqrt(2 pi)) - sum log h, computed here
    with np.logaddexp; finite where f underflows."""
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, d))
    h = 10.0 ** rng.uniform(-1, 0.5, d)
    direction = rng.normal(size=d)
    queries = np.outer(10.0 ** rng.uniform(1.7, 4, 6), direction / np.linalg.norm(direction))
    queries = queries * h
    weights = rng.exponential(size=n) + 0.01 if weighted else np.ones(n)
    got = kernel_density(queries, keys, h, log=True, sample_weight=weights)
    u2 = (((queries[:, None, :] - keys[None, :, :]) / h) ** 2).sum(axis=-1)
    terms = -0.5 * u2 + np.log(weights)
    constant = np.log(weights.sum()) + d * 0.5 * math.log(2 * math.pi) + np.log(h).sum()
    want = np.logaddexp.reduce(terms, axis=1) - constant
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-12)


@settings(max_examples=25)
@given(
    seed=seeds,
    n=sizes((2, 40)),
    var_type=st.text(alphabet="cuo", min_size=1, max_size=4),
    kernel=kernels,
    scale=st.sampled_from([1e-150, 1e150]),
)
def test_scaled_data_shift_the_log_density_by_the_log_of_the_scale(
    seed, n, var_type, kernel, scale
):
    """Continuous columns times 1e-150 or 1e150 (with their widths, or under the normal
    reference rule where no continuous column is constant: see
    test_the_rule_on_a_constant_column_follows_the_data_scale): log f shifts by exactly
    -d_c log(scale) (1e-12 relative to the larger of log f and the shift), the CDF does
    not move (1e-12)."""
    case = mixed_case(seed, n, 10, var_type, weighted=True)
    cont = np.array([kind == "c" for kind in var_type])
    factor = np.where(cont, scale, 1.0)
    shift = -cont.sum() * math.log(scale)
    weighed = case.keys if case.sample_weight is None else case.keys[case.sample_weight > 0]
    spread = np.ptp(weighed[:, cont], axis=0) > 0  # among the rows the rule counts
    for widths in (case.widths, "normal_reference") if spread.all() else (case.widths,):
        scaled_widths = widths if isinstance(widths, str) else widths * factor
        base = kernel_density(case.queries, case.keys, widths, log=True, **options(case, kernel))
        moved = kernel_density(
            case.queries * factor,
            case.keys * factor,
            scaled_widths,
            log=True,
            **options(case, kernel),
        )
        finite = np.isfinite(base)
        assert np.array_equal(finite, np.isfinite(moved))
        # relative to the terms' size: log f near 0 after the shift is a difference of
        # two logs of size |shift|
        size = np.maximum(np.abs(base[finite]), abs(shift))
        assert np.all(np.abs(moved[finite] - (base[finite] + shift)) <= 1e-12 * size)
        np.testing.assert_allclose(
            kernel_cdf(
                case.queries * factor, case.keys * factor, scaled_widths, **options(case, kernel)
            ),
            kernel_cdf(case.queries, case.keys, widths, **options(case, kernel)),
            rtol=0,
            atol=1e-12,
        )


@pytest.mark.xfail(
    strict=True,
    reason="the normal reference rule gives a constant continuous column a unit spread "
    "(h = 1.06 n^(-1/(4+d)) in the data's units, whatever their magnitude): at 1e150 "
    "every query a few values away gets log f near -1e296 (-inf for compact kernels), "
    "at 1e-150 the density is flat",
)
@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_the_rule_on_a_constant_column_follows_the_data_scale(scale):
    """Five keys at 0.4 (no spread), queries 0.3 .. 0.5: with the data times ``scale``,
    the rule's log density moves by -log(scale), as it does for data with a spread."""
    keys = np.full((5, 1), 0.4)
    queries = np.linspace(0.3, 0.5, 9)[:, None]
    base = kernel_density(queries, keys, "normal_reference", log=True)
    moved = kernel_density(queries * scale, keys * scale, "normal_reference", log=True)
    np.testing.assert_allclose(moved, base - math.log(scale), rtol=1e-12)


# --------------------------------------------------------------------------- rtol
def _clustered(seed, n, var_type):
    """n rows in 6 tight clusters far apart (continuous columns), with categorical columns
    of 3 codes; queries from the rows (jittered) and between the clusters."""
    rng = np.random.default_rng(seed)
    d = len(var_type)
    centres = rng.uniform(-50, 50, (6, d))
    label = rng.integers(0, 6, n)
    X = centres[label] + rng.normal(size=(n, d)) * rng.uniform(0.2, 2)
    for c, kind in enumerate(var_type):
        if kind != "c":
            X[:, c] = (label + rng.integers(0, 2, n)) % 3
    queries = X[rng.integers(0, n, 200)].copy()
    cont = np.array([kind == "c" for kind in var_type])
    queries[:, cont] += rng.normal(size=(200, cont.sum()))
    between = rng.uniform(-50, 50, (100, d))
    between[:, ~cont] = rng.integers(0, 3, (100, (~cont).sum()))
    return X, np.vstack([queries, between])


@settings(max_examples=25)
@given(
    seed=seeds,
    n=sizes((1500, 4000)),
    var_type=st.sampled_from(["cc", "ccc", "ccu", "cco"]),
    kernel=kernels,
    rtol=st.sampled_from([1e-8, 1e-4, 1e-2]),
    weighted=st.booleans(),
)
def test_rtol_keeps_every_density_within_its_bound(seed, n, var_type, kernel, rtol, weighted):
    """|f_rtol / f - 1| <= rtol (+ 1e-12) at every query of clustered data, rule widths;
    0 where f is 0."""
    X, queries = _clustered(seed, n, var_type)
    weights = np.random.default_rng(seed).exponential(size=n) + 0.01 if weighted else None
    common = dict(var_type=var_type, kernel=kernel, sample_weight=weights)
    exact = kernel_density(queries, X, "normal_reference", **common)
    pruned = kernel_density(queries, X, "normal_reference", rtol=rtol, **common)
    positive = exact > 0
    np.testing.assert_array_equal(pruned[~positive], 0.0)
    assert np.all(np.abs(pruned[positive] / exact[positive] - 1) <= rtol + 1e-12)


def test_rtol_prunes_on_clustered_data():
    """The bound above is not vacuous: at rtol = 1e-2 some density differs from the exact
    one (keys are left out), while the exact path (rtol = 0) gives the same values twice."""
    X, queries = _clustered(3, 4000, "cc")
    exact = kernel_density(queries, X, "normal_reference")
    assert np.array_equal(exact, kernel_density(queries, X, "normal_reference"))
    pruned = kernel_density(queries, X, "normal_reference", rtol=1e-2)
    assert np.any(pruned != exact)


# --------------------------------------------------------------------------- devices
def _has_gpu():
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - no numba-cuda, no driver: no GPU
        return False


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: device='cuda' is valid here")
@pytest.mark.skipif(cuda_available(), reason="a machine without a GPU refuses device='cuda'")
def test_the_cdf_on_cuda_needs_a_gpu():
    X = np.random.default_rng(0).normal(size=(20, 2))
    for function in (kernel_density, kernel_cdf):
        with pytest.raises(ValueError, match="device='cuda' needs a CUDA GPU"):
            function(X[:3], X, device="cuda")


def test_device_auto_runs_on_a_cpu_machine():
    """device='auto' gives the CPU's values, for the density, its log and the CDF."""
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.normal(size=50), rng.integers(0, 3, 50)])
    for function in (kernel_density, kernel_cdf):
        np.testing.assert_allclose(
            function(X[:7], X, var_type="cu", device="auto"),
            function(X[:7], X, var_type="cu", device="cpu"),
            rtol=1e-14,
        )
