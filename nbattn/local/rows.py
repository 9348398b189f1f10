"""The engine's leave-one-out passes over ranges of query chunks, for a row runner.

The leave-one-out fits and the rows' gradient terms are per training row, each row left
out and fitted against every key, so the rows split into independent ranges.
``nbattn.smoothing.loo_rows.row_runner`` says how ranges run
(``nbattn.dask.sharded_training`` maps them onto a cluster); :func:`loo_fits_rows` and
:func:`loo_gradient_rows` hand it the engine's passes. A range is a range of the
layout's query chunks (``leaves.query_start``: k-d neighbours with rtol > 0, so each task
bounds and prunes its own chunks against the whole tree, as the in-memory pass does
chunk by chunk): each task runs the first pass on its chunks and settles its fallback
rows as the exact path does, and for the gradient runs the second pass on the same
chunks. Tasks return their rows (``loo_rows.RowBlock``), not sums: the caller scores
and sums them in the order it would in one call, so the criterion and its gradient
are the in-memory ones to the bit however the rows were split.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..dispatch.device import kernels_for
from ..smoothing.loo_rows import RowBlock, sum_over_rows
from .engine import fit_layout, threads_for
from .leaves import TreeLayout

__all__ = ["loo_fits_rows", "loo_gradient_rows", "squared_error_slopes"]


def squared_error_slopes(fits, targets, loo_weights):
    """d CV / d fit_{-i} = 2 w_i (fit_{-i} - y_i) (n, n_out) of the weighted squared error."""
    return 2.0 * (fits - targets) * loo_weights[:, None]


def loo_fits_rows(tree: TreeLayout) -> np.ndarray:
    """(n, n_out) the leave-one-out fits of ``tree``'s problem (queries = keys, each left
    out) in the original row order, range by range."""
    n_chunks = tree.leaves.query_start.shape[0] - 1
    fits = sum_over_rows(_chunk_range, n_chunks, tree, None, None, None)
    return tree.from_layout(fits.rows)


def loo_gradient_rows(tree: TreeLayout, targets, loo_weights, cat_dparams):
    """``(fits, per-row gradient)``: the leave-one-out fits (n, n_out) in the original
    order and each row's d (sum_o e_io fit_io) / d theta (n, dc + dk) in the layout's
    (``kernels.local.local_loo_gradient``), e the squared error's slopes
    (:func:`squared_error_slopes`; ``targets`` (n, n_out) and ``loo_weights`` (n,) in
    the original order)."""
    n_chunks = tree.leaves.query_start.shape[0] - 1
    fits, gradient = sum_over_rows(
        _chunk_range,
        n_chunks,
        tree,
        np.ascontiguousarray(tree.to_layout(targets)),
        np.ascontiguousarray(tree.to_layout(loo_weights)),
        np.ascontiguousarray(cat_dparams),
    )
    return tree.from_layout(fits.rows), gradient.rows


def _chunk_range(a, b, tree, targets, loo_weights, cat_dparams):
    """Chunks [a, b) of ``tree``: their fits (a ``RowBlock``), and with ``cat_dparams``
    ``(fits, gradient rows)``; ``targets`` and ``loo_weights`` in the layout's order."""
    starts = tree.leaves.query_start
    part = dataclasses.replace(tree, leaves=tree.leaves._replace(query_start=starts[a : b + 1]))
    fit = fit_layout(part)
    rows = slice(int(starts[a]), int(starts[b]))
    fits = fit.beta[rows, 0, :]
    if cat_dparams is None:
        return RowBlock(rows.start, fits)
    out_weights = np.zeros((fit.beta.shape[0], fits.shape[1]))
    out_weights[rows] = squared_error_slopes(fits, targets[rows], loo_weights[rows])
    problem = part.problem
    module = kernels_for("local", problem.spec.device)
    with threads_for(problem):
        per_query = module.local_loo_gradient(
            *problem.kernel_groups(exclude_self=True),
            fit,
            problem.values_t,
            cat_dparams,
            out_weights,
            part.leaves_on(problem.spec.device),
        )
    return RowBlock(rows.start, fits), RowBlock(rows.start, per_query[rows])
