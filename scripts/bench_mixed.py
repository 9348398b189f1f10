"""Mixed-type local regression: nbattn against statsmodels KernelReg, measured in one run.

Three measurements on mixed data (3 continuous columns, one unordered column
with 3 categories and one ordered column with 4):

1. Leave-one-out widths: ``nbattn.local.widths.local_loo_widths`` against
   statsmodels ``KernelReg(bw="cv_ls")``, local-constant (degree 0, the
   estimator both define for categorical columns), n = 500: seconds each, the
   LOO MSE each reaches (both evaluated by ``nbattn.local.engine.local_loo_loss``;
   statsmodels' unbounded Nelder-Mead may leave a smoothing l outside its
   kernel's domain, which is clipped to the domain for the evaluation), and the
   speed ratio.
2. Local-linear prediction at fixed widths: ``local_polynomial(degree=1)``
   against ``KernelReg(reg_type="ll").fit`` on the continuous columns (the
   statsmodels local-linear design would hold category codes), seconds and ratio.
3. Throughput: local-linear (and local-constant, local-quadratic) pairs/s
   against ``nbattn.nadaraya_watson`` on the same continuous data, d = 1..4.

    python scripts/bench_mixed.py [--n 500] [--pairs-n 4000] [--skip-cv]

statsmodels' cv_ls takes minutes at n = 500; --skip-cv leaves it out.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from _timing import best_time

from nbattn.local.engine import fit_problem, local_loo_loss, local_polynomial
from nbattn.local.problem import prepare
from nbattn.local.widths import local_loo_widths
from nbattn.smoothing.regression import nadaraya_watson

VAR_TYPE = "cccuo"
COUNTS = [0, 0, 0, 3, 4]


def mixed_data(n, rng):
    X = np.column_stack(
        [
            rng.normal(size=n),
            rng.uniform(-2, 2, size=n),
            rng.normal(size=n),
            rng.integers(0, 3, n),
            rng.integers(0, 4, n),
        ]
    ).astype(float)
    X[:3, 3] = np.arange(3)
    X[:4, 4] = np.arange(4)
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * X[:, 2] ** 2 + 0.4 * X[:, 3] - 0.2 * X[:, 4]
    return X, y + 0.3 * rng.normal(size=n)


def bench_widths(n, rng):
    from statsmodels.nonparametric.kernel_regression import KernelReg

    X, y = mixed_data(n, rng)
    local_loo_widths(X[:50], y[:50], 0, var_type=VAR_TYPE, n_categories=COUNTS)  # compile
    t_ours = best_time(
        lambda: local_loo_widths(X, y, 0, var_type=VAR_TYPE, n_categories=COUNTS), repeat=3
    )
    ours = local_loo_widths(X, y, 0, var_type=VAR_TYPE, n_categories=COUNTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        kr = KernelReg(y, X, VAR_TYPE, reg_type="lc", bw="cv_ls")
        t_sm = time.perf_counter() - t0
    top = np.array([0, 0, 0, 2 / 3, 1.0])
    sm_bw = np.where(top > 0, np.clip(kr.bw, 0, top), np.abs(kr.bw))
    kw = dict(var_type=VAR_TYPE, n_categories=COUNTS)
    mse_ours = local_loo_loss(X, y, ours, 0, **kw)
    mse_sm = local_loo_loss(X, y, sm_bw, 0, **kw)
    print(f"LOO widths, local-constant, n={n}, var_type={VAR_TYPE}")
    print(f"  nbattn      {t_ours:8.3f} s   LOO MSE {mse_ours:.6f}   widths {np.round(ours, 4)}")
    print(f"  statsmodels {t_sm:8.3f} s   LOO MSE {mse_sm:.6f}   widths {np.round(kr.bw, 4)}")
    ratio = mse_ours / mse_sm
    print(f"  speed ratio {t_sm / t_ours:8.1f}x   MSE ratio nbattn/statsmodels {ratio:.6f}")


def bench_predict(n, rng):
    from statsmodels.nonparametric.kernel_regression import KernelReg

    X, y = mixed_data(n, rng)
    Xc = X[:, :3]
    Q = mixed_data(n, rng)[0][:, :3]
    bw = np.array([0.4, 0.6, 0.4])
    kr = KernelReg(y, Xc, "ccc", reg_type="ll", bw=bw)
    local_polynomial(Q[:5], Xc, y, bw, 1)
    t_ours = best_time(lambda: local_polynomial(Q, Xc, y, bw, 1), repeat=50)
    problem = prepare(Q, Xc, y, bw, 1)
    t_prepare = best_time(lambda: prepare(Q, Xc, y, bw, 1), repeat=50)
    t_kernel = best_time(lambda: fit_problem(problem), repeat=50)
    t_sm = best_time(lambda: kr.fit(Q), repeat=1)
    diff = np.abs(local_polynomial(Q, Xc, y, bw, 1) - kr.fit(Q)[0]).max()
    print(f"local-linear predict, {n} queries x {n} keys, 3 continuous columns")
    print(
        f"  nbattn {t_ours * 1e3:8.3f} ms   statsmodels {t_sm * 1e3:9.1f} ms   "
        f"ratio {t_sm / t_ours:8.0f}x   max |difference| {diff:.2e}"
    )
    print(
        f"  of which: checks and layout {t_prepare * 1e3:.3f} ms, "
        f"kernel (with its thread choice) {t_kernel * 1e3:.3f} ms"
    )


def bench_pairs(n, rng):
    print(f"throughput, {n} queries x {n} keys, float64, pairs/s (ratio to Nadaraya-Watson)")
    for d in (1, 2, 3, 4):
        X = rng.normal(size=(n, d))
        y = np.sin(X).sum(axis=1)
        Q = rng.normal(size=(n, d))
        h = np.full(d, 0.5)
        nadaraya_watson(Q[:5], X, y, h)
        t_nw = best_time(nadaraya_watson, Q, X, y, h)
        row = [f"  d={d}  NW {n * n / t_nw:9.3g}"]
        for degree, name in ((0, "local-constant"), (1, "local-linear"), (2, "local-quadratic")):
            local_polynomial(Q[:5], X, y, h, degree)
            t = best_time(local_polynomial, Q, X, y, h, degree)
            row.append(f"{name} {n * n / t:9.3g} ({t_nw / t:4.2f}x)")
        print("  ".join(row))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--pairs-n", type=int, default=4000)
    parser.add_argument("--skip-cv", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    bench_predict(args.n, rng)
    bench_pairs(args.pairs_n, rng)
    if not args.skip_cv:
        bench_widths(args.n, rng)


if __name__ == "__main__":
    main()
