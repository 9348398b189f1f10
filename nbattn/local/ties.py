"""The leave-one-out fits of a training set with tied rows, from one key per distinct row.

Tables with discrete columns (years of schooling, counts, categories) repeat rows: a
10,000-row sample of CPS1988 (education, experience and four categorical columns) has
3,792 distinct rows. Every row of a tie group has the same weight against every key,
so the leave-one-out criterion can stream the distinct rows against the distinct rows
(G^2 pairs instead of n^2) and give each member its own system by adding the rest of
its group (``nbattn.kernels.local_ties``, whose docstring has the formulas). The fits
agree with the plain pass to rounding.

:func:`tie_groups` says whether a training problem takes this path: the CPU, no
sample weights, no missing values, and distinct rows at most
``config.LOCAL_TIE_MAX_SHARE`` percent of all rows. The groups are a problem of their
own (a key per group, weighing log c_g), laid out by ``leaves.tree_layout`` as any
other: with rtol > 0 in k-d order with pruned leaves, so a table of many rows and few
distinct ones is both pooled and pruned. :func:`tied_loo_fits` computes the fits; it
returns None where a member's sums weigh nothing (the plain pass's nearest-key
fallback then decides), so the caller runs the plain pass instead;
:func:`tied_loo_gradient` the criterion's gradient on the same leaves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import config
from .._core.numeric import sum_safe_units
from .._core.threads import serial_below
from ..dispatch.device import kernels_for, resolve_device
from .leaves import TreeLayout, tree_layout
from .problem import LocalProblem

__all__ = ["TieGroups", "TiedPass", "tie_groups", "tied_loo_fits", "tied_loo_gradient"]


@dataclasses.dataclass(frozen=True)
class TieGroups:
    """The training rows grouped by equality in every column."""

    #: (G,) int64 one row of each group (its first)
    first: np.ndarray
    #: (n,) int64 each row's group
    group: np.ndarray
    #: (G,) float64 rows per group
    counts: np.ndarray

    def members(self, order=None):
        """``(member_start, members)`` of the groups in ``order`` (positions -> groups;
        None: their own order): the rows of the t-th group are
        ``members[member_start[t] : member_start[t + 1]]``, in increasing order."""
        counts, position = self.counts, self.group
        if order is not None:
            counts = counts[order]
            place = np.empty_like(order)
            place[order] = np.arange(order.shape[0])
            position = place[self.group]
        member_start = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts.astype(np.int64), out=member_start[1:])
        return member_start, np.argsort(position, kind="stable").astype(np.int64)


def tie_groups(problem: LocalProblem) -> TieGroups | None:
    """The tie groups of a leave-one-out training problem, or None where it does not
    take the pooled path (module docstring)."""
    spec = problem.spec
    n = problem.q_cont.shape[0]
    on_cpu = spec.device == "cpu" or (spec.device == "auto" and resolve_device("auto") == "cpu")
    if (
        not problem.exclude_self
        or not on_cpu
        or spec.missing
        or problem.sample_weight is not None
        or n < 2
    ):
        return None
    rows = np.concatenate([problem.q_cont, problem.q_cat], axis=1)
    if rows.shape[1] == 0:
        return None
    _, first, inverse, counts = np.unique(
        rows, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    if 100 * first.shape[0] > config.LOCAL_TIE_MAX_SHARE * n:
        return None
    return TieGroups(
        first=first.astype(np.int64),
        group=inverse.reshape(-1).astype(np.int64),
        counts=counts.astype(np.float64),
    )


@dataclasses.dataclass(frozen=True)
class TiedPass:
    """The first pass over a problem's tie groups, what its gradient pass reads."""

    #: (n, n_out) the leave-one-out fits of the rows
    fits: np.ndarray
    #: the groups' problem in the order its passes read (``leaves.tree_layout``: k-d
    #: order and pruned leaves with rtol > 0), and its leaves
    tree: TreeLayout
    #: the rows of each group in that order (``TieGroups.members``)
    member_start: np.ndarray
    members: np.ndarray
    #: the groups' ``LocalFit`` (shift, log_norm, g) and the members' beta (n, p, n_out)
    group_fit: object
    beta: np.ndarray
    #: the groups' value sums and the rows' values, divided by ``units``
    group_sums: np.ndarray
    row_values: np.ndarray
    #: (n_out,) the power of two each output was divided by
    units: np.ndarray


def tied_loo_fits(problem: LocalProblem, ties: TieGroups) -> TiedPass | None:
    """The first pass over the tie groups at ``problem``'s widths (the criterion's
    ``problem_at``): the rows' leave-one-out fits and the state of
    :func:`tied_loo_gradient`; None where a row's sums weigh nothing. Values beyond
    2**+-400 are pooled divided by a power of two, as
    ``nbattn.local.engine.fit_problem`` does (exact).

    The groups form a problem of their own (one key per group, log c_g its log weight,
    the group's mean its value), which ``leaves.tree_layout`` lays out as any other: with
    ``spec.rtol`` > 0 in k-d order with pruned leaves, the bound holding for the sums
    over the other groups (the rest of a row's group only adds to them)."""
    units = sum_safe_units(problem.values_t)
    row_values = np.ascontiguousarray(problem.values_t / units[:, None])
    group_sums = np.zeros((row_values.shape[0], ties.counts.shape[0]))
    for o in range(row_values.shape[0]):
        group_sums[o] = np.bincount(
            ties.group, weights=row_values[o], minlength=group_sums.shape[1]
        )
    first = ties.first
    pooled = dataclasses.replace(
        problem,
        q_cont=np.ascontiguousarray(problem.q_cont[first]),
        keys_cont_t=np.ascontiguousarray(problem.keys_cont_t[:, first]),
        q_cat=np.ascontiguousarray(problem.q_cat[first]),
        keys_cat_t=np.ascontiguousarray(problem.keys_cat_t[:, first]),
        log_weights=np.log(ties.counts),
        values_t=np.ascontiguousarray(group_sums / ties.counts),
    )
    tree = tree_layout(pooled)
    order = tree.key_order
    if order is not None:
        group_sums = group_sums[:, order]
    member_start, members = ties.members(order)
    module = kernels_for("local_ties", "cpu")
    with serial_below(first.shape[0] ** 2, config.SERIAL_PAIRS):  # as engine.threads_for
        group_fit, beta = module.tied_loo_fits(
            *tree.problem.kernel_groups(exclude_self=True),
            tree.problem.values_t,
            np.ascontiguousarray(group_sums),
            row_values,
            member_start,
            members,
            tree.leaves,
        )
    if np.isnan(beta).any():
        return None
    with np.errstate(over="ignore"):  # a fit beyond float64 is inf, as on the plain pass
        fits = beta[:, 0, :] * units
    return TiedPass(
        fits, tree, member_start, members, group_fit, beta, group_sums, row_values, units
    )


def tied_loo_gradient(tied: TiedPass, cat_dparams, out_weights) -> np.ndarray:
    """sum_i sum_o e_io d fit_io / d theta over the rows (``out_weights`` (n, n_out) the
    e_io), as ``local_loo_gradient`` summed over its queries: (dc + dk,) in the kernels'
    order (continuous columns first), ``cat_dparams`` as there; the first pass's leaves
    (with rtol > 0 the derivative of the pruned sums)."""
    module = kernels_for("local_ties", "cpu")
    # the kernel's fits are the true ones divided by units: e_io units_o gives the same sum
    weights = np.ascontiguousarray(out_weights * tied.units[None, :])
    tree = tied.tree
    with serial_below(tied.group_fit.g.shape[0] ** 2, config.SERIAL_PAIRS):
        per_group = module.tied_loo_gradient(
            *tree.problem.kernel_groups(exclude_self=True),
            tied.group_fit,
            tied.beta,
            tree.problem.values_t,
            tied.group_sums,
            tied.row_values,
            tied.member_start,
            tied.members,
            cat_dparams,
            weights,
            tree.leaves,
        )
    return per_group.sum(axis=0)
