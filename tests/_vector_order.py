"""Tools for the tests that a kernel's bits do not depend on where its arrays lie.

LLVM vectorises a loop that stores to one array while it reads another behind a runtime
check: when the stored array begins within one vector step after the address being
read (``diff.check``) or the two ranges overlap (``found.conflict``), the loop runs in
its scalar form instead. For an element-wise loop both forms give the same bits. For a
loop that also sums floats with ``reassoc`` they do not: the vector form keeps one
partial sum per lane and adds the lanes at the end, the scalar form adds in order. So a
sum taken in a loop that stores would change in its last bits with the addresses of
the arrays, which differ between processes. The kernels keep every floating-point sum
in a loop that stores nothing.

* :func:`guarded_float_sums` finds such loops in a function's LLVM IR, and
  :func:`address_dependent_sums` those behind a distance check (a check of overlapping
  ranges fails only where two arrays really overlap, the same in every process);
* :func:`fresh_ir` compiles a jitted function afresh (numba shows no IR for code loaded
  from its cache) for the given arguments and returns its IR;
* :func:`adjacent_after` places one array right after another in one allocation, so a
  test can call a kernel with its scratch where the runtime check would fire.
"""

from __future__ import annotations

import re

import numpy as np
from numba import njit

_BLOCK_LABEL = re.compile(r"^([\w.$-]+):")
_CHECKS = ("%diff.check", "%found.conflict", "%conflict.rdx")
_FLOAT_VECTOR_PHI = re.compile(r"= phi (?:[a-z ]*)<\d+ x (?:float|double)>")


def _blocks(function_ir):
    blocks, label, lines = {}, "entry", []
    for line in function_ir.splitlines()[1:]:
        match = _BLOCK_LABEL.match(line)
        if match:
            blocks[label] = lines
            label, lines = match.group(1), []
        else:
            lines.append(line)
    blocks[label] = lines
    return blocks


def _successors(lines):
    found = []
    for line in lines:
        if line.strip().startswith(("br ", "switch ")):
            found += re.findall(r"label %([\w.$-]+)", line)
    return found


def guarded_float_sums(ir):
    """``[(function, check block, vector body, kind)]``: the vectorised loops of ``ir``
    (LLVM IR text) entered through a runtime alias check (a ``vector.memcheck`` block, or
    the ``diff.check`` / ``found.conflict`` comparisons merged into another block) whose
    vector body carries a floating-point vector phi (a sum kept per lane). ``kind``:
    "distance" for a ``diff.check`` (it fails for arrays that merely lie close), else
    "overlap"."""
    found = []
    for function in re.findall(r"^define .*?^}", ir, flags=re.S | re.M):
        name = re.search(r'@"?([^"(]+)"?\(', function.splitlines()[0]).group(1)
        blocks = _blocks(function)
        for label, lines in blocks.items():
            text = "\n".join(lines)
            kind = "distance" if "%diff.check" in text else "overlap"
            # the check may be merged into the block before it, but keeps its names
            if not (label.startswith("vector.memcheck") or any(c in text for c in _CHECKS)):
                continue
            seen, stack = set(), [label]
            while stack:  # the vector path of this check, up to its loop bodies
                block = stack.pop()
                if block in seen or block not in blocks:
                    continue
                seen.add(block)
                if "vector.body" in block:
                    if any(_FLOAT_VECTOR_PHI.search(line) for line in blocks[block]):
                        found.append((name, label, block, kind))
                    continue
                if "scalar.ph" in block or "middle.block" in block:
                    continue
                stack += [
                    s for s in _successors(blocks[block]) if s.startswith(("vector.", "vec."))
                ]
    return found


def address_dependent_sums(ir):
    """The loops of :func:`guarded_float_sums` behind a distance check: their sums take the
    scalar or the vector order depending on where the arrays lie."""
    return [loop for loop in guarded_float_sums(ir) if loop[3] == "distance"]


def fresh_ir(function, *args, **options):
    """The LLVM IR of ``function`` (a numba dispatcher) compiled anew, without the
    on-disk cache, for ``args``; ``options`` as ``njit``'s (the project's fastmath
    flags unless given)."""
    from nbattn import config

    options.setdefault("fastmath", config.FASTMATH)
    copy = njit(**options)(function.py_func)
    copy(*args)
    return "\n".join(copy.inspect_llvm().values())


def adjacent_after(first, second_shape, dtype=None):
    """``(a, b)``: a copy of ``first`` and an uninitialised array of ``second_shape``
    that begins where ``a`` ends, both views of one allocation."""
    first = np.asarray(first)
    dtype = np.dtype(dtype or first.dtype)
    if dtype != first.dtype:
        raise ValueError("adjacent_after: one dtype for both arrays")
    size = int(np.prod(second_shape))
    buffer = np.empty(first.size + size, dtype=dtype)
    a = buffer[: first.size].reshape(first.shape)
    a[...] = first
    return a, buffer[first.size :].reshape(second_shape)
