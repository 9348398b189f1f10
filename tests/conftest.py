import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# No "compiling kernels for first use" line (nbattn._core.compiling) in the tests' outputs,
# which many tests read: whether a test compiles depends on the cache, not on the test.
# Set before nbattn is imported (config reads it then); subprocesses inherit it.
# tests/core/test_compiling.py runs its processes without it.
os.environ.setdefault("NBATTN_QUIET", "1")

# The suite's hypothesis settings, which each test's @settings extends: no deadline, as an
# example's first call may compile kernels (seconds, against hypothesis' 200 ms). Under CI
# (``CI`` set, as .ci/run runs) hypothesis also draws the same examples every run, so a red
# run is reproducible and never depends on the draw of the day; locally it explores new
# examples each run (and keeps failures in .hypothesis/).
settings.register_profile("nbattn", deadline=None)
settings.register_profile(
    "ci", parent=settings.get_profile("nbattn"), derandomize=True, print_blob=True
)
settings.load_profile(
    "ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "nbattn"
)

#: Markers for tests that read what only some platforms have; such a test is
#: skipped elsewhere, with the reason shown by ``pytest -ra``.
PLATFORM_MARKERS = {
    "procfs": (
        Path("/proc/self/status").is_file(),
        "reads /proc/self/status, which only Linux has",
    ),
    "ru_maxrss": (
        sys.platform.startswith("linux"),
        "reads ru_maxrss in KiB, as Linux reports it (macOS reports bytes, Windows has none)",
    ),
}


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def small_flash_tiles(monkeypatch):
    """Flash tiles (forward and backward) of 8 queries x 16 keys, so that small inputs
    cross many tile boundaries, and every call on all numba threads (small calls
    otherwise run on one)."""
    from nbattn import config

    sizes = dict(FLASH_BLOCK_Q=8, FLASH_BLOCK_K=16, FLASH_BWD_BLOCK_Q=8, FLASH_BWD_BLOCK_K=16)
    for name, value in {"FLASH_SERIAL_WORK": 0, **sizes}.items():
        monkeypatch.setattr(config, name, value)


def pytest_configure(config):
    # One compile of a kernel at a time across the test processes (xdist's workers share
    # numba's on-disk cache): the warm-up's file lock per kernel, one folder per checkout
    # in the system's temporary folder. After the initial conftests: tests/cuda's sets
    # NUMBA_ENABLE_CUDASIM before numba loads.
    from nbattn.app.warmup import lock_compiles

    checkout = Path(__file__).resolve().parent.parent
    digest = hashlib.sha1(str(checkout).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"nbattn-compile-locks-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    lock_compiles(folder)
    # The same lock in the worker processes of the suite's Dask clusters (LocalCluster
    # spawns them; dask reads its DASK_* variables when it is imported, after this).
    os.environ["NBATTN_TEST_COMPILE_LOCKS"] = str(folder)
    preload = Path(__file__).resolve().parent / "dask_worker_setup.py"
    os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PRELOAD", json.dumps([str(preload)]))
    # The flex kernels generated per user function (nbattn.kernels.flex_build) go to a
    # folder per checkout in the system's temporary folder, shared by xdist's workers and
    # by later runs as numba's cache is, never to the user's cache folder.
    os.environ.setdefault(
        "NBATTN_FLEX_DIR", str(Path(tempfile.gettempdir()) / f"nbattn-flex-{digest}")
    )
    # The CUDA simulator suite needs NUMBA_ENABLE_CUDASIM before numba is
    # imported, so scripts/test runs tests/cuda in a process of its own.
    config.addinivalue_line("norecursedirs", "cuda")


def pytest_runtest_setup(item):
    for name, (available, reason) in PLATFORM_MARKERS.items():
        if not available and item.get_closest_marker(name) is not None:
            pytest.skip(f"{sys.platform}: {reason}")
