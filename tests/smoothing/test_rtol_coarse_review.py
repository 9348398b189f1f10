"""Hostile review of the coarse exponential on the k-d tree path.

``nadaraya_watson(..., rtol=)`` in float64 from ``COARSE_MIN_RTOL`` (1.6e-7) on sums the
kept leaves with ``coarse_exp`` (degree 7, claimed within ``COARSE_EXP_RTOL`` = 1e-8
relative) and prunes with (rtol - eps) / (1 + eps). The public contract, per query row
and output column (S the exact normaliser, f the exact prediction):

    (1 - rtol) S <= Shat <= (1 + 1e-8) S          (the 1e-8 only where coarse)
    |fhat - f| <= rtol / (1 - rtol) * max_j |v_j - f|

on top of the rounding of the exact path. Every test below draws many problems (seeds
or hypothesis) and checks that contract against the plain-NumPy reference, at and on
both sides of the switch, at hostile scales of keys and values, with exclude_self, far
queries, duplicates, one key, many output columns, and on a bundled public table; and
checks ``coarse_exp`` itself at the points hostile to its range reduction.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import nbattn
from nbattn import config
from nbattn.dispatch.device import kernels_for
from nbattn.kernels.fastmath import COARSE_EXP_RTOL, coarse_exp, fast_exp
from nbattn.kernels.tree_pool import COARSE_MIN_RTOL, coarse_for
from nbattn.smoothing import regression
from nbattn.smoothing.pruned import tree_layout
from tests import naive

from .._config import config_values

_FORCE = {
    "TREE_LEAF_KEYS": 4,
    "TREE_MIN_KEYS": 1,
    "TREE_MAX_COST_SHARE": 10**9,
    "TREE_MAX_OVERHEAD_SHARE": 10**9,
}

_BELOW = float(np.nextafter(COARSE_MIN_RTOL, 0.0))
_ABOVE = float(np.nextafter(COARSE_MIN_RTOL, 1.0))
RTOLS = [_BELOW, COARSE_MIN_RTOL, 1.6e-7, _ABOVE, 1e-6, 1e-3, 0.5, 0.999]


# ---------------------------------------------------------------------------- helpers
def _tree_nw(queries, keys, values, h, rtol, dtype, exclude_self=False, leaf=4):
    """The tree path forced at any size; run twice, bit-identical, inputs untouched."""
    before = [np.array(a, copy=True) for a in (queries, keys, values, h)]
    force = dict(_FORCE, TREE_LEAF_KEYS=leaf)
    with config_values(**force):
        runs = [
            nbattn.nadaraya_watson(
                queries,
                keys,
                values,
                h,
                exclude_self,
                dtype=np.dtype(dtype).name,
                rtol=rtol,
                return_lse=True,
            )
            for _ in range(2)
        ]
    for a, b in zip(before, (queries, keys, values, h)):
        assert np.array_equal(a, b, equal_nan=True)
    (out, lse), (out2, lse2) = runs
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2), "two calls differ"
    assert out.dtype == np.dtype(dtype)
    return out, lse


def _check_contract(out, lse, queries, keys, values, h, rtol, dtype, exclude_self=False):
    """The public contract, per row and column, with a rounding slack per column."""
    dtype = np.dtype(dtype)
    v = np.asarray(values, dtype=np.float64)
    v2 = v.reshape(v.shape[0], -1)
    out2 = np.asarray(out, dtype=np.float64).reshape(out.shape[0], -1)
    exact = np.asarray(naive.nadaraya_watson(queries, keys, v2, h, exclude_self)).reshape(
        out2.shape
    )
    exact_lse = naive.nadaraya_watson_lse(queries, keys, h, exclude_self)
    n_keys = v2.shape[0]
    assert np.all(np.isfinite(out2)), "non-finite prediction"
    assert np.all(np.isfinite(lse)), "non-finite lse"
    # all in units of each column's max |v| (so that values near the float64 maximum do
    # not overflow the differences); a zero column stays in its own units
    top = np.abs(v2).max(axis=0)
    unit = np.where(top > 0.0, top, 1.0)
    vs, fs, os_ = v2 / unit, exact / unit, out2 / unit
    # max_j |v_jc - f_ic| over the keys each row sums (not its own key under exclude_self)
    diff = np.abs(vs[None, :, :] - fs[:, None, :])
    if exclude_self:
        idx = np.arange(out2.shape[0])
        diff[idx, idx, :] = 0.0
    spread = diff.max(axis=1)
    rel = 3e-4 if dtype == np.float32 else 1e-11
    tiny = 8 * n_keys * (1e-45 if dtype == np.float32 else 5e-324) / unit
    slack = rel + tiny
    allowed = rtol / (1.0 - rtol) * spread + slack[None, :]
    err = np.abs(os_ - fs)
    worst = np.unravel_index(np.argmax(err - allowed), err.shape)
    assert np.all(err <= allowed), (
        f"prediction bound broken at row/col {worst}: |fhat - f| = {err[worst]!r}, "
        f"allowed {allowed[worst]!r} (rtol {rtol!r}, spread {spread[worst]!r})"
    )
    coarse = dtype == np.float64 and rtol >= COARSE_MIN_RTOL
    lse_rel = 3e-4 if dtype == np.float32 else 1e-12
    lse_slack = lse_rel * (1.0 + np.abs(exact_lse) + math.log(max(n_keys, 1)))
    up = lse - exact_lse
    hi = (COARSE_EXP_RTOL if coarse else 0.0) + lse_slack
    lo = np.log1p(-rtol) - lse_slack
    i = int(np.argmax(up - hi))
    assert np.all(up <= hi), f"lse too high at row {i}: +{up[i]!r}, allowed +{hi[i]!r}"
    i = int(np.argmin(up - lo))
    assert np.all(up >= lo), f"lse too low at row {i}: {up[i]!r}, allowed {lo[i]!r}"


def _geometry(kind, rng, n_queries, n_keys, d):
    if kind == "clustered":
        centres = rng.uniform(-5, 5, (4, d))
        keys = centres[rng.integers(0, 4, n_keys)] + 0.2 * rng.normal(size=(n_keys, d))
    elif kind == "duplicates":
        keys = rng.normal(size=(3, d))[rng.integers(0, 3, n_keys)]
    elif kind == "line":  # a narrow width over many keys: most leaves pruned
        keys = np.zeros((n_keys, d))
        keys[:, 0] = np.sort(rng.uniform(-20, 20, n_keys))
    else:
        keys = rng.uniform(-2, 2, (n_keys, d))
    queries = keys[rng.integers(0, n_keys, n_queries)] + 0.3 * rng.normal(size=(n_queries, d))
    if kind == "far":
        queries[::2] += 1e4 * (1.0 + rng.uniform(size=(queries[::2].shape[0], d)))
    h = rng.uniform(0.15, 0.6) * np.ones(d)
    return queries, keys, h


def _values(kind, rng, n_keys, p, dtype):
    base = rng.normal(size=(n_keys, p))
    if kind == "normal":
        return base + 3.0
    if kind == "mixed":  # signs mixed, mean near zero, one column a thousand times larger
        out = base * np.where(rng.uniform(size=(n_keys, p)) < 0.5, -1.0, 1.0)
        out[:, 0] *= 1e3
        return out
    if kind == "constant":
        return np.full((n_keys, p), -7.25)
    if kind == "huge":
        return base * (1e300 if dtype == np.float64 else 1e37)
    if kind == "tiny":
        return base * (1e-300 if dtype == np.float64 else 1e-36)
    if kind == "subnormal":
        return base * (1e-310 if dtype == np.float64 else 1e-40)
    if kind == "near_max":  # sums of these overflow without the values' rescaling
        top = np.finfo(dtype).max
        return np.clip(base, -1, 1) * 0.9 * float(top)
    raise AssertionError(kind)


GEOMS = ["uniform", "clustered", "duplicates", "line", "far"]
VALUES = ["normal", "mixed", "constant", "huge", "tiny", "subnormal", "near_max"]


@pytest.fixture
def tree_runs(monkeypatch):
    """Whether each call of the public path ran the tree (``pool_within_rtol`` spied)."""
    ran = []
    real = regression.pool_within_rtol

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        ran.append(result is not None)
        return result

    monkeypatch.setattr(regression, "pool_within_rtol", spy)
    return ran


# ------------------------------------------------------------- the public contract
@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-6, 0.5])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_contract_over_seeds_geometries_and_values(rtol, dtype):
    """Every geometry x value kind, at and on both sides of the switch (the property test
    below draws the other tolerances, the leaf sizes and more seeds)."""
    for geom in GEOMS:
        for vkind in VALUES:
            for seed in range(1):
                rng = np.random.default_rng([seed, GEOMS.index(geom), VALUES.index(vkind)])
                d = int(rng.integers(1, 4))
                p = int(rng.integers(1, 3))
                n_keys = int(rng.integers(1, 200))
                n_q = int(rng.integers(1, 30))
                queries, keys, h = _geometry(geom, rng, n_q, n_keys, d)
                values = _values(vkind, rng, n_keys, p, dtype)
                out, lse = _tree_nw(queries, keys, values, h, rtol, dtype)
                _check_contract(out, lse, queries, keys, values, h, rtol, dtype)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    geom=st.sampled_from(GEOMS),
    vkind=st.sampled_from(VALUES),
    rtol=st.sampled_from(RTOLS),
    dtype=st.sampled_from([np.float64, np.float32]),
    n_keys=st.integers(1, 400),
    n_q=st.integers(1, 40),
    d=st.integers(1, 5),
    p=st.integers(1, 3),
    leaf=st.sampled_from([1, 2, 4, 16]),
)
def test_contract_property(seed, geom, vkind, rtol, dtype, n_keys, n_q, d, p, leaf):
    rng = np.random.default_rng(seed)
    queries, keys, h = _geometry(geom, rng, n_q, n_keys, d)
    values = _values(vkind, rng, n_keys, p, dtype)
    out, lse = _tree_nw(queries, keys, values, h, rtol, dtype, leaf=leaf)
    _check_contract(out, lse, queries, keys, values, h, rtol, dtype)


@pytest.mark.parametrize("scale", [1e150, 1e-150])
@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-6, 1e-3, 0.5, 0.999])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_keys_and_queries_at_extreme_scales(scale, rtol, dtype):
    """Keys, queries and h all multiplied by 1e+-150 (the scaled problem is unchanged)."""
    for seed in range(4):
        rng = np.random.default_rng([seed, 150])
        geom = GEOMS[seed % len(GEOMS)]
        d = 1 + seed % 3
        queries, keys, h = _geometry(geom, rng, 25, 150, d)
        values = _values(VALUES[seed % 3], rng, 150, 2, dtype)
        out, lse = _tree_nw(queries * scale, keys * scale, values, h * scale, rtol, dtype)
        _check_contract(out, lse, queries, keys, values, h, rtol, dtype)


@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-6, 1e-3, 0.5, 0.999])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_exclude_self(rtol, dtype):
    for seed in range(5):
        rng = np.random.default_rng([seed, 5])
        geom = ["uniform", "clustered", "duplicates", "line"][seed % 4]
        n = int(rng.integers(2, 250))
        _, keys, h = _geometry(geom, rng, 1, n, 1 + seed % 3)
        values = _values(VALUES[seed % len(VALUES)], rng, n, 1 + seed % 2, dtype)
        out, lse = _tree_nw(keys, keys, values, h, rtol, dtype, exclude_self=True)
        _check_contract(out, lse, keys, keys, values, h, rtol, dtype, exclude_self=True)


@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-3, 0.999])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_one_key(rtol, dtype):
    """One key: every prediction is its value exactly, lse its score."""
    for seed in range(10):
        rng = np.random.default_rng([seed, 1])
        d = 1 + seed % 3
        keys = rng.normal(size=(1, d))
        queries = rng.normal(size=(7, d)) * [1.0, 1e2, 1e4, 1e6][seed % 4]
        values = rng.normal(size=(1, 3)) * 10.0 ** rng.integers(-30, 30)
        h = np.full(d, 0.5)
        out, lse = _tree_nw(queries, keys, values, h, rtol, dtype)
        np.testing.assert_array_equal(out, np.broadcast_to(values.astype(dtype), out.shape))
        _check_contract(out, lse, queries, keys, values, h, rtol, dtype)


@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-6, 0.5])
def test_many_output_columns_each_within_its_own_bound(rtol):
    """40 columns of wildly different scales and signs: the bound is per column."""
    for seed in range(3):
        rng = np.random.default_rng([seed, 40])
        queries, keys, h = _geometry(["clustered", "line"][seed % 2], rng, 30, 300, 2)
        scales = 10.0 ** rng.integers(-280, 280, 40)
        values = (rng.normal(size=(300, 40)) + rng.normal(size=40)) * scales
        out, lse = _tree_nw(queries, keys, values, h, rtol, np.float64)
        _check_contract(out, lse, queries, keys, values, h, rtol, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_constant_values_come_back_constant(dtype):
    for seed in range(10):
        rng = np.random.default_rng([seed, 77])
        queries, keys, h = _geometry(GEOMS[seed % len(GEOMS)], rng, 20, 200, 2)
        c = float(rng.normal() * 10.0 ** rng.integers(-30, 30))
        values = np.full(200, c)
        for rtol in (COARSE_MIN_RTOL, 1e-3, 0.999):
            out, _ = _tree_nw(queries, keys, values, h, rtol, dtype)
            ref = dtype(c)
            # the summation's own rounding (n terms), as on the exact path
            assert np.all(np.abs(out - ref) <= 2 * 200 * np.finfo(dtype).eps * abs(ref)), (
                seed,
                rtol,
                np.abs(out - ref).max() / abs(ref),
            )


def test_rtol_zero_is_the_exact_path_bit_for_bit():
    for seed in range(6):
        rng = np.random.default_rng([seed, 0])
        queries, keys, h = _geometry(GEOMS[seed % len(GEOMS)], rng, 40, 300, 1 + seed % 3)
        values = rng.normal(size=(300, 2))
        for dtype in ("float64", "float32"):
            exact = nbattn.nadaraya_watson(queries, keys, values, h, dtype=dtype, return_lse=True)
            with config_values(**_FORCE):
                for rtol in (0, 0.0, np.float32(0.0), np.int64(0)):
                    got = nbattn.nadaraya_watson(
                        queries, keys, values, h, dtype=dtype, rtol=rtol, return_lse=True
                    )
                    assert np.array_equal(got[0], exact[0]) and np.array_equal(got[1], exact[1])


def test_the_switch_really_switches():
    """Float64 at COARSE_MIN_RTOL runs the coarse copy, just below it does not, and both
    honour the contract; float32 never does (coarse_for)."""
    assert coarse_for(COARSE_MIN_RTOL, np.float64) is True
    assert coarse_for(1.6e-7, np.float64) is True
    assert coarse_for(_BELOW, np.float64) is None
    assert coarse_for(0.5, np.float32) is None
    assert coarse_for(np.float32(0.5), np.float64) is True
    differ = 0
    for seed in range(10):
        rng = np.random.default_rng([seed, 16])
        queries, keys, h = _geometry("clustered", rng, 20, 300, 2)
        values = rng.normal(size=300) + 3.0
        with config_values(TREE_LEAF_KEYS=4):
            q, k_t, v_t, _ = regression._layout(queries, keys, values[:, None], h, np.float64)
            k_t, v_t, nodes, own = tree_layout(k_t, v_t, False, q.shape[0])
        tree = kernels_for("tree_pool", "cpu")
        rows = np.arange(q.shape[0])
        a = tree.tree_pool(q, k_t, v_t, *nodes, own, COARSE_MIN_RTOL, rows, 16, True)
        b = tree.tree_pool(q, k_t, v_t, *nodes, own, COARSE_MIN_RTOL, rows, 16, None)
        differ += not np.array_equal(a[0], b[0])
        for out, lse, far, _ in (a, b):
            assert not far.any()
            _check_contract(out[:, 0], lse, queries, keys, values, h, COARSE_MIN_RTOL, np.float64)
    assert differ > 0


# ------------------------------------------------------------------ a public table
@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-6, 1e-3, 0.5, 0.999])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bundled_diabetes_table(rtol, dtype, tree_runs):
    """scikit-learn's bundled diabetes table (442 x 10, continuous, standardised): each
    random subset of its columns predicts the target and the bmi column, on the tree path
    (spied to have run), within the contract against the exact path."""
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_diabetes(return_X_y=True)
    for seed in range(2):
        rng = np.random.default_rng([seed, 442])
        cols = np.sort(rng.choice([0, 2, 3, 4, 5, 6, 7, 8, 9], size=1 + seed % 4, replace=False))
        feats = X[:, cols]
        h = feats.std(axis=0) * len(feats) ** (-1.0 / (len(cols) + 4)) * rng.uniform(0.1, 1.0)
        values = np.stack([y, X[:, 2] * 1e3], axis=1)
        train = rng.uniform(size=len(feats)) < 0.7
        for queries, keys, vals, excl in (
            (feats[~train], feats[train], values[train], False),
            (feats, feats, values, True),
        ):
            out, lse = _tree_nw(queries, keys, vals, h, rtol, dtype, exclude_self=excl)
            _check_contract(out, lse, queries, keys, vals, h, rtol, dtype, exclude_self=excl)
    assert tree_runs and all(tree_runs)


# ------------------------------------------------------------------- coarse_exp itself
@njit(fastmath=config.FASTMATH)
def _coarse_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = coarse_exp(x[i])


@njit(fastmath=config.FASTMATH)
def _fast_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = fast_exp(x[i])


def _coarse(x):
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    _coarse_loop(x, out)
    return out


def _rel(x):
    got = _coarse(x)
    want = np.exp(np.asarray(x, dtype=np.float64))
    return np.abs(got - want) / want, got


def _ulps_around(x, k):
    """x and its k float64 neighbours on each side."""
    pts = [np.asarray(x, dtype=np.float64)]
    up = down = pts[0]
    for _ in range(k):
        up = np.nextafter(up, np.inf)
        down = np.nextafter(down, -np.inf)
        pts += [up, down]
    return np.concatenate([np.ravel(p) for p in pts])


_LO, _HI = -708.39, 709.43


def _in_range(x):
    return x[(x >= _LO) & (x <= _HI)]


def test_coarse_exp_at_the_reduction_edges_every_binade():
    """x = (k + 1/2) ln 2 (and k ln 2, where n changes), computed several ways, and
    +-64 ulps around each, for every k whose x lies in the range."""
    k = np.arange(-1030, 1030, dtype=np.float64)
    ln2 = math.log(2.0)
    edges = np.concatenate(
        [
            (k + 0.5) * ln2,
            k * ln2 + ln2 / 2,
            (2 * k + 1) / (2 * 1.4426950408889634),
            k * ln2,
            (k + 0.5 - 1e-15) * ln2,
            (k + 0.5 + 1e-15) * ln2,
        ]
    )
    x = _in_range(_ulps_around(_in_range(edges), 64))
    rel, _ = _rel(x)
    i = int(np.argmax(rel))
    assert rel[i] < COARSE_EXP_RTOL, (x[i], rel[i])


def test_coarse_exp_at_the_flush_and_overflow_thresholds():
    x = _in_range(
        np.concatenate(
            [
                _ulps_around(np.array([_LO, _HI]), 2000),
                np.linspace(_LO, _LO + 1.0, 100_001),
                np.linspace(_HI - 1.0, _HI, 100_001),
            ]
        )
    )
    rel, got = _rel(x)
    i = int(np.argmax(rel))
    assert rel[i] < COARSE_EXP_RTOL, (x[i], rel[i])
    assert np.all(np.isfinite(got)) and np.all(got > 0.0)
    # outside: 0 below the flush, inf above the overflow threshold, as documented
    below = np.nextafter(_LO, -np.inf)
    above = np.nextafter(_HI, np.inf)
    np.testing.assert_array_equal(_coarse(np.array([below, above])), [0.0, np.inf])


def test_coarse_exp_at_zero_signed_zero_and_tiny_arguments():
    tiny = np.array(
        [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -2.2250738585072014e-308]
        + [s * 10.0**e for e in range(-300, 0, 7) for s in (1.0, -1.0)]
    )
    got = _coarse(tiny)
    rel = np.abs(got - np.exp(tiny)) / np.exp(tiny)
    assert rel.max() < COARSE_EXP_RTOL
    assert got[0] == 1.0 and got[1] == 1.0


@settings(max_examples=300, deadline=None)
@given(x=st.floats(_LO, _HI, allow_nan=False, allow_infinity=False))
def test_coarse_exp_property_whole_range(x):
    rel, _ = _rel(np.array([x]))
    assert rel[0] < COARSE_EXP_RTOL


def test_coarse_exp_random_dense_sweeps():
    rng = np.random.default_rng(2026)
    x = np.concatenate(
        [
            rng.uniform(_LO, _HI, 2_000_000),
            rng.uniform(-60.0, 0.0, 1_000_000),  # where the pool's weights live
            -rng.exponential(3.0, 1_000_000),
        ]
    )
    rel, _ = _rel(_in_range(x))
    assert rel.max() < COARSE_EXP_RTOL, rel.max()


def test_coarse_exp_is_monotone_enough_for_the_sums():
    """No sign flips or negative weights: coarse_exp > 0 over the range, and its ratio to
    fast_exp is within eps of 1 (the proof adds each weight's error to eps * its sum)."""
    x = np.linspace(_LO, _HI, 500_001)
    got = _coarse(x)
    ref = np.empty_like(x)
    _fast_loop(x, ref)
    assert np.all(got > 0.0)
    assert np.max(np.abs(got / ref - 1.0)) < COARSE_EXP_RTOL


# ------------------------------------------------------- larger, default leaves, tiles
@pytest.mark.parametrize("tile", [1, 3, 16, 64])
@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-6, 1e-3])
def test_tight_pruning_on_a_line_any_tile(tile, rtol):
    """3000 keys on a (nearly) flat line at a narrow width: the rule drops up to ~0.96 of
    its budget (measured); with tiles of any size and leaves of 4 to 512 keys the contract
    holds on each side of the switch (spiky values: a few keys 50 above the rest)."""
    for seed in range(2):
        rng = np.random.default_rng([seed, tile, 3000])
        n = 3000
        keys = np.sort(rng.uniform(-50, 50, n))[:, None]
        if seed % 2:
            keys = np.concatenate([keys, 0.01 * rng.normal(size=(n, 1))], axis=1)
        d = keys.shape[1]
        queries = keys[rng.integers(0, n, 150)] + 0.3 * rng.normal(size=(150, d))
        values = np.stack([np.sin(keys[:, 0]) + 50.0 * (rng.uniform(size=n) < 0.01)], axis=1)
        h = np.full(d, 0.3)
        for leaf in (4, 32, 512):
            with config_values(TREE_TILE_ROWS=tile):
                out, lse = _tree_nw(queries, keys, values, h, rtol, np.float64, leaf=leaf)
            _check_contract(out, lse, queries, keys, values, h, rtol, np.float64)


@pytest.mark.parametrize("rtol", [COARSE_MIN_RTOL, 1e-3])
def test_default_configuration_large_clustered(rtol, tree_runs):
    """No forcing: the cost model picks the tree (spied) on 20,000 clustered keys at a
    narrow width, and the result honours the contract (6,000 queries: enough that trying
    the tree costs at most ``TREE_MAX_OVERHEAD_SHARE`` of exact streaming)."""
    for seed in range(2):
        rng = np.random.default_rng([seed, 20000])
        queries, keys, _ = _geometry("clustered", rng, 6000, 20000, 2)
        h = np.full(2, 0.02)
        values = rng.normal(size=(20000, 2)) * [1.0, 1e-200] + [3.0, 0.0]
        out, lse = nbattn.nadaraya_watson(queries, keys, values, h, rtol=rtol, return_lse=True)
        rows = rng.choice(queries.shape[0], 300, replace=False)  # the contract is per row
        _check_contract(out[rows], lse[rows], queries[rows], keys, values, h, rtol, np.float64)
    assert tree_runs and all(tree_runs)


@pytest.mark.parametrize("rtol", [_BELOW, COARSE_MIN_RTOL, 1e-3, 0.5])
@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_query_in_a_loose_box_at_the_flush_thresholds(rtol, d):
    """Keys at the corners of a cube (jittered), queries near its centre: the box bound is
    ~0 while every score is about -gap, so coarse weights relative to the box shift sit at
    the flush threshold and the row may be re-walked at its best score; the contract
    holds on both sides of the switch."""
    corners = np.array(np.meshgrid(*[[-1.0, 1.0]] * d)).reshape(d, -1).T
    h = np.full(d, 1.0 / np.sqrt(2.0))
    for gap in (650.0, 700.0, 708.0, 708.4, 709.0, 709.5, 745.0, 746.0, 800.0):
        for seed in range(3):
            rng = np.random.default_rng([seed, d, int(gap * 10)])
            keys = corners * np.sqrt(gap / d) / np.sqrt(2.0)
            keys = keys * (1.0 + 1e-4 * rng.normal(size=keys.shape))
            queries = 1e-3 * rng.normal(size=(5, d))
            values = rng.normal(size=(keys.shape[0], 2)) + [0.0, 5.0]
            for leaf in (1, 4, 512):
                out, lse = _tree_nw(queries, keys, values, h, rtol, np.float64, leaf=leaf)
                _check_contract(out, lse, queries, keys, values, h, rtol, np.float64)
