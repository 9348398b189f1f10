"""Hostile review of the threaded k-d split (``kd_order.kd_split``, ``take_columns`` and
``smoothing.pruned.tree_layout`` on them): edge sizes, odd leaf sizes, special values,
dtypes and layouts, thread counts switched within a process, concurrent callers and a
Ctrl-C during a split. Every answer is compared with the serial depth-first split as it
was before the threads (``_serial_kd_order``, the same guarded median selection) or
across thread counts, never with stored outputs."""

import _thread
import signal
import sys
import threading
import time

import numba
import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.kernels import items
from nbattn.kernels import kd_order as kd
from nbattn.smoothing import pruned
from tests._kd_serial import serial_kd_order as _serial_kd_order

TWO = min(2, numba.config.NUMBA_NUM_THREADS)
THREADS = list(range(1, TWO + 1))


def _reference(z, leaf_keys):
    z64 = np.ascontiguousarray(z, dtype=np.float64)
    return _serial_kd_order(z64, np.int64(min(max(int(leaf_keys), 1), 2**62)), kd._SCAN_PER_KEY)


def _assert_same_split(z, leaf_keys, parallel_keys=kd._PARALLEL_KEYS):
    """kd_order(z) on one thread and two (twice each, switched within the process)
    equals the serial reference and leaves z's bytes and flags as they were."""
    before, writeable = z.copy(), z.flags.writeable
    ref_order, ref_starts = _reference(z, leaf_keys)
    with_threads = numba.get_num_threads()
    try:
        for threads in THREADS + THREADS[::-1]:
            numba.set_num_threads(threads)
            order, starts = kd.kd_order(z, leaf_keys, kd._SCAN_PER_KEY, parallel_keys)
            assert order.dtype == np.int64 and starts.dtype == np.int64
            np.testing.assert_array_equal(order, ref_order)
            np.testing.assert_array_equal(starts, ref_starts)
    finally:
        numba.set_num_threads(with_threads)
    assert z.tobytes() == before.tobytes() and z.flags.writeable == writeable


def _special(kind, n, k, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k))
    if kind == "nan_some":
        z[rng.random((n, k)) < 0.2] = np.nan
    elif kind == "nan_column":
        z[:, 0] = np.nan
    elif kind == "nan_all":
        z[:] = np.nan
    elif kind == "inf":
        mask = rng.random((n, k))
        z[mask < 0.1], z[mask > 0.9] = np.inf, -np.inf
    elif kind == "max_float":  # extent inf: the first such column is chosen
        z[:, 0] = np.where(rng.random(n) < 0.5, 1.7e308, -1.7e308)
        z[:, -1] *= 1e300
    elif kind == "subnormal":
        z = rng.integers(-5, 5, size=(n, k)) * 5e-324
    elif kind == "signed_zero":
        z = rng.integers(-1, 2, size=(n, k)) * 0.0
        z[rng.random((n, k)) < 0.3] = -0.0
    elif kind == "equal":
        z[:] = 3.25
    elif kind == "reverse":
        z = np.sort(z, axis=0)[::-1]
    elif kind == "organ_pipe":  # every column rises then falls: the guard sorts
        x = np.arange(n, dtype=np.float64)
        z = np.minimum(x, n - 1 - x)[:, None] + np.arange(k) + 1e-3 * z
    return z


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 513])
@pytest.mark.parametrize("leaf_keys", [0, 1, 16, 2**62])
def test_small_sizes_on_the_threaded_path(n, leaf_keys):
    """parallel_keys=1: the level-by-level split and _leaf_starts at the smallest sizes
    (n = leaf_keys + 1 among them)."""
    _assert_same_split(_special("normal", n, 3, seed=n), leaf_keys, parallel_keys=1)


@pytest.mark.parametrize(
    "kind",
    [
        "nan_some",
        "nan_column",
        "nan_all",
        "inf",
        "max_float",
        "subnormal",
        "signed_zero",
        "equal",
        "reverse",
        "organ_pipe",
    ],
)
@pytest.mark.parametrize("n", [kd._PARALLEL_KEYS - 1, kd._PARALLEL_KEYS + 1])
def test_special_values_at_the_threshold(kind, n):
    _assert_same_split(_special(kind, n, 3, seed=n), 64)


@pytest.mark.parametrize("leaf_keys", [2.5, 0.5, -5, np.int32(7), np.uint8(9), 2**63, 2**64])
def test_odd_leaf_sizes(leaf_keys):
    _assert_same_split(_special("normal", 3000, 2, seed=1), leaf_keys, parallel_keys=1)


def _layouts():
    rng = np.random.default_rng(2)
    base = rng.normal(size=(kd._PARALLEL_KEYS + 5, 3))
    read_only = base.copy()
    read_only.setflags(write=False)
    return {
        "float32_F": np.asfortranarray(base.astype(np.float32)),
        "int32": np.round(base * 100).astype(np.int32),
        "uint64_big": np.abs(np.round(base * 2.0**60)).astype(np.uint64) + np.uint64(2**63),
        "int64_big": np.round(base * 2.0**58).astype(np.int64) + 1,
        "bool": base > 0,
        "row_strided": np.repeat(base, 2, axis=0)[::2],
        "column_strided": np.repeat(base, 2, axis=1)[:, ::2],
        "reversed": base[::-1],
        "read_only": read_only,
    }


@pytest.mark.parametrize("name", list(_layouts()))
def test_dtypes_and_layouts(name):
    _assert_same_split(_layouts()[name], 64)


@pytest.mark.skipif(TWO < 2, reason="one numba thread")
def test_concurrent_callers_with_their_own_thread_counts():
    """Python threads splitting at once (one on one numba thread, one on two) queue
    their items on the one pool and each gets the serial split."""
    rng = np.random.default_rng(3)
    zs = [rng.normal(size=(40_000 + i, 2)) for i in range(4)]
    refs = [_reference(z, 64) for z in zs]
    wrong = []

    def caller(i):
        numba.set_num_threads(1 + i % 2)
        for _ in range(2):
            order, starts = kd.kd_order(zs[i], 64)
            if not (np.array_equal(order, refs[i][0]) and np.array_equal(starts, refs[i][1])):
                wrong.append(i)

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(60)
    assert not any(thread.is_alive() for thread in callers)
    assert wrong == []


@pytest.mark.parametrize("extra", [-1, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_take_columns_at_its_threshold(extra, dtype):
    """At 2**17 +- 1 values, from a strided and a read-only x: the plain gather."""
    rng = np.random.default_rng(4)
    n = kd._PARALLEL_VALUES + extra
    x = (rng.normal(size=(2, 2 * n)) * 100).astype(dtype)[:1, ::2]
    order = rng.permutation(n)
    read_only = np.asfortranarray(np.vstack([x, x]))
    read_only.setflags(write=False)
    with_threads = numba.get_num_threads()
    try:
        for threads in THREADS:
            numba.set_num_threads(threads)
            for values in (x, read_only):
                got = kd.take_columns(values, order)
                assert got.flags.c_contiguous and got.dtype == values.dtype
                np.testing.assert_array_equal(got, values[:, order])
    finally:
        numba.set_num_threads(with_threads)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_layout_keys_are_the_gathered_keys(dtype):
    """The keys left in k-d order by kd_split, cast back to k_t's dtype, are k_t[:, order]
    bit for bit (signed zeros, subnormals of float32, values at float32's limits)."""
    rng = np.random.default_rng(5)
    n = kd._PARALLEL_KEYS + 3
    k_t = rng.normal(size=(3, n)).astype(dtype)
    k_t[0, ::5] = -0.0
    k_t[1, ::7] = np.finfo(dtype).tiny / 4  # subnormal
    k_t[2, ::11] = np.finfo(dtype).max
    v_t = np.asfortranarray(rng.normal(size=(2, n)).astype(dtype))
    k_before, v_before = k_t.copy(), v_t.copy()
    order, _ = _reference(k_t.T, int(config.TREE_LEAF_KEYS))
    for threads in THREADS:
        with_threads = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            keys, values, _, own = pruned.tree_layout(k_t, v_t, True, 100)
        finally:
            numba.set_num_threads(with_threads)
        assert keys.dtype == dtype and values.dtype == dtype
        assert keys.tobytes() == np.ascontiguousarray(k_t[:, order]).tobytes()
        assert values.tobytes() == np.ascontiguousarray(v_t[:, order]).tobytes()
        np.testing.assert_array_equal(order[own], np.arange(100))
    assert k_t.tobytes() == k_before.tobytes() and v_t.tobytes() == v_before.tobytes()


@pytest.fixture
def tree_forced(monkeypatch):
    monkeypatch.setattr(config, "TREE_MIN_KEYS", 1)
    monkeypatch.setattr(config, "TREE_MAX_COST_SHARE", 10**9)
    monkeypatch.setattr(config, "TREE_MAX_OVERHEAD_SHARE", 10**9)


@pytest.mark.skipif(TWO < 2, reason="one numba thread")
def test_rtol_path_same_bits_on_threads_and_concurrent_callers(tree_forced):
    rng = np.random.default_rng(6)
    centres = rng.uniform(-3, 3, size=(12, 3))
    keys = centres[rng.integers(0, 12, 20_000)] + 0.2 * rng.normal(size=(20_000, 3))
    queries = centres[rng.integers(0, 12, 500)] + 0.2 * rng.normal(size=(500, 3))
    values = np.sin(keys).sum(1)
    cases = [(dtype, width) for dtype in ("float32", "float64") for width in (0.05, 0.2)]

    def call(dtype, width):
        return nbattn.nadaraya_watson(
            queries, keys, values, width, rtol=1e-6, return_lse=True, dtype=dtype
        )

    with_threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        refs = [call(*case) for case in cases]
        numba.set_num_threads(2)
        for case, ref in zip(cases, refs):
            for got, want in zip(call(*case), ref):
                assert got.tobytes() == want.tobytes()
    finally:
        numba.set_num_threads(with_threads)
    wrong = []

    def caller(i):
        got = call(*cases[i])
        if any(a.tobytes() != b.tobytes() for a, b in zip(got, refs[i])):
            wrong.append(i)

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(len(cases))]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(60)
    assert not any(thread.is_alive() for thread in callers) and wrong == []


def _busy_workers():
    """The pool threads inside a work item (not waiting on the queue)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    busy = []
    for ident, frame in sys._current_frames().items():
        if not names.get(ident, "").startswith("nbattn-items"):
            continue
        while frame is not None:
            if frame.f_code.co_name == "run" and "futures" in frame.f_code.co_filename:
                busy.append(names[ident])
                break
            frame = frame.f_back
    return busy


@pytest.mark.skipif(TWO < 2, reason="one numba thread")
def test_ctrl_c_during_a_split():
    """A KeyboardInterrupt at any point of a threaded split leaves no worker in an item,
    the input as it was, and the next call right. With Python's own SIGINT handler
    installed: a process started in the background (as CI may start the suite) inherits
    SIGINT ignored, and then ``interrupt_main`` does nothing."""
    n = 200_000
    x = np.arange(n, dtype=np.float64)
    z = np.minimum(x, n - 1 - x)[:, None] + np.random.default_rng(7).normal(size=(n, 2))
    before = z.copy()
    ref = _reference(z, 512)
    with_threads = numba.get_num_threads()
    numba.set_num_threads(2)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        start = time.perf_counter()
        kd.kd_order(z, 512)
        took = time.perf_counter() - start
        interrupted = 0
        for share in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9):
            timer = threading.Timer(share * took, _thread.interrupt_main)
            try:
                timer.start()
                kd.kd_order(z, 512)
                timer.join()
                time.sleep(0.05)  # an interrupt that comes after the call lands here
            except KeyboardInterrupt:
                interrupted += 1
                assert _busy_workers() == []
            timer.join()
            order, starts = kd.kd_order(z, 512)
            np.testing.assert_array_equal(order, ref[0])
            np.testing.assert_array_equal(starts, ref[1])
        assert interrupted == 6
        assert not items._POOL or items._POOL[0][0]._work_queue.empty()
    finally:
        signal.signal(signal.SIGINT, previous)
        numba.set_num_threads(with_threads)
    assert z.tobytes() == before.tobytes()


@pytest.mark.parametrize("n", [0, 1, 17, 2000, 20000])
def test_no_features_keeps_the_order_and_the_leaves_of_n(n):
    """Keys without coordinates: nothing to split by, so the order is the identity, and
    the leaves are those every split at (a + b) // 2 gives (from n alone, as with one
    feature); no coordinate is read (the split once read past the empty copy)."""
    order, starts = kd.kd_order(np.zeros((n, 0)), 16)
    np.testing.assert_array_equal(order, np.arange(n))
    np.testing.assert_array_equal(starts, kd.kd_order(np.zeros((n, 1)), 16)[1])
