"""GPU checks and figures for nbattn's CUDA kernels, in one run (needs a CUDA GPU).

1. Checks, on small inputs, that every CUDA twin gives what its CPU twin
   gives: the kernels themselves (``nbattn.cuda.pooling`` / ``loo`` against
   ``nbattn.kernels.pooling`` / ``loo``, including the paths that split
   outputs or gradient entries over several launches), then the functional
   layer with ``device="cuda"`` against ``device="cpu"``: Nadaraya-Watson
   (1-D and 8-D, float32 and float64, exclude_self), a far query (nearest
   value, not 0/0), the LOO loss and gradients (log-widths and a metric),
   flash attention forward and backward (causal and not, L != S, D = 64 and
   an odd D; masks, grouped-query heads, windows, bottom-right causal,
   softcap, dropout), packed variable-length attention, KV-cache decoding,
   mixed-type local-polynomial fits, numba device arrays in -> device arrays out, and torch CUDA
   tensors in -> torch CUDA tensors out when torch with CUDA is installed.
2. Nadaraya-Watson pairs/s (queries x keys per second), 1-D and 8-D, float32,
   one output, inputs already on the GPU; the size grows from 2^14 x 2^14
   until one call takes ~0.3 s (at most 2^20 x 2^20).
3. The LOO loss and gradient (n = 2^13 and 2^15, d = 4, float32) on the GPU,
   beside the CPU on this machine for n = 2^13.
4. Flash attention TFLOP/s, B = 1, H = 8, D = 64, float32, N = 1024 ...
   16,384, forward and backward, causal and not, beside
   ``torch.nn.functional.scaled_dot_product_attention`` (forward; backward by
   autograd) on the same GPU when torch with CUDA is there, with the ratio
   nbattn / torch. FLOP convention of FlashAttention and torch: forward
   4 N^2 D per head (half when causal), backward 2.5x the forward. (nbattn's
   backward recomputes scores in three kernels and does 8/5 of that work; the
   figure still uses the convention, so the ratio to torch is fair.)

Robust by construction: every check and every timing runs guarded -- an
exception is printed as ERROR with its last line and counted, and the run
goes on. A time budget (``--budget``, 240 s by default; Nadaraya-Watson
gets at most 45 s of it and the LOO timing 30 s) skips the timings that
would not fit, so the whole run stays under 5 minutes on an H200 (first
calls compile kernels: a few seconds each). The run ends with a
summary table. Every time is the best of 3 after a warm-up call, bracketed
by ``cuda.synchronize()``.

    python scripts/bench_gpu.py                  # on a machine with a CUDA GPU
    python scripts/bench_gpu.py --simulate-tiny  # the checks and one tiny timing of
                                                 # each kind, under the CUDA simulator

It imports the nbattn that Python finds: an installed one, or from a
checkout without installing, ``PYTHONPATH=. python scripts/bench_gpu.py``
(it needs nbattn's dependencies and numba-cuda; torch is optional).

Exit status: 0 all checks passed; 1 a check failed or raised; 2 no usable GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import numpy as np


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
    parser.add_argument(
        "--budget", type=float, default=240.0, help="seconds after which timings are skipped"
    )
    parser.add_argument("--no-torch", action="store_true", help="skip torch SDPA")
    return parser.parse_args(argv)


class Report:
    """Collects check results and timing rows; every part runs through :meth:`guard`."""

    def __init__(self, budget_s):
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.checks = []  # (name, status, detail)
        self.timings = []  # (section, what, figure)

    def elapsed(self):
        return time.perf_counter() - self.t0

    def out_of_time(self, section_start=None, allowance_s=None):
        """Past the whole run's budget, or past ``allowance_s`` since ``section_start``
        (so that slow kernel compiles in the checks do not starve the timings)."""
        now = self.elapsed()
        if now > self.budget_s:
            return True
        return allowance_s is not None and now - section_start > allowance_s

    def guard(self, name, fn, *args):
        """Run ``fn(*args)``; an exception becomes an ERROR line and the run goes on."""
        try:
            return fn(*args)
        except Exception as exc:  # one part failing must not stop the others
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{last} ({os.path.basename(where.filename)}:{where.lineno})"
            self.checks.append((name, "ERROR", detail))
            print(f"  ERROR {name}: {detail}", flush=True)
            return None

    def compare(self, name, got, ref, tol):
        """PASS when max |got - ref| <= tol * max |ref| and the non-finite entries agree."""
        got = np.asarray(got, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if got.shape != ref.shape:
            self._record(name, False, f"shape {got.shape} != {ref.shape}")
            return
        finite = np.isfinite(ref)
        if not np.array_equal(np.isfinite(got), finite) or not np.array_equal(
            got[~finite], ref[~finite]
        ):
            self._record(name, False, "non-finite entries differ")
            return
        scale = max(np.abs(ref[finite]).max(initial=0.0), 1e-300)
        err = np.abs(got[finite] - ref[finite]).max(initial=0.0) / scale
        self._record(name, err <= tol, f"rel err {err:.1e} (tol {tol:.0e})")

    def expect(self, name, ok, detail):
        self._record(name, bool(ok), detail)

    def _record(self, name, ok, detail):
        status = "PASS" if ok else "FAIL"
        self.checks.append((name, status, detail))
        print(f"  {status}  {name:<52s} {detail}", flush=True)

    def timing(self, section, what, figure):
        self.timings.append((section, what, figure))
        print(f"  {what:<44s} {figure}", flush=True)

    def failed(self):
        return sum(status != "PASS" for _, status, _ in self.checks)

    def summary(self):
        print("\nsummary")
        counts = {s: sum(st == s for _, st, _ in self.checks) for s in ("PASS", "FAIL", "ERROR")}
        print(
            f"  checks: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['ERROR']} errors"
        )
        for name, status, detail in self.checks:
            if status != "PASS":
                print(f"    {status:<5s} {name}: {detail}")
        if self.timings:
            print(f"  {'section':<18s} {'what':<44s} figure")
            for section, what, figure in self.timings:
                print(f"  {section:<18s} {what:<44s} {figure}")
        print(f"  total {self.elapsed():.1f} s")


TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-5}


# --- 1. checks ---------------------------------------------------------------


def check_kernel_twins(report, tiny):
    """nbattn.cuda.{pooling,loo} against nbattn.kernels.{pooling,loo}, arrays in the kernels'
    layout; sizes that need several launches (outputs, gradient entries)."""
    from nbattn import config
    from nbattn.cuda import loo as gpu_loo
    from nbattn.cuda import pooling as gpu_pool
    from nbattn.kernels import loo as cpu_loo
    from nbattn.kernels import pooling as cpu_pool

    print("checks: CUDA kernels against their CPU twins", flush=True)
    rng = np.random.default_rng(0)
    n = 13 if tiny else 700
    for dtype in (np.float32, np.float64):
        tol = TOL[np.dtype(dtype)]
        for d, p in ((1, 1), (3, config.CUDA_MAX_OUTPUTS + 3)):
            name = f"{np.dtype(dtype).name} d={d} outputs={p}"
            z = rng.normal(size=(n, d)).astype(dtype)
            z_t = np.ascontiguousarray(z.T)
            y = rng.normal(size=(n, p))
            v_t = np.ascontiguousarray(y.T, dtype=dtype)

            def pool(z=z, z_t=z_t, v_t=v_t, name=name, tol=tol):
                for exclude, offset in ((False, 0), (True, 0)):
                    out, lse = gpu_pool.gaussian_pool(z, z_t, v_t, exclude, offset)
                    ref_out, ref_lse = cpu_pool.gaussian_pool(z, z_t, v_t, exclude, offset)
                    tag = f"pool {name} exclude={exclude}"
                    report.compare(f"{tag} out", out.copy_to_host(), ref_out, tol)
                    report.compare(f"{tag} lse", lse.copy_to_host(), ref_lse, tol)

            def loss(z=z, z_t=z_t, v_t=v_t, y=y, name=name, tol=tol):
                rows = np.arange(z.shape[0], dtype=np.int64)
                got = gpu_loo.loo_squared_error(z, z_t, v_t, y, rows)
                ref = cpu_loo.loo_squared_error(z, z_t, v_t, y, rows)
                report.compare(f"LOO squared error {name}", got, ref, tol)

            report.guard(f"pool {name}", pool)
            report.guard(f"LOO squared error {name}", loss)

        def grads(dtype=dtype, tol=tol):
            # k = 70 features and d = 12 points (78 pairs): more entries than one launch holds
            for k in (3, config.CUDA_MAX_GRAD_ENTRIES + 6):
                m = 11 if tiny else 300
                z = (rng.normal(size=(m, k)) / np.sqrt(k)).astype(dtype)
                z_t = np.ascontiguousarray(z.T)
                y = rng.normal(size=(m, 2))
                v_t = np.ascontiguousarray(y.T, dtype=dtype)
                f, lse = cpu_pool.gaussian_pool(z, z_t, v_t, True)
                resid = np.ascontiguousarray(f - y, dtype=dtype)
                f = np.ascontiguousarray(f, dtype=dtype)
                got = gpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
                ref = cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
                report.compare(f"LOO grad diag {np.dtype(dtype).name} k={k}", got, ref, tol)
            d = 12
            x = rng.normal(size=(m, d)).astype(dtype)
            L = rng.normal(size=(3, d)) / np.sqrt(d)
            z = np.ascontiguousarray(x @ L.T, dtype=dtype)
            z_t = np.ascontiguousarray(z.T)
            f, lse = cpu_pool.gaussian_pool(z, z_t, v_t, True)
            resid = np.ascontiguousarray(f - y, dtype=dtype)
            f = np.ascontiguousarray(f, dtype=dtype)
            x_t = np.ascontiguousarray(x.T)
            got = gpu_loo.loo_grad_full(z, z_t, x, x_t, v_t, resid, f, lse)
            ref = cpu_loo.loo_grad_full(z, z_t, x, x_t, v_t, resid, f, lse)
            report.compare(f"LOO grad full {np.dtype(dtype).name} d={d}", got, ref, tol)

        report.guard(f"LOO gradients {np.dtype(dtype).name}", grads)


def check_functional(report, tiny):
    """The functional layer with device="cuda" against device="cpu"."""
    import nbattn
    from nbattn import learning

    print("checks: device='cuda' against device='cpu'", flush=True)
    rng = np.random.default_rng(1)
    n = 13 if tiny else 300

    def nadaraya_watson(d, dtype):
        tol = TOL[np.dtype(dtype)]
        x = rng.normal(size=(n, d)).astype(dtype)
        q = rng.normal(size=(n // 2 + 1, d)).astype(dtype)
        y = rng.normal(size=(n, 2)).astype(dtype)
        tag = f"d={d} {np.dtype(dtype).name}"
        got = nbattn.nadaraya_watson(q, x, y, 0.7, device="cuda")
        report.compare(f"NW {tag}", got, nbattn.nadaraya_watson(q, x, y, 0.7), tol)
        got = nbattn.nadaraya_watson(x, x, y, 0.7, exclude_self=True, device="cuda")
        ref = nbattn.nadaraya_watson(x, x, y, 0.7, exclude_self=True)
        report.compare(f"NW exclude_self {tag}", got, ref, tol)

    for d in (1, 8):
        for dtype in (np.float32, np.float64):
            report.guard(f"NW d={d} {np.dtype(dtype).name}", nadaraya_watson, d, dtype)

    def far_query():
        keys = np.array([[0.0], [1.0], [2.0]])
        got = nbattn.nadaraya_watson([[-1e4], [1e4]], keys, [10.0, 20.0, 30.0], 1.0, device="cuda")
        report.expect(
            "NW far query gets its nearest key's value", np.array_equal(got, [10, 30]), got
        )

    report.guard("NW far query", far_query)

    def device_arrays():
        from numba import cuda

        q, k = rng.normal(size=(11, 2)), rng.normal(size=(19, 2))
        v = rng.normal(size=19)
        got = nbattn.nadaraya_watson(
            cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), "scott", device="cuda"
        )
        report.expect("NW device arrays in, device array out", not isinstance(got, np.ndarray), "")
        ref = nbattn.nadaraya_watson(q, k, v, "scott")
        report.compare("NW device arrays", got.copy_to_host(), ref, 1e-10)

    report.guard("NW device arrays", device_arrays)

    X = rng.normal(size=(n, 3))
    yv = np.sin(X[:, 0]) + X[:, 1] * X[:, 2]
    h = np.array([0.6, 0.9, 1.2])
    L = rng.normal(size=(2, 3))

    def loo(dtype):
        t = TOL[np.dtype(dtype)]
        loss_g, grad_g = learning.loo_loss_and_grad(X, yv, h, dtype=dtype, device="cuda")
        loss_c, grad_c = learning.loo_loss_and_grad(X, yv, h, dtype=dtype)
        report.compare(f"LOO loss {dtype}", loss_g, loss_c, t)
        report.compare(f"LOO grad log-widths {dtype}", grad_g, grad_c, t)
        _, grad_g = learning.loo_loss_and_grad(X, yv, components=L, dtype=dtype, device="cuda")
        _, grad_c = learning.loo_loss_and_grad(X, yv, components=L, dtype=dtype)
        report.compare(f"LOO grad metric L {dtype}", grad_g, grad_c, t)

    for dtype in ("float64", "float32"):
        report.guard(f"LOO {dtype}", loo, dtype)

    def flash(dtype, causal, dim):
        heads, n_q, n_k = (2, 11, 13) if tiny else (3, 100, 130)
        tol = TOL[np.dtype(dtype)]
        q = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        k = rng.normal(size=(heads, n_k, dim)).astype(dtype)
        v = rng.normal(size=(heads, n_k, dim)).astype(dtype)
        g = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        name = f"{np.dtype(dtype).name} causal={causal} D={dim}"
        out, lse = nbattn.flash_attention(q, k, v, causal, return_lse=True, device="cuda")
        ref_out, ref_lse = nbattn.flash_attention(q, k, v, causal, return_lse=True)
        report.compare(f"flash forward out {name}", out, ref_out, tol)
        report.compare(f"flash forward lse {name}", lse, ref_lse, tol)
        got = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal, device="cuda")
        ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, causal)
        for grad_name, a, b in zip(("dq", "dk", "dv"), got, ref, strict=True):
            report.compare(f"flash backward {grad_name} {name}", a, b, tol)

    for dim in (4, 7) if tiny else (64, 7):
        for dtype in (np.float32, np.float64):
            for causal in (False, True):
                name = f"flash {np.dtype(dtype).name} causal={causal} D={dim}"
                report.guard(name, flash, dtype, causal, dim)

    def flash_features(dtype):
        heads, kv_heads, n_q, n_k, dim = (4, 2, 9, 13, 4) if tiny else (8, 2, 100, 130, 64)
        tol = TOL[np.dtype(dtype)]
        q = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        k = rng.normal(size=(kv_heads, n_k, dim)).astype(dtype)
        v = rng.normal(size=(kv_heads, n_k, dim)).astype(dtype)
        g = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        padding = rng.random(n_k) > 0.2
        cases = {
            "bool key-padding mask, GQA": dict(mask=padding[None, :], enable_gqa=True),
            "float mask, window, bottom-right causal": dict(
                mask=rng.normal(size=(n_q, n_k)),
                enable_gqa=True,
                window=(5, None),
                causal=True,
                causal_alignment="bottom_right",
            ),
            "softcap, dropout": dict(enable_gqa=True, softcap=2.0, dropout_p=0.25, random_state=7),
        }
        for label, kw in cases.items():
            name = f"flash {label} {np.dtype(dtype).name}"
            out, lse = nbattn.flash_attention(q, k, v, return_lse=True, device="cuda", **kw)
            ref_out, ref_lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
            report.compare(f"{name} out", out, ref_out, tol)
            got = nbattn.flash_attention_backward(q, k, v, out, lse, g, device="cuda", **kw)
            ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, **kw)
            for grad_name, a, b in zip(("dq", "dk", "dv"), got, ref, strict=True):
                report.compare(f"{name} {grad_name}", a, b, tol)

    def varlen_and_decode(dtype):
        tol = TOL[np.dtype(dtype)]
        lengths = np.array([0, 5, 17] if tiny else [0, 50, 170, 1])
        cu = np.concatenate([[0], np.cumsum(lengths)])
        q = rng.normal(size=(4, cu[-1], 8)).astype(dtype)
        kv = rng.normal(size=(2, cu[-1], 8)).astype(dtype)
        kw = dict(causal=True, enable_gqa=True, window=(3, None))
        got = nbattn.flash_attention_varlen(q, kv, kv, cu, cu, device="cuda", **kw)
        ref = nbattn.flash_attention_varlen(q, kv, kv, cu, cu, **kw)
        report.compare(f"varlen {np.dtype(dtype).name}", got, ref, tol)
        s_max, b = 32 if tiny else 512, len(lengths)
        cache_k = rng.normal(size=(b, 2, s_max, 8)).astype(dtype)
        cache_v = rng.normal(size=(b, 2, s_max, 8)).astype(dtype)
        seqlens = np.minimum(lengths, s_max - 2)
        q1 = rng.normal(size=(b, 4, 2, 8)).astype(dtype)
        k_new = rng.normal(size=(b, 2, 2, 8)).astype(dtype)
        v_new = rng.normal(size=(b, 2, 2, 8)).astype(dtype)
        outs = []
        for device in ("cuda", "cpu"):
            ck, cv = cache_k.copy(), cache_v.copy()
            outs.append(
                nbattn.flash_decode(
                    q1, ck, cv, seqlens, k_new, v_new, enable_gqa=True, device=device
                )
            )
        report.compare(f"flash_decode {np.dtype(dtype).name}", outs[0], outs[1], tol)

    def local_mixed(degree):
        n = 60 if tiny else 2000
        X = np.column_stack(
            [rng.normal(size=n), rng.normal(size=n), rng.integers(0, 3, n), rng.integers(0, 4, n)]
        ).astype(float)
        y = np.sin(X[:, 0]) + 0.3 * X[:, 2] + 0.1 * rng.normal(size=n)
        widths = [0.5, 0.7, 0.2, 0.3]
        kw = dict(degree=degree, var_type="ccuo", n_categories=[0, 0, 3, 4])
        got = nbattn.local_polynomial(X[:20], X, y, widths, device="cuda", **kw)
        ref = nbattn.local_polynomial(X[:20], X, y, widths, **kw)
        report.compare(f"local polynomial degree {degree}", got, ref, 1e-9)

    for dtype in (np.float32, np.float64):
        report.guard(f"flash features {np.dtype(dtype).name}", flash_features, dtype)
        report.guard(f"varlen and decode {np.dtype(dtype).name}", varlen_and_decode, dtype)
    for degree in (0, 1):
        report.guard(f"local polynomial degree {degree}", local_mixed, degree)

    torch = _torch_cuda()
    if torch is not None:

        def torch_tensors():
            q = rng.normal(size=(2, 33, 16)).astype(np.float32)
            tq = torch.from_numpy(q).cuda()
            out = nbattn.flash_attention(tq, tq, tq, True, device="cuda")
            same_kind = isinstance(out, torch.Tensor) and out.is_cuda
            report.expect("torch CUDA tensors in, torch CUDA tensor out", same_kind, type(out))
            ref = nbattn.flash_attention(q, q, q, True)
            report.compare("torch CUDA tensors", out.cpu().numpy(), ref, 2e-5)

        report.guard("torch CUDA tensors", torch_tensors)


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


# --- 2-4. timings ------------------------------------------------------------


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


def bench_nadaraya_watson(report, tiny):
    from numba import cuda

    from nbattn.cuda import pooling

    print("\nNadaraya-Watson, float32, inputs on the GPU, one output (best of 3)", flush=True)
    rng = np.random.default_rng(2)
    start = report.elapsed()
    for d in (1, 8):
        n = 16 if tiny else 2**14
        while True:
            if report.out_of_time(start, 45.0):
                report.timing("NW", f"d={d} n={n}", "skipped (time budget)")
                break
            q = cuda.to_device(rng.normal(size=(n, d)).astype(np.float32))
            k_t = cuda.to_device(rng.normal(size=(d, n)).astype(np.float32))
            v_t = cuda.to_device(rng.normal(size=(1, n)).astype(np.float32))
            seconds = _best_of(
                lambda q=q, k_t=k_t, v_t=v_t: pooling.gaussian_pool(q, k_t, v_t, False),
                cuda.synchronize,
            )
            report.timing(
                "NW", f"d={d} {n} x {n}", f"{n * n / seconds:.3g} pairs/s ({seconds:.4f} s)"
            )
            if tiny or seconds > 0.3 or n >= 2**20:
                break
            n *= 4 if seconds < 0.02 else 2


def bench_loo(report, tiny):
    from numba import cuda

    from nbattn import learning

    print("\nLOO loss and gradient (log-widths), float32, d = 4", flush=True)
    rng = np.random.default_rng(3)
    start = report.elapsed()
    for n in (16,) if tiny else (2**13, 2**15):
        if report.out_of_time(start, 30.0):
            report.timing("LOO", f"n={n}", "skipped (time budget)")
            continue
        X = rng.normal(size=(n, 4))
        y = np.sin(X[:, 0]) + X[:, 1]
        h = np.full(4, 0.5)

        def on(device, X=X, y=y, h=h):
            return learning.loo_loss_and_grad(X, y, h, dtype="float32", device=device)

        gpu = _best_of(lambda: on("cuda"), cuda.synchronize)
        line = f"GPU {gpu:.4f} s ({2 * n * n / gpu:.3g} pairs/s over both passes)"
        if n <= 2**13 and not report.out_of_time(start, 30.0):
            cpu = _best_of(lambda: on("cpu"), lambda: None, repeat=1)
            line += f", CPU {cpu:.3g} s, CPU/GPU {cpu / gpu:.3g}x"
        report.timing("LOO", f"n={n} loss and gradient", line)


def _flops(n, heads, dim, causal, backward):
    fwd = 4.0 * heads * n * n * dim / (2.0 if causal else 1.0)
    return fwd * 2.5 if backward else fwd


def bench_flash(report, sizes, tiny, use_torch):
    from numba import cuda

    from nbattn.cuda import flash

    torch = _torch_cuda() if use_torch else None
    heads, dim = (1, 4) if tiny else (8, 64)
    print(f"\nflash attention, float32, B=1 H={heads} D={dim} (TFLOP/s, best of 3)", flush=True)
    if torch is None:
        print("  torch with CUDA not found (or --no-torch): nbattn's figures alone")
    rng = np.random.default_rng(4)
    for n in [16] if tiny else sizes:
        for causal in (False, True):
            if report.out_of_time():
                report.timing("flash", f"N={n} causal={causal}", "skipped (time budget)")
                continue
            q, k, v, g = (rng.normal(size=(heads, n, dim)).astype(np.float32) for _ in range(4))
            arrays = tuple(cuda.to_device(a) for a in (q, k, v, g))
            scale = 1.0 / np.sqrt(dim)
            ours = report.guard(
                f"flash timing N={n} causal={causal}", _nbattn_times, flash, arrays, scale, causal
            )
            theirs = {}
            if torch is not None:
                theirs = report.guard(
                    f"torch SDPA timing N={n} causal={causal}",
                    _torch_times,
                    torch,
                    q,
                    k,
                    v,
                    g,
                    causal,
                )
            for name, seconds in (ours or {}).items():
                flops = _flops(n, heads, dim, causal, name == "backward")
                figure = f"{flops / seconds / 1e12:.3g} TFLOP/s"
                if theirs and name in theirs:
                    torch_tflops = flops / theirs[name] / 1e12
                    figure += f", torch {torch_tflops:.3g}, ratio {theirs[name] / seconds:.2f}"
                report.timing("flash", f"N={n} causal={causal} {name}", figure)


def _nbattn_times(flash, arrays, scale, causal):
    """Best-of-3 seconds of the CUDA forward and backward kernels on device arrays."""
    from numba import cuda

    q, k, v, g = arrays
    out, lse = flash.flash_forward(q, k, v, scale, causal)
    return {
        "forward": _best_of(lambda: flash.flash_forward(q, k, v, scale, causal), cuda.synchronize),
        "backward": _best_of(
            lambda: flash.flash_backward(q, k, v, out, lse, g, scale, causal), cuda.synchronize
        ),
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
    import numba
    from numba import cuda

    report = Report(args.budget)
    if args.simulate_tiny:
        print("device: CUDA simulator (NUMBA_ENABLE_CUDASIM=1), tiny shapes, 8 threads per block")
    else:
        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else device.name
        print(f"device: {name}, compute capability {device.compute_capability}")
    print(f"numba {numba.__version__}, numba.cuda from {os.path.dirname(cuda.__file__)}")
    tiny = args.simulate_tiny
    for section, fn, fn_args in (
        ("kernel twins", check_kernel_twins, (report, tiny)),
        ("functional layer", check_functional, (report, tiny)),
        ("NW timing", bench_nadaraya_watson, (report, tiny)),
        ("LOO timing", bench_loo, (report, tiny)),
        ("flash timing", bench_flash, (report, args.sizes, tiny, not args.no_torch)),
    ):
        start = report.elapsed()
        report.guard(section, fn, *fn_args)
        print(f"  [{section}: {report.elapsed() - start:.1f} s]", flush=True)
    report.summary()
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
