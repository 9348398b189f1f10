"""What the flex kernels (``nbattn.kernels.flex``, compiled anew per user function) take
from here: :func:`tanh`, the vectorisable tanh for the user's ``score_mod``
(``nbattn.flex_tanh``), and the functions that do not depend on the user's functions
(:func:`block_state`, :func:`band_limits`, :func:`backward_shifts`): compiled once and
cached here, not once per generated module. Their work items run on
:mod:`nbattn.kernels.items`, and the backward's row terms and dQ sum are flash's
compiled-once kernels.
"""

from __future__ import annotations

import cmath

import numpy as np
from numba import njit, types
from numba.extending import overload

from .. import config
from .._core.numeric import LOG2E
from .base2 import TANH_REAL
from .fastmath import like

__all__ = [
    "LIMIT32",
    "LIMIT64",
    "MAX32",
    "backward_shifts",
    "band_limits",
    "block_state",
    "tanh",
]


def tanh(x):
    """``tanh(x)`` for a ``score_mod``: inside the compiled kernel an inlined form that
    vectorises with the score loop (numba's ``np.tanh`` of a float is a call to the
    C library, one element at a time).

    For a real ``x`` (float32 or float64) it is the ``softcap=`` path's
    tanh, ``nbattn.kernels.base2.tanh_real`` (an odd polynomial below 1/32, else
    sign(x) (1 - e) / (1 + e) with e = 2**(-2 ``|x|`` log2(e)); within a few units in
    the last place). For a complex ``x`` it is ``cmath.tanh``, exact, so the
    complex-step derivative of the backward (``nbattn.kernels.flex``) works
    through it. Called from Python it is ``np.tanh`` (arrays too, as the
    reference implementations call a ``score_mod``).
    """
    return np.tanh(x)


def _tanh_complex(x):
    return cmath.tanh(x)


# error_model="numpy": (1 - e) / (1 + e) without the division-by-zero check, whose
# branch (never taken: 1 + e >= 1) would keep the score loop from vectorising.
@overload(tanh, jit_options={"fastmath": config.FASTMATH, "error_model": "numpy"})
def _tanh_overload(x):
    if isinstance(x, types.Complex):
        return _tanh_complex
    if isinstance(x, types.Float):
        return TANH_REAL[x.bitwidth]
    return None


#: The largest score whose base-2 form (times log2(e)) is finite, per tile dtype.
LIMIT64 = float(np.finfo(np.float64).max) / LOG2E
LIMIT32 = float(np.finfo(np.float32).max) / LOG2E
#: The largest float32: a finite float64 score beyond it is stored as it (sign kept).
MAX32 = float(np.finfo(np.float32).max)

#: A bound on the relative rounding error of lse log2(e) (lse from the forward's m ln 2 +
#: log l): 4 ulp, twice what the three roundings can make.
NOISE = 2.0**-50


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def block_state(blocks, b, h, qt, kt):
    """The tile's class in ``blocks``: 0 closed, 1 partial, 2 open."""
    return blocks[
        b if blocks.shape[0] > 1 else 0,
        h if blocks.shape[1] > 1 else 0,
        qt if blocks.shape[2] > 1 else 0,
        kt if blocks.shape[3] > 1 else 0,
    ]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def band_limits(i, j0, nb, band):
    """The tile columns [lo, hi) of row i inside the band."""
    offset, left, right = band
    centre = i + offset - j0
    return min(max(centre - left, 0), nb), min(max(centre + right + 1, 0), nb)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def backward_shifts(lse, like_array):
    """(3, BH, L) in ``like_array``'s dtype: per row of ``lse`` (float64, natural units)
    the shift lse log2(e) as (top, rest, margin) for :func:`_weights`. float32: top =
    float32(shift), rest = the float32 of what top leaves (0 when within the shift's
    rounding error, ``NOISE``), margin 0; float64: top = shift, rest 0, margin its
    rounding error."""
    n_bh, n_q = lse.shape
    out = np.zeros((3, n_bh, n_q), dtype=like_array.dtype)
    for bh in range(n_bh):
        for i in range(n_q):
            shift = lse[bh, i] * LOG2E
            noise = abs(shift) * NOISE
            top = like(shift, like_array)
            out[0, bh, i] = top
            if like_array.itemsize == 4:
                rest = shift - np.float64(top)
                if abs(rest) > noise:
                    out[1, bh, i] = rest
            else:
                out[2, bh, i] = noise
    return out
