"""Decoding and packed variable-length attention against torch, measured in one run.

Usage: python scripts/bench_decode.py [--quick] [--threads 2] [--repeats 7]

1. decode: one new query per sequence (L = 1) over a cache of S keys,
   B = 1, H = 32, D = 128, float32: ``nbattn.flash_decode`` (split-KV)
   against ``torch.nn.functional.scaled_dot_product_attention`` on the same
   cache (torch tensors viewing the same memory). Also grouped-query (H_kv = 8).
2. varlen: sequences of mixed lengths packed along the sequence axis,
   ``nbattn.flash_attention_varlen`` against a Python loop of torch SDPA over
   the sequences (causal).

Prints the median time of the repeats and the ratio torch / nbattn (> 1:
nbattn is faster), then the vectorisation check of the decode kernel (packed
zmm/ymm instructions in its assembly).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import numpy as np


def median_time(fn, repeats):
    fn()  # warm (compiles)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def report(name, t_nbattn, t_torch):
    print(
        f"{name:<44} nbattn {t_nbattn * 1e3:9.2f} ms   torch {t_torch * 1e3:9.2f} ms   "
        f"ratio {t_torch / t_nbattn:5.2f}x"
    )


def bench_decode(torch, S, H, H_kv, D, repeats):
    import nbattn

    rng = np.random.default_rng(0)
    B = 1
    k_cache = rng.standard_normal((B, H_kv, S, D), dtype=np.float32)
    v_cache = rng.standard_normal((B, H_kv, S, D), dtype=np.float32)
    q = rng.standard_normal((B, H, 1, D), dtype=np.float32)
    lengths = np.array([S], dtype=np.int64)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k_cache, v_cache))
    gqa = H != H_kv

    def run_nbattn():
        return nbattn.flash_decode(q, k_cache, v_cache, lengths, enable_gqa=gqa)

    def run_torch():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=gqa)

    diff = np.abs(run_nbattn() - run_torch().numpy()).max()
    report(
        f"decode L=1 S={S} H={H} H_kv={H_kv} D={D}",
        median_time(run_nbattn, repeats),
        median_time(run_torch, repeats),
    )
    print(f"{'':<44} max |nbattn - torch| = {diff:.2e}")


def bench_varlen(torch, lengths, H, D, repeats):
    import nbattn

    rng = np.random.default_rng(1)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(cu[-1])
    q = rng.standard_normal((H, total, D), dtype=np.float32)
    k = rng.standard_normal((H, total, D), dtype=np.float32)
    v = rng.standard_normal((H, total, D), dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

    def run_nbattn():
        return nbattn.flash_attention_varlen(q, k, v, cu, cu, causal=True)

    def run_torch():
        out = torch.empty_like(tq)
        with torch.no_grad():
            for a, b in zip(cu[:-1], cu[1:]):
                out[:, a:b] = torch.nn.functional.scaled_dot_product_attention(
                    tq[:, a:b], tk[:, a:b], tv[:, a:b], is_causal=True
                )
        return out

    diff = np.abs(run_nbattn() - run_torch().numpy()).max()
    report(
        f"varlen {len(lengths)} seqs total={total} H={H} D={D}",
        median_time(run_nbattn, repeats),
        median_time(run_torch, repeats),
    )
    print(f"{'':<44} max |nbattn - torch| = {diff:.2e}")


def vectorisation():
    """Count packed multiply/add instructions in a fresh (uncached) compile of the kernel."""
    from numba import njit

    from nbattn import config
    from nbattn.kernels import decode

    fresh = njit(fastmath=config.FASTMATH, nogil=True)(decode.decode_items.py_func)
    for signature in decode.decode_items.signatures:  # those the runs above used
        fresh.compile(signature)
    asm = "\n".join(fresh.inspect_asm().values())
    packed = re.findall(r"\bv(?:fmadd|fnmadd|mul|add)[0-9a-z]*p([sd])\s+%([yz])mm", asm)
    zmm = sum(1 for _, reg in packed if reg == "z")
    print(
        f"decode kernel: {len(packed)} packed ymm/zmm multiply/add instructions "
        f"({zmm} on zmm) in its assembly"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import numba
    import torch

    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    S = 2048 if args.quick else 32768
    bench_decode(torch, S, 32, 32, 128, args.repeats)
    bench_decode(torch, S, 32, 8, 128, args.repeats)
    rng = np.random.default_rng(2)
    n_seqs = 16 if args.quick else 64
    lengths = rng.integers(1, 128 if args.quick else 1024, size=n_seqs)
    bench_varlen(torch, lengths, 8, 64, args.repeats)
    many = rng.integers(1, 64, size=64 if args.quick else 2000)
    bench_varlen(torch, many, 8, 64, args.repeats)
    vectorisation()


if __name__ == "__main__":
    main()
