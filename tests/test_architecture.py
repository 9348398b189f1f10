"""docs/ARCHITECTURE.md states the layer rules import-linter checks; the house keeps its shape.

``lint-imports`` (run by scripts/test) checks the contracts of ``[tool.importlinter]`` in
pyproject.toml; these tests keep the prose from drifting away from them, and check the
size rules of the house (top-level modules, module length).
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def _documented_layers() -> list[str]:
    block = re.search(
        r"<!-- layers:begin -->\n```\n(.*?)```\n<!-- layers:end -->", ARCHITECTURE, re.S
    )
    assert block, "docs/ARCHITECTURE.md has no <!-- layers:begin --> block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_documented_layers_are_the_checked_ones():
    (layers,) = [c for c in CONTRACTS if c["type"] == "layers"]
    assert _documented_layers() == layers["layers"]


def test_every_contract_is_described():
    for contract in CONTRACTS:
        assert contract["name"] in ARCHITECTURE, contract["name"]
        for module in contract.get("source_modules", []) + contract.get("forbidden_modules", []):
            assert f"`{module}`" in ARCHITECTURE, module


def test_the_top_level_holds_at_most_eight_plain_modules():
    plain = sorted(p.name for p in (ROOT / "nbattn").glob("*.py"))
    assert len(plain) <= 8, plain


def test_no_module_is_over_800_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "nbattn").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 800
    }
    assert long == {}


def test_only_cuda_and_dispatch_import_numba_cuda():
    """The one floor above ``nbattn.cuda`` that touches numba-cuda is ``nbattn.dispatch``."""
    import ast

    found = []
    for path in (ROOT / "nbattn").rglob("*.py"):
        if path.parent.name in ("cuda", "dispatch"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("numba", "numba.cuda"):
                names = {a.name for a in node.names}
                if node.module == "numba.cuda" or "cuda" in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Import) and any(
                a.name.startswith("numba.cuda") for a in node.names
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
