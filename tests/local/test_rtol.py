"""local_polynomial(..., rtol=) and the LOO search with rtol: the pruned passes within their bound.

The contract (``nbattn.kernels.local_leaves``, ``nbattn.local.leaves``): each query's
normaliser l loses at most rtol * l, so log l lies in [log l_exact + log(1 - rtol),
log l_exact], and the fit moves by at most 2 rtol / (1 - rtol) ||g||_1 max_j |y_j - x_j . beta|
(g the pruned equivalent-kernel vector, beta the exact coefficients) wherever both
solves keep the same terms (a design at the edge of its rank may drop another term
under any perturbation: the truncated solve jumps there). The properties
force the leaves at small sizes (leaves of 4 keys, any number of keys) and compare the
pruned pass with the exact one (rtol = 0: every key, the kernels' own exact path, itself
checked against statsmodels and the naive references in ``test_local.py``).
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn._core.local_groups import AllKeys
from nbattn.estimators import LocalPolynomialRegressor
from nbattn.local.engine import fit_problem, local_loo_loss, local_polynomial
from nbattn.local.leaves import tree_layout, uses_tree
from nbattn.local.problem import prepare
from nbattn.local.widths import local_loo_loss_and_grad, local_loo_widths
from tests.strategies import seeds

from .._config import config_values

KINDS = ["uniform", "clustered", "duplicates", "far", "huge", "tiny"]
_FORCE = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}


@pytest.fixture
def leaves_always():
    with config_values(**_FORCE):
        yield


def _table(kind, seed, n, n_queries, dc, cats):
    """(queries, keys, y, var_type, widths) of a mixed table of ``kind``."""
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.uniform(-5, 5, (4, dc))
        cont = centres[rng.integers(0, 4, n)] + 0.2 * rng.normal(size=(n, dc))
    elif kind == "duplicates":
        cont = rng.normal(size=(3, dc))[rng.integers(0, 3, n)]
    else:
        cont = rng.uniform(-2, 2, (n, dc))
    codes = [rng.integers(0, c, n) for c, _ in cats]
    keys = np.column_stack([cont, *codes]) if cats else cont
    pick = rng.integers(0, n, n_queries)
    queries = keys[pick].copy()
    queries[:, :dc] += 0.3 * rng.normal(size=(n_queries, dc))
    if kind == "far":  # half the queries thousands of widths from every key
        queries[::2, :dc] += 1e4
    scale = {"huge": 1e300, "tiny": 1e-300}.get(kind, 1.0)
    queries[:, :dc] *= scale
    keys = keys.astype(float)
    keys[:, :dc] *= scale
    y = np.sin(cont[:, 0] * 2.0) + 0.1 * rng.normal(size=n) + 3.0
    var_type = "c" * dc + "".join(kind_ for _, kind_ in cats)
    # each categorical smoothing a share of its largest (exact matching at 0)
    tops = [(c - 1) / c if kind_ == "u" else 1.0 for c, kind_ in cats]
    widths = [0.4 * scale] * dc + [float(rng.choice([0.0, 0.1, 0.9])) * t for t in tops]
    return queries, keys, y, var_type, np.array(widths)


def _design(problem, i, degree):
    """(n_keys, p) the local design x_j of query i, in the kernels' term order."""
    d = (problem.keys_cont_t - problem.q_cont[i][:, None]).T
    columns = [np.ones(d.shape[0])]
    if degree >= 1:
        columns += [d[:, c] for c in range(d.shape[1])]
    if degree >= 2:
        columns += [d[:, c] * d[:, c2] for c in range(d.shape[1]) for c2 in range(c, d.shape[1])]
    return np.column_stack(columns)


def _check_within_bound(problem, rtol):
    exact = fit_problem(dataclasses.replace(problem, spec=_with_rtol(problem.spec, 0.0)))
    pruned = fit_problem(problem)
    again = fit_problem(problem)
    for a, b in zip(pruned, again):  # repeatable to the bit
        np.testing.assert_array_equal(a, b)
    fell_back = exact.log_norm == -np.inf
    np.testing.assert_array_equal(pruned.log_norm == -np.inf, fell_back)
    y = problem.values_t[0]
    for i in np.flatnonzero(~fell_back):
        lse_exact = exact.shift[i] + exact.log_norm[i]
        lse = pruned.shift[i] + pruned.log_norm[i]
        slack = 1e-12 * (1.0 + abs(lse_exact))
        assert lse <= lse_exact + slack
        assert lse >= lse_exact + np.log1p(-rtol) - slack
        if not np.array_equal(exact.g[i] == 0, pruned.g[i] == 0):
            # the truncated solve kept other terms (a design at its rank's edge: the
            # contract's bound is for the same terms; any perturbation can flip a pivot)
            continue
        x = _design(problem, i, problem.degree)
        residual = np.abs(y - x @ exact.beta[i, :, 0]).max()
        allowed = 2.0 * rtol / (1.0 - rtol) * np.abs(pruned.g[i]).sum() * residual
        diff = abs(pruned.beta[i, 0, 0] - exact.beta[i, 0, 0])
        assert diff <= allowed + 1e-9 * (1.0 + abs(exact.beta[i, 0, 0])), (i, diff, allowed)
    for i in np.flatnonzero(fell_back):  # the nearest key: any of the tied nearest ones
        a, b = exact.nearest[i], pruned.nearest[i]
        if a < 0:  # no admissible key at all
            assert b < 0
            continue
        d_a = np.sum((problem.keys_cont_t[:, a] - problem.q_cont[i]) ** 2)
        d_b = np.sum((problem.keys_cont_t[:, b] - problem.q_cont[i]) ** 2)
        mis_a = np.sum(problem.keys_cat_t[:, a] != problem.q_cat[i])
        mis_b = np.sum(problem.keys_cat_t[:, b] != problem.q_cat[i])
        assert (mis_b, d_b) == (mis_a, d_a)
        assert pruned.beta[i, 0, 0] == y[b]


def _with_rtol(spec, rtol):
    return dataclasses.replace(spec, rtol=rtol)


@settings(max_examples=80)
@given(
    kind=st.sampled_from(KINDS),
    seed=seeds,
    n=st.integers(1, 160),
    n_queries=st.integers(1, 30),
    dc=st.integers(1, 3),
    cats=st.lists(st.tuples(st.integers(2, 4), st.sampled_from("uo")), max_size=2),
    degree=st.integers(0, 2),
    kernel=st.sampled_from(["gaussian", "epanechnikov", "tricube"]),
    rtol=st.sampled_from([1e-8, 1e-4, 1e-2, 0.3]),
    exclude_self=st.booleans(),
    weighted=st.sampled_from([None, "mixed", "tiny"]),
)
def test_pruned_fit_within_bound(
    kind, seed, n, n_queries, dc, cats, degree, kernel, rtol, exclude_self, weighted
):
    queries, keys, y, var_type, widths = _table(kind, seed, n, n_queries, dc, cats)
    if exclude_self:
        queries = keys
    rng = np.random.default_rng(seed + 1)
    weights = None
    if weighted == "mixed":  # some keys left out (weight 0), the others of all sizes
        weights = rng.choice([0.0, 1e-9, 1.0, 7.0], size=n)
        weights[0] = 1.0
    elif weighted == "tiny":  # weights summing to 1e-9
        weights = rng.uniform(size=n)
        weights *= 1e-9 / weights.sum()
    with config_values(**_FORCE):
        problem = prepare(
            queries,
            keys,
            y,
            widths,
            degree,
            var_type=var_type,
            n_categories=[0] * dc + [c for c, _ in cats],
            kernel=kernel,
            sample_weight=weights,
            exclude_self=exclude_self,
            rtol=rtol,
        )
        assert uses_tree(problem)
        _check_within_bound(problem, rtol)


def test_leaves_are_a_permutation(leaves_always):
    """The layout holds every key once, its leaves cover them, each box holds its keys."""
    queries, keys, y, var_type, widths = _table("clustered", 3, 300, 20, 2, [(3, "u")])
    problem = prepare(queries, keys, y, widths, 1, var_type=var_type, rtol=1e-6)
    tree = tree_layout(problem)
    assert sorted(tree.key_order.tolist()) == list(range(300))
    start = tree.leaves.leaf_start
    assert start[0] == 0 and start[-1] == 300 and np.all(np.diff(start) > 0)
    for leaf in range(start.shape[0] - 1):
        part = tree.problem.keys_cont_t[:, start[leaf] : start[leaf + 1]]
        assert np.all(part.min(axis=1) == tree.leaves.box_lo[leaf])
        assert np.all(part.max(axis=1) == tree.leaves.box_hi[leaf])
    np.testing.assert_array_equal(tree.problem.values_t[0], y[tree.key_order])


def test_exact_path_unchanged_at_rtol_zero():
    """rtol = 0 runs the exact kernels on the problem as it is (no order, every key)."""
    queries, keys, y, var_type, widths = _table("uniform", 5, 3000, 50, 2, [(3, "o")])
    problem = prepare(queries, keys, y, widths, 1, var_type=var_type)
    tree = tree_layout(problem)
    assert tree.key_order is None and isinstance(tree.leaves, AllKeys)


def test_pruning_skips_keys_and_agrees(leaves_always):
    """On clustered data at narrow widths most leaves are dropped, and the answers agree."""
    queries, keys, y, var_type, widths = _table("clustered", 11, 4000, 200, 2, [(4, "u")])
    widths[:2] = 0.05
    widths[2] = 0.0  # exact matching: a leaf of other codes weighs exactly 0
    exact = local_polynomial(queries, keys, y, widths, 1, var_type=var_type)
    pruned = local_polynomial(queries, keys, y, widths, 1, var_type=var_type, rtol=1e-6)
    np.testing.assert_allclose(pruned, exact, rtol=1e-6, atol=1e-6)
    problem = prepare(queries, keys, y, widths, 1, var_type=var_type, rtol=1e-6)
    tree = tree_layout(problem)
    from nbattn.kernels.local_leaves import kept_runs

    data, model = tree.problem.kernel_groups()
    n_leaves = tree.leaves.leaf_start.shape[0] - 1
    upper, lower = np.zeros(n_leaves), np.zeros(n_leaves)
    runs = np.zeros((n_leaves, 2), dtype=np.int64)
    visited = []
    starts = tree.leaves.query_start
    for i0, i1 in zip(starts[:-1], starts[1:]):
        n_runs = kept_runs(i0, i1, data, model, tree.leaves, upper, lower, runs)
        visited.append(sum(runs[r, 1] - runs[r, 0] for r in range(n_runs)))
    assert np.mean(visited) < 0.2 * 4000


def test_cost_model_keeps_the_exact_path_where_nothing_prunes():
    """Wide widths: every chunk would visit every leaf, so the exact passes run (in the
    caller's order, to the bit); narrow ones on clustered data take the leaves."""
    queries, keys, y, var_type, widths = _table("clustered", 4, 3000, 300, 2, [(3, "u")])
    with config_values(LOCAL_LEAF_KEYS=16, LOCAL_TREE_MIN_KEYS=1):
        wide = widths.copy()
        wide[:2] = 50.0
        wide[2] = 2.0 / 3.0  # every category weighs the same
        problem = prepare(queries, keys, y, wide, 1, var_type=var_type, rtol=1e-6)
        assert tree_layout(problem).key_order is None
        exact = local_polynomial(queries, keys, y, wide, 1, var_type=var_type)
        np.testing.assert_array_equal(
            local_polynomial(queries, keys, y, wide, 1, var_type=var_type, rtol=1e-6), exact
        )
        narrow = widths.copy()
        narrow[:2] = 0.02
        problem = prepare(queries, keys, y, narrow, 1, var_type=var_type, rtol=1e-6)
        assert tree_layout(problem).key_order is not None


@pytest.mark.parametrize("degree", [0, 1])
def test_loo_loss_and_gradient_with_rtol(leaves_always, degree):
    """The pruned criterion and its gradient are close to the exact ones at a small rtol,
    and repeatable to the bit."""
    _, X, y, var_type, widths = _table("clustered", 2, 400, 1, 2, [(3, "u"), (4, "o")])
    theta = np.array([np.log(0.3), np.log(0.5), -1.0, -2.0])
    exact = local_loo_loss_and_grad(X, y, theta, degree, var_type=var_type)
    pruned = local_loo_loss_and_grad(X, y, theta, degree, var_type=var_type, rtol=1e-10)
    again = local_loo_loss_and_grad(X, y, theta, degree, var_type=var_type, rtol=1e-10)
    assert pruned[0] == again[0] and np.array_equal(pruned[1], again[1])
    assert abs(pruned[0] - exact[0]) <= 1e-7 * exact[0]
    np.testing.assert_allclose(pruned[1], exact[1], rtol=1e-5, atol=1e-9 * np.abs(exact[1]).max())
    loss = local_loo_loss(X, y, [0.3, 0.5, 0.2, 0.1], degree, var_type=var_type, rtol=1e-10)
    loss_exact = local_loo_loss(X, y, [0.3, 0.5, 0.2, 0.1], degree, var_type=var_type)
    assert abs(loss - loss_exact) <= 1e-7 * loss_exact


@pytest.mark.parametrize("seed", range(4))
def test_search_with_rtol_never_worse_than_the_rule(leaves_always, seed):
    """The search on the pruned criterion, judged by the exact one: never worse than the
    rule widths, and the same widths from two identical calls."""
    _, X, y, var_type, _ = _table(
        ["clustered", "uniform", "duplicates", "far"][seed], seed, 300, 1, 2, [(3, "u")]
    )
    widths = local_loo_widths(X, y, 1, var_type=var_type, rtol=1e-3, maxiter=20)
    again = local_loo_widths(X, y, 1, var_type=var_type, rtol=1e-3, maxiter=20)
    np.testing.assert_array_equal(widths, again)
    found = local_loo_loss(X, y, widths, 1, var_type=var_type)
    rule = local_loo_loss(X, y, "scott", 1, var_type=var_type)
    assert found <= rule


def test_estimator_rtol_round_trip(tmp_path, leaves_always):
    """The estimator's rtol reaches the search and the predictions, and its model file."""
    from nbattn import load, save

    queries, X, y, var_type, _ = _table("clustered", 9, 300, 40, 2, [(3, "u")])
    model = LocalPolynomialRegressor(var_type=var_type, rtol=1e-6, bandwidth="scott").fit(X, y)
    exact = LocalPolynomialRegressor(var_type=var_type, bandwidth="scott").fit(X, y)
    np.testing.assert_allclose(model.predict(queries), exact.predict(queries), atol=1e-5)
    path = tmp_path / "model.nbattn"
    save(model, path)
    loaded = load(path)
    assert loaded.get_params()["rtol"] == 1e-6
    np.testing.assert_array_equal(loaded.predict(queries), model.predict(queries))


@pytest.mark.parametrize("bad", [-1e-3, 1.0, float("nan"), float("inf"), "1e-6", True])
def test_bad_rtol_is_refused(bad):
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match="rtol"):
        local_polynomial(X, X, X[:, 0], rtol=bad)
    with pytest.raises(ValueError, match="rtol"):
        LocalPolynomialRegressor(rtol=bad).fit(X, X[:, 0])


def test_rtol_on_auto_stays_on_the_cpu():
    """With rtol > 0 "auto" runs on the CPU (the pruned GPU passes run where "cuda" is
    asked for: ``tests/cuda/test_local_pruned.py``)."""
    X = np.random.default_rng(0).normal(size=(20, 2))
    problem = prepare(X, X, X[:, 0], "scott", 1, rtol=1e-6, device="auto")
    assert problem.spec.device == "cpu"


def test_gradient_path_settles_fallback_ties_as_the_exact_path(leaves_always):
    """Keys on a grid, a compact kernel narrower than the spacing: every leave-one-out fit
    falls back to a nearest key, with ties; the criterion from the gradient path is the
    exact one, as the value path's is."""
    X = np.repeat(np.arange(30.0), 1)[:, None]
    y = np.sin(np.arange(30.0)) * 3.0
    theta = np.array([np.log(0.5)])
    exact = local_loo_loss_and_grad(X, y, theta, 1, kernel="epanechnikov")[0]
    pruned = local_loo_loss_and_grad(X, y, theta, 1, kernel="epanechnikov", rtol=1e-6)[0]
    value = local_loo_loss(X, y, [0.5], 1, kernel="epanechnikov", rtol=1e-6)
    assert pruned == exact == value


def test_predict_checks_rtol_set_after_fit():
    X = np.random.default_rng(0).normal(size=(30, 2))
    model = LocalPolynomialRegressor(bandwidth="scott").fit(X, X[:, 0])
    for bad in (2.0, -1.0, "abc"):
        model.set_params(rtol=bad)
        with pytest.raises(ValueError, match="rtol"):
            model.predict(X)
