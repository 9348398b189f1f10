"""The local-polynomial kernels' argument groups and codes (``nbattn._core.local_groups``,
one definition for the CPU kernels and their CUDA twins), and their design size as a
kernel function."""

from __future__ import annotations

from numba import njit

from .. import config
from .._core import local_groups
from .._core.local_groups import (  # noqa: F401  (the kernels' names for them)
    EPANECHNIKOV,
    GAUSSIAN,
    KERNEL_CODES,
    TRICUBE,
    LocalData,
    LocalFit,
    LocalModel,
)

#: ``local_groups.n_terms`` compiled, inlined into the kernels (also callable from Python).
n_terms = njit(fastmath=config.FASTMATH, cache=config.CACHE, inline="always")(local_groups.n_terms)
