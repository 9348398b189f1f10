"""Review cases for the k-d tree walk on work items (``nbattn.kernels.tree_pool`` run by
``nbattn.kernels.items.run_items`` instead of a ``prange``).

Each pool thread allocates its scratch once and resets it per tile, and the tiles are
handed out by an atomic counter. The contract: every tile writes only its own rows, so
(out, lse, far, work) are bit for bit the same on every run, every thread count, and
whichever thread or earlier tile ran before; different ``tile`` values may change the
order of the nodes (not bit-identical) but each stays within the rtol bound. Hostile
cases: tiles of far rows, rows that walk again (loose boxes, "Shift"), skipped keys next
to rows without, partial tiles, tile 1 and tiles wider than the rows, no rows, one key,
one key excluded, duplicates, 1 and 12 features, float32 and float64, both exponentials,
Ctrl-C while the pool works, concurrent callers, forked children, more threads than
cores or tiles, and inputs left untouched.
"""

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numba
import numpy as np
import pytest

import nbattn
from nbattn.dispatch.device import kernels_for
from nbattn.kernels import items
from nbattn.kernels import tree_pool as tree_module
from nbattn.smoothing import regression
from nbattn.smoothing.pruned import _query_order, tree_layout

from .._config import config_values

TREE = kernels_for("tree_pool", "cpu")
EXACT = kernels_for("pooling", "cpu").gaussian_pool
MAX_THREADS = numba.config.NUMBA_NUM_THREADS
ROOT = Path(__file__).resolve().parents[2]
_FORCE = {
    "TREE_MIN_KEYS": 1,
    "TREE_MAX_COST_SHARE": 10**9,
    "TREE_MAX_OVERHEAD_SHARE": 10**9,
    "TREE_LEAF_KEYS": 16,
}


@contextlib.contextmanager
def _threads(n):
    saved = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(saved)


def _bits(result):
    """The exact bytes, dtypes and shapes of (out, lse, far, work): -0.0 != 0.0, NaN == NaN
    only with the same payload."""
    return [(a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()) for a in result]


def _assert_same_bits(first, second, what=""):
    for name, a, b in zip(("out", "lse", "far", "work"), _bits(first), _bits(second)):
        assert a == b, f"{name} differs {what}"


def _gap(dtype):
    """A squared scaled distance at which weights relative to a box's bound flush below the
    one-pass minimum (float64 ~ e^-658, float32 ~ e^-55) but stay far below the far
    threshold: a query inside a box spanning two such clusters walks again."""
    return 1000.0 if dtype == np.float64 else 200.0


def _problem(kind, seed, n_queries, n_keys, d, p, dtype, exclude_self=False):
    """(queries, keys, values, h) in float64; queries are the keys under exclude_self."""
    rng = np.random.default_rng(seed)
    h = np.full(d, 0.3)
    if kind == "clustered":
        centres = rng.uniform(-4, 4, (5, d))
        keys = centres[rng.integers(0, 5, n_keys)] + 0.15 * rng.normal(size=(n_keys, d))
    elif kind == "duplicates":
        keys = rng.normal(size=(3, d))[rng.integers(0, 3, n_keys)]
    elif kind == "shift":  # two tight clusters +-a apart along feature 0, scaled = unscaled
        h = np.full(d, 1.0 / np.sqrt(2.0))
        a = np.sqrt(_gap(dtype))
        keys = 0.01 * rng.normal(size=(n_keys, d))
        keys[:, 0] += a * (rng.integers(0, 2, n_keys) * 2 - 1)
    else:
        keys = rng.uniform(-2, 2, (n_keys, d))
    values = rng.normal(size=(n_keys, p)) + 3.0
    if exclude_self:
        queries = keys.copy()
        if kind == "far":  # a run of isolated keys, each 1e5 widths from every other
            step = 1e5 * np.arange(1, n_keys // 3 + 1)
            keys[: n_keys // 3, 0] += step
            queries = keys.copy()
        return queries, keys, values, h
    queries = keys[rng.integers(0, n_keys, n_queries)] + 0.3 * rng.normal(size=(n_queries, d))
    if kind == "far":  # a block of queries beyond the far threshold: whole tiles of far rows
        queries[: n_queries // 2] += 1e5 * (1.0 + rng.uniform(size=(n_queries // 2, d)))
    elif kind == "shift":  # half the queries between the clusters: inside a loose box
        queries[: n_queries // 2] = 0.01 * rng.normal(size=(n_queries // 2, d))
    return queries, keys, values, h


def _laid_out(queries, keys, values, h, dtype, leaf_keys, exclude_self=False):
    with config_values(TREE_LEAF_KEYS=leaf_keys):
        q, k_t, v_t, _ = regression._layout(queries, keys, values, h, dtype)
        k_t, v_t, nodes, own = tree_layout(k_t, v_t, exclude_self, q.shape[0])
        rows = _query_order(q)
    return q, k_t, v_t, nodes, own, rows


def _walk(lay, rtol, tile, rows=None, own=None, coarse="auto"):
    q, k_t, v_t, nodes, own0, rows0 = lay
    rows = rows0 if rows is None else rows
    own = own0 if own is None else own
    if coarse == "auto":
        coarse = TREE.coarse_for(rtol, q.dtype)
    return TREE.tree_pool(q, k_t, v_t, *nodes, own, rtol, rows, tile, coarse)


def _exact_rows(lay, rows, own=None):
    """The exact streaming kernel's (out, lse) per row of ``rows`` (as pruned.py's far rows
    are recomputed), with that row's own skipped key."""
    q, k_t, v_t, _, own0, _ = lay
    own = own0 if own is None else own
    outs, lses = [], []
    for i in rows:
        skip = own.shape[0] > 0 and own[i] >= 0
        row_out, row_lse = EXACT(q[i : i + 1], k_t, v_t, skip, int(own[i]) if skip else 0)
        outs.append(np.asarray(row_out[0], dtype=np.float64))
        lses.append(float(row_lse[0]))
    return np.array(outs).reshape(len(rows), v_t.shape[0]), np.array(lses)


def _assert_within_bound(result, exact, lay, rtol, coarse):
    """Every row not flagged far within the contract's bound of the exact kernel's
    ``exact`` (from :func:`_exact_rows`); far rows left 0 and nan as documented."""
    out, lse, far, work = result
    exact_out, exact_lse = exact
    q, k_t, v_t, _, _, _ = lay
    values = v_t.T.astype(np.float64)
    tiny = 3e-4 if q.dtype == np.float32 else 1e-10
    spread = np.maximum(values.max(axis=0) - exact_out, exact_out - values.min(axis=0))
    allowed = rtol / (1.0 - rtol) * spread + tiny * np.abs(values).max()
    finite = ~far & np.isfinite(exact_lse)
    err = np.abs(out[finite].astype(np.float64) - exact_out[finite])
    assert np.all(err <= allowed[finite]), err.max()
    lse_slack = tiny * (1.0 + np.abs(exact_lse[finite]))
    eps = tree_module.COARSE_EXP_RTOL if coarse else 0.0
    assert np.all(lse[finite] <= exact_lse[finite] + eps + lse_slack)
    assert np.all(lse[finite] >= exact_lse[finite] + np.log1p(-rtol) - lse_slack)
    assert np.all(out[far] == 0.0) and np.all(np.isnan(lse[far]))
    assert np.all(work[:, 1] >= 1)


# --- bits across thread counts, repeats, and per-tile isolation -------------------------

CASES = [
    (kind, dtype, exclude_self, d)
    for kind in ("uniform", "clustered", "duplicates", "far", "shift")
    for dtype in (np.float64, np.float32)
    for exclude_self in (False, True)
    for d in ((1, 3) if kind in ("uniform", "clustered") else (2,))
] + [("uniform", np.float64, False, 12), ("clustered", np.float32, True, 12)]


@pytest.mark.parametrize(("kind", "dtype", "exclude_self", "d"), CASES)
def test_bits_do_not_depend_on_threads_repeats_or_neighbouring_tiles(kind, dtype, exclude_self, d):
    """For each tile width: 1 thread, all threads twice, and each tile run alone (fresh
    scratch) give the same bits; every width within the bound of the exact kernel."""
    n_keys = 300 if kind != "shift" else 120
    leaf = 1000 if kind == "shift" else 8  # shift: one leaf spanning both clusters
    walked_again = 0
    for seed in range(2):
        problem = _problem(kind, seed, 61, n_keys, d, 2, dtype, exclude_self)
        lay = _laid_out(*problem, dtype, leaf, exclude_self)
        rows = lay[5]
        exact = _exact_rows(lay, rows)
        for rtol in (1e-6, 0.05):
            coarse = TREE.coarse_for(rtol, dtype)
            for tile in (1, 4, 16, rows.shape[0] + 7):
                with _threads(1):
                    reference = _walk(lay, rtol, tile)
                with _threads(MAX_THREADS):
                    for _repeat in range(2):
                        _assert_same_bits(reference, _walk(lay, rtol, tile), f"tile {tile}")
                # each tile alone, on one thread and in reverse order: nothing carried over
                with _threads(1):
                    for first in reversed(range(0, rows.shape[0], tile)):
                        alone = _walk(lay, rtol, tile, rows=rows[first : first + tile])
                        part = [a[first : first + tile] for a in reference]
                        _assert_same_bits(part, alone, f"tile {tile} at {first}")
                _assert_within_bound(reference, exact, lay, rtol, coarse)
                out, lse, far, work = reference
                if kind == "far":
                    far_rows = np.abs(problem[0][rows, 0]) > 1e4
                    assert far[far_rows].all()
                    # a near row that shares its tile with far rows inside the root box
                    # may be dragged to their leaves first and flagged (then recomputed
                    # exactly by the caller); alone, or beside rows flagged up front, not
                    if tile == 1 or not exclude_self:
                        assert np.array_equal(far, far_rows)
                else:
                    assert not far.any()
                walked_again += int((work[:, 0] > n_keys).sum())
    if kind == "shift" and not exclude_self:  # the rows between the clusters walked twice
        assert walked_again > 0


def _mixed(dtype, seed, leaf):
    """Queries in blocks: between two far-apart clusters (walk again), near them, beyond
    the far threshold; keys skipped for some rows (own >= 0), none for the others."""
    rng = np.random.default_rng(seed)
    a = np.sqrt(_gap(dtype))
    n_keys = 90
    keys = 0.01 * rng.normal(size=(n_keys, 2))
    keys[:, 0] += a * (rng.integers(0, 2, n_keys) * 2 - 1)
    values = rng.normal(size=(n_keys, 3)) * [1.0, 1e-3, 1e3] + 2.0
    between = 0.01 * rng.normal(size=(23, 2))
    near = keys[rng.integers(0, n_keys, 23)] + 0.3 * rng.normal(size=(23, 2))
    far = 1e5 * (1.0 + rng.uniform(size=(11, 2)))
    blocks = [between, near, far, near[::-1] + 0.1, between[::-1]]
    order = rng.permutation(len(blocks))
    queries = np.concatenate([blocks[i] for i in order])
    h = np.full(2, 1.0 / np.sqrt(2.0))
    lay = _laid_out(queries, keys, values, h, dtype, leaf)
    own = np.where(
        rng.uniform(size=queries.shape[0]) < 0.5, rng.integers(0, n_keys, queries.shape[0]), -1
    )
    own[rng.integers(0, queries.shape[0], 5)] = -1
    rows = np.arange(queries.shape[0])  # the blocks as given: tiles mix kinds of rows
    return lay, own.astype(np.int64), rows


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("leaf", [4, 1000])
def test_mixed_tiles_keep_no_state_from_the_previous_tile(dtype, leaf):
    """Tiles of far rows, rows that walk again, rows skipping a key and rows skipping none,
    one after another on the same thread: each row's bits are those of the row walked
    alone (tile 1) or its tile walked alone, in any tile order and on any thread count."""
    for seed in range(3):
        lay, own, rows = _mixed(dtype, seed, leaf)
        exact = _exact_rows(lay, rows, own)
        for rtol, coarse, tile in (
            (1e-9, None, 1),
            (1e-9, None, 8),
            (1e-3, TREE.coarse_for(1e-3, dtype), 3),
            (1e-3, TREE.coarse_for(1e-3, dtype), 200),
            (1e-3, None, 8),
            (0.3, TREE.coarse_for(0.3, dtype), 1),
        ):
            with _threads(1):
                forward = _walk(lay, rtol, tile, rows=rows, own=own, coarse=coarse)
            n_tiles = -(-rows.shape[0] // tile)
            # the whole tiles in reverse order, the partial one last (the same tiles)
            whole = rows.shape[0] // tile
            blocks = [rows[t * tile : (t + 1) * tile] for t in range(whole)][::-1]
            perm = np.concatenate([*blocks, rows[whole * tile :]])
            with _threads(MAX_THREADS):
                backward = _walk(lay, rtol, tile, rows=perm, own=own, coarse=coarse)
            back = np.empty_like(perm)
            back[perm] = np.arange(perm.shape[0])
            _assert_same_bits(forward, [a[back] for a in backward], f"tile {tile} reversed")
            for t in range(n_tiles):
                part = rows[t * tile : (t + 1) * tile]
                with _threads(1):
                    alone = _walk(lay, rtol, tile, rows=part, own=own, coarse=coarse)
                _assert_same_bits([a[part] for a in forward], alone, f"tile {t}")
            _assert_within_bound(forward, exact, lay, rtol, coarse)
            out, lse, far, work = forward
            assert np.array_equal(far, np.abs(lay[0][rows, 0]) > 1e4)
            if leaf == 1000:  # one leaf: the rows between the clusters walk twice
                assert (work[~far, 0] >= 2 * 89).any() and (work[~far, 0] <= 90).any()


def test_tile_zero_and_negative_are_tile_one_and_rows_may_repeat():
    lay = _laid_out(*_problem("clustered", 4, 40, 200, 2, 1, np.float64), np.float64, 8)
    one = _walk(lay, 1e-6, 1)
    for tile in (0, -5, np.int32(1), 1.0):
        _assert_same_bits(one, _walk(lay, 1e-6, tile), f"tile {tile!r}")
    rows = lay[5]
    repeated = np.concatenate([rows[:5], rows[:5], rows[:5]])
    with _threads(MAX_THREADS):
        got = _walk(lay, 1e-6, 5, rows=repeated)  # three copies of one tile
    for a in got:
        assert np.array_equal(a[:5], a[5:10], equal_nan=True)
        assert np.array_equal(a[:5], a[10:], equal_nan=True)


# --- edge shapes -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threads", [1, MAX_THREADS])
def test_no_rows_one_key_one_key_excluded_and_duplicates(dtype, threads):
    lay = _laid_out(*_problem("uniform", 0, 10, 50, 3, 2, dtype), dtype, 8)
    with _threads(threads):
        out, lse, far, work = _walk(lay, 1e-6, 16, rows=np.empty(0, dtype=np.int64))
    assert out.shape == (0, 2) and out.dtype == dtype
    assert lse.shape == (0,) and far.shape == (0,) and work.shape == (0, 3)

    # one key: every row sums it, or is far
    keys = np.array([[0.3, -0.2]])
    queries = np.array([[0.3, -0.2], [0.5, 0.0], [1e6, 1e6], [-0.1, 0.4]])
    values = np.array([[2.5, -7.0]])
    lay = _laid_out(queries, keys, values, np.array([0.4, 0.4]), dtype, 8)
    with _threads(threads):
        out, lse, far, work = _walk(lay, 0.1, 3, rows=np.arange(4))
    assert np.array_equal(far, [False, False, True, False])
    np.testing.assert_allclose(out[~far], np.repeat(values, 3, axis=0), rtol=1e-6)
    assert np.all(work[~far, 0] == 1)

    # one key excluded: out 0, lse -inf, not far
    lay = _laid_out(keys, keys, values, np.array([0.4, 0.4]), dtype, 8, exclude_self=True)
    for tile in (1, 4):
        with _threads(threads):
            out, lse, far, work = _walk(lay, 0.1, tile)
        assert not far.any() and np.all(out == 0.0) and lse[0] == -np.inf
        assert np.array_equal(lay[4], [0])

    # every key the same point: the mean of the values, the leave-one-out mean under skip
    rng = np.random.default_rng(1)
    keys = np.tile([[1.0, 2.0]], (70, 1))
    values = rng.normal(size=(70, 1))
    lay = _laid_out(keys, keys, values, np.array([0.5, 0.5]), dtype, 4, exclude_self=True)
    with _threads(threads):
        out, lse, far, work = _walk(lay, 1e-3, 5)
    loo = (values.sum() - values[lay[5], 0]) / 69.0
    tol = 1e-4 if dtype == np.float32 else 1e-12
    assert not far.any()
    np.testing.assert_allclose(out[:, 0], loo, rtol=tol, atol=tol)


@pytest.mark.parametrize("threads", [1, MAX_THREADS])
def test_public_api_one_key_and_one_key_excluded(monkeypatch, threads):
    for name, value in _FORCE.items():
        monkeypatch.setattr(nbattn.config, name, value)
    with _threads(threads):
        one = nbattn.nadaraya_watson([[0.0], [3.0]], [[1.0]], [4.0], 1.0, rtol=0.1)
        out, lse = nbattn.nadaraya_watson(
            [[1.0]], [[1.0]], [2.0], 1.0, True, rtol=0.1, return_lse=True
        )
    assert np.array_equal(one, [4.0, 4.0])
    assert out[0] == 0.0 and lse[0] == -np.inf


# --- the public path ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_public_nadaraya_watson_same_bits_on_any_thread_count_and_within_bound(
    monkeypatch, dtype, exclude_self
):
    for name, value in _FORCE.items():
        monkeypatch.setattr(nbattn.config, name, value)
    for seed, kind in enumerate(("uniform", "clustered", "far", "duplicates", "shift") * 2):
        queries, keys, values, h = _problem(kind, seed, 157, 400, 2, 2, dtype, exclude_self)
        for rtol in (1e-9, 1e-6, 1e-3, 0.2):
            runs = []
            for threads in (1, MAX_THREADS, 1):
                with _threads(threads):
                    runs.append(
                        nbattn.nadaraya_watson(
                            queries, keys, values, h, exclude_self,
                            dtype=dtype.__name__, rtol=rtol, return_lse=True,
                        )
                    )  # fmt: skip
            for other in runs[1:]:
                assert np.array_equal(runs[0][0], other[0]) and np.array_equal(runs[0][1], other[1])
            out, lse = runs[0]
            exact, exact_lse = nbattn.nadaraya_watson(
                queries, keys, values, h, exclude_self, dtype=dtype.__name__, return_lse=True
            )
            assert out.dtype == dtype and np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
            tiny = 3e-4 if dtype == np.float32 else 1e-10
            spread = np.maximum(values.max(axis=0) - exact, exact - values.min(axis=0))
            err = np.abs(out - exact)
            assert np.all(err <= rtol / (1 - rtol) * spread + tiny * np.abs(values).max()), (
                kind,
                rtol,
                err.max(),
            )
            coarse = TREE.coarse_for(rtol, dtype) is not None
            lse_slack = tiny * (1.0 + np.abs(exact_lse))
            eps = tree_module.COARSE_EXP_RTOL if coarse else 0.0
            assert np.all(lse <= exact_lse + eps + lse_slack)
            assert np.all(lse >= exact_lse + np.log1p(-rtol) - lse_slack)


def test_regressor_and_pruned_module_agree_with_the_function(monkeypatch):
    for name, value in _FORCE.items():
        monkeypatch.setattr(nbattn.config, name, value)
    queries, keys, values, h = _problem("clustered", 9, 120, 500, 2, 1, np.float64)
    values = values[:, 0]
    with _threads(MAX_THREADS):
        direct = nbattn.nadaraya_watson(queries, keys, values, h, rtol=1e-4)
        model = nbattn.NadarayaWatsonRegressor(bandwidth=h, rtol=1e-4).fit(keys, values)
        predicted = model.predict(queries)
    with _threads(1):
        again = nbattn.NadarayaWatsonRegressor(bandwidth=h, rtol=1e-4).fit(keys, values)
        serial = again.predict(queries)
    assert np.array_equal(direct, predicted) and np.array_equal(predicted, serial)


# --- Ctrl-C while the pool works -------------------------------------------------------


def _big_problem():
    """A walk of some tens of milliseconds: many rows, tile 1, a tiny rtol."""
    queries, keys, values, h = _problem("uniform", 5, 3000, 3000, 2, 2, np.float64)
    return _laid_out(queries, keys, values, h * 3, np.float64, 8)


@pytest.mark.skipif(MAX_THREADS < 2, reason="the pool runs only on more than one thread")
def test_keyboard_interrupt_while_waiting_stops_every_writer(monkeypatch):
    lay = _big_problem()
    with _threads(MAX_THREADS):
        clean = _walk(lay, 1e-12, 1)
    seen = {}
    real_run_items, real_submit, real_wait = items.run_items, items._submit, items.wait

    def recording_run_items(kernel, *args):
        seen["outputs"] = args[-4:]  # out, lse, far_rows, work
        return real_run_items(kernel, *args)

    def recording_submit(kernel, n_workers, counter, args, futures):
        seen["futures"] = futures
        seen["counter"] = counter
        return real_submit(kernel, n_workers, counter, args, futures)

    calls = []

    def interrupted_wait(futures, *a, **kw):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.002)  # the workers are inside their items
            raise KeyboardInterrupt
        return real_wait(futures, *a, **kw)

    monkeypatch.setattr(tree_module, "run_items", recording_run_items)
    monkeypatch.setattr(items, "_submit", recording_submit)
    monkeypatch.setattr(items, "wait", interrupted_wait)
    with _threads(MAX_THREADS), pytest.raises(KeyboardInterrupt):
        _walk(lay, 1e-12, 1)
    assert all(f.done() for f in seen["futures"])  # nobody is still working
    assert seen["counter"][0] >= items._DONE
    snapshot = [np.array(a, copy=True) for a in seen["outputs"]]
    time.sleep(0.05)
    for a, b in zip(snapshot, seen["outputs"]):
        assert np.array_equal(a, b, equal_nan=True)  # nothing written after the raise
    # the interrupted call stopped early: some rows never got their tile
    assert np.isnan(seen["outputs"][1][~seen["outputs"][2]]).any()
    monkeypatch.undo()
    with _threads(MAX_THREADS):
        _assert_same_bits(clean, _walk(lay, 1e-12, 1), "after the interrupt")
    with _threads(1):
        _assert_same_bits(clean, _walk(lay, 1e-12, 1), "after the interrupt, one thread")


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_a_real_sigint_mid_call_propagates_and_the_next_call_is_clean(monkeypatch):
    """SIGINT from a timer while the calls run: KeyboardInterrupt comes out, no pool
    thread keeps running items, and the next calls give the clean call's bits."""
    lay = _big_problem()
    with _threads(MAX_THREADS):
        clean = _walk(lay, 1e-12, 1)
        start = time.perf_counter()
        _walk(lay, 1e-12, 1)
        one_call = time.perf_counter() - start
    futures = []
    real_submit = items._submit

    def recording_submit(kernel, n_workers, counter, args, fs):
        futures.append(fs)
        return real_submit(kernel, n_workers, counter, args, fs)

    monkeypatch.setattr(items, "_submit", recording_submit)
    interrupted = 0
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for attempt in range(8):
            delay = max(one_call * (0.2 + 0.1 * attempt), 1e-3)
            try:
                with _threads(MAX_THREADS):
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
                    signal.setitimer(signal.ITIMER_REAL, delay)
                    for _ in range(50):
                        _walk(lay, 1e-12, 1)
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert interrupted == 8
    assert all(f.done() for fs in futures for f in fs)
    monkeypatch.undo()
    for threads in (MAX_THREADS, 1):
        with _threads(threads):
            _assert_same_bits(clean, _walk(lay, 1e-12, 1), f"after SIGINT, {threads} threads")


# --- concurrent callers, forked children, other thread counts ---------------------------


def test_two_python_threads_at_once_give_the_sequential_results(monkeypatch):
    for name, value in _FORCE.items():
        monkeypatch.setattr(nbattn.config, name, value)
    problems = [
        _problem("clustered", 21, 800, 1500, 2, 2, np.float64),
        _problem("shift", 22, 800, 400, 2, 1, np.float32),
        _problem("far", 23, 600, 1500, 3, 1, np.float64),
    ]
    dtypes = ["float64", "float32", "float64"]

    def call(i):
        queries, keys, values, h = problems[i]
        return nbattn.nadaraya_watson(
            queries, keys, values, h, dtype=dtypes[i], rtol=1e-6, return_lse=True
        )

    sequential = [call(i) for i in range(len(problems))]
    results = {}
    errors = []
    barrier = threading.Barrier(len(problems))

    def worker(i, threads):
        try:
            numba.set_num_threads(threads)  # thread-local in numba
            barrier.wait()
            results[i] = [call(i) for _ in range(6)]
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    for round_ in range(2):
        threads = [
            threading.Thread(target=worker, args=(i, MAX_THREADS if (i + round_) % 2 else 1))
            for i in range(len(problems))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        for i in range(len(problems)):
            for out, lse in results[i]:
                assert np.array_equal(out, sequential[i][0])
                assert np.array_equal(lse, sequential[i][1])


def test_dask_shards_on_threads_give_the_synchronous_bits(monkeypatch):
    """nadaraya_watson_sharded(rtol=) on dask's threaded scheduler: the shards' walks run
    in several Python threads at once, each on the pool; the same bits as one at a time."""
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    nbdask = pytest.importorskip("nbattn.dask")
    for name, value in _FORCE.items():
        monkeypatch.setattr(nbattn.config, name, value)
    queries, keys, values, h = _problem("clustered", 71, 400, 2400, 2, 2, np.float64)
    lazy = nbdask.nadaraya_watson_sharded(
        da.from_array(queries, chunks=(100, 2)),
        da.from_array(keys, chunks=((900, 800, 700), 2)),
        da.from_array(values, chunks=((900, 800, 700), 2)),
        bandwidth=h,
        rtol=1e-4,
    )
    with dask.config.set(scheduler="sync"):
        serial = lazy.compute()
    with dask.config.set(scheduler="threads", num_workers=4):
        for _ in range(3):
            assert np.array_equal(lazy.compute(), serial)
    exact = nbattn.nadaraya_watson(queries, keys, values, h)
    spread = np.abs(values[None, :, :] - exact[:, None, :]).max(axis=1)
    assert np.all(np.abs(serial - exact) <= 1e-4 / (1 - 1e-4) * spread + 1e-12 * 5)


def _fork_child(conn, lay):
    try:
        conn.send([a.tobytes() for a in _walk(lay, 1e-6, 4)])
    except BaseException as error:  # noqa: BLE001
        conn.send(repr(error))
    finally:
        conn.close()


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods() or MAX_THREADS < 2,
    reason="needs fork and a pool",
)
def test_a_forked_child_walks_on_a_pool_of_its_own():
    lay = _laid_out(*_problem("clustered", 31, 300, 800, 2, 2, np.float64), np.float64, 8)
    with _threads(MAX_THREADS):
        parent = _walk(lay, 1e-6, 4)  # the parent's pool exists now
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_fork_child, args=(send, lay))
        child.start()
        send.close()
        ready = receive.poll(60)
        got = receive.recv() if ready else None
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
    assert ready, "the forked child hung"
    assert got == [a.tobytes() for a in parent]


_SCRIPT = """
import sys, numpy as np, numba
sys.path.insert(0, {root!r})
from tests.smoothing import test_tree_items_review as review
found = []
for threads in sorted({{1, numba.config.NUMBA_NUM_THREADS}}):
    numba.set_num_threads(threads)
    for kind, dtype in (("clustered", np.float64), ("shift", np.float32), ("far", np.float64)):
        lay = review._laid_out(*review._problem(kind, 41, 50, 300, 2, 2, dtype), dtype, 8)
        for tile in (1, 16, 1000):
            found.append([a.tobytes() for a in review._walk(lay, 1e-6, tile)])
np.save({path!r}, np.array(found, dtype=object), allow_pickle=True)
"""


def _results_here():
    found = []
    for kind, dtype in (("clustered", np.float64), ("shift", np.float32), ("far", np.float64)):
        lay = _laid_out(*_problem(kind, 41, 50, 300, 2, 2, dtype), dtype, 8)
        for tile in (1, 16, 1000):
            found.append([a.tobytes() for a in _walk(lay, 1e-6, tile)])
    return found


def test_more_threads_than_cores_and_tiles_in_a_fresh_process(tmp_path):
    """NUMBA_NUM_THREADS=7 (more than the cores, more than a 1000-row tile's one item) and
    1, in processes of their own: the same bits as here."""
    with _threads(1):
        here = _results_here()
    for n in (7, 1):
        path = str(tmp_path / f"found{n}.npy")
        env = dict(os.environ, NUMBA_NUM_THREADS=str(n))
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT.format(root=str(ROOT), path=path)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        found = np.load(path, allow_pickle=True).tolist()
        per_count = len(here)
        assert len(found) == per_count * (2 if n > 1 else 1)
        for k in range(0, len(found), per_count):
            assert found[k : k + per_count] == here


# --- inputs untouched ----------------------------------------------------------------------


@pytest.mark.parametrize("exclude_self", [False, True])
def test_inputs_are_never_written(monkeypatch, exclude_self):
    for name, value in _FORCE.items():
        monkeypatch.setattr(nbattn.config, name, value)
    for dtype in (np.float64, np.float32):
        problem = _problem("shift", 51, 90, 90, 2, 2, dtype, exclude_self)
        lay = _laid_out(*problem, dtype, 8, exclude_self)
        q, k_t, v_t, nodes, own, rows = lay
        arrays = [q, k_t, v_t, *nodes, own, rows]
        before = [np.array(a, copy=True) for a in arrays]
        flags = [a.flags.writeable for a in arrays]
        for threads in (1, MAX_THREADS):
            with _threads(threads):
                _walk(lay, 1e-6, 4)
                _walk(lay, 0.1, 1, coarse=None)
        for a, b, flag in zip(arrays, before, flags):
            assert a.tobytes() == b.tobytes() and a.flags.writeable == flag
        public = [np.array(a, copy=True) for a in problem]
        with _threads(MAX_THREADS):
            nbattn.nadaraya_watson(*problem, exclude_self, dtype=dtype.__name__, rtol=1e-6)
        for a, b in zip(public, problem):
            assert a.tobytes() == b.tobytes()
