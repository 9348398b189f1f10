"""Review of the pruned GPU passes (``BlockRuns``): edge cases against the CPU and the
exact pass, and the layout's cache of its runs (``TreeLayout.leaves_on``).

Simulator only, 8 threads per block (``conftest.py``), leaves of 4 keys at any size.
"""

import dataclasses
import os

import numpy as np
import pytest

from nbattn import config
from nbattn._core.local_groups import BlockRuns, LocalLeaves
from nbattn.local.engine import fit_layout, fit_problem
from nbattn.local.leaves import tree_layout
from nbattn.local.problem import prepare

from .._config import config_values

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

_FORCE = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}


def _clustered(seed, n, n_q, lam=0.2):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-6, 6, (4, 2))
    cont = centres[rng.integers(0, 4, n)] + 0.3 * rng.normal(size=(n, 2))
    keys = np.column_stack([cont, rng.integers(0, 3, n)]).astype(float)
    queries = keys[rng.integers(0, n, n_q)].copy()
    queries[:, :2] += 0.2 * rng.normal(size=(n_q, 2))
    y = np.sin(2.0 * cont[:, 0]) + 0.1 * rng.normal(size=n) + 3.0
    return queries, keys, y, np.array([0.3, 0.3, lam * 2 / 3])


def _lse(fit):
    return fit.shift + fit.log_norm


@pytest.mark.parametrize(
    "case",
    ["partial_block", "far_compact", "zero_weights", "outputs_split", "code_absent"],
)
def test_pruned_gpu_edge_cases_within_the_bound(case):
    """Each case against the exact CPU pass: the same fallback rows (nearest key and
    value), every normaliser within log1p(-rtol), every fit within the contract's bound
    (||g||_1 <= a few here; a loose residual bound)."""
    rtol = 1e-3
    queries, keys, y, widths = _clustered(7, 70, 13)  # 13 queries: a partial block of 8
    kw = dict(var_type="ccu")
    values = y
    if case == "far_compact":  # every other query beyond the support: no run, fallback
        queries[::2, :2] += 50.0
        kw["kernel"] = "epanechnikov"
    elif case == "zero_weights":
        weights = np.random.default_rng(1).uniform(size=70)
        weights[::3] = 0.0
        kw["sample_weight"] = weights / weights.sum() * 1e-9
    elif case == "outputs_split":
        values = np.column_stack([y, -2.0 * y, y**2])
    elif case == "code_absent":  # l = 0 and a code no key has: every key weighs 0
        widths[2] = 0.0
        queries[::2, 2] = 3
        kw["n_categories"] = [0, 0, 4]
    with config_values(**_FORCE, CUDA_MAX_OUTPUTS=2):
        problem = prepare(queries, keys, values, widths, 1, rtol=rtol, device="cuda", **kw)
        assert isinstance(tree_layout(problem).leaves, LocalLeaves)
        pruned = fit_problem(problem)
        again = fit_problem(problem)
        exact_spec = dataclasses.replace(problem.spec, rtol=0.0, device="cpu")
        exact = fit_problem(dataclasses.replace(problem, spec=exact_spec))
    for a, b in zip(pruned, again):
        np.testing.assert_array_equal(a, b)
    fell_back = exact.log_norm == -np.inf
    np.testing.assert_array_equal(pruned.log_norm == -np.inf, fell_back)
    np.testing.assert_array_equal(pruned.nearest[fell_back], exact.nearest[fell_back])
    np.testing.assert_array_equal(pruned.beta[fell_back, 0], exact.beta[fell_back, 0])
    reached = ~fell_back
    lse, lse_exact = _lse(pruned)[reached], _lse(exact)[reached]
    slack = 1e-12 * (1 + np.abs(lse_exact))
    assert np.all(lse <= lse_exact + slack)
    assert np.all(lse >= lse_exact + np.log1p(-rtol) - slack)
    residual = np.abs(problem.values_t).max() + np.abs(exact.beta[:, 0, :]).max()
    allowed = 2 * rtol / (1 - rtol) * np.abs(pruned.g).sum(axis=1) * residual
    diff = np.abs(pruned.beta[:, 0, :] - exact.beta[:, 0, :]).max(axis=1)
    assert np.all(diff[reached] <= allowed[reached] + 1e-9)


def test_layout_with_new_leaves_does_not_reuse_stale_runs():
    """A layout whose leaves change (``dataclasses.replace`` copies the cached runs) builds
    its blocks' runs again from the new leaves, as the CPU reads them."""
    queries, keys, y, _ = _clustered(43, 120, 40)
    widths = np.array([2.0, 2.0, 0.3])  # wide: rtol = 0.9 drops real weight
    with config_values(**_FORCE):
        problem = prepare(queries, keys, y, widths, 1, var_type="ccu", rtol=0.9, device="cuda")
        tree = tree_layout(problem)
        loose = tree.leaves_on("cuda")
        strict = dataclasses.replace(tree, leaves=tree.leaves._replace(rtol=1e-12))
        fresh = dataclasses.replace(strict, block_runs=None)
        fit_stale, fit_fresh = fit_layout(strict), fit_layout(fresh)
    assert isinstance(loose, BlockRuns) and config.CUDA_THREADS_PER_BLOCK == loose.block_size
    assert strict.leaves_on("cuda").rtol == strict.leaves.rtol
    np.testing.assert_allclose(_lse(fit_stale), _lse(fit_fresh), rtol=1e-12)
