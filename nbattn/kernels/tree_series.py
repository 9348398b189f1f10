"""Taylor series per k-d node for the ``rtol > 0`` walk (the improved fast Gauss transform).

In the scaled units of ``nbattn.kernels.tree_pool`` the weight of key j for query q is
exp(-|q - k_j|^2). For a node with centre c (its box's centre), a = q - c, b_j = k_j - c
and r >= |b_j| for each of its keys (its radius, from its keys),

    exp(-|q - k_j|^2) = exp(-|a|^2) exp(-|b_j|^2) exp(2 a.b_j),

    exp(2 a.b) = sum_{|alpha| < p} 2^|alpha| / alpha! a^alpha b^alpha + R_p(a, b)

(the multinomial form of sum_{n < p} (2 a.b)^n / n!), so the node's sums are

    sum_j exp(-|q - k_j|^2) (1, v_j) ~ exp(-|a|^2) sum_{|alpha| < p} C_alpha a^alpha,
    C_alpha = 2^|alpha| / alpha! sum_j exp(-|b_j|^2) b_j^alpha (1, v_j),

coefficients that depend on the node alone (:func:`series_coefficients`, float64, in
graded order: the terms of degree < p are a prefix for every p up to the node's degree).

Truncation bound. R_p is the Lagrange remainder of exp at x = 2 a.b: R_p = x^p / p! e^xi
for some xi between 0 and x, and |x| <= 2 |a| |b| (Cauchy-Schwarz), so
|R_p| <= (2 |a| |b|)^p / p! e^{2 |a| |b|}. With A = |a| and B = |b_j| <= r the error of one
key's weight is then at most

    exp(-A^2 - B^2) (2 A B)^p / p! e^{2 A B} = (2 A B)^p / p! exp(-(A - B)^2)
        <= (2 A r)^p / p! exp(-max(A - r, 0)^2)                       (the bound)

because each factor is bounded on its own: (2 A B)^p <= (2 A r)^p as B <= r, and
(A - B)^2 >= max(A - r, 0)^2 (if A >= r then A - B >= A - r >= 0, else the right side is 0).
A node of c keys errs by at most c times that in its weight and, each key's error being
multiplied by its value, by at most c times that times max_j |v_j - f| in
sum_j w_j (v_j - f) for any f (the series of that sum has coefficients C_v - f C_1).

Rounding. Each coefficient is a float64 sum over the node's keys of products of at most
p + 3 roundings, and the evaluation a sum of T terms built one multiply each; with u =
2^-53 the computed value errs, for any order of the sums, by at most (c + T + 2 p + 10) u
times sum_j sum_alpha 2^|alpha| / alpha! |a^alpha| |b_j^alpha| exp(-A^2 - B^2) <=
c exp(-max(A - r, 0)^2) (the same steps with |a|.|b| <= A r). The bound the walk uses,
:func:`series_degree`'s E, adds (c + 2 T + 64) 2^-52 to the truncation factor for it.
In the values' series that allowance scales with max_j |v_j|, not max_j |v_j - f|: for the
prediction's bound it is rounding on top, as the exact path's own rounding is.

The walk (``tree_pool``'s module docstring, "Series") picks per row the least p whose E
fits the row's budget, at the cost of T(p) = C(p - 1 + d, d) terms against the node's c
keys summed directly; ``config.TREE_SERIES_*`` bound the degree and who gets
coefficients.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import config
from .fastmath import fast_exp
from .items import next_item, run_items

__all__ = [
    "monomials",
    "rescale",
    "series_coefficients",
    "series_degree",
    "series_rows",
    "series_value",
    "truncation",
]

#: The rounding allowance of :func:`series_degree`, per key and term (module docstring).
_ROUND = 2.0**-52
#: exp in the bound is rounded; this covers it and the rounding of the bound's product.
_BOUND_UP = 1.0 + 2.0**-30
_D2_SHRINK = 1.0 - 2.0**-40  # as tree_pool's rule
_BUILD_BLOCK = 64  # keys per block of the coefficients' build
_INV_FACTORIAL = np.array([1.0 / math.factorial(p) for p in range(171)])


def monomials(d, p_max):
    """The graded order of the monomials a^alpha of d variables of degree < p_max, built
    one multiply each: ``(parent, var, const, deg_end)``. Monomial t (t >= 1) is
    monomial ``parent[t]`` times a[var[t]], ``const[t]`` = 2^|alpha| / alpha!, and the
    monomials of degree < p are the first ``deg_end[p]`` (deg_end has p_max + 1 entries)."""
    parent, var, const, exps = [0], [0], [1.0], [(0,) * d]
    deg_end = [0, 1]
    # heads[f]: the first monomial of the previous degree whose last variable is >= f
    heads = [0] * d
    prev_end = 1
    for _ in range(1, p_max):
        new_heads = []
        for f in range(d):
            new_heads.append(len(exps))
            for t in range(heads[f], prev_end):
                alpha = list(exps[t])
                alpha[f] += 1
                parent.append(t)
                var.append(f)
                const.append(const[t] * 2.0 / alpha[f])
                exps.append(tuple(alpha))
        heads = new_heads
        prev_end = len(exps)
        deg_end.append(len(exps))
    return (
        np.array(parent, dtype=np.int64),
        np.array(var, dtype=np.int64),
        np.array(const, dtype=np.float64),
        np.array(deg_end[: p_max + 1], dtype=np.int64),
    )


def truncation(a, r, p):
    """The module docstring's per-key bound (2 a r)^p / p! exp(-max(a - r, 0)^2) (NumPy)."""
    gap = np.maximum(np.asarray(a, dtype=np.float64) - r, 0.0)
    return (2.0 * a * r) ** p / math.factorial(p) * np.exp(-gap * gap)


def series_coefficients(keys_t, values_t, start, stop, lo, hi, parent, var, const, deg_end, per):
    """Each node's series (module docstring): ``(degree, offset, centre, radius, coef)``.

    A node of c keys gets the terms of degree < p, p the largest with deg_end[p] terms
    at most c / ``per`` (``degree[node]`` = p, 0: none); its coefficients are
    ``coef[offset[node] + ch * T + t]`` for the T = deg_end[p] terms t and the channels
    ch = 0 (the weight) and 1 + c (value c, as ``values_t`` holds it). ``centre`` is the
    box's centre, ``radius`` the largest distance from it to a key of the node. The nodes
    are the work items of ``items.run_items`` (each writes only its own entries: the
    same bits on any number of threads)."""
    degree, offset, centre, total = _series_layout(
        start, stop, lo, hi, deg_end, 1 + values_t.shape[0], float(per)
    )
    coef = np.zeros(total)
    radius = np.zeros(start.shape[0])
    keys_t = np.ascontiguousarray(keys_t, dtype=np.float64)  # one compiled copy for both
    values_t = np.ascontiguousarray(values_t, dtype=np.float64)
    run_items(
        _coef_items,
        keys_t,
        values_t,
        start,
        stop,
        parent,
        var,
        const,
        deg_end,
        degree,
        offset,
        centre,
        radius,
        coef,
    )
    return degree, offset, centre, radius, coef


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def _series_layout(start, stop, lo, hi, deg_end, width, per):
    """``(degree, offset, centre, n_coef)`` of :func:`series_coefficients`."""
    n_nodes, k = lo.shape
    p_max = deg_end.shape[0] - 1
    degree = np.zeros(n_nodes, dtype=np.int64)
    offset = np.zeros(n_nodes, dtype=np.int64)
    centre = np.empty((n_nodes, k))
    total = 0
    for node in range(n_nodes):
        count = stop[node] - start[node]
        p = 0
        for q in range(1, p_max + 1):
            if deg_end[q] * per <= count:
                p = q
        degree[node] = p
        offset[node] = total
        total += width * deg_end[p]
        for f in range(k):
            centre[node, f] = 0.5 * (lo[node, f] + hi[node, f])
    return degree, offset, centre, total


@njit(fastmath=config.FASTMATH, cache=config.CACHE, nogil=True)
def _coef_items(
    counter,
    keys_t,
    values_t,
    start,
    stop,
    parent,
    var,
    const,
    deg_end,
    degree,
    offset,
    centre,
    radius,
    coef,
):
    """The nodes of :func:`series_coefficients` taken from ``counter``. Keys go in blocks
    of ``_BUILD_BLOCK``: each monomial for the whole block in one pass (a product of two
    rows), then its sums with the weights and values, every inner loop over the block's
    keys (3.7 times the speed of one key at a time; ``inspect_asm`` shows the sums and
    the centring in packed zmm adds, the products still scalar)."""
    k = keys_t.shape[0]
    width = 1 + values_t.shape[0]
    b = np.empty((k, _BUILD_BLOCK))
    mono = np.empty((deg_end[deg_end.shape[0] - 1], _BUILD_BLOCK))
    while True:
        node = next_item(counter)
        if node >= start.shape[0]:
            return
        p = degree[node]
        if p == 0:
            continue
        n_terms = deg_end[p]
        base = offset[node]
        far = 0.0
        for j0 in range(start[node], stop[node], _BUILD_BLOCK):
            nb = min(_BUILD_BLOCK, stop[node] - j0)
            weight = mono[0]
            for j in range(nb):
                weight[j] = 0.0
            for f in range(k):
                cf = centre[node, f]
                bf = b[f]
                for j in range(nb):
                    bf[j] = keys_t[f, j0 + j] - cf
                    weight[j] += bf[j] * bf[j]
            for j in range(nb):
                far = max(far, weight[j])
            for j in range(nb):
                weight[j] = math.exp(-weight[j])
            for t in range(1, n_terms):
                row, prev, bf = mono[t], mono[parent[t]], b[var[t]]
                for j in range(nb):
                    row[j] = prev[j] * bf[j]
            for t in range(n_terms):
                row = mono[t]
                total = 0.0
                for j in range(nb):
                    total += row[j]
                coef[base + t] += total
                for c in range(width - 1):
                    values = values_t[c, j0 : j0 + nb]
                    total = 0.0
                    for j in range(nb):
                        total += row[j] * values[j]
                    coef[base + (c + 1) * n_terms + t] += total
        radius[node] = math.sqrt(far)
        for ch in range(width):
            for t in range(n_terms):
                coef[base + ch * n_terms + t] *= const[t]


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def series_degree(
    q64,
    r,
    node,
    d2,
    count,
    own_in,
    degree,
    centre,
    radius,
    deg_end,
    ratio,
    rho,
    m,
    total,
    used,
    single,
):
    """``(p, shift, err)`` for row r of the tile and ``node`` (``count`` keys at box distance
    ``d2``): the least degree p whose error bound err fits the row's budget,
    used + 2 err <= rho * total (all relative to ``shift``, the shift the row takes for the
    node: the box's bound -d2 in the keys' dtype where it is above m[r]), and whose terms
    cost no more than summing the keys (deg_end[p] * ``ratio`` <= count); p = 0: none
    (``own_in``: the node holds the row's excluded key)."""
    p_node = degree[node]
    if p_node == 0 or own_in or not total[r] > 0.0:
        return 0, 0.0, 0.0
    shift = -d2
    if single:  # the leaves' shift in the keys' dtype (tree_pool, "Shift")
        shift = np.float64(np.float32(shift))
    shift = max(m[r], shift)
    room = (rho * total[r] - used[r]) * fast_exp(m[r] - shift)
    if not room > 0.0:
        return 0, shift, 0.0
    p_cost = 0  # the highest degree whose terms cost no more than the keys
    for p in range(1, p_node + 1):
        if deg_end[p] * ratio > count:
            break
        p_cost = p
    if p_cost == 0:
        return 0, shift, 0.0
    a2 = 0.0
    for f in range(q64.shape[1]):
        diff = q64[r, f] - centre[node, f]
        a2 += diff * diff
    dist = math.sqrt(a2)
    rad = radius[node]
    gap = max(dist - rad, 0.0)
    scale = count * fast_exp(-gap * gap - shift) * _BOUND_UP
    x = 2.0 * dist * rad
    # x^p / p! is unimodal in p: its least over 1..p_cost is at an end, so a row that no
    # degree can serve leaves here, without the search below (most rows that test)
    least = min(x, x**p_cost * _INV_FACTORIAL[p_cost])
    if 2.0 * scale * (least + (count + 2 * deg_end[1] + 64) * _ROUND) > room:
        return 0, shift, 0.0
    term = 1.0
    for p in range(1, p_cost + 1):
        n_terms = deg_end[p]
        term = term * x / p
        err = scale * (term + (count + 2 * n_terms + 64) * _ROUND)
        if 2.0 * err <= room:
            return p, shift, err
    return 0, shift, 0.0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def series_value(
    q64, r, node, p, shift, degree, offset, centre, parent, var, deg_end, coef, mono, a, acc_row
):
    """The node's series of degree < p for row r relative to exp(shift): returns the
    weight's and adds each value's into ``acc_row``; ``mono`` a scratch of deg_end[p]
    or more, ``a`` one of d. Called, not inlined (compile time)."""
    k = q64.shape[1]
    for f in range(k):
        a[f] = q64[r, f] - centre[node, f]
    a2 = 0.0
    for f in range(k):  # a sum in the loop that stores a would depend on where a lies
        a2 += a[f] * a[f]
    n_terms = deg_end[p]
    mono[0] = 1.0
    for t in range(1, n_terms):
        mono[t] = mono[parent[t]] * a[var[t]]
    stride = deg_end[degree[node]]
    base = offset[node]
    scale = math.exp(-a2 - shift)
    weight = 0.0
    for t in range(n_terms):
        weight += coef[base + t] * mono[t]
    for c in range(acc_row.shape[0]):
        at = base + (c + 1) * stride
        part = 0.0
        for t in range(n_terms):
            part += coef[at + t] * mono[t]
        acc_row[c] += scale * part
    return scale * weight


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def rescale(r, new_m, n_outputs, acc, m, total, used):
    """Row r's sums moved from the shift m[r] to ``new_m`` (above it)."""
    scale = math.exp(m[r] - new_m)
    total[r] *= scale
    used[r] *= scale
    for c in range(n_outputs):
        acc[r, c] *= scale
    m[r] = new_m


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def series_rows(
    q64,
    rows,
    n_rows,
    whole,
    keep,
    node,
    d2,
    start,
    stop,
    skip,
    series,
    ratio,
    rho,
    single,
    acc,
    m,
    total,
    used,
    scratch,
):
    """Node ``node`` (keys [start, stop) of it, box distance d2[r] from row r) for the
    tile's rows ``rows[:n_rows]``: each row drops it (``tree_pool``'s rule), takes its
    series (:func:`series_degree`) or neither. ``whole`` (an internal node): unless every
    row drops or takes the series, nothing is done and -1 returned (the tile descends);
    else (a leaf) the rows that do neither are written to ``keep`` and their count
    returned. ``series`` = (degree, offset, centre, radius, coef, parent, var, deg_end),
    ``scratch`` = (terms, choice, shifts, errs, mono, a): terms[r] counts the terms row r
    evaluated, the others are scratch of the tile's rows, deg_end[-1] terms and d."""
    degree, offset, centre, radius, coef, parent, var, deg_end = series
    terms, choice, shifts, errs, mono, a = scratch
    first = start[node]
    count = stop[node] - first
    n_outputs = acc.shape[1]
    for x in range(n_rows):
        r = rows[x]
        if total[r] > 0.0:
            bound = count * fast_exp(-d2[r] * _D2_SHRINK - m[r])
            if used[r] + bound <= rho * total[r]:
                choice[x] = -1
                errs[x] = bound
                continue
        own_in = first <= skip[r] < first + count
        p, shift, err = series_degree(
            q64,
            r,
            node,
            d2[r],
            count,
            own_in,
            degree,
            centre,
            radius,
            deg_end,
            ratio,
            rho,
            m,
            total,
            used,
            single,
        )
        if p == 0 and whole:
            return -1
        choice[x], shifts[x], errs[x] = p, shift, err
    n_keep = 0
    for x in range(n_rows):
        r = rows[x]
        p = choice[x]
        if p < 0:
            used[r] += errs[x]
        elif p == 0:
            keep[n_keep] = r
            n_keep += 1
        else:
            if shifts[x] > m[r]:
                rescale(r, shifts[x], n_outputs, acc, m, total, used)
            total[r] += series_value(
                q64,
                r,
                node,
                p,
                m[r],
                degree,
                offset,
                centre,
                parent,
                var,
                deg_end,
                coef,
                mono,
                a,
                acc[r],
            )
            used[r] += errs[x]
            terms[r] += deg_end[p]
    return n_keep
