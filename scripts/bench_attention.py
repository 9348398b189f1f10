"""Benchmark: blocked (flash) attention in nbattn against torch's CPU SDPA, feature by feature.

One run prints every ratio the flash work is judged by, nbattn and torch
measured in the same run, each time the median of ``--repeat`` interleaved
rounds (so both see the same load; absolute times on a shared machine drift
by up to 2x, ratios much less). ``ratio`` is torch's time / nbattn's time
(> 1: nbattn is faster). float32, B = 1, D = 64, numba and torch on
``--threads`` threads (2 by default), BLAS inside the flash kernels on one.

Cases (N = sequence length, L = S = N):

* ``plain``: H = 8, N = 4096, forward and forward + backward (autograd);
* ``key padding``, ``bool``, ``float bias``: the same with a mask, N = 2048
  and 4096, torch given the same mask; forward, and forward + backward;
* ``gqa``: H = 32 query heads, H_kv = 8, N = 2048, torch ``enable_gqa``;
* ``window``: causal with a 256-key window at N = 16384 against nbattn's
  own full causal attention (the window skips the tiles outside the band)
  and against torch with the equivalent boolean band mask.

``--quick`` divides every N by 8 (a smoke run of the script, not a figure).

``--profile`` prints instead where the time of the plain case goes: one head,
one thread, CPU time (less disturbed by other processes than wall time), the
whole forward and forward + backward against torch, and each stage alone on
the kernels' own tiles and BLAS calls (``nbattn.kernels.blas.gemm``): the
score GEMM Q K^T, the exponential pass, the GEMM acc += P V, and the
backward's five GEMMs by form (two A B^T, two A^T B, one A B; A B and A^T B
run on NumPy's bundled OpenBLAS where it is found, see ``nbattn.kernels.blas``).
``NBATTN_GEMM_ON_NUMPY_BLAS=0`` keeps them on numba's BLAS, for a comparison
(of the profile and of every case).

    python scripts/bench_attention.py
    python scripts/bench_attention.py --quick --repeat 3
    python scripts/bench_attention.py --profile
"""

from __future__ import annotations

import argparse
import os
import time

import numba
import numpy as np
from _timing import interleaved_times

import nbattn

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is optional: nbattn's times alone
    torch = None

D = 64


def _median_times(fns, repeat):
    """Median wall time of each function over ``repeat`` interleaved rounds (after one warm-up)."""
    return [float(np.median(t)) for t in interleaved_times(fns, repeat)]


def _arrays(rng, h, n, h_kv=None):
    h_kv = h if h_kv is None else h_kv
    q = rng.standard_normal((1, h, n, D)).astype(np.float32)
    k = rng.standard_normal((1, h_kv, n, D)).astype(np.float32)
    v = rng.standard_normal((1, h_kv, n, D)).astype(np.float32)
    g = rng.standard_normal((1, h, n, D)).astype(np.float32)
    return q, k, v, g


def _nbattn(q, k, v, g, backward, **kwargs):
    if not backward:
        return lambda: nbattn.flash_attention(q, k, v, **kwargs)

    def run():
        out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **kwargs)
        nbattn.flash_attention_backward(q, k, v, out, lse, g, **kwargs)

    return run


def _torch(q, k, v, g, backward, mask=None, causal=False, enable_gqa=False):
    tq, tk, tv, tg = (torch.from_numpy(x) for x in (q, k, v, g))
    tm = None if mask is None else torch.from_numpy(mask)
    kwargs = dict(attn_mask=tm, is_causal=causal, enable_gqa=enable_gqa)
    if not backward:

        def forward():
            with torch.no_grad():
                F.scaled_dot_product_attention(tq, tk, tv, **kwargs)

        return forward
    leaves = [x.clone().requires_grad_(True) for x in (tq, tk, tv)]

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        F.scaled_dot_product_attention(*leaves, **kwargs).backward(tg)

    return forward_backward


def _masks(rng, n):
    keys = np.ones((1, 1, 1, n), dtype=bool)
    keys[..., int(0.8 * n) :] = False  # the last fifth is padding
    causal_ish = np.tril(np.ones((n, n), dtype=bool), k=n // 8)  # a structured boolean mask
    bias = (0.1 * rng.standard_normal((1, 1, n, n))).astype(np.float32)
    return {"key padding": keys, "bool": causal_ish, "float bias": bias}


def _report(name, ours, theirs, target):
    ratio = theirs / ours if theirs is not None else float("nan")
    verdict = "" if theirs is None else ("ok" if ratio >= target else f"below {target}")
    other = f"{theirs * 1e3:10.1f}" if theirs is not None else f"{'-':>10}"
    print(f"{name:<44} {ours * 1e3:10.1f} {other} {ratio:7.2f}  {verdict}", flush=True)


def _cpu_times(fns, repeat):
    """Least CPU time of each function over ``repeat`` interleaved rounds (after one warm-up)."""
    return [min(t) for t in interleaved_times(fns, repeat, clock=time.process_time)]


def _stage_kernels():
    """The stages of the flash kernels alone, as numba loops over the same tiles and calls."""
    from numba import njit

    from nbattn import config
    from nbattn.kernels.blas import gemm
    from nbattn.kernels.flash import exp2_shift_sum

    @njit(cache=False)
    def score_gemm(q, k, block_q, block_k):
        n_q, n_k = q.shape[0], k.shape[0]
        st = np.empty((block_q, block_k), dtype=q.dtype)
        for i0 in range(0, n_q, block_q):
            for j0 in range(0, n_k, block_k):
                gemm(q[i0 : i0 + block_q], k[j0 : j0 + block_k], st, False, True, 0.0)
        return st[0, 0]

    @njit(fastmath=config.FASTMATH, cache=False)
    def exp_pass(st, n_q, n_k):
        total = 0.0
        for _ in range(0, n_q, st.shape[0]):
            for _ in range(0, n_k, st.shape[1]):
                for r in range(st.shape[0]):
                    total += exp2_shift_sum(st[r], st.dtype.type(0.0))
                    st[r, :] = -1.0
        return total

    @njit(cache=False)
    def pv_gemm(p, v, n_q):
        acc = np.zeros((p.shape[0], v.shape[1]), dtype=v.dtype)
        for _ in range(0, n_q, p.shape[0]):
            for j0 in range(0, v.shape[0], p.shape[1]):
                gemm(p, v[j0 : j0 + p.shape[1]], acc, False, False, 1.0)
        return acc[0, 0]

    @njit(cache=False)
    def backward_gemms(form, q, k, v, g, block_q, block_k):
        """form 0: S = Q K^T and dP = dO V^T as A B on K^T and V^T written once per key
        tile (as the kernel does); 1: the two A^T B (dV += P^T dO, dK += dS^T Q); 2: the
        A B dQ += dS K."""
        n_q, n_k, d = q.shape[0], k.shape[0], q.shape[1]
        st = np.full((block_q, block_k), 1e-3, dtype=q.dtype)
        dp = np.full((block_q, block_k), 1e-3, dtype=q.dtype)
        dk = np.zeros((block_k, d), dtype=q.dtype)
        dv = np.zeros((block_k, d), dtype=q.dtype)
        dq = np.zeros((block_q, d), dtype=q.dtype)
        k_t = np.empty((d, block_k), dtype=q.dtype)
        v_t = np.empty((v.shape[1], block_k), dtype=q.dtype)
        for j0 in range(0, n_k, block_k):
            k_tile, v_tile = k[j0 : j0 + block_k], v[j0 : j0 + block_k]
            if form == 0:
                k_t[:] = k_tile.T
                v_t[:] = v_tile.T
            for i0 in range(0, n_q, block_q):
                q_tile, g_tile = q[i0 : i0 + block_q], g[i0 : i0 + block_q]
                if form == 0:
                    gemm(q_tile, k_t, st, False, False, 0.0)
                    gemm(g_tile, v_t, dp, False, False, 0.0)
                elif form == 1:
                    gemm(st, g_tile, dv, True, False, 1.0)
                    gemm(dp, q_tile, dk, True, False, 1.0)
                else:
                    gemm(dp, k_tile, dq, False, False, 1.0)
        return dk[0, 0] + dv[0, 0] + dq[0, 0] + st[0, 0] + dp[0, 0]

    return score_gemm, exp_pass, pv_gemm, backward_gemms


def profile(n, repeat):
    """Where the time of one head goes (one thread, CPU time): see the module docstring."""
    from nbattn import config
    from nbattn._core.threads import blas_one_thread
    from nbattn.kernels.blas import ON_NUMPY_BLAS

    numba.set_num_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    q, k, v, g = _arrays(rng, 1, n)
    long = n >= config.FLASH_LONG_KEYS
    fq, fk = (
        (config.FLASH_LONG_FWD_BLOCK_Q, config.FLASH_LONG_FWD_BLOCK_K)
        if long
        else (config.FLASH_BLOCK_Q, config.FLASH_BLOCK_K)
    )
    bq, bk = (
        (config.FLASH_LONG_BWD_BLOCK_Q, config.FLASH_LONG_BWD_BLOCK_K)
        if long
        else (config.FLASH_BWD_BLOCK_Q, config.FLASH_BWD_BLOCK_K)
    )
    score_gemm, exp_pass, pv_gemm, backward_gemms = _stage_kernels()
    q2, k2, v2, g2 = (x[0, 0] for x in (q, k, v, g))
    st = np.full((fq, fk), -1.0, dtype=np.float32)
    p = np.full((fq, fk), 1e-3, dtype=np.float32)
    flops = 4.0 * n * n * D  # the forward's two GEMMs; the backward has five
    library = "NumPy's OpenBLAS" if ON_NUMPY_BLAS else "numba's BLAS"
    stages = [
        ("nbattn forward", _nbattn(q, k, v, g, False), flops),
        ("nbattn forward + backward", _nbattn(q, k, v, g, True), 3.5 * flops),
        (f"  score GEMM Q K^T ({fq} x {fk} tiles)", lambda: score_gemm(q2, k2, fq, fk), flops / 2),
        ("  exponential pass", lambda: exp_pass(st, n, n), None),
        (f"  GEMM acc += P V ({library})", lambda: pv_gemm(p, v2, n), flops / 2),
        (
            f"  backward S, dP: A B on K^T, V^T ({bq} x {bk})",
            lambda: backward_gemms(0, q2, k2, v2, g2, bq, bk),
            flops,
        ),
        (
            f"  backward dV, dK: A^T B ({library})",
            lambda: backward_gemms(1, q2, k2, v2, g2, bq, bk),
            flops,
        ),
        (
            f"  backward dQ: A B ({library})",
            lambda: backward_gemms(2, q2, k2, v2, g2, bq, bk),
            flops / 2,
        ),
    ]
    if torch is not None:
        stages.append(("torch forward", _torch(q, k, v, g, False), flops))
        stages.append(("torch forward + backward", _torch(q, k, v, g, True), 3.5 * flops))
    load = os.getloadavg()
    with blas_one_thread():
        measured = _cpu_times([fn for _, fn, _ in stages], repeat)
    times = {}
    print(f"profile: one head, N={n}, D={D}, float32, one thread, least CPU time of {repeat}")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*load))
    print(f"{'stage':<44} {'ms':>8} {'GFLOP/s':>8}")
    for (name, _, work), t in zip(stages, measured):
        times[name] = t
        rate = f"{work / t / 1e9:8.0f}" if work else f"{'':>8}"
        print(f"{name:<44} {t * 1e3:8.1f} {rate}")
    if torch is not None:
        for what in ("forward", "forward + backward"):
            ratio = times[f"torch {what}"] / times[f"nbattn {what}"]
            print(f"ratio torch / nbattn, {what}: {ratio:.2f}")
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="every N divided by 8")
    parser.add_argument(
        "--profile", action="store_true", help="where the plain case's time goes (one head)"
    )
    parser.add_argument(
        "--only", nargs="+", default=["plain", "masks", "gqa", "window"], help="case groups"
    )
    args = parser.parse_args(argv)
    if args.profile:
        profile(4096 // (8 if args.quick else 1), args.repeat)
        return
    numba.set_num_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    div = 8 if args.quick else 1
    rng = np.random.default_rng(0)
    print(f"D={D} float32, {args.threads} threads, median of {args.repeat}; numba", end=" ")
    print(numba.__version__ + (f", torch {torch.__version__}" if torch is not None else ""))
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"{'case':<44} {'nbattn ms':>10} {'torch ms':>10} {'ratio':>7}  (torch / nbattn)")

    def compare(name, arrays, target, backward=False, torch_kwargs=None, **kwargs):
        fns = [_nbattn(*arrays, backward, **kwargs)]
        if torch is not None:
            fns.append(_torch(*arrays, backward, **(torch_kwargs or kwargs)))
        times = _median_times(fns, args.repeat)
        _report(name, times[0], times[1] if torch is not None else None, target)

    if "plain" in args.only:
        n = 4096 // div
        arrays = _arrays(rng, 8, n)
        compare(f"plain H8 N{n} fwd", arrays, 1.1)
        compare(f"plain H8 N{n} fwd+bwd", arrays, 1.1, backward=True)
    if "masks" in args.only:
        for n in (2048 // div, 4096 // div):
            arrays = _arrays(rng, 8, n)
            for name, mask in _masks(rng, n).items():
                compare(f"{name} H8 N{n} fwd", arrays, 1.0, mask=mask)
                compare(f"{name} H8 N{n} fwd+bwd", arrays, 1.0, backward=True, mask=mask)
    if "gqa" in args.only:
        n = 2048 // div
        arrays = _arrays(rng, 32, n, h_kv=8)
        compare(f"gqa H32 Hkv8 N{n} fwd", arrays, 1.0, enable_gqa=True)
        compare(f"gqa H32 Hkv8 N{n} fwd+bwd", arrays, 1.0, backward=True, enable_gqa=True)
    if "window" in args.only:
        n, w = 16384 // div, 256 // div
        arrays = _arrays(rng, 8, n)
        windowed = _nbattn(*arrays, False, causal=True, window=(w, None))
        full = _nbattn(*arrays, False, causal=True)
        t_window, t_full = _median_times([windowed, full], max(1, args.repeat // 2))
        _report(f"window {w} vs full causal, nbattn N{n} fwd", t_window, t_full, 10.0)
        if torch is not None:
            band = np.tril(np.ones((n, n), dtype=bool)) & ~np.tril(np.ones((n, n), bool), k=-w - 1)
            t_torch = _median_times([_torch(*arrays, False, mask=band)], max(1, args.repeat // 2))
            _report(f"window {w} vs torch band mask N{n} fwd", t_window, t_torch[0], 1.0)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
