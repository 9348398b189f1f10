"""``kd_order``'s guarded median selection: adversarial columns (organ-pipe, sawtooth, a
killer of the middle pivot, median-of-3 killer, sorted, constant, few values) take
O(n log n) work and give the plain-Python twin's order and a valid split, while normal
keys never reach the guard (the order is the unguarded selection's, bit for bit)."""

import math

import numpy as np
import pytest

from nbattn.kernels import kd_order
from tests import naive

#: A budget per key no selection reaches: the plain (unguarded) selection, as before the guard
UNGUARDED = 2**40


def _unguarded_root_scan(column):
    """Keys scanned by the unguarded selection at the root of a 1-D column (the twin's
    trace; leaves of n - 1 keys, so the root is the only node split)."""
    trace = []
    naive.kd_order(column[:, None], column.size - 1, trace, scan_per_key=UNGUARDED)
    return trace[0][2]


# ---------------------------------------------------------------------------------------
# adversarial columns


def _organ_pipe(n):
    m = n // 2
    return np.r_[np.arange(m), np.arange(n - m)[::-1]].astype(np.float64)


def _sawtooth(n, period=97):
    return (np.arange(n) % period).astype(np.float64)


def _middle_pivot_killer(n):
    """Values on which the unguarded selection's root takes a pass per key: the pivot of
    each pass (the middle element) is made the largest value left (McIlroy's lazy
    adversary: keys not yet compared as a pivot are 'gas', below every pivot). Simulated
    until the guard's budget is spent, then the gas gets increasing values."""
    arr = list(range(n))  # element ids at positions
    value = [None] * n
    next_high = n - 1
    lo, hi, mid, scanned = 0, n - 1, n // 2, 0
    while lo < hi and scanned <= 32 * n + 256:
        scanned += hi - lo + 1
        p = arr[(lo + hi) // 2]
        if value[p] is None:
            value[p] = next_high
            next_high -= 1
        pivot = value[p]
        i, j = lo, hi
        while i <= j:
            while value[arr[i]] is None or value[arr[i]] < pivot:
                i += 1
            while value[arr[j]] is not None and value[arr[j]] > pivot:
                j -= 1
            if i <= j:
                arr[i], arr[j] = arr[j], arr[i]
                i += 1
                j -= 1
        if mid <= j:
            hi = j
        elif mid >= i:
            lo = i
        else:
            break
    gas = 0
    for e in range(n):
        if value[e] is None:
            value[e] = gas
            gas += 1
    return np.array(value, dtype=np.float64)


def _median_of_3_killer(n):
    """Musser's sequence against median-of-3 quicksort (n a multiple of 4)."""
    n -= n % 4
    half = n // 2
    out = np.empty(n)
    for i in range(1, half + 1):
        if i % 2 == 1:
            out[i - 1] = i
            out[i] = half + i
        out[half + i - 1] = 2 * i
    return out


def _columns(n):
    rng = np.random.default_rng(n)
    return {
        "organ_pipe": _organ_pipe(n),
        "organ_pipe_down": -_organ_pipe(n),
        "sawtooth": _sawtooth(n),
        "middle_pivot_killer": _middle_pivot_killer(n),
        "median_of_3_killer": _median_of_3_killer(n),
        "sorted": np.arange(n, dtype=np.float64),
        "reverse": np.arange(n, dtype=np.float64)[::-1].copy(),
        "all_equal": np.full(n, 2.5),
        "few_values": np.round(rng.normal(size=n) * 0.3),
        "organ_pipe_nan": np.where(np.arange(n) % 13 == 0, np.nan, _organ_pipe(n)),
    }


def _keys(column, k):
    """k coordinates: the column first (the widest), then narrower ones."""
    n = column.shape[0]
    cols = [column]
    for f in range(1, k):
        cols.append(np.roll(_organ_pipe(n), 37 * f) * 1e-3)
    return np.ascontiguousarray(np.stack(cols, axis=1))


_assert_valid = naive.assert_valid_kd_split


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("n", [700, 2000])
def test_adversarial_columns_match_the_twin_and_split_validly(n, k):
    for name, column in _columns(n).items():
        z = _keys(column, k)
        for leaf_keys in (1, 16):
            order, starts = kd_order.kd_order(z, leaf_keys)
            trace = []
            ref_order, ref_starts = naive.kd_order(z, leaf_keys, trace)
            np.testing.assert_array_equal(order, ref_order, err_msg=f"{name} {leaf_keys}")
            np.testing.assert_array_equal(starts, ref_starts, err_msg=f"{name} {leaf_keys}")
            if "nan" not in name:
                _assert_valid(z, leaf_keys, order, starts)
            # the work of the passes stays within the budget at every node: O(n log n)
            for a, b, scanned, _ in trace:
                assert scanned <= 32 * (b - a) + 256
            total = sum(scanned for _, _, scanned, _ in trace)
            assert total <= (32 * n + 256) * math.ceil(math.log2(n)), name


@pytest.mark.parametrize("n", [700, 3000])
def test_the_guard_fires_where_the_old_selection_overran(n):
    """The unguarded root selection scans ~n^2 / 4 keys of an organ pipe; the killer is
    built to keep it going a key per pass past the budget. The guarded one sorts instead,
    within the budget."""
    columns = _columns(n)
    assert _unguarded_root_scan(columns["organ_pipe"]) > n * n / 8
    assert _unguarded_root_scan(columns["middle_pivot_killer"]) > 32 * n + 256
    for name in ("organ_pipe", "middle_pivot_killer"):
        trace = []
        naive.kd_order(columns[name][:, None], 16, trace)
        a, b, scanned, guarded = trace[0]  # the root
        assert (a, b) == (0, n) and guarded and scanned <= 32 * n + 256, name


@pytest.mark.parametrize("k", [1, 3])
def test_large_organ_pipe(k):
    """2e5 keys (the unguarded selection: seconds per call, 1e6 minutes): a valid split,
    and at a smaller n of the same family the twin's order."""
    n = 200_000
    z = _keys(_organ_pipe(n), k)
    order, starts = kd_order.kd_order(z, 256)
    _assert_valid(z, 256, order, starts)
    small = _keys(_organ_pipe(20_000), k)
    order, starts = kd_order.kd_order(small, 256)
    ref_order, ref_starts = naive.kd_order(small, 256)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(starts, ref_starts)


def test_large_sawtooth_and_killers_are_valid():
    n = 50_000
    for column in (_sawtooth(n), _sawtooth(n, 4099), _median_of_3_killer(n)):
        z = _keys(column, 2)
        order, starts = kd_order.kd_order(z, 64)
        _assert_valid(z, 64, order, starts)


def test_select_median_reports_the_guard():
    n = 5001
    for column, guarded in (
        (_organ_pipe(n), True),
        (np.random.default_rng(0).normal(size=n), False),
    ):
        zc = np.ascontiguousarray(np.stack([column, -column]))
        order = np.arange(n)
        mid = n // 2
        assert kd_order._select_median(order, zc, 0, n, mid, 0, kd_order._SCAN_PER_KEY) == guarded
        np.testing.assert_array_equal(zc[0], column[order])  # the columns moved with order
        np.testing.assert_array_equal(zc[1], -column[order])
        assert zc[0, mid] == np.sort(column)[mid]
        assert zc[0, :mid].max() <= zc[0, mid] <= zc[0, mid + 1 :].min()


def _normal_keys(kind, n, k, rng):
    if kind == "normal":
        return rng.normal(size=(n, k)) * rng.uniform(0.1, 10.0, size=k)
    if kind == "uniform":
        return rng.random((n, k))
    if kind == "clustered":
        centres = rng.normal(size=(20, k)) * 10
        return centres[rng.integers(0, 20, n)] + rng.normal(size=(n, k)) * rng.uniform(0.01, 1)
    if kind == "rounded":
        return np.round(rng.normal(size=(n, k)) * 2)
    if kind == "few_values":
        return rng.integers(0, 3, (n, k)).astype(np.float64)
    if kind == "heavy_tailed":
        return rng.standard_cauchy(size=(n, k))
    if kind == "mixed":
        z = rng.normal(size=(n, k))
        z[:, 0] = rng.integers(0, 4, n)
        return z
    if kind == "nan":
        z = rng.normal(size=(n, k))
        z[rng.random((n, k)) < 0.2] = np.nan
        return z
    if kind == "sorted":
        return np.sort(rng.normal(size=(n, k)), axis=0)
    if kind == "reverse_sorted":
        return np.sort(rng.normal(size=(n, k)), axis=0)[::-1]
    if kind == "sorted_ties":
        return np.sort(np.round(rng.normal(size=(n, k)) * 2), axis=0)
    if kind == "all_equal":
        return np.full((n, k), -1.5)
    raise KeyError(kind)


_NORMAL_KINDS = [
    "normal",
    "uniform",
    "clustered",
    "rounded",
    "few_values",
    "heavy_tailed",
    "mixed",
    "nan",
    "sorted",
    "reverse_sorted",
    "sorted_ties",
    "all_equal",
]


@pytest.mark.parametrize("kind", _NORMAL_KINDS)
def test_normal_keys_never_reach_the_guard(kind):
    """Many draws, sizes, widths and leaf sizes: the order and leaves are the unguarded
    selection's bit for bit (the guard only counted)."""
    for seed in range(30):
        rng = np.random.default_rng([seed, len(kind)])
        n = int(rng.choice([2, 7, 60, 500, 3000, 20_000]))
        k = int(rng.integers(1, 6))
        z = np.ascontiguousarray(_normal_keys(kind, n, k, rng))
        for leaf_keys in (1, 8, 256):
            order, starts = kd_order.kd_order(z, leaf_keys)
            ref_order, ref_starts = kd_order.kd_order(z, leaf_keys, UNGUARDED)
            np.testing.assert_array_equal(order, ref_order, err_msg=f"{seed} {n} {k}")
            np.testing.assert_array_equal(starts, ref_starts, err_msg=f"{seed} {n} {k}")


def test_normal_keys_stay_far_below_the_budget():
    """The twin's count of the keys each node's passes scanned: random and tied keys keep
    well under the budget (32 per key + 256) at every node, the guard never sorts."""
    worst = 0.0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        kind = _NORMAL_KINDS[seed % len(_NORMAL_KINDS)]
        z = np.ascontiguousarray(_normal_keys(kind, 400, int(rng.integers(1, 4)), rng))
        trace = []
        naive.kd_order(z, 1, trace)
        for a, b, scanned, guarded in trace:
            assert not guarded
            worst = max(worst, scanned / (b - a))
    assert worst < 16
