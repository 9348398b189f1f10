import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# Under CI (``CI`` set, as .ci/run runs) hypothesis draws the same examples every
# run, so a red run is reproducible and never depends on the draw of the day;
# locally it explores new examples each run (and keeps failures in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() not in ("", "0", "false"):
    settings.load_profile("ci")

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


def pytest_configure(config):
    # After the initial conftests: tests/cuda's sets NUMBA_ENABLE_CUDASIM before numba loads.
    from . import _compile_locks

    _compile_locks.install(Path(__file__).resolve().parent.parent)
    # The CUDA simulator suite needs NUMBA_ENABLE_CUDASIM before numba is
    # imported, so scripts/test runs tests/cuda in a process of its own.
    config.addinivalue_line("norecursedirs", "cuda")


def pytest_runtest_setup(item):
    for name, (available, reason) in PLATFORM_MARKERS.items():
        if not available and item.get_closest_marker(name) is not None:
            pytest.skip(f"{sys.platform}: {reason}")
