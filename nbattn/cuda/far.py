"""Far rows on the GPU: the device twins of the far-row path of ``nbattn.kernels.pooling``.

A Gaussian row whose best score ``m = max_j -||z_q - z_j||^2`` lies below
``-config.FAR_SCORE_<dtype>`` (or whose every admissible score overflowed)
cannot take its weights from direct scores: their rounding error, about
(d + 3) u |s|, decides the weights. The CPU kernels recompute such rows, and
so do these device functions, one thread per row, in float64, with the same
thresholds and steps (see the CPU module's "Far rows"):

* a float32 row beyond ``FAR_SCORE_FLOAT32``: direct scores in float64 (the
  differences of float32 numbers are exact there) -- :func:`direct_state64`;
* a row beyond ``FAR_SCORE_FLOAT64``, or overflowed: scores relative to its
  nearest key a, r_j = s_j - s_a = (z_j - z_a) . (2 z_q - z_j - z_a), the second
  factor summed with TwoSum, on inputs multiplied by a power of two c that
  keeps every product finite -- :func:`far_state`, :func:`far_score`.

These rows are rare, so the functions read the query row and the keys from
global memory with plain loops (no tiles, no synchronisation: a thread may run
them alone; and no local arrays passed in, which would put a kernel's
register-held rows on the stack). A first pass (the LOO loss) redoes a far
row with :func:`repair_state` and :func:`weighted_value` (:func:`far_squared_error`). The
kernels compile without fast-math (``common.exp_for``), so TwoSum's
compensation is kept; NVVM's contraction into fused multiply-adds only makes
the products more exact.

Second passes (LOO gradients, spread) run their direct rows in their tiled
kernels and hand the others (:func:`far_rows`: lse below -far_limit) to a far
kernel, one thread per such row, which finds the row's mode from its lse as
the CPU's ``_row_setup`` does (:func:`row_setup`): skip, ``DIRECT_FLOAT64``
(float64 scores, w = exp(s - lse)), or ``ANCHORED`` (w = exp(r_j - shift),
shift including log l). The tiled kernels keep their registers that way.
"""

from __future__ import annotations

import math

import numpy as np

from .. import config
from .common import jit

#: How a second pass gets a row's weights (the CPU's ``_row_setup`` modes).
DIRECT, DIRECT_FLOAT64, ANCHORED = 0, 1, 2

FAR_SCORE_FLOAT32 = float(config.FAR_SCORE_FLOAT32)
FAR_SCORE_FLOAT64 = float(config.FAR_SCORE_FLOAT64)
# Largest scaled magnitude in the anchored form (the CPU's _FAR_MAGNITUDE).
_FAR_MAGNITUDE = 2.0**500
_FLOAT64_MAX = float(np.finfo(np.float64).max)
_SCALE_STEP = 2.0**-64


def far_limit(dtype):
    """The score magnitude beyond which a row of ``dtype`` is far (config's value when
    this module was imported, as for the CPU kernels, which compile it in)."""
    return FAR_SCORE_FLOAT32 if np.dtype(dtype) == np.float32 else FAR_SCORE_FLOAT64


def far_rows(lse, dtype):
    """Indices of the rows whose lse is not >= -far_limit(dtype) (NaN included): the
    rows a second pass hands to its far kernel. ``lse``: host or device array."""
    host = lse if isinstance(lse, np.ndarray) else lse.copy_to_host()
    return np.flatnonzero(~(np.asarray(host, dtype=np.float64) >= -far_limit(dtype)))


@jit(device=True, inline=True)
def has_admissible_key(n_keys, own):
    """Whether a row over ``n_keys`` keys with key ``own`` skipped (-1: none) has any key."""
    skipped = 1 if 0 <= own and own < n_keys else 0
    return n_keys - skipped > 0


@jit(device=True, inline=True)
def two_sum(a, b):
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@jit(device=True)
def far_scale(q_row, keys_t):
    """A power of two c with c * max(|z_q|, |z_k|) <= 2**500 (1 when already so)."""
    big = 0.0
    for f in range(keys_t.shape[0]):
        v = abs(np.float64(q_row[f]))
        if v > big:
            big = v
    for f in range(keys_t.shape[0]):
        for j in range(keys_t.shape[1]):
            v = abs(np.float64(keys_t[f, j]))
            if v > big:
                big = v
    c = 1.0
    while big * c > _FAR_MAGNITUDE:
        c *= _SCALE_STEP
    return c


@jit(device=True)
def scaled_distance(q_row, keys_t, j, c):
    """sum_f (c k_jf - c q_f)^2 (finite for the scaled inputs)."""
    total = 0.0
    for f in range(keys_t.shape[0]):
        diff = c * np.float64(keys_t[f, j]) - c * np.float64(q_row[f])
        total += diff * diff
    return total


@jit(device=True)
def scaled_relative(q_row, keys_t, j, a, c):
    """c**2 (s_j - s_a) = sum_f (c k_jf - c k_af) (2 c q_f - c k_jf - c k_af), TwoSum'd."""
    total = 0.0
    for f in range(keys_t.shape[0]):
        q2 = 2.0 * (c * np.float64(q_row[f]))
        ka = c * np.float64(keys_t[f, a])
        kj = c * np.float64(keys_t[f, j])
        s1, e1 = two_sum(q2, -kj)
        s2, e2 = two_sum(s1, -ka)
        total += (kj - ka) * (s2 + (e1 + e2))
    return total


@jit(device=True, inline=True)
def unscaled(r, inv_c):
    """r / c**2, at most the largest float (0 stays 0, never 0 * inf)."""
    if r == 0.0:
        return 0.0
    v = r * inv_c * inv_c
    return v if v < _FLOAT64_MAX else _FLOAT64_MAX


@jit(device=True)
def far_score(q_row, keys_t, j, own, anchor, c):
    """r_j = s_j - s_anchor (float64; -inf for the key ``own``)."""
    if j == own:
        return -math.inf
    return unscaled(scaled_relative(q_row, keys_t, j, anchor, c), 1.0 / c)


@jit(device=True)
def far_state(q_row, keys_t, own):
    """Anchor and normaliser of a far row: ``(a, c, s_a, shift, l)`` (the CPU's far_state).

    ``a`` the nearest admissible key (-1 if none), ``c`` the power of two,
    ``s_a = -||z_q - z_a||^2`` (-inf where it overflows), shift = max_j r_j and
    l = sum_j exp(r_j - shift), so that w_j = exp(r_j - shift) / l and
    lse = s_a + shift + log l.
    """
    n_keys = keys_t.shape[1]
    c = far_scale(q_row, keys_t)
    anchor = -1
    best = math.inf
    for j in range(n_keys):
        dist = scaled_distance(q_row, keys_t, j, c)
        if dist < best and j != own:
            best = dist
            anchor = j
    if anchor < 0:
        return -1, c, -math.inf, 0.0, 0.0
    best = 0.0
    candidate = anchor
    for j in range(n_keys):
        r = scaled_relative(q_row, keys_t, j, candidate, c)
        if r > best and j != own:
            best = r
            anchor = j
    shift = 0.0
    total = 0.0
    for j in range(n_keys):
        r = far_score(q_row, keys_t, j, own, anchor, c)
        if r > shift:
            total *= math.exp(shift - r)
            shift = r
        total += math.exp(r - shift)
    inv_c = 1.0 / c
    s_a = -scaled_distance(q_row, keys_t, anchor, c) * inv_c * inv_c
    return anchor, c, s_a, shift, total


@jit(device=True)
def direct_score64(q_row, keys_t, j):
    """s_j = -||z_q - z_j||^2 in float64 (exact differences of float32 inputs)."""
    s = 0.0
    for f in range(keys_t.shape[0]):
        diff = np.float64(keys_t[f, j]) - np.float64(q_row[f])
        s -= diff * diff
    return s


@jit(device=True)
def direct_state64(q_row, keys_t, own):
    """(m, l) of one row with float64 scores: m = max_j s_j, l = sum_j exp(s_j - m)."""
    m = -math.inf
    total = 0.0
    for j in range(keys_t.shape[1]):
        if j == own:
            continue
        s = direct_score64(q_row, keys_t, j)
        if s == -math.inf:
            continue
        if s > m:
            total *= math.exp(m - s)
            m = s
        total += math.exp(s - m)
    return m, total


@jit(device=True)
def repair_state(q_row, keys_t, own, limit, limit64):
    """``(mode, anchor, c, shift, l)`` of a far row of a first pass (the tail of the
    CPU's ``pool_row``), for a row with an admissible key whose direct best score
    lies below ``-limit`` (the dtype's far limit): a float32 row takes float64
    scores (mode DIRECT_FLOAT64, shift = m), unless those too lie beyond
    ``limit64`` (float64's far limit) or overflow; then the anchored form
    (ANCHORED). The weights are :func:`far_weight` ``(..., shift, anchor, c, shift) / l``.
    Both limits are arguments, not this module's globals, so that they enter the
    calling kernels' closures and so their disk-cache keys (``common.jit``)."""
    if limit < limit64:
        m, total = direct_state64(q_row, keys_t, own)
        if m >= -limit64:
            return DIRECT_FLOAT64, -1, 1.0, m, total
    anchor, c, s_a, shift, total = far_state(q_row, keys_t, own)
    return ANCHORED, anchor, c, shift, total


@jit(device=True)
def weighted_value(q_row, keys_t, values_t, o, own, mode, anchor, c, shift):
    """sum_j w_j values_t[o, j] with the unnormalised weights of :func:`repair_state`."""
    total = 0.0
    for j in range(keys_t.shape[1]):
        if j == own:
            continue
        w = far_weight(q_row, keys_t, j, own, mode, shift, anchor, c, shift)
        total += w * np.float64(values_t[o, j])
    return total


@jit(device=True)
def far_squared_error(q_row, keys_t, values_t, targets, i, own, limit, limit64):
    """sum_c (f_c - targets[i, c])^2 for a far row of a first pass, f_c its prediction
    from :func:`repair_state`'s weights (the LOO loss's far rows)."""
    mode, anchor, c, shift, total = repair_state(q_row, keys_t, own, limit, limit64)
    sq = 0.0
    for o in range(values_t.shape[0]):
        value = weighted_value(q_row, keys_t, values_t, o, own, mode, anchor, c, shift)
        err = value / total - targets[i, o]
        sq += err * err
    return sq


@jit(device=True)
def row_setup(q_row, keys_t, own, lse_i, limit, limit64):
    """``(skip, mode, anchor, c, shift)`` of one row of a second pass (the CPU's
    ``_row_setup``): DIRECT when lse_i >= -limit; skip a row with lse = -inf and
    no admissible key; DIRECT_FLOAT64 when lse_i >= -limit64; else
    ANCHORED with shift = max r + log l (skip when lse = -inf is not an overflow:
    a row the caller leaves out)."""
    if lse_i >= -limit:
        return False, DIRECT, -1, 1.0, 0.0
    if lse_i == -math.inf and not has_admissible_key(keys_t.shape[1], own):
        return True, DIRECT, -1, 1.0, 0.0
    if lse_i >= -limit64:
        return False, DIRECT_FLOAT64, -1, 1.0, 0.0
    anchor, c, s_a, shift, total = far_state(q_row, keys_t, own)
    if lse_i == -math.inf and s_a > -math.inf:
        return True, DIRECT, -1, 1.0, 0.0
    return anchor < 0, ANCHORED, anchor, c, shift + math.log(total)


@jit(device=True)
def far_weight(q_row, keys_t, j, own, mode, lse_i, anchor, c, shift):
    """w_j of a DIRECT_FLOAT64 or ANCHORED row (float64; 0 for the key ``own``)."""
    if j == own:
        return 0.0
    if mode == DIRECT_FLOAT64:
        return math.exp(direct_score64(q_row, keys_t, j) - lse_i)
    return math.exp(far_score(q_row, keys_t, j, own, anchor, c) - shift)
