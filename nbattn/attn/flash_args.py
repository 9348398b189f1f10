"""The keywords of the flash entries, checked and turned into the kernels' argument groups.

``nbattn.flash.flash_attention`` and its backward (and the varlen / decode
entries built on the same kernels) take

    mask, enable_gqa, window, causal_alignment, softcap, dropout_p, random_state

besides q, k, v, causal and scale. This module checks each one (a ValueError
naming the keyword) and builds what ``nbattn.kernels.flash`` and its CUDA
twin read, the one place where the groups of ``nbattn._core.attn_groups`` are
made: the key/value slice of every query slice (grouped-query attention and
broadcast leading dimensions without copies), the un-expanded base-2 mask
with its slice index and per-row lse shift (``Bias``), the band
(``Band``: offset, left, right), the scale and base-2 softcap (``ScoreTransform``),
the dropout words (``Dropout``) and the tile sizes (``Tiles``). See
``nbattn.kernels.flash`` for the kernels' conventions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import config
from .._core.attn_groups import NO_DROPOUT, Band, Bias, DecodeWindow, Dropout, ScoreTransform, Tiles
from .._core.numeric import LOG2E, dropout_seed, dropout_threshold, power_of_two_scale
from .._core.validation import as_float_array, check_bool, check_choice, resolve_dtype
from ..dispatch.device import kernels_for

#: The alignments of the causal band and the window (``causal_alignment=``).
ALIGNMENTS = ("top_left", "bottom_right")

#: Masks whose finite entries all lie within this magnitude are used as given;
#: larger ones are shifted per query row by the row's largest admissible entry
#: (the softmax does not change, lse gets the shift back), which keeps their
#: admissible entries near 0 where the kernel's dtype resolves them.
_SHIFT_ABOVE = 64.0


def check_qkv(q, k, v, enable_gqa, others=(), keys=("S", "keys")):
    """q, k, v as arrays of one computation dtype (``others``, e.g. out and grad_out,
    take part in the dtype rule), with matching feature and key axes and, for
    grouped-query attention, a head axis; returns ``(q, k, v, dtype)``."""
    dtype = resolve_dtype(None, q, k, v, *others)
    q = as_float_array(q, "q", min_ndim=2, dtype=dtype, allow_bool=False)
    k = as_float_array(k, "k", min_ndim=2, dtype=dtype, allow_bool=False)
    v = as_float_array(v, "v", min_ndim=2, dtype=dtype, allow_bool=False)
    check_shapes(q, k, v, enable_gqa, keys)
    return q, k, v, dtype


def check_shapes(q, k, v, enable_gqa, keys=("S", "keys")):
    """The feature and key axes of checked q, k, v match (and, for grouped-query
    attention, they have a head axis): a ValueError naming the arrays otherwise."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has E={q.shape[-1]} features but k has {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has {keys[0]}={k.shape[-2]} {keys[1]} but v has {v.shape[-2]}")
    if enable_gqa and (q.ndim < 3 or k.ndim < 3 or v.ndim < 3):
        raise ValueError(
            "enable_gqa needs a head axis (-3) on q, k and v, got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )


#: The unnormalised weights the flash kernels sum against a row's reference maximum
#: stay below 2**20 (``nbattn.kernels.flash.REBASE_SUM``), so their sum_j p_j v_j is
#: within n_keys * 2**20 * max|v|; two more bits cover the rounding.
FLASH_WEIGHT_BOUND = 2.0**22


def value_scales(vf, n_keys, weight_bound=FLASH_WEIGHT_BOUND):
    """None, or per slice of ``vf`` (n, S, Ev) the power of two 2**e to divide it by.

    An attention output is a convex combination of value rows, but a kernel that
    sums ``p_j v_j`` before normalising holds up to ``n_keys * weight_bound *
    max|v|``, which overflows for values near the top of the dtype's range. A
    slice whose largest |v| exceeds ``limit = finfo.max / (n_keys * weight_bound)``
    gets the smallest power of two 2**e with ``max|v| / 2**e < limit``; the
    others get 1. Dividing by 2**e and multiplying the output back is exact
    (the mantissas do not change), so the result equals the unscaled one
    wherever that one did not overflow; slices that need no scaling are left
    alone (subnormal values are never scaled, hence never flushed). Reads
    ``vf`` twice (its max and min), copies nothing.
    """
    if vf.size == 0:
        return None
    axes = tuple(range(1, vf.ndim))
    top = np.maximum(vf.max(axis=axes), -vf.min(axis=axes))
    return scales_for(top, vf.dtype, n_keys, weight_bound)


def scales_for(top, dtype, n_keys, weight_bound):
    """:func:`value_scales` from the largest |v| per slice, ``top`` (any shape)."""
    top = np.asarray(top, dtype=np.float64)
    limit = float(np.finfo(dtype).max) / (max(int(n_keys), 1) * weight_bound)
    over = top > limit
    if not over.any():
        return None
    return np.where(over, 2.0 * power_of_two_scale(np.where(over, top / limit, 1.0)), 1.0)


def scale_values(vf, scales):
    """``vf`` (our own copy) divided in place by ``scales`` (one power of two per slice)."""
    if scales is not None:
        vf /= scales.astype(vf.dtype).reshape((-1,) + (1,) * (vf.ndim - 1))
    return vf


def unscale_output(out, scales, index=None):
    """``out`` (n, ..., Ev) multiplied in place by ``scales[index]`` (the slice of v that
    each output slice read; ``index`` None = the slices match)."""
    if scales is not None:
        factors = scales if index is None else scales[index]
        out *= factors.astype(out.dtype).reshape((-1,) + (1,) * (out.ndim - 1))
    return out


def check_forward_results(out, lse, grad_out, lead, n_q, d_v, dtype):
    """The forward's ``out`` (lead + (L, Ev)) and ``lse`` (lead + (L,), float64, -inf
    allowed) and the incoming ``grad_out`` (out's shape), checked and converted."""
    needs = (
        ("out", out, "the forward's output"),
        ("lse", lse, "the forward's lse: flash_attention(..., return_lse=True)"),
        ("grad_out", grad_out, "the gradient of the loss with respect to out"),
    )
    for name, arr, what in needs:
        if arr is None:
            raise ValueError(f"{name} is required: pass {what}")
    out_shape = lead + (n_q, d_v)
    out = as_float_array(out, "out", min_ndim=2, dtype=dtype, allow_bool=False)
    grad_out = as_float_array(grad_out, "grad_out", min_ndim=2, dtype=dtype, allow_bool=False)
    lse = as_float_array(lse, "lse", min_ndim=1, dtype="float64", allow_neg_inf=True)
    for name, arr, shape in (
        ("out", out, out_shape),
        ("grad_out", grad_out, out_shape),
        ("lse", lse, lead + (n_q,)),
    ):
        if arr.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return out, lse, grad_out


@dataclass
class Keywords:
    """The checked keywords of one flash call (see :func:`check_keywords`)."""

    causal: bool
    enable_gqa: bool
    window: tuple[int | None, int | None] | None
    causal_alignment: str
    softcap: float | None
    dropout_p: float


def check_keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p) -> Keywords:
    """Each keyword checked, with a ValueError that names it."""
    causal = check_bool(causal, "causal")
    enable_gqa = check_bool(enable_gqa, "enable_gqa")
    check_choice(causal_alignment, "causal_alignment", ALIGNMENTS)
    if window is not None:
        try:
            sides = tuple(window)
        except TypeError:
            sides = ()
        if len(sides) != 2:
            raise ValueError(f"window must be a pair (left, right) or None, got {window!r}")
        checked = []
        for side, name in zip(sides, ("left", "right")):
            if side is None:
                checked.append(None)
                continue
            if isinstance(side, (bool, np.bool_)) or not isinstance(side, (int, np.integer)):
                raise ValueError(
                    f"window {name} side must be a non-negative int or None, got {side!r}"
                )
            if side < 0:
                raise ValueError(f"window {name} side must be >= 0, got {side}")
            checked.append(int(side))
        window = tuple(checked)
    if softcap is not None:
        if isinstance(softcap, (bool, np.bool_)) or not isinstance(
            softcap, (int, float, np.integer, np.floating)
        ):
            raise ValueError(f"softcap must be a positive float or None, got {softcap!r}")
        softcap = float(softcap)
        if not (math.isfinite(softcap) and softcap > 0.0):
            raise ValueError(f"softcap must be a positive finite float or None, got {softcap}")
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(
        dropout_p, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return Keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p)


def band(keywords: Keywords, n_q: int, n_k: int) -> Band:
    """The kernels' band (offset, left, right): key j is admissible for query i iff
    i + offset - left <= j <= i + offset + right. Unbounded sides are n_q + n_k + 1."""
    offset = n_k - n_q if keywords.causal_alignment == "bottom_right" else 0
    unbounded = n_q + n_k + 1
    left, right = unbounded, unbounded
    if keywords.window is not None:
        if keywords.window[0] is not None:
            left = min(keywords.window[0], unbounded)
        if keywords.window[1] is not None:
            right = min(keywords.window[1], unbounded)
    if keywords.causal:
        right = min(right, 0)
    return Band(offset, left, right)


def decode_window(keywords: Keywords) -> DecodeWindow:
    """The split-KV decoding kernels' window: causal, and the sides of ``window`` in
    natural positions, -1 for an unbounded side."""
    left, right = (-1, -1)
    if keywords.window is not None:
        left, right = (-1 if side is None else side for side in keywords.window)
    return DecodeWindow(keywords.causal, left, right)


def has_band(band_: Band, n_q: int, n_k: int) -> bool:
    """Whether the band excludes some (query, key) pair: some j < i + offset - left
    (largest at i = L - 1, j = 0) or some j > i + offset + right (i = 0, j = S - 1)."""
    offset, left, right = band_
    return n_q - 1 + offset - left > 0 or n_k - 1 > offset + right


def admissible(band_: Band, n_q: int, n_k: int) -> np.ndarray:
    """The (L, S) boolean matrix of the band (for the rare huge-mask shift)."""
    offset, left, right = band_
    diff = np.arange(n_k)[None, :] - np.arange(n_q)[:, None] - offset
    return (diff >= -left) & (diff <= right)


# --------------------------------------------------------------------------- leading dims
def kv_layout(q_shape, k_shape, v_shape, enable_gqa, extra_leads=()):
    """(lead, kv_lead, kv_index): the query slices' leading dims, the key/value slices'
    and the key/value slice (int64, one per query slice) each query slice reads.

    With ``enable_gqa`` the head axis (-3) of k and v may hold H_kv heads
    dividing q's H: query head h reads key/value head h // (H // H_kv)
    (torch's ``enable_gqa``). Other leading dims broadcast (torch semantics)
    without copying k or v.
    """
    q_lead, k_lead, v_lead = q_shape[:-2], k_shape[:-2], v_shape[:-2]
    try:
        kv_lead = tuple(np.broadcast_shapes(k_lead, v_lead))
    except ValueError:
        raise ValueError(
            f"the leading (batch) dimensions of k {tuple(k_shape)} and v {tuple(v_shape)} "
            "do not broadcast"
        ) from None
    group = 1
    if enable_gqa and len(q_lead) >= 1 and len(kv_lead) >= 1 and q_lead[-1] != kv_lead[-1]:
        h_q, h_kv = q_lead[-1], kv_lead[-1]
        if h_kv == 0 or h_q % h_kv:
            raise ValueError(
                f"enable_gqa: the key/value heads H_kv={h_kv} (axis -3 of k and v) must divide "
                f"the query heads H={h_q} (axis -3 of q)"
            )
        group = h_q // h_kv
    kv_as_q = kv_lead[:-1] + (kv_lead[-1] * group,) if group > 1 else kv_lead
    shapes = [q_lead, kv_as_q, *extra_leads]
    try:
        lead = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        names = ["q", "k and v (heads repeated for enable_gqa)" if group > 1 else "k and v"]
        names += ["mask"] * len(extra_leads)
        desc = ", ".join(f"{n} {tuple(s)}" for n, s in zip(names, shapes))
        hint = "" if enable_gqa else " (set enable_gqa=True for fewer key/value heads)"
        raise ValueError(f"the leading (batch) dimensions do not broadcast: {desc}{hint}") from None
    index = np.arange(math.prod(kv_lead), dtype=np.int64).reshape(kv_lead)
    if group > 1:
        index = np.repeat(index, group, axis=-1)
    kv_index = np.broadcast_to(index, lead).reshape(-1).copy()
    return lead, kv_lead, kv_index


# --------------------------------------------------------------------------- masks
@dataclass
class MaskArrays:
    """The kernels' mask: base-2 (BM, LM, SM) in the computation dtype (shape (0, 1, 1)
    when there is none), its slice per query slice, the per-row lse shift (BM, LM) in
    natural units (None when nothing was shifted), and the table of its open tiles for
    the tile sizes ``live_tiles`` where it was made with the mask (else None)."""

    mask: np.ndarray
    index: np.ndarray
    shift: np.ndarray | None
    live: np.ndarray | None = None
    live_tiles: tuple[int, int] | None = None

    def bias(self, live: np.ndarray, slopes: np.ndarray) -> Bias:
        """The kernels' additive terms: this mask with its tile table ``live`` (the CPU's,
        from the kernel's tile sizes) and the base-2 ALiBi ``slopes`` (shape (0,) = none)."""
        return Bias(self.mask, self.index, live, slopes)

    def live_for(self, tiles: Tiles) -> np.ndarray | None:
        """The table of open tiles for ``tiles`` when it was made with the mask, else None."""
        if self.live is not None and self.live_tiles == (tiles.block_q, tiles.block_k):
            return self.live
        return None

    def lse_shift(self, n_q: int) -> np.ndarray | None:
        """The shift of every (query slice, row), (BH, L) float64, or None."""
        if self.shift is None:
            return None
        return np.broadcast_to(self.shift[self.index], (self.index.size, n_q))


def mask_arrays(bias, lead, n_q, n_k, dtype, band_, banded, tiles=None, name="mask") -> MaskArrays:
    """The kernels' mask arrays from ``bias`` (..., LM, SM), or None.

    ``bias`` is a boolean mask (True = may attend) or a float one (added to the
    scores; -inf excludes), as :func:`nbattn.attn.masks.mask_input` gives it:
    its entries are read here, once, by ``nbattn.kernels.masks``, which
    writes the base-2 form in ``dtype`` and the table of open tiles for
    ``tiles`` (when given), and refuses NaN and +inf (a ValueError naming
    ``name``). Masks with entries beyond ``_SHIFT_ABOVE`` in magnitude are
    then shifted per query row by the largest entry that row may attend to
    (inside the band), so that what remains is representable in ``dtype``;
    entries that then fall below half the dtype's range have weight 0 next
    to that entry and become -inf.
    """
    n_bh = math.prod(lead)
    if bias is None:
        return MaskArrays(np.zeros((0, 1, 1), dtype=dtype), np.zeros(n_bh, np.int64), None)
    m_lead = bias.shape[:-2]
    index = np.arange(math.prod(m_lead), dtype=np.int64).reshape(m_lead)
    index = np.broadcast_to(index, lead).reshape(-1).copy()
    flat = np.ascontiguousarray(bias.reshape((-1,) + bias.shape[-2:]))
    if not flat.flags.writeable:  # numba compiles read-only arrays apart
        flat = flat.copy()
    block_q, block_k = (1, 1) if tiles is None else (tiles.block_q, tiles.block_k)
    n_m, n_l, n_s = flat.shape
    live = np.zeros(
        (n_m, -(-n_l // block_q) if n_l > 1 else 1, -(-n_s // block_k) if n_s > 1 else 1),
        dtype=np.uint8,
    )
    base2 = np.empty(flat.shape, dtype=dtype)
    kernels = kernels_for("masks", "cpu")
    if flat.dtype == np.bool_:
        kernels.bool_mask_base2(flat, base2, live, block_q, block_k)
        largest = 0.0
    else:
        n_bad, largest = kernels.float_mask_base2(flat, base2, live, block_q, block_k)
        if n_bad:
            as_float_array(bias, name, allow_neg_inf=True)  # raises, naming the first entry
    if largest <= _SHIFT_ABOVE:  # the common case: one pass, straight into the kernels' dtype
        if tiles is None:
            return MaskArrays(base2, index, None)
        return MaskArrays(base2, index, None, live, (block_q, block_k))
    flat = flat.astype(np.float64)
    considered = flat
    if banded and flat.shape[-1] > 1:
        considered = np.broadcast_to(flat, (flat.shape[0], n_q, n_k))
        considered = np.where(admissible(band_, n_q, n_k), considered, -np.inf)
    top = considered.max(axis=-1)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        flat = considered - top[..., None]
    shift = top
    with np.errstate(over="ignore"):
        base2 = flat * LOG2E
    floor = -float(np.finfo(dtype).max) / 2
    base2 = np.where(base2 < floor, -np.inf, base2)
    if base2.max() > -floor:
        raise ValueError(
            f"{name} holds values beyond what the {np.dtype(dtype).name} kernels can add to the "
            "scores; rescale it"
        )
    return MaskArrays(np.ascontiguousarray(base2, dtype=dtype), index, shift)


# --------------------------------------------------------------------------- dropout
def dropout_words(dropout_p, random_state, n_q, n_k, for_backward=False) -> Dropout:
    """The kernels' dropout group: seed, threshold, n_rows = n_q, n_cols = n_k, row0 = col0
    = 0 and keep_scale = 1 / (1 - p) (see ``nbattn.kernels.flash``).

    The backward must regenerate the forward's mask, so with ``dropout_p > 0``
    it needs the same seed: an int ``random_state`` (a Generator or None
    cannot give the forward's draw back), else a ValueError.
    """
    if dropout_p == 0.0:
        return NO_DROPOUT
    if for_backward and (
        random_state is None
        or isinstance(random_state, (bool, np.bool_))
        or not isinstance(random_state, (int, np.integer))
    ):
        raise ValueError(
            "random_state must be the int seed that the forward call used when dropout_p > 0 "
            f"(the backward regenerates the dropout mask from it), got {random_state!r}"
        )
    seed = dropout_seed(random_state)
    return Dropout(seed, dropout_threshold(dropout_p), n_q, n_k, 0, 0, 1.0 / (1.0 - dropout_p))


# --------------------------------------------------------------------------- score, tiles
def score_transform(scale: float, keywords: Keywords) -> ScoreTransform:
    """The kernels' score group: the user's ``scale`` and the base-2 softcap (0 = none)."""
    return ScoreTransform(scale, 0.0 if keywords.softcap is None else keywords.softcap * LOG2E)


def _narrowed(block_q, block_k, band_: Band, n_k):
    """The tile sizes under a window narrower than ``block_k``.

    A query tile of ``block_q`` rows visits the key tiles that meet its band,
    left + right + block_q keys wide; key tiles much wider than the band
    would be mostly outside it, so under a window narrower than ``block_k``
    both sizes drop to the power of two at or above half the band's width
    (at least 64, at most the configured sizes).
    """
    _, left, right = band_
    width = min(left, n_k) + min(right, n_k) + 1
    if width >= block_k:
        return block_q, block_k
    narrow = max(64, 1 << max(0, (width // 2 - 1).bit_length()))
    return min(block_q, narrow), min(block_k, narrow)


def flash_tiles(n_k: int, band_: Band, backward: bool, n_groups: int = 1) -> Tiles:
    """The tiles of one flash call over ``n_k`` keys: ``config.FLASH_LONG_*`` from
    ``config.FLASH_LONG_KEYS`` keys, else ``config.FLASH_(BWD_)BLOCK_*``, narrowed
    under a window (:func:`_narrowed`); read per call. ``n_groups`` key-tile
    groups per key/value slice (the backward's)."""
    long = n_k >= config.FLASH_LONG_KEYS
    if backward and long:
        sizes = config.FLASH_LONG_BWD_BLOCK_Q, config.FLASH_LONG_BWD_BLOCK_K
    elif backward:
        sizes = config.FLASH_BWD_BLOCK_Q, config.FLASH_BWD_BLOCK_K
    elif long:
        sizes = config.FLASH_LONG_FWD_BLOCK_Q, config.FLASH_LONG_FWD_BLOCK_K
    else:
        sizes = config.FLASH_BLOCK_Q, config.FLASH_BLOCK_K
    return Tiles(*_narrowed(*sizes, band_, n_k), n_groups)


def varlen_tiles(backward: bool) -> Tiles:
    """The tiles of a varlen call: ``config.FLASH_(BWD_)BLOCK_Q/K``, read per call."""
    if backward:
        return Tiles(config.FLASH_BWD_BLOCK_Q, config.FLASH_BWD_BLOCK_K)
    return Tiles(config.FLASH_BLOCK_Q, config.FLASH_BLOCK_K)


def backward_groups(n_kv, n_key_tiles, dq_bytes):
    """Key-tile groups per key/value slice so that every thread has work.

    Each group beyond the first costs a dQ buffer of ``dq_bytes``; the extra
    buffers are capped at ``config.FLASH_MAX_DQ_BUFFER_BYTES`` in all (read
    per call).
    """
    import numba

    threads = numba.get_num_threads()
    if threads <= 1 or n_kv % threads == 0 or n_kv >= 4 * threads:
        return 1
    groups = min(n_key_tiles, -(-2 * threads // n_kv))
    return max(1, min(groups, 1 + config.FLASH_MAX_DQ_BUFFER_BYTES // max(dq_bytes, 1)))
