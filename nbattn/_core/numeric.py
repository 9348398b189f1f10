"""Host-side numeric helpers shared by the functional layers, Dask and the CUDA host wrappers."""

from __future__ import annotations

import numpy as np

#: log2(e): the flash kernels work in base 2 (scores pre-multiplied by it once per tile).
LOG2E = 1.4426950408889634


def power_of_two_scale(magnitude):
    """Per entry, 2**(e - 1) for ``magnitude = m 2**e`` (1/2 <= m < 1); 1 where it is 0.

    ``magnitude / 2 < scale <= magnitude``, and dividing by a power of two is
    exact: the one scaling by which spreads and sums of squares of data near
    1e160 or 1e-170 neither overflow nor underflow (NumPy, host side; used by
    the width rules, the CUDA host wrappers and Dask).
    """
    magnitude = np.asarray(magnitude, dtype=np.float64)
    return np.where(magnitude > 0, np.ldexp(1.0, np.frexp(magnitude)[1] - 1), 1.0)


def median(x, axis=0, skip_nan=False):
    """``np.median`` (``np.nanmedian`` with ``skip_nan``) along ``axis``, except where the
    mean of the two middle values overflows (both near +-1.8e308, an even count): there
    the lower middle value, itself a value of the data. The one centre of columns and
    widths at any magnitude."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        middle = np.nanmedian(x, axis=axis) if skip_nan else np.median(x, axis=axis)
    overflowed = np.isinf(middle)
    if np.any(overflowed):
        quantile = np.nanquantile if skip_nan else np.quantile
        middle = np.where(overflowed, quantile(x, 0.5, axis=axis, method="lower"), middle)
    return middle


def plus_scaled(centre, q, exponent: int):
    """``centre + q 2**exponent`` without overflowing on the way: ``q 2**exponent`` alone
    may pass float64 (q an interval's half-width in units of a power of two that is
    itself near the limit) where the sum does not; there it is computed as
    ``(centre 2**-exponent + q) 2**exponent``, so the result is inf only where the end
    itself lies beyond float64."""
    with np.errstate(over="ignore"):
        wide = np.ldexp(q, exponent)
        end = centre + wide
        far = ~np.isfinite(wide) & np.isfinite(q)
        if np.any(far):
            end = np.where(far, np.ldexp(np.ldexp(centre, -exponent) + q, exponent), end)
    return end


def sum_safe_units(values_t) -> np.ndarray:
    """Per row of ``values_t`` (one output's values), the power of two to divide it by so
    that sums of its products with weights up to about 2**60 neither overflow nor lose
    digits to subnormals: 1 for rows whose max |v| lies in [2**-400, 2**960]; above, the
    division brings the max to [2**959, 2**960) (values 2**1900 below it stay normal);
    below, it brings the max to [1/2, 1) (exact). Each row keeps its own scale, so a
    column near 1e308 costs another column no digit."""
    top = np.max(np.abs(values_t), axis=1) if values_t.shape[1] else np.zeros(values_t.shape[0])
    units = np.ones(values_t.shape[0])
    huge, tiny = top > 2.0**960, (top > 0) & (top < 2.0**-400)
    units[huge] = power_of_two_scale(top[huge]) / 2.0**959
    units[tiny] = power_of_two_scale(top[tiny]) * 2.0
    return units


def within_squares(y):
    """y divided by a power of two near max |y| when that lies beyond 2**+-400, where the
    squared residuals of a leave-one-out criterion overflow or underflow (the division is
    exact and moves every criterion value by the same factor; y of ordinary size is left
    as it is, since an optimiser's stopping test is not scale-free)."""
    top = float(np.max(np.abs(y))) if y.size else 0.0
    if top == 0.0 or 2.0**-400 <= top <= 2.0**400:
        return y
    return y / float(power_of_two_scale(top))


#: The fewest rows a search may start on (``subsample`` of ``nbattn.local.widths``).
MIN_SUBSAMPLE_ROWS = 10


def row_ladder(n, first, growth) -> list:
    """Rows of each stage of a search that starts on subsamples: ``[m, g m, g^2 m, ...,
    n]`` with m = ``first`` and g = ``growth`` (at least 2), every subsample at most half
    of the n rows; ``[n]`` when n < 2 m or ``first`` <= 0."""
    first, growth = int(first), max(int(growth), 2)
    if first <= 0:
        return [n]
    stages = []
    rows = first
    while 2 * rows <= n:
        stages.append(rows)
        rows *= growth
    return stages + [n]


#: Resolution of the dropout probability: ``threshold = round(p * 2**24)``.
DROPOUT_BITS = 24


#: The dropout hash, SplitMix64's finaliser of ``seed + (counter + 1) * GOLDEN``, on the
#: CPU (``kernels.dropout.keep``) and the GPU (``cuda.dropout.keep``): its constants,
#: and the shift that leaves the top ``DROPOUT_BITS`` bits.
SPLITMIX_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SPLITMIX_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
SPLITMIX_MIX2 = np.uint64(0x94D049BB133111EB)
DROPOUT_SHIFT = np.uint64(64 - DROPOUT_BITS)


def dropout_threshold(dropout_p):
    """``uint64(round(dropout_p * 2**24))``: keep a weight iff its 24 random bits are >= this."""
    return np.uint64(round(float(dropout_p) * 2.0**DROPOUT_BITS))


def dropout_seed(random_state):
    """The uint64 dropout seed of ``random_state``.

    int -> ``random_state mod 2**64``; None -> fresh entropy from NumPy;
    ``numpy.random.Generator`` -> one draw of 64 bits. Anything else is a
    ValueError naming ``random_state``.
    """
    if random_state is None:
        random_state = np.random.default_rng()
    if isinstance(random_state, np.random.Generator):
        return np.uint64(random_state.integers(0, 2**64, dtype=np.uint64))
    if isinstance(random_state, (bool, np.bool_)) or not isinstance(
        random_state, (int, np.integer)
    ):
        raise ValueError(
            f"random_state must be None, an int or a numpy.random.Generator, got {random_state!r}"
        )
    return np.uint64(int(random_state) % 2**64)
