"""The width search's criterion from the leave-one-out tiles (``criterion_for``).

On continuous columns with the Gaussian kernel, degree 0, no weights and no missing
values the search's criterion and gradient come from the tiles of the learned metrics
(``nbattn.local.widths._PooledCriterion``): the same numbers as the engine's to rounding,
which these tests check over random shapes, magnitudes and widths, and the same
guarantees for the search (never worse than the rule, the same bits twice).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.local import widths as W
from nbattn.local.engine import local_loo_loss
from nbattn.local.problem import check_columns, rule_widths

from ..strategies import seeds


def _criteria(X, y, var_type=None, degree=0, sample_weight=None, **options):
    spec, (Xc,) = check_columns({"X": X}, var_type=var_type or "c" * X.shape[1], **options)
    start = rule_widths(spec, Xc)
    y2 = y.reshape(len(X), -1)
    problem = W._training_problem(spec, Xc, y2, degree, sample_weight, start)
    return W.LooCriterion(problem), W.criterion_for(problem), start


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    n=st.integers(2, 400),
    d=st.integers(1, 4),
    p=st.integers(1, 3),
    kind=st.sampled_from(["normal", "duplicates", "clustered", "huge", "tiny"]),
    log_factor=st.floats(-3.0, 2.0),
)
def test_equals_the_engine_to_rounding(seed, n, d, p, kind, log_factor):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10.0, d)
    if kind == "duplicates":
        X = X[rng.integers(0, max(1, n // 5), n)]
    elif kind == "clustered":
        X = rng.uniform(-5, 5, (3, d))[rng.integers(0, 3, n)] + 0.05 * rng.normal(size=(n, d))
    y = np.sin(X[:, :1]) + rng.normal(size=(n, p))
    scale = {"huge": 1e150, "tiny": 1e-150}.get(kind, 1.0)
    engine, pooled, start = _criteria(X * scale, y * scale)
    assert isinstance(pooled, W._PooledCriterion)
    theta = np.log(start * np.exp(log_factor) * rng.uniform(0.5, 2.0, d))
    value, grad = engine.loss_and_grad(theta)
    value_p, grad_p = pooled.loss_and_grad(theta)
    assert value_p == pytest.approx(value, rel=1e-11, abs=1e-300)
    scale = max(np.abs(grad).max(), value)  # a gradient of zeros is exact to the value's digits
    np.testing.assert_allclose(grad_p, grad, rtol=1e-8, atol=1e-11 * scale)
    assert pooled.loss(theta + 1e-3) == pytest.approx(engine.loss(theta + 1e-3), rel=1e-11)


def test_only_where_the_tiles_compute_the_same_criterion():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 2))
    y = X[:, 0] + rng.normal(size=50)
    assert isinstance(_criteria(X, y)[1], W._PooledCriterion)
    engine_cases = [
        dict(degree=1),
        dict(sample_weight=np.ones(50)),
        dict(kernel="epanechnikov"),
        dict(var_type="cu"),
    ]
    Xu = X.copy()
    Xu[:, 1] = rng.integers(0, 3, 50)
    for case in engine_cases:
        data = Xu if case.get("var_type") == "cu" else X
        chosen = _criteria(data, y, **case)[1]
        assert type(chosen) is W.LooCriterion, case
    Xn = X.copy()
    Xn[3, 1] = np.nan
    assert type(_criteria(Xn, y, missing="marginalize")[1]) is W.LooCriterion


def _designs():
    """Curves built to trouble a search: tied x (plateaus), an irrelevant column (its
    minimum at the upper end), two far clusters (several minima), pure noise (the flat
    end at the widest widths)."""
    rng = np.random.default_rng(11)
    n = 300
    x = rng.uniform(-2, 2, n)
    yield "tied", np.round(x * 2) / 2, np.sign(x) + 0.1 * rng.normal(size=n)
    X = np.column_stack([x, rng.normal(size=n)])
    yield "irrelevant", X, np.sin(2 * x) + 0.1 * rng.normal(size=n)
    far = np.where(rng.uniform(size=n) < 0.5, x, x + 1e3)
    yield "far clusters", far, np.cos(3 * far) + 0.1 * rng.normal(size=n)
    yield "noise", X, rng.normal(size=n)


@pytest.mark.parametrize("rtol", [0.0, 1e-6, 0.3])
def test_nw_search_no_worse_than_the_rule_and_repeatable(rtol):
    for name, X, y in _designs():
        X = X.reshape(len(y), -1)
        fits = [nbattn.NadarayaWatsonRegressor(bandwidth="loo", rtol=rtol).fit(X, y) for _ in "ab"]
        widths = fits[0].bandwidth_
        assert widths.tobytes() == fits[1].bandwidth_.tobytes(), name
        rule = nbattn.NadarayaWatsonRegressor(bandwidth="scott").fit(X, y).bandwidth_
        found = local_loo_loss(X, y, widths, 0, var_type="c" * X.shape[1])
        start = local_loo_loss(X, y, rule, 0, var_type="c" * X.shape[1])
        assert found <= start * (1 + 1e-12), name


@pytest.mark.parametrize("offset, scale", [(0.0, 1e-100), (1e10, 1e-3), (0.0, 1e-80)])
def test_small_and_offset_targets_agree_with_the_engine(offset, scale):
    """y near 1e-100 underflowed in the tiles and y = 1e10 + noise lost the gradient's
    digits (found in review): the pooled criterion centres y and brings it to unit size,
    so it equals the engine's criterion of the centred targets (a shift changes no
    residual; the engine itself loses digits to an offset of 1e10)."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (300, 2))
    y = offset + scale * (np.sin(X[:, 0]) + 0.3 * rng.normal(size=300))
    pooled, start = _criteria(X, y)[1:]
    engine = _criteria(X, y - np.median(y))[0]
    for factor in (1e-3, 1e-2, 1.0):
        theta = np.log(start * factor)
        value, grad = engine.loss_and_grad(theta)
        value_p, grad_p = pooled.loss_and_grad(theta)
        assert value_p == pytest.approx(value, rel=1e-9)
        np.testing.assert_allclose(grad_p, grad, rtol=1e-6, atol=1e-9 * value)
