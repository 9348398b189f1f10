"""GPU checks and figures for nbattn's CUDA kernels, in one run (needs a CUDA GPU).

1. Checks, on small inputs, that every CUDA twin gives what the CPU path gives:
   Nadaraya-Watson (1-D and 8-D, float32 and float64, exclude_self), the LOO
   loss and gradient (diagonal widths and full metric), flash attention
   forward and backward (causal and not, L != S); torch CUDA tensors in ->
   torch CUDA tensors out when torch with CUDA is installed. A failed check
   is printed as FAIL and makes the exit status 1 (the timings still run).
2. Nadaraya-Watson pairs/s (queries x keys per second), 1-D and 8-D,
   float32, one output, with the inputs already on the GPU. The problem size
   grows from 2^16 x 2^16 until one call takes ~0.5 s (at most 2^20 x 2^20).
3. Flash attention TFLOP/s, B = 1, H = 8, D = 64, float32, N = 1024 ...
   16,384, forward and backward, causal and not, beside
   ``torch.nn.functional.scaled_dot_product_attention`` (forward; backward by
   autograd) on the same GPU when torch with CUDA is there, with the ratio
   nbattn / torch. FLOP convention of FlashAttention and torch: forward
   4 N^2 D per head (half when causal), backward 2.5x the forward. (nbattn's
   backward recomputes scores in three kernels and does 8/5 of that work; the
   figure still uses the convention, so the ratio to torch is fair.)

Every time is the best of 3 after a warm-up call, bracketed by
``cuda.synchronize()``. The whole run takes well under 5 minutes on an H200
(a time guard skips the largest sizes if it would not).

    python scripts/bench_gpu.py                  # on a machine with a CUDA GPU
    python scripts/bench_gpu.py --simulate-tiny  # the checks and one tiny timing of
                                                 # each kind, under the CUDA simulator

Exit status: 0 all checks passed; 1 a check failed; 2 no usable GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

#: Seconds after which the timing sections stop growing the problem sizes.
TIME_BUDGET_S = 200.0


def _parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--simulate-tiny",
        action="store_true",
        help="run under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) on tiny shapes",
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1024, 4096, 16384],
        help="flash attention sequence lengths N (default 1024 4096 16384)",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip torch SDPA")
    return parser.parse_args(argv)


class Checks:
    """Collects PASS/FAIL lines: max |got - ref| / max |ref| against a tolerance."""

    def __init__(self):
        self.failed = 0

    def compare(self, name, got, ref, tol):
        got = np.asarray(got, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        finite = np.isfinite(ref)
        same_inf = got.shape == ref.shape and np.array_equal(np.isfinite(got), finite)
        scale = max(np.abs(ref[finite]).max(initial=0.0), 1e-30)
        err = np.abs(got[finite] - ref[finite]).max(initial=0.0) / scale if same_inf else np.inf
        ok = err <= tol
        self.failed += not ok
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<46s} rel err {err:.1e} (tol {tol:.0e})")


def run_checks(tiny):
    """CUDA twin vs CPU path on small inputs; returns the number of failed checks."""
    import nbattn
    from nbattn import learning

    print("checks: CUDA against the CPU path")
    checks = Checks()
    rng = np.random.default_rng(0)
    n = 13 if tiny else 300
    tol = {np.float64: 1e-10, np.float32: 2e-5}
    for d in (1, 8):
        for dtype in (np.float32, np.float64):
            x = rng.normal(size=(n, d)).astype(dtype)
            q = rng.normal(size=(n // 2 + 1, d)).astype(dtype)
            y = rng.normal(size=(n, 2)).astype(dtype)
            got = nbattn.nadaraya_watson(q, x, y, 0.7, device="cuda")
            checks.compare(
                f"NW d={d} {np.dtype(dtype).name}",
                got,
                nbattn.nadaraya_watson(q, x, y, 0.7),
                tol[dtype],
            )
            got = nbattn.nadaraya_watson(x, x, y, 0.7, exclude_self=True, device="cuda")
            ref = nbattn.nadaraya_watson(x, x, y, 0.7, exclude_self=True)
            checks.compare(f"NW exclude_self d={d} {np.dtype(dtype).name}", got, ref, tol[dtype])
    X = rng.normal(size=(n, 3))
    yv = np.sin(X[:, 0]) + X[:, 1] * X[:, 2]
    h = np.array([0.6, 0.9, 1.2])
    L = rng.normal(size=(2, 3))
    for dtype in ("float64", "float32"):
        t = tol[np.dtype(dtype).type]
        loss_g, grad_g = learning.loo_loss_and_grad(X, yv, h, dtype=dtype, device="cuda")
        loss_c, grad_c = learning.loo_loss_and_grad(X, yv, h, dtype=dtype)
        checks.compare(f"LOO loss {dtype}", loss_g, loss_c, t)
        checks.compare(f"LOO grad log-widths {dtype}", grad_g, grad_c, t)
        _, grad_g = learning.loo_loss_and_grad(X, yv, components=L, dtype=dtype, device="cuda")
        _, grad_c = learning.loo_loss_and_grad(X, yv, components=L, dtype=dtype)
        checks.compare(f"LOO grad metric L {dtype}", grad_g, grad_c, t)
    heads, n_q, n_k, dim = (2, 11, 13, 4) if tiny else (3, 100, 130, 64)
    for dtype in (np.float32, np.float64):
        for causal in (False, True):
            q = rng.normal(size=(heads, n_q, dim)).astype(dtype)
            k = rng.normal(size=(heads, n_k, dim)).astype(dtype)
            v = rng.normal(size=(heads, n_k, dim)).astype(dtype)
            g = rng.normal(size=(heads, n_q, dim)).astype(dtype)
            name = f"{np.dtype(dtype).name} causal={causal}"
            out, lse = nbattn.flash_attention(q, k, v, causal, return_lse=True, device="cuda")
            ref_out, ref_lse = nbattn.flash_attention(q, k, v, causal, return_lse=True)
            checks.compare(f"flash forward out {name}", out, ref_out, tol[dtype])
            checks.compare(f"flash forward lse {name}", lse, ref_lse, tol[dtype])
            got = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal, device="cuda")
            ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, causal)
            for grad_name, a, b in zip(("dq", "dk", "dv"), got, ref, strict=True):
                checks.compare(f"flash backward {grad_name} {name}", a, b, tol[dtype])
    torch = _torch_cuda()
    if torch is not None:
        q = rng.normal(size=(2, 33, 16)).astype(np.float32)
        tq = torch.from_numpy(q).cuda()
        out = nbattn.flash_attention(tq, tq, tq, True, device="cuda")
        same_kind = isinstance(out, torch.Tensor) and out.is_cuda
        ref = nbattn.flash_attention(q, q, q, True)
        checks.compare("torch CUDA tensors in and out", out.cpu().numpy(), ref, 2e-5)
        if not same_kind:
            checks.failed += 1
            print("  FAIL  torch CUDA tensors in did not give a torch CUDA tensor out")
    return checks.failed


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _best_of(fn, sync, repeat=3):
    fn()
    sync()
    best = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def bench_nadaraya_watson(tiny, t0):
    from numba import cuda

    from nbattn.cuda import pooling

    print("\nNadaraya-Watson, float32, inputs on the GPU, one output (best of 3)")
    print(f"  {'d':>2s} {'queries':>9s} {'keys':>9s} {'seconds':>9s} {'pairs/s':>10s}")
    rng = np.random.default_rng(1)
    for d in (1, 8):
        n = 16 if tiny else 2**16
        while True:
            q = cuda.to_device(rng.normal(size=(n, d)).astype(np.float32))
            k_t = cuda.to_device(rng.normal(size=(d, n)).astype(np.float32))
            v_t = cuda.to_device(rng.normal(size=(1, n)).astype(np.float32))
            seconds = _best_of(
                lambda q=q, k_t=k_t, v_t=v_t: pooling.gaussian_pool(q, k_t, v_t, False),
                cuda.synchronize,
            )
            print(f"  {d:>2d} {n:>9d} {n:>9d} {seconds:>9.4f} {n * n / seconds:>10.3g}")
            if tiny or seconds > 0.5 or n >= 2**20 or time.perf_counter() - t0 > TIME_BUDGET_S / 2:
                break
            n *= 2


def _flops(n, causal, backward):
    fwd = 4.0 * 8 * n * n * 64 / (2.0 if causal else 1.0)
    return fwd * 2.5 if backward else fwd


def bench_flash(sizes, tiny, use_torch, t0):
    from numba import cuda

    from nbattn.cuda import flash

    torch = _torch_cuda() if use_torch else None
    heads, dim = (1, 4) if tiny else (8, 64)
    print(f"\nflash attention, float32, B=1 H={heads} D={dim} (TFLOP/s, best of 3)")
    if torch is None:
        print("  torch with CUDA not found (or --no-torch): nbattn's figures alone")
    print(f"  {'N':>6s} {'causal':>6s} {'pass':>8s} {'nbattn':>8s} {'torch':>8s} {'ratio':>6s}")
    rng = np.random.default_rng(2)
    for n in [16] if tiny else sizes:
        if time.perf_counter() - t0 > TIME_BUDGET_S:
            print(f"  N={n}: skipped (time budget of {TIME_BUDGET_S:.0f} s reached)")
            continue
        q, k, v, g = (rng.normal(size=(heads, n, dim)).astype(np.float32) for _ in range(4))
        dq_, dk_, dv_, dg_ = (cuda.to_device(a) for a in (q, k, v, g))
        scale = 1.0 / np.sqrt(dim)
        for causal in (False, True):
            times = _nbattn_times(flash, (dq_, dk_, dv_, dg_), scale, causal)
            torch_times = _torch_times(torch, q, k, v, g, causal) if torch is not None else {}
            for name, seconds in times.items():
                flops = _flops(n, causal, name == "backward") * heads / 8 * dim / 64
                ours = flops / seconds / 1e12
                line = f"  {n:>6d} {causal!s:>6s} {name:>8s} {ours:>8.3g}"
                if name in torch_times:
                    theirs = flops / torch_times[name] / 1e12
                    line += f" {theirs:>8.3g} {ours / theirs:>6.2f}"
                print(line)


def _nbattn_times(flash, arrays, scale, causal):
    """Best-of-3 seconds of the CUDA forward and backward kernels on device arrays."""
    from numba import cuda

    q, k, v, g = arrays
    out, lse = flash.flash_forward(q, k, v, scale, causal)

    def forward():
        flash.flash_forward(q, k, v, scale, causal)

    def backward():
        flash.flash_backward(q, k, v, out, lse, g, scale, causal)

    return {
        "forward": _best_of(forward, cuda.synchronize),
        "backward": _best_of(backward, cuda.synchronize),
    }


def _torch_times(torch, q, k, v, g, causal):
    import torch.nn.functional as F

    tq, tk, tv = (torch.from_numpy(a[None]).cuda().requires_grad_(True) for a in (q, k, v))
    tg = torch.from_numpy(g[None]).cuda()
    sync = torch.cuda.synchronize

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def backward():
        torch.autograd.grad(out, (tq, tk, tv), tg, retain_graph=True)

    return {"forward": _best_of(forward, sync), "backward": _best_of(backward, sync)}


def main(argv=None):
    args = _parse(argv)
    if args.simulate_tiny:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        import numba

        if not numba.config.ENABLE_CUDASIM:
            raise SystemExit(
                "--simulate-tiny: numba was imported before NUMBA_ENABLE_CUDASIM was set"
            )
        from nbattn import config

        config.CUDA_THREADS_PER_BLOCK = 8
    from nbattn.device import cuda_available

    if not cuda_available():
        print(
            "bench_gpu.py: no usable CUDA GPU (numba.cuda.is_available() is False): it needs "
            "an NVIDIA GPU, its driver and numba-cuda (pip install 'nbattn[cuda]'). "
            "Use --simulate-tiny to run the checks under the CUDA simulator.",
            file=sys.stderr,
        )
        return 2
    from numba import cuda

    t0 = time.perf_counter()
    if args.simulate_tiny:
        print("device: CUDA simulator (NUMBA_ENABLE_CUDASIM=1), tiny shapes, 8 threads per block")
    else:
        name = cuda.get_current_device().name
        print(f"device: {name.decode() if isinstance(name, bytes) else name}")
    failed = run_checks(args.simulate_tiny)
    bench_nadaraya_watson(args.simulate_tiny, t0)
    bench_flash(args.sizes, args.simulate_tiny, not args.no_torch, t0)
    print(f"\n{failed} check(s) failed; total {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
