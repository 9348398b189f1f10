"""The callers' layout pass of the streaming estimators: ``(x - centre) * scale``,
row-major and feature-major in one read (``nbattn.smoothing.regression``), with the
largest magnitude written so that a caller can refuse what its dtype cannot hold.
``nbattn.kernels.pooling`` exposes it (the op module of ``kernels_for("pooling")``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .items import next_item, run_items

__all__ = ["centred_scaled"]


def centred_scaled(x, centre, scale, out, out_t):
    """out[i, f] = (x[i, f] - centre[f]) * scale[f], computed in float64 and rounded once
    to out's dtype; the same into out_t[f, i] when out_t has rows (feature-major).

    One pass for the callers' layout (``nbattn.smoothing.regression``), its chunks of
    rows the work items of :func:`nbattn.kernels.items.run_items`. Returns the
    largest magnitude written (float64, before rounding; inf or NaN where a
    product overflowed or x held one), so the caller can refuse what the
    dtype cannot hold.
    """
    n_chunks = (x.shape[0] + _LAYOUT_ROWS - 1) // _LAYOUT_ROWS
    largest = np.zeros(max(n_chunks, 1))
    run_items(_centred_items, x, centre, scale, out, out_t, largest)
    return float(largest.max())  # NaN wins, as in each chunk


#: Rows per work item of :func:`centred_scaled`.
_LAYOUT_ROWS = 256


@njit(fastmath=False, cache=config.CACHE, nogil=True)
def _centred_items(counter, x, centre, scale, out, out_t, largest):
    """The chunks of rows that ``counter`` hands this thread; ``largest[chunk]`` their
    largest magnitude (NaN once one is NaN)."""
    n, d = x.shape
    write_rows = out.shape[0] == n
    write_t = out_t.shape[0] == d and out_t.shape[1] == n
    n_chunks = (n + _LAYOUT_ROWS - 1) // _LAYOUT_ROWS
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        big = 0.0
        for i in range(chunk * _LAYOUT_ROWS, min(n, (chunk + 1) * _LAYOUT_ROWS)):
            for f in range(d):
                value = (np.float64(x[i, f]) - centre[f]) * scale[f]
                if not abs(value) <= big and big == big:  # larger, or the first NaN
                    big = abs(value)
                if write_rows:
                    out[i, f] = value
                if write_t:
                    out_t[f, i] = value
        largest[chunk] = big
