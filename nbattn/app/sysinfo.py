"""What ``nbattn info`` reports: versions, threading, tile sizes, the CUDA driver and
libraries numba-cuda finds, Parquet support and the model file format.

Nothing here needs a GPU or fails without one: every probe answers "not found"
with numba-cuda's reason instead of raising.
"""

from __future__ import annotations

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


def _cuda_lines(problem: str | None) -> list[str]:
    """Whether CUDA kernels can run here and, when not, why."""
    if problem is None:
        return ["CUDA usable: True"]
    return ["CUDA usable: False", f"  why: {problem}"]


def info_lines() -> list[str]:
    """The lines ``nbattn info`` prints."""
    import numba
    import numpy as np

    from .. import config
    from .._core.version import __version__
    from ..dispatch.device import cuda_problem
    from . import io

    threads = numba.config.NUMBA_NUM_THREADS
    lines = [
        f"nbattn {__version__}",
        f"numpy {np.__version__}, numba {numba.__version__}",
        f"threading layer: {numba.config.THREADING_LAYER}, threads: {threads}",
        f"key block: {config.KEY_BLOCK}, query block: {config.QUERY_BLOCK}",
        *_cuda_lines(cuda_problem()),
        "CUDA libraries (numba-cuda):",
        *(f"  {name}: {where}" for name, where in cuda_libraries().items()),
    ]
    try:
        import pyarrow

        parquet = f"yes (pyarrow {pyarrow.__version__})"
    except ImportError:
        parquet = "no (pip install 'nbattn[parquet]')"
    lines.append(f"Parquet: {parquet}")
    lines.append(f"model file format: {io.FORMAT_NAME} version {io.FORMAT_VERSION}")
    return lines
