"""The leave-one-out fits of a training set with tied rows, from one key per distinct row.

Tables with discrete columns (years of schooling, counts, categories) repeat rows: a
10,000-row sample of CPS1988 (education, experience and four categorical columns) has
3,792 distinct rows. Every row of a tie group has the same weight against every key,
so the leave-one-out criterion streams the distinct rows against the distinct rows
(G^2 pairs instead of n^2): the groups are a problem of their own (a key per group,
weighing log c_g, the group's mean its value), fitted by the engine's first pass with
the group's own key left out. Member i of group g then adds the rest of its group,
whose design is e_1 (the constant's moment and the value's sum only):

    A_i = A_g + c e_1 e_1^T,    V_i = V_g + c y'_i e_1,    c = (c_g - 1) e^a,
    y'_i = (S_g - y_i) / (c_g - 1)

(A = M + ridge diag(0, M_11, ...), the engine's system before normalising; a the score
of a pair equal in every column). With u = A_g^-1 e_1 = g / l (Sherman and Morrison),

    beta_i = beta_g + u c (y'_i - beta_g0) / (1 + c u_0),    g_i = g (1 + r) / (1 + r g_0)

(r = c / l), the same solution as the member's own system: adding to A_00 only raises
the later pivots, so a system whose terms the others' solution keeps keeps them all.
A group whose others' solution dropped a term (or that no other group reaches, without
a tie) is solved directly by the plain pass, one member (the others share its system
and follow from it); a tied group that no other reaches is its tie alone. Where such a
member falls back to a nearest key the pooled path declines (None) and the plain pass
decides. The gradient's
pass is ``nbattn.kernels.local_ties``. The fits agree with the plain pass to rounding
times the conditioning of the local systems: a badly conditioned degree-2 system that
keeps every term (CPS1988 at narrow widths) amplifies the update's rounding, and the
criterion then differs from the plain pass's by up to 1e-6 relative, as both differ
from the dense solve.

:func:`tie_groups` says whether a training problem takes this path: the CPU, no
sample weights, no missing values, fixed widths, and distinct rows at most
``config.LOCAL_TIE_MAX_SHARE`` percent of all rows. The groups' problem is laid out by
``leaves.tree_layout`` as any other: with rtol > 0 in k-d order with pruned leaves,
the bound holding for the sums over the other groups (the rest of a row's group only
adds to them).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .. import config
from .._core.numeric import sum_safe_units
from .._core.threads import serial_below
from ..dispatch.device import kernels_for, resolve_device
from .leaves import TreeLayout, exact_leaves, tree_layout
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
        """``(member_start, members, position)`` of the groups in ``order`` (positions ->
        groups; None: their own order): the rows of the t-th group are
        ``members[member_start[t] : member_start[t + 1]]``, in increasing order, and
        ``position[i]`` is the position of row i's group."""
        by_group, group_start = self._rows_by_group
        if order is None:
            return group_start, by_group, self.group
        sizes = np.diff(group_start)[order]
        member_start = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
        np.cumsum(sizes, out=member_start[1:])
        # the t-th group's rows are by_group[group_start[order[t]] + k], k < sizes[t]
        shift = np.repeat(group_start[order] - member_start[:-1], sizes)
        members = by_group[shift + np.arange(by_group.shape[0])]
        place = np.empty_like(order)
        place[order] = np.arange(order.shape[0])
        return member_start, members, place[self.group]

    @functools.cached_property
    def _rows_by_group(self):
        """``(by_group, group_start)``: the rows sorted by group, in increasing order within
        each (a stable sort, once per grouping: :meth:`members` then only gathers), and
        where each group's rows start."""
        group_start = np.zeros(self.counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.counts.astype(np.int64), out=group_start[1:])
        return np.argsort(self.group, kind="stable").astype(np.int64), group_start


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
        or problem.stretched
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
    :func:`tied_loo_gradient` (module docstring); None where a row falls back to a
    nearest key. Values beyond 2**+-400 are pooled divided by a power of two, as
    ``nbattn.local.engine.fit_problem`` does (exact)."""
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
    member_start, members, group_of_row = ties.members(order)
    module = kernels_for("local", "cpu")
    with serial_below(first.shape[0] ** 2, config.SERIAL_PAIRS):  # as engine.threads_for
        others = module.local_fit(
            *tree.problem.kernel_groups(exclude_self=True),
            tree.problem.values_t,
            False,
            tree.leaves,
        )
    # the rest of each group: weight c = (c_g - 1) e^a, score log c (-inf: no tie, or
    # an ordered column at l = 1, where equal codes weigh nothing)
    counts = ties.counts if order is None else ties.counts[order]
    equal_score = float(np.sum(problem.cat_params[:, 0])) if problem.cat_params.size else 0.0
    tie_score = np.full(counts.shape[0], -np.inf)
    tie_score[counts > 1] = np.log(counts[counts > 1] - 1.0) + equal_score
    tied_groups = tie_score > -np.inf
    # every member's system is the others' plus its tie, A_i = A + c e_1 e_1^T: solved
    # from the others' solution where that keeps every term (module docstring); a tied
    # group that no other reaches is its tie alone (the mean of the others, slopes dropped)
    alone = (others.log_norm == -np.inf) & tied_groups
    reached = others.log_norm > -np.inf
    redo = ~(alone | (reached & np.all(others.g != 0.0, axis=1)))
    p = others.g.shape[1]
    unit = np.zeros(p)
    unit[0] = 1.0
    g = np.where(alone[:, None], unit, others.g)
    shift = np.where(alone, tie_score, others.shift)
    log_norm = np.where(alone, -np.inf, others.log_norm)
    base_beta = np.where(alone[:, None, None], 0.0, others.beta)
    # r = c / l, the tie's weight over the others' (both at the others' running maximum)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_r = tie_score - shift - log_norm  # +inf where the tie is alone
        inv_r = np.exp(-log_r)  # inf without a tie, 0 where it is alone
        g0 = g[:, 0]
        lift = np.where(tied_groups, 1.0 / (inv_r + g0), 0.0)  # r / (1 + r g0)
        grow = np.where(tied_groups, (inv_r + 1.0) / (inv_r + g0), 1.0)  # (1 + r) / (1 + r g0)
    size = counts[group_of_row]
    mean_of_others = np.where(
        size[None, :] > 1,
        (group_sums[:, group_of_row] - row_values) / np.maximum(size - 1.0, 1.0)[None, :],
        0.0,
    )
    base = base_beta[group_of_row]  # (n, p, n_out)
    step = lift[group_of_row, None] * (mean_of_others.T - base[:, 0, :])  # (n, n_out)
    beta = base + g[group_of_row][:, :, None] * step[:, None, :]
    with np.errstate(invalid="ignore"):  # -inf - -inf in the groups solved directly below
        log_norm = np.logaddexp(log_norm, tie_score - shift)
    group_fit = others._replace(g=g * grow[:, None], shift=shift, log_norm=log_norm)
    if redo.any() and not _solve_directly(
        problem, row_values, mean_of_others, tie_score, group_of_row, member_start, members,
        redo, group_fit, beta,
    ):  # fmt: skip
        return None
    if not np.isfinite(beta).all():
        return None
    with np.errstate(over="ignore"):  # a fit beyond float64 is inf, as on the plain pass
        fits = beta[:, 0, :] * units
    return TiedPass(
        fits, tree, member_start, members, group_fit, beta, group_sums, row_values, units
    )


def _solve_directly(
    problem, row_values, others_mean, tie_score, group_of_row, member_start, members, redo,
    fit, beta,
):  # fmt: skip
    """The groups ``redo`` (whose others' solution dropped a term, or that nothing
    reaches) solved on the plain exact pass: their rows of ``beta`` and their state in
    ``fit``. The members of a group share one system A and differ in its right-hand
    side only by the tie's c y'_i e_1, so one member per group (its first) is solved and
    the others follow, beta_i = beta_1 + (c / l) (y'_i - y'_1) g (``others_mean`` the
    y'_i, (n_out, n); the kept terms are the same). The queries are those members and
    the keys every row with them first, so that query k is key k as the pass excludes
    it. False where one of them falls back to a nearest key (the plain pass breaks ties
    between nearest keys in the original order: it decides)."""
    groups = np.flatnonzero(redo)
    firsts = members[member_start[groups]]
    rest = np.ones(group_of_row.shape[0], dtype=np.bool_)
    rest[firsts] = False  # the other rows in increasing order (a mask: setdiff1d sorts)
    keys = np.concatenate([firsts, np.flatnonzero(rest)])
    subset = dataclasses.replace(
        problem,
        q_cont=np.ascontiguousarray(problem.q_cont[firsts]),
        q_cat=np.ascontiguousarray(problem.q_cat[firsts]),
        keys_cont_t=np.ascontiguousarray(problem.keys_cont_t[:, keys]),
        keys_cat_t=np.ascontiguousarray(problem.keys_cat_t[:, keys]),
        log_weights=np.ascontiguousarray(problem.log_weights[keys]),
        values_t=np.ascontiguousarray(row_values[:, keys]),
    )
    with serial_below(firsts.shape[0] * keys.shape[0], config.SERIAL_PAIRS):
        direct = kernels_for("local", "cpu").local_fit(
            *subset.kernel_groups(exclude_self=True),
            subset.values_t,
            False,
            exact_leaves(subset),
        )
    if np.any(direct.log_norm == -np.inf):
        return False
    fit.g[groups] = direct.g
    fit.shift[groups] = direct.shift
    fit.log_norm[groups] = direct.log_norm
    # the other members: c / l = exp(tie score - shift - log l) of their group's system
    position = np.full(redo.shape[0], -1)
    position[groups] = np.arange(groups.shape[0])
    rows = np.flatnonzero(redo[group_of_row])
    at = position[group_of_row[rows]]
    with np.errstate(invalid="ignore"):  # no tie: -inf - finite, c / l = 0
        ratio = np.exp(tie_score[groups] - direct.shift - direct.log_norm)
    ratio = np.where(np.isnan(ratio), 0.0, ratio)
    moved = others_mean[:, rows] - others_mean[:, firsts[at]]  # (n_out, rows)
    step = ratio[at, None] * moved.T  # (rows, n_out)
    beta[rows] = direct.beta[at] + direct.g[at][:, :, None] * step[:, None, :]
    return True


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
