"""Review cases of the bootstrap bands that found defects: targets near float64's top
(the percentile interpolation and the wild residuals overflowed into inf/NaN), and no
queries at the functional layer."""

from fractions import Fraction

import numpy as np
import pytest

import nbattn
from nbattn.local import bands


def _type7(row, level):
    """Hyndman and Fan's type 7 percentile computed exactly with fractions."""
    a = sorted(Fraction(float(v)) for v in row)
    h = Fraction(level) * (len(a) - 1)
    lo = int(h)
    hi = min(lo + 1, len(a) - 1)
    return float(a[lo] + (a[hi] - a[lo]) * (h - lo))


@pytest.mark.parametrize("seed", range(20))
def test_percentiles_of_replicates_near_float_max_are_finite(seed):
    rng = np.random.default_rng(seed)
    reps = rng.uniform(-1.79, 1.79, (3, 1 + seed)) * 1e308
    reps[0] /= 1e300  # an ordinary row beside them keeps numpy's own bits
    levels = [0.025, 0.3, 0.975]
    got = bands.percentiles(reps, levels)
    assert np.isfinite(got).all()
    want = [[_type7(r, q) for r in reps] for q in levels]
    # a + (b - a) t rounds b - a and its product: an ulp or two of max(|a|, |b|)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15 * np.abs(reps).max())
    assert np.array_equal(got[:, 0], np.quantile(reps[0], levels))


@pytest.mark.parametrize("resample", ["wild", "pairs"])
@pytest.mark.parametrize("degree", [0, 1])
def test_band_of_targets_near_float_max_is_the_scaled_band(resample, degree):
    """y times 2**1023 (exact) gives the band times 2**1023, to the bit: finite where that
    is finite (y of both signs reaching 1.7e308: residuals near 3.4e308)."""
    rng = np.random.default_rng(5)
    X = rng.uniform(-2.0, 2.0, (25, 1))
    y = rng.uniform(-1.0, 1.0, 25)
    y *= 1.85 / np.max(np.abs(y))
    Q = np.array([[-1.0], [0.0], [0.7]])
    cls = nbattn.LocalPolynomialRegressor
    options = dict(bandwidth=0.4, degree=degree)
    small = (
        cls(**options)
        .fit(X, y)
        .predict_interval(Q, method="bootstrap", resample=resample, n_boot=200)
    )
    big = (
        cls(**options)
        .fit(X, y * 2.0**1023)
        .predict_interval(Q, method="bootstrap", resample=resample, n_boot=200)
    )
    with np.errstate(over="ignore"):
        want = small * 2.0**1023
    assert not np.isnan(big).any()
    assert np.isfinite(want).any()
    np.testing.assert_array_equal(big, want)


@pytest.mark.parametrize("resample", ["wild", "pairs"])
def test_no_queries_give_empty_ends_and_draw_nothing(resample):
    rng = np.random.default_rng(2)
    X, y = rng.uniform(size=(10, 1)), rng.normal(size=(10, 2))
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.3).fit(X, y)
    Q = X[:0]
    gen = np.random.default_rng(9)
    state = gen.bit_generator.state
    lower, upper = bands.bootstrap_band(
        model._local_spec(Q),
        model.X_fit_,
        model.y_fit_,
        Q,
        model.bandwidth_,
        0,
        n_boot=49,
        resample=resample,
        random_state=gen,
    )
    assert lower.shape == upper.shape == (0, 2)
    assert gen.bit_generator.state == state
