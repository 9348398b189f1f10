"""The moves of the local-polynomial GPU kernels' arrays to the device.

The argument groups, codes and design size they take are defined once in
``nbattn._core.local_groups``, for the CUDA kernels and their CPU twins.

The host wrappers read the groups' fields, with NumPy or device arrays;
:func:`device_inputs` moves the arrays that every launch reads to the GPU once.
"""

from __future__ import annotations

import numpy as np

from .common import to_device


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


def refuse_pruning(leaves):
    """The GPU passes visit every key: ``leaves`` is ``AllKeys`` or says rtol = 0."""
    if leaves is not None and getattr(leaves, "rtol", 0.0) > 0:
        raise NotImplementedError(
            "rtol > 0 (pruned local passes) runs on the CPU only; use device='cpu' or rtol=0"
        )
