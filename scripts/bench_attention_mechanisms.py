"""Attention throughput: nbattn against torch and NumPy, measured in one run.

For each configuration prints GFLOP/s (4 B H L S D flops for QK^T and PV) of

* ``nbattn.attention`` soft scaled-dot path (streaming kernel, no L x S matrix),
* ``nbattn.attention(..., return_weights=True)`` (score kernel + softmax kernel + matmul),
* ``torch.nn.functional.scaled_dot_product_attention`` (CPU, same thread count),
* the NumPy textbook formula (matmul, exp, normalise, matmul),
* ``nbattn.scores.additive`` vs the NumPy formula that builds the (L, S, H) tensor,

and the ratio of nbattn to each peer. Absolute figures drift on a shared machine;
the ratios are the result.

    python scripts/bench_attention_mechanisms.py [--quick] [--threads N] [--cpu-time]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

import nbattn

CLOCK = time.perf_counter


def best_time(fn, repeat=3):
    best = np.inf
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
    return best


def numpy_attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return (s / s.sum(axis=-1, keepdims=True)) @ v


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for numba and torch (default numba's); on a busy shared machine "
        "--threads 1 gives the fairer per-core comparison: oversubscribed OpenMP "
        "barriers slow parallel loops by up to 10x",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process CPU clock instead of the wall clock: with --threads 1 "
        "this measures per-core efficiency and ignores time the process waits for a core",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    if args.threads:
        numba.set_num_threads(args.threads)
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)  # OpenBLAS under NumPy's matmul
    try:
        import torch

        torch.set_num_threads(numba.get_num_threads())
    except ImportError:
        torch = None
    print(
        f"threads: numba {numba.get_num_threads()}, torch {torch and torch.get_num_threads()}; "
        f"clock: {'process CPU time' if args.cpu_time else 'wall'}"
    )
    sizes = [(1, 8, 512, 64)] if args.quick else [(1, 8, 512, 64), (1, 8, 2048, 64)]
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for B, H, N, D in sizes:
            q, k, v = (rng.normal(size=(B, H, N, D)).astype(dtype) for _ in range(3))
            flops = 4.0 * B * H * N * N * D
            for causal in (False, True):
                f = flops / 2 if causal else flops
                nbattn.attention(q, k, v, causal=causal)  # compile
                t_nb = best_time(lambda: nbattn.attention(q, k, v, causal=causal))  # noqa: B023
                t_w = best_time(
                    lambda: nbattn.attention(q, k, v, causal=causal, return_weights=True)  # noqa: B023
                )
                row = (
                    f"{np.dtype(dtype).name} B={B} H={H} L=S={N} D={D} causal={causal!s:5}: "
                    f"nbattn {f / t_nb / 1e9:6.1f} GFLOP/s, with weights {f / t_w / 1e9:6.1f}"
                )
                if torch is not None:
                    T = [torch.from_numpy(a) for a in (q, k, v)]
                    sdpa = torch.nn.functional.scaled_dot_product_attention
                    sdpa(*T, is_causal=causal)
                    t_t = best_time(lambda: sdpa(*T, is_causal=causal))  # noqa: B023
                    row += f", torch {f / t_t / 1e9:6.1f} (nbattn/torch {t_t / t_nb:.2f}x)"
                if not causal:
                    t_np = best_time(lambda: numpy_attention(q, k, v), repeat=2)  # noqa: B023
                    row += f", numpy {f / t_np / 1e9:6.1f} (nbattn/numpy {t_np / t_nb:.2f}x)"
                print(row, flush=True)
    # additive score: pairs/s against the NumPy formula that holds (L, S, H)
    L = S = 256 if args.quick else 512
    E, Hd = 64, 64
    q = rng.normal(size=(L, E))
    k = rng.normal(size=(S, E))
    W, U, a = rng.normal(size=(Hd, E)), rng.normal(size=(Hd, E)), rng.normal(size=Hd)
    nbattn.scores.additive(q, k, W, U, a)
    t_nb = best_time(lambda: nbattn.scores.additive(q, k, W, U, a))
    t_np = best_time(lambda: np.tanh((q @ U.T)[:, None, :] + (k @ W.T)[None, :, :]) @ a, repeat=2)
    print(
        f"additive score float64 L=S={L} E={E} hidden={Hd}: nbattn {L * S * Hd / t_nb / 1e9:.2f} "
        f"G tanh-terms/s, numpy {L * S * Hd / t_np / 1e9:.2f} (nbattn/numpy {t_np / t_nb:.2f}x)"
    )


if __name__ == "__main__":
    main()
