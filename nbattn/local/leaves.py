"""A local problem's keys in k-d order, cut into leaves: what ``rtol > 0`` lets the passes skip.

With ``spec.rtol > 0`` the local passes (``nbattn.kernels.local_leaves``) drop,
per chunk of neighbouring queries, the leaves of keys of smallest certified
weight bound while their sum stays within ``rtol`` times a lower bound on each
query's normaliser: each moment sum of the local fit (the normaliser l, M,
V / max|y|) then moves by at most ``rtol`` times l, and the fit by at most

    |fit - fit_exact| <= 2 rtol / (1 - rtol) ||g||_1 max_j |y_j - x_j . beta|

over the keys j of the query (g = (M/l + R)^-1 e_1, the equivalent-kernel
vector; ||g||_1 = 1 for the local constant), wherever the pruned and the exact
solves keep the same terms: a design at the edge of its rank (fewer distinct
keys than terms nearby) may drop another term under any perturbation of its
moments, this one included, and the truncated solve then jumps.

:func:`tree_layout` orders the keys once per problem (that is, once per width
vector: the order follows the widths): a k-d split of the continuous columns
scaled by their widths and of the category codes, each code step stretched to
the distance whose Gaussian weight equals the column's mismatch factor, so that
a category near exact matching is split first and its leaves hold one code (a
leaf of other codes is then bounded by the mismatch term). The leaves' boxes,
code ranges and weight ranges go to the kernels in a ``LocalLeaves``. With
exclude_self (the leave-one-out fit) the queries, being the keys, take the same
order, so that query i still meets its own key at position i, and the keys' leaves
as their chunks; otherwise they take a k-d order of their own, cut into leaves.
The kernels bound each chunk (at most ``config.QUERY_BLOCK`` queries of one leaf)
against each key leaf together.

The exact path (rtol = 0, fewer than ``config.LOCAL_TREE_MIN_KEYS`` keys,
missing values, no column, or a sample of the chunks that would visit more than
``config.LOCAL_TREE_MAX_SHARE`` percent of the keys: the bounds would cost more
than they save) keeps the problem as it is with one leaf: the kernels' sums are
then the exact ones, to the bit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import config
from .._core.local_groups import AllKeys, BlockRuns, LocalLeaves
from ..dispatch.device import kernels_for, resolve_device
from .problem import LocalProblem

__all__ = ["TreeLayout", "exact_leaves", "tree_layout"]

#: Largest stretch of one code step in the k-d split (a category at exact matching
#: has an infinite mismatch cost; this many widths already splits it first).
_MOST_CODE_STRETCH = 64.0


def exact_leaves(problem) -> AllKeys:
    """Every key for every query: the exact passes. ``problem``: a ``LocalProblem``
    or a ``LocalData`` (the same array names)."""
    return AllKeys(query_start=_chunks(np.array([0, problem.q_cont.shape[0]], dtype=np.int64)))


@dataclasses.dataclass
class TreeLayout:
    """A problem in the order its passes read, its leaves, and the way back.

    ``key_order[t]`` is the original key at position t (None: the original order);
    ``query_order`` likewise for the queries.
    """

    problem: LocalProblem
    leaves: LocalLeaves | AllKeys
    key_order: np.ndarray | None = None
    query_order: np.ndarray | None = None
    #: the problem in its original order (None: ``problem`` is)
    source: LocalProblem | None = None
    #: the GPU's form of ``leaves`` (:meth:`leaves_on`) and the leaves it was built from
    block_runs: tuple | None = None

    def leaves_on(self, device):
        """The leaves as the passes on ``device`` read them: ``leaves`` on the CPU; on the
        GPU, pruned leaves become the key runs of each block of
        ``config.CUDA_THREADS_PER_BLOCK`` queries (``BlockRuns``), computed here on the
        host by the CPU's rule (``kernels.local_leaves.block_runs``), once per layout
        (the first pass and its second passes visit the same keys), built again where
        ``leaves`` is no longer the object they were built from."""
        if not isinstance(self.leaves, LocalLeaves) or resolve_device(device) != "cuda":
            return self.leaves
        if self.block_runs is None or self.block_runs[0] is not self.leaves:
            size = int(config.CUDA_THREADS_PER_BLOCK)
            table, runs = kernels_for("local", "cpu").block_runs(
                size, *self.problem.kernel_groups(), self.leaves
            )
            self.block_runs = (self.leaves, BlockRuns(size, table, runs, self.leaves.rtol))
        return self.block_runs[1]

    def to_layout(self, rows):
        """Per-query rows (n_q, ...) of the original order, in the layout's."""
        return rows if self.query_order is None else rows[self.query_order]

    def from_layout(self, rows):
        """Per-query rows (n_q, ...) of the layout's order, in the original."""
        if self.query_order is None:
            return rows
        out = np.empty_like(rows)
        out[self.query_order] = rows
        return out

    def settled(self, fit):
        """The layout's ``LocalFit`` with each fallback query's nearest key the exact path's.

        A query with no key of positive weight takes its nearest key's value, the first
        of the tied nearest ones (``nbattn.kernels.local``): the first in k-d order in the
        layout's pass, where the exact path takes the first in the original order. Those
        queries are searched again in the original order (the same search, the same
        arithmetic), so that ties (keys on a grid, duplicates with different values) fall
        as they do at rtol = 0."""
        if self.source is None:
            return fit
        rows = np.flatnonzero((fit.log_norm == -np.inf) & (fit.nearest >= 0))
        if rows.size == 0:
            return fit
        nearest_key = kernels_for("local", "cpu").nearest_key
        data = self.source.kernel_groups()[0]
        exclude_self = bool(self.source.exclude_self)
        position = np.empty_like(self.key_order)
        position[self.key_order] = np.arange(self.key_order.shape[0])
        nearest, beta = fit.nearest.copy(), fit.beta.copy()
        for t, i in zip(rows, self.query_order[rows]):
            nearest[t] = position[nearest_key(np.int64(i), data, exclude_self)]
            beta[t, 0, :] = self.problem.values_t[:, nearest[t]]
        return fit._replace(beta=beta, nearest=nearest)

    def original_fit(self, fit):
        """A (settled: :meth:`settled`) ``LocalFit`` of the layout's queries and keys in the
        original order."""
        if self.key_order is None and self.query_order is None:
            return fit
        nearest = fit.nearest
        if self.key_order is not None:
            nearest = np.where(nearest >= 0, self.key_order[np.maximum(nearest, 0)], nearest)
        return type(fit)(*(self.from_layout(part) for part in (*fit[:4], nearest, fit[5])))


def uses_tree(problem: LocalProblem) -> bool:
    """Whether the problem's passes prune (module docstring: otherwise exact)."""
    n_k = problem.log_weights.shape[0]
    columns = problem.keys_cont_t.shape[0] + problem.keys_cat_t.shape[0]
    return (
        problem.spec.rtol > 0.0
        and n_k >= config.LOCAL_TREE_MIN_KEYS
        and not problem.spec.missing
        and columns > 0
    )


def tree_layout(problem: LocalProblem) -> TreeLayout:
    """The problem in k-d order with its leaves (:func:`uses_tree`), else as it is."""
    if not uses_tree(problem):
        return TreeLayout(problem, exact_leaves(problem))
    ops = kernels_for("local", "cpu")
    stretch = _code_stretch(problem)
    points = np.hstack([problem.keys_cont_t.T, problem.keys_cat_t.T * stretch])
    points = np.ascontiguousarray(points)
    order, leaf_start = ops.kd_order(points, int(config.LOCAL_LEAF_KEYS))
    keys_cont_t = np.ascontiguousarray(problem.keys_cont_t[:, order])
    keys_cat_t = np.ascontiguousarray(problem.keys_cat_t[:, order])
    log_weights = np.ascontiguousarray(problem.log_weights[order])
    ordered = dataclasses.replace(
        problem,
        keys_cont_t=keys_cont_t,
        keys_cat_t=keys_cat_t,
        log_weights=log_weights,
        values_t=np.ascontiguousarray(problem.values_t[:, order]),
        sample_weight=None if problem.sample_weight is None else problem.sample_weight[order],
    )
    if problem.exclude_self:  # query i is key i: the same order, the same leaves
        query_order, query_start = order, leaf_start
    else:  # neighbours next to each other: the chunks of queries the kernels bound together
        query_points = np.hstack([problem.q_cont, problem.q_cat * stretch])
        query_order, query_start = ops.kd_order(
            np.ascontiguousarray(query_points), _query_leaf(problem)
        )
    ordered.q_cont = np.ascontiguousarray(problem.q_cont[query_order])
    ordered.q_cat = np.ascontiguousarray(problem.q_cat[query_order])
    leaves = LocalLeaves(
        _chunks(query_start),
        leaf_start,
        *ops.leaf_ranges(keys_cont_t, keys_cat_t, log_weights, leaf_start),
        problem.spec.rtol,
    )
    if not _pays(ops, ordered, leaves):
        return TreeLayout(problem, exact_leaves(problem))
    return TreeLayout(ordered, leaves, order, query_order, problem)


def _pays(ops, ordered: LocalProblem, leaves: LocalLeaves) -> bool:
    """The cost model: whether evenly spaced chunks of queries (``config.LOCAL_TREE_*``)
    visit at most ``LOCAL_TREE_MAX_SHARE`` percent of the keys. No clock is read: the
    choice, like the answer, is the same in every run."""
    n_chunks = leaves.query_start.shape[0] - 1
    sample = min(n_chunks, int(config.LOCAL_TREE_SAMPLE_CHUNKS))
    if sample == 0:
        return False
    chunks = np.unique(np.linspace(0, n_chunks - 1, sample).astype(np.int64))
    data, model = ordered.kernel_groups()
    share = ops.visited_share(data, model, leaves, chunks)
    return share * 100.0 <= config.LOCAL_TREE_MAX_SHARE


def _query_leaf(problem: LocalProblem) -> int:
    """Queries per chunk of a prediction: about as many as fall in a key leaf's region,
    ``LOCAL_LEAF_KEYS n_q / n_k``, from 1 (sparse queries are bounded one by one: a chunk
    spread over many widths keeps every leaf it spans) to ``config.QUERY_BLOCK``."""
    n_q, n_k = problem.q_cont.shape[0], problem.log_weights.shape[0]
    share = int(config.LOCAL_LEAF_KEYS) * n_q // max(n_k, 1)
    return int(min(max(share, 1), int(config.QUERY_BLOCK)))


def _chunks(starts) -> np.ndarray:
    """The ranges [starts[t], starts[t + 1]) cut into chunks of at most ``config.QUERY_BLOCK``
    queries (each within its range: a k-d leaf's chunks stay inside its box)."""
    step = int(config.QUERY_BLOCK)
    cuts = [np.arange(a, b, step) for a, b in zip(starts[:-1], starts[1:])]
    return np.concatenate([*cuts, starts[-1:]]).astype(np.int64)


def _code_stretch(problem: LocalProblem) -> np.ndarray:
    """(dk,) the k-d split's length of one code step per categorical column: the distance
    whose Gaussian weight exp(-r^2 / 2) is the mismatch factor exp(b + t - a) (module
    docstring), at most ``_MOST_CODE_STRETCH``."""
    out = np.empty(problem.cat_params.shape[0])
    for k, (a, b, t) in enumerate(problem.cat_params):
        with np.errstate(invalid="ignore"):
            cost = a - (b + t)  # >= 0: a mismatch never weighs more than a match
        if not cost > 0.0:  # 0, or NaN where l is at an end and both terms are -inf
            out[k] = 0.0
        elif cost >= 0.5 * _MOST_CODE_STRETCH**2:
            out[k] = _MOST_CODE_STRETCH
        else:
            out[k] = math.sqrt(2.0 * cost)
    return out
