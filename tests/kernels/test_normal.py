"""The vectorisable normal CDF (``nbattn.kernels.normal``) against mpmath and scipy's
``log_ndtr``: Phi to about 1e-15 relative where it is a normal float64 (scipy's ``ndtr``
is off by z^2 2^-53 relative in the lower tail: its erfc's argument is rounded), log Phi
through its parts to the last bits in the far lower tail, where Phi underflows."""

import mpmath
import numpy as np
from numba import njit
from scipy.special import log_ndtr

from nbattn import config
from nbattn.kernels.normal import normal_cdf, normal_cdf_parts


@njit(fastmath=config.FASTMATH)
def _phi(z, out, exponents, factors):
    for i in range(z.size):  # the loop the density kernels vectorise
        out[i] = normal_cdf(z[i])
        exponents[i], factors[i] = normal_cdf_parts(z[i])


def _evaluate(z):
    out, exponents, factors = np.empty_like(z), np.empty_like(z), np.empty_like(z)
    _phi(z, out, exponents, factors)
    return out, exponents, factors


def test_phi_matches_scipy_in_the_body():
    rng = np.random.default_rng(0)
    z = np.concatenate(
        [np.linspace(-37.4, 9.0, 1501), rng.normal(size=500) * 6, [0.0, -0.0, 1e-300, -1e-300]]
    )
    phi, exponents, factors = _evaluate(z)
    with mpmath.workdps(30):
        exact = np.array([float(mpmath.ncdf(mpmath.mpf(float(v)))) for v in z])
    np.testing.assert_allclose(phi, exact, rtol=1e-15, atol=0)
    body = z < -1.0  # log Phi is not small: relative accuracy of the parts
    np.testing.assert_allclose(
        exponents[body] + np.log(factors[body]), log_ndtr(z[body]), rtol=4e-16 * 32, atol=0
    )
    upper = z >= 0.0  # Phi in [1/2, 1]: the factor is Phi itself, no exponent
    assert np.all(exponents[upper] == 0.0)
    np.testing.assert_allclose(factors[upper], exact[upper], rtol=1e-15, atol=0)


def test_log_phi_is_exact_far_in_the_lower_tail():
    z = -np.geomspace(38.5, 1e150, 400)
    phi, exponents, factors = _evaluate(z)
    assert np.all(phi == 0.0)  # below the smallest normal float64
    assert np.all(factors > 0.0)  # but the factor never underflows
    np.testing.assert_allclose(exponents + np.log(factors), log_ndtr(z), rtol=1e-15, atol=0)
    _, exponents, factors = _evaluate(np.array([-1e200, -np.inf]))
    assert np.all(exponents == -np.inf)  # x^2 / 2 beyond float64: log Phi = -inf
