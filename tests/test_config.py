"""The tunables: one section each, one defaults table, a reset that restores it."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from nbattn import config


def _assigned_tunables() -> list[str]:
    tree = ast.parse(Path(config.__file__).read_text())
    return [
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_")
    ]


def test_every_tunable_is_in_exactly_one_section():
    in_sections = [name for names in config.SECTIONS.values() for name in names]
    assert len(in_sections) == len(set(in_sections))
    # the tables themselves, the cache switches and the names only CUDA kernels read
    derived = {"SECTIONS", "DEFAULTS", "CACHE", "CUDA_CACHE", "CUDA_ONLY_TUNABLES"}
    assert set(_assigned_tunables()) - derived == set(in_sections)
    assert set(config.DEFAULTS) == set(in_sections)


def test_reset_restores_the_defaults(monkeypatch):
    before = {name: copy.copy(getattr(config, name)) for name in config.DEFAULTS}
    monkeypatch.setattr(config, "KEY_BLOCK", config.KEY_BLOCK + 7)
    monkeypatch.setattr(config, "LOO_RTOL", 0.5)
    config.FASTMATH.add("nnan")  # an in-place edit of the one mutable value
    try:
        config.reset("KEY_BLOCK")
        assert config.KEY_BLOCK == before["KEY_BLOCK"] and config.LOO_RTOL == 0.5
        config.reset()
        assert {name: getattr(config, name) for name in config.DEFAULTS} == before
        assert "nnan" not in config.FASTMATH
    finally:
        config.reset()


def test_reset_names_an_unknown_tunable():
    with pytest.raises(ValueError, match="unknown tunable 'KEY_BLOK'"):
        config.reset("KEY_BLOK")


def test_a_patched_compiled_tunable_turns_the_cache_off(monkeypatch):
    """A kernel compiled with a patched constant must not reach the shared on-disk cache."""
    asked = config._cache_on()
    assert config.CACHE == config.CUDA_CACHE == asked and config.patched_tunables() == []
    for name, value in [("KEY_BLOCK", config.KEY_BLOCK * 2), ("LOCAL_PIVOT_TOL", 0.5)]:
        monkeypatch.setattr(config, name, value)
        assert config.CACHE is config.CUDA_CACHE is False and name in config.patched_tunables()
        monkeypatch.undo()
        assert config.CACHE == config.CUDA_CACHE == asked
    monkeypatch.setattr(config, "LOO_RTOL", 0.5)  # read at call time: the cache stays
    assert config.CACHE == config.CUDA_CACHE == asked


def test_a_patched_cuda_launch_tunable_turns_only_the_cuda_cache_off(monkeypatch):
    """The CUDA simulator's tests patch the threads per block: the CPU kernels, which
    never read it, keep loading from and writing to the shared cache."""
    asked = config._cache_on()
    monkeypatch.setattr(config, "CUDA_THREADS_PER_BLOCK", 8)
    assert config.CUDA_CACHE is False and config.CACHE == asked


def test_no_cpu_kernel_reads_a_cuda_launch_tunable():
    """What lets ``config.CACHE`` ignore them (the CUDA kernels' sources may read them):
    neither the kernels nor the shared helpers they compile in (``_core``) name one."""
    import re

    read = set()
    for folder in ("kernels", "_core"):
        for path in (Path(config.__file__).parent / folder).glob("*.py"):
            read |= set(re.findall(r"\b([A-Z][A-Z0-9_]+)\b", path.read_text()))
    assert config.CUDA_ONLY_TUNABLES and not read & config.CUDA_ONLY_TUNABLES


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "1e3", str(2**31), str(2**40)])
def test_an_environment_integer_out_of_range_is_refused(raw):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NBATTN_KEY_BLOCK": raw}
    result = subprocess.run(
        [sys.executable, "-c", "import nbattn.config"], env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "NBATTN_KEY_BLOCK" in result.stderr


def test_every_tunable_the_kernels_read_is_known_as_compiled():
    """A tunable a kernel compiles in must turn the cache off when patched: the kernel
    sources name no config value that :func:`config.compiled_tunables` lacks."""
    import re

    package = Path(config.__file__).parent
    read = set()
    for folder in ("kernels", "cuda"):
        for path in (package / folder).glob("*.py"):
            read |= set(re.findall(r"config\.([A-Z][A-Z0-9_]+)\b", path.read_text()))
    tunables = read & set(config.DEFAULTS)
    assert tunables and tunables <= config.compiled_tunables()
