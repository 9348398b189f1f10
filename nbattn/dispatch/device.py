"""Which device runs a computation ("cpu", "cuda" or "auto"), the one dispatch table, and
what numba-cuda finds on this machine."""

from __future__ import annotations

from .._core.validation import check_choice
from .transfer import is_device_array

_DEVICES = ("cpu", "cuda", "auto")


_NO_GPU = (
    "device='cuda' needs a CUDA GPU with its driver and numba-cuda "
    "(pip install 'nbattn[cuda]'); numba found no usable GPU here. "
    "Use device='cpu' or device='auto'."
)


def _numba_sees_gpu() -> bool:
    """True when numba can see a usable CUDA GPU, or runs the CUDA simulator (never raises)."""
    try:
        from numba import cuda
    except Exception:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def cuda_problem() -> str | None:
    """Why ``device="cuda"`` cannot run here, as a sentence that names the fix; None
    when it can (never raises).

    Either numba sees no GPU, or it sees one but numba-cuda cannot compile
    kernels with the installed NumPy (``nbattn.cuda.compat``: numba-cuda 0.30.4
    with NumPy 2.5); the latter is checked once per process, only where a GPU is.
    """
    if not _numba_sees_gpu():
        return _NO_GPU
    try:
        from ..cuda.compat import numpy_problem

        return numpy_problem()
    except Exception:  # the check itself must never stand in the way
        return None


def cuda_available() -> bool:
    """True when CUDA kernels can run here: numba sees a usable GPU (or runs the CUDA
    simulator) and numba-cuda can compile with this NumPy (never raises)."""
    return cuda_problem() is None


def resolve_device(device: str) -> str:
    """Map a requested device to the one that runs: "auto" picks CUDA when a GPU is there.

    "cuda" where CUDA cannot run raises a ValueError that says what is missing
    (:func:`cuda_problem`). "auto" falls back to the CPU: silently without a
    GPU, with a ``RuntimeWarning`` that says why when a GPU is there but
    numba-cuda cannot compile with this NumPy.
    """
    check_choice(device, "device", _DEVICES)
    if device == "cpu":
        return "cpu"
    problem = cuda_problem()
    if problem is None:
        return "cuda"
    if device == "auto":
        if problem != _NO_GPU:
            import warnings

            warnings.warn(f"{problem} Running on the CPU.", RuntimeWarning, stacklevel=2)
        return "cpu"
    raise ValueError(problem)


#: The one dispatch table: (op, device) -> the module that implements ``op``
#: there. CPU modules live in ``nbattn.kernels``, their CUDA twins (same
#: function contracts) in ``nbattn.cuda``; both are imported on first use, so
#: importing nbattn never needs numba-cuda or a GPU. An op's module is its entry:
#: it may take part of its names from modules of one algorithm each (``loo_tiles``
#: provides ``kd_order`` and ``leaf_boxes`` of ``kernels.kd_order``, and runs the
#: fused passes of ``kernels.loo_fused``). ``loo`` holds the LOO loss, gradients
#: and spread, ``loo_1d`` the CPU-only kernels of the 1-D width search.
KERNELS = {
    ("pooling", "cpu"): "nbattn.kernels.pooling",
    ("pooling", "cuda"): "nbattn.cuda.pooling",
    ("pooling_gemm", "cpu"): "nbattn.kernels.pooling_gemm",
    ("tree_pool", "cpu"): "nbattn.kernels.tree_pool",
    ("loo", "cpu"): "nbattn.kernels.loo",
    ("loo", "cuda"): "nbattn.cuda.loo",
    ("flash", "cpu"): "nbattn.kernels.flash",
    ("flash", "cuda"): "nbattn.cuda.flash",
    ("flex", "cpu"): "nbattn.kernels.flex_build",
    ("flex", "cuda"): "nbattn.cuda.flex",
    ("masks", "cpu"): "nbattn.kernels.masks",
    ("scores", "cpu"): "nbattn.kernels.scores",
    ("softmax", "cpu"): "nbattn.kernels.softmax",
    ("local", "cpu"): "nbattn.kernels.local",
    ("local_ties", "cpu"): "nbattn.kernels.local_ties",
    ("loo_tiles", "cpu"): "nbattn.kernels.loo_tiles",
    ("loo_1d", "cpu"): "nbattn.kernels.loo_1d",
    ("local", "cuda"): "nbattn.cuda.local",
    ("density", "cpu"): "nbattn.kernels.density",
    ("density", "cuda"): "nbattn.cuda.density",
    ("decode", "cpu"): "nbattn.kernels.decode",
    ("decode", "cuda"): "nbattn.cuda.decode",
    ("varlen", "cpu"): "nbattn.kernels.varlen",
    ("varlen", "cuda"): "nbattn.cuda.varlen",
    ("layout", "cuda"): "nbattn.cuda.layout",
}


def kernels_for(op: str, device: str):
    """The kernel module for ``op`` on ``device`` ("cpu", "cuda" or "auto").

    ``device`` is resolved here (:func:`resolve_device`), so this is the one
    place where nbattn chooses between CPU and GPU.
    """
    import importlib

    resolved = resolve_device(device)
    try:
        name = KERNELS[(op, resolved)]
    except KeyError:
        ops = sorted({o for o, _ in KERNELS})
        if op not in ops:
            raise ValueError(f"unknown kernel op {op!r}; known: {ops}") from None
        raise ValueError(f"{op!r} has no {resolved} kernels; use device='cpu'") from None
    return importlib.import_module(name)


def device_for(device: str, *arrays) -> str:
    """The device ("cpu" or "cuda") that runs a call with these arrays.

    GPU arrays (see :func:`is_device_array`) need ``device="cuda"`` or
    ``"auto"`` and run on the GPU; host arrays follow :func:`resolve_device`
    ("auto" picks the GPU when numba sees one; "cuda" without one raises).
    """
    if any(is_device_array(a) for a in arrays):
        check_choice(device, "device", _DEVICES)
        if device == "cpu" or resolve_device("cuda") != "cuda":
            raise ValueError(f"GPU arrays need device='cuda' or 'auto', got device={device!r}")
        return "cuda"
    return resolve_device(device)


#: The dynamic libraries numba-cuda loads to compile and run kernels.
CUDA_LIBRARIES = ("nvvm", "nvrtc", "cudart")


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def cuda_libraries() -> dict:
    """``{"driver": ..., "nvvm": ..., "nvrtc": ..., "cudart": ..., "cudadevrt": ...}``: for
    each, where numba-cuda found it ("found at PATH") or why not ("not found: REASON").

    The same look-ups as ``numba -s`` / ``numba.cuda.cudadrv.libs.test()``,
    without printing.
    """
    try:
        from numba.cuda.cudadrv import libs
    except Exception as exc:  # no numba-cuda, or a broken install
        return {"numba-cuda": f"not available: {_reason(exc)}"}
    found = {}
    try:
        loader, candidates = libs.locate_driver_and_loader()
        _, path = libs.load_driver(loader, candidates)
        found["driver"] = f"found at {path}"
    except Exception as exc:
        found["driver"] = f"not found: {_reason(exc)}"
    for lib in CUDA_LIBRARIES:
        try:
            libs.open_cudalib(lib)
            found[lib] = f"found at {libs.get_cudalib(lib)}"
        except Exception as exc:
            found[lib] = f"not found: {_reason(exc)}"
    try:
        path = libs.get_cudalib("cudadevrt", static=True)
        libs.check_static_lib(path)
        found["cudadevrt"] = f"found at {path}"
    except Exception as exc:
        found["cudadevrt"] = f"not found: {_reason(exc)}"
    return found
