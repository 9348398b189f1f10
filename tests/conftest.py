import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def pytest_configure(config):
    # The CUDA simulator suite needs NUMBA_ENABLE_CUDASIM before numba is
    # imported, so scripts/test runs tests/cuda in a process of its own.
    config.addinivalue_line("norecursedirs", "cuda")
