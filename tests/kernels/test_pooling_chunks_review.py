"""Hostile review of the chunked one pass of ``kernels.pooling`` (``one_pass_rows``).

Once the first row of a chunk of ``config.QUERY_BLOCK`` queries passes the one-pass
bound, the chunk's other rows are summed together (each key block read once for all of
them, each row's own key skipped). The claims checked here, on small shapes:

1. a row whose chunk's first row passes has the bits of the row pooled alone
   (``gaussian_pool(queries[i:i+1], ..., self_offset + i)``); the first row of every
   chunk has them always;
2. every row matches a float64 reference (``tests/naive.py``'s softmax on scores taken
   relative to the row's best key, so that far rows are exact too), in chunks that mix
   near, borderline, underflowing and far rows in every order, with the own key at and
   around key-block edges;
3. the same bits on one thread and on two, and on two identical calls;
4. the public entry points (``nbattn.nadaraya_watson(exclude_self=True)``, the
   leave-one-out rows of ``nbattn.smoothing.loo_rows.loss_grad_rows``, which pass a
   ``self_offset``) agree with ``tests/naive.py`` on a real table (scikit-learn's
   bundled diabetes data, no download).
"""

import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.kernels import pooling

from .. import naive
from ..strategies import seeds

KB = config.KEY_BLOCK
QB = config.QUERY_BLOCK
BASE_TOL = {np.float32: 1e-5, np.float64: 1e-12}
UNIT = {np.float32: 2.0**-24, np.float64: 2.0**-53}
# best score of a row whose unshifted sum is near the one-pass bound: 80 ln 2, 950 ln 2
BOUND_SCORE = {np.float32: 80 * math.log(2), np.float64: 950 * math.log(2)}
# a float64 row with m below -FAR_SCORE_FLOAT64 (2**24) takes the anchored far path
FAR_DISTANCE = {np.float32: 1.5 * math.sqrt(config.FAR_SCORE_FLOAT32), np.float64: 5000.0}
KINDS = ("near", "edge", "under", "far")


# --------------------------------------------------------------------------- references


def _own(i, n_keys, exclude_self, offset):
    j = i + offset
    return j if exclude_self and 0 <= j < n_keys else -1


def _reference(queries, keys_t, values_t, exclude_self, offset):
    """``(out, lse, m)`` in float64 from the inputs as given: scores relative to the best
    admissible key a, r_j = -(k_j - k_a).(k_j + k_a - 2 q) (no cancellation of two huge
    squares), then naive's softmax / logsumexp; m the best score (the row's scale)."""
    q = queries.astype(np.float64)
    k = keys_t.T.astype(np.float64)
    v = values_t.T.astype(np.float64)
    # each column divided by a power of two near its largest value (exact), so that
    # products of weights and subnormal values keep their digits (as nadaraya_watson_exact)
    big = np.abs(v).max(axis=0) if v.size else np.zeros(v.shape[1])
    unit = np.ldexp(1.0, np.where(big > 0, np.frexp(big)[1], 0))
    v = v / unit
    n_q, n_k = q.shape[0], k.shape[0]
    out = np.zeros((n_q, v.shape[1]))
    lse = np.full(n_q, -np.inf)
    best = np.full(n_q, -np.inf)
    for i in range(n_q):
        direct = -np.sum((q[i] - k) ** 2, axis=1)
        own = _own(i, n_k, exclude_self, offset)
        if own >= 0:
            direct[own] = -np.inf
        if not np.isfinite(direct).any():
            continue
        a = int(np.argmax(direct))
        rel = -np.sum((k - k[a]) * (k + k[a] - 2.0 * q[i]), axis=1)
        a = int(np.argmax(np.where(np.isfinite(direct), rel, -np.inf)))  # ties of rounding
        rel = -np.sum((k - k[a]) * (k + k[a] - 2.0 * q[i]), axis=1)
        if own >= 0:
            rel[own] = -np.inf
        out[i] = naive.softmax_rows(rel[None])[0] @ v
        best[i] = direct[a]
        lse[i] = direct[a] + naive.logsumexp_rows(rel[None])[0]
    with np.errstate(over="ignore"):
        return out * unit, lse, best


def _row_tolerance(dtype, d, m, k_max):
    """The rounding a row of best score m may carry (module docstring: (d + 3) u |s| for
    the direct scores; float32 rows beyond FAR_SCORE_FLOAT32 take float64 scores, float64
    rows beyond FAR_SCORE_FLOAT64 relative ones), plus the dtype's base tolerance."""
    m = abs(m)
    if dtype == np.float32 and m <= config.FAR_SCORE_FLOAT32:
        err = (d + 3) * UNIT[np.float32] * (m + 1.0)
    elif m <= config.FAR_SCORE_FLOAT64:
        err = (d + 3) * UNIT[np.float64] * (m + 1.0)
    else:  # relative scores: |k_j - k_a| |2 q - k_j - k_a| per feature
        err = (d + 3) * UNIT[np.float64] * 4.0 * k_max * (2.0 * math.sqrt(m) + 4.0 * k_max)
    return BASE_TOL[dtype] + 4.0 * err


def _assert_matches_reference(out, lse, queries, keys_t, values_t, exclude_self, offset):
    dtype = queries.dtype.type
    ref, ref_lse, best = _reference(queries, keys_t, values_t, exclude_self, offset)
    scale = np.abs(values_t.astype(np.float64)).max(axis=1)  # per output column
    k_max = float(np.abs(keys_t).max()) if keys_t.size else 0.0
    tiny = np.finfo(dtype).smallest_subnormal
    for i in range(queries.shape[0]):
        if not np.isfinite(ref_lse[i]):
            np.testing.assert_array_equal(out[i], 0.0)
            assert lse[i] == -np.inf, (i, lse[i])
            continue
        tol = _row_tolerance(dtype, queries.shape[1], best[i], k_max)
        err = np.abs(out[i].astype(np.float64) - ref[i])
        assert np.all(err <= tol * scale + 2 * tiny), (i, best[i], out[i], ref[i], tol)
        assert abs(lse[i] - ref_lse[i]) <= tol * max(1.0, abs(ref_lse[i])), (
            i,
            best[i],
            lse[i],
            ref_lse[i],
        )


def _one_pass_total(query_row, keys_t, own):
    """The unshifted sum of ``one_pass_row`` for one row (values do not enter it)."""
    ones = np.ones((1, keys_t.shape[1]), dtype=keys_t.dtype)
    buf = np.empty(KB, dtype=keys_t.dtype)
    acc = np.empty(1)
    return pooling.one_pass_row(query_row, keys_t, ones, np.int64(own), buf, acc)


def _passes(query_row, keys_t, own):
    total = _one_pass_total(query_row, keys_t, own)
    return total >= pooling.one_pass_min_sum(keys_t.shape[1], keys_t)


def _same(a, b):
    return np.array_equal(a, b, equal_nan=True)


def _assert_rows_alone(out, lse, queries, keys_t, values_t, exclude_self, offset):
    """Claim 1: the rows of a chunk whose first row passes, and the first row of every
    chunk, have the bits of the row pooled alone. Returns how many rows were claimed."""
    n_q = queries.shape[0]
    claimed = 0
    for first in range(0, n_q, QB):
        own = first + offset if exclude_self else -1
        chunk_passes = _passes(queries[first], keys_t, own)
        for i in range(first, min(n_q, first + QB)):
            if i != first and not chunk_passes:
                continue
            alone, alone_lse = pooling.gaussian_pool(
                queries[i : i + 1], keys_t, values_t, exclude_self, offset + i
            )
            assert _same(out[i], alone[0]), (i, first, chunk_passes, out[i], alone[0])
            assert _same(lse[i], alone_lse[0]), (i, first, chunk_passes, lse[i], alone_lse[0])
            claimed += 1
    return claimed


def _pool_on_threads(queries, keys_t, values_t, exclude_self, offset):
    """Claim 3: the result on one thread, on two, and twice on two; returns the last."""
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = pooling.gaussian_pool(queries, keys_t, values_t, exclude_self, offset)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = pooling.gaussian_pool(queries, keys_t, values_t, exclude_self, offset)
        again = pooling.gaussian_pool(queries, keys_t, values_t, exclude_self, offset)
    finally:
        numba.set_num_threads(before)
    for a, b in ((one, two), (two, again)):
        assert _same(a[0], b[0]) and _same(a[1], b[1])
    return two


def _check_all(queries, keys_t, values_t, exclude_self, offset):
    out, lse = _pool_on_threads(queries, keys_t, values_t, exclude_self, offset)
    _assert_matches_reference(out, lse, queries, keys_t, values_t, exclude_self, offset)
    return _assert_rows_alone(out, lse, queries, keys_t, values_t, exclude_self, offset)


# --------------------------------------------------------------------------- inputs


def _queries_of_kinds(rng, kinds, d, dtype):
    """One query per kind, keys in [-1, 1]^d: "near" inside the box, "edge" with best
    score near the one-pass bound, "under" below it (weights underflow, not far), "far"
    beyond the dtype's far threshold."""
    q = np.zeros((len(kinds), d))
    bound = BOUND_SCORE[dtype]
    for r, kind in enumerate(kinds):
        if kind == "near":
            q[r] = rng.uniform(-1, 1, size=d)
            continue
        if kind == "edge":
            dist = math.sqrt(bound * rng.uniform(0.9, 1.1))
        elif kind == "under":
            dist = math.sqrt(bound * rng.uniform(1.4, 4.0))
        else:
            dist = FAR_DISTANCE[dtype] * rng.uniform(1.0, 2.0)
        q[r, 0] = (1.0 + dist) * rng.choice([-1.0, 1.0])
        q[r, 1:] = rng.uniform(-1, 1, size=d - 1)
    return q.astype(dtype)


def _keys_values(rng, n_keys, d, n_outputs, dtype, magnitude=1.0):
    keys_t = rng.uniform(-1, 1, size=(d, n_keys)).astype(dtype)
    values_t = (rng.normal(size=(n_outputs, n_keys)) * magnitude).astype(dtype)
    return keys_t, values_t


DTYPES = [np.float32, np.float64]


# --------------------------------------------------------------------------- mixed chunks

PATTERNS = {
    "first near, later far": ["near"] + ["far"] * 15 + ["near"] * 2,
    "first far, later near": ["far"] + ["near"] * 16,
    "all far": ["far"] * 17,
    "first near, later under": ["near"] + ["under", "near"] * 8,
    "first under, later near": ["under"] + ["near"] * 15 + ["under", "near"],
    "alternating four kinds": [KINDS[i % 4] for i in range(33)],
    "reversed four kinds": [KINDS[3 - i % 4] for i in range(33)],
    "first edge": ["edge"] * 3 + ["near", "far", "under", "edge"] * 3 + ["near"] * 2,
    "near then all failing": ["near"] + ["under"] * 7 + ["far"] * 7 + ["near"],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("pattern", list(PATTERNS), ids=list(PATTERNS))
@pytest.mark.parametrize("n_keys", [1, 2, KB, KB + 1])
def test_chunks_mixing_near_and_far_rows(dtype, pattern, n_keys):
    kinds = PATTERNS[pattern]
    for seed in range(2):
        rng = np.random.default_rng([seed, n_keys, len(kinds)])
        d = 1 + seed
        keys_t, values_t = _keys_values(rng, n_keys, d, 1 + 2 * seed, dtype)
        queries = _queries_of_kinds(rng, kinds, d, dtype)
        _check_all(queries, keys_t, values_t, False, 0)
        # own keys placed at the key-block edges (or wherever they fall for few keys)
        for offset in {-1, 0, n_keys - len(kinds), KB - 1, KB - QB, KB - QB + 1}:
            _check_all(queries, keys_t, values_t, True, offset)


def test_the_first_row_passing_claims_the_whole_chunk():
    """Sanity of the harness: the cases above do take the together path (a near first
    row, rows after it), and claim 1 is checked on them, not vacuously skipped."""
    rng = np.random.default_rng(7)
    keys_t, values_t = _keys_values(rng, KB + 1, 2, 3, np.float64)
    queries = _queries_of_kinds(rng, PATTERNS["first near, later far"], 2, np.float64)
    assert _passes(queries[0], keys_t, -1)
    out, lse = pooling.gaussian_pool(queries, keys_t, values_t, False, 0)
    assert _assert_rows_alone(out, lse, queries, keys_t, values_t, False, 0) == 18


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=34),
    n_keys=st.sampled_from([1, 2, 5, KB, KB + 1]),
    d=st.integers(1, 3),
    n_outputs=st.sampled_from([1, 3]),
    exclude_self=st.booleans(),
    f32=st.booleans(),
    duplicate_keys=st.booleans(),
    seed=seeds,
)
def test_random_chunks_of_every_kind(
    kinds, n_keys, d, n_outputs, exclude_self, f32, duplicate_keys, seed
):
    dtype = np.float32 if f32 else np.float64
    rng = np.random.default_rng(seed)
    keys_t, values_t = _keys_values(rng, n_keys, d, n_outputs, dtype)
    if duplicate_keys:  # every key twice (or more): ties between keys
        keys_t = np.ascontiguousarray(keys_t[:, rng.integers(0, max(1, n_keys // 2), n_keys)])
    queries = _queries_of_kinds(rng, kinds, d, dtype)
    offsets = [0]
    if exclude_self:
        offsets = [int(rng.integers(-len(kinds), n_keys + 1)), KB - 1 - int(rng.integers(0, QB))]
    for offset in offsets:
        _check_all(queries, keys_t, values_t, exclude_self, offset)


# --------------------------------------------------------------------------- own keys at edges


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("n_queries", [1, 15, 16, 17, 33])
def test_own_keys_on_every_block_edge(dtype, n_queries):
    """Queries equal to their own keys (the dominant weight) with the own keys of the
    chunk's rows straddling j0, j1 - 1 and the last key, over 1, 2, KB and KB + 1 keys."""
    rng = np.random.default_rng(n_queries)
    for n_keys in (KB, KB + 1, 2 * KB + 1):
        keys_t, values_t = _keys_values(rng, n_keys, 2, 3, dtype)
        offsets = {KB - 1, KB, KB + 1, KB - n_queries, KB - n_queries + 1, n_keys - n_queries}
        offsets |= {KB - QB, KB - QB - 1, 0}
        for offset in sorted(o for o in offsets if o >= 0 and o + n_queries <= n_keys):
            queries = np.ascontiguousarray(keys_t[:, offset : offset + n_queries].T)
            queries = queries + rng.normal(scale=0.05, size=queries.shape).astype(dtype) * (
                rng.uniform(size=(n_queries, 1)) < 0.5
            )
            _check_all(queries.astype(dtype), keys_t, values_t, True, offset)
    for n_keys in (1, 2):  # one key excluded: rows with no admissible key in the chunk
        keys_t, values_t = _keys_values(rng, n_keys, 2, 1, dtype)
        queries = _queries_of_kinds(rng, ["near"] * n_queries, 2, dtype)
        for offset in (-n_queries + 1, -1, 0, 1):
            _check_all(queries, keys_t, values_t, True, offset)


# --------------------------------------------------------------------------- the bound itself


def _bisect_bound(keys_t, dtype, direction, own=-1):
    """Two adjacent floats x_pass < x_fail of the first coordinate of a query on the
    axis ``direction`` (others 0): the row passes the one-pass bound at x_pass and
    fails it at x_fail."""
    d = keys_t.shape[0]

    def row(x):
        q = np.zeros(d, dtype=dtype)
        q[0] = x
        return q

    lo = dtype(1.0 * direction)
    hi = dtype((1.0 + 2.0 * math.sqrt(2.0 * BOUND_SCORE[dtype])) * direction)
    assert _passes(row(lo), keys_t, own) and not _passes(row(hi), keys_t, own)
    while np.nextafter(lo, hi) != hi:
        mid = dtype((np.float64(lo) + np.float64(hi)) / 2)
        if mid == lo or mid == hi:
            mid = np.nextafter(lo, hi)
        if _passes(row(mid), keys_t, own):
            lo = mid
        else:
            hi = mid
    return row(lo), row(hi)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("n_keys", [2, KB, KB + 1])
def test_rows_one_ulp_either_side_of_the_bound(dtype, n_keys):
    """Rows whose unshifted sums lie one ulp of the query apart on the two sides of the
    bound, as first rows and as later rows of chunks: the together sum takes the same
    decision as the row alone (same bits), and both sides match the reference."""
    rng = np.random.default_rng(n_keys)
    for n_outputs in (1, 3):
        keys_t, values_t = _keys_values(rng, n_keys, 2, n_outputs, dtype)
        ok, fail = _bisect_bound(keys_t, dtype, 1.0)
        ok2, fail2 = _bisect_bound(keys_t, dtype, -1.0)
        near = np.zeros(2, dtype=dtype)
        orders = [
            [near, ok, fail, ok, fail, ok2, fail2] + [fail] * 10 + [ok],
            [ok, fail, fail2, ok2] * 5,
            [fail, ok, near, fail2, ok2] * 4,
            [ok2] * 16 + [fail2] * 16 + [ok],
        ]
        for rows in orders:
            queries = np.array(rows, dtype=dtype)
            _check_all(queries, keys_t, values_t, False, 0)
            # a chunk of ok rows followed by a fail row: the together sums decide per row
            out, _ = pooling.gaussian_pool(queries, keys_t, values_t, False, 0)
            assert np.all(np.isfinite(out))


# --------------------------------------------------------------------------- values and widths


@pytest.mark.parametrize(
    "dtype, magnitudes",
    [
        (np.float64, (1e-300, 1e300, 5e-324)),
        (np.float64, (4e-320, 1.0, 1e-310)),
        (np.float32, (1e-38, 1e38, 1e-42)),
    ],
    ids=["f64-tiny-huge-subnormal", "f64-subnormal-columns", "f32-tiny-huge-subnormal"],
)
def test_extreme_value_magnitudes_in_mixed_chunks(dtype, magnitudes):
    """Three output columns of very different magnitudes (the driver scales each by a
    power of two) in chunks mixing near and underflowing rows."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        n_keys = [5, KB, KB + 1][seed]
        keys_t = rng.uniform(-1, 1, size=(2, n_keys)).astype(dtype)
        values_t = np.stack(
            [
                (rng.uniform(0.5, 1.0, n_keys) * rng.choice([-1, 1], n_keys)).astype(np.float64) * m
                for m in magnitudes
            ]
        ).astype(dtype)
        kinds = [KINDS[(i * (seed + 1)) % 4] for i in range(17)]
        queries = _queries_of_kinds(rng, kinds, 2, dtype)
        for ex, off in ((False, 0), (True, KB - 1), (True, 0)):
            out, lse = _pool_on_threads(queries, keys_t, values_t, ex, off)
            _assert_matches_reference(out, lse, queries, keys_t, values_t, ex, off)
            _assert_rows_alone(out, lse, queries, keys_t, values_t, ex, off)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("scale", [1e-9, 1e-3, 30.0, 1e4])
def test_tiny_and_huge_widths(dtype, scale):
    """Scaled inputs multiplied by ``scale`` (1/h): all weights ~1 (huge h) down to all
    rows far but the own-key ones (tiny h), leave-one-out of keys over themselves, with
    ties (each key twice)."""
    rng = np.random.default_rng(int(scale * 1e9) % 2**32)
    base = rng.uniform(-1, 1, size=(2, 600))
    base = np.concatenate([base, base[:, :40]], axis=1)  # duplicates: exact ties
    keys_t = np.ascontiguousarray(base * scale).astype(dtype)
    values_t = rng.normal(size=(3, keys_t.shape[1])).astype(dtype)
    queries = np.ascontiguousarray(keys_t[:, :33].T)
    _check_all(queries, keys_t, values_t, True, 0)
    _check_all(queries, keys_t, values_t, False, 0)
    shifted = np.ascontiguousarray(keys_t[:, 580:613].T)
    _check_all(shifted, keys_t, values_t, True, 580)


def test_ties_between_two_keys():
    """A query at the midpoint of two keys (exact ties), as first and later rows."""
    for dtype in DTYPES:
        for gap in (1.0, 20.0, 80.0):
            keys_t = np.array([[-gap, gap, 3 * gap]], dtype=dtype)
            values_t = np.array([[1.0, -1.0, 5.0], [2.0, 2.0, 2.0]], dtype=dtype)
            queries = np.zeros((18, 1), dtype=dtype)
            queries[1::3, 0] = 2 * gap  # tie between keys 1 and 2
            out, lse = _pool_on_threads(queries, keys_t, values_t, False, 0)
            _assert_matches_reference(out, lse, queries, keys_t, values_t, False, 0)
            _assert_rows_alone(out, lse, queries, keys_t, values_t, False, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_non_finite_queries_inside_a_passing_chunk(dtype):
    """NaN and infinite queries after a passing first row (the kernel itself does not
    check its inputs): each row keeps its bits alone, on any thread count, and the
    finite rows around them match the reference."""
    rng = np.random.default_rng(11)
    keys_t, values_t = _keys_values(rng, KB + 1, 2, 3, dtype)
    queries = _queries_of_kinds(rng, ["near"] * 17 + ["far", "near"], 2, dtype)
    bad = [3, 5, 6, 16]
    queries[3, 0], queries[5, 1], queries[6, 0], queries[16, 0] = np.nan, np.inf, -np.inf, np.nan
    good = np.setdiff1d(np.arange(queries.shape[0]), bad)
    for ex, off in ((False, 0), (True, KB - 4)):
        out, lse = _pool_on_threads(queries, keys_t, values_t, ex, off)
        _assert_rows_alone(out, lse, queries, keys_t, values_t, ex, off)
        sub = np.ascontiguousarray(queries[good])
        ref_out, ref_lse = pooling.gaussian_pool(sub, keys_t, values_t, False, 0)
        if not ex:  # the finite rows as pooled without the others (other chunks: to rounding)
            np.testing.assert_allclose(out[good], ref_out, rtol=BASE_TOL[dtype], atol=1e-30)


@pytest.mark.parametrize("offset", [2**40, -(2**40), KB + 1, -64])
def test_an_own_key_out_of_range_skips_nothing(offset):
    """exclude_self with every row's own key outside the keys is, bit for bit, no
    exclusion (the split of a key block around ``own`` must not trigger)."""
    rng = np.random.default_rng(5)
    for dtype in DTYPES:
        keys_t, values_t = _keys_values(rng, KB + 1, 2, 3, dtype)
        queries = _queries_of_kinds(rng, ["near"] * 15 + ["under", "edge"] * 5, 2, dtype)
        if offset == KB + 1:
            keys_t, values_t = keys_t[:, :KB].copy(), values_t[:, :KB].copy()
        plain = pooling.gaussian_pool(queries, keys_t, values_t, False, 0)
        skipped = _pool_on_threads(queries, keys_t, values_t, True, offset)
        assert _same(plain[0], skipped[0]) and _same(plain[1], skipped[1])


# --------------------------------------------------------------------------- public entry points


def _diabetes():
    datasets = pytest.importorskip("sklearn.datasets")
    try:
        return datasets.load_diabetes(return_X_y=True)  # bundled with scikit-learn
    except Exception as exc:  # pragma: no cover - a trimmed install
        pytest.skip(f"scikit-learn's bundled diabetes data is unavailable: {exc}")


@pytest.fixture
def direct_path(monkeypatch):
    """The direct streaming kernel whatever the number of features (not the GEMM tiles)."""
    for name in ("GEMM_MIN_FEATURES_FLOAT32", "GEMM_MIN_FEATURES_FLOAT64"):
        monkeypatch.setattr(config, name, 10**9)


@pytest.mark.parametrize("h", [1e3, 0.1, 0.01, 0.003, 0.001])
def test_public_leave_one_out_on_a_real_table(h, direct_path):
    """``nadaraya_watson(X, X, y, h, exclude_self=True)`` on scikit-learn's diabetes table
    (442 x 10), widths from all-weights-equal to nearly every row below the one-pass
    bound, against naive's leave-one-out; outputs y, y * 1e-300 and y * 1e300."""
    X, y = _diabetes()
    values = np.column_stack([y, y * 1e-300, y * 1e300])
    got, lse = nbattn.nadaraya_watson(X, X, values, h, exclude_self=True, return_lse=True)
    scores = naive.gaussian_scores(X, X, h)
    np.fill_diagonal(scores, -np.inf)
    best = scores.max(axis=1)
    ref = naive.softmax_rows(scores) @ values
    ref_lse = naive.logsumexp_rows(scores)
    d = X.shape[1]
    for i in range(X.shape[0]):
        tol = _row_tolerance(np.float64, d, best[i], 1.0)
        assert np.all(np.abs(got[i] - ref[i]) <= tol * np.abs(values).max(axis=0)), (i, best[i])
        assert abs(lse[i] - ref_lse[i]) <= tol * max(1.0, abs(ref_lse[i]))
    got32 = nbattn.nadaraya_watson(X, X, y, h, exclude_self=True, dtype="float32")
    if h >= 0.01:  # float32 inputs: rounding the scaled data moves the scores by u |z| |dz|
        assert np.max(np.abs(got32 - ref[:, 0])) <= 1e-4 * np.abs(y).max()


def test_leave_one_out_rows_with_an_offset(direct_path):
    """``loo_rows.loss_grad_rows`` pools row ranges [a, b) with ``self_offset = a``: the
    ranges placed so that chunks straddle the first key-block edge, against naive's LOO
    loss and gradient (the sums over the ranges add up to the whole)."""
    from nbattn.smoothing.loo_rows import loss_grad_rows

    rng = np.random.default_rng(3)
    n = KB + 90
    X = rng.normal(size=(n, 2))
    X[::7] += 30.0  # isolated rows whose LOO prediction underflows the one pass
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    h = np.array([0.3, 0.5])
    z = X / (h * math.sqrt(2.0))
    z_t = np.ascontiguousarray(z.T)
    y2 = y[:, None]
    v_t = np.ascontiguousarray(y2.T)
    for cuts in ([0, n], [0, KB - QB + 1, n], [0, KB - 1, KB + 1, n], [0, 17, KB, n]):
        sse, sums = 0.0, 0.0
        for a, b in zip(cuts[:-1], cuts[1:]):
            s, g = loss_grad_rows(a, b, z, z_t, v_t, y2, None, None, np.float64, "cpu")
            sse, sums = sse + s, sums + g
        loss, grad = sse / n, 2.0 * (2.0 / n) * sums
        np.testing.assert_allclose(loss, naive.loo_loss(X, y, bandwidth=h), rtol=1e-10)
        np.testing.assert_allclose(grad, naive.loo_grad(X, y, bandwidth=h), rtol=1e-8)


# --------------------------------------------------------------------------- tiny blocks
