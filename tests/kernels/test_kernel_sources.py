"""Source rules that keep the CPU kernels' compile time down (docs/ARCHITECTURE.md, "Tests")."""

import ast
from pathlib import Path

import nbattn.kernels

KERNELS = Path(nbattn.kernels.__file__).parent


def _slice_assignments_from_arrays(tree):
    """``a[..., i:j, ...] = <not a number>`` (plain or augmented) statements, by line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AugAssign):
            targets, value = [node.target], node.value
        else:
            continue
        numeric = isinstance(value, ast.Constant) or (
            isinstance(value, ast.UnaryOp) and isinstance(value.operand, ast.Constant)
        )
        for target in targets:
            if not isinstance(target, ast.Subscript) or numeric:
                continue
            index = target.slice
            parts = index.elts if isinstance(index, ast.Tuple) else [index]
            if any(isinstance(part, ast.Slice) for part in parts):
                found.append(node.lineno)
    return found


def test_no_kernel_assigns_an_array_to_a_slice():
    """numba compiles its shape-mismatch message (string formatting, about 6 s of CPU)
    into every kernel that assigns an array to a slice; kernels copy element by element.
    A scalar fill (``acc[:nb] = 0.0``) is fine."""
    offenders = []
    for path in sorted(KERNELS.glob("*.py")):
        for line in _slice_assignments_from_arrays(ast.parse(path.read_text())):
            offenders.append(f"{path.name}:{line}")
    assert not offenders, offenders


def test_the_scan_finds_what_it_looks_for():
    source = "a[1:3] = b[0]\na[i, :] += c\na[:] = 0.0\na[:n] = -1\na[i] = b\n"
    assert _slice_assignments_from_arrays(ast.parse(source)) == [1, 2]
