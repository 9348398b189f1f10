"""Counter-based dropout random numbers: one definition for the CPU and the GPU.

No mask is ever stored. For the attention weight of query row ``i`` and key
column ``j`` of the flattened (batch*head) slice ``bh`` (the QUERY head), with
``n_q`` rows and ``n_k`` columns,

    counter = (bh * n_q + i) * n_k + j                       (uint64, wrapping)
    z = seed + (counter + 1) * 0x9E3779B97F4A7C15            (uint64, wrapping)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    keep  <=>  (z >> 40) >= threshold,   threshold = round(dropout_p * 2**24)

(the SplitMix64 finaliser of the counter). The decision depends only on the
seed and the weight's position, never on tiling or thread count, so a given
seed gives the same mask on every machine, on any number of threads, in the
forward and in the backward pass (which regenerates it), and on the GPU
(``nbattn.cuda.dropout.keep`` is the bit-for-bit twin).

``nbattn._core.numeric.dropout_seed(random_state)`` is the one way a seed
is made (an int is taken modulo 2**64, ``None`` draws fresh entropy from
NumPy, a ``numpy.random.Generator`` gives one draw), and
``dropout_threshold(p)`` the threshold.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .._core.numeric import DROPOUT_SHIFT, SPLITMIX_GOLDEN, SPLITMIX_MIX1, SPLITMIX_MIX2

_ONE = np.uint64(1)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(cache=config.CACHE)
def keep(seed, counter, threshold):
    """True when the weight at ``counter`` survives dropout (all three uint64)."""
    z = seed + (counter + _ONE) * SPLITMIX_GOLDEN
    z = (z ^ (z >> _S30)) * SPLITMIX_MIX1
    z = (z ^ (z >> _S27)) * SPLITMIX_MIX2
    z = z ^ (z >> _S31)
    return (z >> DROPOUT_SHIFT) >= threshold
