"""What the flex kernels (``nbattn.kernels.flex``, compiled anew per user function) take
from here: :func:`tanh`, the vectorisable tanh for the user's ``score_mod``
(``nbattn.flex_tanh``), and the functions that do not depend on the user's functions
(:func:`block_state`, :func:`band_limits`, :func:`backward_shifts`): compiled once and
cached here, not once per generated module. Their work items run on
:mod:`nbattn.kernels.items`, and the backward's row terms and dQ sum are flash's
compiled-once kernels.
"""

from __future__ import annotations

import cmath

import numba
import numpy as np
from numba import njit, types
from numba.core.registry import cpu_target
from numba.extending import intrinsic, overload

from .. import config
from .._core.numeric import LOG2E
from .base2 import TANH_REAL
from .fastmath import like

__all__ = [
    "LIMIT32",
    "LIMIT64",
    "MAX32",
    "backward_shifts",
    "band_limits",
    "block_state",
    "compiled_entry",
    "held_args",
    "load_args",
    "tanh",
]


def tanh(x):
    """``tanh(x)`` for a ``score_mod``: inside the compiled kernel an inlined form that
    vectorises with the score loop (numba's ``np.tanh`` of a float is a call to the
    C library, one element at a time).

    For a real ``x`` (float32 or float64) it is the ``softcap=`` path's
    tanh, ``nbattn.kernels.base2.tanh_real`` (an odd polynomial below 1/32, else
    sign(x) (1 - e) / (1 + e) with e = 2**(-2 ``|x|`` log2(e)); within a few units in
    the last place). For a complex ``x`` it is ``cmath.tanh``, exact, so the
    complex-step derivative of the backward (``nbattn.kernels.flex``) works
    through it. Called from Python it is ``np.tanh`` (arrays too, as the
    reference implementations call a ``score_mod``).
    """
    return np.tanh(x)


def _tanh_complex(x):
    return cmath.tanh(x)


# error_model="numpy": (1 - e) / (1 + e) without the division-by-zero check, whose
# branch (never taken: 1 + e >= 1) would keep the score loop from vectorising.
@overload(tanh, jit_options={"fastmath": config.FASTMATH, "error_model": "numpy"})
def _tanh_overload(x):
    if isinstance(x, types.Complex):
        return _tanh_complex
    if isinstance(x, types.Float):
        return TANH_REAL[x.bitwidth]
    return None


#: The largest score whose base-2 form (times log2(e)) is finite, per tile dtype.
LIMIT64 = float(np.finfo(np.float64).max) / LOG2E
LIMIT32 = float(np.finfo(np.float32).max) / LOG2E
#: The largest float32: a finite float64 score beyond it is stored as it (sign kept).
MAX32 = float(np.finfo(np.float32).max)

#: A bound on the relative rounding error of lse log2(e) (lse from the forward's m ln 2 +
#: log l): 4 ulp, twice what the three roundings can make.
NOISE = 2.0**-50


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def block_state(blocks, b, h, qt, kt):
    """The tile's class in ``blocks``: 0 closed, 1 partial, 2 open."""
    return blocks[
        b if blocks.shape[0] > 1 else 0,
        h if blocks.shape[1] > 1 else 0,
        qt if blocks.shape[2] > 1 else 0,
        kt if blocks.shape[3] > 1 else 0,
    ]


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def band_limits(i, j0, nb, band):
    """The tile columns [lo, hi) of row i inside the band."""
    offset, left, right = band
    centre = i + offset - j0
    return min(max(centre - left, 0), nb), min(max(centre + right + 1, 0), nb)


@njit(fastmath=config.FASTMATH, cache=config.CACHE)
def backward_shifts(lse, like_array):
    """(3, BH, L) in ``like_array``'s dtype: per row of ``lse`` (float64, natural units)
    the shift lse log2(e) as (top, rest, margin) for :func:`_weights`. float32: top =
    float32(shift), rest = the float32 of what top leaves (0 when within the shift's
    rounding error, ``NOISE``), margin 0; float64: top = shift, rest 0, margin its
    rounding error."""
    n_bh, n_q = lse.shape
    out = np.zeros((3, n_bh, n_q), dtype=like_array.dtype)
    for bh in range(n_bh):
        for i in range(n_q):
            shift = lse[bh, i] * LOG2E
            noise = abs(shift) * NOISE
            top = like(shift, like_array)
            out[0, bh, i] = top
            if like_array.itemsize == 4:
                rest = shift - np.float64(top)
                if abs(rest) > noise:
                    out[1, bh, i] = rest
            else:
                out[2, bh, i] = noise
    return out


# ------------------------------------------------------------- mod_args held at an address
#
# The flex loops (``nbattn.kernels.flex_loops``) only pass ``mod_args`` through to the tile
# function. Taken as arguments, their types would be part of the loops' signature, and
# the loops would compile again (about 2 CPU s each, forward and backward) for every
# combination of types a caller passes (a float64 table and a float, an int32 table and
# an int, a bool table...). Instead the loops take one int64: the address of the
# arguments' native representation (numba's struct of the tuple, arrays as numba holds
# them), written by :func:`held_args`; the tile function of a generated module, which
# is specialised on these types anyway, reads them back with :func:`load_args`. The
# values are the same bits, passed the same way to the user's functions.


@intrinsic
def _store(typingctx, buffer, value):
    """Write ``value``'s native representation into ``buffer``'s bytes and take a reference
    to its arrays (they stay alive until :func:`_release`)."""

    def codegen(context, builder, sig, args):
        array, val = args
        data = context.make_array(sig.args[0])(context, builder, array).data
        where = builder.bitcast(data, context.get_value_type(sig.args[1]).as_pointer())
        builder.store(val, where)
        context.nrt.incref(builder, sig.args[1], val)
        return context.get_dummy_value()

    return types.none(buffer, value), codegen


@intrinsic
def _release(typingctx, buffer, value):
    """Drop the references :func:`_store` took (``value`` gives only the type)."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        where = builder.bitcast(data, context.get_value_type(sig.args[1]).as_pointer())
        context.nrt.decref(builder, sig.args[1], builder.load(where))
        return context.get_dummy_value()

    return types.none(buffer, value), codegen


@intrinsic
def load_args(typingctx, address, kind):
    """The value of type ``kind`` (a type reference: a global numba type) that
    :func:`held_args` wrote at ``address``, a new reference to it."""
    value_type = kind.instance_type

    def codegen(context, builder, sig, args):
        where = builder.inttoptr(args[0], context.get_value_type(value_type).as_pointer())
        value = builder.load(where)
        context.nrt.incref(builder, value_type, value)
        return value

    return value_type(address, kind), codegen


@njit(cache=config.CACHE)
def _hold(buffer, value, release):
    """:func:`_store` ``value`` into ``buffer``, or with ``release`` :func:`_release` it: one
    function, so that each new type of ``mod_args`` compiles one small kernel, not two."""
    if release:
        _release(buffer, value)
    else:
        _store(buffer, value)


class held_args:  # noqa: N801 - used as a function: ``with held_args(value) as address``
    """``with held_args(value, kind) as address``: ``value`` (a tuple of arrays and numbers)
    written, in numba's native representation of the type ``kind`` (None:
    ``numba.typeof(value)``), into a buffer whose address (an int) the block gets;
    :func:`load_args` reads it back inside a kernel with that type. A value of another
    type than ``kind`` is a TypeError here: read at another layout it would be garbage
    or a crash. The arrays are referenced until the block ends, however it ends, and
    released as the type written, whatever the value became meanwhile; the buffer must
    not be read after that (the flex loops' ``run_items`` returns only once no thread
    runs an item)."""

    def __init__(self, value, kind=None):
        given = numba.typeof(value)
        if kind is not None and given != kind:
            raise TypeError(f"mod_args of types {given}, where {kind} are read")
        self.value = value
        context = cpu_target.target_context
        size = context.get_abi_sizeof(context.get_value_type(given))
        # 16-byte aligned: a float's or a pointer's alignment whatever the dtype's
        self.buffer = np.zeros(max(size, 1) + 15, dtype=np.uint8)
        start = (-self.buffer.ctypes.data) % 16
        self.buffer = self.buffer[start : start + max(size, 1)]
        self.signature = (numba.typeof(self.buffer), given, types.boolean)

    def __enter__(self):
        compiled_entry(_hold, self.signature)(self.buffer, self.value, False)
        return self.buffer.ctypes.data

    def __exit__(self, *exc):
        compiled_entry(_hold, self.signature)(self.buffer, self.value, True)
        return False


def compiled_entry(kernel, signature):
    """``kernel``'s compiled entry point for exactly ``signature`` (compiled, or loaded from
    the cache, on first use). The dispatcher would otherwise pick an overload it can
    convert the arguments to (a Python int of [2**63, 2**64) into an int64 one, an
    OverflowError; a jitted function as its own type, a compile per function), where the
    callers need the machine code of that one signature."""
    compiled = kernel.overloads.get(signature)
    if compiled is None:
        kernel.compile(signature)
        compiled = kernel.overloads[signature]
    return compiled.entry_point
