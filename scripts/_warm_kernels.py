"""Compile the costliest numba kernels into the on-disk cache before the test run.

scripts/test runs this before ``pytest -n``. Without it, two xdist workers that
reach the same uncompiled kernel at about the same time both compile it (20-35 s
of CPU each for the pooling, flash and leave-one-out tile kernels), because the
cache holds it only once the first compile ends. Here each kernel is compiled
once, the jobs spread over as many processes as the test run has workers
(longest first), and the workers then load them from the cache. A job whose
kernels are already cached costs only its tiny call.

The jobs are ``nbattn warmup``'s (``nbattn.app.warmup.JOBS``) and a few more that
the tests reach (packed sequences, the GEMM pooling tiles, the LOO tiles). Each
calls the public functions with tiny arrays of the types the library and the
tests pass, so it compiles exactly the specialisations they use. A job that fails
is reported and skipped: the test run shows the real error.

Usage: python scripts/_warm_kernels.py [N_PROCESSES | auto]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np

from nbattn.app import warmup


def _nw_gemm(dtype):
    """Pooling with as many features as take the GEMM tiles."""
    import nbattn
    from nbattn import config

    wide = (
        config.GEMM_MIN_FEATURES_FLOAT32
        if dtype == np.float32
        else config.GEMM_MIN_FEATURES_FLOAT64
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, wide)).astype(dtype)
    y = rng.normal(size=(30, 2)).astype(dtype)
    nbattn.nadaraya_watson(x, x, y, 1.0, True, dtype=dtype)


def _varlen(dtype):
    import nbattn

    rng = np.random.default_rng(0)
    cu = np.array([0, 3, 7])
    q, k, v = (rng.normal(size=(2, 7, 4)).astype(dtype) for _ in range(3))
    out, lse = nbattn.flash_attention_varlen(q, k, v, cu, cu, return_lse=True)
    nbattn.flash_attention_varlen_backward(q, k, v, out, lse, np.ones_like(out), cu, cu)


def _loo_tiles(boxed):
    import nbattn
    from nbattn import config

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    saved = config.LOO_PRUNE_MIN_ROWS, config.LOO_BOXED_MAX_SHARE
    if boxed:  # the boxed tiles on a small table, as the tests force them
        config.LOO_PRUNE_MIN_ROWS, config.LOO_BOXED_MAX_SHARE = 16, 1.0
    try:
        nbattn.loo_loss_and_grad(x, y, np.ones(3))
        nbattn.loo_loss_and_grad(x, y, components=np.eye(2, 3))
    finally:  # the process runs other jobs after this one
        config.LOO_PRUNE_MIN_ROWS, config.LOO_BOXED_MAX_SHARE = saved


#: (name, rough seconds of its compiles on a cold cache, job, arguments): the jobs of
#: ``nbattn warmup`` (the kernels a user's first calls reach), then those that only the
#: tests reach in quantity (packed sequences, the GEMM tiles, the LOO tiles).
JOBS = warmup.JOBS + [
    ("varlen float64", 41, _varlen, (np.float64,)),
    ("varlen float32", 40, _varlen, (np.float32,)),
    ("gemm pooling float32", 30, _nw_gemm, (np.float32,)),
    ("gemm pooling float64", 30, _nw_gemm, (np.float64,)),
    ("boxed loo tiles", 21, _loo_tiles, (True,)),
    ("loo tiles", 15, _loo_tiles, (False,)),
]


def _run(name, job, args):
    t0 = time.perf_counter()
    try:
        job(*args)
    except Exception as exc:  # noqa: BLE001 - reported; the test run shows the real error
        return name, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
    return name, time.perf_counter() - t0, None


def main(n_processes: int) -> int:
    t0 = time.perf_counter()
    jobs = sorted(JOBS, key=lambda job: -job[1])  # longest first
    failed = 0
    # a kernel that two jobs need is compiled once: the second waits, then loads it
    folder = tempfile.mkdtemp(prefix="nbattn-warm-kernels-locks-")
    try:
        with ProcessPoolExecutor(
            max_workers=n_processes, initializer=warmup.lock_compiles, initargs=(folder,)
        ) as pool:
            futures = [pool.submit(_run, name, job, args) for name, _, job, args in jobs]
            for future in as_completed(futures):
                name, seconds, error = future.result()
                if error:
                    failed += 1
                    print(f"warm-up {name}: FAILED ({error})", file=sys.stderr)
                else:
                    print(f"warm-up {name}: {seconds:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"warm-up: {len(jobs) - failed} of {len(jobs)} jobs in {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )
    return 0


def _processes(arg: str | None) -> int:
    """pytest-xdist's ``-n`` value: a count, or ``auto``/``logical`` for every core."""
    if arg is None or arg in ("auto", "logical"):
        return os.cpu_count() or 1
    return max(1, int(arg))


if __name__ == "__main__":
    sys.exit(main(_processes(sys.argv[1] if len(sys.argv) > 1 else None)))
