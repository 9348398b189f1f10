"""The weighted moment sums of the local-polynomial fit and its small solve (CPU).

Per block of keys, with the block's scores s_j and the running maximum m of
the online softmax (``nbattn.kernels.local``), the first pass adds

    M_ab += sum_j w_j x_ja x_jb,    V_ao += sum_j w_j x_ja y_jo,    w_j = exp(s_j - m)

(a <= b; x_j0 = 1) to the query's moments. Three ways, by case:

* :func:`constant_moments`: the local constant with one output, one pass
  for l = sum_j w_j and sum_j w_j y_j;
* ``fused_moments_<p>``: one output and p = 2 to 5 terms (local-linear in 1-4
  columns, local-quadratic in one), every moment of the block in one pass
  with register accumulators. Its source is generated per p from one
  template (:func:`fused_moments_source`, shown for p = 3 in its docstring):
  numba keeps scalars in registers but not arrays, so each moment needs a
  variable of its own. Each p is a C callback, compiled when a fit first
  needs it (:func:`fused_moments_kernel`);
* :func:`design_moments`: any p and outputs, w_j stored over the scores,
  then one vectorised dot product per moment.

:func:`score_derivative_sums` adds the sums of the local-constant marginal
effects, and :func:`solve` solves the normalised system for g and beta.
:func:`block_moments` picks the path at run time from the pair that
:func:`fused_moments_for` hands it (the fused kernel's address and whether it
serves), so the first pass compiles once for every p, and a new p costs only
its small callback.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types

from .. import config
from .fastmath import fast_exp
from .local_pairs import F8P, compiled_callback, dlog_kernel

_PIVOT_TOL = config.LOCAL_PIVOT_TOL

#: The term counts that ``fused_moments`` handles in one pass (more would spill registers).
FUSED_TERMS = (2, 3, 4, 5)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def constant_moments(scores, y, nb, m, moments, rhs):
    """The local constant with one output: l and sum_j w_j y_j in one pass."""
    total = 0.0
    acc = 0.0
    for j in range(nb):
        w = fast_exp(scores[j] - m)
        total += w
        acc += w * y[j]
    moments[0, 0] += total
    rhs[0, 0] += acc


def fused_moments_source(p):
    """The source of ``fused_moments_<p>(nb, m, scores_p, y_p, x1_p, x2_p, x3_p, x4_p,
    o1, o2, o3, o4, moments_p, rhs_p)`` (the arrays by address: ``FUSED_SIGNATURE``).

    Term t >= 1 of key j is ``x<t>[j] - o<t>``: the key rows and the query's
    coordinates (the differences computed here, never stored), or the design rows
    and zeros; the rows past term p - 1 are never read. For p = 3 it reads::

        scores = carray(scores_p, (nb,))
        y = carray(y_p, (nb,))
        moments = carray(moments_p, (3, 3))
        rhs = carray(rhs_p, (3,))
        s00 = s01 = s02 = s11 = s12 = s22 = v0 = v1 = v2 = 0.0
        x1 = carray(x1_p, (nb,))
        x2 = carray(x2_p, (nb,))
        for j in range(nb):
            w = fast_exp(scores[j] - m)
            d1 = x1[j] - o1
            d2 = x2[j] - o2
            wd1 = w * d1
            wd2 = w * d2
            s00 += w
            s01 += wd1
            s02 += wd2
            s11 += wd1 * d1
            s12 += wd1 * d2
            s22 += wd2 * d2
            wy = w * y[j]
            v0 += wy
            v1 += wy * d1
            v2 += wy * d2
        moments[0, 0] += s00
        ...
        rhs[2] += v2

    p = 0 gives a kernel that does nothing: the address handed where no fused sums
    serve (:func:`fused_moments_for`).
    """
    head = (
        f"def fused_moments_{p}(nb, m, scores_p, y_p, x1_p, x2_p, x3_p, x4_p, "
        "o1, o2, o3, o4, moments_p, rhs_p):"
    )
    if p == 0:
        return head + "\n    return\n"
    terms = range(1, p)
    pairs = [(a, b) for a in range(p) for b in range(a, p)]
    sums = [f"s{a}{b}" for a, b in pairs] + [f"v{a}" for a in range(p)]
    body = [
        "scores = carray(scores_p, (nb,))",
        "y = carray(y_p, (nb,))",
        f"moments = carray(moments_p, ({p}, {p}))",
        f"rhs = carray(rhs_p, ({p},))",
        " = ".join(sums) + " = 0.0",
    ]
    body += [f"x{t} = carray(x{t}_p, (nb,))" for t in terms]
    body.append("for j in range(nb):")
    loop = ["w = fast_exp(scores[j] - m)"]
    loop += [f"d{t} = x{t}[j] - o{t}" for t in terms]
    loop += [f"wd{t} = w * d{t}" for t in terms]
    loop += [f"s0{b} += " + ("w" if b == 0 else f"wd{b}") for b in range(p)]
    loop += [f"s{a}{b} += wd{a} * d{b}" for a, b in pairs if a > 0]
    # the products (w d) y for one difference, (w y) d for more: the forms of the
    # hand-written sums this replaced, so that the results stay bit for bit the same
    if p == 2:
        loop += ["v0 += w * y[j]", "v1 += wd1 * y[j]"]
    else:
        loop += ["wy = w * y[j]", "v0 += wy"] + [f"v{t} += wy * d{t}" for t in terms]
    body += ["    " + line for line in loop]
    body += [f"moments[{a}, {b}] += s{a}{b}" for a, b in pairs]
    body += [f"rhs[{a}] += v{a}" for a in range(p)]
    return "\n".join([head] + ["    " + line for line in body]) + "\n"


#: The C signature of every fused moment kernel (:func:`fused_moments_source`): one type
#: for all p, so the first pass that calls one (through its address, an argument)
#: compiles once, not once per p.
FUSED_SIGNATURE = types.void(
    types.int64, types.float64, F8P, F8P, F8P, F8P, F8P, F8P,
    types.float64, types.float64, types.float64, types.float64, F8P, F8P,
)  # fmt: skip

_FUSED = {}


def fused_moments_kernel(p):
    """The compiled ``fused_moments_<p>`` (:func:`fused_moments_source`, a C callback),
    made once per p in a process (and cached on disk)."""
    if p in _FUSED:
        return _FUSED[p]
    namespace = {"__name__": __name__, "fast_exp": fast_exp, "carray": carray}
    return compiled_callback(
        _FUSED, p, fused_moments_source(p), f"fused_moments_{p}", FUSED_SIGNATURE,
        config.FASTMATH, namespace, __file__,
    )  # fmt: skip


def fused_moments_for(p, data, values_t):
    """``(address, on)``, what :func:`block_moments` reads: the address of the fused
    sums of p terms and True for one output (``values_t`` (1, n_k)) and p in
    ``FUSED_TERMS``, else the address of the kernel that does nothing (never called)
    and False. One argument type either way, so the first pass compiles once for every
    p (chosen by type, it compiled once per p: 3.4-4.5 s of CPU each). The kernel reads
    rows of the keys and values by address, so they must be C-contiguous float64."""
    arrays = (values_t, data.keys_cont_t, data.q_cont)
    on = (
        values_t.shape[0] == 1
        and p in FUSED_TERMS
        and all(a.dtype == np.float64 and a.flags.c_contiguous for a in arrays)
    )
    return fused_moments_kernel(p if on else 0).ctypes, on


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def block_moments(
    fused, i, j0, nb, data, values_t, store_design, do_mfx, kernel,
    scores, design, m, wx, moments, rhs, dsum, dysum,
):  # fmt: skip
    """Adds keys j0 .. j0+nb-1 of query i (their ``scores`` and ``design`` rows from
    ``block_scores``) to the moments, at the running maximum m:

    * ``fused`` on (:func:`fused_moments_for`: one output, p in ``FUSED_TERMS``): the
      fused sums of that p (``fused_moments_<p>``, called by address), the differences
      read from the design rows (``store_design``) or from the keys and the query;
    * else :func:`constant_moments` for the local constant with one output and no
      marginal effects, or :func:`design_moments` (and, with ``do_mfx``,
      :func:`score_derivative_sums`)."""
    address, on = fused
    p = moments.shape[0]
    if not on:
        if p == 1 and values_t.shape[0] == 1 and not do_mfx:
            constant_moments(scores, values_t[0, j0 : j0 + nb], nb, m, moments, rhs)
        else:
            design_moments(scores, design, values_t, j0, nb, m, p, wx, moments, rhs)
            if do_mfx:
                score_derivative_sums(scores, design, values_t, j0, nb, kernel, dsum, dysum)
        return
    y = values_t[0, j0 : j0 + nb]
    if store_design:  # rows past the last term repeat it (never read)
        x1, x2 = design[1, 0:nb], design[min(2, p - 1), 0:nb]
        x3, x4 = design[min(3, p - 1), 0:nb], design[min(4, p - 1), 0:nb]
        o1 = o2 = o3 = o4 = 0.0
    else:  # rows past the last column repeat it (never read)
        q_cont, keys_cont_t = data.q_cont, data.keys_cont_t
        dc = keys_cont_t.shape[0]
        c1, c2, c3 = min(1, dc - 1), min(2, dc - 1), min(3, dc - 1)
        x1, x2 = keys_cont_t[0, j0 : j0 + nb], keys_cont_t[c1, j0 : j0 + nb]
        x3, x4 = keys_cont_t[c2, j0 : j0 + nb], keys_cont_t[c3, j0 : j0 + nb]
        o1, o2, o3, o4 = q_cont[i, 0], q_cont[i, c1], q_cont[i, c2], q_cont[i, c3]
    address(
        nb, m, scores.ctypes, y.ctypes, x1.ctypes, x2.ctypes, x3.ctypes, x4.ctypes,
        o1, o2, o3, o4, moments.ctypes, rhs.ctypes,
    )  # fmt: skip


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def block_dot(u, v, nb):
    """sum_j u_j v_j over the block's nb keys (one vectorised reduction)."""
    acc = 0.0
    for j in range(nb):
        acc += u[j] * v[j]
    return acc


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def add_value_sums(u, values_t, j0, nb, sums):
    """sums_o += sum_j u_j y_jo for every output o (``values_t`` rows, keys j0 .. j0+nb-1)."""
    for o in range(values_t.shape[0]):
        sums[o] += block_dot(u, values_t[o, j0 : j0 + nb], nb)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def design_moments(scores, design, values_t, j0, nb, m, p, wx, moments, rhs):
    """Any p and outputs: w_j over ``scores``, then one dot product per moment
    (``wx`` is scratch, ``design`` the block's design rows)."""
    total = 0.0
    for j in range(nb):
        w = fast_exp(scores[j] - m)
        scores[j] = w
        total += w
    moments[0, 0] += total
    add_value_sums(scores, values_t, j0, nb, rhs[0])
    for a in range(1, p):
        # wx[j] = w_j x_ja, then one dot product per moment
        xa = design[a]
        for j in range(nb):
            wx[j] = scores[j] * xa[j]
        acc = 0.0
        for j in range(nb):
            acc += wx[j]
        moments[0, a] += acc
        for b in range(a, p):
            moments[a, b] += block_dot(wx, design[b], nb)
        add_value_sums(wx, values_t, j0, nb, rhs[a])


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def score_derivative_sums(scores, design, values_t, j0, nb, kernel, dsum, dysum):
    """The local-constant marginal effects' sums, after :func:`design_moments` left
    w_j in ``scores``: dsum_c += sum_j w_j ds_jc and dysum_co += sum_j w_j ds_jc y_jo
    with ds_jc = -s'(d_jc), the score's derivative with respect to q_c (the design
    rows of the differences are overwritten)."""
    for c in range(dsum.shape[0]):
        row = design[1 + c]
        acc = 0.0
        for j in range(nb):
            ds = -dlog_kernel(row[j], kernel)
            row[j] = ds * scores[j]
            acc += row[j]
        dsum[c] += acc
        add_value_sums(row, values_t, j0, nb, dysum[c])


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def solve(moments, rhs, ridge, g, beta, a, keep, z):
    """Solve (M + ridge diag(0, M_11, ...)) [g, beta] = [e_1, rhs] by Cholesky; non-positive
    pivots drop their term (coefficient 0). ``a`` (p, p), ``keep`` (p,) and ``z`` (p,) are
    scratch (the caller's, so that a query allocates nothing). The factor's diagonal is
    stored as its reciprocal: one division per term instead of one per entry (the solve is
    a chain of dependent operations, so its latency, not its flops, is what a query pays)."""
    p = moments.shape[0]
    n_out = rhs.shape[1]
    for t in range(p):  # explicit loops: numba's slice assignment costs more at p <= 10
        for u in range(p):
            a[t, u] = moments[t, u]
        keep[t] = True
    for t in range(1, p):
        a[t, t] += ridge * a[t, t]
    for t in range(p):
        for u in range(t):
            if not keep[u]:
                continue
            a[t, t] -= a[t, u] * a[t, u]
        diag_scale = moments[t, t] * (1.0 + ridge)
        if not (a[t, t] > _PIVOT_TOL * diag_scale) or not (diag_scale > 0.0):
            keep[t] = False
            for v in range(t, p):
                a[v, t] = 0.0
            continue
        a[t, t] = 1.0 / np.sqrt(a[t, t])
        for v in range(t + 1, p):
            acc = a[v, t]
            for u in range(t):
                acc -= a[v, u] * a[t, u]
            a[v, t] = acc * a[t, t]
    # forward and back substitution for e_1 and each output
    for col in range(n_out + 1):
        for t in range(p):
            z[t] = 0.0
        for t in range(p):
            if not keep[t]:
                continue
            acc = (1.0 if t == 0 else 0.0) if col == 0 else rhs[t, col - 1]
            for u in range(t):
                acc -= a[t, u] * z[u]
            z[t] = acc * a[t, t]
        for t in range(p - 1, -1, -1):
            if not keep[t]:
                z[t] = 0.0
                continue
            acc = z[t]
            for u in range(t + 1, p):
                acc -= a[u, t] * z[u]
            z[t] = acc * a[t, t]
        if col == 0:
            for t in range(p):
                g[t] = z[t]
        else:
            for t in range(p):
                beta[t, col - 1] = z[t]
