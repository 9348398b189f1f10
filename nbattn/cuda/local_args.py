"""The moves of the local-polynomial GPU kernels' arrays to the device.

The argument groups, codes and design size they take are defined once in
``nbattn._core.local_groups``, for the CUDA kernels and their CPU twins.

The host wrappers read the groups' fields, with NumPy or device arrays;
:func:`device_inputs` moves the arrays that every launch reads to the GPU once.
"""

from __future__ import annotations

import numpy as np

from .._core.local_groups import BlockRuns
from .common import threads_for, to_device
from .local_pairs import KEY_STRETCH, NO_STRETCH, QUERY_STRETCH


def device_inputs(data, model):
    """The arrays every launch reads, on the device and in the launched kernels' order:
    (q_cont, keys_cont_t, q_cat, keys_cat_t, cat_params, log_weights, q_stretch,
    keys_stretch_t), the last two the stretches of nearest-neighbour widths, (0, 0) where
    there are none (None in ``data``: :func:`stretch_kind`)."""
    stretches = tuple(np.zeros((0, 0)) if a is None else a for a in data[5:7])  # None: fixed
    arrays = (data.q_cont, data.keys_cont_t, data.q_cat, data.keys_cat_t)
    arrays += (model.cat_params, data.log_weights, *stretches)
    return tuple(
        to_device(np.ascontiguousarray(a, dtype=np.float64) if isinstance(a, np.ndarray) else a)
        for a in arrays
    )


def stretch_kind(inputs):
    """The compile-time stretch flag of :func:`device_inputs`'s arrays
    (``local_pairs``): ``QUERY_STRETCH`` where the queries have stretches,
    ``KEY_STRETCH`` where the keys have, else ``NO_STRETCH`` (at most one of the two)."""
    q_cont, keys_cont_t, q_stretch, keys_stretch_t = inputs[0], inputs[1], inputs[6], inputs[7]
    per_query, per_key = q_stretch.shape[0] > 0, keys_stretch_t.shape[1] > 0
    if per_query and per_key:
        raise ValueError("nearest-neighbour widths stretch the queries or the keys, not both")
    if per_query and q_stretch.shape != q_cont.shape:
        raise ValueError(f"q_stretch is {q_stretch.shape}, the queries {q_cont.shape}")
    if per_key and keys_stretch_t.shape != keys_cont_t.shape:
        raise ValueError(f"keys_stretch_t is {keys_stretch_t.shape}, the keys {keys_cont_t.shape}")
    if per_query:
        return QUERY_STRETCH
    return KEY_STRETCH if per_key else NO_STRETCH


def host_array(a, dtype=np.float64):
    """A NumPy or device array as a C-contiguous NumPy array of ``dtype``."""
    return np.ascontiguousarray(a if isinstance(a, np.ndarray) else a.copy_to_host(), dtype=dtype)


def key_runs(leaves, n_q, n_k):
    """``(threads, (block_table, key_runs))`` of a launch over n_q queries: the threads per
    block and the key ranges each block visits, on the device (``local_pairs.key_walk_function``).
    ``leaves``: a ``BlockRuns`` (the pruned leaves' runs, at its block size), or None /
    ``AllKeys`` / rtol = 0 (every key in one run, at the launch's usual block size)."""
    if isinstance(leaves, BlockRuns):
        expected = -(-n_q // leaves.block_size)
        if leaves.block_runs.shape[0] != expected:
            raise ValueError(
                f"the key runs are for {leaves.block_runs.shape[0]} blocks of "
                f"{leaves.block_size} queries, not {n_q} queries"
            )
        table, runs = leaves.block_runs, leaves.runs
        threads = int(leaves.block_size)
    else:
        if leaves is not None and getattr(leaves, "rtol", 0.0) > 0:
            raise TypeError(
                "the GPU passes take pruned leaves as BlockRuns "
                "(nbattn.local.leaves.TreeLayout.leaves_on)"
            )
        threads = threads_for(n_q)
        table = np.zeros((max(-(-n_q // threads), 1), 2), dtype=np.int64)
        table[:, 1] = 1
        runs = np.array([[0, n_k]], dtype=np.int64)
    return threads, (to_device(np.ascontiguousarray(table)), to_device(np.ascontiguousarray(runs)))
