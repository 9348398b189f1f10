"""Attention dropout on the GPU: the device twin of ``nbattn.kernels.dropout.keep``.

Counter-based: nothing is stored, and whether the weight of query row i and
key column j of the flattened (batch, query head) index bh survives depends
only on the seed and ``counter = (bh * n_q + i) * n_k + j``, hashed by
SplitMix64's finaliser as ``nbattn.kernels.dropout`` writes out (the constants
are ``nbattn._core.numeric``'s, for both), so the forward and backward
kernels, on any tiling and any number of threads, and the CPU kernels all
drop the same weights.

The wrapping products and sums are written on 32-bit halves
(:func:`mul64`, :func:`add64`), which never overflow a uint64: the CUDA
simulator runs device functions on NumPy scalars, whose overflow warns (and
the test configuration turns warnings of nbattn's modules into errors), so
this one spelling is exact in both places. On a GPU the halves cost a few
integer multiply-adds per weight, next to the 2 D multiply-adds of its
scores; only dropout kernels contain them.
"""

from __future__ import annotations

import numpy as np

from .._core.numeric import DROPOUT_SHIFT, SPLITMIX_GOLDEN, SPLITMIX_MIX1, SPLITMIX_MIX2
from .common import jit

__all__ = ["add64", "counter", "keep", "mul64"]

_U = np.uint64
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
_ONE = np.uint64(1)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@jit(device=True, inline=True)
def mul64(a, b):
    """a * b mod 2**64 for uint64 a, b, from 32-bit halves (no intermediate overflows)."""
    a0 = a & _LOW
    a1 = a >> _32
    b0 = b & _LOW
    b1 = b >> _32
    low = a0 * b0  # < 2**64
    mid = ((a1 * b0) & _LOW) + ((a0 * b1) & _LOW) + (low >> _32)  # < 3 * 2**32
    return ((mid & _LOW) << _32) | (low & _LOW)


@jit(device=True, inline=True)
def add64(a, b):
    """a + b mod 2**64 for uint64 a, b, from 32-bit halves (no intermediate overflows)."""
    low = (a & _LOW) + (b & _LOW)
    high = (a >> _32) + (b >> _32) + (low >> _32)
    return ((high & _LOW) << _32) | (low & _LOW)


@jit(device=True, inline=True)
def counter(bh, i, j, n_q, n_k):
    """(bh * n_q + i) * n_k + j as a uint64 (wrapping), from non-negative integers."""
    row = add64(mul64(_U(bh), _U(n_q)), _U(i))
    return add64(mul64(row, _U(n_k)), _U(j))


@jit(device=True, inline=True)
def keep(seed, count, threshold):
    """True when the weight numbered ``count`` survives dropout (all three uint64).

    ``threshold = round(dropout_p * 2**24)``: a weight is dropped with
    probability threshold / 2**24.
    """
    z = add64(seed, mul64(add64(count, _ONE), SPLITMIX_GOLDEN))
    z = mul64(z ^ (z >> _S30), SPLITMIX_MIX1)
    z = mul64(z ^ (z >> _S27), SPLITMIX_MIX2)
    z = z ^ (z >> _S31)
    return (z >> DROPOUT_SHIFT) >= threshold
