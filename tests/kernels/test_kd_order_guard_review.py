"""Hostile review of ``kd_order``'s guarded median selection (``_select_median`` counts
the keys its passes scan and, past 32 (b - a) + 256, sorts [lo, hi] with the stable merge
sort ``_sort_range``, NaN last).

Checked here: the kernel equals ``tests/naive.py::kd_order`` bit for bit on adversarial
columns (organ pipes and their relatives) holding NaN, +-inf, -0.0 / +0.0 ties,
subnormals and 1e305 magnitudes, in every dtype and layout, at n = 1..3 and leaf sizes
1 and > n, k = 1..8, with the guard at the root and normal data below, or deep in the
tree; the split is valid wherever the keys hold no NaN (checked independently of
``kd_nodes``); the input is never written; ``_sort_range`` is a stable sort (numpy's
stable argsort, NaN last); 1e6 organ-pipe keys split validly; and the callers
(``nadaraya_watson(rtol=)``, the local engine and ``LocalPolynomialRegressor(rtol=)``) on
an organ-pipe column stay within their stated bounds of the exact answers and repeat to
the bit.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.kernels import kd_order as kd
from tests import naive
from tests.strategies import seeds

from .._config import config_values


def _organ_pipe(n):
    m = n // 2
    return np.r_[np.arange(m), np.arange(n - m)[::-1]].astype(np.float64)


def _twin(z, leaf_keys):
    """The plain-Python twin's (order, starts, trace), its warnings (inf - inf) muted."""
    trace = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        order, starts = naive.kd_order(z, leaf_keys, trace)
    return order, starts, trace


def _check_split(z, leaf_keys, order, starts):
    """Independently of ``kd_nodes``: a permutation; the leaves at the node ranges that
    n alone fixes; at each node whose keys hold no NaN along the split axis (the first of
    the widest coordinates, a NaN extent never widest), the left half no larger than the
    right. Returns the number of nodes checked."""
    z = np.asarray(z, dtype=np.float64)
    n, k = z.shape
    leaf_keys = max(leaf_keys, 1)
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    zz = z[order]
    stack, leaf_firsts, checked = [(0, n)], [], 0
    while stack:
        a, b = stack.pop()
        if b - a <= leaf_keys:
            leaf_firsts.append(a)
            continue
        widest, dim = -1.0, 0
        for f in range(k):
            col = zz[a:b, f]
            col = col[~np.isnan(col)]
            with np.errstate(invalid="ignore", over="ignore"):
                extent = col.max() - col.min() if col.size else -np.inf
            if extent > widest:
                widest, dim = extent, f
        mid = (a + b) // 2
        left, right = zz[a:mid, dim], zz[mid:b, dim]
        if not (np.isnan(left).any() or np.isnan(right).any()):
            assert left.max() <= right.min(), (a, b, dim)
            checked += 1
        stack.append((mid, b))
        stack.append((a, mid))
    np.testing.assert_array_equal(np.append(leaf_firsts, n) if n else [0], starts)
    return checked


def _check(z, leaf_keys):
    """Kernel == twin bit for bit, the input unchanged, a valid split, every node within
    the budget. Returns the twin's trace."""
    before = np.array(z, copy=True)
    order, starts = kd.kd_order(z, leaf_keys)
    assert np.asarray(z).tobytes() == before.tobytes()  # bitwise: NaN payloads, -0.0
    ref_order, ref_starts, trace = _twin(z, leaf_keys)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(starts, ref_starts)
    _check_split(z, leaf_keys, order, starts)
    for a, b, scanned, _ in trace:
        assert scanned <= 32 * (b - a) + 256
    return trace


def _guarded(trace):
    return [(a, b) for a, b, _, guarded in trace if guarded]


# ---------------------------------------------------------------------------------------
# adversarial columns, drawn


def _shape(rng, n):
    kind = int(rng.integers(0, 9))
    if kind == 0:
        c = _organ_pipe(n)
    elif kind == 1:
        c = -_organ_pipe(n)
    elif kind == 2:
        c = np.r_[_organ_pipe(n // 2), _organ_pipe(n - n // 2)]
    elif kind == 3:
        c = np.floor(_organ_pipe(n) / rng.integers(1, 20))  # ties in runs
    elif kind == 4:
        c = np.exp(-(np.linspace(-3, 3, n) ** 2))  # a smooth organ pipe
    elif kind == 5:
        c = np.sin(np.linspace(0, int(rng.integers(1, 6)) * np.pi, n))
    elif kind == 6:
        c = rng.normal(size=n)
    elif kind == 7:
        c = np.tile(_organ_pipe(max(n // int(rng.integers(1, 5)), 1)), 5)[:n]
    else:
        c = np.abs(np.linspace(-1, 1, n))
    c = c * float(rng.choice([1.0, -1.0, 3.0, 1e-310, 1e305]))
    if rng.random() < 0.3:
        c[rng.random(n) < rng.choice([0.001, 0.01, 0.1])] = np.nan
    if rng.random() < 0.2:
        c[rng.random(n) < 0.01] = rng.choice([np.inf, -np.inf])
    if rng.random() < 0.3:
        c = np.where(c == 0, np.where(rng.random(n) < 0.5, 0.0, -0.0), c)
    return c


@settings(max_examples=60)
@given(
    seed=seeds,
    n=st.sampled_from([1, 2, 3, 5, 50, 300, 700, 1500]),
    k=st.integers(1, 4),
    leaf=st.sampled_from([1, 2, 7, 64, "n+1"]),
)
def test_drawn_adversarial_keys_match_the_twin(seed, n, k, leaf):
    rng = np.random.default_rng(seed)
    leaf_keys = n + 1 if leaf == "n+1" else leaf
    z = np.column_stack([_shape(rng, n) * rng.choice([1.0, 1e-3]) for _ in range(k)])
    _check(np.ascontiguousarray(z), leaf_keys)


def test_many_seeds_reach_the_guard_and_match_the_twin():
    """The drawn columns do reach the guard (not only the fast path) and agree there."""
    guarded = 0
    for seed in range(60):
        rng = np.random.default_rng([seed, 7])
        n = int(rng.choice([300, 700, 1200]))
        z = np.column_stack([_shape(rng, n) for _ in range(int(rng.integers(1, 3)))])
        guarded += len(_guarded(_check(z, int(rng.choice([1, 8, 64])))))
    assert guarded >= 10


# ---------------------------------------------------------------------------------------
# special values on an organ pipe (the guard fires at the root)

_N = 1000


def _special_columns():
    n = _N
    out = {}
    for where in ("first", "last", "mid", "pivot", "both_ends"):
        c = _organ_pipe(n)
        index = {"first": [0], "last": [-1], "mid": [n // 2], "pivot": [(n - 1) // 2],
                 "both_ends": [0, -1]}[where]  # fmt: skip
        c[index] = np.nan
        out[f"nan_{where}"] = c
    for frac in (0.0005, 0.002, 0.01):
        c = _organ_pipe(n)
        c[np.random.default_rng(int(frac * 1e4)).random(n) < frac] = np.nan
        out[f"nan_{frac}"] = c
    c = _organ_pipe(n)
    c[n // 2 - 1 : n // 2 + 1] = np.inf
    out["inf_peak"] = c
    c = c.copy()
    c[[0, -1]] = -np.inf
    out["inf_both"] = c
    c = _organ_pipe(n)
    out["signed_zero_floor"] = np.where(c < 3, np.where(np.arange(n) % 2 == 0, 0.0, -0.0), c)
    out["signed_zero_pipe"] = np.where(
        c % 4 == 0, np.where(np.arange(n) % 3 == 0, -0.0, 0.0), 1 + c // 4
    )
    out["subnormal"] = _organ_pipe(n) * 1e-320
    out["huge"] = _organ_pipe(n) * 1.7e305
    out["huge_signed"] = (_organ_pipe(n) - n / 4) * 5e305  # the extent overflows to inf
    out["ties_runs"] = np.floor(_organ_pipe(n) / 37)
    return out


@pytest.mark.parametrize("name", sorted(_special_columns()))
@pytest.mark.parametrize("k", [1, 2])
def test_special_values_on_an_organ_pipe(name, k):
    column = _special_columns()[name]
    cols = [column] + [np.arange(_N) * 1e-9 for _ in range(k - 1)]  # ties told apart
    for leaf_keys in (1, 8, 300):
        _check(np.ascontiguousarray(np.column_stack(cols)), leaf_keys)


def test_the_guard_fires_on_the_special_columns():
    """Not vacuous: most special columns do reach the guard at the root."""
    fired = [
        name
        for name, c in _special_columns().items()
        if (0, _N) in _guarded(_twin(c[:, None], 8)[2])
    ]
    assert len(fired) >= 12, fired  # not: nan_pivot, signed_zero_pipe, ties_runs


def test_all_nan_columns():
    n = 900
    for z in (
        np.full((n, 1), np.nan),
        np.full((n, 3), np.nan),
        np.column_stack([np.full(n, np.nan), _organ_pipe(n)]),  # the pipe is the widest
        np.column_stack([_organ_pipe(n), np.full(n, np.nan), -_organ_pipe(n)]),
    ):
        for leaf_keys in (1, 5, n + 1):
            _check(z, leaf_keys)


def test_signed_zero_ties_keep_their_order_through_the_guard():
    """A pipe of blocks of equal keys, -0.0 and +0.0 among them, the second coordinate a
    label: the guard's stable sort must leave ties in the twin's order (the labels
    tell it)."""
    n = 1200
    pipe = _organ_pipe(n)
    key = np.floor(pipe / 4) - 50.0  # runs of 4 equal keys; the 0 runs hold -0.0 and +0.0
    key = np.where(key == 0, np.where(np.arange(n) % 2 == 0, -0.0, 0.0), key)
    z = np.column_stack([key, np.arange(n) * 1e-12])
    trace = _check(z, 16)
    assert (0, n) in _guarded(trace)


# ---------------------------------------------------------------------------------------
# dtypes, layouts, tiny n, many k


def _pipe_keys(n, k):
    return np.column_stack([np.roll(_organ_pipe(n), 37 * f) * (1.0 - 0.1 * f) for f in range(k)])


@pytest.mark.parametrize(
    "make",
    [
        lambda z: z.astype(np.float32),
        lambda z: (z * 2.0**53 + np.arange(z.shape[0])[:, None] % 3).astype(np.int64),  # rounds
        lambda z: z.astype(np.uint64) * np.uint64(2**54),
        lambda z: z.astype(np.int8),  # wraps: a sawtooth of pipes
        lambda z: z % 3 == 0,
        lambda z: np.asfortranarray(z),
        lambda z: np.repeat(np.repeat(z, 2, axis=0), 2, axis=1)[::2, ::2],
        lambda z: z[::-1],
        lambda z: np.broadcast_to(z[:1], z.shape),  # zero strides, read-only
    ],
    ids=[
        "float32",
        "int64_2^53",
        "uint64",
        "int8",
        "bool",
        "fortran",
        "strided",
        "negstride",
        "broadcast",
    ],  # fmt: skip
)
@pytest.mark.parametrize("k", [1, 3])
def test_dtypes_and_layouts_equal_the_float64_answer(make, k):
    z = make(_pipe_keys(1200, k))
    reference = np.ascontiguousarray(z, dtype=np.float64)
    order, starts = kd.kd_order(z, 16)
    ref_order, ref_starts = kd.kd_order(reference, 16)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(starts, ref_starts)
    _check(reference, 16)


def test_read_only_input():
    z = _pipe_keys(1000, 2)
    z.setflags(write=False)
    _check(z, 4)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("k", range(1, 9))
def test_tiny_n_and_many_k(n, k):
    rng = np.random.default_rng(n * 10 + k)
    for z in (rng.normal(size=(n, k)), np.full((n, k), np.nan), np.zeros((n, k)) * -1):
        for leaf_keys in (1, 2, n, n + 1, 10**9, 0, -5):
            if leaf_keys < 1:  # the twin loops on leaf_keys < 1; the kernel takes 1
                np.testing.assert_array_equal(
                    np.concatenate(kd.kd_order(z, leaf_keys)),
                    np.concatenate(kd.kd_order(z, 1)),
                )
                continue
            _check(z, leaf_keys)


@pytest.mark.parametrize("k", range(1, 9))
def test_many_pipes_many_k(k):
    z = _pipe_keys(1500, k)
    for leaf_keys in (1, 33):
        _check(z, leaf_keys)


def test_no_keys_kernel():
    order, starts = kd.kd_order(np.empty((0, 3)), 1)
    assert order.shape == (0,) and starts.tolist() == [0]


def test_no_keys_twin_matches_the_kernel():
    z = np.empty((0, 2))
    np.testing.assert_array_equal(naive.kd_order(z, 1)[1], kd.kd_order(z, 1)[1])


# ---------------------------------------------------------------------------------------
# where the guard fires: the root then normal data, deep in the tree


def test_guard_at_the_root_then_normal_data_below():
    """A wide organ pipe (it splits the root, the guard sorts it) beside random narrower
    coordinates: below the root the halves are sorted along the pipe, so the children
    split normally, without the guard."""
    for seed in range(8):
        rng = np.random.default_rng(seed)
        n = int(rng.choice([1000, 2001]))
        z = np.column_stack([_organ_pipe(n) * 10, rng.normal(size=(n, 2)) * 50])
        trace = _check(z, int(rng.choice([1, 16])))
        assert _guarded(trace) == [(0, n)], _guarded(trace)


def test_guard_deep_in_the_tree():
    """The root splits two clusters (sorted, no guard); each half is an organ pipe along
    the other coordinate, which the guard sorts at depth 1 or below."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        n = 2 * int(rng.integers(500, 900))
        c0 = np.r_[np.zeros(n // 2), np.full(n // 2, 1e6)]
        c1 = np.r_[_organ_pipe(n // 2), _organ_pipe(n // 2)] + rng.integers(0, 2) * 0.5
        trace = _check(np.column_stack([c0, c1]), int(rng.choice([1, 8])))
        nodes = _guarded(trace)
        assert nodes and (0, n) not in nodes, nodes


def test_the_budget_boundary():
    """McIlroy's killer of the middle pivot at 784 keys spends the root's budget exactly
    (32 n + 256 keys scanned, then the next pass is refused): the guard's comparison
    (> budget, not >=) decides the order there, and kernel and twin must agree on it."""
    from tests.kernels.test_kd_order_worst_case import _middle_pivot_killer

    n = 784
    trace = _check(_middle_pivot_killer(n)[:, None], n - 1)
    assert trace[0] == (0, n, 32 * n + 256, True)
    for leaf_keys in (1, 16):
        _check(_middle_pivot_killer(n)[:, None], leaf_keys)


# ---------------------------------------------------------------------------------------
# _sort_range and _select_median on their own


def _stable_rank(values):
    """numpy's stable argsort: NaN last, -0.0 == +0.0, ties in their present order."""
    return np.argsort(values, kind="stable")


@pytest.mark.parametrize(
    "kind",
    [
        "sorted",
        "reverse",
        "all_equal",
        "ties",
        "signed_zeros",
        "nan",
        "all_nan",
        "inf",
        "pipe",
        "random",
    ],  # fmt: skip
)
@pytest.mark.parametrize("m", [0, 1, 2, 3, 7, 64, 65, 1000, 1023, 1025])
def test_sort_range_is_a_stable_sort(kind, m):
    rng = np.random.default_rng(m)
    values = {
        "sorted": np.arange(m, dtype=float),
        "reverse": np.arange(m, dtype=float)[::-1],
        "all_equal": np.full(m, 2.5),
        "ties": rng.integers(0, 3, m).astype(float),
        "signed_zeros": np.where(rng.random(m) < 0.5, 0.0, -0.0),
        "nan": np.where(rng.random(m) < 0.3, np.nan, rng.integers(0, 4, m).astype(float)),
        "all_nan": np.full(m, np.nan),
        "inf": rng.choice([-np.inf, np.inf, 0.0, -0.0, np.nan], m),
        "pipe": _organ_pipe(m),
        "random": rng.normal(size=m),
    }[kind].copy()
    pad = 5  # sort an inner range [lo, stop) of a longer array: the rest must stay put
    n = m + 2 * pad
    full = np.r_[rng.normal(size=pad), values, rng.normal(size=pad)]
    zc = np.ascontiguousarray(np.stack([np.arange(n) * 1.0, full, -np.arange(n) * 1.0]))
    order = np.arange(n) + 100
    before = zc.copy()
    kd._sort_range(order, zc, pad, pad + m, 1)
    rank = pad + _stable_rank(values)
    expect = np.r_[np.arange(pad), rank, np.arange(pad + m, n)]
    np.testing.assert_array_equal(order, expect + 100)
    np.testing.assert_array_equal(zc, before[:, expect])  # every coordinate moved alike
    # -0.0 / +0.0 kept where they were: compare bit patterns
    assert np.array_equal(zc[1].view(np.int64), before[1, expect].view(np.int64))


@pytest.mark.parametrize("seed", range(12))
def test_select_median_any_mid_any_range(seed):
    """The guard's sort keeps the selection contract for any mid in any sub-range (the
    kernel only asks for the middle of the whole node)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(600, 3000))
    column = [_organ_pipe(n), np.floor(_organ_pipe(n) / 7), -_organ_pipe(n), rng.normal(size=n)][
        seed % 4
    ]
    zc = np.ascontiguousarray(np.stack([column, np.arange(n) * 1.0]))
    order = np.arange(n)
    a = int(rng.integers(0, n // 4))
    b = int(rng.integers(3 * n // 4, n + 1))
    mid = int(rng.integers(a, b))
    kd._select_median(order, zc, a, b, mid, 0, kd._SCAN_PER_KEY)
    np.testing.assert_array_equal(zc[0], column[order])
    np.testing.assert_array_equal(zc[1], order * 1.0)
    np.testing.assert_array_equal(np.sort(order[a:b]), np.arange(a, b))
    np.testing.assert_array_equal(order[:a], np.arange(a))
    np.testing.assert_array_equal(order[b:], np.arange(b, n))
    assert zc[0, mid] == np.sort(column[a:b])[mid - a]
    assert zc[0, a:mid].max(initial=-np.inf) <= zc[0, mid] <= zc[0, mid + 1 : b].min(initial=np.inf)


# ---------------------------------------------------------------------------------------
# huge n


@pytest.mark.parametrize("k", [1, 3])
def test_a_million_keys_of_organ_pipe(k):
    """1e6 organ-pipe keys (the unguarded selection: minutes) finish; the split is valid
    at every node (checked on kd_nodes' boxes, vectorised) and the input is untouched."""
    n = 1_000_000
    z = _pipe_keys(n, k)
    z[:, 1:] *= 0.5
    before = z.copy()
    order, starts = kd.kd_order(z, 1 if k == 1 else 64)
    np.testing.assert_array_equal(z, before)
    leaf_keys = 1 if k == 1 else 64
    assert np.array_equal(np.sort(order), np.arange(n))
    z_t = np.ascontiguousarray(z[order].T)
    start, stop, right, lo, hi = kd.kd_nodes(z_t, leaf_keys)
    inner = np.flatnonzero(right >= 0)
    dim = np.argmax(hi[inner] - lo[inner], axis=1)  # finite keys: no NaN extent
    assert np.all(hi[inner + 1, dim] <= lo[right[inner], dim])
    np.testing.assert_array_equal(np.append(start[right < 0], n), starts)
    assert np.all(stop[right < 0] - start[right < 0] <= leaf_keys)


# ---------------------------------------------------------------------------------------
# callers end to end on an organ-pipe column


def _pipe_data(n, seed):
    rng = np.random.default_rng(seed)
    x = _organ_pipe(n) / n + rng.integers(0, 2) * 1e-7  # ranks, each value twice
    y = np.sin(12 * x) + 0.1 * rng.normal(size=n) + 2.0
    return rng, x, y


@pytest.mark.parametrize("seed", range(3))
def test_nadaraya_watson_rtol_on_an_organ_pipe(monkeypatch, seed):
    from nbattn.smoothing import regression

    took_tree = []
    real = regression.pool_within_rtol

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        took_tree.append(result is not None)
        return result

    monkeypatch.setattr(regression, "pool_within_rtol", spy)
    # the guarded split on the real path: trying the tree is allowed whatever it costs
    # (the sample still decides), as the overhead guard is not what is tested here
    monkeypatch.setattr(config, "TREE_MAX_OVERHEAD_SHARE", 10**9)
    rng, x, y = _pipe_data(6000, seed)
    assert (0, 6000) in _guarded(_twin(x[:, None], 256)[2])  # the keys' tree is guarded
    rtol = 1e-6
    for queries, exclude_self in ((rng.random(4000) * 0.5, False), (x, True)):
        exact = nbattn.nadaraya_watson(queries, x, y, bandwidth=0.002, exclude_self=exclude_self)
        first = nbattn.nadaraya_watson(
            queries, x, y, bandwidth=0.002, exclude_self=exclude_self, rtol=rtol
        )
        again = nbattn.nadaraya_watson(
            queries, x, y, bandwidth=0.002, exclude_self=exclude_self, rtol=rtol
        )
        np.testing.assert_array_equal(first, again)
        assert took_tree[-1] and took_tree[-2]  # the pruned tree path, not the fallback
        spread = np.abs(y[None, :] - exact[:, None]).max(axis=1)
        bound = rtol / (1 - rtol) * spread + 1e-13 * np.abs(y).max()
        assert np.all(np.abs(first - exact) <= bound)


@pytest.mark.parametrize("degree", [0, 1])
def test_local_engine_rtol_on_an_organ_pipe(degree):
    """The local engine's stated bound (``tests/local/test_rtol.py::_check_within_bound``:
    the normaliser within rtol, the fit within 2 rtol / (1 - rtol) ||g||_1 max |residual|,
    repeatable to the bit) on keys whose widest column is an organ pipe."""
    from nbattn.local.leaves import tree_layout
    from nbattn.local.problem import prepare
    from tests.local.test_rtol import _check_within_bound

    rng, x, y = _pipe_data(3000, degree)
    X = np.column_stack([x, rng.random(3000)])
    Q = np.column_stack([rng.random(150) * 0.5, rng.random(150)])
    with config_values(LOCAL_TREE_MIN_KEYS=1, LOCAL_TREE_MAX_SHARE=100):
        problem = prepare(Q, X, y, np.array([0.003, 0.3]), degree, rtol=1e-6)
        assert tree_layout(problem).key_order is not None
        assert (0, 3000) in _guarded(_twin(problem.keys_cont_t.T.copy(), 64)[2])
        _check_within_bound(problem, 1e-6)


@pytest.mark.parametrize("degree", [0, 1])
def test_local_polynomial_regressor_rtol_on_an_organ_pipe(monkeypatch, degree):
    from nbattn.local import engine

    pruned_layouts = []
    real = engine.tree_layout

    def spy(problem):
        layout = real(problem)
        pruned_layouts.append(layout.key_order is not None)
        return layout

    monkeypatch.setattr(engine, "tree_layout", spy)
    rng, x, y = _pipe_data(5000, degree + 10)
    X = np.column_stack([x, rng.random(5000)])
    yy = y + X[:, 1]
    Q = np.column_stack([rng.random(1500) * 0.5, rng.random(1500)])
    widths = [0.003, 0.3]
    exact = nbattn.LocalPolynomialRegressor(degree=degree, bandwidth=widths).fit(X, yy).predict(Q)
    model = nbattn.LocalPolynomialRegressor(degree=degree, bandwidth=widths, rtol=1e-6).fit(X, yy)
    first, again = model.predict(Q), model.predict(Q)
    assert any(pruned_layouts)  # the leaves were used (the spy sees the engine's call)
    np.testing.assert_array_equal(first, again)
    # the stated bound needs the pruned equivalent kernel (checked on the engine above);
    # here: 2 rtol / (1 - rtol) max|y - fit| times a generous ||g||_1 of 50
    spread = np.abs(yy[None, :] - exact[:, None]).max(axis=1)
    assert np.all(np.abs(first - exact) <= 2e-6 / (1 - 1e-6) * 50 * spread + 1e-12)


@pytest.mark.parametrize("leaf_keys", [0, -5])
def test_leaf_keys_below_one_act_as_one_in_the_twin_too(leaf_keys):
    z = np.random.default_rng(3).normal(size=(9, 2))
    got, want = kd.kd_order(z, leaf_keys), naive.kd_order(z, leaf_keys)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[1], naive.kd_order(z, 1)[1])
