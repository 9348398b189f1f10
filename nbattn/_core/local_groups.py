"""The argument groups of the local-polynomial kernels, their codes and their design size.

Every kernel of ``nbattn.kernels.local`` and its CUDA twin ``nbattn.cuda.local``
takes its inputs in three typed groups instead of a long row of positional
arguments, defined once here for both sides (plain data: ``_core`` is the
floor both ``kernels/`` and ``cuda/`` stand on):

* :class:`LocalData`, the problem's data layout: the queries and the keys
  (continuous columns scaled by their widths, categorical codes as floats),
  the keys' log sample weights, and the stretches of nearest-neighbour widths
  (a width per query or per key; empty for fixed widths);
* :class:`LocalModel`, how pairs are weighed and fitted: the continuous
  kernel's code, the categorical columns' score terms (from their widths),
  the degree and the relative ridge of the local fit, and the pair flags
  ``exclude_self`` and ``missing``;
* :class:`LocalFit`, the first pass's outputs, which the second passes read;
* :class:`LocalLeaves`, the keys' k-d leaves and ``rtol``: which keys a pass may
  skip (``nbattn.kernels.local_leaves``), or :class:`AllKeys` where every
  query visits every key (rtol = 0): a type of its own, so that the exact passes
  compile without the pruning code;
* :class:`BlockRuns`, the GPU's form of the pruned leaves: the key ranges each block
  of queries visits, computed on the host from a ``LocalLeaves`` by the CPU's rule.

They are ``NamedTuple`` classes, which numba types as tuples (one compiled
specialisation per combination of field types, so the scalars keep one type
each: ``kernel`` and ``degree`` ints, the flags bools, ``ridge`` a float).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .columns import CONTINUOUS_KERNELS

#: Continuous kernels by name (``columns.CONTINUOUS_KERNELS``) -> the code the kernels take.
KERNEL_CODES = {name: code for code, name in enumerate(CONTINUOUS_KERNELS)}
GAUSSIAN, EPANECHNIKOV, TRICUBE = (KERNEL_CODES[n] for n in ("gaussian", "epanechnikov", "tricube"))

#: The distribution kernels' categorical column kinds (``cat_kind``, CPU and GPU).
UNORDERED, ORDERED = 0, 1

#: The conditional quantiles' root-finder (CPU and GPU): at most this many steps per
#: level, and a bracket within this relative width of its ends (4 ulp) counts as closed.
QUANTILE_MAX_STEPS = 400
QUANTILE_ULPS = 4e-16


class LocalData(NamedTuple):
    """The problem's data layout (C-contiguous float64 arrays)."""

    #: (n_q, dc) the queries' continuous columns, divided by their widths
    q_cont: np.ndarray
    #: (dc, n_k) the keys' continuous columns, scaled the same way, feature-major
    keys_cont_t: np.ndarray
    #: (n_q, dk) the queries' categorical codes
    q_cat: np.ndarray
    #: (dk, n_k) the keys' categorical codes, feature-major
    keys_cat_t: np.ndarray
    #: (n_k,) log sample weight of each key (-inf leaves it out, 0 everywhere: unweighted)
    log_weights: np.ndarray
    #: (n_q, dc) per query and continuous column, the factor r by which the kernel's argument
    #: is stretched, K(r d) (generalised nearest-neighbour widths, ``nbattn.local.neighbours``:
    #: r = h / h(q)); shape (0, 0) where no query is stretched. None for fixed widths on the
    #: CPU: a type of its own, so the fixed-width kernels compile without the stretched
    #: code (``kernels.local_pairs.stretched_terms``); the GPU's host code reads None as (0, 0)
    q_stretch: np.ndarray | None
    #: (dc, n_k) the same per key (adaptive nearest-neighbour widths: r = h / h_j); (0, 0)
    #: where no key is stretched, None with ``q_stretch``. The design rows keep the
    #: unstretched differences d.
    keys_stretch_t: np.ndarray | None


class LocalModel(NamedTuple):
    """How the pairs are weighed and the local design fitted."""

    #: (dk, 3) per categorical column (a, b, t): the term is a for equal codes, else b + t |q - k|
    cat_params: np.ndarray
    #: the continuous kernel: GAUSSIAN, EPANECHNIKOV or TRICUBE
    kernel: int
    #: 0, 1 or 2: the local design's degree
    degree: int
    #: the relative ridge R of the local solve
    ridge: float
    #: skip the pair (i, i): the leave-one-out fit when the queries are the keys
    exclude_self: bool
    #: NaN entries may occur: their column's term is left out of the pair
    missing: bool


class LocalFit(NamedTuple):
    """The first pass's outputs (``local_fit``), the second passes' state."""

    #: (n_q, p, n_out) coefficients in scaled units (beta[:, 0] is the fit)
    beta: np.ndarray
    #: (n_q, p) (M/l + R)^-1 e_1, the equivalent-kernel vector
    g: np.ndarray
    #: (n_q,) the running maximum m of the scores
    shift: np.ndarray
    #: (n_q,) log l = log sum_j exp(s_j - m); -inf where the fit fell back to a nearest key
    log_norm: np.ndarray
    #: (n_q,) int64 the fallback key, else -1
    nearest: np.ndarray
    #: (n_q, dc, n_out) the local-constant marginal effects d fit / d q (zeros unless asked)
    mfx: np.ndarray


class AllKeys(NamedTuple):
    """The exact passes' leaves: every query visits every key, in the keys' order."""

    #: (n_chunks + 1,) int64 the first query of each chunk of a pass, then n_q
    query_start: np.ndarray


class LocalLeaves(NamedTuple):
    """The keys' leaves in k-d order and the tolerance of the pruned passes
    (``nbattn.kernels.local_leaves``); rtol = 0 with one leaf: every key, exactly."""

    #: (n_chunks + 1,) int64 the first query of each chunk the passes bound together, then n_q
    query_start: np.ndarray
    #: (n_leaves + 1,) int64 the first key of each leaf, then n_k
    leaf_start: np.ndarray
    #: (n_leaves, dc) the lower corner of each leaf's box of scaled continuous columns
    box_lo: np.ndarray
    #: (n_leaves, dc) its upper corner
    box_hi: np.ndarray
    #: (n_leaves, dk) the smallest code of each categorical column in the leaf
    cat_lo: np.ndarray
    #: (n_leaves, dk) the largest
    cat_hi: np.ndarray
    #: (n_leaves,) the largest log key weight in the leaf
    log_weight_max: np.ndarray
    #: (n_leaves,) the smallest
    log_weight_min: np.ndarray
    #: (n_leaves,) log of the leaf's key count, widened by the bounds' rounding margin
    log_size: np.ndarray
    #: the relative error allowed on every kernel sum (0: exact)
    rtol: float


class BlockRuns(NamedTuple):
    """The pruned leaves as the GPU passes read them: for each block of ``block_size``
    consecutive queries (one thread each, in k-d order), the runs of keys it visits,
    ``runs[block_runs[b, 0] : block_runs[b, 1]]``, each run a key range [start, stop).
    The host computes them from a :class:`LocalLeaves` with the CPU's rule, a block of
    queries bounded together as the CPU bounds a chunk (``kernels.local_leaves.block_runs``),
    so every kernel sum keeps the same ``rtol`` contract."""

    #: the queries per block, the launch's threads per block
    block_size: int
    #: (n_blocks, 2) int64 each block's first run and the end of its runs
    block_runs: np.ndarray
    #: (n_runs, 2) int64 key ranges [start, stop)
    runs: np.ndarray
    #: the relative error allowed on every kernel sum
    rtol: float


def n_terms(dc, degree):
    """Number of terms of the local design: 1, 1 + dc, or 1 + dc + dc (dc + 1) / 2
    (the constant, the dc differences, the products d_c d_c' for c <= c')."""
    if degree == 0 or dc == 0:
        return 1
    if degree == 1:
        return 1 + dc
    return 1 + dc + dc * (dc + 1) // 2
