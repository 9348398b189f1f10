"""The leave-one-out fits of a training set with tied rows, from one key per distinct row.

Tables with discrete columns (years of schooling, counts, categories) repeat rows: a
10,000-row sample of CPS1988 (education, experience and four categorical columns) has
3,792 distinct rows. Every row of a tie group has the same weight against every key,
so the leave-one-out criterion can stream the distinct rows against the distinct rows
(G^2 pairs instead of n^2) and give each member its own system by adding the rest of
its group (``nbattn.kernels.local_ties``, whose docstring has the formulas). The fits
agree with the plain pass to rounding.

:func:`tie_groups` says whether a training problem takes this path: the exact CPU
passes (rtol = 0), no sample weights, no missing values, and distinct rows at most
``config.LOCAL_TIE_MAX_SHARE`` percent of all rows. :func:`tied_loo_fits` computes
the fits; it returns None where a member's sums weigh nothing (the plain pass's
nearest-key fallback then decides), so the caller runs the plain pass instead.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import config
from .._core.local_groups import LocalData
from .._core.numeric import sum_safe_units
from .._core.threads import serial_below
from ..dispatch.device import kernels_for
from .leaves import exact_leaves
from .problem import LocalProblem

__all__ = ["TieGroups", "TiedPass", "tie_groups", "tied_loo_fits", "tied_loo_gradient"]


@dataclasses.dataclass(frozen=True)
class TieGroups:
    """The training rows grouped by equality in every column."""

    #: (G,) int64 one row of each group (its first)
    first: np.ndarray
    #: (G + 1,) int64 where each group's rows start in ``members``, then n
    member_start: np.ndarray
    #: (n,) int64 the rows, group by group, each group's in increasing order
    members: np.ndarray
    #: (G,) float64 rows per group
    counts: np.ndarray


def tie_groups(problem: LocalProblem) -> TieGroups | None:
    """The tie groups of a leave-one-out training problem, or None where it does not
    take the pooled path (module docstring)."""
    spec = problem.spec
    n = problem.q_cont.shape[0]
    if (
        not problem.exclude_self
        or spec.device != "cpu"
        or spec.rtol > 0.0
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
    members = np.argsort(inverse.reshape(-1), kind="stable").astype(np.int64)
    member_start = np.zeros(first.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=member_start[1:])
    return TieGroups(
        first=first.astype(np.int64),
        member_start=member_start,
        members=members,
        counts=counts.astype(np.float64),
    )


@dataclasses.dataclass(frozen=True)
class TiedPass:
    """The first pass over a problem's tie groups, what its gradient pass reads."""

    #: (n, n_out) the leave-one-out fits of the rows
    fits: np.ndarray
    #: the kernels' arguments: the groups' ``LocalData`` and ``LocalModel``, their
    #: ``LocalFit`` (shift, log_norm, g), the members' beta (n, p, n_out), the groups'
    #: means and sums and the rows' values (all divided by ``units``)
    data: object
    model: object
    group_fit: object
    beta: np.ndarray
    means: np.ndarray
    group_sums: np.ndarray
    row_values: np.ndarray
    #: (n_out,) the power of two each output was divided by
    units: np.ndarray


def tied_loo_fits(problem: LocalProblem, ties: TieGroups) -> TiedPass | None:
    """The first pass over the tie groups at ``problem``'s widths (the criterion's
    ``problem_at``): the rows' leave-one-out fits and the state of
    :func:`tied_loo_gradient`; None where a row's sums weigh nothing. Values beyond
    2**+-400 are pooled divided by a power of two, as
    ``nbattn.local.engine.fit_problem`` does (exact)."""
    units = sum_safe_units(problem.values_t)
    values_t = np.ascontiguousarray(problem.values_t / units[:, None])
    group_sums = np.ascontiguousarray(
        np.add.reduceat(values_t[:, ties.members], ties.member_start[:-1], axis=1)
    )
    means = np.ascontiguousarray(group_sums / ties.counts)
    first = ties.first
    data = LocalData(
        np.ascontiguousarray(problem.q_cont[first]),
        np.ascontiguousarray(problem.keys_cont_t[:, first]),
        np.ascontiguousarray(problem.q_cat[first]),
        np.ascontiguousarray(problem.keys_cat_t[:, first]),
        np.log(ties.counts),
    )
    _, model = problem.kernel_groups(exclude_self=True)
    module = kernels_for("local_ties", "cpu")
    with serial_below(first.shape[0] ** 2, config.SERIAL_PAIRS):  # as engine.threads_for
        group_fit, beta = module.tied_loo_fits(
            data,
            model,
            means,
            group_sums,
            values_t,
            ties.member_start,
            ties.members,
            exact_leaves(data),
        )
    if np.isnan(beta).any():
        return None
    with np.errstate(over="ignore"):  # a fit beyond float64 is inf, as on the plain pass
        fits = beta[:, 0, :] * units
    return TiedPass(fits, data, model, group_fit, beta, means, group_sums, values_t, units)


def tied_loo_gradient(tied: TiedPass, ties: TieGroups, cat_dparams, out_weights) -> np.ndarray:
    """sum_i sum_o e_io d fit_io / d theta over the rows (``out_weights`` (n, n_out) the
    e_io), as ``local_loo_gradient`` summed over its queries: (dc + dk,) in the kernels'
    order (continuous columns first), ``cat_dparams`` as there."""
    module = kernels_for("local_ties", "cpu")
    # the kernel's fits are the true ones divided by units: e_io units_o gives the same sum
    weights = np.ascontiguousarray(out_weights * tied.units[None, :])
    with serial_below(ties.first.shape[0] ** 2, config.SERIAL_PAIRS):
        per_group = module.tied_loo_gradient(
            tied.data,
            tied.model,
            tied.group_fit,
            tied.beta,
            tied.means,
            tied.group_sums,
            tied.row_values,
            ties.member_start,
            ties.members,
            cat_dparams,
            weights,
            exact_leaves(tied.data),
        )
    return per_group.sum(axis=0)
