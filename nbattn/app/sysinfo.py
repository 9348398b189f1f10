"""What ``nbattn info`` reports: versions, threading, tile sizes, the CUDA driver and
libraries numba-cuda finds, Parquet support and the model file format.

Nothing here needs a GPU or fails without one: every probe answers "not found"
with numba-cuda's reason instead of raising.
"""

from __future__ import annotations


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
    from ..dispatch.device import cuda_libraries, cuda_problem
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
