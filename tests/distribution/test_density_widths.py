"""A density's widths by leave-one-out likelihood (``nbattn.distribution.density_widths``):
the criterion against statsmodels' ``loo_likelihood`` and the naive twin, and the
``"cv_ml"`` search against statsmodels' optimum, the rule of thumb, a brute-force grid,
and itself (bit for bit, in one process and in a fresh one)."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.distribution.density_widths import loo_log_likelihood
from tests import naive
from tests.distribution.test_density import KERNELS, kernels, mixed_case, mixed_cases
from tests.strategies import seeds, sizes


def _statsmodels(X, var_type, widths):
    from statsmodels.nonparametric.kernel_density import KDEMultivariate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return KDEMultivariate(X, var_type=var_type, bw=np.asarray(widths, dtype=float))


def _statsmodels_loo(X, var_type, widths):
    """statsmodels' loo_likelihood (-sum_i log of the sum of the other rows' kernels over
    n - 1 ... without the division: see the module docstring of density_widths)."""
    widths = np.asarray(widths, dtype=float)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return float(_statsmodels(X, var_type, widths).loo_likelihood(widths, np.log))


def _lambda_max(var_type, X):
    """Each column's largest admissible width: inf for 'c', (c-1)/c for 'u' (c the levels
    present, statsmodels' count), 1 for 'o'."""
    top = []
    for c, kind in enumerate(var_type):
        levels = np.unique(X[:, c]).size
        top.append(math.inf if kind == "c" else (levels - 1) / levels if kind == "u" else 1.0)
    return np.array(top)


# --------------------------------------------------------------------------- the criterion
def smoothing_above_zero(case):
    """The case with each categorical l = 0 moved to lambda_max / 1000: l = 0 (exact
    matching) is test_loo_log_likelihood_at_exact_matching's (a known bug)."""
    widths = case.widths.copy()
    for c, kind in enumerate(case.var_type):
        if kind != "c" and widths[c] == 0.0:
            count = case.n_categories[c] if case.n_categories[c] else 1
            widths[c] = 1e-3 * ((count - 1) / count if kind == "u" else 1.0)
    return case._replace(widths=widths)


@settings(max_examples=30)
@given(seed=seeds, n=sizes((4, 40)), var_type=st.sampled_from(["c", "cc", "cou", "uo"]))
def test_loo_log_likelihood_is_statsmodels_plus_n_log_n_minus_1(seed, n, var_type):
    """Without weights, at fixed widths (every category present twice at least among the
    rows: statsmodels counts the levels of the rows left in):
    loo_log_likelihood = loo_likelihood(bw, np.log) + n log(n - 1), within 1e-10
    relative."""
    case = smoothing_above_zero(mixed_case(seed, n, 1, var_type, weighted=False, min_count=2))
    X, widths = case.keys, case.widths
    got = loo_log_likelihood(X, widths, var_type=var_type)
    want = _statsmodels_loo(X, var_type, widths) + n * math.log(n - 1)
    # statsmodels sums the kernels themselves: +inf where they underflow (nbattn's logs
    # do not; the naive twin's test covers those)
    assume(math.isfinite(want))
    assert got == pytest.approx(want, rel=1e-10, abs=1e-10)


@settings(max_examples=40)
@given(case=mixed_cases(max_rows=30), kernel=kernels)
def test_loo_log_likelihood_matches_the_naive_twin(case, kernel):
    """Every column kind, kernel and weights: -sum_i (w_i / mean w) log f_-i(x_i) of the
    naive twin (1e-10 relative; +inf on both sides where a row is out of reach)."""
    case = smoothing_above_zero(case)
    X = case.keys
    if X.shape[0] < 2:
        return
    got = loo_log_likelihood(
        X,
        case.widths,
        var_type=case.var_type,
        n_categories=case.n_categories,
        kernel=kernel,
        sample_weight=case.sample_weight,
    )
    want = naive.kde_loo_log_likelihood(
        X, case.widths, case.var_type, case.n_categories, kernel, case.sample_weight
    )
    if math.isinf(want):
        assert got == want
    else:
        assert got == pytest.approx(want, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("weights", [[0.0, 1.2], [1.2, 0.0, 0.0], [0.0, 0.0, 3.0]])
def test_loo_log_likelihood_is_inf_where_no_other_row_carries_weight(weights):
    """A weighted row whose other rows all weigh 0 has no leave-one-out density: the
    criterion is +inf (as the naive twin), without a NaN or a numpy warning on the way."""
    X = np.linspace(-1.0, 1.0, len(weights))[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = loo_log_likelihood(X, [0.5], var_type="c", sample_weight=weights)
    want = naive.kde_loo_log_likelihood(X, np.array([0.5]), "c", np.zeros(1), "gaussian", weights)
    assert got == want == math.inf


@settings(max_examples=25)
@given(case=mixed_cases(max_rows=30), kernel=kernels, factor=st.sampled_from([1e-200, 1e200]))
def test_loo_log_likelihood_ignores_the_total_weight(case, kernel, factor):
    """Weights times 1e-200 or 1e200: the same criterion (1e-12)."""
    if case.keys.shape[0] < 2:
        return
    weights = case.sample_weight if case.sample_weight is not None else np.ones(len(case.keys))
    common = dict(var_type=case.var_type, n_categories=case.n_categories, kernel=kernel)
    plain = loo_log_likelihood(case.keys, case.widths, sample_weight=weights, **common)
    scaled = loo_log_likelihood(case.keys, case.widths, sample_weight=weights * factor, **common)
    if math.isinf(plain):
        assert scaled == plain
    else:
        assert scaled == pytest.approx(plain, rel=1e-12, abs=1e-12)


_EXACT_MATCHING = [
    # an ordered column, l = 0, the code 3 held by one row only: that row has no other
    # row in reach, f_-i = 0, the criterion +inf (statsmodels' too)
    (np.array([[0.0], [1], [0], [1], [2], [2], [1], [0], [1], [1], [3]]), [0.0], "o"),
    (np.array([[0.0], [1], [0], [1], [2], [2], [1], [0], [1], [1], [3]]), [0.0], "u"),
    # l = 0 in 'o' with a narrow h: the rows of another code must count for nothing
    (
        np.array(
            [
                [-3.06709486, 1, 0],
                [-3.53382669, 0, 1],
                [-2.90040492, 1, 1],
                [-3.86720656, 0, 0],
                [-3.2337848, 0, 0],
            ]
        ),
        [0.03660043, 0.0, 0.40418844],
        "cou",
    ),
]


@pytest.mark.xfail(
    strict=True,
    reason="loo_log_likelihood evaluates l = 0 at theta = -30 (widths_to_theta's clip): "
    "l = lambda_max sigmoid(-30), about 9.4e-14 lambda_max, not exact matching",
)
@pytest.mark.parametrize(("X", "widths", "var_type"), _EXACT_MATCHING)
def test_loo_log_likelihood_at_exact_matching(X, widths, var_type):
    """With l = 0 the categorical kernel is exact matching, as in kernel_density: the
    criterion is the naive twin's (+inf where a row's cell holds no other row)."""
    counts = tuple(0 if kind == "c" else int(X[:, c].max()) + 1 for c, kind in enumerate(var_type))
    want = naive.kde_loo_log_likelihood(X, widths, var_type, counts)
    got = loo_log_likelihood(X, widths, var_type=var_type)
    assert got == pytest.approx(want, rel=1e-10) if math.isfinite(want) else got == want


# --------------------------------------------------------------------------- cv_ml vs statsmodels
def statsmodels_table(seed, var_type, n):
    """Rows of the given kinds: continuous columns a mixture (30% shifted by 4), 'u' 3
    levels, 'o' 4 levels, every level present (statsmodels counts them from the data)."""
    rng = np.random.default_rng(seed)
    cols = []
    for kind in var_type:
        if kind == "c":
            cols.append(rng.normal(size=n) * rng.uniform(0.5, 3) + (rng.random(n) < 0.3) * 4)
        else:
            count = 3 if kind == "u" else 4
            codes = rng.integers(0, count, n)
            codes[:count] = np.arange(count)
            cols.append(codes)
    return np.column_stack(cols).astype(float)


STATSMODELS_DATASETS = [
    ("c", 0, 80),
    ("c", 1, 80),
    ("cu", 0, 120),
    ("cu", 2, 120),
    ("cou", 0, 150),
    ("cou", 4, 150),
]


@pytest.mark.parametrize(("var_type", "seed", "n"), STATSMODELS_DATASETS)
def test_cv_ml_reaches_statsmodels_optimum(var_type, seed, n):
    """statsmodels' own objective (loo_likelihood) at nbattn's cv_ml widths is at least as
    low as at statsmodels' cv_ml widths, those clipped into the kernels' ranges where its
    optimiser left them (l <= (c-1)/c for 'u', l <= 1 for 'o'); 1e-9 relative for the two
    searches' stopping rules."""
    X = statsmodels_table(seed, var_type, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from statsmodels.nonparametric.kernel_density import KDEMultivariate

        theirs = np.clip(
            KDEMultivariate(X, var_type=var_type, bw="cv_ml").bw, 0.0, _lambda_max(var_type, X)
        )
    ours = nbattn.KernelDensity(bandwidth="cv_ml", var_type=var_type).fit(X).bandwidth_
    reference = _statsmodels_loo(X, var_type, theirs)
    assert _statsmodels_loo(X, var_type, ours) <= reference + 1e-9 * abs(reference)


# --------------------------------------------------------------------------- cv_ml vs the rule
def _rounded(x, digits=7):
    return np.array([float(f"{v:.{digits - 1}e}") for v in np.ravel(x)]).reshape(np.shape(x))


def hard_table(name, seed):
    """(X, var_type): data built to break a search."""
    rng = np.random.default_rng(seed)
    if name == "ties":  # 100 rows on 7 or so values
        return np.round(rng.normal(size=(100, 1))), "c"
    if name == "some ties":
        return np.round(rng.normal(size=(100, 1)), 1), "c"
    if name == "far clusters":
        return np.r_[rng.normal(size=50), 1e6 + rng.normal(size=50)][:, None], "c"
    if name in ("irrelevant and deterministic u", "irrelevant and deterministic o"):
        x = rng.normal(size=120)
        kind = name[-1]
        noise = rng.integers(0, 4, 120)  # independent of x, uniform
        noise[:4] = np.arange(4)
        return np.column_stack([x, noise, (x > 0).astype(float)]), "c" + kind + kind
    if name.startswith("n="):
        n = int(name[2:3])
        if name.endswith("cu"):
            codes = np.arange(n) % 2  # both levels present
            return np.column_stack([rng.normal(size=n), codes]), "cu"
        return rng.normal(size=(n, 1)), "c"
    if name == "float32 noise":
        return _rounded(1e4 + 1e-2 * rng.normal(size=(150, 1))), "c"
    if name == "float32 noise 2d":
        return np.column_stack(
            [_rounded(1e4 + 1e-2 * rng.normal(size=150)), rng.normal(size=150)]
        ), "cc"
    raise AssertionError(name)


HARD_TABLES = [
    "ties",
    "some ties",
    "far clusters",
    "irrelevant and deterministic u",
    "irrelevant and deterministic o",
    "n=2",
    "n=3",
    "n=5",
    "n=2 cu",
    "n=3 cu",
    "n=5 cu",
    "float32 noise",
    "float32 noise 2d",
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", HARD_TABLES)
def test_cv_ml_is_never_worse_than_the_rule(name, kernel):
    """The criterion (the naive twin's) at the cv_ml widths is at most at the normal
    reference rule's (1e-12 relative for the widths' round trip through the search's
    coordinates), the widths
    are finite and inside their ranges, and the fitted density is finite and positive
    at the training rows."""
    X, var_type = hard_table(name, 0)
    model = nbattn.KernelDensity(bandwidth="cv_ml", var_type=var_type, kernel=kernel).fit(X)
    widths = model.bandwidth_
    top = _lambda_max(var_type, X)
    cont = np.array([kind == "c" for kind in var_type])
    assert np.all(np.isfinite(widths)) and np.all(widths[cont] > 0)
    assert np.all((widths[~cont] >= 0) & (widths[~cont] <= top[~cont]))
    counts = tuple(0 if kind == "c" else int(X[:, c].max()) + 1 for c, kind in enumerate(var_type))
    rule_widths = nbattn.KernelDensity(var_type=var_type, kernel=kernel).fit(X).bandwidth_
    found = naive.kde_loo_log_likelihood(X, widths, var_type, counts, kernel)
    rule = naive.kde_loo_log_likelihood(X, rule_widths, var_type, counts, kernel)
    assert found <= rule + 1e-12 * abs(rule) if math.isfinite(rule) else found <= rule
    log_f = model.score_samples(X)
    assert np.all(np.isfinite(log_f))


def test_cv_ml_with_a_one_level_categorical_column_warns_of_nothing():
    """An unordered column whose rows all hold code 0 (one category: l = 0, the only
    width it admits): cv_ml gives it l = 0 without a NaN on the way."""
    X = np.column_stack([np.random.default_rng(0).normal(size=30), np.zeros(30)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model = nbattn.KernelDensity(bandwidth="cv_ml", var_type="cu").fit(X)
    assert model.bandwidth_[1] == 0.0 and model.bandwidth_[0] > 0


# --------------------------------------------------------------------------- brute force
def one_d_sample(seed, n, shape):
    rng = np.random.default_rng(seed)
    if shape == "normal":
        return rng.normal(size=n) * rng.uniform(0.1, 10)
    if shape == "exponential":
        return rng.exponential(size=n)
    if shape == "bimodal":
        return np.r_[rng.normal(size=n // 2), 8 + 0.3 * rng.normal(size=n - n // 2)]
    return rng.standard_t(2, size=n)


def loo_curve(x, grid, kernel):
    """n CV(h) of 1-D rows x at each h of ``grid``: -sum_i log f_-i(x_i), f_-i the mean
    of the other rows' kernels, each column's log kernel that of tests.naive, summed in
    log space, vectorised over h (+inf where a compact kernel reaches no other row)."""
    n = x.size
    out = np.empty(grid.size)
    for start in range(0, grid.size, 200):
        h = grid[start : start + 200, None, None]
        log_K = naive._log_density_column("c", x[None, :, None], x[None, None, :], h, 0, kernel)
        log_K[:, np.arange(n), np.arange(n)] = -np.inf
        log_f = naive.logsumexp_rows(log_K) - math.log(n - 1)
        out[start : start + 200] = -log_f.sum(axis=1)
    return out


def grid_check(x, kernel, lo=None, hi=None):
    """(criterion at the cv_ml width, its least value over 5000 log-spaced widths from
    the rule's h e^-9 to e^3, or from ``lo`` to ``hi``)."""
    X = x[:, None]
    h = nbattn.KernelDensity(bandwidth="cv_ml", kernel=kernel).fit(X).bandwidth_[0]
    rule = nbattn.KernelDensity(kernel=kernel).fit(X).bandwidth_[0]
    lo, hi = (rule * math.exp(-9), rule * math.exp(3)) if lo is None else (lo, hi)
    grid = np.exp(np.linspace(math.log(lo), math.log(hi), 5000))
    curve = loo_curve(x, grid, kernel)
    found = naive.kde_loo_log_likelihood(X, [h], "c", (0,), kernel)
    # the curve and nbattn's criterion are the naive twin's
    assert loo_log_likelihood(X, [h], kernel=kernel) == pytest.approx(found, rel=1e-12)
    for k in np.linspace(0, grid.size - 1, 7).astype(int):
        twin = naive.kde_loo_log_likelihood(X, [grid[k]], "c", (0,), kernel)
        assert curve[k] == pytest.approx(twin, rel=1e-10) or curve[k] == twin == np.inf
    return found, curve.min()


@settings(max_examples=20)
@given(
    seed=seeds,
    n=sizes((2, 50)),
    shape=st.sampled_from(["normal", "exponential", "bimodal", "student"]),
    kernel=st.sampled_from(["gaussian", "tricube"]),
)
def test_cv_ml_reaches_the_minimum_of_a_dense_grid(seed, n, shape, kernel):
    """In 1-D the search's criterion is within 1e-6 relative of the least value on a dense
    log grid of h (or below it)."""
    found, best = grid_check(one_d_sample(seed, n, shape), kernel)
    assert found <= best + 1e-6 * abs(best)


@pytest.mark.xfail(
    strict=True,
    reason="a local minimum: the Epanechnikov criterion is kinked (a pair enters the "
    "support at each gap), and the search stops short of the grid's least value by "
    "1e-6 to 1e-5 relative",
)
@pytest.mark.parametrize(("seed", "n"), [(8, 58), (64, 37)])
def test_cv_ml_reaches_the_minimum_of_a_dense_grid_epanechnikov(seed, n):
    """Reproducers of the misses on Epanechnikov curves (one_d_sample(seed, n, "normal"))."""
    found, best = grid_check(one_d_sample(seed, n, "normal"), "epanechnikov")
    assert found <= best + 1e-6 * abs(best)


@pytest.mark.xfail(
    strict=True,
    reason="the search keeps h within config.WIDTH_BOUNDS = (1e-3, 1e4) times the rule's: "
    "two clusters 1e6 apart put the rule near 2.1e5, the search stops at 211 (criterion "
    "697.4) while h near 0.51 gives 213.4",
)
def test_cv_ml_reaches_the_minimum_of_a_dense_grid_far_clusters():
    """Two unit clusters of 50 rows 1e6 apart (hard_table): the grid from 1e-2 to 1e7."""
    found, best = grid_check(hard_table("far clusters", 0)[0][:, 0], "gaussian", 1e-2, 1e7)
    assert found <= best + 1e-6 * abs(best)


def mixed_design(name, seed, n=60):
    """(X, var_type): a continuous column and a categorical one built to break the
    search's policy for a smooth criterion (``nbattn.local.search.SMOOTH_POLICY``)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, n)
    codes[:3] = np.arange(3)
    if name == "l at 0":  # each category its own cluster: other categories' keys only cost
        x = 6.0 * codes + rng.normal(size=n)
    elif name == "l at its top":  # the category independent of x, uniform
        x = rng.normal(size=n)
    elif name == "two minima in h":  # a wide cluster and a tight one
        x = np.where(np.arange(n) < n // 2, rng.normal(size=n), 6.0 + 0.02 * rng.normal(size=n))
    elif name == "tied x":  # x on a lattice, its cells told apart by the category
        x = np.round(rng.normal(size=n)) + 0.25 * codes
    else:
        raise AssertionError(name)
    return np.column_stack([x, codes]).astype(float)


def mixed_grid_minimum(X, kind, h_grid, l_grid):
    """The least n CV (the naive twin's criterion) over the grid of (h, l) of a Gaussian
    continuous column and a categorical one of 3 levels: f_-i = ((1 - l) A_i + l / 2 B_i)
    / (n - 1) ('u'), A_i / B_i the sums of the other rows' kernels in i's category /
    the others ('o': (1 - l) A_i + (1 - l) / 2 sum_k l^k B_ik, B_ik at distance k)."""
    x, codes = X[:, 0], X[:, 1].astype(int)
    n = x.size
    gap = np.abs(codes[:, None] - codes[None, :])
    best = math.inf
    for h in h_grid:
        K = np.exp(-0.5 * ((x[:, None] - x[None, :]) / h) ** 2) / (h * math.sqrt(2 * math.pi))
        np.fill_diagonal(K, 0.0)
        sums = np.stack([(K * (gap == k)).sum(axis=1) for k in range(3)])  # (3, n)
        lam = l_grid[:, None]
        if kind == "u":
            f = (1.0 - lam) * sums[0] + lam / 2.0 * (sums[1] + sums[2])
        else:
            f = (1.0 - lam) * (sums[0] + 0.5 * (lam * sums[1] + lam**2 * sums[2]))
        with np.errstate(divide="ignore"):
            values = -np.log(f / (n - 1)).sum(axis=1)
        best = min(best, float(values.min()))
    return best


MIXED_DESIGNS = ["l at 0", "l at its top", "two minima in h", "tied x"]


@pytest.mark.parametrize("kind", ["u", "o"])
@pytest.mark.parametrize("name", MIXED_DESIGNS)
def test_cv_ml_reaches_the_minimum_of_a_dense_grid_2d(name, kind):
    """A continuous column and a categorical one: the cv_ml criterion is within 1e-6
    relative of the least value on a dense grid of (h, l) (h log-spaced from the rule's
    e^-6 to e^3, l over [0, lambda_max] with both ends), or below it; and inside the
    ranges (l in [0, lambda_max])."""
    X = mixed_design(name, 0)
    var_type = "c" + kind
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tied x: h at the search's floor
        widths = nbattn.KernelDensity(bandwidth="cv_ml", var_type=var_type).fit(X).bandwidth_
    rule = nbattn.KernelDensity(var_type=var_type).fit(X).bandwidth_[0]
    top = 2.0 / 3.0 if kind == "u" else 1.0
    assert widths[0] > 0 and 0.0 <= widths[1] <= top
    h_grid = rule * np.exp(np.linspace(-6.0, 3.0, 300))
    l_grid = np.r_[0.0, top * np.geomspace(1e-6, 1.0, 400)]
    best = mixed_grid_minimum(X, kind, h_grid, l_grid)
    found = naive.kde_loo_log_likelihood(X, widths, var_type, (0, 3), "gaussian")
    assert mixed_grid_minimum(X, kind, widths[:1], widths[1:]) == pytest.approx(found, rel=1e-10)
    assert found <= best + 1e-6 * abs(best)


# --------------------------------------------------------------------------- repeatability
REPEAT_CONFIGS = [
    ("c", "gaussian", False),
    ("cc", "epanechnikov", True),
    ("cuo", "tricube", False),
    ("cou", "gaussian", True),
]


def repeat_digest(var_type, kernel, weighted, seed=0):
    """The cv_ml widths of a table of the given kinds as a hex string."""
    X = statsmodels_table(seed, var_type, 90)
    X[:, 0] = np.round(X[:, 0], 1)  # ties
    weights = np.random.default_rng(seed).exponential(size=90) if weighted else None
    model = nbattn.KernelDensity(bandwidth="cv_ml", var_type=var_type, kernel=kernel)
    return model.fit(X, sample_weight=weights).bandwidth_.tobytes().hex()


@pytest.mark.parametrize(("var_type", "kernel", "weighted"), REPEAT_CONFIGS)
def test_cv_ml_fits_twice_to_the_bit(var_type, kernel, weighted):
    first = repeat_digest(var_type, kernel, weighted)
    junk = [np.full((rows, 64), np.nan) for rows in range(1, 16)]  # scratch to hand back
    del junk
    assert repeat_digest(var_type, kernel, weighted) == first


_CHILD = """
import json
import nbattn
from tests.distribution.test_density_widths import REPEAT_CONFIGS, repeat_digest
print(json.dumps([nbattn.__file__] + [repeat_digest(*c) for c in REPEAT_CONFIGS]))
"""


def test_cv_ml_fits_in_a_fresh_process_to_the_bit():
    """A fresh process (this checkout first on its path) finds the widths found here."""
    here = [repeat_digest(*config) for config in REPEAT_CONFIGS]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    where, *there = json.loads(done.stdout.strip().splitlines()[-1])
    assert where == nbattn.__file__  # this checkout's package, not another install
    for config, a, b in zip(REPEAT_CONFIGS, here, there):
        assert a == b, config


def test_conditional_cv_ml_sees_past_a_plateau_at_the_floor():
    """A conditional density whose criterion is flat as x's first width shrinks to the
    search's floor (n = 46, no ties): the search does not stop on that plateau (criterion
    21.35) but reaches statsmodels' optimum (15.22) in statsmodels' own objective."""
    from statsmodels.nonparametric.kernel_density import KDEMultivariateConditional

    rng = np.random.default_rng(105)
    n = int(rng.integers(30, 90))
    X = np.c_[rng.normal(size=n), rng.uniform(size=n)]
    y = np.sin(2 * X[:, 0]) + rng.normal(size=n) * 0.3
    model = nbattn.ConditionalKernelDensity(bandwidth="cv_ml").fit(X, y)
    peer = KDEMultivariateConditional(y, X, "c", "cc", bw=[0.3, 0.02, 0.2])
    ours = peer.loo_likelihood(np.r_[model.y_bandwidth_, model.bandwidth_], func=np.log)
    # statsmodels' cv_ml answer on this data (its optimiser takes 5 s to find it again)
    theirs = peer.loo_likelihood(np.array([0.3250, 0.01825, 0.1594]), func=np.log)
    assert theirs < 15.23
    assert ours <= theirs + 1e-6 * abs(theirs)


@pytest.mark.parametrize("factor", [2.0**40, 2.0**-40, 2.0**-1000])
def test_conditional_cv_ml_weights_times_a_power_of_two_give_the_same_bits(factor):
    rng = np.random.default_rng(3)
    X = np.c_[rng.normal(size=60), rng.integers(0, 3, 60)]
    y = X[:, 0] + rng.normal(size=60)
    w = rng.uniform(0.1, 2.0, 60)
    options = dict(bandwidth="cv_ml", var_type="cu")
    a = nbattn.ConditionalKernelDensity(**options).fit(X, y, sample_weight=w)
    b = nbattn.ConditionalKernelDensity(**options).fit(X, y, sample_weight=w * factor)
    np.testing.assert_array_equal(
        np.r_[a.y_bandwidth_, a.bandwidth_], np.r_[b.y_bandwidth_, b.bandwidth_]
    )
