"""Inlined, vectorisable ``exp`` for every CPU kernel.

``np.exp`` inside a numba loop compiles to a scalar libm call on a machine
without SVML, which keeps a kernel about 30x below what the vector units can
do. ``fast_exp`` is written so that LLVM vectorises it: Cody-Waite range
reduction and a polynomial, with ``2**n`` built from the exponent bits.

    exp(x) = 2**n * exp(r),   n = round(x / ln 2),   r = x - n ln 2,  |r| <= ln(2)/2

``exp(r)`` is its Taylor polynomial (degree 12 for float64, 7 for float32),
evaluated by Horner's rule with fused multiply-adds. Measured accuracy over
the whole range (``tests/test_fastmath.py``): at most 2 ulp in float32 and
below 1e-15 relative in float64. Results below the smallest normal number are
flushed to zero (``x < -708.39`` in float64, ``x < -87.33`` in float32); that
includes ``x = -inf``. ``x > 709.43`` (float64) or ``x > 88.37`` (float32) gives
``inf``, slightly before the true overflow (the last half-binade is given up
so that 2**n stays a normal number). The
kernels never pass NaN.

``coarse_exp`` shortens the float64 polynomial to degree 7 (below 1e-8 relative; in the
k-d tree's leaf sums about 1/7 faster) for sums asked for only within a tolerance;
``exp_within`` picks one of the two by an argument's type.

This module holds the natural-base ``fast_exp`` and the ``maxnum`` intrinsic
``fmax``; the row reductions built on them, the one ``row_max`` and the one
``exp_shift_sum``, are in ``nbattn.kernels.softmax``. The blocked attention
kernels (``nbattn.kernels.flash``) keep their own base-2 ``exp2`` on purpose:
they fold log2(e) into the queries once, so each score is already
t = s log2(e) and 2**t needs no ln 2 range reduction (measured 1/3 cheaper in
the softmax loop). Every kernel whose scores arrive in natural units
(pooling, LOO, softmax, masked attention) uses ``fast_exp``: a natural-unit
score passed to ``exp2`` would need the multiplication by log2(e) that
``fast_exp`` does inside its range reduction, so nothing is gained there.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .. import config

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 with its low bits cleared, so n*LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_MAGIC64 = 6755399441055744.0  # 1.5 * 2**52: adding it leaves the integer n in the low bits
_LO64 = -708.39  # exp(-708.39) ~ 2.2e-308, the smallest normal float64
_HI64 = 709.43  # round(x / ln 2) <= 1023, the largest exponent; above: inf

_LN2_HI32 = np.float32(0.693145751953125)
_LN2_LO32 = np.float32(1.428606765330187045e-06)
_LOG2E32 = np.float32(_LOG2E)
_MAGIC32 = np.float32(12582912.0)  # 1.5 * 2**23
_LO32 = np.float32(-87.33)
_HI32 = np.float32(88.37)

#: exp(r) on |r| <= ln(2)/2: its Taylor polynomial, 1/k! highest degree first
#: (degree 12 for float64, 7 for float32).
_EXP64_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(12, -1, -1))

#: The degree of exp(r)'s Taylor polynomial in :func:`coarse_exp` (float64).
COARSE_EXP_DEGREE = 7
#: A bound on :func:`coarse_exp`'s relative error in float64: the truncation error
#: |r|**8 / 8! e**|r| <= 7.4e-9 on |r| <= ln(2)/2 (relative to exp(r) >= e**-|r|), plus
#: the rounding of the reduction and of Horner's rule (a few 1e-16).
COARSE_EXP_RTOL = 1e-8
_EXP64_COARSE_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(COARSE_EXP_DEGREE, -1, -1))
_EXP32_TAYLOR = tuple(np.float32(1.0 / math.factorial(k)) for k in range(7, -1, -1))


def _bitcast(source, target):
    """An intrinsic that reinterprets the bits of a ``source`` scalar as a ``target``
    (an LLVM bitcast of two types of one width: free and vectorisable)."""

    def reinterpret(typingctx, value):
        if value != source:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    reinterpret.__name__ = f"_{source}_as_{target}"
    return intrinsic(reinterpret)


_bits_to_float64 = _bitcast(types.int64, types.float64)
_float64_to_bits = _bitcast(types.float64, types.int64)
_bits_to_float32 = _bitcast(types.int32, types.float32)
_float32_to_bits = _bitcast(types.float32, types.int32)


@njit(inline="always")
def horner(coefficients, r):
    """``c_0 r**n + c_1 r**(n-1) + ... + c_n`` for the tuple ``coefficients`` (highest
    degree first), by Horner's rule ``p <- p r + c_k``, in that order.

    Inlined into its caller, it takes the caller's fast-math flags; with a
    constant tuple LLVM unrolls the loop, so the kernel loop around it vectorises.
    """
    p = coefficients[0]
    for k in range(1, len(coefficients)):
        p = p * r + coefficients[k]
    return p


def by_float_width(x, for_float32, for_float64):
    """What an ``@overload`` of a function of one float scalar returns for the numba type
    ``x``: ``for_float32``, ``for_float64`` (float64), or None (not a float: no match)."""
    if not isinstance(x, types.Float):
        return None
    return for_float32 if x.bitwidth == 32 else for_float64


def fast_exp(x):
    """``exp(x)`` for a float scalar; see the module docstring for accuracy.

    Called from Python it is ``np.exp``; inside a numba kernel it compiles to
    the inlined, vectorisable form.
    """
    return np.exp(x)


# Compiled without "reassoc": it would fold the two-step Cody-Waite reduction
# (x - n*LN2_HI) - n*LN2_LO back into x - n*ln2 and lose 40 bits. LLVM still
# inlines the function into each kernel's loop and vectorises it there.
_EXP_FASTMATH = config.FASTMATH - {"reassoc"}


@overload(fast_exp, jit_options={"fastmath": _EXP_FASTMATH})
def _fast_exp_overload(x):
    return by_float_width(x, _exp32, _exp64)


def _exp64_with(terms):
    """The float64 exponential with the Taylor polynomial ``terms`` of exp(r)."""

    def exp64(x):
        xc = min(max(x, _LO64), _HI64)
        n = np.floor(xc * _LOG2E + 0.5)
        r = (xc - n * _LN2_HI) - n * _LN2_LO
        p = horner(terms, r)
        # n is an integer-valued double; n + 1.5*2**52 holds n in its low mantissa bits.
        # Adding (1023 - bits(1.5*2**52)) then shifting by 52 gives the bits of 2**n.
        n_bits = _float64_to_bits(n + _MAGIC64) - 0x4338000000000000 + 1023
        scale = _bits_to_float64(n_bits << 52)
        result = p * scale
        if x < _LO64:
            result = 0.0
        if x > _HI64:
            result = np.inf
        return result

    return exp64


_exp64 = _exp64_with(_EXP64_TAYLOR)
_exp64_coarse = _exp64_with(_EXP64_COARSE_TAYLOR)


def coarse_exp(x):
    """``exp(x)`` within ``COARSE_EXP_RTOL`` relative error in float64 (``fast_exp`` with
    a Taylor polynomial of degree ``COARSE_EXP_DEGREE`` instead of 12: five fused
    multiply-adds fewer), ``fast_exp`` itself in float32. For sums that are asked
    for only within a tolerance (``nbattn.kernels.tree_pool``)."""
    return np.exp(x)


@overload(coarse_exp, jit_options={"fastmath": _EXP_FASTMATH})
def _coarse_exp_overload(x):
    return by_float_width(x, _exp32, _exp64_coarse)


def exp_within(x, coarse):
    """``coarse_exp(x)`` where ``coarse`` is a bool, ``fast_exp(x)`` where it is None: the
    choice is made by the type, when the caller is compiled (no branch at run time)."""
    return np.exp(x)


@overload(exp_within, inline="always")
def _exp_within_overload(x, coarse):
    if not isinstance(x, types.Float):
        return None
    if isinstance(coarse, types.NoneType):
        return lambda x, coarse: fast_exp(x)
    return lambda x, coarse: coarse_exp(x)


def _exp32(x):
    xc = min(max(x, _LO32), _HI32)
    n = np.floor(xc * _LOG2E32 + np.float32(0.5))
    r = (xc - n * _LN2_HI32) - n * _LN2_LO32
    p = horner(_EXP32_TAYLOR, r)
    n_bits = _float32_to_bits(n + _MAGIC32) - 0x4B400000 + 127
    scale = _bits_to_float32(np.int32(n_bits << 23))
    result = p * scale
    if x < _LO32:
        result = np.float32(0.0)
    if x > _HI32:
        result = np.float32(np.inf)
    return result


def like(value, array):
    """``value`` cast to ``array``'s dtype (float32 kernels stay in float32)."""
    return array.dtype.type(value)


@overload(like, inline="always")
def _like_overload(value, array):
    if array.dtype == types.float32:
        return lambda value, array: np.float32(value)
    return lambda value, array: np.float64(value)


@intrinsic
def fmax(typingctx, a, b):
    """``llvm.maxnum(a, b)`` for two floats of one type.

    Python's ``max`` lowers to compare-and-select, which LLVM vectorises as a
    reduction only under ``nnan`` function attributes that numba never sets;
    a ``maxnum`` reduction vectorises as it is. Inputs are never NaN here.
    """
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(signature.return_type)
        fn = builder.module.declare_intrinsic("llvm.maxnum", [ty], ir.FunctionType(ty, [ty, ty]))
        return builder.call(fn, args)

    return a(a, b), codegen
