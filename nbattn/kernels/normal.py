"""The standard normal CDF Phi in a form the compiler vectorises (CPU kernels).

``math.erfc`` and ``math.log`` compile to scalar libm calls, which keep a loop over
keys from vectorising (about 56 ns a pair in the conditional CDF's passes). Here, for
x = |z|,

    Phi(-x) = exp(-x^2 / 2) R(x),    R(x) = Phi(-x) exp(x^2 / 2) = erfcx(x / sqrt 2) / 2,

and R, smooth and positive on [0, inf) (R(x) ~ 1 / (x sqrt(2 pi)) as x grows), is
t g(t) with t = 4 / (4 + x) in (0, 1] and g a Chebyshev series of degree 24 in 2t - 1
(coefficients fitted to 40 digits; evaluated by Clenshaw's recurrence): R to 7e-16
relative on the whole half-line. Phi(z) is Phi(-x) for z < 0 and 1 - Phi(-x) otherwise,
chosen by a select, so one loop serves every sign. Only arithmetic, ``fast_exp``
(``nbattn.kernels.fastmath``) and bit operations: loops over these vectorise.

``normal_cdf`` is Phi itself, to about 1e-15 relative where Phi(z) is a normal float64
(z > -37.5; 0 below, where exp(-x^2 / 2) underflows): exp(-x^2 / 2) is taken as
exp(-xh^2 / 2) (1 + d + d^2 / 2 + d^3 / 6 + d^4 / 24), xh = x with its last 27 bits
cleared, so that xh^2 / 2 is exact, and d = -(x - xh)(x + xh) / 2 (|d| < 1e-4 there):
the rounding of x^2 would cost x^2 2^-53 relative (4e-15 at z = -8).
``normal_cdf_parts`` splits Phi(z) as exp(e) v for log-space sums: e = -x^2 / 2 for
z < 0 (0 otherwise) and v = R(x) (or Phi(z) in [1/2, 1]), v never below 1e-300 for
|z| < 1e150, so log Phi(z) = e + log v is exact in the far lower tail, where Phi
underflows, without a logarithm per pair.
"""

from __future__ import annotations

from numba import njit, types
from numba.extending import intrinsic

from .. import config
from .fastmath import _bits_to_float64, _float64_to_bits, fast_exp

__all__ = ["normal_cdf", "normal_cdf_parts", "normal_tail_factor"]

#: The scale of the map t = c / (c + x) of [0, inf) onto (0, 1].
_SCALE = 4.0


@intrinsic
def _divide(typingctx, a, b):
    """a / b for two float64s as one LLVM ``fdiv``: numba's ``/`` checks b against 0 to
    raise ZeroDivisionError, a branch that keeps the loop around it scalar (b is never 0
    here)."""
    if a != types.float64 or b != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return types.float64(a, b), codegen


#: Clears the last 27 bits of a float64: its square is then exact.
_HIGH_BITS = ~((1 << 27) - 1)


#: Chebyshev coefficients of g(t) = R(x) / t in s = 2t - 1 (the first one halved),
#: written into :func:`_chebyshev_series`.
@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _chebyshev_series(s):
    """g(t) at s = 2t - 1: sum_k c_k T_k(s) by Clenshaw's recurrence, written out (a
    loop over a tuple of 25 constants is not unrolled, and then the loop around it does
    not vectorise)."""
    s2 = 2.0 * s
    d = 1.0142661060838386e-17
    dd = 0.0
    d, dd = s2 * d - dd + 7.151235360654053e-18, d
    d, dd = s2 * d - dd + -2.0130368431552333e-16, d
    d, dd = s2 * d - dd + 3.0451658804315853e-16, d
    d, dd = s2 * d - dd + 3.232846081541394e-15, d
    d, dd = s2 * d - dd + -1.2268185079261061e-14, d
    d, dd = s2 * d - dd + -4.353840663163703e-14, d
    d, dd = s2 * d - dd + 3.2821541166777413e-13, d
    d, dd = s2 * d - dd + 4.606201711176235e-13, d
    d, dd = s2 * d - dd + -7.936207374645758e-12, d
    d, dd = s2 * d - dd + -2.485356047851177e-12, d
    d, dd = s2 * d - dd + 1.9435038070971737e-10, d
    d, dd = s2 * d - dd + -2.8206509081173767e-11, d
    d, dd = s2 * d - dd + -5.171627015435708e-09, d
    d, dd = s2 * d - dd + -8.452550300172939e-10, d
    d, dd = s2 * d - dd + 1.536333687349456e-07, d
    d, dd = s2 * d - dd + 2.5258922136865774e-07, d
    d, dd = s2 * d - dd + -4.725842254926741e-06, d
    d, dd = s2 * d - dd + -2.5136847908026697e-05, d
    d, dd = s2 * d - dd + 8.014961859953749e-05, d
    d, dd = s2 * d - dd + 0.0017314801240606202, d
    d, dd = s2 * d - dd + 0.012129438315111521, d
    d, dd = s2 * d - dd + 0.05554838891881276, d
    d, dd = s2 * d - dd + 0.18792720420989265, d
    return s * d - dd + 0.24261280114151915


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def normal_tail_factor(x):
    """R(x) = Phi(-x) exp(x^2 / 2) for x >= 0 (module docstring)."""
    t = _divide(_SCALE, _SCALE + x)
    return t * _chebyshev_series(2.0 * t - 1.0)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def normal_cdf(z):
    """Phi(z) (module docstring): about 1e-15 relative for z > -37.5, 0 below."""
    x = abs(z)
    xh = _bits_to_float64(_float64_to_bits(min(x, 40.0)) & _HIGH_BITS)  # Phi(-40): 0
    d = -0.5 * (min(x, 40.0) - xh) * (min(x, 40.0) + xh)
    correction = 1.0 + d * (1.0 + d * (0.5 + d * (1.0 / 6.0 + d * (1.0 / 24.0))))
    tail = fast_exp(-0.5 * xh * xh) * correction * normal_tail_factor(x)
    return tail if z < 0.0 else 1.0 - tail


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def normal_cdf_parts(z):
    """(e, v) with Phi(z) = exp(e) v (module docstring): the exponent for log-space sums
    and a factor in (1e-300, 1]."""
    x = abs(z)
    factor = normal_tail_factor(x)
    if z < 0.0:
        return -0.5 * x * x, factor
    return 0.0, 1.0 - fast_exp(-0.5 * x * x) * factor
