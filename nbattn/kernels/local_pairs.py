"""The pair terms of the local-polynomial kernels (CPU): scores and design rows of a key block.

For query i and key j the score is the log of the product kernel (the formulas
are in ``nbattn.kernels.local``'s docstring),

    s_j = log w_j + sum_c log K(d_jc) + sum_k (a_k if equal else b_k + t_k |q_k - k_jk|),

with d_jc = k_jc - q_ic (the columns are already divided by their widths; under
nearest-neighbour widths log K(r d_jc), r the query's or the key's stretch), and
the local design x_j = (1, d_j, [d_jc d_jc' for c <= c']). :func:`block_scores`
computes both for one block of keys (vectorised loops over the keys, one
column at a time); :func:`pair_scores` computes the same bits in one pass over the
keys where a generated kernel of the columns' kinds serves (:func:`one_pass_for`;
Gaussian, no missing value, fixed widths, few columns), a C callback the local
passes call by address; :func:`nearest_key` is the fallback of a query that no key
reaches; :func:`dlog_kernel` is s'(d), which the marginal effects and the
width gradient read.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, cfunc, njit, types
from numba.extending import overload

from .. import config
from .._core.local_groups import EPANECHNIKOV, GAUSSIAN
from .fastmath import fmax

_KEY_BLOCK = config.KEY_BLOCK


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def dlog_kernel(d, kernel):
    """s'(d), the derivative of log K(d) (0 outside a compact support)."""
    if kernel == GAUSSIAN:
        return -d
    if kernel == EPANECHNIKOV:
        d2 = d * d
        if d2 >= 1.0:
            return 0.0
        return -2.0 * d / (1.0 - d2)
    a = abs(d)
    a3 = a * a * a
    if a3 >= 1.0:
        return 0.0
    return -9.0 * d * a / (1.0 - a3)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def category_term(x, qk, a, b, t):
    """The term of a categorical column for a key's code x and the query's code qk:
    a for equal codes, b + t max(|x - qk|, 1) for unequal ones, 0 where x is missing.

    With (a, b, t) = ``cat_params[k]`` it is the column's score term; the term is
    linear in (a, b, t), so with ``cat_dparams[k]``, their derivatives with respect
    to a width parameter, it is the score's derivative. (|x - q| >= 1 where integer
    codes differ, so t = -inf, l = 0, never meets 0.)"""
    if x == qk:
        return a
    if x == x:
        return b + t * fmax(abs(x - qk), 1.0)
    return 0.0


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def log_kernel(d, kernel):
    """log K(d) of a continuous kernel without its constant (-inf outside a compact
    support), the engine's convention (``nbattn.kernels.local``); the densities' kernel
    sums read it."""
    if kernel == GAUSSIAN:
        return -0.5 * d * d
    if kernel == EPANECHNIKOV:
        inside = 1.0 - d * d
        return math.log(inside) if inside > 0.0 else -math.inf
    inside = 1.0 - abs(d) ** 3
    return 3.0 * math.log(inside) if inside > 0.0 else -math.inf


def stretched_terms(i, j0, nb, data, kernel, missing, scores, design):
    """The continuous columns' terms of :func:`block_scores` under nearest-neighbour
    widths, chosen by type: where ``LocalData``'s stretches are None (fixed widths) it does
    nothing and returns False, and no stretched code is compiled into the caller (a branch
    on a value would compile it into every local kernel: +1.5 s of the first local-linear
    call); where they are arrays, :func:`_stretched_terms` and True."""
    raise NotImplementedError("stretched_terms runs in compiled code only")


@overload(stretched_terms, inline="always")
def _stretched_terms_overload(i, j0, nb, data, kernel, missing, scores, design):
    if isinstance(data.types[data.fields.index("q_stretch")], types.NoneType):

        def fixed(i, j0, nb, data, kernel, missing, scores, design):
            return False

        return fixed

    def stretched(i, j0, nb, data, kernel, missing, scores, design):
        _stretched_terms(i, j0, nb, data, kernel, missing, scores, design)
        return True

    return stretched


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def _stretched_terms(i, j0, nb, data, kernel, missing, scores, design):
    """log K(r d_jc), r the query's stretch ``q_stretch[i, c]`` or the key's
    ``keys_stretch_t[c, j]`` (``LocalData``; one of them (0, 0)), added to ``scores``; the
    unstretched differences d_jc go to the design rows (always written)."""
    q_cont, keys_cont_t = data.q_cont, data.keys_cont_t
    per_query = data.q_stretch.shape[0] > 0
    per_key = data.keys_stretch_t.shape[1] > 0
    gaussian = kernel == GAUSSIAN
    prod = design[0]
    for j in range(nb):
        prod[j] = 1.0
    for c in range(keys_cont_t.shape[0]):
        qc = q_cont[i, c]
        kc = keys_cont_t[c, j0 : j0 + nb]
        # the keys' stretches, or any row of the same type where they are not stretched
        rk = data.keys_stretch_t[c, j0 : j0 + nb] if per_key else kc
        rq = data.q_stretch[i, c] if per_query else 1.0
        row = design[1 + c]
        for j in range(nb):
            d = kc[j] - qc
            if missing and d != d:
                d = 0.0
            row[j] = d
            u = d * rk[j] if per_key else d * rq
            if gaussian:
                scores[j] -= 0.5 * u * u
            elif kernel == EPANECHNIKOV:
                f = 1.0 - u * u
                prod[j] *= f if f > 0.0 else 0.0
            else:
                a = abs(u)
                f = 1.0 - a * a * a
                prod[j] *= f * f * f if f > 0.0 else 0.0
    if not gaussian and keys_cont_t.shape[0] > 0:
        for j in range(nb):
            scores[j] += np.log(prod[j]) if prod[j] > 0.0 else -np.inf


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def block_scores(i, j0, nb, data, model, weighted, store_design, scores, design):
    """Scores of keys j0 .. j0+nb-1 for query i into ``scores``, the scaled differences
    into ``design[1 : 1 + dc]`` (0 where missing) and the quadratic terms after them
    (``design[0]`` is scratch: the constant term is implicit).

    ``data`` and ``model``: the ``LocalData`` and ``LocalModel`` groups.
    ``weighted``: whether ``log_weights`` holds anything but zeros. With
    ``store_design`` False (only without missing values) the design rows are
    left unwritten: the caller reads the differences from the keys itself.
    Returns the block's maximum score (-inf when no key is admissible).
    """
    q_cont, keys_cont_t = data.q_cont, data.keys_cont_t
    q_cat, keys_cat_t, log_weights = data.q_cat, data.keys_cat_t, data.log_weights
    cat_params, kernel, degree = model.cat_params, model.kernel, model.degree
    exclude_self, missing = model.exclude_self, model.missing
    dc = keys_cont_t.shape[0]
    dk = keys_cat_t.shape[0]
    if weighted:
        block_log_weights = log_weights[j0 : j0 + nb]  # a slice: [j0 + j] would not vectorise
        for j in range(nb):
            scores[j] = block_log_weights[j]
    else:
        for j in range(nb):
            scores[j] = 0.0
    if stretched_terms(i, j0, nb, data, kernel, missing, scores, design):
        pass
    elif kernel == GAUSSIAN:
        for c in range(dc):
            qc = q_cont[i, c]
            kc = keys_cont_t[c, j0 : j0 + nb]
            row = design[1 + c]
            if missing:
                if qc != qc:
                    for j in range(nb):
                        row[j] = 0.0
                    continue
                for j in range(nb):
                    d = kc[j] - qc
                    if d != d:
                        d = 0.0
                    row[j] = d
                    scores[j] -= 0.5 * d * d
            elif store_design:
                for j in range(nb):
                    d = kc[j] - qc
                    row[j] = d
                    scores[j] -= 0.5 * d * d
            else:
                for j in range(nb):
                    d = kc[j] - qc
                    scores[j] -= 0.5 * d * d
    elif dc > 0:
        # Compact kernels: the product in the linear domain, one log per pair.
        prod = design[0]
        for j in range(nb):
            prod[j] = 1.0
        for c in range(dc):
            qc = q_cont[i, c]
            kc = keys_cont_t[c, j0 : j0 + nb]
            row = design[1 + c]
            if missing and qc != qc:
                for j in range(nb):
                    row[j] = 0.0
                continue
            for j in range(nb):
                d = kc[j] - qc
                if missing and d != d:
                    d = 0.0
                if store_design:
                    row[j] = d
                if kernel == EPANECHNIKOV:
                    f = 1.0 - d * d
                else:
                    a = abs(d)
                    f = 1.0 - a * a * a
                    f = f * f * f
                prod[j] *= f if f > 0.0 else 0.0
        for j in range(nb):
            scores[j] += np.log(prod[j]) if prod[j] > 0.0 else -np.inf
    for k in range(dk):
        qk = q_cat[i, k]
        if missing and qk != qk:
            continue
        a_eq = cat_params[k, 0]
        b_ne = cat_params[k, 1]
        t_step = cat_params[k, 2]
        kk = keys_cat_t[k, j0 : j0 + nb]
        if missing:
            for j in range(nb):
                scores[j] += category_term(kk[j], qk, a_eq, b_ne, t_step)
        elif t_step == 0.0:
            for j in range(nb):
                scores[j] += a_eq if kk[j] == qk else b_ne
        else:  # no missing code: the branch of category_term without the NaN test
            for j in range(nb):
                x = kk[j]
                scores[j] += a_eq if x == qk else b_ne + t_step * fmax(abs(x - qk), 1.0)
    return finish_block(i, j0, nb, dc, degree, exclude_self, scores, design)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def finish_block(i, j0, nb, dc, degree, exclude_self, scores, design):
    """The end of a block's scores: query i's own key excluded, the quadratic terms of the
    design (degree 2), and the block's maximum score (returned)."""
    if exclude_self and j0 <= i < j0 + nb:
        scores[i - j0] = -np.inf
    p = design.shape[0]
    if degree >= 2 and p > 1:
        t = 1 + dc
        for c in range(dc):
            for c2 in range(c, dc):
                for j in range(nb):
                    design[t, j] = design[1 + c, j] * design[1 + c2, j]
                t += 1
    best = -np.inf
    for j in range(nb):
        best = fmax(best, scores[j])  # maxnum vectorises; scores are never NaN
    return best


# --------------------------------------------------------------------------- one-pass scores
#: The flags of the one-pass scores: config.FASTMATH without reassociation, so that LLVM
#: keeps each pair's additions in the order written, the order of the one-column passes
#: of :func:`block_scores` (bit for bit the same scores).
_IN_ORDER = set(config.FASTMATH) - {"reassoc"}

#: The most columns (continuous and categorical together) of a one-pass score kernel.
ONE_PASS_COLUMNS = 8

#: The most continuous columns a local-linear fit scores in one pass. Beyond them the
#: one-column passes are as fast or faster (one thread, in-process alternation, time one
#: pass / the other: 0.79-0.91 with up to four continuous columns, 0.95 with five, 1.00
#: with six, 1.05-1.20 with eight); a local-quadratic fit, whose moment sums dominate,
#: gained nothing (0.99) and keeps them.
ONE_PASS_LINEAR_COLUMNS = 5


def one_pass_kinds(data, model):
    """The column kinds of the one-pass scores of a problem, a string ('c' continuous, 'u'
    a categorical column with t = 0, 'o' another one), or None where :func:`block_scores`
    serves it (a compact kernel, missing values, nearest-neighbour widths, too many
    columns, a local-linear fit of more than ``ONE_PASS_LINEAR_COLUMNS`` continuous
    columns or a local-quadratic one, where it does not pay, or an array that is not
    C-contiguous float64: the kernel reads them by address)."""
    dc, dk = data.keys_cont_t.shape[0], data.keys_cat_t.shape[0]
    degree = int(model.degree)
    arrays = (data.q_cont, data.keys_cont_t, data.q_cat, data.keys_cat_t, data.log_weights,
              model.cat_params)  # fmt: skip
    if (
        int(model.kernel) != GAUSSIAN
        or bool(model.missing)
        or data.q_stretch is not None
        or not 0 < dc + dk <= ONE_PASS_COLUMNS
        or degree >= 2
        or (degree == 1 and dc > ONE_PASS_LINEAR_COLUMNS)
        or not all(a.dtype == np.float64 and a.flags.c_contiguous for a in arrays)
    ):
        return None
    return "c" * dc + "".join("u" if t == 0.0 else "o" for t in model.cat_params[:, 2])


#: A pointer to float64, the array arguments of the C callbacks (here and
#: ``local_moments``'s fused sums).
F8P = types.CPointer(types.float64)
#: The C signature of every one-pass kernel (:func:`one_pass_source`): one type for all
#: column kinds, so the kernels that call one (through its address, an argument) compile
#: once, not once per kinds.
ONE_PASS_SIGNATURE = types.void(
    types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
    types.int64, types.int64, types.int64,
    F8P, F8P, F8P, F8P, F8P, F8P, F8P, F8P,
)  # fmt: skip


def one_pass_source(kinds):
    """The source of ``one_pass_<kinds>(i, j0, nb, n_q, n_k, n_rows, n_cols, weighted,
    store_design, q_cont, keys_cont_t, q_cat, keys_cat_t, log_weights, cat_params, scores,
    design)`` (the arrays by address: ``ONE_PASS_SIGNATURE``): the scores of keys
    j0 .. j0+nb-1 for query i in one pass over the keys, each pair's score in a register
    (the log weight or 0, then each continuous column's -d^2/2, then each categorical
    column's term: the order of :func:`block_scores`' one-column passes), and with
    ``store_design`` the differences into ``design[1 : 1 + dc]``. Gaussian kernel, no
    missing value."""
    dc = kinds.count("c")
    cats = kinds[dc:]
    dk = len(cats)
    head = [
        f"def one_pass_{kinds}(i, j0, nb, n_q, n_k, n_rows, n_cols, weighted, "
        "store_design, q_cont_p, keys_cont_p, q_cat_p, keys_cat_p, log_weights_p, "
        "cat_params_p, scores_p, design_p):"
    ]
    body = [
        "w = carray(log_weights_p, (n_k,))[j0 : j0 + nb]",
        "scores = carray(scores_p, (nb,))",
    ]
    if dc:
        body += [
            f"q_cont = carray(q_cont_p, (n_q, {dc}))",
            f"keys_cont_t = carray(keys_cont_p, ({dc}, n_k))",
            "design = carray(design_p, (n_rows, n_cols))",
        ]
    if dk:
        body += [
            f"q_cat = carray(q_cat_p, (n_q, {dk}))",
            f"keys_cat_t = carray(keys_cat_p, ({dk}, n_k))",
            f"cat_params = carray(cat_params_p, ({dk}, 3))",
        ]
    for c in range(dc):
        body += [
            f"x{c} = keys_cont_t[{c}, j0 : j0 + nb]",
            f"q{c} = q_cont[i, {c}]",
            f"e{c} = design[{1 + c}]",
        ]
    for k, kind in enumerate(cats):
        body += [
            f"y{k} = keys_cat_t[{k}, j0 : j0 + nb]",
            f"r{k} = q_cat[i, {k}]",
            f"a{k} = cat_params[{k}, 0]",
            f"b{k} = cat_params[{k}, 1]",
        ]
        if kind == "o":
            body.append(f"t{k} = cat_params[{k}, 2]")

    def loop(start, store):
        lines = ["for j in range(nb):", f"    s = {start}"]
        for c in range(dc):
            lines.append(f"    d = x{c}[j] - q{c}")
            if store:
                lines.append(f"    e{c}[j] = d")
            lines += ["    dd = d * d", "    s = s - 0.5 * dd"]
        for k, kind in enumerate(cats):
            if kind == "u":
                lines.append(f"    s = s + (a{k} if y{k}[j] == r{k} else b{k})")
            else:
                lines += [
                    f"    u = y{k}[j]",
                    f"    s = s + (a{k} if u == r{k} else b{k} + t{k} * fmax(abs(u - r{k}), 1.0))",
                ]
        lines.append("    scores[j] = s")
        return lines

    def indent(lines, n):
        return [" " * n + line for line in lines]

    def by_weights(store):
        return (
            ["if weighted:"]
            + indent(loop("w[j]", store), 4)
            + ["else:"]
            + indent(loop("0.0", store), 4)
        )

    if dc:
        body += ["if store_design:"] + indent(by_weights(True), 4)
        body += ["else:"] + indent(by_weights(False), 4)
    else:
        body += by_weights(False)
    return "\n".join(head + indent(body, 4)) + "\n"


_ONE_PASS = {}


def compiled_callback(registry, key, source, name, signature, fastmath, namespace, filename):
    """``registry[key]``, compiling it first when absent: the C callback ``name`` defined
    by ``source`` (executed in ``namespace``, which holds the caller's ``__name__``, as if
    written in ``filename``, the caller's file), of C ``signature``, cached on disk.
    The local passes' generated callbacks (:func:`one_pass_kernel`,
    ``local_moments.fused_moments_kernel``) are made here."""
    if key not in registry:
        # cache=True needs a function's source file on disk, and a cached callback
        # rebuilds its environment from its module: hence the caller's file and name
        exec(compile(source, filename, "exec"), namespace)
        compiled = cfunc(signature, fastmath=fastmath, cache=config.CACHE)(namespace[name])
        # the first one stored wins: a thread whose kernel is running holds only its address,
        # and a callback replaced in the registry would free the code under it
        registry.setdefault(key, compiled)
    return registry[key]


def one_pass_kernel(kinds):
    """The compiled ``one_pass_<kinds>`` (:func:`one_pass_source`, a C callback), made once
    per kinds in a process (and cached on disk)."""
    if kinds in _ONE_PASS:
        return _ONE_PASS[kinds]
    namespace = {"__name__": __name__, "fmax": fmax, "carray": carray}
    return compiled_callback(
        _ONE_PASS, kinds, one_pass_source(kinds), f"one_pass_{kinds}", ONE_PASS_SIGNATURE,
        _IN_ORDER, namespace, __file__,
    )  # fmt: skip


def one_pass_for(data, model):
    """``(address, on)``, what :func:`pair_scores` reads: the address of the one-pass
    scores of the problem's column kinds (:func:`one_pass_kinds`) and True, or, where
    :func:`block_scores` serves the problem, the address of the kernel of no column
    (never called) and False. One argument type either way, so a local kernel compiles
    once for every problem (a None here would compile each kernel twice)."""
    kinds = one_pass_kinds(data, model)
    return one_pass_kernel(kinds or "").ctypes, kinds is not None


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def pair_scores(one_pass, i, j0, nb, data, model, weighted, store_design, scores, design):
    """:func:`block_scores`' scores, design rows and block maximum, from the one-pass kernel
    where ``one_pass`` (:func:`one_pass_for`) says so (the same bits in one pass over the
    keys), else from :func:`block_scores` itself."""
    address, on = one_pass
    if not on:
        return block_scores(i, j0, nb, data, model, weighted, store_design, scores, design)
    n_q, dc, _, n_k = problem_shape(data)
    address(
        i, j0, nb, n_q, n_k, design.shape[0], design.shape[1],
        1 if weighted else 0, 1 if store_design else 0,
        data.q_cont.ctypes, data.keys_cont_t.ctypes, data.q_cat.ctypes,
        data.keys_cat_t.ctypes, data.log_weights.ctypes, model.cat_params.ctypes,
        scores.ctypes, design.ctypes,
    )  # fmt: skip
    return finish_block(i, j0, nb, dc, model.degree, model.exclude_self, scores, design)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def any_weight(log_weights):
    """Whether any key has a log weight other than 0 (the unweighted case skips them)."""
    for j in range(log_weights.shape[0]):
        if log_weights[j] != 0.0:
            return True
    return False


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def problem_sizes(data):
    """(n_q, dc, dk, n_k, weighted) of the ``LocalData`` group: the queries, the
    continuous and categorical columns, the keys, and whether any key has a log
    weight other than 0 (``any_weight``, the argument of :func:`block_scores`)."""
    n_q, dc, dk, n_k = problem_shape(data)
    return n_q, dc, dk, n_k, any_weight(data.log_weights)


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def problem_shape(data):
    """(n_q, dc, dk, n_k) of the ``LocalData`` group (:func:`problem_sizes` without the
    pass over the key weights)."""
    n_q = data.q_cont.shape[0]
    dc = data.keys_cont_t.shape[0]
    dk = data.keys_cat_t.shape[0]
    n_k = data.log_weights.shape[0]
    return n_q, dc, dk, n_k


@njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")
def block_scratch(p, dc):
    """The scratch of :func:`block_scores` for a chunk of queries: the block's scores
    and its design rows (p terms, and at least the 1 + dc rows of the differences).
    Zeroed, not empty: a row read before it is written (a kernel's bug) then gives the
    same answer in every run instead of whatever the allocator handed back (once per
    chunk of queries, so the cost does not show)."""
    return np.zeros(_KEY_BLOCK), np.zeros((max(p, 1 + dc), _KEY_BLOCK))


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def nearest_key(i, data, exclude_self):
    """The admissible key nearest query i: fewest unequal categories, then smallest
    sum of squared scaled differences (missing entries ignored), the first on ties;
    -1 when no key is admissible."""
    q_cont, keys_cont_t = data.q_cont, data.keys_cont_t
    q_cat, keys_cat_t, log_weights = data.q_cat, data.keys_cat_t, data.log_weights
    n_k = log_weights.shape[0]
    best = -1
    best_mis = np.inf
    best_dist = np.inf
    for j in range(n_k):
        if log_weights[j] == -np.inf or (exclude_self and j == i):
            continue
        mis = 0.0
        for k in range(keys_cat_t.shape[0]):
            x = keys_cat_t[k, j]
            qk = q_cat[i, k]
            if x == x and qk == qk and x != qk:
                mis += 1.0
        dist = 0.0
        for c in range(keys_cont_t.shape[0]):
            d = keys_cont_t[c, j] - q_cont[i, c]
            if d == d:
                dist += d * d
        if mis < best_mis or (mis == best_mis and dist < best_dist):
            best, best_mis, best_dist = j, mis, dist
    return best
