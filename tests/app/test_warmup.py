"""``nbattn warmup``: the common kernels compiled ahead of use, in parallel processes."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys

import pytest

from nbattn.app import warmup
from nbattn.app.cli import build_parser


def test_the_command_is_parsed_with_its_options():
    args = build_parser().parse_args(["warmup", "-j", "2", "-q"])
    assert (args.command, args.processes, args.quiet) == ("warmup", 2, True)
    assert build_parser().parse_args(["warmup"]).processes is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["warmup", "-j", "0"])


def test_python_m_nbattn_warmup_has_help():
    result = subprocess.run(
        [sys.executable, "-m", "nbattn", "warmup", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "numba's on-disk cache" in result.stdout


def test_the_jobs_cover_the_common_entry_points():
    names = [name for name, *_ in warmup.JOBS]
    assert len(set(names)) == len(names)
    for needed in (
        "flash float32",
        "flash float64",
        "nadaraya_watson float32",
        "nadaraya_watson float64",
        "local polynomial",
        "local polynomial shapes",
        "Nadaraya-Watson estimators",
        "learned widths",
        "classifier",
    ):
        assert needed in names


def test_a_job_runs_in_a_process_of_its_own_and_is_reported():
    out = io.StringIO()
    failed = warmup.run_warmup(processes=1, stream=out, names=["nadaraya_watson float64"])
    assert failed == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("nbattn warmup: nadaraya_watson float64: ")
    assert lines[-1].startswith("nbattn warmup: 1 of 1 jobs in ")
    quiet = io.StringIO()
    assert warmup.run_warmup(processes=1, stream=quiet, quiet=True, names=[]) == 0
    assert quiet.getvalue() == ""


def test_an_unknown_job_is_refused_by_name():
    with pytest.raises(ValueError, match="names: unknown warm-up jobs \\['flash float16'\\]"):
        warmup.run_warmup(names=["flash float16"])


def test_the_test_processes_compile_under_the_warmups_lock():
    """tests/conftest.py installs ``warmup.lock_compiles``: one lock, not a copy of it."""
    from numba.core import dispatcher

    assert getattr(dispatcher.Dispatcher.compile, "_nbattn_locked", False)


def test_an_outermost_cached_compile_takes_a_lock_named_after_its_kernel(tmp_path):
    """A kernel with an on-disk cache locks a file named after it; one without does not;
    installing twice wraps once."""
    (tmp_path / "kernel_mod.py").write_text(
        "import numba\n"
        "@numba.njit(cache=True)\n"
        "def cached(x):\n    return x + 1\n"
        "@numba.njit\n"
        "def plain(x):\n    return x + 2\n"
    )
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "from numba.core import dispatcher\n"
        "from nbattn.app.warmup import lock_compiles\n"
        "folder = Path(sys.argv[1]) / 'locks'; folder.mkdir()\n"
        "lock_compiles(folder); wrapped = dispatcher.Dispatcher.compile\n"
        "lock_compiles(folder); assert dispatcher.Dispatcher.compile is wrapped\n"
        "import kernel_mod\n"
        "assert kernel_mod.cached(1) == 2 and kernel_mod.plain(1) == 3\n"
        "print(sorted(p.name for p in folder.iterdir()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    expected = hashlib.sha1(b"kernel_mod.cached").hexdigest()
    assert result.stdout.strip() == repr([expected])
