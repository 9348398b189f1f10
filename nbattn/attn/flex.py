"""Programmable attention: user score and mask functions compiled into the flash kernels.

The attention chapter's scoring function a(q, k) as user code, in the
convention of PyTorch's FlexAttention:

    s_ij   = score_mod(scale * q_i . k_j, b, h, i, j, *mod_args)
    s_ij   = -inf  where not mask_mod(b, h, i, j, *mod_args)
    out_i  = sum_j softmax_j(s_ij) v_j,     lse_i = log sum_j exp(s_ij)

for q of shape (B, H, L, E) (b and h index the batch and query head; q of
shape (H, L, E) or (L, E) has b = 0, and h = 0 without a head axis).
``score_mod`` sees the scaled product before the softmax, and the mask
applies after it (``score_mod`` runs on masked entries of a visited tile
too, as in FlexAttention, so indexing in it must be valid for every (i, j):
numba does not check bounds). Both are plain Python functions on scalars, compiled with
numba (``njit`` is applied when they are not jitted already) into the tile
loop of the flash kernels (``nbattn.kernels.flex``; the compiled modules are
cached on disk per function, see ``nbattn.kernels.flex_build``). Arrays they
read (a bias table, per-head slopes, document ids) are passed in
``mod_args`` and arrive as their trailing arguments: numba would freeze a
global or closed-over array into the compiled code, so functions that read
one are refused.

On float32 inputs the score functions compute as torch's do: the Python floats they
read (constants, closure cells, module globals, defaults) are float32 (torch's "weak"
scalars take the tensor's dtype; numba alone would type them float64), through a copy
of each function made by :func:`computing_in`; floats float32 cannot hold,
``np.float64(c)``, module attributes (``math.pi``) and float64 ``mod_args`` keep
float64 arithmetic.

Inside ``score_mod``, ``nbattn.flex_tanh`` (a tanh softcap) compiles to an
inlined form that vectorises with the score loop, where ``np.tanh`` is a
call to the C library per element (about 3x slower for a causal softcapped
forward); its complex form keeps the complex-step derivative exact.

A :class:`BlockMask` (:func:`create_block_mask`) evaluates ``mask_mod`` once
per tile of the flash kernels and classifies each tile: fully masked tiles
are never visited and fully open ones skip the per-element mask, so document
masking, prefix-LM and sliding windows cost only the tiles they keep. The
backward differentiates through ``score_mod`` by the complex step (a
complex128 evaluation of the function; exact to rounding where it is
analytic in ``score``) or with the user's ``score_mod_grad``; given the user's
``score_mod_args_grad``, a pass of its own (``nbattn.kernels.flex_args``) also gives
the gradients of the float arrays of ``mod_args``:

    dL/dT[k] = sum_ij P_ij (dP_ij - D_i) d score_mod(s_ij, b, h, i, j, *T) / dT[k]

over the admissible entries, in float64 buffers per slot of work summed in slot
order (a number of slots that does not depend on the threads, so neither do the
bits), returned in each array's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import config
from .._core.attn_groups import FLEX_BACKWARD_ITEM, FLEX_FORWARD_ITEM, Tiles
from .._core.layout import flat_batch, unbroadcast
from .._core.numeric import LOG2E
from .._core.threads import blas_one_thread, serial_below
from .._core.validation import check_dot_range, check_scale
from ..dispatch.device import device_for, kernels_for
from . import flex_cuda
from .flash_args import (
    Keywords,
    backward_groups,
    band,
    check_forward_results,
    check_qkv,
    flash_tiles,
    kv_layout,
    scale_values,
    unscale_output,
    value_scales,
)

# and flex_tanh (module __getattr__ below)
__all__ = [
    "BlockMask",
    "check_mods",
    "check_on_cpu",
    "check_score_functions",
    "create_block_mask",
    "flex_backward",
    "flex_forward",
    "item_table",
    "run_args_backward",
    "run_backward",
    "run_forward",
    "uses_flex",
]


def __getattr__(name):
    # flex_tanh is the kernels' function itself (numba compiles its inlined form into a
    # score_mod that calls it), looked up on first use: importing this module (as
    # nbattn.flash_attention does) loads no kernel module.
    if name == "flex_tanh":
        return kernels_for("flex", "cpu").tanh
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SCORE_PARAMS = "score, b, h, q_idx, kv_idx"
_MASK_PARAMS = "b, h, q_idx, kv_idx"
_ARGS_PARAMS = "grad_score, score, b, h, q_idx, kv_idx, *mod_args, then one gradient array"


def _mod_args(mod_args, name="mod_args"):
    """``mod_args`` as a tuple of C-contiguous writeable arrays and numbers, of the types
    numba compiles: native byte order (a big-endian array is converted), float16 widened
    to float32 (exactly), a plain ``ndarray`` for a subclass; a masked array (whose mask
    the compiled code would ignore), long doubles and ints beyond 64 bits are refused."""
    if mod_args is None:
        return ()
    if not isinstance(mod_args, tuple):
        raise ValueError(
            f"{name} must be a tuple of arrays and numbers, got {type(mod_args).__name__}"
        )
    return tuple(_mod_arg(arg, f"{name}[{n}]") for n, arg in enumerate(mod_args))


def _mod_arg(arg, where):
    """One entry of :func:`_mod_args`."""
    if isinstance(arg, np.ma.MaskedArray):
        raise ValueError(
            f"{where} is a masked array, whose mask the compiled functions would not see; "
            "pass arg.filled(value), or the mask as an array of its own"
        )
    if isinstance(arg, np.ndarray):
        arr = np.asarray(arg)  # a plain ndarray (np.matrix and other subclasses)
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{where} must be a bool, int or float array, got {arr.dtype}")
        arr = _native(arr, where)
        # (np.ascontiguousarray would make a 0-d array 1-d)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return arr if arr.flags.writeable else arr.copy()
    if isinstance(arg, (bool, np.bool_)):
        return arg
    if isinstance(arg, (np.timedelta64, np.datetime64)):  # np.timedelta64 is an np.integer
        raise ValueError(f"{where} must be a NumPy array or a number, got {type(arg).__name__}")
    if isinstance(arg, (int, np.integer)):
        if not -(2**63) <= int(arg) < 2**64:
            raise ValueError(f"{where} = {arg} is beyond the 64-bit integers numba computes with")
        return arg
    if isinstance(arg, (float, np.floating)):
        return _native(np.asarray(arg), where)[()] if isinstance(arg, np.floating) else arg
    raise ValueError(f"{where} must be a NumPy array or a number, got {type(arg).__name__}")


def _native(arr, where):
    """``arr`` in a dtype numba compiles: native byte order, float16 as float32."""
    if arr.dtype.kind == "f" and arr.dtype.itemsize not in (2, 4, 8):
        raise ValueError(
            f"{where} has dtype {arr.dtype.name}, which numba does not compute with; "
            "convert it to float64"
        )
    if arr.dtype.kind == "f" and arr.dtype.itemsize == 2:
        return arr.astype(np.float32)  # exact
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="))  # exact
    return arr


@dataclass
class BlockMask:
    """``mask_mod`` evaluated per tile of the flash kernels: a reusable ``block_mask=``.

    Holds ``mask_mod``, its ``mod_args`` and the shape (B, H, L, S) it was made
    for (B or H of 1 broadcast), and per tile size a uint8 table (B, H, QT, KT)
    of 0 (``mask_mod`` False on the whole tile: never visited), 1 (partial:
    the mask is evaluated per element) and 2 (True on the whole tile: no
    per-element mask). The table for the forward's tiles is made by
    :func:`create_block_mask`; the backward's, on its first use.
    """

    mask_mod: object
    mod_args: tuple
    shape: tuple
    _tables: dict = field(default_factory=dict, repr=False)

    def table(self, block_q: int, block_k: int) -> np.ndarray:
        """The tile classes for tiles of ``block_q`` queries x ``block_k`` keys."""
        key = (block_q, block_k)
        if key not in self._tables:
            n_b, n_h, n_q, n_k = self.shape
            self._tables[key] = kernels_for("flex", "cpu").block_states(
                self.mask_mod, n_b, n_h, n_q, n_k, block_q, block_k, self.mod_args
            )
        return self._tables[key]

    def sparsity(self, block_q: int, block_k: int) -> float:
        """The fraction of tiles never visited at these tile sizes."""
        return float(np.mean(self.table(block_q, block_k) == 0))


def _dim(value, name):
    if value is None:
        return 1
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


def create_block_mask(mask_mod, B, H, L, S, mod_args=()):
    """``mask_mod`` evaluated per tile of the flash kernels, for ``block_mask=``.

    Parameters
    ----------
    mask_mod : function ``mask_mod(b, h, q_idx, kv_idx, *mod_args) -> bool``
        True where query ``q_idx`` of batch entry ``b`` and head ``h`` may attend
        to key ``kv_idx``. Compiled with numba (``njit`` is applied if needed).
    B, H : int or None
        Batch entries and heads the mask differs over; None (or 1) when it is
        the same for all (``b`` or ``h`` is then 0 in the calls).
    L, S : int
        Query and key lengths.
    mod_args : tuple of arrays and numbers
        ``mask_mod``'s trailing arguments (document ids, prefix lengths).

    Returns
    -------
    BlockMask
        Reusable across calls (forward and backward) of the same shape.
        ``mask_mod`` is evaluated once per (b, h, query, key) here, so a mask
        that changes with the data needs a new block mask.
    """
    dims = (_dim(B, "B"), _dim(H, "H"), _dim(L, "L"), _dim(S, "S"))
    args = _mod_args(mod_args)
    kernels_for("flex", "cpu").check_signature(mask_mod, "mask_mod", 4, len(args), _MASK_PARAMS)
    mask = BlockMask(mask_mod, args, dims)
    unbanded = (0, dims[2] + dims[3] + 1, dims[2] + dims[3] + 1)
    tiles = _forward_tiles(dims[3], unbanded, block_masked=True)
    mask.table(tiles.block_q, tiles.block_k)
    return mask


@dataclass
class Mods:
    """The checked user functions of one call."""

    score_mod: object
    mask_mod: object
    block_mask: BlockMask | None
    score_args: tuple
    mask_args: tuple
    score_grad: object = None
    args_grad: object = None
    #: the dtype of each ``mod_args`` entry as the caller gave it (None for a number):
    #: the dtype of its gradient (the kernels see float16 as float32, any byte order
    #: as native)
    arg_dtypes: tuple = ()


def uses_flex(
    score_mod, mask_mod, block_mask, score_mod_grad=None, mod_args=(), args_grad=None
) -> bool:
    """Whether a flash call takes the programmable path (``mod_args`` without functions
    takes it too, to be refused by :func:`check_mods`)."""
    given_args = not (mod_args is None or (isinstance(mod_args, tuple) and not mod_args))
    return given_args or any(
        f is not None for f in (score_mod, mask_mod, block_mask, score_mod_grad, args_grad)
    )


def check_on_cpu(device, *arrays, what=None):
    """score_mod and mask_mod of ``flash_attention_varlen`` and ``flash_decode``, and
    ``what`` (``score_mod_args_grad``) wherever it is given, run on the CPU kernels
    only; say so (for device="cuda" whether or not a GPU is there: the GPU is not the
    problem). ``flash_attention`` runs score_mod and mask_mod on the GPU too
    (``flex_cuda.flex_device``)."""
    if device == "cuda" or device_for(device, *arrays) != "cpu":
        if what is not None:
            raise ValueError(f"{what} runs on the CPU only (device='cpu', host arrays)")
        raise ValueError(
            "score_mod and mask_mod of flash_attention_varlen and flash_decode run on the "
            "CPU only (device='cpu', host arrays); flash_attention runs them on the GPU too"
        )


#: Why an entry refuses ``block_mask`` (the others take it).
_NO_BLOCK_MASK = {
    "flash_attention_varlen": (
        "flash_attention_varlen takes no block_mask: a block mask classifies the tiles of "
        "one (B, H, L, S) rectangle, and packed sequences each have their own lengths and "
        "tiles; pass mask_mod (evaluated per element on the tiles visited), with causal= "
        "or window= to skip the tiles outside the band of every sequence"
    ),
    "flash_decode": (
        "flash_decode takes no block_mask: its queries sit at the end of each batch row's "
        "cache, not on the tiles a block mask classifies; pass mask_mod, with causal= or "
        "window= to read only the keys of the window"
    ),
}


def check_score_functions(score_mod, score_mod_grad, score_mod_args_grad, n_args):
    """``score_mod`` and the backward's ``score_mod_grad`` and ``score_mod_args_grad``
    checked against ``n_args`` entries of ``mod_args`` (each may be None); the torch
    adapter checks the backward's two in its forward, before anything compiles."""
    build = kernels_for("flex", "cpu")
    if score_mod is not None:
        build.check_signature(score_mod, "score_mod", 5, n_args, _SCORE_PARAMS)
    if score_mod_grad is not None:
        build.check_signature(score_mod_grad, "score_mod_grad", 5, n_args, _SCORE_PARAMS)
        if score_mod is None:
            raise ValueError("score_mod_grad is given without score_mod")
    if score_mod_args_grad is not None:
        build.check_signature(
            score_mod_args_grad, "score_mod_args_grad", 6 + n_args, n_args, _ARGS_PARAMS
        )
        if score_mod is None:
            raise ValueError(
                "score_mod_args_grad is given without score_mod (it differentiates score_mod "
                "with respect to the arrays of mod_args)"
            )


def check_mods(
    score_mod,
    mask_mod,
    block_mask,
    mod_args,
    score_mod_grad,
    kw: Keywords,
    mask,
    entry="flash_attention",
    score_mod_args_grad=None,
):
    """The user functions checked against ``mod_args`` and the other keywords of the
    public function ``entry`` (``flash_attention``, ``flash_attention_varlen`` or
    ``flash_decode``; the latter two refuse a block mask)."""
    build = kernels_for("flex", "cpu")
    used = [
        name
        for name, on in (
            ("mask", mask is not None),
            ("softcap", kw.softcap is not None),
            ("dropout_p", kw.dropout_p > 0.0),
        )
        if on
    ]
    if used:
        raise ValueError(
            f"{', '.join(used)} cannot be combined with score_mod, mask_mod or block_mask; "
            "express it in score_mod or mask_mod (causal, window and enable_gqa combine)"
        )
    if block_mask is not None and entry in _NO_BLOCK_MASK:
        raise ValueError(_NO_BLOCK_MASK[entry])
    args = _mod_args(mod_args)
    if args and score_mod is None and mask_mod is None:
        raise ValueError(
            "mod_args are the trailing arguments of score_mod and mask_mod, and neither is "
            "given (a block_mask holds its own: create_block_mask(..., mod_args=))"
        )
    check_score_functions(score_mod, score_mod_grad, score_mod_args_grad, len(args))
    mask_args = args
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise ValueError(
                "block_mask must come from nbattn.create_block_mask, got "
                f"{type(block_mask).__name__}"
            )
        if mask_mod is not None:
            raise ValueError("pass mask_mod or block_mask (which holds its mask_mod), not both")
        mask_mod, mask_args = block_mask.mask_mod, block_mask.mod_args
    elif mask_mod is not None:
        build.check_signature(mask_mod, "mask_mod", 4, len(args), _MASK_PARAMS)
    arg_dtypes = tuple(
        arg.dtype if isinstance(arg, np.ndarray) else None for arg in (mod_args or ())
    )
    return Mods(
        score_mod,
        mask_mod,
        block_mask,
        args,
        mask_args,
        score_mod_grad,
        score_mod_args_grad,
        arg_dtypes,
    )


def item_table(dtype, **fields) -> np.ndarray:
    """The work items of the flex kernels: a record array of ``dtype``
    (``FLEX_FORWARD_ITEM`` or ``FLEX_BACKWARD_ITEM``), every field given (arrays of one
    length, or numbers for all items)."""
    missing = set(dtype.names) - set(fields)
    if missing or set(fields) - set(dtype.names):
        raise TypeError(f"item fields {sorted(fields)} are not {sorted(dtype.names)}")
    n = np.broadcast_shapes(*(np.shape(value) for value in fields.values()))
    items = np.empty(n, dtype=dtype)
    for name, value in fields.items():
        items[name] = value
    return items


def _blocks(mods: Mods, tiles: Tiles) -> np.ndarray:
    if mods.block_mask is not None:
        return mods.block_mask.table(tiles.block_q, tiles.block_k)
    return np.full((1, 1, 1, 1), 1 if mods.mask_mod is not None else 2, dtype=np.uint8)


def computing_in(mods: Mods, dtype) -> Mods:
    """``mods`` whose score functions (``score_mod``, ``score_mod_grad``,
    ``score_mod_args_grad``) compute as torch's FlexAttention does for inputs of
    ``dtype``: for float32 the Python floats they read are float32 (copies made by
    ``flex_build.float32_constants``); otherwise unchanged. ``mask_mod`` returns a
    bool and stays as given."""
    if np.dtype(dtype) != np.float32:
        return mods
    weak = kernels_for("flex", "cpu").float32_constants
    return replace(
        mods,
        score_mod=weak(mods.score_mod),
        score_grad=weak(mods.score_grad),
        args_grad=weak(mods.args_grad),
    )


def _kernels(mods: Mods, backward: bool):
    build = kernels_for("flex", "cpu")
    return build, build.specialise(
        mods.score_mod,
        mods.mask_mod,
        mods.score_grad if backward else None,
        (mods.score_args, mods.mask_args),
    )


def run_forward(qf, kf, vf, items, n_out, tiles: Tiles, mods: Mods, dtype):
    """``(out (n_out, L, Ev), lse (n_out, L))`` of the flex forward kernel over the work
    ``items`` (``FLEX_FORWARD_ITEM``): qf (BH, L, E) times the scale, kf, vf (BKV, S, .)."""
    mods = computing_in(mods, dtype)
    build, kernels = _kernels(mods, backward=False)
    args = (qf, kf, vf, _blocks(mods, tiles), items, tiles, mods.score_args, mods.mask_args)
    return build.call(kernels, "flex_forward", mods, dtype, *args, n_out)


def run_backward(qf, kf, vf, of, lf, gf, kv_index, n_heads, items, scale, tiles, mods, dtype):
    """``(dq, dk, dv)`` of the flex backward kernel over the work ``items``
    (``FLEX_BACKWARD_ITEM``): qf times the scale, lf the forward's lse (BH, L) float64."""
    mods = computing_in(mods, dtype)
    build, kernels = _kernels(mods, backward=True)
    return build.call(
        kernels,
        "flex_backward",
        mods,
        dtype,
        qf,
        kf,
        vf,
        of,
        lf,
        gf,
        kv_index,
        n_heads,
        _blocks(mods, tiles),
        items,
        scale,
        tiles,
        mods.score_args,
        mods.mask_args,
        backward=True,
    )


#: The most slots (private gradient buffers) of the mod_args gradients: a number fixed
#: whatever the threads, so that the sums are too.
_ARGS_SLOTS = 16


def _args_buffers(args, n_slots):
    """Per ``mod_args`` entry the float64 slot buffers (n_slots,) + its shape; for an entry
    without a gradient (not a float array) a placeholder of its shape ((1,) for a number)
    whose elements are all one scratch value per slot (stride 0: writes go unseen).

    A placeholder is never contiguous, whatever its shape (at least two slots, 16 bytes
    apart): numba would type one of shape (1, ..., 1) as C-contiguous and the others
    not, and compile the gradient kernels once more when a batch of 1 follows one of 2."""
    buffers = []
    for arg in args:
        if isinstance(arg, np.ndarray) and arg.dtype.kind == "f":
            buffers.append(np.zeros((n_slots,) + arg.shape))
            continue
        shape = arg.shape if isinstance(arg, np.ndarray) else (1,)
        slots = max(n_slots, 2)
        scratch = np.zeros((slots, 2))[:, 0]
        strides = (scratch.strides[0],) + (0,) * len(shape)
        buffers.append(np.lib.stride_tricks.as_strided(scratch, (slots,) + shape, strides))
    return tuple(buffers)


def run_args_backward(qf, kf, vf, of, lf, gf, kv_index, n_heads, items, tiles, mods, dtype):
    """The gradients of the ``mod_args`` entries (None for those that are not float arrays),
    each in its entry's shape and dtype, from ``score_mod_args_grad`` (see
    ``nbattn.kernels.flex_args``); arguments as in :func:`run_backward`, whose work items
    (``FLEX_BACKWARD_ITEM``) give the slices (each slice once, whatever its key-tile
    groups). The slots are summed in slot order, in float64."""
    mods = computing_in(mods, dtype)
    build = kernels_for("flex", "cpu")
    kernels = build.specialise_args(mods.score_mod, mods.mask_mod, mods.args_grad)
    items = np.ascontiguousarray(items[items["group"] == 0])
    args = mods.score_args
    per_slot = 8 * sum(
        a.size if isinstance(a, np.ndarray) and a.dtype.kind == "f" else 0 for a in args
    )
    room = max(1, config.FLASH_MAX_DQ_BUFFER_BYTES // max(per_slot, 1))
    n_slots = max(1, min(_ARGS_SLOTS, items.shape[0], room))
    grads = _args_buffers(args, n_slots)
    slices = Tiles(tiles.block_q, tiles.block_k, 1)
    arrays = (qf, kf, vf, of, lf, gf, kv_index, n_heads, _blocks(mods, slices), items, slices)
    build.call_args(kernels, mods, dtype, grads, *arrays, args, mods.mask_args)
    results = []
    for arg, buffer, given in zip(args, grads, mods.arg_dtypes, strict=True):
        if not (isinstance(arg, np.ndarray) and arg.dtype.kind == "f"):
            results.append(None)
            continue
        total = np.array(buffer[0])  # a copy; a 0-d array for a 0-d entry, not a scalar
        for slot in range(1, n_slots):
            total += buffer[slot]
        results.append(total.astype(given))
    return tuple(results)


@dataclass
class _FlexLayout:
    qf: np.ndarray  # (BH, L, E): q * scale
    kf: np.ndarray
    vf: np.ndarray
    lead: tuple
    kv_lead: tuple
    kv_index: np.ndarray
    n_heads: int
    band: tuple
    scale: float
    dtype: type
    shapes: tuple

    @property
    def work(self):
        n_bh, n_q, e = self.qf.shape
        return n_bh * n_q * self.kf.shape[1] * (e + self.vf.shape[2])


def _flat(x, lead):
    if x.shape[:-2] == tuple(lead) and x.flags.c_contiguous:
        return x.reshape((-1,) + x.shape[-2:])
    return flat_batch(x, lead)


def _layout(q, k, v, kw: Keywords, scale, mods: Mods, others=()) -> _FlexLayout:
    q, k, v, dtype = check_qkv(q, k, v, kw.enable_gqa, others)
    scale = check_scale(scale, q.shape[-1])
    check_dot_range(q, k, scale * LOG2E, dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead, kv_lead, kv_index = kv_layout(q.shape, k.shape, v.shape, kw.enable_gqa)
    if len(lead) > 2:
        raise ValueError(
            "score_mod, mask_mod and block_mask take q of shape (B, H, L, E) (b and h index "
            f"the two leading dimensions), got leading dimensions {lead}"
        )
    n_b = lead[0] if len(lead) == 2 else 1
    n_h = lead[-1] if lead else 1
    bm = mods.block_mask
    if bm is not None:
        mb, mh, ml, ms = bm.shape
        if (ml, ms) != (n_q, n_k) or mb not in (1, n_b) or mh not in (1, n_h):
            raise ValueError(
                f"block_mask was made for (B, H, L, S) = {bm.shape}; this call has "
                f"({n_b}, {n_h}, {n_q}, {n_k})"
            )
    qf = _flat(q, lead)
    qf *= dtype(scale)
    return _FlexLayout(
        qf,
        _flat(k, kv_lead),
        _flat(v, kv_lead),
        lead,
        kv_lead,
        kv_index,
        n_h,
        band(kw, n_q, n_k),
        scale,
        dtype,
        (q.shape, k.shape, v.shape),
    )


def _forward_tiles(n_k, band_, block_masked):
    """The forward's tiles: the flash kernels', with query tiles no taller than key
    tiles under a block mask.

    The long-sequence forward tiles are 512 queries x 256 keys: a query tile
    then spans two blocks of 256 of a block-diagonal (document) mask, and each
    of its live tiles is half masked, computed and evaluated per element. Square
    tiles visit only the live blocks (8 documents of 256 in 2048: half the
    tiles and no per-element mask, 2.1x faster measured).
    """
    tiles = flash_tiles(n_k, band_, backward=False)
    if block_masked and tiles.block_q > tiles.block_k:
        return Tiles(tiles.block_k, tiles.block_k, tiles.n_groups)
    return tiles


def _padded_forward_items(lay: _FlexLayout, tiles: Tiles) -> np.ndarray:
    """Every (query slice, query tile) against all keys; slices interleaved, and heavy and
    light causal tiles in turn (0, n-1, 1, n-2, ...), so that the threads finish together."""
    n_bh, n_q, _ = lay.qf.shape
    n_qt = -(-n_q // tiles.block_q)
    order = np.arange(n_bh * n_qt)
    bh = order % n_bh
    turn = order // n_bh
    qt = np.where(turn % 2 == 0, turn // 2, n_qt - 1 - turn // 2)
    i0 = qt * tiles.block_q
    offset, left, right = lay.band
    return item_table(
        FLEX_FORWARD_ITEM,
        bh=bh,
        kv=lay.kv_index[bh],
        out=bh,
        b=bh // lay.n_heads,
        h=bh % lay.n_heads,
        qt=qt,
        i0=i0,
        row0=i0,
        rows=np.minimum(tiles.block_q, n_q - i0),
        k_row0=0,
        k_lo=0,
        k_hi=lay.kf.shape[1],
        offset=offset,
        left=left,
        right=right,
    )


def flex_forward(q, k, v, kw: Keywords, scale, return_lse, mods: Mods, device="cpu"):
    """:func:`nbattn.flash_attention` with score_mod / mask_mod / block_mask (see the
    module docstring) on ``device`` ("cpu" or "cuda": ``nbattn.attn.flex_cuda``)."""
    lay = _layout(q, k, v, kw, scale, mods)
    n_bh, n_q, _ = lay.qf.shape
    scales = value_scales(lay.vf, lay.kf.shape[1])
    scale_values(lay.vf, scales)
    tiles = _forward_tiles(lay.kf.shape[1], lay.band, mods.block_mask is not None)
    if device == "cuda":
        out, lse = flex_cuda.forward(lay, tiles, computing_in(mods, lay.dtype))
    else:
        items = _padded_forward_items(lay, tiles)
        with blas_one_thread(), serial_below(lay.work, config.FLASH_SERIAL_WORK):
            out, lse = run_forward(lay.qf, lay.kf, lay.vf, items, n_bh, tiles, mods, lay.dtype)
    unscale_output(out, scales, lay.kv_index)
    out = out.reshape(lay.lead + (n_q, lay.vf.shape[2]))
    if not return_lse:
        return out
    return out, lse.reshape(lay.lead + (n_q,))


def flex_backward(q, k, v, out, lse, grad_out, kw: Keywords, scale, mods: Mods, device="cpu"):
    """:func:`nbattn.flash_attention_backward` with score_mod / mask_mod / block_mask:
    ``(dq, dk, dv)``, the derivative of ``score_mod`` by the complex step or from
    ``score_mod_grad``, on ``device`` ("cpu" or "cuda"); and the gradients of
    ``mod_args`` as a fourth result when ``score_mod_args_grad`` is given
    (:func:`run_args_backward`, CPU only)."""
    lay = _layout(q, k, v, kw, scale, mods, others=(out, grad_out))
    n_bh, n_q, _ = lay.qf.shape
    n_kv, n_k, _ = lay.kf.shape
    out, lse, grad_out = check_forward_results(
        out, lse, grad_out, lay.lead, n_q, lay.vf.shape[2], lay.dtype
    )
    of = flat_batch(out, lay.lead, lay.dtype)
    gf = flat_batch(grad_out, lay.lead, lay.dtype)
    lf = np.ascontiguousarray(lse.reshape(-1, n_q), dtype=np.float64)
    block_k = flash_tiles(n_k, lay.band, backward=True).block_k
    n_groups = backward_groups(n_kv, -(-n_k // block_k), lay.qf.nbytes)
    tiles = flash_tiles(n_k, lay.band, backward=True, n_groups=n_groups)
    offset, left, right = lay.band
    items = item_table(
        FLEX_BACKWARD_ITEM,
        kv=np.repeat(np.arange(n_kv), n_groups),
        group=np.tile(np.arange(n_groups), n_kv),
        b0=0,
        q_row0=0,
        n_q=n_q,
        k_row0=0,
        n_k=n_k,
        offset=offset,
        left=left,
        right=right,
    )
    arrays = (lay.qf, lay.kf, lay.vf, of, lf, gf, lay.kv_index, lay.n_heads, items, lay.scale)
    if device == "cuda":
        dq, dk, dv = flex_cuda.backward(lay, of, lf, gf, tiles, computing_in(mods, lay.dtype))
    else:
        with blas_one_thread(), serial_below(lay.work, config.FLASH_SERIAL_WORK):
            dq, dk, dv = run_backward(*arrays, tiles, mods, lay.dtype)
            if mods.args_grad is not None:
                d_args = run_args_backward(*arrays[:-1], tiles, mods, lay.dtype)
    q_shape, k_shape, v_shape = lay.shapes
    grads = (
        unbroadcast(dq.reshape(lay.lead + dq.shape[1:]), q_shape),
        unbroadcast(dk.reshape(lay.kv_lead + dk.shape[1:]), k_shape),
        unbroadcast(dv.reshape(lay.kv_lead + dv.shape[1:]), v_shape),
    )
    return grads if mods.args_grad is None else grads + (d_args,)
