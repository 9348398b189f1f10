"""The CUDA simulator suite: run as its own pytest process (scripts/test does).

NUMBA_ENABLE_CUDASIM must be set before numba is imported, which is why this
folder is excluded from the main run (tests/conftest.py) and started alone.
A small threads-per-block makes multi-block and partial-tile paths run.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from nbattn import config  # noqa: E402

config.CUDA_THREADS_PER_BLOCK = 8


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


@pytest.fixture
def launches(monkeypatch):
    """``launches(module, name)`` wraps ``module.name`` for this test; the returned
    list gets ``name`` appended at each call (which CUDA kernels a method ran)."""
    calls = []

    def watch(module, name):
        original = getattr(module, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
        return calls

    return watch
