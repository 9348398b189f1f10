"""Positional encodings for self-attention (the attention chapter, self-attention with positions).

Self-attention alone ignores order: alpha_ij depends only on q_i and k_j.
Two families fix that (the text's two choices):

* absolute encodings added to the inputs: :func:`sinusoidal` (Vaswani et al.
  2017 / d2l) and a learned table (:func:`learned`), both applied with
  :func:`add_positions`;
* relative encodings that change the scores: :func:`rope` (rotary, Su et al.
  2021) rotates q and k so that q_i . k_j depends on i - j; :func:`alibi_bias`
  (Press et al. 2022) and :func:`relative_position_bias` (Shaw et al. 2018's
  clipped relative positions, as a scalar bias per offset) are additive masks.

Every bias returned here is a float array to pass as ``mask=`` to
``nbattn.attention`` or to ``MultiHeadAttention.forward`` ((H, L, S) biases
broadcast over the head axis of (..., H, L, S) scores); :func:`rope` is applied
to the per-head queries and keys (``MultiHeadAttention(rotary_base=...)`` does
so itself).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._core.validation import (
    as_float_array,
    check_bool,
    check_dtype,
    check_positive_float,
    check_positive_int,
)

__all__ = [
    "add_positions",
    "alibi_bias",
    "alibi_slopes",
    "learned",
    "relative_position_bias",
    "relative_position_index",
    "rope",
    "sinusoidal",
]


def sinusoidal(num_positions, dim, base=10000.0, dtype="float64"):
    """The sinusoidal position table P (num_positions, dim) of Vaswani et al. / d2l.

    .. math::

        P_{i, 2j} = \\sin\\big(i / \\text{base}^{2j/d}\\big), \\qquad
        P_{i, 2j+1} = \\cos\\big(i / \\text{base}^{2j/d}\\big)

    for positions i = 0 .. num_positions-1 (an odd ``dim`` drops the last cosine).
    Add it to the inputs with :func:`add_positions`.
    """
    n = check_positive_int(num_positions, "num_positions")
    d = check_positive_int(dim, "dim")
    base = check_positive_float(base, "base")
    angles = np.arange(n, dtype=np.float64)[:, None] / np.power(
        base, np.arange(0, d, 2, dtype=np.float64) / d
    )
    table = np.empty((n, d), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d // 2])
    return table.astype(check_dtype(dtype))


def learned(num_positions, dim, random_state=None, std=0.02, dtype="float64"):
    """A learnable absolute position table (num_positions, dim), initialised N(0, std^2).

    The initialisation of BERT/GPT-2 position embeddings; the table is a plain
    array to be trained by whatever fits the rest of the model, and applied
    with :func:`add_positions`.
    """
    n = check_positive_int(num_positions, "num_positions")
    d = check_positive_int(dim, "dim")
    std = check_positive_float(std, "std")
    rng = np.random.default_rng(random_state)
    return rng.normal(0.0, std, size=(n, d)).astype(check_dtype(dtype))


def add_positions(x, table, offset=0):
    """x (..., L, D) + table[offset : offset + L]: absolute positions added to the inputs."""
    x = as_float_array(x, "x", min_ndim=2, allow_bool=False)
    t = as_float_array(table, "table", dtype=x.dtype, allow_bool=False)
    if t.ndim != 2 or t.shape[1] != x.shape[-1]:
        raise ValueError(f"table must have shape (positions, {x.shape[-1]}), got {t.shape}")
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    L = x.shape[-2]
    if offset + L > t.shape[0]:
        raise ValueError(f"table has {t.shape[0]} positions, fewer than offset + L = {offset + L}")
    return x + t[offset : offset + L]


def _positions(positions, n, name):
    if positions is None:
        return np.arange(n, dtype=np.float64)
    p = as_float_array(positions, name, min_ndim=1, dtype=np.float64, allow_bool=False)
    if p.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {p.shape}")
    return p


def rope(x, positions=None, base=10000.0, interleaved=False):
    """Rotary position embedding (RoPE) of queries or keys x (..., L, D), D even.

    Feature pairs (a_j, b_j), j = 0 .. D/2 - 1, are rotated by the angle
    p_i theta_j at position p_i, with theta_j = base^(-2j/D):

    .. math::

        a'_j = a_j \\cos(p_i \\theta_j) - b_j \\sin(p_i \\theta_j), \\qquad
        b'_j = a_j \\sin(p_i \\theta_j) + b_j \\cos(p_i \\theta_j)

    so that rope(q)_i . rope(k)_j depends on q_i, k_j and p_i - p_j only.
    Apply it to both q and k (per head) before the scaled dot product.

    Parameters
    ----------
    x : array (..., L, D)
    positions : array (L,), optional
        p_i; default 0 .. L-1.
    base : float
    interleaved : bool
        Pairing convention. False (default): half-split, a_j = x[j] and
        b_j = x[j + D/2] (GPT-NeoX, Llama / Hugging Face ``rotate_half``).
        True: interleaved, a_j = x[2j], b_j = x[2j+1] (the RoFormer paper).
    """
    x = as_float_array(x, "x", min_ndim=2, allow_bool=False)
    interleaved = check_bool(interleaved, "interleaved")
    D = x.shape[-1]
    if D % 2:
        raise ValueError(f"rope needs an even feature dimension, x has {D}")
    base = check_positive_float(base, "base")
    p = _positions(positions, x.shape[-2], "positions")
    theta = np.power(base, -np.arange(0, D, 2, dtype=np.float64) / D)
    angle = p[:, None] * theta[None, :]  # (L, D/2)
    cos = np.cos(angle).astype(x.dtype)
    sin = np.sin(angle).astype(x.dtype)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : D // 2], x[..., D // 2 :]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : D // 2], out[..., D // 2 :] = ra, rb
    return out


def alibi_slopes(num_heads):
    """ALiBi head slopes m_h (Press et al. 2022), shape (num_heads,).

    For n a power of two, m_h = 2^(-8h/n), h = 1..n (a geometric sequence
    starting at 2^(-8/n)). Otherwise, with n0 the largest power of two below
    n, the slopes of n0 heads followed by every other slope of 2 n0 heads
    (the odd-indexed ones: 2^(-8(2h-1)/(2 n0))), h = 1 .. n - n0 — the
    reference implementation's rule.
    """
    n = check_positive_int(num_heads, "num_heads")

    def power_of_two(m):
        start = 2.0 ** (-8.0 / m)
        return start ** np.arange(1, m + 1, dtype=np.float64)

    if n & (n - 1) == 0:
        return power_of_two(n)
    n0 = 2 ** math.floor(math.log2(n))
    return np.concatenate([power_of_two(n0), power_of_two(2 * n0)[0::2][: n - n0]])


def alibi_bias(num_heads, num_queries, num_keys=None, dtype="float64"):
    """ALiBi additive bias (num_heads, L, S): ``bias[h, i, j] = -m_h |i - j|``.

    With ``causal=True`` attention (keys j <= i) this is exactly the paper's
    bias m_h (j - i); the absolute value extends it symmetrically to
    non-causal attention. Pass it as ``mask=`` (float masks are added).
    """
    slopes = alibi_slopes(num_heads)
    L = check_positive_int(num_queries, "num_queries")
    S = L if num_keys is None else check_positive_int(num_keys, "num_keys")
    dist = np.abs(np.arange(L)[:, None] - np.arange(S)[None, :]).astype(np.float64)
    return (-slopes[:, None, None] * dist[None]).astype(check_dtype(dtype))


def relative_position_index(num_queries, num_keys=None, max_distance=1):
    """Indices (L, S) into a table of 2K+1 offsets: ``clip(j - i, -K, K) + K`` (Shaw et al.)."""
    L = check_positive_int(num_queries, "num_queries")
    S = L if num_keys is None else check_positive_int(num_keys, "num_keys")
    K = check_positive_int(max_distance, "max_distance")
    rel = np.arange(S)[None, :] - np.arange(L)[:, None]
    return np.clip(rel, -K, K) + K


def relative_position_bias(table, num_queries, num_keys=None):
    """Clipped relative-position bias (Shaw et al. 2018) from a table of 2K+1 entries.

    .. math:: b_{ij} = t\\big[\\operatorname{clip}(j - i, -K, K) + K\\big]

    Offsets beyond ±K share the table's end entries. ``table`` (2K+1,) gives an
    (L, S) bias; (2K+1, H) gives one bias per head, (H, L, S). Shaw et al.
    learn such a table (of vectors, added to the keys); here each offset
    carries a scalar added to the scores — pass the result as ``mask=``.
    """
    t = as_float_array(table, "table", min_ndim=1, allow_bool=False)
    if t.ndim > 2 or t.shape[0] % 2 == 0 or t.shape[0] < 3:
        raise ValueError(
            f"table must have shape (2K+1,) or (2K+1, heads) with K >= 1, got {t.shape}"
        )
    K = (t.shape[0] - 1) // 2
    idx = relative_position_index(num_queries, num_keys, K)
    if t.ndim == 1:
        return t[idx]
    return np.moveaxis(t[idx], -1, 0)
