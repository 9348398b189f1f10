"""Every nbattn module imports on its own, and no two modules import each other.

Each module is imported in a fresh interpreter (``python -c "import nbattn.X"``),
so an import that only works because another module happened to be loaded
first fails here. The import graph between nbattn's own modules -- every
``import`` statement, at module level or inside a function -- must have no
cycle: a cycle through a function-level import works until someone moves it
to the top. The package itself (``from . import __version__``) is not a node.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "nbattn"
ROOT = PACKAGE.parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py"))


def _has_numba_cuda() -> bool:
    try:
        importlib.import_module("numba.cuda")
    except Exception:
        return False
    return True


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a (possibly relative) import inside ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _edges(module: str) -> set[str]:
    """The nbattn modules that ``module`` imports anywhere in its source."""
    path = ROOT.joinpath(*module.split("."))
    is_package = path.is_dir()
    source = (path / "__init__.py") if is_package else path.with_suffix(".py")
    tree = ast.parse(source.read_text())
    known = set(MODULES)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = _resolve(module, is_package, node.level, node.module)
            names = [f"{parent}.{alias.name}" for alias in node.names] + [parent]
        else:
            continue
        for name in names:
            if name in known and name != "nbattn" and name != module:
                found.add(name)
    # importing nbattn.a.b loads nbattn.a first; that is not an edge of its own
    return {m for m in found if not module.startswith(m + ".")}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_module_list_is_complete():
    assert "nbattn.attn.attention" in MODULES and "nbattn.kernels.flash" in MODULES
    assert "nbattn._flash_gpu" not in MODULES  # folded into nbattn.flash


def test_no_import_cycle_between_nbattn_modules():
    graph = {m: _edges(m) for m in MODULES if m != "nbattn"}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


#: Run in one interpreter: numpy, numba and the other libraries nbattn's modules use are
#: loaded once, then each module is imported in a fork of that interpreter, where no
#: nbattn module is loaded yet. A fresh interpreter per module would load them all over
#: again for each module (about 30 s of CPU); a module that forgets an import of its own
#: fails here all the same (another library loaded is not a name bound in the module).
_FORK_SERVER = """
import importlib, json, os, sys, traceback
import numpy, numba
for library in ("scipy.optimize", "scipy.special", "scipy.stats", "pandas", "sklearn.base",
                "sklearn.utils.validation", "matplotlib.pyplot", "tqdm", "threadpoolctl",
                "dask.array", "dask.dataframe", "distributed"):
    try:
        importlib.import_module(library)
    except ImportError:  # an optional one that is not installed
        pass
results = {}
for module in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            __import__(module)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        err = pipe.read()
    _, status = os.waitpid(pid, 0)
    results[module] = (os.waitstatus_to_exitcode(status), err)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def fresh_imports():
    """Every module imported where no other nbattn module is loaded: {module: (rc, stderr)}."""
    skip_cuda = not _has_numba_cuda()
    skip_torch = importlib.util.find_spec("torch") is None  # the optional adapter needs it
    modules = [
        m
        for m in MODULES
        if not (skip_cuda and m.startswith("nbattn.cuda"))
        and not (skip_torch and m == "nbattn.torch")
    ]
    if hasattr(os, "fork"):
        out = subprocess.run(
            [sys.executable, "-c", _FORK_SERVER, json.dumps(modules)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout
        return {module: tuple(result) for module, result in json.loads(out).items()}
    running = {  # no fork (Windows): a fresh interpreter per module, side by side
        module: subprocess.Popen(
            [sys.executable, "-c", f"import {module}"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for module in modules
    }
    results = {}
    for module, process in running.items():
        _, err = process.communicate(timeout=600)
        results[module] = (process.returncode, err)
    return results


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_in_a_fresh_process(module, fresh_imports):
    if module not in fresh_imports:
        pytest.skip(f"{'torch' if module == 'nbattn.torch' else 'numba-cuda'} is not installed")
    rc, err = fresh_imports[module]
    assert rc == 0, f"import {module} failed:\n{err[-3000:]}"
