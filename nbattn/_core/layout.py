"""Host array layouts for the kernels: flattened batches, feature-major keys, un-broadcasting.

The functional layer checks arrays with ``nbattn._core.validation`` and lays them
out here; the kernels trust these layouts (C-contiguous, one dtype).
"""

from __future__ import annotations

import numpy as np


def flat_batch(x: np.ndarray, batch: tuple[int, ...], dtype=None) -> np.ndarray:
    """(..., A, B) broadcast to ``batch + (A, B)``, as a C-contiguous (prod(batch), A, B) copy."""
    full = np.broadcast_to(x, tuple(batch) + x.shape[-2:])
    return np.array(full.reshape((-1,) + x.shape[-2:]), dtype=dtype or x.dtype, order="C")


def feature_major(x: np.ndarray) -> np.ndarray:
    """(B, S, E) -> C-contiguous (B, E, S): the score kernels' key layout."""
    return np.ascontiguousarray(np.swapaxes(x, 1, 2))


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the leading dimensions that broadcasting added to ``shape``."""
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape[:-2]) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(shape)
