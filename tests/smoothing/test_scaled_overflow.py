"""Finite data that overflows only once nbattn divides it by its widths.

Every public function that scales data by widths either gives the right answer
(centring first, or scaling before subtracting, keeps the value representable)
or refuses the input with a message naming the argument, the row and the column
and saying what overflowed; no RuntimeWarning escapes on the way (warnings are
errors in these tests), and no NaN, inf or silent 0 comes back.
"""

import warnings

import numpy as np
import pytest

import nbattn
from nbattn._core import validation
from nbattn.estimators import LocalPolynomialRegressor, NadarayaWatsonRegressor
from nbattn.smoothing.regression import gaussian_attention_weights, nadaraya_watson_spread

from .. import naive

BIG = 1.7e308
# keys spanning the float64 range: x - median overflows for the last key
KEYS = np.array([-BIG, -BIG, BIG])
VALUES = np.array([1.0, 2.0, 3.0])
QUERIES = np.array([BIG, -BIG])


def _pool(name, queries, keys, values, bandwidth, dtype):
    """The prediction of public function ``name`` (1-D data, one output)."""
    q2, k2 = np.asarray(queries)[:, None], np.asarray(keys)[:, None]
    if name == "nadaraya_watson":
        return nbattn.nadaraya_watson(queries, keys, values, bandwidth, dtype=dtype)
    if name == "nadaraya_watson_spread":
        return nadaraya_watson_spread(queries, keys, values, bandwidth, dtype=dtype)[0]
    if name == "gaussian_attention_weights":
        return gaussian_attention_weights(queries, keys, bandwidth, dtype=dtype) @ values
    if name == "local_polynomial_0":
        return nbattn.local_polynomial(queries, keys, values, bandwidth, degree=0, dtype=dtype)
    if name == "local_polynomial_1":
        return nbattn.local_polynomial(queries, keys, values, bandwidth, degree=1, dtype=dtype)
    if name == "NadarayaWatsonRegressor":
        model = NadarayaWatsonRegressor(bandwidth=bandwidth, dtype=dtype).fit(k2, values)
        return model.predict(q2)
    if name == "LocalPolynomialRegressor":
        model = LocalPolynomialRegressor(degree=0, bandwidth=bandwidth, dtype=dtype)
        return model.fit(k2, values).predict(q2)
    raise AssertionError(name)


POOLS = [
    "nadaraya_watson",
    "nadaraya_watson_spread",
    "gaussian_attention_weights",
    "local_polynomial_0",
    "local_polynomial_1",
    "NadarayaWatsonRegressor",
    "LocalPolynomialRegressor",
]
#: the functions that lay the scaled data out in the computation's dtype
IN_DTYPE = {
    "nadaraya_watson",
    "nadaraya_watson_spread",
    "gaussian_attention_weights",
    "NadarayaWatsonRegressor",
}


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("name", POOLS)
def test_centring_that_overflows_is_computed_in_a_safer_order(name):
    """x - median overflows (1.7e308 - -1.7e308); scaled first it does not: the exact
    answer (the nearest keys' values), not 'contains NaN or inf'."""
    got = _pool(name, QUERIES, KEYS, VALUES, 2.0, "float64")
    expected = naive.nadaraya_watson_exact(QUERIES, KEYS, VALUES, 2.0)
    np.testing.assert_allclose(expected, [3.0, 1.5])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(IN_DTYPE))
def test_float32_layout_beyond_its_range_names_row_and_column(name):
    """The scaled coordinates fit float64 but not float32: a float32 computation is
    refused naming the argument, row and column (float64 gives the answer)."""
    queries, keys = np.array([0.5, 1e38]), np.array([0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"queries row 1, column 0: .*1e\+38.*float32 range"):
        _pool(name, queries, keys, VALUES, 0.1, "float32")
    got = _pool(name, queries, keys, VALUES, 0.1, "float64")
    np.testing.assert_allclose(got, naive.nadaraya_watson_exact(queries, keys, VALUES, 0.1))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", POOLS)
@pytest.mark.parametrize("width", [1e-3, 1e-300, 2.3e-308])
def test_small_widths_that_overflow_the_data_name_row_and_column(name, dtype, width):
    """1e308 / 0.001 (and tiny normal widths over ordinary data) has no float64 value."""
    queries, keys = np.array([0.0, 1e308]), np.array([0.0, 1e308, 2.0])
    if width < 1e-200:
        queries, keys = queries / 1e290, keys / 1e290
    with pytest.raises(ValueError, match=r"(queries|keys) row \d, column 0: .* overflows float64"):
        _pool(name, queries, keys, VALUES, width, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", POOLS)
def test_subnormal_width_is_refused_naming_the_bandwidth(name, dtype):
    with pytest.raises(ValueError, match="bandwidth.*subnormal"):
        _pool(name, np.array([0.0]), np.array([0.0, 1.0]), VALUES[:2], 1e-310, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", POOLS)
def test_widths_near_the_float64_limit_are_not_a_silent_zero_scale(name, dtype):
    """h sqrt 2 overflows for h = 1.5e308: 1 / (h sqrt 2) came out 0 with a warning,
    and every key weighed the same; the same problem scaled down by 2**-1000 (exact)
    gives the reference."""
    queries, keys, h = np.array([-9e307, 9e307]), np.array([-1e308, 0.0, 1e308]), 1.5e308
    got = _pool(name, queries, keys, VALUES, h, dtype)
    down = 2.0**-1000
    expected = _pool(name, queries * down, keys * down, VALUES, h * down, dtype)
    assert np.ptp(expected) > 0.1  # the keys do not all weigh the same
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    if name != "local_polynomial_1":
        exact = naive.nadaraya_watson_exact(queries * down, keys * down, VALUES, h * down)
        np.testing.assert_allclose(got, exact, rtol=1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_loo_loss_names_x_row_and_column(dtype):
    X, y = np.array([0.0, 1e308, 2.0]), VALUES
    with pytest.raises(
        ValueError, match=r"X \(centred on its median\) row 1, column 0: .*overflows"
    ):
        nbattn.loo_loss(X, y, 1e-3, dtype=dtype)
    with pytest.raises(
        ValueError, match=r"X \(centred on its median\) row 1, column 0: .*overflows"
    ):
        nbattn.loo_loss_and_grad(X, y, 1e-3, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_loo_loss_centring_that_overflows(dtype):
    """X - median(X) overflows for [-1.7e308, -1.7e308, 1.7e308]: the column is
    centred on its midrange instead, and the loss is the exact one (the far key's
    leave-one-out prediction is the mean of the two near ones)."""
    X = np.array([-BIG, -BIG, BIG])
    if dtype == "float32":
        with pytest.raises(ValueError, match=r"X \(centred on its median\) row \d.*float32"):
            nbattn.loo_loss(X, VALUES, 2.0, dtype=dtype)
        return
    got = nbattn.loo_loss(X, VALUES, 2.0, dtype=dtype)
    # left out: row 0 -> 2, row 1 -> 1, row 2 -> 1.5 (both others at the same distance)
    assert got == pytest.approx(((2 - 1) ** 2 + (1 - 2) ** 2 + (1.5 - 3) ** 2) / 3, rel=1e-12)


@pytest.mark.parametrize("fit", ["rule", "loo_bandwidth", "LocalPolynomialRegressor"])
def test_a_spread_beyond_float64_is_refused_naming_the_column(fit):
    """The standard deviation of [-1.7e308, -1.7e308, 1.7e308] is beyond float64."""
    X = np.column_stack([VALUES, KEYS])
    with pytest.raises(ValueError, match=r"(X|keys) column 1 spreads beyond the float64 range"):
        if fit == "rule":
            nbattn.nadaraya_watson(X, X, VALUES)
        elif fit == "loo_bandwidth":
            nbattn.loo_bandwidth(X, VALUES)
        else:
            LocalPolynomialRegressor().fit(X, VALUES)


def test_estimators_fit_twice_bit_for_bit():
    k2 = KEYS[:, None]
    first = NadarayaWatsonRegressor(bandwidth=2.0).fit(k2, VALUES).predict(QUERIES[:, None])
    again = NadarayaWatsonRegressor(bandwidth=2.0).fit(k2, VALUES).predict(QUERIES[:, None])
    np.testing.assert_array_equal(first, again)


# ------------------------------------------------------------------ the helper itself


def test_scaled_columns_equals_the_plain_formula_where_nothing_overflows():
    rng = np.random.default_rng(0)
    x, h, c = rng.normal(size=(50, 3)), np.array([0.1, 1.0, 7.0]), rng.normal(size=3)
    np.testing.assert_array_equal(validation.scaled_columns(x, "x", h, centre=c), (x - c) / h)
    s = 1.0 / (h * np.sqrt(2.0))
    got = validation.scaled_columns(x, "x", h, scale=s, centre=c)
    np.testing.assert_array_equal(got, (x - c) * s)
    z32 = validation.scaled_columns(x, "x", h, centre=c, dtype=np.float32)
    assert z32.dtype == np.float32
    np.testing.assert_array_equal(z32, ((x - c) / h).astype(np.float32))


def test_scaled_columns_wording_and_nan():
    x = np.array([[0.0, -1e308], [2.0, 1e308]])
    with pytest.raises(ValueError, match=r"^keys row 0, column 1: -1e\+308 / bandwidth 0.01 over"):
        validation.scaled_columns(x, "keys", [1.0, 0.01])
    with pytest.raises(ValueError, match=r"row 1, column 1: \(1e\+308 - centre -1e\+308\)"):
        validation.scaled_columns(x, "keys", [1.0, 0.5], centre=[0.0, -1e308])
    # a centre that overflows x - centre but not x / h - centre / h
    z = validation.scaled_columns(x, "keys", [1.0, 2.0], centre=[0.0, -1e308])
    np.testing.assert_allclose(z[:, 1], [0.0, 1e308], rtol=1e-15)
    missing = np.array([[np.nan], [1.0]])
    got = validation.scaled_columns(missing, "keys", [2.0], allow_nan=True)
    np.testing.assert_array_equal(got, [[np.nan], [0.5]])


def test_centred_columns_midrange_where_the_median_overflows():
    x = np.column_stack([[1.0, 2.0, 4.0], [-BIG, -BIG, BIG]])
    got = validation.centred_columns(x)
    np.testing.assert_array_equal(got[:, 0], [-1.0, 0.0, 2.0])
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[:, 1], [-BIG, -BIG, BIG])  # midrange 0
