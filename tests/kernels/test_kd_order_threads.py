"""``kd_order`` on the threads (``kd_split``: the top of the tree level by level, the
subtrees below it as work items) gives the serial depth-first split's ``(order,
leaf_start)`` bit for bit: on any data, on one thread and two, and twice in a row.

The reference is the serial split as it was before the threads (``_serial_kd_order``,
the same guarded median selection of ``kd_order._select_median``). ``parallel_keys=1``
makes the threaded split run at the small sizes hypothesis draws; a few cases at 2e4 and
1e5 keys take the default threshold."""

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn.kernels import kd_order as kd
from tests._kd_serial import serial_kd_order as _serial_kd_order

THREADS = list(range(1, min(2, numba.config.NUMBA_NUM_THREADS) + 1))
KINDS = ["normal", "clustered", "ties", "nan", "constant", "organ_pipe", "sorted"]


def _keys(kind, n, k, seed):
    """n keys of k features of one kind of data (float64)."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.normal(size=(n, k))
    if kind == "clustered":
        centres = rng.uniform(size=(8, k))
        return centres[rng.integers(0, 8, n)] + 0.01 * rng.normal(size=(n, k))
    if kind == "ties":
        return rng.integers(0, 3, size=(n, k)).astype(np.float64)
    if kind == "nan":
        z = rng.normal(size=(n, k))
        z[rng.random((n, k)) < 0.15] = np.nan
        return z
    if kind == "constant":
        return np.full((n, k), 2.5)
    if kind == "organ_pipe":  # rising then falling: the selection's guard sorts
        x = np.arange(n, dtype=np.float64)
        z = 1e-3 * rng.normal(size=(n, k))
        z[:, 0] = np.minimum(x, n - 1 - x)
        return z
    return np.sort(rng.normal(size=(n, k)), axis=0)  # sorted


def _check(z, leaf_keys, parallel_keys):
    """kd_order equals the serial reference on every thread count, twice in a row, and
    leaves z as it was."""
    z_before = z.copy()
    ref_order, ref_starts = _serial_kd_order(z, leaf_keys, kd._SCAN_PER_KEY)
    with_threads = numba.get_num_threads()
    try:
        for threads in THREADS:
            numba.set_num_threads(threads)
            for _ in range(2):
                order, starts = kd.kd_order(z, leaf_keys, kd._SCAN_PER_KEY, parallel_keys)
                np.testing.assert_array_equal(order, ref_order)
                np.testing.assert_array_equal(starts, ref_starts)
                assert order.dtype == np.int64 and starts.dtype == np.int64
    finally:
        numba.set_num_threads(with_threads)
    np.testing.assert_array_equal(z, z_before)


@settings(max_examples=60)
@given(
    kind=st.sampled_from(KINDS),
    n=st.one_of(st.integers(0, 8), st.integers(9, 3000)),
    k=st.integers(1, 4),
    leaf_keys=st.sampled_from([0, 1, 2, 7, 16, 64, 512]),
    dtype=st.sampled_from([np.float64, np.float32, np.int64]),
    layout=st.sampled_from("CF"),
    levels=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_threaded_split_is_the_serial_split(kind, n, k, leaf_keys, dtype, layout, levels, seed):
    """``levels``: the top split level by level on the threads down to _ITEMS_PER_THREAD
    nodes a thread (``_SUBTREE_KEYS`` 1), as at large n."""
    z = _keys(kind, n, k, seed)
    if dtype == np.int64:
        z = np.nan_to_num(np.round(z * 10.0))
    z = np.asarray(z, dtype=dtype, order=layout)  # F: z.T is already feature-major
    subtree_keys = kd._SUBTREE_KEYS
    kd._SUBTREE_KEYS = 1 if levels else subtree_keys
    try:
        _check(z, leaf_keys, parallel_keys=1)
    finally:
        kd._SUBTREE_KEYS = subtree_keys


@pytest.mark.parametrize(
    ("kind", "n", "k", "leaf_keys"),
    [
        ("clustered", 20_000, 3, 512),
        ("nan", 20_000, 2, 16),
        ("organ_pipe", 20_000, 2, 512),
        ("ties", 100_000, 2, 512),
        ("normal", 100_000, 3, 64),
    ],
)
def test_threaded_split_at_default_threshold(kind, n, k, leaf_keys):
    assert n >= kd._PARALLEL_KEYS  # the threaded split runs here
    _check(_keys(kind, n, k, seed=n + k), leaf_keys, kd._PARALLEL_KEYS)


@pytest.mark.skipif(len(THREADS) < 2, reason="one numba thread")
def test_the_split_runs_on_the_threads(monkeypatch):
    """From ``_PARALLEL_KEYS`` keys on two threads the subtrees are work items on the pool,
    and the levels after the root too where their nodes are larger than
    ``_SUBTREE_KEYS``; below ``_PARALLEL_KEYS``, nothing is."""
    calls = []
    monkeypatch.setattr(kd, "_run", _counting_run(kd._run, calls))
    z = _keys("clustered", 4 * kd._SUBTREE_KEYS, 3, seed=1)
    with_threads = numba.get_num_threads()
    try:
        numba.set_num_threads(2)
        for n, at_least in ((z.shape[0], 2), (kd._PARALLEL_KEYS, 1)):
            calls.clear()
            kd.kd_order(z[:n], 64)
            threaded = [kernel for kernel, on_threads in calls if on_threads]
            assert threaded.count(kd._split_items) >= at_least
        calls.clear()
        kd.kd_order(z[: kd._PARALLEL_KEYS - 1], 64)
        assert calls and not any(on_threads for _, on_threads in calls)
    finally:
        numba.set_num_threads(with_threads)


def _counting_run(run, calls):
    """``kd._run`` that notes each call's kernel and whether it ran on the threads."""

    def counted(kernel, threaded, *args):
        calls.append((kernel, threaded))
        return run(kernel, threaded, *args)

    return counted


def test_take_columns_is_the_gather():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 40_000)).astype(np.float32)
    order = rng.permutation(40_000)
    with_threads = numba.get_num_threads()
    try:
        for threads in THREADS:
            numba.set_num_threads(threads)
            for parallel_values in (1, kd._PARALLEL_VALUES):
                got = kd.take_columns(x, order, parallel_values)
                assert got.flags.c_contiguous and got.dtype == x.dtype
                np.testing.assert_array_equal(got, x[:, order])
    finally:
        numba.set_num_threads(with_threads)
