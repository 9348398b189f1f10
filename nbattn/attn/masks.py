"""Attention masks as additive biases, and the softmax-invariant shift of huge ones.

A mask follows torch's SDPA convention: boolean True where a query may attend
to a key, float values added to the scores (``-inf`` excludes). Every entry
(softmax, attention, multi-head, flash) turns it into an additive float array
with :func:`mask_as_bias`; biases too large for the computation's dtype are
brought back by :func:`shift_rows`, which subtracts each row's maximum
(softmax(x - c) = softmax(x) for a constant c per row).
"""

from __future__ import annotations

import numpy as np

from .._core.validation import as_float_array

__all__ = ["mask_as_bias", "mask_input", "shift_rows"]


def mask_input(mask, shape=None, name="mask") -> np.ndarray | None:
    """A boolean or float mask as an array (..., LM, SM), checked for its kind and shape only.

    What :func:`mask_as_bias` checks before it converts anything: boolean
    masks stay boolean and float32 / float64 masks keep their values (other
    floats become float64); the entries are not read (the flash path turns
    them into its base-2 form in one pass that also refuses NaN and +inf:
    ``nbattn.attn.flash_args.mask_arrays``). The result is C-contiguous and
    writeable, a view of ``mask`` where it already is. 0-D and 1-D masks gain
    leading axes of 1; ``mask=None`` gives None.
    """
    if mask is None:
        return None
    try:
        arr = np.asarray(mask)
    except Exception as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if arr.dtype.kind == "f" and arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    elif arr.dtype.kind not in "bf":
        raise ValueError(
            f"{name} must be boolean (True = attend) or float (added to the scores), "
            f"got dtype {arr.dtype}"
        )
    if arr.ndim < 2:
        arr = arr.reshape((1,) * (2 - arr.ndim) + arr.shape)
    if shape is not None:
        n_q, n_k = shape
        if arr.shape[-2] not in (1, n_q) or arr.shape[-1] not in (1, n_k):
            raise ValueError(
                f"{name} has shape {np.shape(mask)}, which does not broadcast to (..., L, S) = "
                f"(..., {n_q}, {n_k})"
            )
    if not (arr.flags.c_contiguous and arr.flags.writeable and arr.dtype.isnative):
        arr = np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C")
    return arr


def mask_as_bias(
    mask, shape=None, name="mask", dtype=np.float64, float_dtype=None
) -> np.ndarray | None:
    """A boolean (True = may attend) or float (added) mask as a float (..., LM, SM) array.

    A boolean mask becomes 0 / -inf in ``dtype`` (exact); a float mask is
    checked (-inf excludes; NaN and +inf are refused) and kept in its own
    float32 or float64, or converted to ``float_dtype``. 0-D and 1-D masks
    gain leading axes of 1. ``mask=None`` gives None.

    Parameters
    ----------
    mask : array_like of bool or float, or None
    shape : (L, S), optional
        When given, the last two axes must be 1 or L, and 1 or S.
    name : str
        The argument named in every ValueError.
    dtype : numpy float type
        The dtype of a boolean mask's bias.
    float_dtype : numpy float type, optional
        The dtype of a float mask's bias; None keeps float32 and float64 (and
        turns other floats into float64).
    """
    arr = mask_input(mask, shape, name)  # its kind and shape
    if arr is None:
        return None
    if arr.dtype.kind == "b":
        return np.where(arr, dtype(0.0), dtype(-np.inf))
    return as_float_array(arr, name, dtype=float_dtype, allow_neg_inf=True)


def shift_rows(z, admissible=None):
    """``z - max`` along the last axis over the admissible entries (a softmax-invariant shift).

    Rows without an admissible finite entry are left as they are. Called only
    when the values are too large for the computation's dtype; entries that
    fall below the float64 range become -inf, which is their weight (0)
    relative to the row's maximum.
    """
    considered = z if admissible is None else np.where(admissible, z, -np.inf)
    top = considered.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        return z - top
