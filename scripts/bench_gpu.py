"""GPU checks and figures for nbattn's CUDA kernels, in one run (needs a CUDA GPU).

Made to fit a lent GPU's short lease (15 minutes, machine start included):
``--sections`` picks what runs, the default order puts first the paths that
have not yet run on a real GPU, every check prints its first-call (compile)
time beside its result, and a time budget keeps time for the timings.

Sections, in their default order (``--sections`` takes any of these names):

checks, CUDA against the CPU on small inputs
  flex      programmable attention (score_mod / mask_mod / block_mask, ``nbattn.cuda.flex``):
            a softcap score_mod with causal=True, and a document block mask, float32
            D = 64, forward and backward
  density   the distributions (``nbattn.cuda.density``): the joint CDF of mixed columns
            (Gaussian and Epanechnikov), the density, the conditional CDF and quantiles
            with device="cuda" against "cpu"
  features  flash attention with masks (boolean key padding, float), grouped-query
            heads, windows, bottom-right causal, softcap, dropout: forward and
            backward (float32 each term, float64 all terms in one call)
  varlen    packed variable-length flash attention (float32)
  decode    KV-cache decoding with appended keys (float32, float64)
  local     mixed-type local-polynomial fits, degree 0 and 1
  torch     torch CUDA tensors in -> torch CUDA tensor out (when torch has CUDA)
  nw        Nadaraya-Watson with device="cuda" (1-D float32, 8-D float64 with
            exclude_self), a far query (its nearest key's value, not 0/0),
            numba device arrays in -> device array out
  loo       the LOO loss and gradients (log-widths and a metric), float64, float32
  flash     flash attention forward and backward, float32 at D = 64 (causal and
            not), float64 at an odd D = 7 (causal), L != S
  twins     the kernels themselves (``nbattn.cuda.pooling`` / ``loo`` against
            ``nbattn.kernels.pooling`` / ``loo``), at sizes that split outputs or
            gradient entries over several launches
timings (best of 3 after a warm-up call, bracketed by ``cuda.synchronize()``)
  time-nw     Nadaraya-Watson pairs/s, 1-D and 8-D, float32, one output, inputs on
              the GPU; 2^14 x 2^14 growing until a call takes ~0.3 s (at most 2^20)
  time-loo    the LOO loss and gradient (n = 2^13 and 2^15, d = 4, float32), beside
              the CPU on this machine for n = 2^13
  time-flash  flash attention TFLOP/s, B = 1, H = 8, D = 64, float32, N = --sizes,
              forward and backward, causal and not, beside torch's
              ``scaled_dot_product_attention`` on the same GPU (ratio nbattn / torch).
              FLOP convention of FlashAttention and torch: forward 4 N^2 D per head
              (half when causal), backward 2.5x the forward (nbattn's backward does
              8/5 of that work; the figure still uses the convention).
  time-flex   programmable attention against the same without user functions,
              B = 1, H = 8, N = 2048, D = 64, float32, host arrays through the public
              calls: a softcap score_mod with causal=True, and with a causal block
              mask, against flash_attention(causal=True, softcap=); forward and
              forward + backward, seconds and the ratio flex / built-in
  time-density  the density (the engine's pass) and the joint CDF of 1e5 queries
              against 1e6 keys (2 continuous columns, float64) on the GPU, the
              conditional quantiles (3 levels) of 1e4 queries against 1e5 keys; the
              CPU on a slice of the queries (1e3, and 100 for the quantiles) and the
              ratio of the two per query (CPU / GPU)

The checks use few compile-time specialisations: one dtype where the code
path is the same in both, both dtypes where the kernels differ (float32
weights through the fast exp, float64 through the accurate one). Kernels
are cached on disk (``nbattn.cuda.common.jit``; ``NUMBA_CACHE_DIR`` chooses
where), so a second run on the same machine loads them: the first-call
times show it, and the run ends with the count of kernels loaded and
compiled.

Time budget: a check section (or check) does not start after ``--check-budget``
seconds (default 300), a timing not after ``--budget`` (default 420; the
Nadaraya-Watson timing gets at most 45 s of it, the LOO timing 30 s); with
``--simulate-tiny`` there is no budget unless given. The time of a check
beside its GPU time is mostly the CPU reference's first call: numba compiles
the CPU kernels too, on a machine whose cache does not have them yet. What
the budget skipped is listed at the end with the command that runs it.
Every part runs guarded: an exception is printed as ERROR with its last
line and counted, and the run goes on. Each part prints its name as it
starts (``...``), and one still running after ``--stall-report`` seconds
(default 90) prints every thread's Python stack, again each time as long
again: a part that never returns shows whether it waits in a compile, a
kernel or the CPU's reference (on 2026-12-04 the first ``features`` check
ran silent for 340 s on an H200, before this report existed).

Figures of the first run on an NVIDIA H200 (numba-cuda 0.30.4): NW float32
1-D 5.4e11 pairs/s at 2^19 x 2^19, 8-D 2.7e11; flash float32 N = 4096
forward 6.9 TFLOP/s (torch SDPA 27.5), backward 5.9 (29.6), causal forward
3.3 (20.4), backward 3.1 (20.3).

    python scripts/bench_gpu.py                       # everything, on a machine with a GPU
    python scripts/bench_gpu.py --sections features varlen time-flash
    python scripts/bench_gpu.py --simulate-tiny       # the checks and one tiny timing of
                                                      # each kind, under the CUDA simulator

It imports the nbattn that Python finds: an installed one, or from a
checkout without installing, ``PYTHONPATH=. python scripts/bench_gpu.py``
(it needs nbattn's dependencies and numba-cuda; torch is optional).

Exit status: 0 every check that ran passed; 1 a check failed or raised;
2 CUDA cannot run here (no GPU, or a numba-cuda that cannot compile with
this NumPy: the message says which).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
import traceback

import numpy as np

import nbattn  # imports no numba (NUMBA_ENABLE_CUDASIM may still be set after it)

CHECK_SECTIONS = (
    "flex",
    "density",
    "features",
    "varlen",
    "decode",
    "local",
    "torch",
    "nw",
    "loo",
    "flash",
    "twins",
)
TIMING_SECTIONS = ("time-flex", "time-density", "time-nw", "time-loo", "time-flash")
SECTIONS = CHECK_SECTIONS + TIMING_SECTIONS


def _parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--simulate-tiny",
        action="store_true",
        help="run under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) on tiny shapes",
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        metavar="SECTION",
        help=f"what to run, in this order (default: all, {' '.join(SECTIONS)})",
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1024, 4096, 16384],
        help="flash attention sequence lengths N (default 1024 4096 16384)",
    )
    parser.add_argument(
        "--check-budget",
        type=float,
        default=None,
        help="seconds after which no further check starts (default 300; none with --simulate-tiny)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds after which no further timing starts (default 420; none with "
        "--simulate-tiny)",
    )
    parser.add_argument(
        "--stall-report",
        type=float,
        default=90.0,
        help="seconds after which a part still running prints every thread's Python stack, "
        "and again each time as long again (default 90; 0: never): a stall then shows "
        "whether it is in a compile, a kernel or the CPU's reference",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip torch SDPA")
    args = parser.parse_args(argv)
    no_limit = np.inf if args.simulate_tiny else None
    if args.check_budget is None:
        args.check_budget = no_limit or 300.0
    if args.budget is None:
        args.budget = no_limit or 420.0
    return args


class Report:
    """Collects check results and timing rows; every part runs through :meth:`guard`.

    GPU calls made through :meth:`on_gpu` are timed; each result line shows the
    seconds spent in them since the previous line (the first result of a
    check: mostly kernel compiles, or cache loads).
    """

    def __init__(self, budget_s, check_budget_s, stall_report_s=0.0):
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.check_budget_s = check_budget_s
        self.stall_report_s = stall_report_s
        self.depth = 0  # guards running (a section's guard holds its checks' guards)
        self.checks = []  # (name, status, detail)
        self.timings = []  # (section, what, figure)
        self.skipped = []  # (section, what)
        self.gpu_s = 0.0  # time in on_gpu calls since the last result line

    def elapsed(self):
        return time.perf_counter() - self.t0

    def out_of_time(self, section_start=None, allowance_s=None):
        """Past the whole run's budget, or past ``allowance_s`` since ``section_start``
        (so that one timing does not starve the others)."""
        now = self.elapsed()
        if now > self.budget_s:
            return True
        return allowance_s is not None and now - section_start > allowance_s

    def out_of_check_time(self):
        return self.elapsed() > self.check_budget_s

    def skip(self, section, what):
        self.skipped.append((section, what))
        print(f"  SKIP  {what}: time budget", flush=True)

    def on_gpu(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its seconds added to the next result line's GPU time."""
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.gpu_s += time.perf_counter() - start

    def guard(self, name, fn, *args, section=None):
        """Run ``fn(*args)``; an exception becomes an ERROR line and the run goes on.
        With ``section`` (a check), nothing runs past the check budget, and the
        check's wall time is printed after it."""
        if section is not None and self.out_of_check_time():
            self.skip(section, name)
            return None
        start = time.perf_counter()
        self.gpu_s = 0.0
        self.depth += 1
        if self.stall_report_s > 0:
            print(f"  ...   {name}", flush=True)
            faulthandler.dump_traceback_later(self.stall_report_s, repeat=True, file=sys.stdout)
        try:
            return fn(*args)
        except Exception as exc:  # one part failing must not stop the others
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{last} ({os.path.basename(where.filename)}:{where.lineno})"
            self.checks.append((name, "ERROR", detail))
            print(f"  ERROR {name}: {detail}", flush=True)
            return None
        finally:
            self.depth -= 1
            faulthandler.cancel_dump_traceback_later()
            if self.depth and self.stall_report_s > 0:  # the enclosing guard's watch again
                faulthandler.dump_traceback_later(self.stall_report_s, repeat=True, file=sys.stdout)
            if section is not None:
                print(f"        [{name}: {time.perf_counter() - start:.1f} s]", flush=True)

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
        gpu = f"gpu {self.gpu_s:5.1f} s" if self.gpu_s >= 0.05 else ""
        self.gpu_s = 0.0
        print(f"  {status}  {name:<52s} {str(detail):<28s} {gpu}", flush=True)

    def timing(self, section, what, figure):
        self.timings.append((section, what, figure))
        print(f"  {what:<44s} {figure}", flush=True)

    def failed(self):
        return sum(status != "PASS" for _, status, _ in self.checks)

    def summary(self, argv_prefix):
        print("\nsummary")
        counts = {s: sum(st == s for _, st, _ in self.checks) for s in ("PASS", "FAIL", "ERROR")}
        print(
            f"  checks: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['ERROR']} errors"
            f", {len(self.skipped)} skipped (time budget)"
        )
        for name, status, detail in self.checks:
            if status != "PASS":
                print(f"    {status:<5s} {name}: {detail}")
        if self.skipped:
            sections = list(dict.fromkeys(section for section, _ in self.skipped))
            for section, what in self.skipped:
                print(f"    SKIP  {section}: {what}")
            print(f"  to run what was skipped: {argv_prefix} --sections {' '.join(sections)}")
        if self.timings:
            print(f"  {'section':<18s} {'what':<44s} figure")
            for section, what, figure in self.timings:
                print(f"  {section:<18s} {what:<44s} {figure}")
        print(f"  total {self.elapsed():.1f} s")


TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-5}


# --- 1. checks ---------------------------------------------------------------
#
# Each check section is a function (report, tiny, rng); each check in it runs
# through report.guard(..., section=...) and its GPU calls through
# report.on_gpu, so that the first result line shows the compile time.


def _name(dtype):
    return np.dtype(dtype).name


def check_features(report, tiny, rng):
    """Flash attention's optional terms, forward and backward, against the CPU: each
    term in float32 (D = 64), all of them in one float64 call (D = 7)."""
    import nbattn

    def run(dtype, dim, label, kw):
        heads, kv_heads, n_q, n_k = (4, 2, 9, 13) if tiny else (8, 2, 100, 130)
        tol = TOL[np.dtype(dtype)]
        q = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        k = rng.normal(size=(kv_heads, n_k, dim)).astype(dtype)
        v = rng.normal(size=(kv_heads, n_k, dim)).astype(dtype)
        g = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        kw = {key: (value(n_q, n_k) if callable(value) else value) for key, value in kw.items()}
        name = f"flash {label} {_name(dtype)} D={dim}"
        out, lse = report.on_gpu(
            nbattn.flash_attention, q, k, v, return_lse=True, device="cuda", **kw
        )
        ref_out, ref_lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
        report.compare(f"{name} out", out, ref_out, tol)
        report.compare(f"{name} lse", lse, ref_lse, tol)
        got = report.on_gpu(
            nbattn.flash_attention_backward, q, k, v, out, lse, g, device="cuda", **kw
        )
        ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, **kw)
        for grad_name, a, b in zip(("dq", "dk", "dv"), got, ref, strict=True):
            report.compare(f"{name} {grad_name}", a, b, tol)

    def padding(n_q, n_k):
        return (rng.random(n_k) > 0.2)[None, :]

    def float_mask(n_q, n_k):
        return rng.normal(size=(n_q, n_k))

    window = dict(window=(5, None), causal=True, causal_alignment="bottom_right")
    cases = (
        (np.float32, "bool key-padding mask, GQA", dict(mask=padding, enable_gqa=True)),
        (
            np.float32,
            "float mask, window, bottom-right causal",
            dict(mask=float_mask, enable_gqa=True, **window),
        ),
        (
            np.float32,
            "softcap, dropout",
            dict(enable_gqa=True, softcap=2.0, dropout_p=0.25, random_state=7),
        ),
        (
            np.float64,
            "every term",
            dict(
                mask=float_mask,
                enable_gqa=True,
                softcap=2.0,
                dropout_p=0.25,
                random_state=7,
                **window,
            ),
        ),
    )
    for dtype, label, kw in cases:
        dim = (4 if dtype == np.float32 else 3) if tiny else (64 if dtype == np.float32 else 7)
        report.guard(
            f"flash {label} {_name(dtype)}", run, dtype, dim, label, kw, section="features"
        )


CAP = 20.0  # the flex checks' and timing's softcap


def flex_softcap(score, b, h, q_idx, kv_idx, doc):
    """The flex checks' score_mod: a tanh softcap of CAP."""
    return CAP * nbattn.flex_tanh(score / CAP)


def flex_documents(b, h, q_idx, kv_idx, doc):
    """The flex checks' mask_mod: causal within documents (doc: a document id per position)."""
    return (kv_idx <= q_idx) & (doc[q_idx] == doc[kv_idx])


def check_flex(report, tiny, rng):
    """score_mod / mask_mod / block_mask on the GPU against the CPU flex kernels."""
    import nbattn

    heads, n, dim = (2, 11, 4) if tiny else (4, 300, 64)
    tol = TOL[np.dtype(np.float32)]
    q, k, v, g = (rng.normal(size=(1, heads, n, dim)).astype(np.float32) for _ in range(4))
    doc = (np.arange(n) // max(1, n // 3)).astype(np.int64)
    block = nbattn.create_block_mask(flex_documents, None, None, n, n, mod_args=(doc,))

    def run(label, kw):
        name = f"flex {label} float32 D={dim}"
        kw = dict(score_mod=flex_softcap, mod_args=(doc,), **kw)
        out, lse = report.on_gpu(
            nbattn.flash_attention, q, k, v, return_lse=True, device="cuda", **kw
        )
        ref_out, ref_lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
        report.compare(f"{name} out", out, ref_out, tol)
        report.compare(f"{name} lse", lse, ref_lse, tol)
        got = report.on_gpu(
            nbattn.flash_attention_backward, q, k, v, out, lse, g, device="cuda", **kw
        )
        ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, **kw)
        for grad_name, a, b in zip(("dq", "dk", "dv"), got, ref, strict=True):
            report.compare(f"{name} {grad_name}", a, b, tol)

    for label, kw in (("softcap, causal", dict(causal=True)), ("document block mask", {})):
        kw = kw if label.startswith("softcap") else dict(block_mask=block)
        report.guard(f"flex {label}", run, label, kw, section="flex")


def check_varlen(report, tiny, rng):
    """Packed variable-length attention (causal, GQA, a window; an empty sequence)."""
    import nbattn

    def run(dtype):
        lengths = np.array([0, 5, 17] if tiny else [0, 50, 170, 1])
        cu = np.concatenate([[0], np.cumsum(lengths)])
        q = rng.normal(size=(4, cu[-1], 8)).astype(dtype)
        kv = rng.normal(size=(2, cu[-1], 8)).astype(dtype)
        kw = dict(causal=True, enable_gqa=True, window=(3, None))
        got = report.on_gpu(nbattn.flash_attention_varlen, q, kv, kv, cu, cu, device="cuda", **kw)
        ref = nbattn.flash_attention_varlen(q, kv, kv, cu, cu, **kw)
        report.compare(f"varlen {_name(dtype)}", got, ref, TOL[np.dtype(dtype)])

    report.guard("varlen float32", run, np.float32, section="varlen")


def check_decode(report, tiny, rng):
    """KV-cache decoding with new keys appended (GQA; an empty cache row)."""
    import nbattn

    def run(dtype):
        lengths = np.array([0, 5, 17] if tiny else [0, 50, 170, 1])
        s_max, b = 32 if tiny else 512, len(lengths)
        cache_k = rng.normal(size=(b, 2, s_max, 8)).astype(dtype)
        cache_v = rng.normal(size=(b, 2, s_max, 8)).astype(dtype)
        seqlens = np.minimum(lengths, s_max - 2)
        q1 = rng.normal(size=(b, 4, 2, 8)).astype(dtype)
        k_new = rng.normal(size=(b, 2, 2, 8)).astype(dtype)
        v_new = rng.normal(size=(b, 2, 2, 8)).astype(dtype)
        outs, caches = [], []
        for device in ("cuda", "cpu"):
            ck, cv = cache_k.copy(), cache_v.copy()
            call = report.on_gpu if device == "cuda" else (lambda fn, *a, **k: fn(*a, **k))
            outs.append(
                call(
                    nbattn.flash_decode,
                    q1,
                    ck,
                    cv,
                    seqlens,
                    k_new,
                    v_new,
                    enable_gqa=True,
                    device=device,
                )
            )
            caches.append((ck, cv))
        tol = TOL[np.dtype(dtype)]
        report.compare(f"flash_decode {_name(dtype)}", outs[0], outs[1], tol)
        report.expect(
            f"flash_decode {_name(dtype)} caches written alike",
            all(np.array_equal(a, b) for a, b in zip(caches[0], caches[1], strict=True)),
            "",
        )

    for dtype in (np.float32, np.float64):
        report.guard(f"decode {_name(dtype)}", run, dtype, section="decode")


def check_density(report, tiny, rng):
    """The distributions with device="cuda" against "cpu": the joint CDF and density of
    continuous, ordered and unordered columns with sample weights, the conditional CDF
    and quantiles (the GPU sums kernel, the host-driven root-finder)."""
    import nbattn

    n, m = (30, 8) if tiny else (3000, 200)
    X = np.column_stack([rng.normal(size=n), rng.integers(0, 4, n), rng.integers(0, 3, n)]).astype(
        float
    )
    w = rng.uniform(0.5, 2.0, n)
    kw = dict(var_type="cou", n_categories=[0, 4, 3], sample_weight=w)

    def joint(kernel):
        options = dict(kw, kernel=kernel)
        for name, fn in (("cdf", nbattn.kernel_cdf), ("density", nbattn.kernel_density)):
            got = report.on_gpu(fn, X[:m], X, [0.6, 0.3, 0.2], device="cuda", **options)
            ref = fn(X[:m], X, [0.6, 0.3, 0.2], **options)
            report.compare(f"joint {name} cou {kernel}", got, ref, 1e-11)

    def conditional():
        y = X[:, 0] + 0.5 * rng.normal(size=n)
        models = {
            device: nbattn.ConditionalKernelDensity(var_type="cou", device=device).fit(X, y)
            for device in ("cpu", "cuda")
        }
        gpu, cpu = models["cuda"], models["cpu"]
        got = report.on_gpu(gpu.cdf, X[:m], y[:m])
        report.compare("conditional cdf", got, cpu.cdf(X[:m], y[:m]), 1e-11)
        levels = [0.1, 0.5, 0.9]
        got = report.on_gpu(gpu.predict_quantile, X[:m], levels)
        ref = cpu.predict_quantile(X[:m], levels)
        error = np.abs(got - ref).max() / cpu.y_bandwidth_
        report.expect("conditional quantiles", error <= 1e-8, f"{error:.1e} widths (tol 1e-08)")

    for kernel in ("gaussian", "epanechnikov"):
        report.guard(f"joint cdf cou {kernel}", joint, kernel, section="density")
    report.guard("conditional cdf and quantiles", conditional, section="density")


def check_local(report, tiny, rng):
    """Mixed-type local-polynomial fits (continuous, unordered, ordered columns)."""
    import nbattn

    def run(degree):
        n = 60 if tiny else 2000
        X = np.column_stack(
            [rng.normal(size=n), rng.normal(size=n), rng.integers(0, 3, n), rng.integers(0, 4, n)]
        ).astype(float)
        y = np.sin(X[:, 0]) + 0.3 * X[:, 2] + 0.1 * rng.normal(size=n)
        widths = [0.5, 0.7, 0.2, 0.3]
        kw = dict(degree=degree, var_type="ccuo", n_categories=[0, 0, 3, 4])
        got = report.on_gpu(nbattn.local_polynomial, X[:20], X, y, widths, device="cuda", **kw)
        ref = nbattn.local_polynomial(X[:20], X, y, widths, **kw)
        report.compare(f"local polynomial degree {degree}", got, ref, 1e-9)

    def pruned():
        from nbattn import config

        # clustered keys at narrow widths: each block of queries keeps a few runs of keys
        # (BlockRuns); the pruned GPU fit against the exact CPU one, within the contract
        n, n_q = (300, 40) if tiny else (200_000, 20_000)
        centres = rng.uniform(-20, 20, (50, 2))
        X = np.column_stack(
            [centres[rng.integers(0, 50, n)] + rng.normal(size=(n, 2)), rng.integers(0, 3, n)]
        ).astype(float)
        y = np.sin(X[:, 0]) + 0.3 * X[:, 2] + 0.1 * rng.normal(size=n)
        queries = X[rng.integers(0, n, n_q)]
        kw = dict(degree=1, var_type="ccu", n_categories=[0, 0, 3])
        widths, rtol = [0.3, 0.3, 0.1], 1e-6
        on_cpu = nbattn.local_polynomial(queries, X, y, widths, rtol=rtol, **kw)
        exact = report.on_gpu(nbattn.local_polynomial, queries, X, y, widths, device="cuda", **kw)
        # each line's GPU time is its own call's: the exact pass, then the pruned one;
        # the bound 2 rtol / (1 - rtol) ||g||_1 max |y - x beta| with ||g||_1 of order 1
        report.compare("local polynomial exact (GPU) vs rtol=1e-6 (CPU)", exact, on_cpu, 1e-4)
        saved = config.LOCAL_TREE_MIN_KEYS, config.LOCAL_LEAF_KEYS
        if tiny:  # leaves at the simulator's sizes, so that the tiny run prunes too
            config.LOCAL_TREE_MIN_KEYS, config.LOCAL_LEAF_KEYS = 1, 8
        try:
            got = report.on_gpu(
                nbattn.local_polynomial, queries, X, y, widths, device="cuda", rtol=rtol, **kw
            )
        finally:
            config.LOCAL_TREE_MIN_KEYS, config.LOCAL_LEAF_KEYS = saved
        report.compare("local polynomial rtol=1e-6 (GPU) vs exact (GPU)", got, exact, 1e-4)

    for degree in (0, 1):
        report.guard(f"local polynomial degree {degree}", run, degree, section="local")
    report.guard("local polynomial pruned (rtol)", pruned, section="local")


def check_torch(report, tiny, rng):
    """torch CUDA tensors in, a torch CUDA tensor out (the flash kernel of the float32
    D = 64 causal check, so nothing extra compiles)."""
    import nbattn

    torch = _torch_cuda()
    if torch is None:
        print("  torch with CUDA not found: nothing to check", flush=True)
        return

    def run():
        q = rng.normal(size=(2, 33, 4 if tiny else 64)).astype(np.float32)
        tq = torch.from_numpy(q).cuda()
        out = report.on_gpu(nbattn.flash_attention, tq, tq, tq, True, device="cuda")
        same_kind = isinstance(out, torch.Tensor) and out.is_cuda
        report.expect("torch CUDA tensors in, torch CUDA tensor out", same_kind, type(out))
        ref = nbattn.flash_attention(q, q, q, True)
        report.compare("torch CUDA tensors", out.cpu().numpy(), ref, 2e-5)

    report.guard("torch CUDA tensors", run, section="torch")


def check_nadaraya_watson(report, tiny, rng):
    """nadaraya_watson(device="cuda") against the CPU: 1-D float32 with one output,
    8-D float64 with two, exclude_self; a far query; device arrays in and out."""
    import nbattn

    n = 13 if tiny else 300

    def run(d, dtype, n_outputs):
        tol = TOL[np.dtype(dtype)]
        x = rng.normal(size=(n, d)).astype(dtype)
        q = rng.normal(size=(n // 2 + 1, d)).astype(dtype)
        y = rng.normal(size=(n, n_outputs) if n_outputs > 1 else n).astype(dtype)
        tag = f"d={d} {_name(dtype)}"
        got = report.on_gpu(nbattn.nadaraya_watson, q, x, y, 0.7, device="cuda")
        report.compare(f"NW {tag}", got, nbattn.nadaraya_watson(q, x, y, 0.7), tol)
        got = report.on_gpu(nbattn.nadaraya_watson, x, x, y, 0.7, exclude_self=True, device="cuda")
        ref = nbattn.nadaraya_watson(x, x, y, 0.7, exclude_self=True)
        report.compare(f"NW exclude_self {tag}", got, ref, tol)

    report.guard("NW d=1 float32", run, 1, np.float32, 1, section="nw")
    report.guard("NW d=8 float64", run, 8, np.float64, 2, section="nw")

    def far_query():
        keys = np.array([[0.0], [1.0], [2.0]])
        got = report.on_gpu(
            nbattn.nadaraya_watson, [[-1e4], [1e4]], keys, [10.0, 20.0, 30.0], 1.0, device="cuda"
        )
        report.expect(
            "NW far query gets its nearest key's value", np.array_equal(got, [10, 30]), got
        )

    report.guard("NW far query", far_query, section="nw")

    def device_arrays():
        from numba import cuda

        q, k = rng.normal(size=(11, 1)), rng.normal(size=(19, 1))
        v = rng.normal(size=19)
        got = report.on_gpu(
            nbattn.nadaraya_watson,
            cuda.to_device(q),
            cuda.to_device(k),
            cuda.to_device(v),
            "scott",
            device="cuda",
        )
        report.expect("NW device arrays in, device array out", not isinstance(got, np.ndarray), "")
        ref = nbattn.nadaraya_watson(q, k, v, "scott")
        report.compare("NW device arrays", got.copy_to_host(), ref, 1e-10)

    report.guard("NW device arrays", device_arrays, section="nw")


def check_loo(report, tiny, rng):
    """The LOO loss and its gradients (log-widths; a metric L), float64 and float32."""
    from nbattn.smoothing import loo

    n = 13 if tiny else 300
    X = rng.normal(size=(n, 3))
    yv = np.sin(X[:, 0]) + X[:, 1] * X[:, 2]
    h = np.array([0.6, 0.9, 1.2])
    L = rng.normal(size=(2, 3))

    def run(dtype):
        t = TOL[np.dtype(dtype)]
        loss_g, grad_g = report.on_gpu(loo.loo_loss_and_grad, X, yv, h, dtype=dtype, device="cuda")
        loss_c, grad_c = loo.loo_loss_and_grad(X, yv, h, dtype=dtype)
        report.compare(f"LOO loss {dtype}", loss_g, loss_c, t)
        report.compare(f"LOO grad log-widths {dtype}", grad_g, grad_c, t)
        _, grad_g = report.on_gpu(
            loo.loo_loss_and_grad, X, yv, components=L, dtype=dtype, device="cuda"
        )
        _, grad_c = loo.loo_loss_and_grad(X, yv, components=L, dtype=dtype)
        report.compare(f"LOO grad metric L {dtype}", grad_g, grad_c, t)

    for dtype in ("float64", "float32"):
        report.guard(f"LOO {dtype}", run, dtype, section="loo")


def check_flash(report, tiny, rng):
    """Flash attention forward and backward, L != S: float32 at D = 64 (causal and
    not), float64 at an odd D (causal: the tail loops of the dot products)."""
    import nbattn

    def run(dtype, causal, dim):
        heads, n_q, n_k = (2, 11, 13) if tiny else (3, 100, 130)
        tol = TOL[np.dtype(dtype)]
        q = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        k = rng.normal(size=(heads, n_k, dim)).astype(dtype)
        v = rng.normal(size=(heads, n_k, dim)).astype(dtype)
        g = rng.normal(size=(heads, n_q, dim)).astype(dtype)
        name = f"{_name(dtype)} causal={causal} D={dim}"
        out, lse = report.on_gpu(
            nbattn.flash_attention, q, k, v, causal, return_lse=True, device="cuda"
        )
        ref_out, ref_lse = nbattn.flash_attention(q, k, v, causal, return_lse=True)
        report.compare(f"flash forward out {name}", out, ref_out, tol)
        report.compare(f"flash forward lse {name}", lse, ref_lse, tol)
        got = report.on_gpu(
            nbattn.flash_attention_backward, q, k, v, out, lse, g, causal, device="cuda"
        )
        ref = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, causal)
        for grad_name, a, b in zip(("dq", "dk", "dv"), got, ref, strict=True):
            report.compare(f"flash backward {grad_name} {name}", a, b, tol)

    wide, odd = (4, 3) if tiny else (64, 7)
    for dtype, causal, dim in (
        (np.float32, False, wide),
        (np.float32, True, wide),
        (np.float64, True, odd),
    ):
        name = f"flash {_name(dtype)} causal={causal} D={dim}"
        report.guard(name, run, dtype, causal, dim, section="flash")


def check_kernel_twins(report, tiny, rng):
    """nbattn.cuda.{pooling,loo} against nbattn.kernels.{pooling,loo}, arrays in the kernels'
    layout; sizes that need several launches (outputs, gradient entries)."""
    from nbattn import config
    from nbattn.cuda import loo as gpu_loo
    from nbattn.cuda import pooling as gpu_pool
    from nbattn.kernels import loo as cpu_loo
    from nbattn.kernels import pooling as cpu_pool

    n = 13 if tiny else 700
    for dtype in (np.float32, np.float64):
        tol = TOL[np.dtype(dtype)]
        for d, p in ((1, 1), (3, config.CUDA_MAX_OUTPUTS + 3)):
            name = f"{_name(dtype)} d={d} outputs={p}"
            z = rng.normal(size=(n, d)).astype(dtype)
            z_t = np.ascontiguousarray(z.T)
            y = rng.normal(size=(n, p))
            v_t = np.ascontiguousarray(y.T, dtype=dtype)

            def pool(z=z, z_t=z_t, v_t=v_t, name=name, tol=tol):
                for exclude, offset in ((False, 0), (True, 0)):
                    out, lse = report.on_gpu(gpu_pool.gaussian_pool, z, z_t, v_t, exclude, offset)
                    ref_out, ref_lse = cpu_pool.gaussian_pool(z, z_t, v_t, exclude, offset)
                    tag = f"pool {name} exclude={exclude}"
                    report.compare(f"{tag} out", out.copy_to_host(), ref_out, tol)
                    report.compare(f"{tag} lse", lse.copy_to_host(), ref_lse, tol)

            def loss(z=z, z_t=z_t, v_t=v_t, y=y, name=name, tol=tol):
                rows = np.arange(z.shape[0], dtype=np.int64)
                got = report.on_gpu(gpu_loo.loo_squared_error, z, z_t, v_t, y, rows)
                ref = cpu_loo.loo_squared_error(z, z_t, v_t, y, rows)
                report.compare(f"LOO squared error {name}", got, ref, tol)

            report.guard(f"pool {name}", pool, section="twins")
            report.guard(f"LOO squared error {name}", loss, section="twins")

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
                got = report.on_gpu(gpu_loo.loo_grad_diag, z, z_t, v_t, resid, f, lse)
                ref = cpu_loo.loo_grad_diag(z, z_t, v_t, resid, f, lse)
                report.compare(f"LOO grad diag {_name(dtype)} k={k}", got, ref, tol)
            d = 12
            x = rng.normal(size=(m, d)).astype(dtype)
            L = rng.normal(size=(3, d)) / np.sqrt(d)
            z = np.ascontiguousarray(x @ L.T, dtype=dtype)
            z_t = np.ascontiguousarray(z.T)
            f, lse = cpu_pool.gaussian_pool(z, z_t, v_t, True)
            resid = np.ascontiguousarray(f - y, dtype=dtype)
            f = np.ascontiguousarray(f, dtype=dtype)
            x_t = np.ascontiguousarray(x.T)
            got = report.on_gpu(gpu_loo.loo_grad_full, z, z_t, x, x_t, v_t, resid, f, lse)
            ref = cpu_loo.loo_grad_full(z, z_t, x, x_t, v_t, resid, f, lse)
            report.compare(f"LOO grad full {_name(dtype)} d={d}", got, ref, tol)

        report.guard(f"LOO gradients {_name(dtype)}", grads, section="twins")


CHECKS = {
    "flex": (check_flex, "programmable attention (score_mod, mask_mod, block_mask)"),
    "density": (check_density, "densities, CDFs and quantiles, device='cuda' against 'cpu'"),
    "features": (check_features, "flash features: masks, GQA, windows, softcap, dropout"),
    "varlen": (check_varlen, "packed variable-length attention"),
    "decode": (check_decode, "KV-cache decoding"),
    "local": (check_local, "mixed-type local polynomial"),
    "torch": (check_torch, "torch CUDA tensors"),
    "nw": (check_nadaraya_watson, "Nadaraya-Watson, device='cuda' against 'cpu'"),
    "loo": (check_loo, "LOO loss and gradients, device='cuda' against 'cpu'"),
    "flash": (check_flash, "flash attention forward and backward"),
    "twins": (check_kernel_twins, "CUDA kernels against their CPU twins"),
}


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


# --- timings ------------------------------------------------------------------


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


def bench_density(report, tiny):
    """pdf and cdf of 1e5 queries against 1e6 keys, the conditional quantiles of 1e4
    against 1e5; the CPU on a slice of the queries, the ratio per query."""
    import nbattn

    print("\nDensities, float64, 2 continuous columns (GPU best of 3; CPU one call)", flush=True)
    rng = np.random.default_rng(4)
    start = report.elapsed()
    n_q, n_k, cpu_q = (16, 64, 4) if tiny else (10**5, 10**6, 10**3)
    keys = rng.normal(size=(n_k, 2))
    queries = rng.normal(size=(n_q, 2))
    for name, fn in (("pdf", nbattn.kernel_density), ("cdf", nbattn.kernel_cdf)):
        if report.out_of_time(start, 120.0):
            report.skip("time-density", f"{name} timing")
            continue
        gpu = _best_of(lambda fn=fn: fn(queries, keys, 0.3, device="cuda"), lambda: None)
        cpu = _best_of(lambda fn=fn: fn(queries[:cpu_q], keys, 0.3), lambda: None, repeat=1)
        ratio = (cpu / cpu_q) / (gpu / n_q)
        report.timing(
            "density",
            f"{name} {n_q} x {n_k}",
            f"GPU {gpu:.3g} s ({n_q * n_k / gpu:.3g} pairs/s), CPU {cpu:.3g} s for {cpu_q}"
            f" queries, CPU/GPU per query {ratio:.3g}x",
        )
    n_q, n_k, cpu_q = (8, 32, 4) if tiny else (10**4, 10**5, 100)
    if report.out_of_time(start, 120.0):
        report.skip("time-density", "quantile timing")
        return
    X = rng.normal(size=(n_k, 2))
    y = X[:, 0] + 0.5 * rng.normal(size=n_k)
    levels = [0.1, 0.5, 0.9]
    models = {
        device: nbattn.ConditionalKernelDensity(
            bandwidth=[0.3, 0.3], y_bandwidth=0.3, device=device
        ).fit(X, y)
        for device in ("cpu", "cuda")
    }
    gpu = _best_of(lambda: models["cuda"].predict_quantile(X[:n_q], levels), lambda: None)
    cpu = _best_of(
        lambda: models["cpu"].predict_quantile(X[:cpu_q], levels), lambda: None, repeat=1
    )
    ratio = (cpu / cpu_q) / (gpu / n_q)
    report.timing(
        "density",
        f"quantiles x3 {n_q} x {n_k}",
        f"GPU {gpu:.3g} s, CPU {cpu:.3g} s for {cpu_q} queries, CPU/GPU per query {ratio:.3g}x",
    )


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
                report.skip("time-nw", f"NW timing d={d} n={n}")
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

    from nbattn.smoothing import loo

    print("\nLOO loss and gradient (log-widths), float32, d = 4", flush=True)
    rng = np.random.default_rng(3)
    start = report.elapsed()
    for n in (16,) if tiny else (2**13, 2**15):
        if report.out_of_time(start, 30.0):
            report.skip("time-loo", f"LOO timing n={n}")
            continue
        X = rng.normal(size=(n, 4))
        y = np.sin(X[:, 0]) + X[:, 1]
        h = np.full(4, 0.5)

        def on(device, X=X, y=y, h=h):
            return loo.loo_loss_and_grad(X, y, h, dtype="float32", device=device)

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
                report.skip("time-flash", f"flash timing N={n} causal={causal}")
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


def flex_causal(b, h, q_idx, kv_idx, doc):
    """The flex timing's mask_mod (of its block mask): causal."""
    return kv_idx <= q_idx


def bench_flex(report, tiny):
    """Programmable attention against the built-in terms, through the public calls."""
    import nbattn

    heads, n, dim = (2, 16, 4) if tiny else (8, 2048, 64)
    print(f"\nflex attention, float32, B=1 H={heads} N={n} D={dim} (seconds, best of 3)")
    rng = np.random.default_rng(5)
    q, k, v, g = (rng.normal(size=(1, heads, n, dim)).astype(np.float32) for _ in range(4))
    doc = np.zeros(n, dtype=np.int64)
    block = nbattn.create_block_mask(flex_causal, None, None, n, n, mod_args=(doc,))
    variants = {
        "built-in causal softcap": dict(causal=True, softcap=CAP),
        "flex softcap, causal=True": dict(causal=True, score_mod=flex_softcap, mod_args=(doc,)),
        "flex softcap, causal block mask": dict(
            score_mod=flex_softcap, block_mask=block, mod_args=(doc,)
        ),
    }

    def times(kw):
        def forward():
            return nbattn.flash_attention(q, k, v, return_lse=True, device="cuda", **kw)

        def both():
            out, lse = forward()
            nbattn.flash_attention_backward(q, k, v, out, lse, g, device="cuda", **kw)

        return {"forward": _best_of(forward, lambda: None), "fwd+bwd": _best_of(both, lambda: None)}

    found = {}
    for label, kw in variants.items():
        if report.out_of_time():
            report.skip("time-flex", f"flex timing {label}")
            continue
        found[label] = report.guard(f"flex timing {label}", times, kw)
    base = found.get("built-in causal softcap")
    for label, result in found.items():
        for what, seconds in (result or {}).items():
            figure = f"{seconds:.4g} s"
            if base and label != "built-in causal softcap":
                figure += f", flex / built-in {seconds / base[what]:.2f}"
            report.timing("flex", f"{label} {what}", figure)


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


def _kernel_cache_counts():
    """(loaded from numba's disk cache, compiled) over nbattn's CUDA kernels so far,
    or None where this numba does not count them (the simulator)."""
    import types

    from nbattn.cuda import common

    dispatchers = []

    def collect(obj):
        if isinstance(obj, tuple | list):
            for item in obj:
                collect(item)
        elif hasattr(obj, "stats") and hasattr(obj, "py_func"):
            dispatchers.append(obj)

    for value in common._KERNELS.values():
        collect(value)
    for name, module in list(sys.modules.items()):
        if name.startswith("nbattn.cuda.") and isinstance(module, types.ModuleType):
            for value in vars(module).values():
                collect(value)
    if not dispatchers:  # the simulator's kernels keep no such count
        return None
    loaded = compiled = 0
    try:
        for dispatcher in {id(d): d for d in dispatchers}.values():
            stats = dispatcher.stats
            loaded += sum(stats.cache_hits.values())
            compiled += sum(stats.cache_misses.values())
    except Exception:
        return None
    return loaded, compiled


def main(argv=None):
    args = _parse(argv)
    # the small checks' grids are small on purpose: numba-cuda's warning on each launch
    # buried the results in the log (set the variable to 1 to see them)
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    if args.simulate_tiny:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        import numba

        if not numba.config.ENABLE_CUDASIM:
            raise SystemExit(
                "--simulate-tiny: numba was imported before NUMBA_ENABLE_CUDASIM was set"
            )
        from nbattn import config

        config.CUDA_THREADS_PER_BLOCK = 8
    from nbattn.dispatch.device import cuda_problem

    problem = cuda_problem()
    if problem is not None:
        print(
            f"bench_gpu.py: CUDA cannot run here. {problem} "
            "(--simulate-tiny runs the checks under the CUDA simulator.)",
            file=sys.stderr,
        )
        return 2
    import numba
    from numba import cuda

    report = Report(args.budget, args.check_budget, args.stall_report)
    if args.simulate_tiny:
        print("device: CUDA simulator (NUMBA_ENABLE_CUDASIM=1), tiny shapes, 8 threads per block")
    else:
        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else device.name
        print(f"device: {name}, compute capability {device.compute_capability}")
    print(
        f"numba {numba.__version__}, numpy {np.__version__}, "
        f"numba.cuda from {os.path.dirname(cuda.__file__)}"
    )
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    print(f"kernel cache: {cache_dir or 'numba default (__pycache__ or the user cache)'}")
    if np.isfinite(args.check_budget) or np.isfinite(args.budget):
        limits = f"checks start until {args.check_budget:.0f} s, timings until {args.budget:.0f} s"
    else:
        limits = "no time budget"
    print(f"sections: {' '.join(args.sections)}; {limits}", flush=True)
    tiny = args.simulate_tiny
    timings = {
        "time-flex": (bench_flex, (report, tiny)),
        "time-density": (bench_density, (report, tiny)),
        "time-nw": (bench_nadaraya_watson, (report, tiny)),
        "time-loo": (bench_loo, (report, tiny)),
        "time-flash": (bench_flash, (report, args.sizes, tiny, not args.no_torch)),
    }
    rng = np.random.default_rng(1)
    for section in args.sections:
        start = report.elapsed()
        if section in CHECKS:
            fn, title = CHECKS[section]
            print(f"\nchecks: {title} [{section}]", flush=True)
            if report.out_of_check_time():
                report.skip(section, f"section {section}")
                continue
            report.guard(section, fn, report, tiny, rng)
        else:
            if report.out_of_time():
                report.skip(section, f"section {section}")
                continue
            fn, fn_args = timings[section]
            report.guard(section, fn, *fn_args)
        print(f"  [{section}: {report.elapsed() - start:.1f} s]", flush=True)
    counts = _kernel_cache_counts()
    if counts is not None:
        print(f"\nCUDA kernels: {counts[0]} loaded from the disk cache, {counts[1]} compiled")
    prefix = "python scripts/bench_gpu.py" + (" --simulate-tiny" if tiny else "")
    report.summary(prefix)
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
