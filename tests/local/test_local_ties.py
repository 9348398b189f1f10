"""The leave-one-out fits of tied training rows pooled one key per distinct row
(``nbattn.local.ties``) against the plain pass and the dense reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import LocalPolynomialRegressor, config
from nbattn.local.engine import fit_problem
from nbattn.local.problem import check_spec, layout
from nbattn.local.search import widths_to_theta
from nbattn.local.ties import tie_groups, tied_loo_fits
from nbattn.local.widths import LooCriterion
from tests import naive
from tests._config import config_values
from tests.strategies import seeds


def _tied_table(rng, n, var_type, levels):
    """n rows whose columns take ``levels`` values each (continuous ones spread by a
    random power of ten): many rows repeat."""
    columns = []
    for kind in var_type:
        codes = rng.integers(0, levels, n).astype(float)
        columns.append(codes * 10.0 ** rng.integers(-3, 4) if kind == "c" else codes)
    return np.column_stack(columns)


def _problem(X, y, var_type, kernel, degree, widths, **spec_options):
    spec = check_spec(X.shape[1], var_type=var_type, kernel=kernel, data=(X,), **spec_options)
    return layout(spec, X, X, y, widths, degree, exclude_self=True)


def _widths(rng, X, var_type, kernel):
    """Widths from a fifth to twice each continuous column's spread (a compact kernel's
    from its spread on: some rows then reach no other), any smoothing of the categories."""
    out = []
    for c, kind in enumerate(var_type):
        if kind == "c":
            spread = max(np.ptp(X[:, c]), 1e-3)
            out.append(spread * rng.uniform(0.2 if kernel == "gaussian" else 0.5, 2.0))
        else:
            top = 1.0 if kind == "o" else (X[:, c].max()) / (X[:, c].max() + 1)
            out.append(rng.uniform(0.0, 1.0) * top)
    return np.array(out)


@settings(max_examples=40)
@given(
    seeds,
    st.integers(2, 60),
    # at most two continuous columns: the fused sums compile per number of terms p, and
    # p = 2, 3 (and the general path) are what these draws reach
    st.sampled_from(["c", "cc", "cu", "co", "ccuu", "u", "cuo"]),
    st.integers(1, 4),
    st.integers(0, 2),
    st.sampled_from(["gaussian", "epanechnikov", "tricube"]),
    st.integers(-300, 300),
)
def test_tied_fits_are_the_leave_one_out_fits(seed, n, var_type, levels, degree, kernel, power):
    """Pooled ties give every row its leave-one-out fit: the dense reference's where the
    local design is well conditioned, the plain pass's to rounding; where the pooled
    path declines (None) the plain pass decides. Targets from 1e-300 to 1e300."""
    rng = np.random.default_rng(seed)
    X = _tied_table(rng, n, var_type, levels)
    y = (rng.normal(size=n) + X[:, 0]) * 10.0**power
    widths = _widths(rng, X, var_type, kernel)
    problem = _problem(X, y, var_type, kernel, degree, widths)
    ties = tie_groups(problem)
    distinct = np.unique(X, axis=0).shape[0]
    assert (ties is None) == (100 * distinct > config.LOCAL_TIE_MAX_SHARE * n)
    if ties is None:
        return
    member_start, members, position = ties.members()
    assert sorted(members.tolist()) == list(range(n))
    for t in range(ties.counts.shape[0]):  # each group's rows, and the way back
        np.testing.assert_array_equal(position[members[member_start[t] : member_start[t + 1]]], t)
    plain = fit_problem(problem)
    tied_pass = tied_loo_fits(problem, ties)
    if tied_pass is None:
        # declined only where a row falls back to a nearest key on the plain pass too
        assert (plain.log_norm == -np.inf).any()
        return
    tied = tied_pass.fits
    assert np.isfinite(tied).all()
    scale = np.abs(y).max()
    # the reference on y / 10**power (the fit is linear in y; its sums would overflow)
    ref, _, weights = naive.local_polynomial_exact(
        X,
        X,
        y / 10.0**power,
        widths,
        var_type,
        [int(X[:, c].max()) + 1 if k != "c" else 0 for c, k in enumerate(var_type)],
        degree,
        kernel=kernel,
        exclude_self=True,
        ridge=config.LOCAL_RIDGE,
    )
    ref = ref * 10.0**power
    cond = naive.local_design_condition(X, X, weights, var_type, degree)
    for i in range(n):
        if cond[i] < 1e6:
            assert abs(tied[i, 0] - ref[i]) <= 1e-9 * scale, (i, cond[i])
            assert abs(tied[i, 0] - plain.beta[i, 0, 0]) <= 1e-9 * scale, (i, cond[i])


def test_the_width_search_on_pooled_ties_finds_the_plain_search_s_widths(monkeypatch):
    """The LOO search of LocalPolynomialRegressor on a tied table (integer and
    categorical columns) pools the ties, lands where the plain pass's search lands (the
    same criterion to rounding), and a second fit gives the same bits."""
    rng = np.random.default_rng(3)
    n = 600
    X = np.column_stack(
        [
            rng.integers(0, 6, n),
            rng.integers(0, 10, n),
            rng.integers(0, 3, n),
            rng.integers(0, 2, n),
        ]
    ).astype(float)
    y = np.sin(X[:, 0] / 3) + 0.05 * X[:, 1] + 0.3 * X[:, 2] + 0.2 * rng.normal(size=n)
    kw = dict(var_type="ccuu")
    pooled = LocalPolynomialRegressor(**kw).fit(X, y)
    again = LocalPolynomialRegressor(**kw).fit(X, y)
    np.testing.assert_array_equal(pooled.bandwidth_, again.bandwidth_)
    np.testing.assert_array_equal(pooled.predict(X), again.predict(X))
    monkeypatch.setattr(config, "LOCAL_TIE_MAX_SHARE", 0)
    plain = LocalPolynomialRegressor(**kw).fit(X, y)
    problem = _problem(X, y, "ccuu", "gaussian", 1, pooled.bandwidth_)
    assert tie_groups(problem) is None  # the patched share turns the pooled path off
    monkeypatch.undo()
    # the plain pass's criterion at both answers: the pooled search's is no worse
    values = []
    for widths in (pooled.bandwidth_, plain.bandwidth_):
        fits = fit_problem(_problem(X, y, "ccuu", "gaussian", 1, widths)).beta[:, 0, 0]
        values.append(float(np.mean((fits - y) ** 2)))
    assert values[0] <= values[1] * (1 + 1e-9)
    assert LooCriterion(_problem(X, y, "ccuu", "gaussian", 1, plain.bandwidth_)).ties is not None
    np.testing.assert_allclose(pooled.bandwidth_, plain.bandwidth_, rtol=1e-6)


@pytest.mark.parametrize("case", ["sample_weight", "missing", "distinct rows", "not leave-one-out"])
def test_ties_are_pooled_only_on_the_unweighted_leave_one_out_pass(case):
    rng = np.random.default_rng(0)
    X = _tied_table(rng, 50, "cu", 3)
    y = rng.normal(size=50)
    widths = np.array([np.ptp(X[:, 0]) + 1.0, 0.3])
    spec_options, weight, exclude_self = {}, None, True
    if case == "sample_weight":
        weight = rng.uniform(0.5, 2.0, 50)
    elif case == "missing":
        spec_options["missing"] = "marginalize"
    elif case == "distinct rows":
        X[:, 0] = np.arange(50.0)
    else:
        exclude_self = False
    spec = check_spec(2, var_type="cu", data=(X,), **spec_options)
    problem = layout(spec, X, X, y, widths, 1, sample_weight=weight, exclude_self=exclude_self)
    assert tie_groups(problem) is None
    if case != "distinct rows":  # the same rows, exact and unweighted: pooled
        spec = check_spec(2, var_type="cu", data=(X,))
        assert tie_groups(layout(spec, X, X, y, widths, 1, exclude_self=True)) is not None


@settings(max_examples=30)
@given(
    seeds,
    st.integers(3, 80),
    st.sampled_from(["c", "cc", "cu", "cuo", "ccuu", "u", "o"]),
    st.integers(0, 2),
    st.sampled_from(["gaussian", "epanechnikov", "tricube"]),
    st.integers(-100, 100),  # the criterion, a squared error, stays within float64
)
def test_the_pooled_criterion_and_gradient_are_the_plain_ones(
    seed, n, var_type, degree, kernel, power
):
    """LooCriterion.loss_and_grad on pooled ties against the plain passes (the criterion
    with its ties set to None): the value to rounding, the gradient to 1e-9 of its
    largest entry or of the value (a flat criterion's gradient is rounding noise)."""
    rng = np.random.default_rng(seed)
    X = _tied_table(rng, n, var_type, 3)
    y = (rng.normal(size=n) + X[:, 0] + 3.0) * 10.0**power
    widths = _widths(rng, X, var_type, kernel)
    spec = check_spec(len(var_type), var_type=var_type, kernel=kernel, data=(X,))
    criterion = LooCriterion(layout(spec, X, X, y, widths, degree, exclude_self=True))
    if criterion.ties is None:
        return
    theta = widths_to_theta(widths, var_type, spec.n_categories)
    pooled = criterion.loss_and_grad(theta)
    criterion.ties = None
    plain = criterion.loss_and_grad(theta)
    if not np.isfinite(plain[0]):
        assert not np.isfinite(pooled[0])
        return
    np.testing.assert_allclose(pooled[0], plain[0], rtol=1e-11)
    scale = max(np.abs(plain[1]).max(), abs(plain[0]))
    np.testing.assert_allclose(pooled[1], plain[1], rtol=0, atol=1e-9 * scale)


def test_the_pooled_gradient_is_the_criterion_s_slope():
    """Central differences of the pooled criterion in every width parameter (Gaussian,
    local linear, continuous and categorical columns)."""
    rng = np.random.default_rng(11)
    X = _tied_table(rng, 300, "ccuo", 4)
    y = np.sin(X[:, 0]) + 0.1 * X[:, 2] + 0.3 * rng.normal(size=300)
    spec = check_spec(4, var_type="ccuo", data=(X,))
    widths = np.array([np.ptp(X[:, 0]) / 3, np.ptp(X[:, 1]) / 2, 0.3, 0.4])
    criterion = LooCriterion(layout(spec, X, X, y, widths, 1, exclude_self=True))
    assert criterion.ties is not None
    theta = widths_to_theta(widths, "ccuo", spec.n_categories)
    value, grad = criterion.loss_and_grad(theta)
    for k in range(4):
        step = np.zeros(4)
        step[k] = 1e-5
        slope = (criterion.loss(theta + step) - criterion.loss(theta - step)) / 2e-5
        assert abs(slope - grad[k]) <= 1e-6 * (abs(grad).max() + value), (k, slope, grad[k])


@settings(max_examples=30)
@given(
    seeds,
    st.integers(8, 120),
    st.sampled_from(["cc", "ccu", "ccuo"]),
    st.sampled_from([0, 1]),  # the general path and the fused sums of p = 3 on pruned leaves
    st.sampled_from(["gaussian", "epanechnikov", "tricube"]),
    st.sampled_from([1e-8, 1e-4, 1e-2, 0.3]),
)
def test_pooled_ties_with_rtol_stay_within_the_bound(seed, n, var_type, degree, kernel, rtol):
    """With rtol > 0 the pooled groups take the pruned leaves (forced here on small data):
    each row's normaliser within rtol of the exact one and its fit within the engine's
    bound 2 rtol / (1 - rtol) ||g||_1 max_j |y_j - x_j . beta| of the exact leave-one-out
    fit; two calls give the same bits."""
    rng = np.random.default_rng(seed)
    X = _tied_table(rng, n, var_type, 3)
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n) + 3.0
    widths = _widths(rng, X, var_type, kernel) / 3.0
    with config_values(LOCAL_LEAF_KEYS=4, LOCAL_TREE_MIN_KEYS=1, LOCAL_TREE_MAX_SHARE=100):
        problem = _problem(X, y, var_type, kernel, degree, widths, rtol=rtol)
        ties = tie_groups(problem)
        if ties is None:
            return
        pooled = tied_loo_fits(problem, ties)
        again = tied_loo_fits(problem, ties)
    exact = fit_problem(_problem(X, y, var_type, kernel, degree, widths))
    if pooled is None:
        assert again is None
        return
    np.testing.assert_array_equal(pooled.fits, again.fits)
    order = pooled.tree.key_order
    assert order is not None  # the forced tree: groups in k-d order, pruned leaves
    position = np.arange(ties.counts.shape[0])
    if order is not None:
        position[order] = np.arange(order.shape[0])
    fit = pooled.group_fit
    for i in range(n):
        t = position[ties.group[i]]
        lse, lse_exact = fit.shift[t] + fit.log_norm[t], exact.shift[i] + exact.log_norm[i]
        slack = 1e-12 * (1.0 + abs(lse_exact))
        assert lse_exact + np.log1p(-rtol) - slack <= lse <= lse_exact + slack, i
        if not np.array_equal(exact.g[i] == 0, fit.g[t] == 0):
            continue  # a design at its rank's edge: the truncated solve kept other terms
        others = np.arange(n) != i
        x = naive.local_design(
            problem.q_cont[i : i + 1], problem.q_cont[others], "c" * problem.q_cont.shape[1], degree
        )[0]
        residual = np.abs(y[others] - x @ exact.beta[i, :, 0]).max()
        allowed = 2.0 * rtol / (1.0 - rtol) * np.abs(fit.g[t]).sum() * residual
        diff = abs(pooled.fits[i, 0] - exact.beta[i, 0, 0])
        assert diff <= allowed + 1e-9 * (1.0 + abs(exact.beta[i, 0, 0])), (i, diff, allowed)


@pytest.mark.parametrize("degree", [0, 1])
def test_pooled_criterion_and_gradient_with_rtol_near_the_exact_ones(degree):
    """At rtol = 1e-10 on the forced tree the pooled criterion and gradient (the
    derivative of the pruned sums) are the exact plain ones to the tolerance's order."""
    rng = np.random.default_rng(7)
    X = _tied_table(rng, 300, "ccuo", 3)
    y = np.sin(X[:, 0]) + 0.2 * X[:, 2] + 0.3 * rng.normal(size=300)
    widths = np.array([np.ptp(X[:, 0]) / 6, np.ptp(X[:, 1]) / 4, 0.2, 0.3])
    theta = widths_to_theta(widths, "ccuo", (0, 0, 3, 3))
    exact = LooCriterion(_problem(X, y, "ccuo", "gaussian", degree, widths))
    exact.ties = None
    with config_values(LOCAL_LEAF_KEYS=4, LOCAL_TREE_MIN_KEYS=1, LOCAL_TREE_MAX_SHARE=100):
        pooled = LooCriterion(_problem(X, y, "ccuo", "gaussian", degree, widths, rtol=1e-10))
        assert pooled.ties is not None
        value, grad = pooled.loss_and_grad(theta)
        assert (value, grad.tolist()) == (lambda v, g: (v, g.tolist()))(
            *pooled.loss_and_grad(theta)
        )
    value_exact, grad_exact = exact.loss_and_grad(theta)
    assert abs(value - value_exact) <= 1e-7 * value_exact
    np.testing.assert_allclose(grad, grad_exact, rtol=1e-5, atol=1e-9 * np.abs(grad_exact).max())


def test_device_auto_on_a_machine_without_a_gpu_pools_ties():
    """device='auto' runs on the CPU where numba sees no GPU, and pools there as 'cpu' does."""
    from nbattn.dispatch.device import resolve_device

    if resolve_device("auto") != "cpu":
        pytest.skip("a GPU is visible: 'auto' runs the plain pass on it")
    rng = np.random.default_rng(0)
    X = _tied_table(rng, 50, "cu", 3)
    spec = check_spec(2, var_type="cu", data=(X,), device="auto")
    problem = layout(spec, X, X, rng.normal(size=50), np.array([1.0, 0.3]), 1, exclude_self=True)
    assert tie_groups(problem) is not None


@pytest.mark.parametrize("degree", [0, 1, 2])
def test_public_loo_loss_pools_ties_and_equals_the_plain_pass(degree, monkeypatch):
    """``local_loo_loss`` on tied tables takes the pooled pass (the plain first pass is
    not called) and equals the plain pass and the dense reference, over many draws."""
    from nbattn.local import engine

    for seed in range(8):
        rng = np.random.default_rng(seed)
        n = 150
        X = np.column_stack([rng.integers(0, 6, n) * 0.5, rng.integers(0, 3, n)]).astype(float)
        y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + rng.normal(size=n)
        widths = np.array([rng.uniform(0.3, 1.5), rng.uniform(0.0, 0.6)])
        kw = dict(var_type="cu", n_categories=[0, 3])
        with config_values(LOCAL_TIE_MAX_SHARE=0):
            plain = engine.local_loo_loss(X, y, widths, degree, **kw)
        with monkeypatch.context() as patch:
            patch.setattr(engine, "fit_problem", _refuse)
            pooled = engine.local_loo_loss(X, y, widths, degree, **kw)
        dense = naive.local_loo_loss_exact(X, y, widths, "cu", [0, 3], degree)
        np.testing.assert_allclose(pooled, plain, rtol=1e-10)
        np.testing.assert_allclose(pooled, dense, rtol=1e-8)


def _refuse(*args, **kwargs):
    raise AssertionError("the plain first pass ran on a tied table")
