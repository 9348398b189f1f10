"""The conditional CDF's and quantiles' passes: time per pair, and the compile time of
their kernels.

    python scripts/bench_quantiles.py [--rows 5000] [--compile]

Prints, on a 1-D heteroscedastic table of ``--rows`` rows queried at as many rows:
``ConditionalKernelDensity.cdf`` (one pass of the log-space kernel sums for the
numerator, one for the denominator) in ns per pair and pass, and ``predict_quantile`` at
three levels (0.1, 0.5, 0.9) in seconds and ns per pair and mixture evaluation (the
root-finder's passes over each row's weights), the best of ``--repeat`` runs. With
``--compile``, first the cold compile time of the two kernels (run it with a fresh
``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import nbattn


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="time the first (cold) calls")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.rows
    x = rng.uniform(-2.0, 2.0, n)
    y = np.sin(2.0 * x) + (0.1 + 0.4 * np.abs(x)) * rng.normal(size=n)
    xq = rng.uniform(-2.0, 2.0, n)
    yq = np.sin(2.0 * xq) + (0.1 + 0.4 * np.abs(xq)) * rng.normal(size=n)
    model = nbattn.ConditionalKernelDensity(bandwidth=[0.08], y_bandwidth=0.08)
    model.fit(x[:, None], y)
    levels = [0.1, 0.5, 0.9]
    if args.compile:
        for name, call in (
            ("cdf", lambda: model.cdf(xq[:3, None], yq[:3])),
            ("quantiles", lambda: model.predict_quantile(xq[:3, None], levels)),
        ):
            start = time.perf_counter()
            call()
            print(f"cold first call of {name}: {time.perf_counter() - start:.1f} s", flush=True)
    pairs = float(n) * n
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        model.cdf(xq[:, None], yq)
        times.append(time.perf_counter() - start)
    t_cdf = min(times)
    print(f"cdf, {n} x {n}: {t_cdf:.3f} s, {t_cdf / (2 * pairs) * 1e9:.2f} ns per pair and pass")
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        model.predict_quantile(xq[:, None], levels)
        times.append(time.perf_counter() - start)
    t_q = min(times)
    print(f"quantiles at {levels}, {n} x {n}: {t_q:.3f} s ({t_q / pairs * 1e9:.1f} ns per pair)")


if __name__ == "__main__":
    main()
