"""Nadaraya-Watson on a k-d tree of the keys, with certified pruning to a relative tolerance.

For queries q_i, keys k_j and values v_j (laid out as for ``nbattn.kernels.pooling``:
inputs pre-scaled by 1/(h sqrt 2), so the weight of key j is exp(s_ij) with
s_ij = -||q_i - k_j||^2) the exact sums are

    S_i = sum_j exp(s_ij),    A_ic = sum_j exp(s_ij) v_jc,    out_ic = A_ic / S_i.

Here the keys are in the k-d order of ``nbattn.kernels.kd_order`` and every node of the
split (``kd_nodes``) carries the bounding box of its keys. A tile of queries (neighbours
in k-d order) walks the tree together, depth first, nearer child first (Gray and Moore's
traversal; "nearer" by the sum of the rows' box distances), and each row sums the leaves
it keeps into float64 running sums relative to a shift (below, "Shift"). Every row keeps
its own L, U and shift: an internal node is
dropped for the tile only when the rule below drops it for every row of the tile (each
row's U then grows by its own B), and a leaf is dropped or summed row by row. So the rule
is applied per row exactly as for a row walking alone; a tile only changes the order of
the nodes and may descend into a node a row could have dropped (the row can then drop its
children: they hold no more weight than their parent's bound). The tile shares the
nodes' bookkeeping and reads each leaf once for all its rows. A node of c keys whose
box lies at squared distance d2 from the query holds a weight of at most

    B = c exp(-d2)                      (every key in the box is at least that far)

and it is dropped, unvisited, when

    U + B <= rtol * L                   (the rule)

where L is the sum of the weights of the leaves summed so far and U the sum of the
bounds B of the nodes dropped so far (U then grows by B). Both are kept relative to the
row's running maximum m, exactly as the streaming kernel keeps its sums, so neither
underflows for a query far from the keys.

Proof that the dropped mass E is at most rtol * S (per row). The rule keeps the invariant
U <= rtol * L at every step: it holds at the start (0 <= 0), a drop adds B only when
U + B <= rtol * L, and summing a leaf only increases L. At the end L is a sum over a
subset of the keys, so L <= S, and each dropped node's true weight is at most its B, so

    E <= U <= rtol * L <= rtol * S.

Gray and Moore's rule, which drops a node when B <= rtol * L * c / n (its share of the
tolerance by its count), is the case where every drop spends only its own share; the
rule above lets a node spend what earlier drops left unspent. The rule is checked in
floating point: it holds to the rounding of L, U and d2 (d2 is shrunk by 2**-40,
relative, to cover the rounding of the box distance).

Consequences, for the computed Shat = S - E and Ahat_c = A_c - sum_{dropped j} w_j v_jc:

* the normaliser: (1 - rtol) S <= Shat <= S, so lse moves by at most -log(1 - rtol);
* each weighted sum: |Ahat_c - A_c| <= E max_j |v_jc| <= rtol * S * max_j |v_jc|;
* the prediction: fhat - f = -sum_{dropped j} w_j (v_j - f) / (S - E), so

      |fhat_c - f_c| <= rtol / (1 - rtol) * max_j |v_jc - f_c|.

All of these are on top of the rounding error that the exact streaming sums carry
themselves (the scores are computed in the input dtype, as there).

Coarse exponential. In float64, from rtol >= 16 eps on (eps = ``COARSE_EXP_RTOL``, 1e-8),
the leaves' weights are computed by ``coarse_exp``, each within eps relative of exp
(``nbattn.kernels.fastmath``: a polynomial of degree 7 instead of 12, about 1/7 of the
walk's time), and the rule runs with rtol' = (rtol - eps) / (1 + eps) in place of rtol.
The computed L is then at most (1 + eps) times the true sum of the kept weights, so the
dropped mass is E <= rtol' (1 + eps) S = (rtol - eps) S, and the kept weights' own error
is at most eps times their sum. The bounds above hold as stated, with one change: Shat
may exceed S by eps S (lse moves up by at most eps, down by at most -log(1 - rtol)):

* (1 - rtol) S <= (1 - eps)(S - E) <= Shat <= (1 + eps) S;
* |Ahat_c - A_c| <= (E + eps S) max_j |v_jc| <= rtol * S * max_j |v_jc|;
* |fhat_c - f_c| <= (E + eps (S - E)) max_j |v_jc - f_c| / ((1 - eps)(S - E))
  <= rtol / (1 - rtol) * max_j |v_jc - f_c|.

Below 16 eps, and in float32 (whose exponential is already within its rounding), the
weights are ``fast_exp``'s and rtol is the rule's (``coarse_for`` decides; the argument's
type picks the exponential when the walk is compiled, so each choice is its own copy).

Series. Where the keys are within reach of every query (wide widths, few features) the
rule drops little. With ``series`` (``nbattn.kernels.tree_series``: a node's Taylor
series, the improved fast Gauss transform, with its truncation bound and proof) a row may
instead take a node's series: its value T (the weight's; T_c the values') is added to L
and its error bound E (truncation and rounding: |T - W| <= E for the node's true weight
W, |T_c - W_c| <= E max_j |v_jc|, and the error of the series of
sum_j w_j (v_jc - f) at most E max_j |v_jc - f|) to U, where

    U + 2 E <= rho * L                  (the series' rule; then U + E <= rho (L + T))

since T >= W - E >= -E. An internal node not dropped for the whole tile takes its series
only when each row drops it or may take its series (else the tile descends); a leaf is
dropped, taken by its series or summed, row by row; a node holding the row's excluded key
never takes its series, nor does the second walk (below, "Shift"). Both rules keep
U <= rho L. With series the rule runs with rho = (rtol - eps) / (1 + rtol) in place of
rtol (eps: ``COARSE_EXP_RTOL`` where the leaves take ``coarse_exp``, else 0). Proof, per
row: let D be the dropped keys, Z the series' nodes and K the summed keys, so
S = W(D) + W(Z) + W(K), L = sum_Z T + Lhat(K) with |Lhat(K) - W(K)| <= eps W(K), and
U >= W(D) + sum_Z E. Then |L - S| <= W(D) + sum_Z E + eps S <= U + eps S, and
U <= rho L <= rho (S + U + eps S) gives U <= rho (1 + eps) S / (1 - rho) = (rtol - eps) S,
so, for Shat = L and Ahat_c the computed weighted sums:

* the normaliser: (1 - rtol) S <= Shat <= (1 + rtol) S (lse within -log(1 - rtol) below
  and log(1 + rtol) above): series may add as well as leave out;
* each weighted sum: |Ahat_c - A_c| <= (U + eps S) max_j |v_jc| <= rtol * S * max_j |v_jc|;
* the prediction: Ahat_c - f_c Shat errs from sum_j w_j (v_jc - f_c) = 0 by at most
  (W(D) + sum_Z E + eps W(K)) max_j |v_jc - f_c| <= rtol S max_j |v_jc - f_c|, so
  |fhat_c - f_c| <= rtol / (1 - rtol) * max_j |v_jc - f_c|.

Only the normaliser's upper side is new: without series (``series`` None, or a walk
that takes none) the section above holds as written. Before a series is taken the row's
shift is raised to the node's box bound, as before a leaf (below); the series is
evaluated relative to it. A row's sums depend on its tile's walk only (the tile decides
a node's series from its rows' states; the tiles are fixed by ``rows`` and ``tile``, not
by the threads), so the result is the same bits on every run and thread count.

Shift. A row's sums are kept relative to exp(m), m a bound on every score it has summed,
so no weight exceeds 1. Before a leaf is summed m is raised, where it is lower, to the
leaf's box bound -d2 (rounded to the keys' dtype, so that every leaf of the row subtracts
the same m): the bound is known before the scores, so the partial distances, the last
feature, the exponential and both sums are one fused pass per leaf, as in the streaming
kernel's one-pass rows (``nbattn.kernels.pooling``, "One pass"), and no pass looks for
the leaf's maximum. A box may bound its keys loosely; if a row's final L then lies below
the one-pass minimum (``one_pass_min_sum``: the weights flushed to zero could matter),
the row walks the tree again with m its running best score, each leaf's scores computed
and their maximum taken before the exponentials (the streaming kernel's max-shifted
online softmax). Either way L is a sum of the kept keys' weights relative to the same m
as U, and the proof above holds as written.

Far rows. A row whose best score may lie below ``-far_score`` of its dtype (the threshold
of ``nbattn.kernels.pooling``'s far rows): m itself below -far_score, or m + log L, which
is at least the best score and at most log(n_keys) above it, below -far_score +
log(n_keys); or whose every score overflowed, is flagged instead of finished (``far``),
and the caller recomputes it with the exact kernel, which decides by the best score itself
and whose far-row paths give the nearest key's value where the textbook formula gives 0/0.
The first test matters: beyond -far_score the rounding of a score, about |s| times the
unit roundoff, can exceed the range of exp, so a weight relative to a box's bound may be
inf (L then is too, and is flagged as well). A row whose root box already lies beyond
that distance is flagged before any leaf is summed.

Layout: ``queries`` (n_queries, d), ``keys_t`` (d, n_keys) and ``values_t``
(n_outputs, n_keys) in k-d order, of one dtype (float32 or float64), C-contiguous; the
tree arrays as ``kd_nodes`` returns them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config
from .fastmath import COARSE_EXP_RTOL, fast_exp, like
from .items import next_item, run_items
from .kd_order import kd_nodes, kd_order, kd_split, take_columns
from .pooling import far_score, fused_range, one_pass_min_sum
from .softmax import row_max
from .tree_leaves import check_blocks, leaf_blocks, value_exponents
from .tree_series import monomials, series_coefficients, series_rows
from .tree_series import rescale as _rescale

__all__ = [
    "coarse_for",
    "kd_nodes",
    "kd_order",
    "kd_split",
    "leaf_blocks",
    "series_for",
    "take_columns",
    "tree_pool",
]

_QUERY_BLOCK = config.QUERY_BLOCK
# A box distance is rounded by at most ~(d + 2) 2**-53 relative; shrinking it by 2**-40
# keeps each bound B an upper bound for any d below 2**13.
_D2_SHRINK = 1.0 - 2.0**-40
_STACK = 128  # the tree's depth is below 64 for any n below 2**63
#: The least rtol whose float64 leaves are summed with ``coarse_exp`` (module docstring,
#: "Coarse exponential"): its error then takes at most 1/16 of the tolerance.
COARSE_MIN_RTOL = 16.0 * COARSE_EXP_RTOL
#: ``pooling.fused_range`` compiled as a function of its own, which the walk calls
#: instead of inlining it (the streaming kernel inlines it): numba's inlining of its long
#: body (the exponential's polynomial, a loop per feature count) was about a fifth of the
#: 11.8-12.2 CPU s that each copy of the walk took to compile (now about 9.6), and a call
#: costs nothing beside a leaf's hundreds of keys (same bits, same time a pair).
_leaf_pass = njit(fastmath=config.FASTMATH, cache=config.CACHE)(fused_range.py_func)


def coarse_for(rtol, dtype):
    """:func:`tree_pool`'s ``coarse`` for a tolerance and the inputs' dtype: True (the
    coarse exponential) for float64 from ``COARSE_MIN_RTOL`` on, else None."""
    return True if np.dtype(dtype) == np.float64 and rtol >= COARSE_MIN_RTOL else None


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _box_d2(q64, r, lo, hi, node):
    """Squared distance from query r of the tile to node's bounding box (0 inside it)."""
    total = 0.0
    for f in range(q64.shape[1]):
        gap = max(lo[node, f] - q64[r, f], q64[r, f] - hi[node, f], 0.0)
        total += gap * gap
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _leaf_range(qt, r, pack, base, nb, skip, shift, n_outputs, coarse, buf, acc_row):
    """The keys of the leaf at ``base`` but ``skip`` (none when outside [0, nb)) for query r
    of the tile: the streaming kernel's fused pass (``pooling.fused_range``) on the leaf's
    block of ``pack`` seen as its (d + p, nb) rows, before the skipped key and after it;
    returns sum_t exp(s_t - shift) (each part summed in the keys' dtype, the parts in
    float64) and adds sum_t exp(s_t - shift) v_tc into ``acc_row[c]``; each weight by
    ``coarse_exp`` where ``coarse`` (module docstring, "Coarse exponential").

    One call site of the fused pass (``_leaf_pass``, a call, not inlined), in a loop over
    the two parts."""
    k = qt.shape[1]
    block = pack[base : base + (k + n_outputs) * nb].reshape((k + n_outputs, nb))
    keys, values = block[:k], block[k:]
    lead_end = skip if 0 <= skip < nb else nb
    total = 0.0
    a, b = np.int64(0), lead_end  # not a literal 0: _leaf_pass would compile for it too
    for _ in range(2):
        if b > a:
            total += np.float64(_leaf_pass(qt[r], keys, values, a, b, shift, buf, acc_row, coarse))
        a, b = lead_end + 1, nb
    return total


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _sum_leaf_at_best(qt, r, pack, base, nb, n_outputs, skip, buf, acc, m, total, used):
    """The leaf's scores first, then the row's shift raised to their maximum where it is
    above m[r] (module docstring, "Shift": the rows the box's bound left too small).
    Called, not inlined (rare, and compile time)."""
    k = qt.shape[1]
    part = buf[:nb]
    keys_f = pack[base : base + nb]
    q0 = qt[r, 0]
    for j in range(nb):
        diff = keys_f[j] - q0
        part[j] = -(diff * diff)
    for f in range(1, k):
        keys_f = pack[base + f * nb : base + (f + 1) * nb]
        qf = qt[r, f]
        for j in range(nb):
            diff = keys_f[j] - qf
            part[j] -= diff * diff
    if 0 <= skip < nb:
        part[skip] = -np.inf
    best = np.float64(row_max(part))
    if best == -np.inf:  # every score overflowed (or the one key was excluded)
        return
    if best > m[r]:
        _rescale(r, best, n_outputs, acc, m, total, used)
    s = like(m[r], buf)
    leaf_total = like(0.0, buf)
    for j in range(nb):
        w = fast_exp(part[j] - s)
        part[j] = w
        leaf_total += w
    total[r] += np.float64(leaf_total)
    for c in range(n_outputs):
        values = pack[base + (k + c) * nb : base + (k + c + 1) * nb]
        weighted = like(0.0, buf)
        for j in range(nb):
            weighted += part[j] * values[j]
        acc[r, c] += weighted


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _sum_leaf(
    qt, r, pack, base, nb, n_outputs, skip, d2, at_best, coarse, buf, acc, m, total, used
):
    """Adds the leaf at ``base``, at box distance ``d2`` from row r of the tile, to the
    row's state (m, total, used, acc[r]; module docstring, "Shift").

    The shift is the box's bound -d2 (rounded to the keys' dtype) where it exceeds the
    row's m, so every weight is exp(s - m) <= 1 and one fused pass sums the leaf;
    ``at_best``: the leaf's best score instead (:func:`_sum_leaf_at_best`)."""
    if at_best:
        _sum_leaf_at_best(qt, r, pack, base, nb, n_outputs, skip, buf, acc, m, total, used)
        return
    shift = np.float64(like(-d2, buf))
    if shift > m[r]:
        _rescale(r, shift, n_outputs, acc, m, total, used)
    total[r] += _leaf_range(qt, r, pack, base, nb, skip, m[r], n_outputs, coarse, buf, acc[r])


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _sum_leaf_rows(
    qt,
    keep,
    n_keep,
    d2,
    pack,
    a0,
    nb,
    n_outputs,
    skip,
    at_best,
    coarse,
    buf,
    acc,
    m,
    total,
    used,
    summed,
):
    """The leaf of keys [a0, a0 + nb) added to each row ``keep[:n_keep]`` of the tile
    (:func:`_sum_leaf`; ``d2[r]``: the leaf's box distance from row r). Called once per
    leaf and tile, not inlined into the walk: one compiled copy of the leaf pass, and a
    call that costs nothing beside the rows' hundreds of keys each."""
    base = a0 * (qt.shape[1] + n_outputs)
    for x in range(n_keep):
        r = keep[x]
        summed[r] += nb
        _sum_leaf(
            qt,
            r,
            pack,
            base,
            nb,
            n_outputs,
            skip[r] - a0,
            d2[r],
            at_best,
            coarse,
            buf,
            acc,
            m,
            total,
            used,
        )


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _drops(node, d2, start, stop, rtol, m, total, used, r):
    """Row r's bound B of ``node`` (relative to exp(m[r])) when the rule drops it, else -1."""
    if not total[r] > 0.0:
        return -1.0
    bound = (stop[node] - start[node]) * fast_exp(-d2 * _D2_SHRINK - m[r])
    if used[r] + bound <= rtol * total[r]:
        return bound
    return -1.0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _tree_tile(
    qt,
    q64,
    active,
    n_active,
    keep,
    skip,
    pack,
    n_outputs,
    start,
    stop,
    right,
    lo,
    hi,
    rtol,
    at_best,
    coarse,
    buf,
    acc,
    m,
    total,
    used,
    summed,
    seen,
    stack_node,
    stack_d2,
    series,
    ratio,
    series_scratch,
):
    """Walks the tree once for the tile's active rows (``active[:n_active]``, indices
    into the tile's buffers; ``keep`` a scratch of as many), summing the leaves each row
    keeps into acc[r], m[r], total[r], used[r] (module docstring); counts keys summed and
    nodes seen per row. ``series``: ``tree_series.series_rows``'s tables (no degree: none;
    module docstring, "Series"), ``series_scratch`` = (terms, choice, shifts, errs, mono,
    a)."""
    with_series = series[0].shape[0] > 0 and not at_best
    single = np.float64(like(0.1, buf)) != 0.1  # float32 keys (a runtime flag: one copy)
    for a in range(n_active):
        r = active[a]
        stack_d2[0, r] = _box_d2(q64, r, lo, hi, 0)
        seen[r] += 1
    stack_node[0] = 0
    top = 1
    while top > 0:
        top -= 1
        node = stack_node[top]
        rgt = right[node]
        if rgt >= 0:
            # dropped for the whole tile only when the rule drops it for every row
            every = True
            for a in range(n_active):
                r = active[a]
                if _drops(node, stack_d2[top, r], start, stop, rtol, m, total, used, r) < 0.0:
                    every = False
                    break
            if every:
                for a in range(n_active):
                    r = active[a]
                    used[r] += _drops(node, stack_d2[top, r], start, stop, rtol, m, total, used, r)
                continue
        n_keep = np.int64(-1)
        if with_series:  # module docstring, "Series": drop, series or neither, per row
            n_keep = series_rows(
                q64, active, n_active, rgt >= 0, keep, node, stack_d2[top], start, stop, skip,
                series, ratio, rtol, single, acc, m, total, used, series_scratch,
            )  # fmt: skip
        if rgt >= 0:
            if n_keep == 0:  # every row dropped it or took its series
                continue
            left = node + 1
            near_left = 0.0
            near_right = 0.0
            for a in range(n_active):
                r = active[a]
                d2_left = _box_d2(q64, r, lo, hi, left)
                d2_right = _box_d2(q64, r, lo, hi, rgt)
                stack_d2[top, r] = d2_left
                stack_d2[top + 1, r] = d2_right
                near_left += d2_left
                near_right += d2_right
                seen[r] += 2
            # the nearer child (summed over the tile's rows) on top of the stack
            if near_left <= near_right:
                stack_node[top], stack_node[top + 1] = rgt, left
                for a in range(n_active):
                    r = active[a]
                    stack_d2[top, r], stack_d2[top + 1, r] = (
                        stack_d2[top + 1, r],
                        stack_d2[top, r],
                    )
            else:
                stack_node[top], stack_node[top + 1] = left, rgt
            top += 2
            continue
        if n_keep < 0:
            n_keep = 0
            for a in range(n_active):
                r = active[a]
                bound = _drops(node, stack_d2[top, r], start, stop, rtol, m, total, used, r)
                if bound >= 0.0:
                    used[r] += bound
                else:
                    keep[n_keep] = r
                    n_keep += 1
        if n_keep > 0:
            a0 = start[node]
            _sum_leaf_rows(
                qt,
                keep,
                n_keep,
                stack_d2[top],
                pack,
                a0,
                stop[node] - a0,
                n_outputs,
                skip,
                at_best,
                coarse,
                buf,
                acc,
                m,
                total,
                used,
                summed,
            )


def series_for(keys_t, values_t, start, stop, lo, hi, p_max, per):
    """The nodes' Taylor series for :func:`tree_pool`'s ``series`` (module docstring,
    "Series"): ``tree_series.series_coefficients`` of the keys and of the values scaled as
    the walk scales them, terms of degree below ``p_max``, a node's degree the largest
    whose terms are at most its keys / ``per``."""
    parent, var, const, deg_end = monomials(keys_t.shape[0], int(p_max))
    _, values_s = value_exponents(values_t)
    degree, offset, centre, radius, coef = series_coefficients(
        keys_t, values_s, start, stop, lo, hi, parent, var, const, deg_end, float(per)
    )
    return degree, offset, centre, radius, coef, parent, var, deg_end


def _no_series(k):
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty, np.zeros((0, k)), np.zeros(0), np.zeros(0), empty, empty, empty


def tree_pool(
    queries,
    keys_t,
    values_t,
    start,
    stop,
    right,
    lo,
    hi,
    own,
    rtol,
    rows,
    tile,
    coarse,
    series=None,
    ratio=1.0,
    leaves=None,
):
    """``(out, lse, far, work)`` for the queries ``rows`` (indices into ``queries``).

    out (n_rows, n_outputs) in the input dtype, lse (n_rows,) float64, far (n_rows,)
    bool: rows to recompute with the exact kernel (their out and lse are left 0 and
    nan), work (n_rows, 3) int64: keys summed, nodes seen and series terms evaluated
    per row (over both walks of a row that walks again, module docstring "Shift"). ``own``
    (n_queries,) holds the k-d position of the key each query skips (-1: none), or is
    empty (no key is skipped). ``rtol`` in [0, 1): the module docstring's tolerance.
    ``tile`` (>= 1): consecutive entries of ``rows`` that walk the tree together (the
    rows of a tile should be near each other, as in k-d order, for the walk to pay).
    ``coarse``: :func:`coarse_for`'s None (the leaves' weights by ``fast_exp``) or True
    (by ``coarse_exp``, the rule with part of rtol; module docstring, "Coarse
    exponential"); each compiles its own copy of the walk. The tiles are the work items
    of :func:`nbattn.kernels.items.run_items` (a serial kernel on a pool of threads: no
    parallel region to compile). ``series``: :func:`series_for`'s tables (None: no
    series), taken where a node's deg_end[p] terms times ``ratio`` cost at most its keys
    (module docstring, "Series"). ``leaves``: ``tree_leaves.leaf_blocks`` of these keys,
    values and nodes (None: built here; blocks of another tree or size raise ValueError).
    """
    n_rows = rows.shape[0]
    n_outputs = values_t.shape[0]
    if leaves is None:
        leaves = leaf_blocks(keys_t, values_t, start, stop, right)
    else:
        check_blocks(leaves, keys_t, n_outputs, start, stop, right)
    pack, exponents, leaf_max, _ = leaves
    prune_rtol = float(rtol)
    eps = COARSE_EXP_RTOL if coarse is not None else 0.0
    if series is not None and series[0].shape[0] > 0:  # module docstring, "Series"
        prune_rtol = (prune_rtol - eps) / (1.0 + prune_rtol)
    elif coarse is not None:  # module docstring, "Coarse exponential": part of rtol pays for it
        prune_rtol = (prune_rtol - eps) / (1.0 + eps)
    if series is None:
        series = _no_series(keys_t.shape[0])
    out = np.zeros((n_rows, n_outputs), dtype=queries.dtype)
    lse = np.full(n_rows, np.nan)
    far_rows = np.zeros(n_rows, dtype=np.bool_)
    work = np.zeros((n_rows, 3), dtype=np.int64)
    run_items(
        _tile_items,
        queries,
        pack,
        n_outputs,
        keys_t.shape[1],
        start,
        stop,
        right,
        lo,
        hi,
        own,
        prune_rtol,
        rows,
        np.int64(max(1, min(int(tile), n_rows))),  # scratch per thread: (_STACK, tile)
        coarse,
        exponents,
        np.int64(leaf_max),
        series,
        float(ratio),
        out,
        lse,
        far_rows,
        work,
    )
    return out, lse, far_rows, work


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _tile_items(
    counter,
    queries,
    pack,
    n_outputs,
    n_keys,
    start,
    stop,
    right,
    lo,
    hi,
    own,
    prune_rtol,
    rows,
    tile,
    coarse,
    exponents,
    leaf_max,
    series,
    ratio,
    out,
    lse,
    far_rows,
    work,
):
    """The tiles of :func:`tree_pool` taken from ``counter`` (``items.next_item``): each
    walks the tree and writes its rows of out, lse, far_rows and work."""
    n_rows = rows.shape[0]
    k = queries.shape[1]
    dtype = queries.dtype
    far = far_score(queries)
    min_sum = one_pass_min_sum(n_keys, queries)
    maybe_far = -far + math.log(max(n_keys, 1))
    n_tiles = (n_rows + tile - 1) // tile
    buf = np.empty(max(leaf_max, 1), dtype=dtype)
    acc = np.zeros((tile, n_outputs), dtype=np.float64)
    qt = np.empty((tile, k), dtype=dtype)
    q64 = np.empty((tile, k), dtype=np.float64)
    m = np.empty(tile)
    total = np.empty(tile)
    used = np.empty(tile)
    summed = np.empty(tile, dtype=np.int64)
    seen = np.empty(tile, dtype=np.int64)
    skip = np.empty(tile, dtype=np.int64)
    active = np.empty(tile, dtype=np.int64)
    keep = np.empty(tile, dtype=np.int64)
    stack_node = np.empty(_STACK, dtype=np.int64)
    stack_d2 = np.empty((_STACK, tile), dtype=np.float64)
    deg_end = series[7]
    scratch = (
        np.empty(tile, dtype=np.int64),
        np.empty(tile, dtype=np.int64),
        np.empty(tile),
        np.empty(tile),
        np.empty(max(deg_end[-1] if deg_end.shape[0] > 0 else 1, 1)),
        np.empty(k),
    )
    terms = scratch[0]
    while True:
        t = next_item(counter)
        if t >= n_tiles:
            return
        acc[:] = 0.0
        for r in range(tile):
            m[r] = -np.inf
            total[r] = 0.0
            used[r] = 0.0
            summed[r] = 0
            seen[r] = 0
            terms[r] = 0
            skip[r] = -1
        r0 = t * tile
        nt = min(n_rows, r0 + tile) - r0
        # counters and flags passed to a called kernel are typed from their first value:
        # a literal 0 or False would make numba compile the callee once more for
        # Literal[int](0) or Literal[bool](False) before the int64 or bool it settles on
        n_active = np.int64(0)
        for r in range(nt):
            i = rows[r0 + r]
            for f in range(k):
                qt[r, f] = queries[i, f]
                q64[r, f] = queries[i, f]
            if own.shape[0] > 0:
                skip[r] = own[i]
            if _box_d2(q64, r, lo, hi, 0) > far:  # beyond the far threshold of every key
                far_rows[r0 + r] = True
                seen[r] = 1
            else:
                active[n_active] = r
                n_active += 1
        at_best = np.bool_(False)
        while n_active > 0:
            _tree_tile(
                qt,
                q64,
                active,
                n_active,
                keep,
                skip,
                pack,
                n_outputs,
                start,
                stop,
                right,
                lo,
                hi,
                prune_rtol,
                at_best,
                coarse,
                buf,
                acc,
                m,
                total,
                used,
                summed,
                seen,
                stack_node,
                stack_d2,
                series,
                ratio,
                scratch,
            )
            if at_best:
                break
            # the rows the box's shift left below the one-pass minimum: again, each leaf
            # shifted by its best score (module docstring, "Shift")
            n_again = np.int64(0)
            for a in range(n_active):
                r = active[a]
                if total[r] < min_sum:
                    active[n_again] = r
                    n_again += 1
                    m[r] = -np.inf
                    total[r] = 0.0
                    used[r] = 0.0
                    acc[r, :] = 0.0
            n_active = n_again
            at_best = True
        for r in range(nt):
            work[r0 + r, 0] = summed[r]
            work[r0 + r, 1] = seen[r]
            work[r0 + r, 2] = terms[r]
            if far_rows[r0 + r]:
                continue
            if total[r] > 0.0:
                if (
                    m[r] < -far
                    or not total[r] < np.inf
                    or total[r] < min_sum
                    or m[r] + np.log(total[r]) < maybe_far
                ):
                    far_rows[r0 + r] = True
                    continue
                for c in range(n_outputs):
                    out[r0 + r, c] = math.ldexp(acc[r, c] / total[r], exponents[c] - 1)
                lse[r0 + r] = m[r] + np.log(total[r])
            elif n_keys - (1 if 0 <= skip[r] < n_keys else 0) > 0:
                far_rows[r0 + r] = True  # every admissible score overflowed
            else:  # no admissible key: one key, excluded
                lse[r0 + r] = -np.inf
