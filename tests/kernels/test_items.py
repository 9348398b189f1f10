"""The work-item runner and the leaf order of the pruned local passes."""

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numba import njit

from nbattn.kernels.items import next_item, run_items
from nbattn.kernels.local_leaves import ascending_order


@njit(nogil=True, cache=True)
def _square_items(counter, values, out, seen):
    while True:
        item = next_item(counter)
        if item >= values.shape[0]:
            return
        out[item] = values[item] * values[item]
        seen[item] += 1


def test_every_item_runs_once_on_any_thread_count():
    values = np.arange(1000, dtype=np.float64)
    for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
        out, seen = np.zeros_like(values), np.zeros(values.shape, dtype=np.int64)
        with_threads = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            run_items(_square_items, values, out, seen)
        finally:
            numba.set_num_threads(with_threads)
        np.testing.assert_array_equal(out, values * values)
        np.testing.assert_array_equal(seen, 1)


def test_no_items_is_no_work():
    out, seen = np.zeros(0), np.zeros(0, dtype=np.int64)
    run_items(_square_items, np.zeros(0), out, seen)
    assert out.shape == (0,)


_floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(0, 60), elements=st.sampled_from([0.0, 1.0, -2.0]) | _floats))
def test_ascending_order_is_lexsort_by_value_then_index(values):
    np.testing.assert_array_equal(
        ascending_order(values), np.lexsort((np.arange(values.shape[0]), values))
    )
