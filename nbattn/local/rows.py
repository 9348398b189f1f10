"""The engine's leave-one-out criterion over ranges of query chunks, for a row runner.

The leave-one-out squared error and its gradient are sums over the training rows,
each left out and fitted against every key:

    CV = sum_i w_i sum_o (fit_{-i}(x_i)_o - y_io)^2,    dCV/dtheta = sum_i (its terms),

so the rows split into independent ranges. ``nbattn.smoothing.loo_rows.row_runner``
says how ranges run (``nbattn.dask.sharded_training`` maps them onto a cluster);
:func:`loo_loss_rows` and :func:`loo_loss_and_grad_rows` hand it the engine's passes.
A range is a range of the layout's query chunks (``leaves.query_start``: k-d
neighbours with rtol > 0, so each task bounds and prunes its own chunks against the
whole tree, as the in-memory pass does chunk by chunk): each task runs the first pass
on its chunks, settles its fallback rows as the exact path does, and returns its part
of the criterion (and of the gradient, from the second pass on the same chunks). The
sum equals the in-memory criterion up to the order of additions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..dispatch.device import kernels_for
from ..smoothing.loo_rows import sum_over_rows
from .engine import fit_layout, threads_for
from .leaves import TreeLayout

__all__ = ["loo_loss_and_grad_rows", "loo_loss_rows"]


def loo_loss_rows(tree: TreeLayout, targets, loo_weights) -> float:
    """The leave-one-out squared error of ``tree``'s problem (queries = keys, each left
    out), ``targets`` (n, n_out) and ``loo_weights`` (n,) in the original row order,
    summed over the row runner's ranges of chunks."""
    return float(_run(tree, targets, loo_weights, None)[0])


def loo_loss_and_grad_rows(tree: TreeLayout, targets, loo_weights, cat_dparams):
    """``(CV, gradient sums in the kernels' order)``: :func:`loo_loss_rows` and the
    second pass's sums (``kernels.local.local_loo_gradient``), range by range."""
    loss, grad = _run(tree, targets, loo_weights, np.ascontiguousarray(cat_dparams))
    return float(loss), np.asarray(grad, dtype=np.float64)


def _run(tree, targets, loo_weights, cat_dparams):
    n_chunks = tree.leaves.query_start.shape[0] - 1
    in_layout = np.ascontiguousarray(tree.to_layout(targets))
    weights = np.ascontiguousarray(tree.to_layout(loo_weights))
    return sum_over_rows(_chunk_range, n_chunks, tree, in_layout, weights, cat_dparams)


def _chunk_range(a, b, tree, targets, loo_weights, cat_dparams):
    """Chunks [a, b) of ``tree``: ``(their squared error, their gradient sums)`` (the
    gradient a zero-length array without ``cat_dparams``). ``targets`` and
    ``loo_weights`` in the layout's query order."""
    starts = tree.leaves.query_start
    part = dataclasses.replace(tree, leaves=tree.leaves._replace(query_start=starts[a : b + 1]))
    fit = fit_layout(part)
    rows = slice(int(starts[a]), int(starts[b]))
    residuals = fit.beta[rows, 0, :] - targets[rows]
    loss = float((residuals**2).sum(axis=1) @ loo_weights[rows])
    if cat_dparams is None:
        return loss, np.zeros(0)
    out_weights = np.zeros_like(targets)
    out_weights[rows] = 2.0 * residuals * loo_weights[rows, None]
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
    return loss, per_query.sum(axis=0)
