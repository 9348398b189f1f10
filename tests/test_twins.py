"""The CUDA twins take the arguments of their CPU kernels.

For every op that ``nbattn.dispatch.device.KERNELS`` maps on both devices, each
public function of the CUDA module has the parameter names, in the same order,
of the CPU module's function of the same name, and each argument group (a
``NamedTuple`` class, as the local kernels take) the same fields: the functional
layers call whichever module ``kernels_for`` returns with one call. The modules
are read from their source with ``ast`` (importing ``nbattn.cuda`` needs
numba-cuda). A module's public names are its ``__all__`` where it has one
(re-exports from sibling modules included), else its top-level functions whose
names do not start with an underscore. Functions of one side only (the CUDA
kernel factories) are not compared.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import nbattn
from nbattn.dispatch.device import KERNELS

#: Twins that differ today, by (op, function name), with the reason. A pair that comes
#: to agree must leave this table (the last test checks it).
KNOWN_MISMATCHES = {
    ("flash", "flash_forward"): (
        "the CUDA host wrapper takes (q, k, v, *args): the CPU kernel's full argument "
        "list, or the short form (q, k, v, scale, causal) of the user's q"
    ),
    ("flash", "flash_backward"): (
        "the CUDA host wrapper takes (q, k, v, out, lse, dout, *args): the CPU kernel's "
        "full argument list, or the short form (..., scale, causal)"
    ),
}

#: Ops whose two modules are not function-by-function twins, with the reason.
NOT_FUNCTION_TWINS = {
    "flex": (
        "the CPU side specialises a generated copy of the template per user function "
        "(specialise, call); the CUDA side builds closures around them (flex_kernels, "
        "flex_forward, flex_backward)"
    ),
}

_PACKAGE_ROOT = pathlib.Path(nbattn.__file__).parent.parent
_TWIN_OPS = sorted({op for op, device in KERNELS if device == "cuda" and (op, "cpu") in KERNELS})


def _tree(module):
    return ast.parse((_PACKAGE_ROOT / (module.replace(".", "/") + ".py")).read_text())


def _definitions(module):
    """Name -> the function or class definition that ``module`` binds, following its
    relative imports (``from .local_args import LocalData``, ``from .._core.local_groups
    import LocalData``)."""
    found = {}
    for node in _tree(module).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
            source = f"{module.rsplit('.', node.level)[0]}.{node.module}"
            if not (_PACKAGE_ROOT / (source.replace(".", "/") + ".py")).is_file():
                continue  # ``from .._core import local_groups``: a package's submodule
            sibling = _definitions(source)
            for alias in node.names:
                if alias.name in sibling:
                    found[alias.asname or alias.name] = sibling[alias.name]
    return found


def _public(module):
    tree = _tree(module)
    names = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            names = ast.literal_eval(node.value)
    if names is None:
        names = [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
        ]
    definitions = _definitions(module)
    return {name: definitions[name] for name in names if name in definitions}


def _signature(node):
    """Parameter names in order (``*args``, ``**kwargs`` marked); a NamedTuple's fields."""
    if isinstance(node, ast.ClassDef):
        return [item.target.id for item in node.body if isinstance(item, ast.AnnAssign)]
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args]
    names += [f"*{args.vararg.arg}"] if args.vararg else []
    names += [a.arg for a in args.kwonlyargs]
    names += [f"**{args.kwarg.arg}"] if args.kwarg else []
    return names


def _mismatches(op):
    cpu = _public(KERNELS[(op, "cpu")])
    cuda = _public(KERNELS[(op, "cuda")])
    return {
        name: (_signature(cpu[name]), _signature(cuda[name]))
        for name in sorted(set(cpu) & set(cuda))
        if type(cpu[name]) is not type(cuda[name])
        or _signature(cpu[name]) != _signature(cuda[name])
    }


def test_every_twin_pair_is_read():
    """The ops with both devices, each module found and holding public names in common."""
    assert {"pooling", "loo", "flash", "local", "decode", "varlen"} <= set(_TWIN_OPS)
    for op in _TWIN_OPS:
        common = set(_public(KERNELS[(op, "cpu")])) & set(_public(KERNELS[(op, "cuda")]))
        assert bool(common) != (op in NOT_FUNCTION_TWINS), op


@pytest.mark.parametrize("op", _TWIN_OPS)
def test_cuda_twins_take_the_cpu_kernels_arguments(op):
    unexplained = {
        name: pair for name, pair in _mismatches(op).items() if (op, name) not in KNOWN_MISMATCHES
    }
    assert unexplained == {}, f"{op}: name -> (CPU parameters, CUDA parameters)"


def test_local_twins_share_their_argument_groups():
    """The local kernels' groups are compared like functions (their fields, in order)."""
    cpu = _public(KERNELS[("local", "cpu")])
    cuda = _public(KERNELS[("local", "cuda")])
    for name in ("LocalData", "LocalModel", "LocalFit"):
        assert isinstance(cpu[name], ast.ClassDef) and isinstance(cuda[name], ast.ClassDef)
        assert _signature(cpu[name]) == _signature(cuda[name]) != []
    assert "local_fit" in cpu and "local_fit" in cuda


def test_known_mismatches_still_differ():
    """An entry of KNOWN_MISMATCHES whose twins agree by now is stale: remove it."""
    stale = [(op, name) for op, name in KNOWN_MISMATCHES if name not in _mismatches(op)]
    assert stale == []
