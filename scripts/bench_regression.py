"""Nadaraya-Watson throughput: nbattn against its peers, measured in one run.

Prints pairs/s (queries x keys per second) and the ratio of nbattn to each
peer, for 1-D and 5-D inputs in float32 and float64. nbattn runs the full
20,000 x 20,000 problem; slow peers run on a subset and are scaled to pairs/s
(their cost is linear in the number of pairs).

Peers: the NumPy full-matrix formula, scikit-learn KNeighborsRegressor with
n_neighbors = n and Gaussian weights, statsmodels KernelReg.fit (reg_type
'lc'), and a naive numba kernel that calls np.exp.

First it prints the speed targets, as medians of repeats, each ratio from
timings taken alternately in one run (numba and torch on 2 threads):

* 1-D float32 n x n against the limit kernel: one plain fused loop per query
  (score, inlined polynomial exp, sum, weighted sum; no max pass, no blocks,
  no far-row checks), the fastest any exact-enough 1-D kernel can be here;
* float32 8k x 8k at d = 64 and 256 against torch: cdist -> softmax ->
  matmul over blocks of query rows (the O(n) memory way to do it in torch).

    python scripts/bench_regression.py [--n 20000] [--million] [--targets-only]
    python scripts/bench_regression.py --crossover   # direct vs GEMM tiles over d
    python scripts/bench_regression.py --profile [--threads 1]  # where the wide time goes

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
from _timing import best_time
from numba import njit, prange

import nbattn
import nbattn.smoothing.regression
from nbattn.kernels.fastmath import fast_exp


def median_ratio(fn_ours, fn_peer, repeat=5):
    """(median time ours, median time peer, median of per-round peer/ours ratios).

    The two run alternately, so load on a shared machine hits both alike.
    """
    ours, peer, ratios = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn_ours()
        t1 = time.perf_counter()
        fn_peer()
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        peer.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
    return float(np.median(ours)), float(np.median(peer)), float(np.median(ratios))


@njit(parallel=True, fastmath=nbattn.config.FASTMATH)
def limit_nw_1d(queries, keys, values):
    """The limit kernel: per query one fused loop over the keys, inlined exp, no max pass.

    Inputs pre-scaled by 1/(h sqrt 2); sums in the input dtype. Not safe (a
    far query gives 0/0): it measures the machine, not a method.
    """
    out = np.empty_like(queries)
    for i in prange(queries.shape[0]):
        q = queries[i]
        total = queries.dtype.type(0.0)
        acc = queries.dtype.type(0.0)
        for j in range(keys.shape[0]):
            diff = keys[j] - q
            w = fast_exp(-(diff * diff))
            total += w
            acc += w * values[j]
        out[i] = acc / total
    return out


def torch_nw_blocks(torch, queries, keys, values, h, block=1024):
    """Nadaraya-Watson in torch: cdist -> softmax -> matmul over blocks of query rows."""
    inv = 1.0 / (h * np.sqrt(2.0))
    k = keys * torch.as_tensor(inv, dtype=keys.dtype)
    q = queries * torch.as_tensor(inv, dtype=keys.dtype)
    out = torch.empty((q.shape[0], values.shape[1]), dtype=values.dtype)
    for i0 in range(0, q.shape[0], block):
        dist = torch.cdist(q[i0 : i0 + block], k)
        out[i0 : i0 + block] = torch.softmax(-(dist * dist), dim=1) @ values
    return out


def targets(n: int, n_wide: int = 8192, repeat: int = 5) -> None:
    """Print the speed targets (module docstring), medians over ``repeat`` rounds."""
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    rng = np.random.default_rng(0)
    print(f"targets: numba threads {numba.get_num_threads()}, median of {repeat} rounds")
    keys = rng.uniform(0, 6, n).astype(np.float32)
    queries = rng.uniform(0, 6, n).astype(np.float32)
    values = np.sin(keys).astype(np.float32)
    h = float(nbattn.smoothing.regression.bandwidth_rule(keys)[0])
    scale = np.float32(1.0 / (h * np.sqrt(2.0)))
    ks, qs = keys * scale, queries * scale
    limit_nw_1d(qs[:4], ks[:50], values[:50])
    nbattn.nadaraya_watson(queries[:4], keys[:50], values[:50], h)
    t_ours, t_peer, ratio = median_ratio(
        lambda: nbattn.nadaraya_watson(queries, keys, values, h),
        lambda: limit_nw_1d(qs, ks, values),
        repeat,
    )
    print(
        f"  1-D float32 {n} x {n}: nbattn {n * n / t_ours:.3g} pairs/s, limit kernel "
        f"{n * n / t_peer:.3g} pairs/s, nbattn / limit = {ratio:.2f}x (target >= 0.9x)"
    )
    try:
        import torch
    except ImportError:
        print("  torch not installed: the wide-input targets are skipped")
        return
    torch.set_num_threads(2)
    for d, target in ((64, 4), (256, 3)):
        keys = rng.normal(size=(n_wide, d)).astype(np.float32)
        queries = rng.normal(size=(n_wide, d)).astype(np.float32)
        values = rng.normal(size=(n_wide, 1)).astype(np.float32)
        h = nbattn.smoothing.regression.bandwidth_rule(keys)
        tk, tq, tv = (torch.from_numpy(a) for a in (keys, queries, values))
        nbattn.nadaraya_watson(queries[:4], keys[:50], values[:50], h)
        with torch.inference_mode():
            t_ours, t_peer, ratio = median_ratio(
                lambda q=queries, k=keys, v=values, h=h: nbattn.nadaraya_watson(q, k, v, h),
                lambda q=tq, k=tk, v=tv, h=h: torch_nw_blocks(torch, q, k, v, h),
                repeat,
            )
        pairs = n_wide * n_wide
        print(
            f"  float32 {n_wide} x {n_wide}, d = {d}: nbattn {pairs / t_ours:.3g} pairs/s, "
            f"torch {pairs / t_peer:.3g} pairs/s, nbattn / torch = {ratio:.2f}x "
            f"(target >= {target}x)"
        )
    sys.stdout.flush()


def crossover(n: int = 4096, repeat: int = 3) -> None:
    """Direct differences against GEMM tiles over d: the measurement behind
    ``config.GEMM_MIN_FEATURES_FLOAT32`` and ``_FLOAT64``."""
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    cfg = nbattn.config
    saved = cfg.GEMM_MIN_FEATURES_FLOAT32, cfg.GEMM_MIN_FEATURES_FLOAT64
    rng = np.random.default_rng(0)
    print(f"crossover: {n} x {n}, time direct / time GEMM (> 1: GEMM faster)")
    try:
        for dtype in ("float32", "float64"):
            for d in (2, 4, 8, 12, 16, 24, 32, 48, 64):
                keys = rng.normal(size=(n, d)).astype(dtype)
                queries = rng.normal(size=(n, d)).astype(dtype)
                values = rng.normal(size=n).astype(dtype)
                h = nbattn.smoothing.regression.bandwidth_rule(keys)

                def direct(q=queries, k=keys, v=values, h=h):
                    cfg.GEMM_MIN_FEATURES_FLOAT32 = cfg.GEMM_MIN_FEATURES_FLOAT64 = 10**9
                    nbattn.nadaraya_watson(q, k, v, h)

                def gemm(q=queries, k=keys, v=values, h=h):
                    cfg.GEMM_MIN_FEATURES_FLOAT32 = cfg.GEMM_MIN_FEATURES_FLOAT64 = 1
                    nbattn.nadaraya_watson(q, k, v, h)

                gemm()
                direct()
                t_gemm, t_direct, ratio = median_ratio(gemm, direct, repeat)
                times = f"direct {t_direct:.4f} s, GEMM {t_gemm:.4f} s"
                print(f"  {dtype} d = {d:3d}: {times}, {ratio:.2f}x")
                sys.stdout.flush()
    finally:
        cfg.GEMM_MIN_FEATURES_FLOAT32, cfg.GEMM_MIN_FEATURES_FLOAT64 = saved


@njit(parallel=True)
def score_gemm_tiles(queries, keys, block_q, block_k):
    """Only the score GEMMs of ``kernels.pooling_gemm`` (same tiles, same prange, one
    BLAS thread each): the floor under the pooling kernel."""
    n_queries, n_keys = queries.shape[0], keys.shape[0]
    n_tiles = (n_queries + block_q - 1) // block_q
    checksum = np.zeros(n_tiles)
    for tile in prange(n_tiles):
        i0 = tile * block_q
        mb = min(block_q, n_queries - i0)
        s_flat = np.empty(mb * block_k, dtype=queries.dtype)
        for j0 in range(0, n_keys, block_k):
            nb = min(block_k, n_keys - j0)
            st = s_flat[: mb * nb].reshape((mb, nb))
            np.dot(queries[i0 : i0 + mb], keys[j0 : j0 + nb].T, st)
            checksum[tile] += st[0, 0]
    return checksum


def profile(threads: int = 2, n: int = 8192, repeat: int = 5) -> None:
    """Where the time of the wide float32 targets goes: the whole call, the pooling
    kernel alone, its score GEMMs alone, and one big BLAS / torch GEMM of the same
    n x n x d (the roofline this machine reaches); best of ``repeat``."""
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    rng = np.random.default_rng(0)
    print(f"profile: float32 {n} x {n}, {numba.get_num_threads()} numba threads, best of {repeat}")
    for d in (64, 256):
        keys = rng.normal(size=(n, d)).astype(np.float32)
        queries = rng.normal(size=(n, d)).astype(np.float32)
        values = rng.normal(size=(n, 1)).astype(np.float32)
        rows = _profile_rows(queries, keys, values, repeat)
        flops = 2.0 * n * n * d
        whole = rows[0][1]
        print(f"  d = {d}:")
        for name, seconds in rows:
            print(
                f"    {name:<46}{seconds * 1e3:9.1f} ms{flops / seconds / 1e9:8.1f} GFLOP/s"
                f"{seconds / whole:7.2f}x the call"
            )
        sys.stdout.flush()


def _profile_rows(queries, keys, values, repeat):
    """[(what, best seconds)] for :func:`profile`, the whole call first."""
    from threadpoolctl import threadpool_limits

    from nbattn._core.threads import blas_one_thread
    from nbattn.kernels import pooling_gemm

    h = nbattn.smoothing.regression.bandwidth_rule(keys)
    q, k_t, v_t, k = nbattn.smoothing.regression._layout(
        queries, keys, values, h, np.dtype(np.float32), keys_row_major=True
    )
    block_q, block_k = pooling_gemm.tile_shape(keys.shape[1])

    def call():
        nbattn.nadaraya_watson(queries, keys, values, h)

    def kernel():
        with blas_one_thread():
            pooling_gemm.gaussian_pool_gemm(q, k, k_t, v_t, False, 0)

    def gemms():
        with blas_one_thread():
            score_gemm_tiles(q, k, block_q, block_k)

    rows = []
    for name, fn in (
        ("nadaraya_watson (whole call)", call),
        ("pooling_gemm kernel", kernel),
        (f"its score GEMMs alone ({block_q} x {block_k} tiles)", gemms),
    ):
        fn()
        rows.append((name, best_time(fn, repeat=repeat)))
    scores = np.empty((len(q), len(k)), dtype=np.float32)
    with threadpool_limits(numba.get_num_threads(), user_api="blas"):
        np.dot(q, k.T, scores)
        rows.append(("one numpy sgemm Q K^T", best_time(np.dot, q, k.T, scores, repeat=repeat)))
    try:
        import torch
    except ImportError:
        return rows
    torch.set_num_threads(numba.get_num_threads())
    tq, tk, tv = (torch.from_numpy(a) for a in (queries, keys, values))
    with torch.inference_mode():
        rows.append(("torch mm Q K^T", best_time(lambda: tq @ tk.T, repeat=repeat)))
        peer = best_time(lambda: torch_nw_blocks(torch, tq, tk, tv, h), repeat=repeat)
        rows.append(("torch cdist -> softmax -> matmul", peer))
    return rows


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
        h = nbattn.smoothing.regression.bandwidth_rule(keys, "scott")
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
    parser.add_argument("--targets-only", action="store_true")
    parser.add_argument("--crossover", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=2, help="numba/BLAS/torch threads (--profile)"
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)  # statsmodels on pandas 3
    if args.crossover:
        crossover()
        sys.exit(0)
    if args.profile:
        profile(args.threads)
        sys.exit(0)
    targets(args.n)
    if args.targets_only:
        sys.exit(0)
    bench(args.n)
    if args.million:
        million()
