"""Benchmark: blocked (flash) attention in nbattn against torch's CPU SDPA.

Prints, from one run, GFLOP/s of ``nbattn.flash_attention`` (forward) and of
``flash_attention`` + ``flash_attention_backward`` (forward+backward), and
the same for ``torch.nn.functional.scaled_dot_product_attention`` (forward,
and forward + autograd backward) when torch is installed, with the ratio
nbattn / torch, for B = 1, H = 8, D = 64, float32, causal and not, with 1 and
2 threads (numba.set_num_threads and torch.set_num_threads together).

FLOP counts (the FlashAttention / torch convention): forward 4 N^2 D per
head (two GEMMs), half of it when causal; backward 2.5x the forward (five
GEMMs), so forward+backward is 3.5x the forward. Each figure is the best of
``--repeat`` runs, nbattn and torch interleaved so that both see the same
load; absolute times on a shared machine drift, ratios less so.

    python scripts/bench_attention.py                        # N = 1024 ... 8192
    python scripts/bench_attention.py --sizes 1024 2048 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import time

import numba
import numpy as np

import nbattn

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is optional: nbattn's figures alone
    torch = None

B, H, D = 1, 8, 64


def _flops(n, causal, backward):
    fwd = 4.0 * B * H * n * n * D / (2.0 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)


def _nbattn_runs(q, k, v, g, causal):
    def forward():
        nbattn.flash_attention(q, k, v, causal=causal)

    def forward_backward():
        out, lse = nbattn.flash_attention(q, k, v, causal=causal, return_lse=True)
        nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal)

    return forward, forward_backward


def _torch_runs(q, k, v, g, causal):
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    tg = torch.from_numpy(g)
    leaves = [x.clone().requires_grad_(True) for x in (tq, tk, tv)]

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        out.backward(tg)

    return forward, forward_backward


def _best(fns, repeat):
    """Best wall time of each function over ``repeat`` interleaved rounds."""
    best = [np.inf] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"])
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    print(f"B={B} H={H} D={D} float32; numba {numba.__version__}", end="")
    print(f", torch {torch.__version__}" if torch is not None else ", torch not installed")
    print("FLOPs: fwd 4 N^2 D per head (half if causal), fwd+bwd 3.5x fwd")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    header = f"{'threads':>7} {'N':>6} {'causal':>6} {'mode':>8} {'nbattn GF/s':>12}"
    if torch is not None:
        header += f" {'torch GF/s':>11} {'ratio':>6}"
    print(header)
    for threads in args.threads:
        numba.set_num_threads(threads)
        if torch is not None:
            torch.set_num_threads(threads)
        # warm up: compile the kernels, start the thread pools
        small = [rng.standard_normal((B, H, 64, D)).astype(np.float32) for _ in range(4)]
        for causal in (False, True):
            for fn in _nbattn_runs(*small, causal) + (
                _torch_runs(*small, causal) if torch is not None else ()
            ):
                fn()
        for n in args.sizes:
            q, k, v, g = (rng.standard_normal((B, H, n, D)).astype(np.float32) for _ in range(4))
            for causal in (False, True):
                ours = _nbattn_runs(q, k, v, g, causal)
                theirs = _torch_runs(q, k, v, g, causal) if torch is not None else None
                for index, mode in enumerate(["fwd", "fwd+bwd"]):
                    if mode not in args.modes:
                        continue
                    fns = [ours[index]] + ([theirs[index]] if theirs is not None else [])
                    times = _best(fns, args.repeat)
                    flops = _flops(n, causal, mode == "fwd+bwd")
                    line = f"{threads:>7} {n:>6} {causal!s:>6} {mode:>8}"
                    line += f" {flops / times[0] / 1e9:>12.1f}"
                    if theirs is not None:
                        line += f" {flops / times[1] / 1e9:>11.1f} {times[1] / times[0]:>6.2f}"
                    print(line, flush=True)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
