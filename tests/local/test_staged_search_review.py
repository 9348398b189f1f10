"""The staged LOO width search of the local fits (``nbattn.local.staged.staged_search``)
where a subsample misleads it: rows of weight 0, structure that only all rows resolve,
a column that varies only outside the subsample; its input checks; and an interrupted
fit. Small subsamples (``subsample=``) let a few hundred rows run in stages."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import LocalPolynomialRegressor
from nbattn.local import staged as local_staged
from nbattn.local import widths as local_widths
from nbattn.local.engine import default_widths, local_loo_loss
from nbattn.local.problem import check_columns
from nbattn.local.widths import local_loo_widths
from tests.strategies import seeds

_KW = dict(var_type="cu", n_categories=[0, 3])


def _mixed(n, seed):
    """(X, y): a continuous column and a 3-level one, y a smooth curve plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 4, n)
    cat = rng.integers(0, 3, n).astype(float)
    return np.column_stack([x, cat]), np.sin(2 * x) + 0.5 * cat + 0.2 * rng.normal(size=n)


def test_zero_weights_on_every_row_of_the_first_subsample():
    """The rows the first stage drew with every row in the draw (a fixed seed) all weigh
    0: the subsample's criterion was 0 / 0 and the search refused data that the search on
    every row fits. Rows of weight 0 are left out of the draws now."""
    n, m = 200, 50
    X, y = _mixed(n, 1)
    weights = np.ones(n)
    weights[np.random.default_rng(0).permutation(n)[:m]] = 0.0
    widths = local_loo_widths(X, y, sample_weight=weights, subsample=m, **_KW)
    again = local_loo_widths(X, y, sample_weight=weights, subsample=m, **_KW)
    np.testing.assert_array_equal(widths, again)
    assert np.isfinite(widths).all()
    ours = local_loo_loss(X, y, widths, sample_weight=weights, **_KW)
    rule = local_loo_loss(X, y, default_widths(X, *_KW.values()), sample_weight=weights, **_KW)
    assert ours <= rule * (1 + 1e-12)


@settings(max_examples=8)
@given(seed=seeds, positive=st.integers(3, 99))
def test_fewer_weighted_rows_than_two_stages_search_every_row(seed, positive):
    """Fewer than twice ``subsample`` rows of positive weight among many rows: no
    stages (a subsample of all rows held few weighted ones); the answer is the search
    on every row's, bit for bit."""
    n = 300
    X, y = _mixed(n, seed)
    rng = np.random.default_rng(seed)
    weights = np.zeros(n)
    weights[rng.choice(n, positive, replace=False)] = rng.uniform(0.5, 2.0, positive)
    staged = local_loo_widths(X, y, sample_weight=weights, subsample=50, **_KW)
    every = local_loo_widths(X, y, sample_weight=weights, **_KW)
    np.testing.assert_array_equal(staged, every)


def _blind_spot(case, seed, n=400):
    """(X, y, var_type) whose best widths on all rows the first stage's 50 rows cannot
    show: a product of two columns (both look irrelevant on 50 rows, so each h sits at
    its upper bound, and neither alone gains on all rows), or a column that is 0 on
    every row of the first two stages (a fixed seed draws them)."""
    rng = np.random.default_rng(4000 + seed)
    x = rng.uniform(0, 4, n)
    cat = rng.integers(0, 3, n).astype(float)
    noise = 0.1 * rng.normal(size=n)
    if case == "product":
        x2 = rng.uniform(0, 4, n)
        y = np.sin(5 * x) * np.sin(5 * x2) + 0.3 * cat + noise
        return np.column_stack([x, x2, cat]), y, "ccu"
    outside = np.random.default_rng(0).permutation(n)[n // 2 :]
    z = np.zeros(n)
    z[outside] = rng.uniform(-1, 1, outside.size)
    y = np.sin(2 * x) + 2 * np.sin(3 * z) + 0.5 * cat + 2 * noise
    return np.column_stack([x, z, cat]), y, "ccu"


@pytest.mark.parametrize("case", ["product", "zero outside the subsamples"])
def test_later_stages_find_what_the_subsample_cannot_see(case):
    """Against the search on every row (the peer): within 1 % on each draw. Before the
    later stages' probes (every h at the coarse grid of the rule's, each h and l alone
    at decades), the product case stayed at twice the criterion on every draw: the
    short search only descended from the subsample's widths."""
    for seed in range(4):
        X, y, var_type = _blind_spot(case, seed)
        staged = local_loo_widths(X, y, var_type=var_type, subsample=50)
        every = local_loo_widths(X, y, var_type=var_type)
        ours = local_loo_loss(X, y, staged, var_type=var_type)
        full = local_loo_loss(X, y, every, var_type=var_type)
        assert ours <= full * (1 + 1e-2), (case, seed, ours, full, staged, every)


@settings(max_examples=10)
@given(
    seed=seeds,
    extra=st.integers(-1, 30),
    degree=st.sampled_from([0, 1, 2]),
    zeros=st.sampled_from([0.0, 0.3, 0.8]),
)
def test_staged_search_around_the_threshold(seed, extra, degree, zeros):
    """n from 2 m - 1 (no stages) up, with a share of rows of weight 0 and few distinct
    x (ties): finite widths, never worse than the rule on all rows, the same from two
    identical calls."""
    m = 20
    n = 2 * m + extra
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, 6, n) / 2.0, rng.integers(0, 3, n)]).astype(float)
    y = np.cos(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n)
    weights = rng.uniform(0.5, 2.0, n) * (rng.uniform(size=n) >= zeros)
    weights[rng.integers(n)] = 1.0  # one row of weight at least
    widths = local_loo_widths(X, y, degree, sample_weight=weights, subsample=m, **_KW)
    again = local_loo_widths(X, y, degree, sample_weight=weights, subsample=m, **_KW)
    np.testing.assert_array_equal(widths, again)
    assert np.isfinite(widths).all() and (widths[:1] > 0).all()
    rule_widths = default_widths(X, *_KW.values())
    ours = local_loo_loss(X, y, widths, degree, sample_weight=weights, **_KW)
    rule = local_loo_loss(X, y, rule_widths, degree, sample_weight=weights, **_KW)
    assert ours <= rule * (1 + 1e-12), (ours, rule, widths)


def test_exact_matching_through_the_stages():
    """Tied x (5 values) and a category that scales y: the search on every row ends at
    or next to exact matching (l = 0, or a share of 1e-3 of its range, which the sweep's
    decades find 2e-5 below it) and an h that isolates each x, no worse than exact
    matching at its h; the staged answer is as good to 1e-4 (l within 1e-2 of 0), and a
    rescaled l = 0 stays exactly 0 (t = -inf)."""
    spec_kw = dict(var_type="cu", n_categories=[0, 3])
    for seed in range(2):
        rng = np.random.default_rng(seed)
        X = np.column_stack([rng.integers(0, 5, 300), rng.integers(0, 3, 300)]).astype(float)
        y = np.cos(X[:, 0]) * (1 + X[:, 1]) + 0.1 * rng.normal(size=300)
        staged = local_loo_widths(X, y, subsample=50, **spec_kw)
        every = local_loo_widths(X, y, **spec_kw)
        assert every[1] < 1e-2 and staged[1] < 1e-2, (staged, every)
        ours, full = (local_loo_loss(X, y, w, **spec_kw) for w in (staged, every))
        exact_matching = local_loo_loss(X, y, [every[0], 0.0], **spec_kw)
        assert full <= exact_matching, (seed, full, exact_matching)
        assert ours <= full * (1 + 1e-4), (seed, ours, full)
    spec, _ = check_columns({"X": np.zeros((1, 2))}, **spec_kw)
    theta = np.array([0.0, -np.inf])
    assert local_staged._rescaled_theta(theta, spec, 50, 300)[1] == -np.inf


@pytest.mark.parametrize("maxiter", ["many", -1, 2.5, True])
def test_maxiter_is_checked(maxiter):
    X, y = _mixed(20, 0)
    with pytest.raises(ValueError, match="maxiter"):
        local_loo_widths(X, y, maxiter=maxiter, **_KW)


@pytest.mark.parametrize("rows", [50, 200])
def test_an_interrupted_staged_fit_leaves_nothing_behind(monkeypatch, rows):
    """KeyboardInterrupt from inside a criterion evaluation (on the subsample's 50 rows,
    or on all 200): it reaches the caller, the model holds no widths or training data,
    and the next fit is a clean fit's, bit for bit."""
    X, y = _mixed(200, 3)
    clean = LocalPolynomialRegressor(var_type="cu", loo_subsample=50).fit(X, y).bandwidth_
    value = local_widths.LooCriterion._value
    calls = []

    def interrupted(self, theta):
        if self.targets.shape[0] == rows:
            calls.append(rows)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return value(self, theta)

    monkeypatch.setattr(local_widths.LooCriterion, "_value", interrupted)
    model = LocalPolynomialRegressor(var_type="cu", loo_subsample=50)
    with pytest.raises(KeyboardInterrupt):
        model.fit(X, y)
    assert len(calls) == 3
    assert not hasattr(model, "bandwidth_") and not hasattr(model, "X_fit_")
    monkeypatch.setattr(local_widths.LooCriterion, "_value", value)
    again = LocalPolynomialRegressor(var_type="cu", loo_subsample=50).fit(X, y).bandwidth_
    np.testing.assert_array_equal(again, clean)
