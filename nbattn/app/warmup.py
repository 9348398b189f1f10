"""``nbattn warmup``: compile the common kernels into numba's on-disk cache ahead of use.

nbattn's kernels are compiled by numba on their first call in a fresh
installation (then loaded from numba's on-disk cache by every later process).
The warm-up makes those first calls itself, on tiny inputs of the types the
library passes, in parallel processes: the estimators (Nadaraya-Watson with rule
and leave-one-out widths, the learned width, local-linear fits, the
classifier; local fits of one to five columns and a categorical one),
``nadaraya_watson`` and ``local_polynomial`` in float64 and
float32, and ``flash_attention`` (forward and backward, with and without a mask) in
float32 and float64.

Each job runs in a process of its own, longest first; a kernel that two jobs
need is compiled once: the second process waits for the first (a file lock per
kernel) and then loads it from the cache. A job whose kernels are cached costs
its import and its tiny calls, so a second warm-up takes seconds.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from .._core.validation import plural

__all__ = ["JOBS", "lock_compiles", "run_warmup"]

_held = threading.local()


# ----------------------------------------------------------------------------- the jobs


def _data(n=60, d=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(dtype)
    y = (np.sin(x[:, 0]) + 0.1 * rng.normal(size=n)).astype(dtype)
    return x, y


def _nw_estimator():
    import nbattn

    x, y = _data()
    for bandwidth in ("scott", "loo"):
        model = nbattn.NadarayaWatsonRegressor(bandwidth=bandwidth).fit(x, y)
        model.predict(x[:5])
        model.attention_weights(x[:5])
    x1, y1 = _data(d=1)
    model = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(x1, y1)
    model.predict(x1[:5], return_std=True)


def _learned():
    import nbattn

    x, y = _data(d=1)  # the walk-through's learned width and its loss curve (the demo)
    nbattn.LearnedKernelRegressor(metric="scalar").fit(x, y).predict(x[:5])
    nbattn.loo_loss(x, y, 0.5)
    x, y = _data()
    nbattn.LearnedKernelRegressor(metric="diagonal").fit(x, y).predict(x[:5])


def _local_polynomial():
    import nbattn

    x, y = _data()
    model = nbattn.LocalPolynomialRegressor().fit(x, y)
    model.predict(x[:5])
    nbattn.local_polynomial(x, x, y, 1.0)


def _local_polynomial_shapes():
    """The local fits of the other column counts: each number of terms p = 2..5 (a
    local-linear fit of 1 to 4 columns) has a small callback of its fused moment sums
    (``nbattn.kernels.local_moments.fused_moments_kernel``), and each string of column
    kinds one of its scores (``nbattn.kernels.local_pairs.one_pass_kernel``); a
    categorical column adds the gradient of its width; tied rows the pooled
    leave-one-out passes."""
    import nbattn

    for d in (1, 2, 4, 5):
        x, y = _data(d=d)
        nbattn.LocalPolynomialRegressor().fit(x, y).predict(x[:5])
    x, y = _data(d=2)
    x[:, 1] = np.arange(x.shape[0]) % 3
    nbattn.LocalPolynomialRegressor(var_type="cu").fit(x, y).predict(x[:5])
    # tied rows (discrete columns) take the pooled leave-one-out passes (nbattn.local.ties)
    x[:, 0] = np.round(x[:, 0])
    nbattn.LocalPolynomialRegressor(var_type="cu").fit(x, y)
    nbattn.LocalPolynomialRegressor().fit(np.round(_data(d=2)[0]), y)


def _classifier():
    import nbattn

    x, y = _data()
    labels = (y > 0).astype(np.int64)
    nbattn.NadarayaWatsonClassifier().fit(x, labels).predict_proba(x[:5])


def _densities():
    import nbattn

    x, y = _data(d=2)
    model = nbattn.KernelDensity(bandwidth="cv_ml").fit(x)
    model.score_samples(x[:5]), model.cdf(x[:5])
    nbattn.KernelDensity(bandwidth="cv_ls").fit(x)
    quantiles = nbattn.KernelQuantileRegressor(bandwidth="cv_ml").fit(x, y)
    quantiles.predict_interval(x[:5])
    conditional = nbattn.ConditionalKernelDensity(bandwidth="cv_ls").fit(x, y)
    conditional.pdf(x[:5], y[:5]), conditional.cdf(x[:5], y[:5])


def _nadaraya_watson(dtype):
    import nbattn

    x, y = _data(dtype=dtype)
    nbattn.nadaraya_watson(x, x, y, 1.0)
    nbattn.nadaraya_watson(x, x, y, 1.0, exclude_self=True)


def _flash(dtype):
    import nbattn

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 2, 16, 8)).astype(dtype) for _ in range(3))
    # without and with a mask: each compiles its own kernels (a group a call does not
    # use is left out of them, nbattn.kernels.flash); causal and windows need none
    for mask in (None, np.tril(np.ones((16, 16), dtype=bool))):
        out, lse = nbattn.flash_attention(q, k, v, mask=mask, return_lse=True)
        nbattn.flash_attention_backward(q, k, v, out, lse, np.ones_like(out), mask=mask)


#: (name, rough seconds of compiling on an idle core, job, arguments), longest first.
JOBS = [
    ("flash float32", 15, _flash, (np.float32,)),
    ("flash float64", 15, _flash, (np.float64,)),
    ("Nadaraya-Watson estimators", 14, _nw_estimator, ()),
    ("learned widths", 12, _learned, ()),
    ("local polynomial", 10, _local_polynomial, ()),
    ("local polynomial shapes", 30, _local_polynomial_shapes, ()),
    ("classifier", 6, _classifier, ()),
    ("densities", 12, _densities, ()),
    ("nadaraya_watson float32", 6, _nadaraya_watson, (np.float32,)),
    ("nadaraya_watson float64", 3, _nadaraya_watson, (np.float64,)),
]


# ------------------------------------------------------------------------ one compile at a time


def lock_compiles(folder) -> None:
    """Make this process take an exclusive file lock per kernel, in ``folder``, around each
    outermost compile of a numba kernel with an on-disk cache (once per process; nothing
    where there is no ``fcntl``, as on Windows).

    Processes that share numba's on-disk cache (the warm-up's workers, the test suite's
    xdist workers) compile a kernel that is not cached yet in whichever needs it first;
    without a lock a second process that needs it before the first has written it
    compiles it again (20-40 s of CPU for the larger kernels). With it the second waits,
    then finds the kernel in the cache (numba looks there first) and loads it. Only
    outermost compiles take a lock (a process holds at most one, so no two processes
    wait on each other); a callee compiled inside one is not locked. Dispatchers without
    an on-disk cache are left alone. The system releases a ``flock`` when its process
    ends, however it ends.
    """
    try:
        import fcntl
    except ImportError:
        return
    from numba.core import dispatcher
    from numba.core.caching import NullCache

    if getattr(dispatcher.Dispatcher.compile, "_nbattn_locked", False):
        return
    folder = Path(folder)
    original = dispatcher.Dispatcher.compile

    def compile(self, sig):
        cache = getattr(self, "_cache", None)
        if getattr(_held, "depth", 0) or cache is None or isinstance(cache, NullCache):
            return original(self, sig)
        func = self.py_func
        name = hashlib.sha1(f"{func.__module__}.{func.__qualname__}".encode()).hexdigest()
        with open(folder / name, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            _held.depth = 1
            try:
                return original(self, sig)
            finally:
                _held.depth = 0
                fcntl.flock(handle, fcntl.LOCK_UN)

    compile._nbattn_locked = True
    dispatcher.Dispatcher.compile = compile


def _start_worker(folder: str) -> None:
    from .._core import compiling

    compiling.silence()  # the command shows its own progress
    lock_compiles(folder)


def _count_compiles():
    """A counter of this process's outermost compiles of nbattn kernels (numba's event)."""
    from numba.core import event

    counter = {"n": 0, "depth": 0}

    class _Counter(event.Listener):
        def on_start(self, ev):
            counter["depth"] += 1
            func = getattr(ev.data.get("dispatcher"), "py_func", None)
            if counter["depth"] == 1 and getattr(func, "__module__", "").startswith("nbattn"):
                counter["n"] += 1  # outermost compiles only: a callee is part of its caller

        def on_end(self, ev):
            counter["depth"] -= 1

    listener = _Counter()
    event.register("numba:compile", listener)
    return counter, listener


def _run_job(index: int):
    """Run job ``index`` of :data:`JOBS`; returns (index, seconds, compiles, error or None)."""
    from numba.core import event

    _, _, job, args = JOBS[index]
    counter, listener = _count_compiles()
    t0 = time.perf_counter()
    try:
        job(*args)
    except Exception as exc:  # noqa: BLE001 - reported by the command, which goes on
        error = f"{type(exc).__name__}: {exc}"
    else:
        error = None
    finally:
        event.unregister("numba:compile", listener)
    return index, time.perf_counter() - t0, counter["n"], error


# ----------------------------------------------------------------------------- the command


def run_warmup(processes=None, quiet=False, stream=None, names=None) -> int:
    """Run the jobs of :data:`JOBS` (those named in ``names``, default all) over
    ``processes`` processes (default: one per core); returns the number of jobs that
    failed. A bar on a terminal, else one line per job."""
    from .._core.progress import Progress

    stream = sys.stderr if stream is None else stream
    known = [job[0] for job in JOBS]
    if names is None:
        names = known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"names: unknown warm-up jobs {unknown}; known: {known}")
    order = sorted((known.index(name) for name in set(names)), key=lambda i: -JOBS[i][1])
    processes = max(1, min(processes or os.cpu_count() or 1, len(order)))
    folder = tempfile.mkdtemp(prefix="nbattn-warmup-locks-")
    t0 = time.perf_counter()
    failed, compiled = [], 0
    bar = Progress(len(order), "nbattn warmup", unit="jobs", quiet=quiet, stream=stream)
    context = multiprocessing.get_context("spawn")  # fresh processes: no forked threads
    try:
        with ProcessPoolExecutor(
            processes, mp_context=context, initializer=_start_worker, initargs=(folder,)
        ) as pool:
            futures = [pool.submit(_run_job, i) for i in order]
            for future in as_completed(futures):
                index, seconds, n_compiles, error = future.result()
                name = JOBS[index][0]
                compiled += n_compiles
                if error:
                    failed.append(name)
                    print(f"nbattn warmup: {name} failed: {error}", file=stream)
                elif not quiet and not bar.enabled:
                    print(f"nbattn warmup: {name}: {seconds:.1f} s", file=stream)
                bar.update(1)
    finally:
        bar.close()
        for lock in Path(folder).iterdir():
            lock.unlink()
        Path(folder).rmdir()
    if not quiet:
        done = len(order) - len(failed)
        what = (
            f"{plural(compiled, 'kernel')} compiled"
            if compiled
            else "all kernels were cached already"
        )
        print(
            f"nbattn warmup: {done} of {len(order)} jobs in "
            f"{time.perf_counter() - t0:.0f} s over {plural(processes, 'process', 'processes')} "
            f"({what})",
            file=stream,
        )
    return len(failed)
