"""The two fast paths of Gaussian pooling against the naive references.

* the one fused pass of ``kernels.pooling`` (no running maximum) and its
  fall-back to the max-shifted row where the unshifted weights underflow;
* the GEMM tiles of ``kernels.pooling_gemm`` for wide inputs, with their row
  checks (far queries, data far from the origin, keys far from the centre).

The path is forced through ``config.GEMM_MIN_FEATURES_<dtype>`` (read at call time).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn.kernels import pooling

from .. import naive
from ..strategies import pooling_shapes, seeds

TOL = {"float64": 1e-12, "float32": 1e-5}


def _rel_err(got, ref):
    return np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300)


@pytest.fixture(params=["direct", "gemm"])
def path(request, monkeypatch):
    """Run the test on the direct kernel, then on the GEMM tiles, whatever d is."""
    _force(monkeypatch, request.param == "gemm")
    return request.param


def _force(monkeypatch, gemm):
    """Send every call to the GEMM tiles (``gemm``) or to the direct kernel."""
    for name in ("GEMM_MIN_FEATURES_FLOAT32", "GEMM_MIN_FEATURES_FLOAT64"):
        monkeypatch.setattr(config, name, 1 if gemm else 10**9)


# --------------------------------------------------------------- the one pass


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rows_on_both_sides_of_the_one_pass_bound(dtype, path):
    """Queries whose best score runs from 0 past the one-pass bound (about -55 in
    float32, -650 in float64) and past the dtype's underflow (-87, -708): the accepted
    and the redone rows both match the reference."""
    rng = np.random.default_rng(0)
    keys = rng.uniform(-1, 1, size=(300, 2))
    values = rng.normal(size=(300, 2))
    best = -np.linspace(0.0, 120.0 if dtype == "float32" else 900.0, 61)
    # h = 1: the score is -|q - k|^2 / 2; put each query sqrt(-2 best) beyond the box
    queries = np.column_stack([1.0 + np.sqrt(-2.0 * best), np.zeros(best.size)])
    got, lse = nbattn.nadaraya_watson(queries, keys, values, 1.0, dtype=dtype, return_lse=True)
    ref = naive.nadaraya_watson(queries, keys, values, 1.0)
    assert _rel_err(got, ref) <= TOL[dtype]
    ref_lse = naive.nadaraya_watson_lse(queries, keys, 1.0)
    tol = TOL[dtype]
    np.testing.assert_allclose(lse, ref_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("magnitude", [1e-30, 1e-40, 1e30])
def test_tiny_and_huge_values_keep_their_digits(dtype, magnitude, path):
    """Values are rescaled by a power of two before the unshifted sums: weights near
    the one-pass bound times values near the underflow (or far above 1) do not
    vanish or overflow. 1e-40 is subnormal in float32."""
    if dtype == "float32" and magnitude > 1e30:
        magnitude = 1e30
    rng = np.random.default_rng(1)
    keys = rng.uniform(0, 1, size=(200, 3))
    queries = np.vstack([rng.uniform(0, 1, size=(20, 3)), [[7.0, 7.0, 7.0], [9.0, 0.0, 0.0]]])
    values = (rng.uniform(0.5, 1.0, size=200) * magnitude).astype(dtype)
    got = nbattn.nadaraya_watson(queries, keys, values, 1.0, dtype=dtype)
    ref = naive.nadaraya_watson(queries, keys, values.astype(np.float64), 1.0)
    assert np.all(got != 0.0)
    tol = TOL[dtype] if np.finfo(dtype).tiny <= magnitude else 1e-3  # subnormal inputs
    assert _rel_err(got, ref) <= tol


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exclude_self_skips_a_dominant_own_key(dtype, path):
    """Leave-one-out on well-separated points: each row's own weight would be ~1e20
    times all others together, so it must be skipped, never subtracted."""
    x = np.arange(40.0)[:, None] * np.array([[1.0, 0.5, 0.25]])
    y = np.cos(x[:, 0])
    got = nbattn.nadaraya_watson(x, x, y, 0.25, exclude_self=True, dtype=dtype)
    ref = naive.nadaraya_watson(x, x, y, 0.25, exclude_self=True)
    # float32: the scaled inputs reach 60 units from the centre, where rounding them
    # moves a neighbour's score by ~3e-5 (the same on every path)
    assert _rel_err(got, ref) <= (5e-5 if dtype == "float32" else TOL[dtype])


def test_one_pass_bound_is_the_documented_one():
    f32, f64 = np.empty(1, np.float32), np.empty(1, np.float64)
    assert pooling.one_pass_min_sum(1000, f32) == 1000 * 2.0**-80
    assert pooling.one_pass_min_sum(1000, f64) == 1000 * 2.0**-950


@settings(max_examples=40, deadline=None)
@given(
    n_queries=st.integers(1, 40),
    n_keys=st.sampled_from([1, 3, 700, config.KEY_BLOCK, config.KEY_BLOCK + 300]),
    d=st.integers(1, 4),
    n_outputs=st.sampled_from([1, 3]),
    exclude_self=st.booleans(),
    f32=st.booleans(),
    seed=seeds,
)
def test_a_chunk_of_rows_sums_as_each_row_alone(
    n_queries, n_keys, d, n_outputs, exclude_self, f32, seed
):
    """The rows of a chunk that take the one pass together (each key block read once for
    all of them) give the bits of each row pooled alone, with its own key skipped
    wherever it falls in a key block."""
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    keys_t = rng.normal(size=(d, n_keys)).astype(dtype)
    values_t = rng.normal(size=(n_outputs, n_keys)).astype(dtype)
    exclude_self = exclude_self and n_keys > n_queries
    offset = int(rng.integers(0, n_keys - n_queries + 1)) if exclude_self else 0
    queries = rng.normal(scale=0.5, size=(n_queries, d)).astype(dtype)
    out, lse = pooling.gaussian_pool(queries, keys_t, values_t, exclude_self, offset)
    for i in range(n_queries):
        alone, alone_lse = pooling.gaussian_pool(
            queries[i : i + 1], keys_t, values_t, exclude_self, offset + i
        )
        np.testing.assert_array_equal(out[i], alone[0])
        assert lse[i] == alone_lse[0]


def test_value_scaling_is_exact_and_bounded():
    values_t = np.array([[3.0, -5.0, 0.0], [0.0, 0.0, 0.0], [1e-310, 2e-310, -1e-320]])
    e = pooling.value_scales(values_t)
    scaled = pooling.scaled_values(values_t, e)
    assert np.all(np.abs(scaled) <= 2.0)
    assert np.all(np.abs(scaled).max(axis=1)[[0, 2]] > 1.0)
    np.testing.assert_array_equal(np.ldexp(scaled, (e - 1)[:, None]), values_t)


# --------------------------------------------------------------- GEMM tiles


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n_outputs", [None, 3])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_gemm_tiles_across_tile_edges(dtype, n_outputs, exclude_self, monkeypatch):
    """More keys than GEMM_BLOCK_K and queries than GEMM_BLOCK_Q (partial tiles)."""
    _force(monkeypatch, True)
    rng = np.random.default_rng(2)
    n, d = config.GEMM_BLOCK_K + 37, 24
    x = rng.normal(size=(n, d))
    v = rng.normal(size=n) if n_outputs is None else rng.normal(size=(n, n_outputs))
    h = nbattn.smoothing.regression.bandwidth_rule(x)
    got, lse = nbattn.nadaraya_watson(
        x, x, v, h, exclude_self=exclude_self, dtype=dtype, return_lse=True
    )
    ref = naive.nadaraya_watson(x, x, v, h, exclude_self=exclude_self)
    assert _rel_err(got, ref) <= TOL[dtype]
    ref_lse = naive.nadaraya_watson_lse(x, x, h, exclude_self=exclude_self)
    tol = TOL[dtype]
    np.testing.assert_allclose(lse, ref_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_data_far_from_the_origin(dtype, path):
    """An offset of 1e4 (float32 keeps 1e-3 there, and the expanded scores would
    cancel norms of 1e8 per feature): centring on the keys in float64 keeps the
    norms small, so both paths keep every digit."""
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(40, 32)), rng.normal(size=(300, 32))
    v = rng.normal(size=300)
    h = nbattn.smoothing.regression.bandwidth_rule(k)
    q, k = q + 1e4, k + 1e4  # the reference's differences of these are exact (Sterbenz)
    ref = naive.nadaraya_watson(q, k, v, h)
    got = nbattn.nadaraya_watson(q, k, v, h, dtype=dtype)
    assert _rel_err(got, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_far_queries_get_the_nearest_key(dtype, path):
    rng = np.random.default_rng(4)
    k = rng.normal(size=(50, 20))
    v = rng.normal(size=50)
    far = 1e30 if dtype == "float32" else 1e160
    q = np.vstack([k[7] * far, -k[11] * far, k[3] + 0.01])
    got = nbattn.nadaraya_watson(q, k, v, 1.0, dtype=dtype)
    nearest = [np.argmax(k @ k[7]), np.argmax(-k @ k[11])]
    np.testing.assert_allclose(got[:2], v[nearest], rtol=TOL[dtype])
    ref = naive.nadaraya_watson(q[2:], k, v, 1.0)
    assert _rel_err(got[2:], ref) <= TOL[dtype]


def test_gemm_redoes_near_queries_among_keys_far_from_the_centre(monkeypatch):
    """Two clusters 300 widths apart: the norms of the second cluster dwarf the
    scores of its near queries, whose expanded scores would lose the digits; the
    row check sends them to the direct differences, which stay exact."""
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(200, 16)), rng.normal(size=(3, 16)) + 300.0
    keys = np.vstack([a, b])
    queries = b + rng.normal(scale=0.2, size=b.shape)
    values = rng.normal(size=203)
    ref = naive.nadaraya_watson(queries, keys, values, 0.5)
    _force(monkeypatch, True)
    got = nbattn.nadaraya_watson(queries, keys, values, 0.5, dtype="float32")
    assert _rel_err(got, ref) <= 1e-5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_tile_far_above_the_running_maximum(dtype, monkeypatch):
    """The first key tile holds only keys 12 widths away (scores ~ -72), a later one
    the near keys (~ 0): the online softmax rescales the first tiles' sums by e**-72
    when the maximum jumps; the result is the reference's."""
    _force(monkeypatch, True)
    rng = np.random.default_rng(7)
    n_far = config.GEMM_BLOCK_K + 44
    side = np.where(np.arange(n_far) % 2 == 0, 12.0, -12.0)
    far_keys = np.column_stack([side, rng.normal(scale=0.1, size=(n_far, 2))])
    keys = np.vstack([far_keys, rng.normal(scale=0.3, size=(10, 3))])
    queries = rng.normal(scale=0.3, size=(30, 3))
    values = rng.normal(size=keys.shape[0])
    got = nbattn.nadaraya_watson(queries, keys, values, 1.0, dtype=dtype)
    ref = naive.nadaraya_watson(queries, keys, values, 1.0)
    assert _rel_err(got, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_agrees_with_the_direct_path_across_the_crossover(dtype, monkeypatch):
    rng = np.random.default_rng(6)
    crossover = getattr(config, "GEMM_MIN_FEATURES_" + dtype.upper())
    for d in (crossover - 1, crossover, 64):
        q, k, v = rng.normal(size=(60, d)), rng.normal(size=(400, d)), rng.normal(size=400)
        h = nbattn.smoothing.regression.bandwidth_rule(k)
        auto = nbattn.nadaraya_watson(q, k, v, h, dtype=dtype)
        _force(monkeypatch, False)
        direct = nbattn.nadaraya_watson(q, k, v, h, dtype=dtype)
        monkeypatch.undo()
        assert nbattn.smoothing.regression.uses_gemm_tiles(d, dtype) == (d >= crossover)
        ref = naive.nadaraya_watson(q, k, v, h)
        tol = 2e-5 if dtype == "float32" else TOL[dtype]  # float32 at d = 64: (d + 3) u |s|
        assert _rel_err(auto, direct) <= tol
        assert _rel_err(auto, ref) <= tol


@settings(max_examples=25)
@given(
    shape=pooling_shapes(queries=90, keys=700, features=40, outputs=3),
    exclude_self=st.booleans(),
    f32=st.booleans(),
    gemm=st.booleans(),
    log_h=st.floats(-1.5, 1.0),
    seed=seeds,
)
def test_random_shapes_on_both_paths(shape, exclude_self, f32, gemm, log_h, seed):
    n_queries, n_keys, d, n_outputs = shape
    rng = np.random.default_rng(seed)
    if exclude_self:
        n_queries = n_keys
    k = rng.normal(size=(n_keys, d))
    q = k.copy() if exclude_self else rng.normal(scale=2.0, size=(n_queries, d))
    v = rng.normal(size=(n_keys, n_outputs))
    h = 10.0**log_h
    dtype = "float32" if f32 else "float64"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _force(monkeypatch, gemm)
        got = nbattn.nadaraya_watson(q, k, v, h, exclude_self=exclude_self, dtype=dtype)
    ref = naive.nadaraya_watson(q, k, v, h, exclude_self=exclude_self)
    assert np.all(np.isfinite(got))
    if exclude_self and n_keys == 1:
        assert np.all(got == 0.0)
        return
    tol = TOL[dtype] if not f32 else _float32_tol(q, k, v, ref, h, exclude_self)
    assert _rel_err(got, ref) <= tol


def _float32_tol(q, k, v, ref, h, exclude_self):
    """The float32 contract, relative to max |ref|: ~1e-5 of the output scale, plus the
    rounding of the scores, (d + 3) u |s| for the keys that weigh (scores within 20 of
    the row's best), which moves a weight by that factor and the output by it times
    2 max |v|."""
    d = k.shape[1]
    d2 = ((q[:, None, :] - k[None, :, :]) ** 2).sum(axis=-1)
    if exclude_self:
        np.fill_diagonal(d2, np.inf)
    s_near = np.max(np.min(d2, axis=1)) / (2.0 * h * h) + 20.0
    scores = (d + 3) * 2.0**-24 * s_near * 2.0 * np.max(np.abs(v))
    return 2e-5 * max(1.0, d / 8) + scores / max(np.max(np.abs(ref)), 1e-300)
