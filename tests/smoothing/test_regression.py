"""nadaraya_watson and the streaming kernel against the naive references and statsmodels."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.smoothing.regression import (
    BANDWIDTH_RULES,
    bandwidth_rule,
    gaussian_attention_weights,
    rule_bandwidth,
)

from .. import naive
from ..strategies import pooling_shapes, seeds


def _rel_err(got, ref):
    return np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300)


@pytest.mark.parametrize("d", [1, 2, 5, 16])
@pytest.mark.parametrize("n_outputs", [None, 1, 3])
def test_float64_matches_naive(rng, d, n_outputs):
    q, k = rng.normal(size=(37, d)), rng.normal(size=(301, d))
    v = rng.normal(size=301) if n_outputs is None else rng.normal(size=(301, n_outputs))
    h = rng.uniform(0.3, 2.0, size=d)
    got = nbattn.nadaraya_watson(q, k, v, h)
    assert got.shape == ((37,) if n_outputs is None else (37, n_outputs))
    assert _rel_err(got, naive.nadaraya_watson(q, k, v, h)) <= 1e-12


@pytest.mark.parametrize("d", [1, 4])
def test_float32_within_1e5_of_output_scale(rng, d):
    q, k = rng.normal(size=(50, d)), rng.normal(size=(700, d))
    v = rng.normal(size=(700, 2))
    got = nbattn.nadaraya_watson(q, k, v, 0.7, dtype="float32")
    assert got.dtype == np.float32
    assert _rel_err(got, naive.nadaraya_watson(q, k, v, 0.7)) <= 1e-5


def test_float32_inputs_compute_in_float32(rng):
    q, k, v = (rng.normal(size=(9, 2)).astype(np.float32) for _ in range(3))
    assert nbattn.nadaraya_watson(q, k, v[:, 0], 1.0).dtype == np.float32


@pytest.mark.parametrize("n_keys", [1, 255, 1023, 1024, 1025, 2500])
def test_exclude_self_is_leave_one_out(rng, n_keys):
    x = rng.normal(size=(n_keys, 2))
    y = rng.normal(size=n_keys)
    got, lse = nbattn.nadaraya_watson(x, x, y, 0.5, exclude_self=True, return_lse=True)
    if n_keys == 1:  # no admissible key: zeros and lse = -inf, never NaN
        assert got[0] == 0.0 and lse[0] == -np.inf
        return
    assert _rel_err(got, naive.nadaraya_watson(x, x, y, 0.5, exclude_self=True)) <= 1e-12
    ref_lse = naive.nadaraya_watson_lse(x, x, 0.5, exclude_self=True)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_online_rescaling_across_key_blocks(dtype):
    # Keys sorted by distance, farthest first: every block raises the running
    # max, so the rescaling path runs once per block (KEY_BLOCK = config value).
    from nbattn import config

    n = 3 * config.KEY_BLOCK + 17
    keys = np.linspace(40.0, 0.0, n)[:, None]
    values = np.cos(keys[:, 0])
    queries = np.array([[0.0], [-3.0], [20.0]])
    got = nbattn.nadaraya_watson(queries, keys, values, 0.5, dtype=dtype)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert _rel_err(got, naive.nadaraya_watson(queries, keys, values, 0.5)) <= tol


def test_one_query_one_key():
    assert nbattn.nadaraya_watson([[0.3]], [[5.0]], [7.0], 0.1)[0] == 7.0


def test_non_contiguous_and_dataframe_inputs(rng):
    pd = pytest.importorskip("pandas")
    big = rng.normal(size=(200, 6))
    q, k = big[::3, ::2], big[1::2, 1::2]  # strided views
    v = rng.normal(size=(k.shape[0], 4))[:, ::2]
    ref = naive.nadaraya_watson(q, k, v, 0.8)
    assert _rel_err(nbattn.nadaraya_watson(q, k, v, 0.8), ref) <= 1e-12
    qdf, kdf = pd.DataFrame(q), pd.DataFrame(k)
    assert _rel_err(nbattn.nadaraya_watson(qdf, kdf, pd.DataFrame(v), 0.8), ref) <= 1e-12


def test_far_query_gets_nearest_value_not_nan():
    keys = np.array([[0.0], [1.0], [2.0]])
    values = np.array([10.0, 20.0, 30.0])
    queries = np.array([[-1e4], [1e4]])
    with np.errstate(all="ignore"):
        assert np.isnan(naive.textbook_nadaraya_watson(queries, keys, values, 1.0)).all()
    np.testing.assert_array_equal(nbattn.nadaraya_watson(queries, keys, values, 1.0), [10, 30])


@pytest.mark.parametrize("h", [1e-6, 1e6])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_extreme_bandwidths(rng, h, dtype):
    k = rng.uniform(0, 1, size=(100, 1))
    v = rng.normal(size=100)
    q = rng.uniform(0, 1, size=(20, 1))
    got = nbattn.nadaraya_watson(q, k, v, h, dtype=dtype)
    assert np.isfinite(got).all()
    if h == 1e6:  # every weight equal: the mean
        np.testing.assert_allclose(got, v.mean(), rtol=1e-5)
    else:  # only the nearest key counts
        nearest = np.abs(q - k.T).argmin(axis=1)
        np.testing.assert_allclose(got, v[nearest], rtol=1e-6)


def test_weight_matrix_matches_naive_and_prediction(rng):
    q, k, v = rng.normal(size=(13, 3)), rng.normal(size=(40, 3)), rng.normal(size=40)
    w = gaussian_attention_weights(q, k, 0.9)
    assert _rel_err(w, naive.nadaraya_watson_weights(q, k, 0.9)) <= 1e-12
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-13)
    assert _rel_err(w @ v, nbattn.nadaraya_watson(q, k, v, 0.9)) <= 1e-12
    w_loo = gaussian_attention_weights(k, k, 0.9, exclude_self=True)
    assert np.all(np.diag(w_loo) == 0.0)


@settings(max_examples=25)
@given(
    shape=pooling_shapes(queries=40, keys=600, features=16, outputs=3),
    seed=seeds,
    f32=st.booleans(),
)
def test_random_shapes_property(shape, seed, f32):
    n_queries, n_keys, d, n_outputs = shape
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(n_queries, d)), rng.normal(size=(n_keys, d))
    v = rng.normal(size=(n_keys, n_outputs))
    h = rng.uniform(0.2, 3.0, size=d)
    dtype = "float32" if f32 else "float64"
    got = nbattn.nadaraya_watson(q, k, v, h, dtype=dtype)
    assert _rel_err(got, naive.nadaraya_watson(q, k, v, h)) <= (1e-5 if f32 else 1e-12)


def test_bandwidth_rules_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(1).normal(size=(400, 1)) * 3.0
    kde = stats.gaussian_kde(x[:, 0])
    np.testing.assert_allclose(bandwidth_rule(x, "scott"), kde.factor * x.std(ddof=1), rtol=1e-12)
    kde_s = stats.gaussian_kde(x[:, 0], bw_method="silverman")
    np.testing.assert_allclose(
        bandwidth_rule(x, "silverman"), kde_s.factor * x.std(ddof=1), rtol=1e-12
    )


def test_constant_feature_gets_unit_spread():
    x = np.column_stack([np.arange(10.0), np.full(10, 3.0)])
    h = bandwidth_rule(x, "scott")
    assert np.isfinite(h).all() and h[1] == pytest.approx(10 ** (-1 / 6))


@pytest.mark.parametrize("rule", ["scott", "silverman"])
def test_rule_bandwidth_is_the_one_rule(rng, rule):
    """bandwidth_rule = rule_bandwidth(std, n): the entry point for spreads measured elsewhere."""
    x = rng.normal(size=(60, 3)) * [1.0, 1e-3, 1e3]
    x[:, 1] = 2.0  # constant: unit spread
    expected = rule_bandwidth(x.std(axis=0, ddof=1), 60, rule)
    np.testing.assert_allclose(bandwidth_rule(x, rule), expected, rtol=1e-12)
    assert expected[1] == pytest.approx(BANDWIDTH_RULES[rule](60, 3))
    with pytest.raises(ValueError, match="bandwidth rule must be one of"):
        rule_bandwidth(np.ones(3), 60, "scot")
    with pytest.raises(ValueError, match="bandwidth rule must be one of"):
        bandwidth_rule(x, "scot")


def test_agrees_with_statsmodels_kernelreg():
    kr = pytest.importorskip("statsmodels.nonparametric.kernel_regression")
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 5, size=(80, 2))
    y = np.sin(x[:, 0]) + x[:, 1] ** 0.5 + rng.normal(0, 0.2, 80)
    q = rng.uniform(0, 5, size=(30, 2))
    h = np.array([0.4, 0.7])
    model = kr.KernelReg(y, x, var_type="cc", reg_type="lc", bw=h)
    ref, _ = model.fit(q)
    np.testing.assert_allclose(nbattn.nadaraya_watson(q, x, y, h), ref, rtol=1e-10)


def test_average_pooling_is_the_mean(rng):
    v = rng.normal(size=(30, 2))
    np.testing.assert_allclose(
        nbattn.average_pooling(np.zeros((4, 1)), v), np.tile(v.mean(0), (4, 1))
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(queries=[[np.nan]]), "queries contains NaN"),
        (dict(keys=[[np.inf], [1.0]]), "keys contains NaN or inf"),
        (dict(values=[np.nan, 1.0]), "values contains NaN"),
        (dict(queries=np.empty((0, 1))), "queries is empty"),
        (dict(queries=[[1.0, 2.0]]), "queries has 2 features but keys has 1"),
        (dict(values=[1.0, 2.0, 3.0]), "values has 3 rows but keys has 2"),
        (dict(bandwidth=0.0), "bandwidth must be positive"),
        (dict(bandwidth=-1.0), "bandwidth must be positive"),
        (dict(bandwidth=float("nan")), "bandwidth must be positive"),
        (dict(bandwidth=[1.0, 2.0]), "bandwidth has 2 entries"),
        (dict(bandwidth="wide"), "bandwidth rule must be one of"),
        (dict(queries=[["a"]]), "queries must be numeric"),
        (dict(exclude_self=True, queries=[[1.0]]), "same number of rows"),
        (dict(dtype="float16"), "dtype must be"),
    ],
)
def test_bad_input_names_the_problem(kwargs, match):
    args = dict(queries=[[0.5], [1.5]], keys=[[0.0], [1.0]], values=[1.0, 2.0], bandwidth=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        nbattn.nadaraya_watson(**args)


def test_inputs_are_not_modified(rng):
    q, k, v = rng.normal(size=(5, 2)), rng.normal(size=(8, 2)), rng.normal(size=8)
    copies = [a.copy() for a in (q, k, v)]
    nbattn.nadaraya_watson(q, k, v, "scott", exclude_self=False)
    for a, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(a, c)
