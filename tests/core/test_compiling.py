"""The one-line notice printed when an nbattn kernel first compiles in a process.

Each case runs a fresh interpreter (the notice is once per process) on a tiny probe
module loaded under an ``nbattn.`` name, so that nothing here compiles a real kernel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nbattn._core import compiling

PROBE = textwrap.dedent(
    """
    from numba import njit

    @njit(cache=True)
    def twice(x):
        return 2 * x
    """
)

SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    from numba import njit
    import nbattn.kernels  # registers the notice, as every kernel import does

    spec = importlib.util.spec_from_file_location("nbattn._probe_{tag}", sys.argv[1])
    probe = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = probe
    spec.loader.exec_module(probe)

    @njit
    def outside(x):  # a user's own numba function: never announced
        return x + 1

    for step in sys.argv[2:]:
        if step == "outside":
            outside(1.0)
        elif step == "float":
            probe.twice(1.5)
        elif step == "int":
            probe.twice(3)
        print("after", step, file=sys.stderr, flush=True)
    """
)


def _run(tmp_path, steps, cache_dir, **env):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    environment = {k: v for k, v in os.environ.items() if k not in ("NBATTN_QUIET", "NBATTN_CACHE")}
    environment.update(NUMBA_CACHE_DIR=str(cache_dir), **env)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tag=tmp_path.name[-6:]), str(probe), *steps],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_the_first_compile_prints_one_line_and_later_ones_none(tmp_path):
    lines = _run(tmp_path, ["outside", "float", "float", "int"], tmp_path / "cache")
    assert lines == ["after outside", compiling.NOTICE, "after float", "after float", "after int"]


def test_a_kernel_loaded_from_the_cache_prints_nothing(tmp_path):
    cache = tmp_path / "cache"
    assert compiling.NOTICE in _run(tmp_path, ["float"], cache)
    assert _run(tmp_path, ["float", "float"], cache) == ["after float", "after float"]


@pytest.mark.parametrize("value", ["1", "true"])
def test_nbattn_quiet_silences_it(tmp_path, value):
    lines = _run(tmp_path, ["float", "int"], tmp_path / "cache", NBATTN_QUIET=value)
    assert lines == ["after float", "after int"]


def test_with_the_cache_off_it_says_so(tmp_path):
    lines = _run(tmp_path, ["float"], tmp_path / "cache", NBATTN_CACHE="0")
    assert lines == [compiling.NOTICE_UNCACHED, "after float"]


def test_nbattn_quiet_must_be_a_flag():
    result = subprocess.run(
        [sys.executable, "-c", "import nbattn.config"],
        capture_output=True,
        text=True,
        env={**os.environ, "NBATTN_QUIET": "maybe"},
        timeout=120,
    )
    assert result.returncode != 0
    assert "NBATTN_QUIET='maybe' must be 1 or 0" in result.stderr
