"""Whether the installed numba-cuda can compile kernels with the installed NumPy.

numba-cuda loads its NumPy support (``numba.cuda.np.arrayobj``, through
``npyimpl``) when it builds its CUDA target context, at the first kernel
compile, and that module registers overloads of NumPy functions by attribute
(``overload(np.row_stack)``). NumPy 2.5 removed ``np.row_stack``; numba-cuda
0.30.4 (the newest release at the time of writing) still registers it for
every NumPy >= 2.0, so with NumPy 2.5 every first compile fails deep inside
numba-cuda with ``AttributeError: module 'numpy' has no attribute
'row_stack'``. numba itself (0.67 and later) guards that overload with
``numpy < 2.5``; the same guard was proposed to numba-cuda and closed
unmerged, numba-cuda being in maintenance mode.

nbattn does not patch NumPy back: an alias ``numpy.row_stack = numpy.vstack``
would let the import pass, but it is not numba-cuda's fix (a version guard)
and it would change NumPy for every other library in the process. Instead
:func:`numpy_problem` builds numba-cuda's target context once, up front (what
the first compile does, in the same order), and turns that failure into a
sentence that names the cause and the fix; the device layer
(``nbattn.dispatch.device``) raises it for ``device="cuda"`` and falls back to the
CPU, with a warning, for ``device="auto"``.

Imports numba only; needs no GPU. The simulator (``NUMBA_ENABLE_CUDASIM=1``)
builds no target context, so it has no such problem.
"""

from __future__ import annotations

import functools


def _version(distribution):
    """The installed version of ``distribution`` ("?" when unknown)."""
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return "?"


def _build_target_context():
    """numba-cuda's CUDA target context, with every registry loaded (what the first
    compile builds)."""
    from numba.cuda.descriptor import cuda_target

    cuda_target.target_context.refresh()


@functools.lru_cache(maxsize=1)
def numpy_problem() -> str | None:
    """Why numba-cuda cannot compile kernels with this NumPy, or None when it can.

    An ``AttributeError`` about the ``numpy`` module while numba-cuda builds its
    target context means that this numba-cuda refers to a NumPy function this
    NumPy no longer has. Any other failure there is not this problem (the
    first compile reports it as it is): None. Computed once per process.
    """
    import numpy as np
    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:
        return None
    try:
        _build_target_context()
    except AttributeError as exc:
        if "'numpy'" not in str(exc):
            return None
        return describe_numpy_problem(str(exc), _version("numba-cuda"), np.__version__)
    except Exception:
        return None
    return None


def describe_numpy_problem(error, numba_cuda_version, numpy_version):
    """The sentence for a numba-cuda whose target context fails with ``error`` (an
    AttributeError's message) under this NumPy: the cause, then the fix."""
    cause = (
        f"numba-cuda {numba_cuda_version} cannot compile CUDA kernels with numpy "
        f"{numpy_version}: loading its NumPy support fails with AttributeError: {error}"
    )
    if "row_stack" in error:
        cause += (
            " (NumPy 2.5 removed np.row_stack, which numba-cuda 0.30.4 and earlier still register)"
        )
        fix = "install numpy<2.5 (pip install 'numpy<2.5') or a numba-cuda that supports numpy 2.5"
    else:
        fix = (
            "install an older numpy that this numba-cuda supports, or a numba-cuda that "
            f"supports numpy {numpy_version}"
        )
    return f"{cause}. To use the GPU, {fix}; or use device='cpu'."
