"""The local-polynomial kernels' design size as a kernel function.

The argument groups and codes the kernels take (``LocalData``, ``LocalModel``,
``LocalFit``, ``GAUSSIAN`` ...) are defined once in ``nbattn._core.local_groups``,
for the CPU kernels and their CUDA twins; the kernels import them from there.
"""

from __future__ import annotations

from numba import njit

from .. import config
from .._core import local_groups

#: ``local_groups.n_terms`` compiled, inlined into the kernels (also callable from Python).
n_terms = njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")(local_groups.n_terms)
