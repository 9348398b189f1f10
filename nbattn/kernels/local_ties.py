"""The leave-one-out width gradient of a training set with tied rows (CPU).

Rows that agree in every column (a table with discrete columns: years of schooling,
counts, categories) have the same kernel weight against every key. Pooled into one key
per distinct row (``nbattn.local.ties``: log c_g more in its score, the group's mean as
its value), the leave-one-out system of a member i of group g is the others' plus the
rest of its group, whose design is e_1 = (1, 0, ..., 0):

    M_i = M_g + (c_g - 1) e^a e_1 e_1^T,     V_i = V_g + e^a (S_g - y_i) e_1

(M_g, V_g the sums over the other groups, a = sum_k a_k the score of a pair equal in
every column: log K(0) = 0 for every continuous kernel, a_k the equal-code term of
categorical column k). So the members of a group share every weight p_j, the design
and g = (M/l + R)^-1 e_1, and differ only in beta_i and the weights e_io of their fits,
in which the gradient is linear: :func:`tied_loo_gradient` streams each group once and
sums its members first. The first pass needs no kernel of its own
(``nbattn.local.ties`` solves the members' systems from the others' solution).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import config
from .items import next_item, run_items
from .local_leaves import chunk_runs
from .local_pairs import block_scratch, one_pass_for, problem_sizes
from .local_passes import (
    add_categorical_derivative_sums,
    add_continuous_derivative_sums,
    block_weights,
    equivalent_coefficients,
    fitted_and_penalty,
)

__all__ = ["tied_loo_gradient"]

_KEY_BLOCK = config.KEY_BLOCK


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def equal_row_score(model):
    """a = sum_k a_k: the score of a pair equal in every column (log K(0) = 0)."""
    score = 0.0
    for k in range(model.cat_params.shape[0]):
        score += model.cat_params[k, 0]
    return score


def tied_loo_gradient(
    data, model, group_fit, beta, values_t, group_sums, row_values, member_start, members,
    cat_dparams, out_weights, leaves,
):  # fmt: skip
    """``local_passes.local_loo_gradient`` of the tied rows, summed over each group's
    members: (G, dc + dk), from the ``group_fit`` and ``beta`` of ``nbattn.local.ties``
    and the rows' ``out_weights`` (n, n_out), the other arguments as there.

    The members share every weight p_j, the design and g; only beta_i and the weights
    e_io of their fits differ, and the derivative is linear in both: a key adds
    p_j (ds_j - sum_k p_k ds_k) c_j sum_o (E_o y_jo - B_o . x_j - ridge sum_t g_t B_to x_jt^2)
    with E_o = sum_i e_io and B_o = sum_i e_io beta_io (taken about the first member's
    fit, y and beta_0 less it, so that the difference keeps its digits), and the rest
    of the group adds the same with x = e_1, y the mean of the member's others and
    ds_k = da_k (continuous ds = 0 at d = 0)."""
    n_groups, dc, dk = data.q_cont.shape[0], data.keys_cont_t.shape[0], data.keys_cat_t.shape[0]
    out = np.zeros((n_groups, dc + dk))
    cat_dparams = cat_dparams if dk else None
    run_items(
        _tied_gradient_items, data, model, group_fit, beta, values_t, group_sums, row_values,
        member_start, members, cat_dparams, out_weights, out, leaves, one_pass_for(data, model),
    )  # fmt: skip
    return out


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _tied_gradient_items(
    counter, data, model, group_fit, beta, values_t, group_sums, row_values, member_start,
    members, cat_dparams, out_weights, out, leaves, one_pass,
):  # fmt: skip
    """The chunks of groups that ``counter`` hands this thread: their rows of ``out``
    (``one_pass``: ``local_pairs.one_pass_for``'s)."""
    weighted = problem_sizes(data)[4]
    ridge = model.ridge
    g, shift, log_norm = group_fit.g, group_fit.shift, group_fit.log_norm
    dc, dk = data.keys_cont_t.shape[0], data.keys_cat_t.shape[0]
    n_out = values_t.shape[0]
    p = g.shape[1]
    n_par = dc + dk
    equal_score = equal_row_score(model)
    n_chunks = leaves.query_start.shape[0] - 1
    while True:
        chunk = next_item(counter)
        if chunk >= n_chunks:
            return
        scores, design = block_scratch(p, dc)
        coef = np.zeros(_KEY_BLOCK)
        cvec = np.zeros(_KEY_BLOCK)
        fitted = np.zeros(_KEY_BLOCK)
        pen = np.zeros(_KEY_BLOCK)
        a_sum = np.zeros(n_par)
        s_sum = np.zeros(n_par)
        e_sum = np.zeros(n_out)
        b_sum = np.zeros((p, n_out))
        ref = np.zeros(n_out)
        first, stop, runs, n_runs = chunk_runs(chunk, data, model, leaves)
        for group in range(first, stop):
            if log_norm[group] == -np.inf:
                continue
            lead = members[member_start[group]]
            size = member_start[group + 1] - member_start[group]
            # E_o, B_o about the first member's fit; the rest of the group's term
            tie_coef = 0.0
            for o in range(n_out):
                ref[o] = beta[lead, 0, o]
                e_sum[o] = 0.0
                for t in range(p):
                    b_sum[t, o] = 0.0
            for s in range(member_start[group], member_start[group + 1]):
                row = members[s]
                for o in range(n_out):
                    e = out_weights[row, o]
                    e_sum[o] += e
                    b_sum[0, o] += e * (beta[row, 0, o] - ref[o])
                    for t in range(1, p):
                        b_sum[t, o] += e * beta[row, t, o]
                    if size > 1:
                        others = (group_sums[o, group] - row_values[o, row]) / (size - 1.0)
                        tie_coef += e * g[group, 0] * (others - beta[row, 0, o])
            for t in range(n_par):
                a_sum[t] = 0.0
                s_sum[t] = 0.0
            a_total = 0.0
            for r in range(n_runs):
                for j0 in range(runs[r, 0], runs[r, 1], _KEY_BLOCK):
                    nb = min(_KEY_BLOCK, runs[r, 1] - j0)
                    nb = block_weights(one_pass, group, j0, nb, data, model, group_fit, weighted,
                                       scores, design)  # fmt: skip
                    # coef_j = p_j sum_o [c_j (E_o (y_jo - ref_o) - B_o . x_j) - ridge pen_jo]
                    equivalent_coefficients(g[group], design, nb, cvec)
                    for j in range(nb):
                        coef[j] = 0.0
                    for o in range(n_out):
                        e, r0 = e_sum[o], ref[o]
                        y = values_t[o, j0 : j0 + nb]
                        fitted_and_penalty(b_sum[:, o], g[group], design, nb, fitted, pen)
                        for j in range(nb):
                            coef[j] += cvec[j] * (e * (y[j] - r0) - fitted[j]) - ridge * pen[j]
                    for j in range(nb):
                        coef[j] *= scores[j]
                        a_total += coef[j]
                    add_continuous_derivative_sums(group, nb, data, model, coef, scores,
                                                   design, a_sum, s_sum)  # fmt: skip
                    if cat_dparams is not None:
                        add_categorical_derivative_sums(group, j0, nb, data, model,
                                                        cat_dparams, coef, scores, a_sum,
                                                        s_sum)  # fmt: skip
            if size > 1:  # the rest of the group: x = e_1, continuous ds = 0, ds_k = da_k
                tie_score = np.log(size - 1.0) + equal_score
                tie_weight = np.exp(tie_score - shift[group] - log_norm[group])
                a_total += tie_weight * tie_coef
                if cat_dparams is not None:
                    for k in range(dk):
                        a_sum[dc + k] += tie_weight * tie_coef * cat_dparams[k, 0]
                        s_sum[dc + k] += tie_weight * cat_dparams[k, 0]
            for t in range(n_par):
                out[group, t] = a_sum[t] - a_total * s_sum[t]
