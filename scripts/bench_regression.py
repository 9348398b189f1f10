"""Nadaraya-Watson throughput: nbattn against its peers, measured in one run.

Prints pairs/s (queries x keys per second) and the ratio of nbattn to each
peer, for 1-D and 5-D inputs in float32 and float64. nbattn runs the full
20,000 x 20,000 problem; slow peers run on a subset and are scaled to pairs/s
(their cost is linear in the number of pairs).

Peers: the NumPy full-matrix formula, scikit-learn KNeighborsRegressor with
n_neighbors = n and Gaussian weights, statsmodels KernelReg.fit (reg_type
'lc'), and a naive numba kernel that calls np.exp.

    python scripts/bench_regression.py [--n 20000] [--million]

--million also measures peak memory of 1,000,000 x 1,000,000 in 1-D float32
(in a subprocess; minutes of compute).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings

import numba
import numpy as np
from numba import njit, prange

import nbattn


def best_time(fn, *args, repeat=3):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


@njit(parallel=True, fastmath=nbattn.config.FASTMATH)
def naive_numba_nw(queries, keys, values, inv_h):
    """The straightforward kernel: two passes per query, np.exp (a libm call)."""
    out = np.empty(queries.shape[0])
    for i in prange(queries.shape[0]):
        best = -np.inf
        for j in range(keys.shape[0]):
            s = 0.0
            for f in range(keys.shape[1]):
                diff = (queries[i, f] - keys[j, f]) * inv_h[f]
                s -= 0.5 * diff * diff
            best = max(best, s)
        total = 0.0
        acc = 0.0
        for j in range(keys.shape[0]):
            s = 0.0
            for f in range(keys.shape[1]):
                diff = (queries[i, f] - keys[j, f]) * inv_h[f]
                s -= 0.5 * diff * diff
            w = np.exp(s - best)
            total += w
            acc += w * values[j]
        out[i] = acc / total
    return out


def numpy_full_matrix(queries, keys, values, h):
    diff = (queries[:, None, :] - keys[None, :, :]) / h
    scores = -0.5 * np.sum(diff * diff, axis=-1)
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ values


def sklearn_knn(queries, keys, values, h):
    from sklearn.neighbors import KNeighborsRegressor

    model = KNeighborsRegressor(
        n_neighbors=len(keys), weights=lambda dist: np.exp(-0.5 * dist**2), algorithm="brute"
    )
    return model.fit(keys / h, values).predict(queries / h)


def statsmodels_kernelreg(queries, keys, values, h):
    from statsmodels.nonparametric.kernel_regression import KernelReg

    model = KernelReg(values, keys, var_type="c" * keys.shape[1], reg_type="lc", bw=h)
    return model.fit(queries)[0]


def bench(n: int) -> None:
    rng = np.random.default_rng(0)
    print(f"numba {numba.__version__}, threads {numba.get_num_threads()}; {n} queries x {n} keys")
    header = f"{'case':<14}{'peer':<26}{'peer pairs/s':>14}{'nbattn pairs/s':>16}{'ratio':>10}"
    print(header)
    print("-" * len(header))
    for d in (1, 5):
        keys = rng.uniform(0, 6, size=(n, d))
        queries = rng.uniform(0, 6, size=(n, d))
        values = np.sin(keys).sum(axis=1) + rng.normal(0, 0.3, n)
        h = nbattn.regression.bandwidth_rule(keys, "scott")
        for dtype in ("float32", "float64"):
            q, k, v = (a.astype(dtype) for a in (queries, keys, values))
            nbattn.nadaraya_watson(q[:4], k[:50], v[:50], h)  # compile
            t = best_time(nbattn.nadaraya_watson, q, k, v, h)
            ours = n * n / t
            case = f"{d}-D {dtype}"
            print(f"{case:<14}{'nbattn':<26}{'':>14}{ours:>16.3g}{'':>10}")
            peers = {
                "numpy full matrix": (numpy_full_matrix, min(n, 1000), n),
                "naive numba (np.exp)": (None, min(n, 4000), n),
            }
            if dtype == "float64":
                peers["sklearn KNN gaussian"] = (sklearn_knn, 500, min(n, 5000))
                peers["statsmodels KernelReg"] = (statsmodels_kernelreg, 1000, min(n, 2000))
            for name, (fn, nq, nk) in peers.items():
                qs, ks, vs = q[:nq], k[:nk], v[:nk]
                if fn is None:
                    inv_h = (1.0 / h).astype(dtype)
                    naive_numba_nw(qs[:2], ks[:5], vs[:5], inv_h)
                    t = best_time(naive_numba_nw, qs, ks, vs, inv_h)
                else:
                    t = best_time(fn, qs, ks, vs, h, repeat=1)
                peer = nq * nk / t
                print(f"{'':<14}{name:<26}{peer:>14.3g}{'':>16}{ours / peer:>9.0f}x")
        sys.stdout.flush()


_MILLION = """
import json, resource, time, numpy as np, nbattn
n = 1_000_000
rng = np.random.default_rng(0)
keys = rng.uniform(0, 6, n).astype(np.float32)
values = (np.sin(keys) + rng.normal(0, 0.3, n)).astype(np.float32)
queries = rng.uniform(0, 6, n).astype(np.float32)
nbattn.nadaraya_watson(queries[:10], keys[:10], values[:10], 0.05)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out = nbattn.nadaraya_watson(queries, keys, values, 0.05)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "pairs_per_s": n * n / seconds,
                  "input_mb": 3 * n * 4 / 1e6, "rss_before_mb": base / 1024,
                  "peak_growth_mb": (peak - base) / 1024}))
"""


def million() -> None:
    print("\n1,000,000 queries x 1,000,000 keys, 1-D float32 (subprocess):")
    done = subprocess.run([sys.executable, "-c", _MILLION], capture_output=True, text=True)
    if done.returncode:
        print(done.stderr)
        return
    r = json.loads(done.stdout)
    print(
        f"  {r['seconds']:.1f} s, {r['pairs_per_s']:.3g} pairs/s; inputs {r['input_mb']:.0f} MB; "
        f"peak RSS growth during the call {r['peak_growth_mb']:.1f} MB"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--million", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)  # statsmodels on pandas 3
    bench(args.n)
    if args.million:
        million()
