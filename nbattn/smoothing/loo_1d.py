"""The leave-one-out criterion of one-dimensional data at one width, on sorted points.

The width search (:mod:`nbattn.smoothing.width_search`) evaluates the criterion
at some thirty widths. In 1-D on the CPU the points are sorted once, and each width
takes the cheapest of three kernels of ``nbattn.kernels.loo`` (none has a GPU
twin: on the GPU every width runs the full kernel), with ``z = x / (h sqrt 2)``:

* **windowed** (``loo_squared_error_sorted_1d``): each row visits the keys around
  it until their weight falls below exp(-gap) of the nearest one (exact to float64
  rounding), about ``window = 2 n sqrt(gap) / span(z) + 2`` keys: a cost that grows
  with the width;
* **boxed Hermite series** (``loo_squared_error_boxed_rows_1d``, a one-dimensional
  fast Gauss transform): from a window of ``config.LOO_BOXED_MIN_WINDOW`` keys
  per row, while there are at most 4 n boxes of width
  ``2 config.LOO_BOXED_HALF_WIDTH``; O(n) whatever the width, each prediction
  within ``2 config.LOO_BOXED_TOL max|y|`` of the exact one by a bound checked row
  by row (the rows it cannot vouch for are computed by the windowed kernel);
* **Taylor series** about the middle of the range (``loo_squared_error_taylor_1d``):
  on fewer points than that window, at widths where the scaled points span at most
  2 (squared span ``config.LOO_TAYLOR_MAX_SPAN_SQ``); O(n).
"""

from __future__ import annotations

import numpy as np

from .. import config
from ..dispatch.device import kernels_for
from .loo_rows import sum_over_rows, threads_for

__all__ = ["SortedCriterion1D", "boxed_1d_pays"]

#: One row of the boxed series costs about as much as this many pairs of the windowed
#: kernel (0.24 ms for 2,000 rows at any width, the window of about 32 keys per row):
#: the work that ``threads_for`` weighs against ``config.SERIAL_PAIRS``.
_BOXED_PAIRS_PER_ROW = 32


def _cpu_loo():
    """The CPU-only LOO kernels: the windowed, boxed and Taylor 1-D kernels (no GPU twin)."""
    return kernels_for("loo_1d", "cpu")


def boxed_1d_pays(n, span, window):
    """Whether the boxed Hermite series beats the windowed kernel on n sorted 1-D points of
    scaled span ``span`` whose direct window holds ``window`` keys per row."""
    n_boxes = span / (2.0 * config.LOO_BOXED_HALF_WIDTH)
    return window >= config.LOO_BOXED_MIN_WINDOW and n_boxes <= 4.0 * n


class SortedCriterion1D:
    """The LOO MSE of n points in one dimension at any width, the points sorted once.

    Parameters
    ----------
    x : ndarray (n,), float64
    y2 : ndarray (n, p), float64 targets
    dtype : the computation's dtype
    """

    def __init__(self, x, y2, dtype):
        n = x.shape[0]
        order = np.argsort(x, kind="stable")
        self.rank = np.empty(n, dtype=np.int64)  # a row's position in the sorted order
        self.rank[order] = np.arange(n)
        self.x_sorted = x[order]
        self.y_sorted = np.ascontiguousarray(y2[order])
        self.v_sorted = np.ascontiguousarray(self.y_sorted.T, dtype=dtype)
        self.gap = _cpu_loo().prune_gap_for(dtype)
        self.dtype = dtype

    def loss(self, width, rows=None):
        """The LOO MSE at width ``width``; with ``rows`` (indices into the unsorted points)
        only those rows are left out and predicted (an estimate)."""
        n = self.x_sorted.shape[0]
        zs = np.ascontiguousarray(self.x_sorted / (width * np.sqrt(2.0)), dtype=self.dtype)
        span = max(float(zs[-1]) - float(zs[0]), 1e-300)
        window = min(n, n * 2.0 * np.sqrt(self.gap) / span + 2.0)  # typical keys per row
        # medium and wide widths: the boxed series costs O(n) whatever the width
        # (measured faster than the one-centre Taylor series at every width too)
        if boxed_1d_pays(n, span, window):
            return self._boxed(zs, rows)
        n_terms = _cpu_loo().taylor_terms(span * span)
        if n_terms:  # wide on few points: every key counts, and the series costs O(n)
            return self._taylor(zs, n_terms, rows)
        return self._windowed(zs, window, rows)

    def _boxed(self, zs, rows):
        n, p = self.y_sorted.shape
        if rows is None:
            args = (zs, self.v_sorted, self.y_sorted, self.gap)
            return sum_over_rows(_sse_rows_boxed_1d, n, *args) / self.y_sorted.size
        sub = np.sort(self.rank[rows])
        with threads_for(sub.size * _BOXED_PAIRS_PER_ROW):
            total, _ = _cpu_loo().loo_squared_error_boxed_rows_1d(
                zs, self.v_sorted, self.y_sorted, sub, self.gap
            )
        return total / (sub.size * p)

    def _taylor(self, zs, n_terms, rows):
        n, p = self.y_sorted.shape
        if rows is None:
            args = (zs, self.v_sorted, self.y_sorted, n_terms)
            return sum_over_rows(_sse_rows_taylor_1d, n, *args) / self.y_sorted.size
        sub = np.sort(self.rank[rows])
        total = _cpu_loo().loo_squared_error_taylor_1d(
            zs, self.v_sorted, self.y_sorted, sub, n_terms
        )
        return float(total) / (sub.size * p)

    def _windowed(self, zs, window, rows):
        n, p = self.y_sorted.shape
        if rows is None:
            args = (zs, self.v_sorted, self.y_sorted, self.gap, window)
            return sum_over_rows(_sse_rows_sorted_1d, n, *args) / self.y_sorted.size
        sub = np.sort(self.rank[rows])
        with threads_for(sub.size * window):
            total = _cpu_loo().loo_squared_error_sorted_1d(
                zs, self.v_sorted, self.y_sorted, sub, self.gap
            )
        return float(total) / (sub.size * p)


# --------------------------------------------------------------------------- row tasks


def _sse_rows_sorted_1d(a, b, zs, v_sorted, y_sorted, gap, window):
    """Squared LOO errors of sorted rows [a, b) by the windowed kernel."""
    rows = np.arange(a, b, dtype=np.int64)
    with threads_for((b - a) * window):
        total = _cpu_loo().loo_squared_error_sorted_1d(zs, v_sorted, y_sorted, rows, gap)
    return float(total)


def _sse_rows_boxed_1d(a, b, zs, v_sorted, y_sorted, gap):
    """Squared LOO errors of sorted rows [a, b) by the boxed Hermite series (exact to
    ``config.LOO_BOXED_TOL``; rows it cannot vouch for directly)."""
    rows = np.arange(a, b, dtype=np.int64)
    with threads_for(rows.size * _BOXED_PAIRS_PER_ROW):
        total, _ = _cpu_loo().loo_squared_error_boxed_rows_1d(zs, v_sorted, y_sorted, rows, gap)
    return total


def _sse_rows_taylor_1d(a, b, zs, v_sorted, y_sorted, n_terms):
    """Squared LOO errors of sorted rows [a, b) by the Taylor series (O(n) per width)."""
    rows = np.arange(a, b, dtype=np.int64)
    return float(_cpu_loo().loo_squared_error_taylor_1d(zs, v_sorted, y_sorted, rows, n_terms))
