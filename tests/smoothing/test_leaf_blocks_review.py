"""Review of ``tree_pool.leaf_blocks`` and ``tree_pool(..., leaves=)``: the
packed leaves and the values' scaling built once per call and shared by the cost
model's sample walk and the main walk.

* the public rtol paths (tree forced at small sizes) keep the contract of the module
  docstring of ``nbattn.kernels.tree_pool`` (within rtol / (1 - rtol) max |v - f| of
  exact) over dtypes, leave-one-out, output counts, value magnitudes and odd rtols, give
  the same bits on 1 and 2 threads and on repeated calls, and actually walk the tree;
* blocks of another tree over the same keys (same n, d and outputs), whose leaves are
  smaller than the tree walked, are refused: the walk's scratch buffer is sized by the
  blocks' ``leaf_max``, and they once overran it (heap corruption, an abort). Run in a
  subprocess, which such an abort would end.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

import nbattn
from nbattn.dispatch.device import kernels_for
from nbattn.smoothing import regression
from nbattn.smoothing.pruned import tree_layout

from .._config import config_values

ROOT = Path(__file__).resolve().parents[2]
_FORCE = {
    "TREE_LEAF_KEYS": 4,
    "TREE_MIN_KEYS": 1,
    "TREE_MAX_COST_SHARE": 10**9,
    "TREE_MAX_OVERHEAD_SHARE": 10**9,
}


@contextlib.contextmanager
def _tree_taken(monkeypatch):
    """The tree forced; yields a list that counts the walks ``pool_within_rtol`` returned."""
    walks = []
    real = regression.pool_within_rtol

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        walks.append(result is not None)
        return result

    monkeypatch.setattr(regression, "pool_within_rtol", spy)
    with config_values(**_FORCE):
        yield walks


def _problem(seed, n, d, n_outputs, scale):
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, d))
    values = rng.normal(size=(n, n_outputs)) * scale
    queries = keys[rng.integers(0, n, 25)] + 0.2 * rng.normal(size=(25, d))
    return queries, keys, values


def _assert_within_contract(got, exact, values, rtol, dtype):
    got = np.asarray(got, dtype=np.float64).reshape(exact.shape[0], -1)
    exact = np.asarray(exact, dtype=np.float64).reshape(exact.shape[0], -1)
    v = values.astype(dtype).astype(np.float64)
    spread = np.max(np.abs(v[None, :, :] - exact[:, None, :]), axis=1)
    slack = (1e-4 if dtype == np.float32 else 1e-10) * (np.abs(exact) + spread)
    with np.errstate(over="ignore"):
        bound = rtol / (1.0 - rtol) * spread + slack
    assert np.all(np.isfinite(got) == np.isfinite(exact))
    assert np.all(np.abs(got - exact) <= bound), np.max(np.abs(got - exact) / bound)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("exclude_self", [False, True])
@pytest.mark.parametrize("n_outputs", [1, 6])
def test_rtol_contract_over_odd_tolerances_and_value_scales(
    monkeypatch, dtype, exclude_self, n_outputs
):
    scales = [1.0, 1e30, 1e-30] + ([1e300, 1e-300, 1e-310] if dtype == np.float64 else [])
    with _tree_taken(monkeypatch) as walks:
        for i, scale in enumerate(scales):
            queries, keys, values = _problem(i, 150, 2, n_outputs, scale)
            if exclude_self:
                queries = keys
            args = (queries, keys, values, 0.3)
            exact = nbattn.nadaraya_watson(*args, dtype=dtype, exclude_self=exclude_self)
            for rtol in (1e-300, 1e-6, 0.5, 0.999):
                got = nbattn.nadaraya_watson(
                    *args, dtype=dtype, exclude_self=exclude_self, rtol=rtol
                )
                _assert_within_contract(got, exact, values, rtol, dtype)
    assert walks and all(walks)  # the tree was walked, not the exact fallback


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_same_bits_on_one_and_two_threads_and_repeated_calls(monkeypatch, dtype):
    queries, keys, values = _problem(7, 400, 3, 2, 1.0)
    saved = numba.get_num_threads()
    results = []
    try:
        with _tree_taken(monkeypatch) as walks:
            for threads in (1, 2, 2, 1):
                numba.set_num_threads(threads)
                for loo in (False, True):
                    q = keys if loo else queries
                    results.append(
                        nbattn.nadaraya_watson(
                            q, keys, values, 0.25, dtype=dtype, exclude_self=loo, rtol=1e-3
                        )
                    )
    finally:
        numba.set_num_threads(saved)
    assert all(walks)
    for k in range(2, len(results)):
        np.testing.assert_array_equal(results[k], results[k % 2])


def test_estimators_with_rtol_walk_the_tree_within_contract(monkeypatch):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 2))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2
    with _tree_taken(monkeypatch) as walks:
        exact = nbattn.NadarayaWatsonRegressor(bandwidth=[0.3, 0.3]).fit(X, y).predict(X)
        for rtol in (1e-6, 0.5):
            model = nbattn.NadarayaWatsonRegressor(bandwidth=[0.3, 0.3], rtol=rtol)
            got = model.fit(X, y).predict(X)
            _assert_within_contract(got, exact, y[:, None], rtol, np.float64)
    assert walks and all(walks)


def test_one_key_and_one_key_left_out():
    with config_values(**_FORCE):
        for rtol in (1e-300, 0.5, 0.999):
            got = nbattn.nadaraya_watson(np.zeros((3, 2)), np.ones((1, 2)), [4.0], 0.5, rtol=rtol)
            np.testing.assert_array_equal(got, 4.0)
            loo = nbattn.nadaraya_watson(
                np.ones((1, 2)), np.ones((1, 2)), [4.0], 0.5, exclude_self=True, rtol=rtol
            )
            np.testing.assert_array_equal(loo, 0.0)  # no admissible key: zeros (documented)
            with pytest.raises(ValueError, match="empty"):
                nbattn.nadaraya_watson(np.zeros((3, 2)), np.zeros((0, 2)), [], 0.5, rtol=rtol)


def test_shared_blocks_over_a_single_leaf_and_many_outputs():
    """leaf_blocks of a one-key tree and of a tree with 40 outputs: the walk given them
    returns the bits of the walk that builds them."""
    tree = kernels_for("tree_pool", "cpu")
    for n, n_outputs in ((1, 1), (1, 3), (50, 40)):
        queries, keys, values = _problem(n, n, 3, n_outputs, 1e-300)
        with config_values(**_FORCE):
            q, k_t, v_t, _ = regression._layout(queries, keys, values, 0.3, np.float64)
            k_t, v_t, nodes, own = tree_layout(k_t, v_t, False, q.shape[0])
            rows = np.arange(q.shape[0])
            shared = tree.leaf_blocks(k_t, v_t, *nodes[:3])
            coarse = tree.coarse_for(0.01, q.dtype)
            a = tree.tree_pool(q, k_t, v_t, *nodes, own, 0.01, rows, 4, coarse)
            b = tree.tree_pool(q, k_t, v_t, *nodes, own, 0.01, rows, 4, coarse, None, 1.0, shared)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


_FOREIGN_BLOCKS = textwrap.dedent(
    """
    import numpy as np
    from nbattn import config
    from nbattn.dispatch.device import kernels_for
    from nbattn.smoothing import regression
    from nbattn.smoothing.pruned import tree_layout

    config.TREE_LEAF_KEYS = 4
    rng = np.random.default_rng(0)
    keys, values = rng.normal(size=(400, 3)), rng.normal(size=(400, 2))
    q, k_t, v_t, _ = regression._layout(rng.normal(size=(20, 3)), keys, values, 0.3, np.float64)
    k_t, v_t, nodes4, own = tree_layout(k_t, v_t, False, q.shape[0])
    tree = kernels_for("tree_pool", "cpu")
    nodes64 = tree.kd_nodes(k_t, 64)        # the same keys, leaves of up to 64 keys
    fine = tree.leaf_blocks(k_t, v_t, *nodes4[:3])   # blocks of the tree of 4-key leaves
    rows = np.arange(q.shape[0])
    try:
        tree.tree_pool(q, k_t, v_t, *nodes64, own, 1e-6, rows, 4, None, None, 1.0, fine)
    except ValueError:
        print("refused")
    else:
        print("accepted")
    """
)


def test_blocks_of_another_tree_over_the_same_keys_are_refused():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run(
        [sys.executable, "-c", _FOREIGN_BLOCKS],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0 and "refused" in run.stdout, (run.returncode, run.stderr[-300:])
