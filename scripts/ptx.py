"""Compile every CUDA kernel for a real GPU without one, and read ptxas's resource table.

``numba.cuda.compile_ptx`` needs libNVVM (the CUDA toolkit, or numba-cuda's
``[cu12]``/``[cu13]`` wheels) but no GPU and no driver; ``ptxas`` (from a
CUDA toolkit, or the ``nvidia-cuda-nvcc`` wheel) assembles the PTX and
reports, per kernel, registers per thread, stack frame and spill bytes --
what decides occupancy and whether per-thread rows live in registers.

* :func:`kernel_cases`: every kernel with the argument types its host
  wrapper launches it with, at given compile-time sizes (the one catalogue);
* :func:`compile_ptx`: PTX for one kernel (sm_90 by default);
* :func:`assemble`: ptxas's registers/stack/spills for that PTX, trying each
  ptxas found until one accepts the PTX version;
* ``python scripts/ptx.py``: the table for the sizes that matter (flash
  D = 64 and 128, Nadaraya-Watson and LOO at typical widths).

Used by ``tests/test_cuda_compile.py``; a development tool, imported by
nothing else.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import nbattn

#: The compute capability compiled for: Hopper (H100, H200).
CC = (9, 0)


@dataclass(frozen=True)
class Case:
    """One kernel at given compile-time sizes: a name, the kernel, its signature."""

    name: str
    kernel: object
    signature: str


def _sig(*args):
    return "void(" + ", ".join(args) + ")"


def flash_cases(
    dtype, d, d_v, mask_kind=0, alibi=False, softcap=False, dropout=False, packed=False
):  # fmt: skip
    """The flash forward, dq, dk and dv kernels of one feature set (see
    ``flash.flash_kernels``) with the argument types ``flash.forward_packed`` and
    ``flash.backward_packed`` launch them with."""
    from nbattn.cuda import flash

    a3, a2, a1 = f"{dtype}[:,:,::1]", f"{dtype}[:,::1]", f"{dtype}[::1]"
    f64_2, i64_1, i64_2 = "float64[:,::1]", "int64[::1]", "int64[:,::1]"
    mask = "boolean[:,:,::1]" if mask_kind == flash.BOOL_MASK else a3
    flags = (mask_kind, alibi, softcap, dropout, packed)
    fwd, dq, dk, dv = flash.flash_kernels(dtype, d, d_v, *flags)
    packing = (i64_1, i64_1, i64_2)  # cu_q, cu_k, offsets
    terms = (mask, i64_1, a1)  # mask, mask_index, slopes
    words = ("float64", "uint64", "uint64", "int64", "int64", "int64", "int64", "float64")
    tiles = ("int64", "int64")  # block size, first grid row of the launch
    features = [
        name
        for name, on in (
            ("bool mask", mask_kind == flash.BOOL_MASK),
            ("float mask", mask_kind == flash.FLOAT_MASK),
            ("alibi", alibi),
            ("softcap", softcap),
            ("dropout", dropout),
            ("packed", packed),
        )
        if on
    ]
    tag = f"{dtype} D={d} Dv={d_v}" + (f" +{'+'.join(features)}" if features else "")
    forward = _sig(a3, a3, a3, i64_1, *packing, *terms, "float64", *words, *tiles, a3, f64_2)
    dq_sig = _sig(
        a3, a3, a3, a3, f64_2, a3, i64_1, *packing, *terms, "float64", "float64", *words,
        *tiles, a3, a2,
    )  # fmt: skip
    dkdv = _sig(
        a3, a3, a3, f64_2, a3, a2, i64_1, i64_1, *packing, *terms, "float64", *words, *tiles,
        a3, a3,
    )  # fmt: skip
    return [
        Case(f"flash forward {tag}", fwd, forward),
        Case(f"flash dq {tag}", dq, dq_sig),
        Case(f"flash dk {tag}", dk, dkdv),
        Case(f"flash dv {tag}", dv, dkdv),
    ]


def flash_feature_cases(dtype, d):
    """The flash kernels with every optional term (float mask, ALiBi, softcap,
    dropout), with a boolean mask alone, and packed (varlen: softcap, dropout,
    sequence offsets) at head size ``d``."""
    from nbattn.cuda import flash

    return (
        flash_cases(dtype, d, d, flash.FLOAT_MASK, True, True, True)
        + flash_cases(dtype, d, d, flash.BOOL_MASK)
        + flash_cases(dtype, d, d, flash.NO_MASK, False, True, True, True)
    )


def decode_cases(dtype, d, d_v):
    """The split-KV decoding kernel (``decode.decode_partials``) at head sizes d, d_v."""
    from nbattn.cuda import decode

    a4, i64_1 = f"{dtype}[:,:,:,::1]", "int64[::1]"
    ints = ("int64", "float64", "boolean", "int64", "int64", "float64", "int64", "int64")
    sig = _sig(a4, a4, a4, i64_1, i64_1, i64_1, i64_1, *ints, "float64[:,:,::1]", "float64[:,::1]")
    return [
        Case(f"decode partials {dtype} D={d} Dv={d_v}", decode.decode_kernel(dtype, d, d_v), sig)
    ]


def _softcap_alibi(score, b, h, q_idx, kv_idx, slopes, doc):
    """A catalogue score_mod: a tanh softcap of 30 and ALiBi with per-head slopes."""
    return 30.0 * nbattn.flex_tanh(score / 30.0) + slopes[h] * (kv_idx - q_idx)


def _causal_document(b, h, q_idx, kv_idx, slopes, doc):
    """A catalogue mask_mod: causal within documents."""
    return kv_idx <= q_idx and doc[q_idx] == doc[kv_idx]


def flex_cases(dtype, d, d_v, score_mod=_softcap_alibi, mask_mod=_causal_document):
    """The programmable-attention kernels (``flex.flex_kernels``: forward, dq, dk, dv) with
    a score_mod and a mask_mod compiled in (by default a softcap + ALiBi and a causal
    document mask, with ``mod_args = (slopes, doc)``: dtype[::1], int64[::1]), with the
    argument types ``flex.flex_forward`` and ``flex.flex_backward`` launch them with.
    They are kept per process, not on disk (``cache=False``)."""
    from nbattn.cuda import flex
    from nbattn.kernels import flex_build

    flex.adopt_tanh(flex_build.tanh)
    a3, a2, f64_2 = f"{dtype}[:,:,::1]", f"{dtype}[:,::1]", "float64[:,::1]"
    i64_1, i64_2, blocks = "int64[::1]", "int64[:,::1]", "uint8[:,:,:,::1]"
    functions = (score_mod, mask_mod, None)
    prints = tuple(flex_build.fingerprint(f, "f") for f in functions)
    fwd, dq, dk, dv = flex.flex_kernels(dtype, d, d_v, functions, prints)
    args = f"Tuple(({dtype}[::1], {i64_1}))"
    tables = (i64_2, blocks, "int64", "int64", "int64", args, args)  # offsets .. mask_args
    tag = f"{dtype} D={d} Dv={d_v}"
    forward = _sig(a3, a3, a3, i64_1, *tables, "int64", "int64", a3, f64_2, "float64[::1]")
    dq_sig = _sig(a3, a3, a3, a3, f64_2, a3, i64_1, *tables, "float64", "int64", "int64", a3, a2)
    dkdv = _sig(a3, a3, a3, f64_2, a3, a2, i64_1, i64_1, *tables, "int64", "int64", a3, a3)
    return [
        Case(f"flex forward {tag}", fwd, forward),
        Case(f"flex dq {tag}", dq, dq_sig),
        Case(f"flex dk {tag}", dk, dkdv),
        Case(f"flex dv {tag}", dv, dkdv),
    ]


def pooling_cases(dtype, d, n_outputs):
    from nbattn.cuda import loo, pooling

    a2, f64_1, f64_2, i64_1 = f"{dtype}[:,::1]", "float64[::1]", "float64[:,::1]", "int64[::1]"
    tag = f"{dtype} d={d} outputs={n_outputs}"
    pool = pooling.gaussian_pool_kernel(dtype, d, n_outputs)
    loss = loo.loss_kernel(dtype, d, n_outputs)
    spread = loo.spread_kernel(dtype, d, n_outputs)
    spread_sig = _sig(a2, a2, a2, a2, f64_1, "boolean", "int64", f64_2, f64_1)
    return [
        Case(f"NW pool {tag}", pool, _sig(a2, a2, a2, "boolean", "int64", "int64", a2, f64_1)),
        Case(f"LOO loss {tag}", loss, _sig(a2, a2, a2, f64_2, i64_1, "int64", f64_1)),
        Case(f"NW spread {tag}", spread, spread_sig),
    ]


def weights_cases(dtype, d):
    """The two kernels of the weight matrix (``pooling.gaussian_weights``)."""
    from nbattn.cuda import pooling

    a2, a1, f64_1 = f"{dtype}[:,::1]", f"{dtype}[::1]", "float64[::1]"
    normaliser, weights = pooling.weights_kernels(dtype, d)
    return [
        Case(
            f"NW weight rows {dtype} d={d}",
            normaliser,
            _sig(a2, a2, a2, "boolean", "int64", a1, f64_1),
        ),
        Case(f"NW weights {dtype} d={d}", weights, _sig(a2, a2, a1, f64_1, "boolean", "int64", a2)),
    ]


def _grad_pair(label, tag, dtype, kernels, diag_launch, full_launch):
    """The diagonal and full LOO gradient kernels of one pass (``kernels``: the pair):
    both take the inputs, ``lse`` and ``self_offset`` first (the full one also the points
    and the pair lists) and ``out`` last, with their own launch arguments in between."""
    a2, f64_1, i64_1 = f"{dtype}[:,::1]", "float64[::1]", "int64[::1]"
    diag, full = kernels
    return [
        Case(
            f"{label} diag {tag}",
            diag,
            _sig(a2, a2, a2, a2, a2, f64_1, "int64", *diag_launch, f64_1),
        ),
        Case(
            f"{label} full {tag}",
            full,
            _sig(a2, a2, a2, a2, a2, a2, a2, f64_1, "int64", i64_1, i64_1, *full_launch, f64_1),
        ),
    ]


def grad_cases(dtype, n_acc):
    from nbattn.cuda import loo

    tag = f"{dtype} entries={n_acc}"
    kernels = loo.grad_kernels(dtype, n_acc)
    # diag: f0, bk; full: bk
    return _grad_pair("LOO grad", tag, dtype, kernels, ("int64", "int64"), ("int64",))


def far_cases(dtype, n_acc):
    """The far-row kernels of the LOO second passes (``loo.far_grad_kernels``,
    ``loo.far_spread_kernel``): one thread per far row, keys from global memory."""
    from nbattn.cuda import loo

    a2, f64_1, f64_2, i64_1 = f"{dtype}[:,::1]", "float64[::1]", "float64[:,::1]", "int64[::1]"
    tag = f"{dtype} entries={n_acc}"
    kernels = loo.far_grad_kernels(dtype, n_acc)
    # diag: rows, f0; full: rows
    return _grad_pair("LOO far grad", tag, dtype, kernels, (i64_1, "int64"), (i64_1,)) + [
        Case(
            f"NW far spread {dtype}",
            loo.far_spread_kernel(dtype),
            _sig(a2, a2, a2, a2, f64_1, "boolean", i64_1, f64_2, f64_1),
        ),
    ]


def layout_cases():
    from nbattn.cuda import layout

    f2, f1 = "float64[:,::1]", "float64[::1]"
    return [
        Case("layout count_nonfinite", layout._count_nonfinite_kernel, _sig(f2, "int64[::1]")),
        Case(
            "layout count_nan_or_posinf",
            layout._count_nan_or_posinf_kernel,
            _sig(f2, "int64[::1]"),
        ),
        Case("layout column_spread", layout._column_spread_kernel, _sig(f2, f1, f1)),
        Case("layout column_sums", layout._column_sums_kernel, _sig(f2, f1, f1, f1, f1)),
        Case(
            "layout scaled_transpose",
            layout._scaled_transpose_kernel,
            _sig(f2, f1, "float32[:,::1]"),
        ),
        Case("layout scaled_copy", layout._scaled_copy_kernel, _sig(f2, f1, "float32[:,::1]")),
    ]


def local_cases(dc, dk, degree, n_out, kernel=0, missing=False, stretch=0):
    """The local-polynomial kernels (``local.local_fit`` with marginal effects where
    they apply, ``local_interval_sums``, ``local_loo_gradient``) at dc continuous and
    dk categorical columns, a degree, n_out outputs per launch, a stretch kind of
    nearest-neighbour widths (``local_pairs``: 0 none, 1 per query, 2 per key); float64
    (their one dtype)."""
    from nbattn.cuda import local

    f2, f1, f3, i1 = "float64[:,::1]", "float64[::1]", "float64[:,:,::1]", "int64[::1]"
    i2 = "int64[:,::1]"  # the blocks' key runs (block_table, key_ranges)
    names = ("gaussian", "epanechnikov", "tricube")
    tag = f"dc={dc} dk={dk} deg={degree} out={n_out} {names[kernel]}" + (" nan" if missing else "")
    tag += ("", " query-stretch", " key-stretch")[stretch]
    do_mfx = local.n_terms(dc, degree) == 1 and dc > 0
    fit = local.fit_kernel(dc, dk, kernel, degree, missing, n_out, do_mfx, stretch)
    interval = local.interval_kernel(dc, dk, kernel, degree, missing, n_out, stretch)
    gradient = local.gradient_kernel(dc, dk, kernel, degree, missing, n_out, stretch)
    inputs = (f2, f2, f2, f2, f2, f1, f2, f2)  # ... log_weights, q_stretch, keys_stretch_t
    return [
        Case(
            f"local fit {tag}",
            fit,
            _sig(*inputs, f2, "boolean", "float64", "int64", i2, i2, f3, f2, f1, f1, i1, f3),
        ),
        Case(
            f"local interval {tag}",
            interval,
            _sig(*inputs, f2, "boolean", f2, f1, f1, i1, "int64", i2, i2, f2),
        ),
        Case(
            f"local gradient {tag}",
            gradient,
            _sig(
                *inputs[:5],
                f2,
                *inputs[5:],
                f2,
                "boolean",
                "float64",
                f3,
                f2,
                f1,
                f1,
                f2,
                "int64",
                i2,
                i2,
                f2,
            ),  # fmt: skip
        ),
    ]


def density_cases(dc, dk, kernel=0):
    """The distributions' sums kernel (``density.sums_kernel``: joint and conditional CDFs,
    the conditional quantiles' evaluations) at dc continuous and dk categorical columns;
    float64 (its one dtype)."""
    from nbattn.cuda import density

    f2, f1, b1 = "float64[:,::1]", "float64[::1]", "boolean[::1]"
    names = ("gaussian", "epanechnikov", "tricube")
    sig = _sig(f2, f2, f2, f2, b1, b1, f2, "int64[::1]", f1, f1, f1, f2, "int64", f1)
    tag = f"dc={dc} dk={dk} {names[kernel]}"
    return [Case(f"density sums {tag}", density.sums_kernel(dc, dk, kernel), sig)]


def kernel_cases():
    """The catalogue at the sizes that matter: flash D = 64 and 128 (float32 and
    float64) and, at D = 64, with every optional term and with a boolean mask;
    the flex kernels at D = 64 with a softcap + ALiBi score_mod and a document mask;
    split-KV decoding at D = 128;
    Nadaraya-Watson, the LOO loss, the spread and the weight matrix at d = 1
    and 8 with 1 and 8 outputs, LOO gradients with 8 and 64 entries
    per launch, the layout kernels, the densities' sums."""
    cases = []
    for dtype in ("float32", "float64"):
        for d in (64, 128):
            cases += flash_cases(dtype, d, d)
        cases += flash_feature_cases(dtype, 64) + decode_cases(dtype, 128, 128)
        cases += flex_cases(dtype, 64, 64)
        for d, n_outputs in ((1, 1), (8, 1), (8, 8)):
            cases += pooling_cases(dtype, d, n_outputs)
        for d in (1, 8):
            cases += weights_cases(dtype, d)
        for n_acc in (8, 64):
            cases += grad_cases(dtype, n_acc)
    # local polynomial: local-linear with 3 continuous and 2 categorical columns,
    # local-quadratic in 2-D, local-constant (marginal effects) with a compact kernel
    # and local-linear under nearest-neighbour widths (a stretch per query, per key)
    for args in ((3, 2, 1, 1), (2, 0, 2, 1), (3, 2, 0, 1, 2, True), (1, 1, 1, 8)):
        cases += local_cases(*args)
    for stretch in (1, 2):
        cases += local_cases(2, 1, 1, 1, 0, False, stretch)
    for dtype in ("float32", "float64"):
        cases += far_cases(dtype, 8)
    # the densities: a Gaussian CDF of 2 continuous and 2 categorical columns, a compact one
    for args in ((2, 2, 0), (1, 0, 2)):
        cases += density_cases(*args)
    return cases + layout_cases()


@contextlib.contextmanager
def _no_device_needed():
    """numba's bundled ``numba.cuda`` compiles device functions for the current
    device's compute capability and asks the driver for it; there is none
    without a GPU, so it is told CC for the duration."""
    try:
        import numba.cuda.dispatcher as dispatcher
    except ImportError:  # pragma: no cover - a numba without CUDA
        yield
        return

    class _Device:
        compute_capability = CC

    saved = getattr(dispatcher, "get_current_device", None)
    dispatcher.get_current_device = lambda: _Device()
    try:
        yield
    finally:
        if saved is None:
            del dispatcher.get_current_device
        else:
            dispatcher.get_current_device = saved


def compile_ptx(case, cc=CC):
    """The PTX of ``case``'s kernel for compute capability ``cc`` (no GPU needed)."""
    from numba import cuda

    fastmath = case.kernel.targetoptions.get("fastmath", False)
    with _no_device_needed():
        ptx, _ = cuda.compile_ptx(case.kernel.py_func, case.signature, cc=cc, fastmath=fastmath)
    return ptx


def ptxas_candidates():
    """Every ptxas found: on PATH, in CUDA_HOME / /usr/local/cuda, and the one of the
    ``nvidia-cuda-nvcc`` wheel (numba-cuda's ``[cu12]`` extra), newest PTX last tried."""
    found = []
    for path in (
        shutil.which("ptxas"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ptxas"),
        "/usr/local/cuda/bin/ptxas",
    ):
        if path and os.path.exists(path):
            found.append(os.path.realpath(path))
    for entry in sys.path:
        for sub in ("nvidia/cuda_nvcc/bin/ptxas", "nvidia/cu13/bin/ptxas"):
            path = os.path.join(entry, sub)
            if os.path.exists(path):
                found.append(os.path.realpath(path))
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Usage:
    """ptxas's resource figures for one kernel (bytes per thread)."""

    registers: int
    stack: int
    spill_stores: int
    spill_loads: int


class PtxasUnavailable(RuntimeError):
    """No ptxas here accepts this PTX (none found, or all older than the PTX version)."""


def assemble(ptx, cc=CC):
    """Assemble ``ptx`` with ``ptxas -v``; the kernel's :class:`Usage`.

    Raises :class:`PtxasUnavailable` when no ptxas found accepts the PTX (for
    example PTX 9.5 from NVVM 13.2 and ptxas 13.0), and ``RuntimeError`` with
    ptxas's message when the PTX does not assemble.
    """
    candidates = ptxas_candidates()
    if not candidates:
        raise PtxasUnavailable("no ptxas found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as handle:
            handle.write(ptx)
        refused = []
        for ptxas in candidates:
            done = subprocess.run(
                [ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", path, "-o", os.devnull],
                capture_output=True,
                text=True,
            )
            if "Unsupported .version" in done.stderr:
                refused.append(f"{ptxas}: {done.stderr.strip().splitlines()[0]}")
                continue
            if done.returncode != 0:
                raise RuntimeError(f"ptxas ({ptxas}) rejected the PTX:\n{done.stderr}")
            return _parse_usage(done.stderr + done.stdout)
    raise PtxasUnavailable("; ".join(refused))


def _parse_usage(text):
    registers = re.search(r"Used (\d+) registers", text)
    frame = re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text
    )
    if registers is None or frame is None:
        raise RuntimeError(f"unexpected ptxas output:\n{text}")
    return Usage(int(registers.group(1)), *(int(g) for g in frame.groups()))


def shared_load_widths(ptx):
    """How many shared-memory loads of each width the PTX has: {"v4": n, "v2": n, "scalar": n}."""
    loads = re.findall(r"\bld\.shared(\.v[24])?\.", ptx)
    return {
        "v4": sum(w == ".v4" for w in loads),
        "v2": sum(w == ".v2" for w in loads),
        "scalar": sum(w == "" for w in loads),
    }


def main(argv=None):
    """Print the register/spill table of :func:`kernel_cases`."""
    import importlib.metadata

    import numba

    try:
        numba_cuda = "numba-cuda " + importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        numba_cuda = "numba's bundled numba.cuda"
    cases = kernel_cases()
    try:
        isa = re.search(r"^\.version (\S+)", compile_ptx(cases[-1]), re.M).group(1)
    except Exception as exc:  # the table says what is missing
        isa = f"unavailable ({type(exc).__name__}: {exc})"
    print(f"numba {numba.__version__}, {numba_cuda}, PTX ISA {isa}, sm_{CC[0]}{CC[1]}")
    print(f"ptxas candidates: {', '.join(ptxas_candidates()) or 'none'}")
    header = f"{'kernel':<44s} {'regs':>5s} {'stack':>6s} {'spill st':>9s} {'spill ld':>9s}"
    print(header + f" {'ld.shared v4/v2/1':>18s}")
    for case in cases:
        try:
            ptx = compile_ptx(case)
            widths = shared_load_widths(ptx)
            loads = f"{widths['v4']}/{widths['v2']}/{widths['scalar']}"
            u = assemble(ptx)
            print(
                f"{case.name:<44s} {u.registers:>5d} {u.stack:>6d} {u.spill_stores:>9d}"
                f" {u.spill_loads:>9d} {loads:>18s}",
                flush=True,
            )
        except Exception as exc:  # one failed kernel does not stop the table
            print(f"{case.name:<44s} FAILED: {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
