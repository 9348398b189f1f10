"""The pruned local passes on the GPU (simulator): each block of queries visits the key runs
that the CPU's rule keeps for it (``BlockRuns``, ``nbattn.local.leaves.TreeLayout.leaves_on``).

Two checks: against the CPU twin run on the same pruned key sets (the CPU's chunks cut at
the GPU's block boundaries: the same kept keys, so the same sums to rounding), and
against the exact pass (every key) within the rtol contract of ``tests/local/test_rtol.py``.
Leaves of 4 keys at any size (as there), 8 threads per block (``conftest.py``).
"""

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn._core.local_groups import AllKeys, BlockRuns, LocalLeaves
from nbattn.cuda import local as cuda_local
from nbattn.kernels import local as cpu_local
from nbattn.local.engine import fit_problem, local_polynomial
from nbattn.local.leaves import tree_layout
from nbattn.local.problem import prepare
from nbattn.local.widths import local_loo_loss_and_grad, widths_to_theta

from .. import naive
from .._config import config_values
from ..strategies import seeds
from .test_local import assert_fits_equal

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

_FORCE = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}


def _clustered(seed, n, dc, n_codes, exclude_self):
    """(queries, keys, y, var_type, widths): clusters far apart relative to the widths,
    one categorical column (l = 0 or smoothed), so that whole leaves are dropped."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-6, 6, (4, dc))
    cont = centres[rng.integers(0, 4, n)] + 0.3 * rng.normal(size=(n, dc))
    keys = np.column_stack([cont, rng.integers(0, n_codes, n)]).astype(float)
    queries = keys if exclude_self else keys[rng.integers(0, n, n // 2)] + 0.0
    if not exclude_self:
        queries[:, :dc] += 0.2 * rng.normal(size=(queries.shape[0], dc))
    y = np.sin(2.0 * cont[:, 0]) + 0.1 * rng.normal(size=n)
    lam = float(rng.choice([0.0, 0.2]))
    widths = np.array([0.3] * dc + [lam * (n_codes - 1) / n_codes])
    return queries, keys, y, "c" * dc + "u", widths


def _conditioned_rows(tree, queries, keys, var_type, widths, degree, exclude_self):
    """Which queries, in the layout's order, have a local design whose Jacobi-scaled
    condition number is below 1e6 (every key weighted as the exact fit weighs it)."""
    counts = [0 if kind == "c" else int(keys[:, c].max()) + 1 for c, kind in enumerate(var_type)]
    _, _, W = naive.local_polynomial_exact(
        queries, keys, np.zeros(keys.shape[0]), widths, var_type, counts, degree,
        exclude_self=exclude_self,
    )  # fmt: skip
    cond = naive.local_design_condition(queries, keys, W, var_type, degree)
    return tree.to_layout(W.any(axis=1) & (cond < 1e6))


def _cpu_leaves_of(tree, blocks: BlockRuns) -> LocalLeaves:
    """The CPU's leaves with its chunks at the GPU's block boundaries: the same kept keys."""
    n_q = tree.problem.q_cont.shape[0]
    starts = np.arange(0, n_q, blocks.block_size, dtype=np.int64)
    return tree.leaves._replace(query_start=np.append(starts, np.int64(n_q)))


@settings(max_examples=4, deadline=None)
@given(
    seed=seeds,
    n=st.integers(12, 40),
    dc=st.integers(1, 2),
    degree=st.integers(0, 2),
    exclude_self=st.booleans(),
    rtol=st.sampled_from([1e-8, 1e-3, 0.2]),
)
def test_block_runs_equal_the_cpu_on_the_same_keys(seed, n, dc, degree, exclude_self, rtol):
    queries, keys, y, var_type, widths = _clustered(seed, n, dc, 3, exclude_self)
    with config_values(**_FORCE):
        problem = prepare(
            queries, keys, y, widths, degree, var_type=var_type, exclude_self=exclude_self,
            rtol=rtol, device="cuda",
        )  # fmt: skip
        tree = tree_layout(problem)
    assert isinstance(tree.leaves, LocalLeaves)
    blocks = tree.leaves_on("cuda")
    assert isinstance(blocks, BlockRuns) and blocks is tree.leaves_on("cuda")  # built once
    assert tree.leaves_on("cpu") is tree.leaves
    ordered = tree.problem
    groups = ordered.kernel_groups()
    cpu_leaves = _cpu_leaves_of(tree, blocks)
    cpu = cpu_local.local_fit(*groups, ordered.values_t, False, cpu_leaves)
    gpu = cuda_local.local_fit(*groups, ordered.values_t, False, blocks)
    # the exact twins agree to rounding where the local design is well conditioned; a
    # design of few keys per term (n = 12 keys in four clusters under a quadratic in two
    # columns) amplifies the sums' rounding by its condition number (6e-5 seen at 1e9),
    # and one at the edge of its rank may keep other terms: there both must be finite
    well = _conditioned_rows(tree, queries, keys, var_type, widths, degree, exclude_self)
    if degree == 0:
        well[:] = True
    if well.any():
        rows = [type(fit)(*(part[well] for part in fit)) for fit in (gpu, cpu)]
        assert_fits_equal(*rows, fit_rtol=1e-9 if degree == 0 else 1e-7)
    assert np.isfinite(gpu[0]).all()
    if not exclude_self:
        return
    # the gradient pass over the same runs
    slopes = np.random.default_rng(seed).normal(size=(ordered.q_cont.shape[0], 1))
    dparams = np.tile([[-0.1, 0.4, 0.0]], (ordered.keys_cat_t.shape[0], 1))
    loo = ordered.kernel_groups(exclude_self=True)
    cpu_fit = cpu_local.local_fit(*loo, ordered.values_t, False, cpu_leaves)
    args = (cpu_fit, ordered.values_t, dparams, slopes)
    cpu_grad = cpu_local.local_loo_gradient(*loo, *args, cpu_leaves)
    gpu_grad = cuda_local.local_loo_gradient(*loo, *args, blocks)
    np.testing.assert_allclose(gpu_grad, cpu_grad, rtol=1e-8, atol=1e-12)


def test_the_blocks_skip_keys_and_cover_what_they_keep():
    """On clustered data at narrow widths the blocks visit a fraction of the keys; each
    block's runs are sorted, disjoint and inside [0, n_k)."""
    queries, keys, y, var_type, widths = _clustered(5, 120, 2, 3, True)
    widths[2] = 0.0
    with config_values(**_FORCE):
        problem = prepare(queries, keys, y, widths, 1, var_type=var_type, rtol=1e-6)
        tree = tree_layout(problem)
    blocks = tree.leaves_on("cuda")
    n_k = keys.shape[0]
    visited = 0
    for lo, hi in blocks.block_runs:
        runs = blocks.runs[lo:hi]
        assert np.all(runs[:, 0] < runs[:, 1]) and runs.min() >= 0 and runs.max() <= n_k
        assert np.all(runs[1:, 0] > runs[:-1, 1])  # neighbouring kept leaves merge
        visited += int((runs[:, 1] - runs[:, 0]).sum())
    assert visited < 0.5 * blocks.block_runs.shape[0] * n_k


def test_pruned_gpu_fit_within_the_bound_of_the_exact_one():
    """local_polynomial(device="cuda", rtol=) against the exact CPU pass: each normaliser
    within rtol of itself, each fit within the contract's bound (as tests/local/test_rtol.py
    checks the CPU's pruned pass)."""
    rtol = 1e-3
    queries, keys, y, var_type, widths = _clustered(9, 60, 2, 3, False)
    with config_values(**_FORCE):
        problem = prepare(queries, keys, y, widths, 1, var_type=var_type, rtol=rtol, device="cuda")
        pruned = fit_problem(problem)
        again = fit_problem(problem)
    exact_spec = dataclasses.replace(problem.spec, rtol=0.0, device="cpu")
    exact = fit_problem(dataclasses.replace(problem, spec=exact_spec))
    for a, b in zip(pruned, again):  # repeatable to the bit
        np.testing.assert_array_equal(a, b)
    reached = exact.log_norm > -np.inf
    lse_exact = (exact.shift + exact.log_norm)[reached]
    lse = (pruned.shift + pruned.log_norm)[reached]
    assert np.all(lse <= lse_exact + 1e-12 * (1 + np.abs(lse_exact)))
    assert np.all(lse >= lse_exact + np.log1p(-rtol) - 1e-12 * (1 + np.abs(lse_exact)))
    same_terms = np.all((exact.g == 0) == (pruned.g == 0), axis=1) & reached
    residual = np.abs(y).max() + np.abs(exact.beta[:, 0, 0]).max()  # >= max |y_j - x_j beta|
    allowed = 2 * rtol / (1 - rtol) * np.abs(pruned.g).sum(axis=1) * residual * 10
    diff = np.abs(pruned.beta[:, 0, 0] - exact.beta[:, 0, 0])
    assert np.all(diff[same_terms] <= allowed[same_terms] + 1e-9)
    # the public function on the GPU equals the engine's pruned fit it runs
    with config_values(**_FORCE):
        public = local_polynomial(
            queries, keys, y, widths, 1, var_type=var_type, rtol=rtol, device="cuda"
        )
    np.testing.assert_array_equal(public, pruned.beta[:, 0, 0])


def test_pruned_loo_criterion_on_the_gpu_matches_the_cpu():
    """The leave-one-out criterion and its gradient with rtol on the GPU: within the
    pruning's reach of the CPU's (different chunks drop different leaves, each within rtol)."""
    X, _, y, var_type, widths = _clustered(13, 40, 2, 3, True)
    theta = widths_to_theta(widths, var_type, (0, 0, 3))
    with config_values(**_FORCE):
        gpu = local_loo_loss_and_grad(X, y, theta, 1, var_type=var_type, rtol=1e-9, device="cuda")
        cpu = local_loo_loss_and_grad(X, y, theta, 1, var_type=var_type, rtol=1e-9, device="cpu")
        exact = local_loo_loss_and_grad(X, y, theta, 1, var_type=var_type)
    np.testing.assert_allclose(gpu[0], exact[0], rtol=1e-6)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-6)
    np.testing.assert_allclose(gpu[1], exact[1], rtol=1e-5, atol=1e-8)


def test_every_key_path_takes_one_run():
    """Without pruning (None, AllKeys) every block walks the single run [0, n_k) (a
    ``LocalLeaves`` handed over as it is: ``test_local.py``)."""
    from nbattn.cuda.local_args import key_runs

    threads, (table, runs) = key_runs(None, 37, 11)
    table, runs = table.copy_to_host(), runs.copy_to_host()
    assert table.shape[0] == -(-37 // threads) and np.all(table == [0, 1])
    np.testing.assert_array_equal(runs, [[0, 11]])
    assert key_runs(AllKeys(np.array([0, 37])), 37, 11)[0] == threads
