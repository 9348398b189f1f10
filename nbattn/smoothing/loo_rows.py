"""The leave-one-out passes over a range of query rows, and how sums over row ranges run.

Every leave-one-out sum is a sum over query rows i, each left out and predicted
against all n keys, so the rows split into independent ranges ``[a, b)``:
:func:`row_runner` chooses how the ranges run (here, as one call, by default;
``nbattn.dask.sharded_training`` maps them onto a Dask cluster), and every row
task of the smoothing layer goes through :func:`sum_over_rows`.

The row tasks here are the two streaming passes of ``nbattn.kernels.loo`` (or its
CUDA twin), on the kernels' layout of the points (scaled by ``1 / (h sqrt 2)`` or
projected by ``L / sqrt 2``; row-major ``z`` and feature-major ``z_t``):

* pass 1, the pool with the pair (i, i) excluded: ``f_i = f_{-i}(x_i)`` and
  ``lse_i``, and the squared errors ``sum_c (f_ic - y_ic)^2``;
* pass 2, the gradient sums: each score recomputed, the exact weight
  ``w_ij = exp(s_ij - lse_i)`` and ``g_ij = w_ij sum_c r_ic (y_jc - f_ic)`` with
  ``r_i = f_i - y_i``, times the squared differences (diagonal metric) or the
  outer products ``(x_i - x_j)(x_i - x_j)^T`` (full metric).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from .. import config
from .._core.threads import serial_below
from ..dispatch.device import kernels_for
from ..dispatch.transfer import to_host

__all__ = [
    "RowBlock",
    "loo_kernels",
    "loss_from_layout",
    "loss_grad_rows",
    "row_runner",
    "row_runner_active",
    "sum_over_rows",
    "threads_for",
]


def threads_for(pairs):
    """Run the kernels inside on one thread when the call has few pairs (config.SERIAL_PAIRS)."""
    return serial_below(pairs, config.SERIAL_PAIRS)


def loo_kernels(device):
    """(loo, pooling) kernel modules for ``device``, from the one dispatch table."""
    return kernels_for("loo", device), kernels_for("pooling", device)


# --------------------------------------------------------------------------- row ranges

#: How sums over query rows run: None = here, one call over all rows; set by
#: :func:`row_runner`.
_ROW_RUNNER = ContextVar("nbattn_row_runner", default=None)


@contextmanager
def row_runner(runner):
    """Run the LOO passes' sums over query rows through ``runner`` inside the block.

    ``runner(task, n_rows, args)`` must return the sum, over row ranges
    ``[a, b)`` that cover ``range(n_rows)``, of ``task(a, b, *args)`` (a float,
    or a tuple of floats, arrays and :class:`RowBlock`, added elementwise). Each range is left
    out and predicted against all keys, so the ranges are independent:
    ``nbattn.dask.sharded_training`` maps them onto a Dask cluster. ``None``
    runs them here, as one call. Contexts nest and are per thread / task
    (a ``ContextVar``).

    Examples
    --------
    >>> def serial(task, n_rows, args):
    ...     return task(0, n_rows, *args)
    >>> with row_runner(serial):
    ...     loss = loo_loss(X, y)  # doctest: +SKIP
    """
    if runner is not None and not callable(runner):
        raise ValueError(f"runner must be callable or None, got {runner!r}")
    token = _ROW_RUNNER.set(runner)
    try:
        yield runner
    finally:
        _ROW_RUNNER.reset(token)


class RowBlock:
    """Rows ``start ..`` of a per-row result (``rows``, an array whose first axis is the
    rows), one range's part. Blocks add by placing their rows, not by summing: the
    ranges are disjoint, so the sum over the ranges is every row in order, and the
    caller reduces them in the order it would in one call (the same bits however the
    rows were split)."""

    def __init__(self, start, rows):
        self.start = int(start)
        self.rows = np.asarray(rows)

    def __add__(self, other):
        first, second = (self, other) if self.start <= other.start else (other, self)
        if first.start + first.rows.shape[0] != second.start:
            raise ValueError("row blocks add only where one ends where the other starts")
        return RowBlock(first.start, np.concatenate([first.rows, second.rows]))


def row_runner_active() -> bool:
    """Whether a :func:`row_runner` other than the default (one call, here) is in force."""
    return _ROW_RUNNER.get() is not None


def sum_over_rows(task, n_rows, *args):
    """``sum_r task(a_r, b_r, *args)`` over row ranges [a_r, b_r) that cover range(n_rows).

    ``task`` returns a float or a tuple of floats and arrays, summed elementwise.
    """
    runner = _ROW_RUNNER.get()
    if runner is None:
        return task(0, n_rows, *args)
    return runner(task, n_rows, args)


# --------------------------------------------------------------------------- the two passes


def _sse_rows(a, b, z, z_t, v_t, y2, device="cpu"):
    """Sum of squared LOO errors of rows [a, b) (each left out) against all keys."""
    rows = np.arange(a, b, dtype=np.int64)
    with threads_for((b - a) * z.shape[0]):
        kernels = loo_kernels(device)[0]
        total = kernels.loo_squared_error(np.ascontiguousarray(z[a:b]), z_t, v_t, y2[a:b], rows)
    return float(total)


def loss_from_layout(z, z_t, y2, dtype, rows=None, device="cpu"):
    """LOO MSE; with ``rows`` only those rows are left out and predicted (an estimate)."""
    v_t = np.ascontiguousarray(y2.T, dtype=dtype)
    if rows is None:
        return sum_over_rows(_sse_rows, z.shape[0], z, z_t, v_t, y2, device) / y2.size
    with threads_for(rows.size * z.shape[0]):
        total = loo_kernels(device)[0].loo_squared_error(
            np.ascontiguousarray(z[rows]), z_t, v_t, y2[rows], rows
        )
    return float(total) / (rows.size * y2.shape[1])


def loss_grad_rows(a, b, z, z_t, v_t, y2, points, points_t, dtype, device="cpu"):
    """Rows [a, b) of the two LOO passes: ``(sum of squared errors, gradient sums)``.

    Gradient sums are ``loo_grad_diag``'s (k,) when ``points`` is None, else
    ``loo_grad_full``'s (d, d) over the original (centred) points.
    """
    zq = np.ascontiguousarray(z[a:b])
    loo_k, pool_k = loo_kernels(device)
    with threads_for((b - a) * z.shape[0]):
        f, lse = pool_k.gaussian_pool(zq, z_t, v_t, True, a)
        if not isinstance(f, np.ndarray):  # the CUDA pool returns device arrays
            f, lse = to_host(f, lse)
        f = f.astype(np.float64)
        resid = f - y2[a:b]
        resid_k = np.ascontiguousarray(resid, dtype=dtype)
        f_k = np.ascontiguousarray(f, dtype=dtype)
        if points is None:
            sums = loo_k.loo_grad_diag(zq, z_t, v_t, resid_k, f_k, lse, a)
        else:
            pts = np.ascontiguousarray(points[a:b])
            sums = loo_k.loo_grad_full(zq, z_t, pts, points_t, v_t, resid_k, f_k, lse, a)
    return float(np.sum(resid**2)), sums
