"""The base-2 exponential and the tanh of the flash kernels, inlined where they are
called so that the loops around them vectorise: :func:`exp2` (the flash, pooling and
flex kernels' weights) and :func:`tanh_real` (the softcap, and ``nbattn.flex_tanh``).
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from .. import config
from .._core.numeric import LOG2E
from .fastmath import (
    _bits_to_float32,
    _bits_to_float64,
    _float32_to_bits,
    _float64_to_bits,
    by_float_width,
    horner,
)

__all__ = ["LN2", "TANH_REAL", "exp2", "tanh_real"]

LN2 = 0.6931471805599453


def exp2(x):
    """``2**x`` for a float scalar; inside a kernel an inlined, vectorisable form.

    The kernels work in base 2 (scores carry a factor log2(e)), which spares
    the two-step ln 2 range reduction of ``fast_exp``: with n = round(x) and
    r = x - n (exact, |r| <= 1/2), 2**x = 2**n * 2**r, 2**n built from the
    exponent bits and 2**r a polynomial in r (float32: degree 6, fitted for
    relative error, < 2e-9; float64: the Taylor polynomial of degree 13,
    < 5e-18). n is rounded by adding and subtracting 1.5 * 2**23 (2**52),
    which leaves n in the low bits of the sum: no rounding instruction, and
    those bits give 2**n directly. ``x`` is clamped to [-127, 127] (float32)
    or [-1023, 1023] (float64); at the lower end the exponent field is 0 and
    the result 0, so x < -126.5 (-1022.5) and ``-inf`` give 0 (no subnormal
    results) without a comparison per element.
    """
    return np.exp2(x)


def _taylor_coefficients(degree):
    """(ln 2)**k / k!, highest degree first."""
    coefficients = [1.0]
    for k in range(1, degree + 1):
        coefficients.append(coefficients[-1] * LN2 / k)
    return tuple(reversed(coefficients))


#: 2**r on [-1/2, 1/2], highest degree first: the degree-6 polynomial of least
#: maximum relative error (Lawson's iteration of weighted least squares on 8000
#: Chebyshev nodes), 1.9e-9; the Taylor polynomial of degree 6 would be 1.2e-7.
_C32 = tuple(
    np.float32(c)
    for c in (
        0.00015345807578209935,
        0.0013399931185616998,
        0.009618488973589415,
        0.05550328777069084,
        0.2402264689048136,
        0.6931472057372029,
        1.0000000005541865,
    )
)
_C64 = _taylor_coefficients(13)
_MAGIC32 = np.float32(12582912.0)  # 1.5 * 2**23: adding it leaves n in the low bits
_MAGIC64 = 6755399441055744.0  # 1.5 * 2**52


def _exp2_32(x):
    xc = min(max(x, np.float32(-127.0)), np.float32(127.0))
    shifted = xc + _MAGIC32
    r = xc - (shifted - _MAGIC32)
    p = horner(_C32, r)
    # the low bits of `shifted` hold n: (n + 127) << 23 is 2**n, 0 at n = -127
    n_bits = _float32_to_bits(shifted) - 0x4B400000 + 127
    return p * _bits_to_float32(np.int32(n_bits << 23))


def _exp2_64(x):
    xc = min(max(x, -1023.0), 1023.0)
    shifted = xc + _MAGIC64
    r = xc - (shifted - _MAGIC64)
    p = horner(_C64, r)
    n_bits = _float64_to_bits(shifted) - 0x4338000000000000 + 1023
    return p * _bits_to_float64(n_bits << 52)


# Without "reassoc", as fast_exp: Horner's rule stays in order, and (x + magic) - magic
# is not folded to x.
@overload(exp2, jit_options={"fastmath": config.FASTMATH - {"reassoc"}})
def _exp2_overload(x):
    return by_float_width(x, _exp2_32, _exp2_64)


#: Below this |x| :func:`tanh_real` takes the odd Taylor polynomial (its first omitted
#: term is below 2**-60 of x there; the exponential form's cancellation costs u / 2|x|,
#: 16 units in the last place at the switch).
TANH_SERIES_BELOW = 1.0 / 32.0


def tanh_real(x):
    """tanh(x) in x's dtype (float32 or float64), inside a kernel an inlined form that
    vectorises (no libm call):

        |x| <  1/32: x (1 + x^2 (-1/3 + x^2 (2/15 + x^2 (-17/315 + x^2 62/2835))))
        |x| >= 1/32: sign(x) (1 - e) / (1 + e),   e = exp(-2|x|) = 2**(-2|x| log2 e)

    within a few units in the last place of tanh(x), relatively: a softcap far above
    the scores, where tanh(x) ~ x, keeps them (the exponential form alone rounds
    1 - e to 0 there). Called from Python it is ``np.tanh``."""
    return np.tanh(x)


def _tanh_real_source(float_type):
    """The implementation of :func:`tanh_real` for one float type (its constants in it)."""
    one, two_log2e, switch = float_type(1.0), float_type(2.0 * LOG2E), float_type(TANH_SERIES_BELOW)
    c3, c5 = float_type(-1.0 / 3.0), float_type(2.0 / 15.0)
    c7, c9 = float_type(-17.0 / 315.0), float_type(62.0 / 2835.0)

    def tanh_of(x):
        ax = abs(x)
        x2 = x * x
        series = x * (one + x2 * (c3 + x2 * (c5 + x2 * (c7 + x2 * c9))))
        e = exp2(-ax * two_log2e)
        th = (one - e) / (one + e)
        if x < 0:
            th = -th
        return series if ax < switch else th

    return tanh_of


#: :func:`tanh_real`'s implementation per float bit width (also ``nbattn.flex_tanh``'s).
TANH_REAL = {32: _tanh_real_source(np.float32), 64: _tanh_real_source(np.float64)}


# error_model="numpy": the division needs no zero check (1 + e >= 1), whose branch would
# keep the loop from vectorising (measured 1.8x)
@overload(tanh_real, jit_options={"fastmath": config.FASTMATH, "error_model": "numpy"})
def _tanh_real_overload(x):
    if isinstance(x, types.Float):
        return TANH_REAL[x.bitwidth]
    return None
