"""The 1-D LOO kernels' bits do not depend on where their arrays lie (tests/_vector_order.py)."""

import numpy as np
import pytest

from nbattn.kernels import loo_1d
from tests._vector_order import (
    address_dependent_sums,
    adjacent_after,
    fresh_ir,
    guarded_float_sums,
)


def _window_sums_at_every_start(adjacent, dtype, n, p, seed):
    rng = np.random.default_rng(seed)
    z = np.sort(rng.normal(size=n) * rng.uniform(0.1, 3.0)).astype(dtype)
    v = rng.normal(size=(p, n)).astype(dtype)
    rows = []
    for start in range(0, n - 1):
        if adjacent:  # the scratch right after the keys: the runtime check's worst case
            zs, weights = adjacent_after(z, (loo_1d._KEY_BLOCK,))
        else:
            zs, weights = z.copy(), np.empty(loo_1d._KEY_BLOCK, dtype=dtype)
        acc = np.zeros(p)
        total = loo_1d._window_sums(zs, v, float(z[n // 2]), 0.0, start, n, acc, weights)
        rows.append((total, *acc))
    return np.array(rows)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(3))
def test_window_sums_with_the_scratch_right_after_the_keys(dtype, seed):
    n, p = 200 + 37 * seed, 1 + seed
    near = _window_sums_at_every_start(True, dtype, n, p, seed)
    apart = _window_sums_at_every_start(False, dtype, n, p, seed)
    assert np.array_equal(near, apart)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_sum_in_a_loop_behind_a_runtime_alias_check(dtype):
    rng = np.random.default_rng(0)
    zs = np.sort(rng.normal(size=64)).astype(dtype)
    v = np.ones((2, 64), dtype=dtype)
    ir = fresh_ir(loo_1d._window_sums, zs, v, 0.1, 0.0, 0, 64, np.zeros(2), np.empty(256, dtype))
    assert guarded_float_sums(ir) == []  # no guarded sum at all here


def test_the_scan_and_the_placement_find_a_sum_behind_a_runtime_alias_check():
    """Neither tool is vacuous: the loop the kernels avoid is found by the scan, and its
    sums change with the placement of its arrays."""
    from numba import njit

    from nbattn import config

    @njit(fastmath=config.FASTMATH)
    def store_and_sum(x, out):
        total = 0.0
        for j in range(x.shape[0]):
            w = x[j] * 2.0
            out[j] = w
            total += w
        return total

    rng = np.random.default_rng(0)
    store_and_sum(np.ones(64), np.empty(64))
    ir = "\n".join(store_and_sum.inspect_llvm().values())
    assert len(address_dependent_sums(ir)) >= 1
    changed = 0
    for _ in range(20):  # 24 keys: shorter than one vector step of the check
        x = rng.normal(size=24) * 10.0 ** rng.uniform(-3, 3, size=24)
        near, out = adjacent_after(x, (24,))
        changed += store_and_sum(near, out) != store_and_sum(x.copy(), np.empty(24))
    assert changed > 0
