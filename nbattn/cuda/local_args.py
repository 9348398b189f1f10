"""The argument groups of the local-polynomial GPU kernels, their codes and their design size.

The twin of ``nbattn.kernels.local_args``, whose docstring describes the
groups: the same classes, fields and codes (the layer rules keep ``cuda/``
from importing ``kernels/``; ``tests/test_twins.py`` checks that they agree).
The host wrappers read the groups' fields, so they take either module's
groups, with NumPy or device arrays; :func:`device_inputs` moves the arrays
that every launch reads to the GPU once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .common import to_device

GAUSSIAN, EPANECHNIKOV, TRICUBE = 0, 1, 2
#: Continuous kernels by name -> the code the kernels take.
KERNEL_CODES = {"gaussian": GAUSSIAN, "epanechnikov": EPANECHNIKOV, "tricube": TRICUBE}


class LocalData(NamedTuple):
    """The problem's data layout (float64; see ``nbattn.kernels.local_args``)."""

    q_cont: np.ndarray
    keys_cont_t: np.ndarray
    q_cat: np.ndarray
    keys_cat_t: np.ndarray
    log_weights: np.ndarray


class LocalModel(NamedTuple):
    """How the pairs are weighed and the local design fitted (``nbattn.kernels.local_args``)."""

    cat_params: np.ndarray
    kernel: int
    degree: int
    ridge: float
    exclude_self: bool
    missing: bool


class LocalFit(NamedTuple):
    """The first pass's outputs, NumPy arrays (``nbattn.kernels.local_args``)."""

    beta: np.ndarray
    g: np.ndarray
    shift: np.ndarray
    log_norm: np.ndarray
    nearest: np.ndarray
    mfx: np.ndarray


def n_terms(dc, degree):
    """Terms of the local design: 1, 1 + dc, or 1 + dc + dc (dc + 1) / 2."""
    if degree == 0 or dc == 0:
        return 1
    if degree == 1:
        return 1 + dc
    return 1 + dc + dc * (dc + 1) // 2


def device_inputs(data, model):
    """The arrays every launch reads, on the device and in the launched kernels' order:
    (q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights)."""
    arrays = (data.q_cont, data.keys_cont_t, data.q_cat, data.keys_cat_t)
    arrays += (model.cat_params, data.log_weights)
    return tuple(
        to_device(np.ascontiguousarray(a, dtype=np.float64) if isinstance(a, np.ndarray) else a)
        for a in arrays
    )


def host_array(a, dtype=np.float64):
    """A NumPy or device array as a C-contiguous NumPy array of ``dtype``."""
    return np.ascontiguousarray(a if isinstance(a, np.ndarray) else a.copy_to_host(), dtype=dtype)
