"""Packaging and start-up: the wheel carries code, data and the command; import is lazy.

The wheel tests build a wheel from a copy of the source tree and install it,
not editable, into a new virtual environment whose only view of the test
environment is one ``.pth`` line naming its site-packages (for numpy, numba,
pandas, ...). They then work from a folder outside the source tree, so what
runs is what the wheel holds. They do not download the dependencies from a
registry into an empty environment (minutes); ``pip check`` in the new
environment compares the wheel's declared requirements with what it sees.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

import nbattn

from ._scripts import run_checked

ROOT = Path(__file__).resolve().parent.parent

#: Libraries that ``import nbattn`` must not load, and the functional layer neither.
HEAVY = ("sklearn", "pandas", "matplotlib", "dask", "distributed", "pyarrow", "torch")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="in the standard library from Python 3.11")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _run_python(code: str, python=sys.executable, cwd=ROOT, env=None, timeout=600):
    return run_checked(
        [python, "-c", textwrap.dedent(code)], cwd=cwd, env=env, timeout=timeout
    ).stdout


# ----------------------------------------------------------------------------- lazy import

#: Run in one fresh process; it reaches the public names in steps and records,
#: after each step, the heavy libraries loaded so far. Loading only grows, so
#: the first step that shows a library is the one that loaded it.
_IMPORT_PROBE = """
import importlib, json, pkgutil, sys
HEAVY = set({heavy!r})
steps = {{}}
def record(step):
    steps[step] = sorted({{m.split(".")[0] for m in sys.modules}} & HEAVY)
import nbattn
record("import nbattn")
steps["numpy or numba after import nbattn"] = "numpy" in sys.modules or "numba" in sys.modules
for name in {functional!r}:
    getattr(nbattn, name)
    record(name)
lazy_submodule = "nbattn.datasets" not in sys.modules
lazy_submodule &= nbattn.datasets.__name__ == "nbattn.app.datasets"
nbattn.NadarayaWatsonRegressor
record("NadarayaWatsonRegressor")
modules = [m.name for m in pkgutil.walk_packages(nbattn.__path__, "nbattn.")
           if not m.name.startswith(("nbattn.cuda", "nbattn.data", "nbattn.app.dask",
                                     "nbattn.torch"))]
for module in modules:
    importlib.import_module(module)
wrong = [n for n, mod in nbattn._PUBLIC.items()
         if getattr(nbattn, n) is not getattr(sys.modules["nbattn." + mod], n)]
print(json.dumps({{"steps": steps, "lazy_submodule": lazy_submodule, "wrong": wrong,
                  "modules": modules, "attention": type(nbattn.attention).__name__}}))
"""

#: The names of the functional layer: reaching them loads numpy and numba only.
FUNCTIONAL = sorted(
    {n for n, module in nbattn._PUBLIC.items() if not module.startswith("estimators")}
) + [
    "positional",
    "scores",
]


@pytest.fixture(scope="module")
def import_probe():
    code = _IMPORT_PROBE.format(heavy=HEAVY, functional=FUNCTIONAL)
    return json.loads(_run_python(code).strip().splitlines()[-1])


def test_import_nbattn_loads_no_heavy_library(import_probe):
    assert import_probe["steps"]["import nbattn"] == []
    assert import_probe["steps"]["numpy or numba after import nbattn"] is False


def test_functional_names_load_no_heavy_library(import_probe):
    """Reaching a name of the functional layer (attention, flash, regression,
    layers, io, positional, scores) loads numpy and numba, not scikit-learn,
    pandas, matplotlib or Dask."""
    steps = import_probe["steps"]
    assert {name: steps[name] for name in FUNCTIONAL if steps[name]} == {}


def test_estimators_load_scikit_learn_when_used(import_probe):
    assert "sklearn" in import_probe["steps"]["NadarayaWatsonRegressor"]


def test_public_names_resolve_after_every_submodule_is_imported(import_probe):
    """Importing a submodule binds it on the package; ``nbattn.attention`` must still
    be the function, and every public name the object its module defines."""
    assert import_probe["wrong"] == [] and import_probe["attention"] == "function"
    assert {"nbattn.attn.attention", "nbattn.attn.layers", "nbattn.app.cli"} <= set(
        import_probe["modules"]
    )


def test_submodules_load_on_attribute_access(import_probe):
    assert import_probe["lazy_submodule"] is True
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        nbattn.no_such_name  # noqa: B018


def test_public_name_lists_agree():
    """``_PUBLIC`` (what loads lazily), ``__all__`` and the TYPE_CHECKING imports
    (what type checkers see) name the same things."""
    tree = ast.parse((ROOT / "nbattn" / "__init__.py").read_text())
    static, submodules = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                for alias in imp.names:
                    if imp.module is None or alias.name in nbattn.ALIASES:  # public submodules
                        submodules.add(alias.name)
                    else:
                        static[alias.name] = imp.module
    assert static == nbattn._PUBLIC
    assert submodules == {"positional", "scores"}
    assert sorted(nbattn.__all__) == sorted([*nbattn._PUBLIC, *submodules, "__version__"])
    for name in nbattn.__all__:
        assert getattr(nbattn, name) is not None
    assert set(nbattn.__all__) <= set(dir(nbattn))


# ----------------------------------------------------------------------------- metadata


def test_version_has_one_source():
    project = _pyproject()
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nbattn.__version__"}


def test_package_list_covers_the_source_tree():
    """The packages are listed by hand (for the data mapping); a new subpackage
    under nbattn/ that is missing from the list would be missing from the wheel."""
    setuptools = _pyproject()["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "nbattn").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == on_disk | {"nbattn.data"}
    assert setuptools["package-dir"] == {"nbattn.data": "data"}
    assert (ROOT / "data" / "__init__.py").is_file()


# ----------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """The source tree copied, so that building writes nothing into the checkout."""
    dest = tmp_path_factory.mktemp("source") / "nbattn-src"
    shutil.copytree(
        ROOT,
        dest,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
            ".hypothesis", "figures", "out",
        ),
    )  # fmt: skip
    return dest


@pytest.fixture(scope="module")
def wheel(source_copy, tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    _pip(
        "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(source_copy)
    )
    (path,) = out.glob("nbattn-*.whl")
    return path


def _new_venv(where: Path) -> Path:
    """A virtual environment without pip that sees the test environment's
    site-packages through one .pth line; returns its python."""
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(where)
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site_dir = _run_python("import sysconfig; print(sysconfig.get_paths()['purelib'])", python)
    # Every folder this interpreter imports from (site-packages, user site, ...)
    # but the checkout itself. They come after the new site-packages, so the
    # installed nbattn is the one found (the tests check its path).
    seen = [Path(p).resolve() for p in sys.path if p and Path(p).is_dir()]
    ours = [str(p) for p in dict.fromkeys(seen) if p != ROOT]
    Path(site_dir.strip(), "test-environment.pth").write_text("\n".join(ours) + "\n")
    return python


def _pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    assert result.returncode == 0, f"pip {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def _pip_into(python: Path, *args: str) -> None:
    _pip("--python", str(python), *args)


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_wheel_contents(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"nbattn-{nbattn.__version__}.dist-info/METADATA").decode()
        entry_points = zf.read(f"nbattn-{nbattn.__version__}.dist-info/entry_points.txt").decode()
    shipped = {n.removeprefix("nbattn/data/") for n in names if n.startswith("nbattn/data/")}
    assert shipped == {p.name for p in (ROOT / "data").iterdir() if p.is_file()}
    for module in ("nbattn/__init__.py", "nbattn/kernels/flash.py", "nbattn/cuda/flash.py"):
        assert module in names
    assert not any(n.startswith(("data/", "tests/", "scripts/")) for n in names)
    assert f"Version: {nbattn.__version__}" in metadata.splitlines()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("Requires-Dist: numba-cuda[cu12]") and 'extra == "cuda"' in r
               for r in requires)  # fmt: skip
    assert "nbattn = nbattn.app.cli:main" in entry_points


def _seed_kernel_cache(dest: Path) -> None:
    """Copy the CPU kernels this test run has compiled so far into ``dest``, the
    cache folder of an installed copy of the same sources. numba keys its cache
    by the content hash of the source file and the function's bytecode, not by
    its path, so the copy loads them instead of compiling the demo's kernels
    afresh (minutes of CPU, on every run); a kernel not compiled yet, or a cache
    that does not match, is compiled as before. numba writes each cache file
    whole (a temporary file, then a rename), so a concurrent writer is harmless."""
    from nbattn.kernels import pooling

    source = getattr(getattr(pooling.gaussian_pool, "_cache", None), "cache_path", None)
    if source is None or not Path(source).is_dir():  # the cache is off, or nothing compiled
        return
    dest.mkdir(parents=True, exist_ok=True)
    # Data files first, then the indexes that name them.
    for pattern in ("*.nbc", "*.nbi"):
        for path in Path(source).glob(pattern):
            shutil.copyfile(path, dest / path.name)


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_and_loads_data(wheel, tmp_path):
    """``pip install nbattn.whl`` (not editable) into a new environment, then, from a
    folder outside the source tree: the command's entry point, ``nbattn demo``
    and ``nbattn.datasets.load_csv("engel")``, all from the installed copy."""
    python = _new_venv(tmp_path / "venv")
    _pip_into(python, "install", "--no-deps", "--no-index", str(wheel))
    _pip_into(python, "check")  # the wheel's requirements hold in what the venv sees
    work = tmp_path / "work"
    work.mkdir()
    out = _run_python(
        """
        import json, sysconfig
        from importlib import metadata
        import nbattn, nbattn.datasets
        engel = nbattn.datasets.load_csv("engel")
        (command,) = metadata.distribution("nbattn").entry_points.select(
            group="console_scripts", name="nbattn")
        print(json.dumps({
            "site": sysconfig.get_paths()["purelib"],
            "file": nbattn.__file__,
            "data": str(nbattn.datasets.data_files()),
            "datasets": nbattn.datasets.available_datasets(),
            "engel": engel.to_dict(orient="list"),
            "version": metadata.version("nbattn"),
            "command": command.value,
        }))
        """,
        python,
        cwd=work,
        env=_clean_env(),
    )
    info = json.loads(out.strip().splitlines()[-1])
    site = Path(info["site"])
    assert Path(info["file"]).is_relative_to(site)
    assert Path(info["data"]) == site / "nbattn" / "data"
    assert info["datasets"] == ["diabetes", "engel", "seed_pooling"]
    import pandas as pd

    expected = pd.read_csv(ROOT / "data" / "engel.csv")
    assert pd.DataFrame(info["engel"]).equals(expected) and expected.shape == (235, 2)
    assert info["version"] == nbattn.__version__
    assert info["command"] == "nbattn.app.cli:main"

    command = python.parent / ("nbattn.exe" if os.name == "nt" else "nbattn")
    env = _clean_env()
    env.pop("NUMBA_CACHE_DIR", None)  # the installed copy caches beside its own sources
    _seed_kernel_cache(site / "nbattn" / "kernels" / "__pycache__")
    result = run_checked([command, "demo", "--outdir", "figures"], cwd=work, env=env, timeout=600)
    for model in ("average_pooling", "nadaraya_watson", "learned_width"):
        assert model in result.stdout
    figures = {p.name for p in (work / "figures").glob("*.png") if p.stat().st_size > 1000}
    assert {"data.png", "nadaraya_watson.png", "loo_curve.png"} <= figures


@pytest.mark.slow
def test_editable_install_finds_the_data(source_copy, tmp_path):
    """What scripts/_setup.sh does (``pip install -e``): the mapped package
    nbattn.data resolves to the checkout's top-level data/ folder."""
    python = _new_venv(tmp_path / "venv")
    _pip_into(python, "install", "--no-deps", "--no-build-isolation", "--no-index", "-e",
              str(source_copy))  # fmt: skip
    out = _run_python(
        """
        import nbattn.datasets as d
        print(d.data_files())
        print(len(d.load_csv("diabetes")))
        """,
        python,
        cwd=tmp_path,
        env=_clean_env(),
    )
    data, rows = out.split()
    assert Path(data).resolve() == (source_copy / "data").resolve()
    assert rows == "442"


# ----------------------------------------------------------------------------- test set-up


def test_test_scripts_name_no_machine_path():
    for script in ("scripts/test", "scripts/_setup.sh", "scripts/demo"):
        text = (ROOT / script).read_text()
        code = "\n".join(line.split("#")[0] for line in text.splitlines()[1:])  # no shebang
        for prefix in ("/opt/", "/home/", "/usr/", "/root", "/tmp/", "/work"):
            assert prefix not in code, f"{script} names {prefix}"


@pytest.mark.parametrize("marker", ["procfs", "ru_maxrss"])
def test_platform_markers_skip_where_the_platform_lacks_it(marker, monkeypatch):
    from . import conftest

    class Item:
        def get_closest_marker(self, name):
            return object() if name == marker else None

    available, reason = conftest.PLATFORM_MARKERS[marker]
    if available:
        conftest.pytest_runtest_setup(Item())  # no skip where the platform has it
    monkeypatch.setitem(conftest.PLATFORM_MARKERS, marker, (False, reason))
    with pytest.raises(pytest.skip.Exception, match=re.escape(reason)):
        conftest.pytest_runtest_setup(Item())


@pytest.mark.procfs
def test_procfs_marker_runs_only_where_proc_exists():
    with open("/proc/self/status") as f:
        assert any(line.startswith("VmHWM:") for line in f)
