"""What the flex kernels (``nbattn.kernels.flex``, compiled anew per user function) take
from here: :func:`tanh`, the vectorisable tanh for the user's ``score_mod``
(``nbattn.flex_tanh``). Their work items run on :mod:`nbattn.kernels.items`, and the
backward's row terms and dQ sum are flash's compiled-once kernels.
"""

from __future__ import annotations

import cmath

import numpy as np
from numba import types
from numba.extending import overload

from .. import config
from .base2 import TANH_REAL

__all__ = ["tanh"]


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
