"""Checks of sequence lengths: the integer inputs of varlen and decoding.

The same wording as ``nbattn._core.validation`` (messages start with the
argument's name, and name the entry); every check returns a new array.
"""

from __future__ import annotations

import numbers

import numpy as np


def as_lengths(x, name: str, n: int | None = None) -> np.ndarray:
    """A checked int64 copy of a 1-D array of non-negative integers (``n`` entries if given).

    Integer dtypes only (bools, floats and strings are refused, even 3.0: a
    length is a count, and a float there is a caller's mistake).
    """
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an array of integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} must have {n} entries (one per batch row), got {arr.shape[0]}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds values beyond the int64 range")
    out = np.array(arr, dtype=np.int64, copy=True)
    negative = np.flatnonzero(out < 0)
    if negative.size:
        i = int(negative[0])
        raise ValueError(f"{name} must be non-negative; {name}[{i}] = {out[i]}")
    return out


def as_cu_seqlens(x, name: str, total: int) -> np.ndarray:
    """Cumulative sequence lengths: int64 (n_seqs + 1,), 0, non-decreasing, ending at ``total``.

    ``total`` is the length of the packed sequence axis of the array the
    offsets index (q's for ``cu_seqlens_q``, k's for ``cu_seqlens_k``).
    """
    cu = as_lengths(x, name)
    if cu.shape[0] < 2:
        raise ValueError(
            f"{name} must have n_seqs + 1 >= 2 entries (offsets 0, ..., total), got {cu.shape[0]}"
        )
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {cu[0]}")
    drops = np.flatnonzero(np.diff(cu) < 0)
    if drops.size:
        i = int(drops[0])
        raise ValueError(
            f"{name} must be non-decreasing; {name}[{i + 1}] = {cu[i + 1]} < {name}[{i}] = {cu[i]}"
        )
    if cu[-1] != total:
        raise ValueError(f"{name} must end at the packed length {total}, got {name}[-1] = {cu[-1]}")
    return cu


def check_max_seqlen(value, name: str, lengths: np.ndarray) -> int:
    """``max_seqlen_q`` / ``max_seqlen_k``: None, or an int at least the longest sequence."""
    longest = int(lengths.max()) if lengths.size else 0
    if value is None:
        return longest
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer or None, got {value!r}")
    if value < longest:
        raise ValueError(f"{name}={value} is below the longest sequence, {longest}")
    return int(value)
