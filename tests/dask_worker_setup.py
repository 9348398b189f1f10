"""Run in each Dask worker process the suite's clusters start (dask's worker preload,
named in tests/conftest.py): the test processes' lock per kernel compile
(``nbattn.app.warmup.lock_compiles``), so that two workers, or a worker and a test
process, that need the same kernel before it is cached compile it once, not each."""

import os


def dask_setup(worker):
    folder = os.environ.get("NBATTN_TEST_COMPILE_LOCKS")
    if folder:
        from nbattn.app.warmup import lock_compiles

        lock_compiles(folder)
