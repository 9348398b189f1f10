"""Leave-one-out bandwidths and learned metrics: nbattn against its peers, in one run.

Usage: python scripts/bench_bandwidth.py [--full] [--skip-statsmodels]

1. statsmodels ``KernelReg(reg_type="lc", bw="cv_ls")`` (Nelder-Mead over the
   per-feature LOO least-squares criterion, Python loops) against
   ``nbattn.loo_bandwidth`` (one scale of Scott's widths: grid + bounded
   Brent) and, in 3-D, ``LearnedKernelRegressor(metric="diagonal")`` (per-feature
   widths, L-BFGS-B on the exact gradient): n = 500 and 2,000 in 1-D, n = 500
   in 3-D (n = 2,000 in 3-D with --full: statsmodels needs ~30 min there).
   Both LOO MSEs are computed by the same exact float64 function.
2. MLKR loss + gradient per evaluation at n = 1,000, d = 5: metric-learn's
   formulation (full n x n matrices, NumPy/BLAS; metric-learn itself does not
   install on scikit-learn 1.9) against ``nbattn.loo_loss_and_grad(components=L)``.
3. ``nbattn.loo_bandwidth`` at n = 100,000 in 1-D, float64 and float32.

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
from nbattn import learning


def _seed_like(n, d, rng):
    """The seed's function along the first coordinate, extra smooth terms for d > 1."""
    X = rng.uniform(0.0, 6.0, size=(n, d))
    y = 2 * np.sin(X[:, 0]) + X[:, 0] ** 0.8
    for k in range(1, d):
        y = y + np.cos((k + 1) * X[:, k] / 2)
    return X, y + rng.normal(0.0, 0.5, n)


def _best_of(fun, repeat=3):
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fun()
        best = min(best, time.perf_counter() - t0)
    return best, out


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
            mse_sm = learning.loo_loss(X, y, np.asarray(bw))
        t_nb, h = _best_of(lambda X=X, y=y: learning.loo_bandwidth(X, y))
        mse_nb = learning.loo_loss(X, y, h)
        print(
            f"{n:>6} {d:>2} {t_sm:>14.2f} {t_nb:>10.4f} {t_sm / t_nb:>7.0f}x "
            f"{mse_sm:>12.6f} {mse_nb:>15.6f} {'loo_bandwidth (scale)':>22}"
        )
        if d > 1:

            def fit(X=X, y=y):
                return nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, y)

            t_dg, model = _best_of(fit, repeat=1)
            mse_dg = learning.loo_loss(X, y, model.bandwidth_)
            print(
                f"{n:>6} {d:>2} {t_sm:>14.2f} {t_dg:>10.4f} {t_sm / t_dg:>7.0f}x "
                f"{mse_sm:>12.6f} {mse_dg:>15.6f} {'diagonal L-BFGS-B':>22}"
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
    print(f"\n== MLKR loss + gradient per evaluation, n = {n}, d = {d} ==")
    rng = np.random.default_rng(1)
    X, y = _seed_like(n, d, rng)
    X = X - X.mean(axis=0)
    A = rng.normal(size=(d, d)) / 3.0
    t_peer, (cost, grad_a) = _best_of(lambda: mlkr_loss_and_grad(A, X, y), repeat=3)
    L = np.sqrt(2.0) * A  # nbattn's score is -1/2 ||L (x_i - x_j)||^2
    nbattn.loo_loss_and_grad(X[:50], y[:50], components=L)  # compile
    t_nb, (loss, grad_l) = _best_of(lambda: nbattn.loo_loss_and_grad(X, y, components=L), 5)
    # same objective: cost = n * loss, d cost / dA = n * sqrt(2) * d loss / dL
    rel_loss = abs(n * loss - cost) / cost
    rel_grad = np.abs(n * np.sqrt(2.0) * grad_l - grad_a).max() / np.abs(grad_a).max()
    print(f"NumPy full-matrix MLKR (metric-learn formulation): {t_peer * 1e3:9.2f} ms")
    print(f"nbattn loo_loss_and_grad(components=L):            {t_nb * 1e3:9.2f} ms")
    print(f"ratio {t_peer / t_nb:.1f}x; agreement: loss {rel_loss:.1e}, gradient {rel_grad:.1e}")
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
        learning.loo_bandwidth(X[:200], y[:200], dtype=dtype)  # compile
        t0 = time.perf_counter()
        h = learning.loo_bandwidth(X, y, dtype=dtype)
        elapsed = time.perf_counter() - t0
        factor = h[0] / learning.bandwidth_rule(X)[0]
        print(f"{dtype}: {elapsed:6.1f} s   h = {h[0]:.5f} ({factor:.3f} x Scott)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also statsmodels 3-D n=2000")
    parser.add_argument("--skip-statsmodels", action="store_true")
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    rng = np.random.default_rng(3)
    Xw, yw = _seed_like(300, 3, rng)
    learning.loo_bandwidth(Xw[:, :1], yw)  # compile the kernels before timing
    learning.loo_bandwidth(Xw, yw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=2).fit(Xw[:50], yw[:50])
    cases = [(500, 1), (2000, 1), (500, 3)] + ([(2000, 3)] if args.full else [])
    bench_statsmodels(cases, args.skip_statsmodels)
    bench_mlkr()
    bench_large()
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
