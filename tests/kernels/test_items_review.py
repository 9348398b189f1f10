"""The work-item runner under a hostile caller: several Python threads, a pool resized
under another thread's feet, Ctrl-C, a worker that raises, a forked child, Dask, the
workqueue threading layer; and the kernels it runs, bit for bit on 1 and 2 threads.

The kernels here are module-level and cached (``cache=True``): one compile of a few
lines each, loaded from disk afterwards.
"""

from __future__ import annotations

import dis
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import njit
from numba.core.registry import CPUDispatcher

import nbattn
import nbattn.kernels.items as items
from nbattn import config
from nbattn.dispatch.device import kernels_for
from nbattn.kernels.items import next_item, run_items

ROOT = Path(__file__).resolve().parents[2]
two_threads = pytest.mark.skipif(
    numba.config.NUMBA_NUM_THREADS < 2, reason="needs at least two numba threads"
)


@njit(nogil=True, cache=True)
def _spin_items(counter, n_items, work, out):
    """``work`` multiply-adds per item (a few ms at 10**6), the result in ``out[item]``."""
    while True:
        item = next_item(counter)
        if item >= n_items:
            return
        x = 0.0
        for _ in range(work):
            x = x * 0.999999 + 1.0
        out[item] = x + item


@njit(nogil=True, cache=True)
def _raise_at(counter, n_items, bad, out):
    """Item ``bad`` raises; the others write ``out[item] = item``."""
    while True:
        item = next_item(counter)
        if item >= n_items:
            return
        if item == bad:
            raise ValueError("item refused")
        out[item] = item


def _spin(n_items, work=10):
    out = np.zeros(n_items)
    run_items(_spin_items, n_items, work, out)
    return out


def _spin_here(n_items, work=10):
    """:func:`_spin` on this thread alone (the kernel called directly)."""
    out = np.zeros(n_items)
    _spin_items(np.zeros(1, dtype=np.int64), n_items, work, out)
    return out


@pytest.fixture
def threads_of_this_thread():
    saved = numba.get_num_threads()
    yield
    numba.set_num_threads(saved)


def test_threads_asking_for_different_pool_sizes_never_see_a_shut_pool(monkeypatch):
    """Thread counts differ per thread (``numba.set_num_threads`` is thread-local): a thread
    asking for a larger pool must not shut the pool another thread is submitting to
    ("cannot schedule new futures after shutdown"). The per-thread counts are faked, as
    this machine may allow only two numba threads."""
    local = threading.local()
    fake = types.SimpleNamespace(get_num_threads=lambda: getattr(local, "n", 2))
    monkeypatch.setattr(items, "numba", fake)
    errors = []
    want = _spin_here(50)

    def caller(n):
        local.n = n
        for _ in range(150):
            try:
                out = _spin(50)
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                errors.append(repr(exc))
                return
            if not np.array_equal(out, want):
                errors.append("wrong result")
                return

    callers = [threading.Thread(target=caller, args=(n,)) for n in (2, 3, 4, 5)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert errors == []


def _child_runs_items(_):
    return _spin(200).sum()


@two_threads
def test_a_forked_child_runs_items(threads_of_this_thread):
    """A process forked after the pool exists has none of its threads: the child must not
    queue its items for threads that do not exist (it hung)."""
    numba.set_num_threads(2)
    want = _spin(200).sum()  # the pool exists now
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.map_async(_child_runs_items, [0])
        try:
            got = result.get(timeout=60)
        except multiprocessing.TimeoutError:
            pool.terminate()
            pytest.fail("the forked child hung in run_items")
    assert got == [want]


@two_threads
@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="Ctrl-C is delivered to the main thread",
)
def test_ctrl_c_stops_the_loop_within_an_item_and_the_next_call_is_right(
    threads_of_this_thread,
):
    """A KeyboardInterrupt during a long loop stops it within a few items (not after the
    whole loop), no worker writes to the outputs after the call has raised, and the next
    call is right. Counted in items, not seconds, so a loaded machine cannot fail it: the
    signal is sent once ten items are done, and the count of items done afterwards is
    bounded by the items in hand plus those fetched before the main thread ran."""
    numba.set_num_threads(2)
    _spin(4)  # compiled or loaded
    n_items = 4000  # about 1 ms each: seconds of work if the interrupt were lost
    out = np.zeros(n_items)
    sent = []

    def interrupt():
        # out[item] = x + item > 0 once an item is done
        while np.count_nonzero(out) < 10:
            time.sleep(0.001)
        sent.append(np.count_nonzero(out))
        # SIGINT to the main thread, as a terminal's Ctrl-C reaches it (interrupt_main
        # would only set Python's flag, and wake no waiting thread)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    # Python's own handler, whatever an earlier test in this process left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        run_items(_spin_items, n_items, 10**6, out)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sender.join()
        signal.signal(signal.SIGINT, previous)
    done = out.copy()
    assert interrupted, (
        f"the loop ran to its end: no KeyboardInterrupt seen (handler before: {previous!r})"
    )
    assert np.count_nonzero(done) - sent[0] <= n_items // 8, (
        f"{np.count_nonzero(done) - sent[0]} items done after Ctrl-C"
    )
    time.sleep(0.05)  # a worker still running would write now
    np.testing.assert_array_equal(out, done)
    got = _spin(64)
    np.testing.assert_array_equal(got, _spin_here(64))


@two_threads
def test_a_second_ctrl_c_during_the_cleanup_still_waits_for_every_worker(
    monkeypatch, threads_of_this_thread
):
    """Ctrl-C while the call waits, and again while it waits for the workers to finish the
    items in hand: the call raises only once every worker has stopped, so nothing is
    written to the outputs afterwards."""
    numba.set_num_threads(2)
    _spin(4)  # compiled or loaded
    real_wait = items.wait
    interrupts = []

    def wait_interrupted(futures, **kwargs):
        if len(interrupts) < 3:  # the first wait and two during the cleanup
            interrupts.append(len(interrupts))
            time.sleep(0.01)  # items in hand, mid-way
            raise KeyboardInterrupt
        return real_wait(futures, **kwargs)

    monkeypatch.setattr(items, "wait", wait_interrupted)
    started = []
    real_submit = items._submit

    def submit(kernel, n_workers, counter, args, futures):
        real_submit(kernel, n_workers, counter, args, futures)
        started.extend(futures)

    monkeypatch.setattr(items, "_submit", submit)
    out = np.zeros(400)
    with pytest.raises(KeyboardInterrupt):
        run_items(_spin_items, 400, 10**6, out)  # about 1 ms an item
    assert len(interrupts) == 3 and started
    assert all(future.done() for future in started)
    done = out.copy()
    time.sleep(0.05)  # a worker still running would write now
    np.testing.assert_array_equal(out, done)
    assert np.count_nonzero(done) < 400  # the interrupt did stop the loop
    monkeypatch.setattr(items, "wait", real_wait)
    np.testing.assert_array_equal(_spin(64), _spin_here(64))


@two_threads
def test_a_worker_exception_propagates_and_the_next_call_is_right(threads_of_this_thread):
    numba.set_num_threads(2)
    for bad in (0, 1, 57, 199):
        with pytest.raises(ValueError, match="item refused"):
            run_items(_raise_at, 200, bad, np.zeros(200))
        out = np.zeros(200)
        run_items(_raise_at, 200, -1, out)
        np.testing.assert_array_equal(out, np.arange(200.0))


def test_a_compile_error_is_raised_on_the_calling_thread():
    """A kernel that does not type fails here, before any item runs on a pool thread."""
    with pytest.raises(numba.core.errors.TypingError):
        run_items(_spin_items, 4, 10, "not an array")


# --------------------------------------------------------------------------- call graphs
def _code_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _reaches_parallel(fn, seen, path):
    """The call paths from ``fn`` (a dispatcher or function) to a ``parallel=True``
    dispatcher, through the globals and module attributes its code reads."""
    py = fn.py_func if isinstance(fn, CPUDispatcher) else fn
    if id(py) in seen:
        return []
    seen.add(id(py))
    found = []
    if isinstance(fn, CPUDispatcher) and fn.targetoptions.get("parallel"):
        found.append(" -> ".join(path))
    names = _code_names(py.__code__)
    for name in names:
        value = py.__globals__.get(name)
        if isinstance(value, types.ModuleType):
            callees = [(f"{name}.{a}", getattr(value, a, None)) for a in names]
        else:
            callees = [(name, value)]
        for label, callee in callees:
            if isinstance(callee, (CPUDispatcher, types.FunctionType)):
                found += _reaches_parallel(callee, seen, path + [label])
    return found


def test_no_kernel_run_on_pool_threads_reaches_a_parallel_kernel():
    """A kernel run on a Python thread must never enter a numba parallel region (two at
    once abort the process under the workqueue layer, and nest under the others):
    every nogil kernel of the modules that call run_items, and the flex template's."""
    from nbattn.kernels import flash, flex_build, local, local_passes, pooling

    modules = [flash, local, local_passes, pooling, flex_build.specialise()]
    roots = {
        f"{m.__name__}.{name}": fn
        for m in modules
        for name, fn in vars(m).items()
        if isinstance(fn, CPUDispatcher) and fn.targetoptions.get("nogil")
    }
    assert len(roots) >= 10  # the runners' kernels were found
    for label, fn in roots.items():
        assert _reaches_parallel(fn, set(), [label]) == []
    # the runner itself calls no kernel but the one it is given
    assert "prange" not in {ins.argval for ins in dis.get_instructions(run_items)}


# --------------------------------------------------------------------------- the kernels
def _flash_case():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, 70, 16))
    k = rng.standard_normal((2, 1, 90, 16))
    v = rng.standard_normal((2, 1, 90, 8))
    return q, k, v


def _flash_all(q, k, v):
    kw = dict(causal=True, enable_gqa=True)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, np.cos(out), **kw)
    return (out, lse, *grads)


def _regression_case():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((400, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(400)
    x[::37, 1] = np.nan  # missing entries: the local passes' other branch
    return x, y


def _local_all(x, y):
    """Every pass on work items: the fit (degrees 0-2), the leave-one-out gradient (the
    width search), the interval sums and the equivalent-kernel weights."""
    results = []
    for degree in (0, 1, 2):
        model = nbattn.LocalPolynomialRegressor(
            degree=degree, bandwidth=[0.4, 0.6], missing="marginalize"
        ).fit(x, y)
        results.append(model.predict(x[:150]))
    searched = nbattn.LocalPolynomialRegressor(missing="marginalize").fit(x[:200], y[:200])
    results.append(searched.bandwidth_)
    results.append(searched.predict_interval(x[:50]))
    results.append(searched.attention_weights(x[:50]))
    return results


def _pool_all(x, y):
    """The Gaussian pool on predicted rows, and on the rows left out one by one."""
    x = np.nan_to_num(x)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=[0.3, 0.5]).fit(x, y)
    pool = kernels_for("pooling", "cpu").gaussian_pool
    z = x / np.array([0.3, 0.5])
    left_out = pool(z, np.ascontiguousarray(z.T), y[None, :].copy(), True, 0)
    return [model.predict(x), *left_out]


def _warm_up():
    """Every kernel of the cases imported (and loaded or compiled) with the default
    thresholds: a kernel module imported while a compiled tunable is patched would
    compile without the on-disk cache (``config.CACHE``)."""
    q, k, v = _flash_case()
    x, y = _regression_case()
    _flash_all(q, k, v)
    _pool_all(x, y)
    _local_all(x[:40], y[:40])


@pytest.fixture
def every_call_parallel(monkeypatch):
    """The thread rules' thresholds at 0: every call above runs on all numba threads."""
    _warm_up()
    monkeypatch.setattr(config, "FLASH_SERIAL_WORK", 0)
    monkeypatch.setattr(config, "SERIAL_PAIRS", 0)


def _bytes(results):
    return [np.ascontiguousarray(r).tobytes() for r in results]


@two_threads
@pytest.mark.usefixtures("every_call_parallel")
@pytest.mark.parametrize("case", ["flash", "local", "pool"])
def test_one_and_two_threads_and_two_runs_are_bit_identical(case, threads_of_this_thread):
    run, data = {
        "flash": (_flash_all, _flash_case),
        "local": (_local_all, _regression_case),
        "pool": (_pool_all, _regression_case),
    }[case]
    inputs = data()
    numba.set_num_threads(1)
    one = _bytes(run(*inputs))
    numba.set_num_threads(2)
    two = _bytes(run(*inputs))
    again = _bytes(run(*inputs))
    assert one == two == again


@two_threads
@pytest.mark.usefixtures("every_call_parallel")
def test_many_python_threads_at_once_give_the_serial_bytes():
    """A ThreadPoolExecutor calling flash attention (forward and backward) and a
    Nadaraya-Watson predict at once, each on the pool of the runner: every result is
    the bytes of the same call made alone."""
    q, k, v = _flash_case()
    x, y = _regression_case()
    jobs = [lambda: _flash_all(q, k, v), lambda: _pool_all(x, y)]
    want = [_bytes(job()) for job in jobs]
    with ThreadPoolExecutor(4) as executor:
        futures = [executor.submit(jobs[n % 2]) for n in range(12)]
        for n, future in enumerate(futures):
            assert _bytes(future.result()) == want[n % 2]


@two_threads
@pytest.mark.usefixtures("every_call_parallel")
def test_dask_threads_give_the_serial_bytes():
    dask = pytest.importorskip("dask")
    x, y = _regression_case()
    q, k, v = _flash_case()
    want_pool, want_flash = _bytes(_pool_all(x, y)), _bytes(_flash_all(q, k, v))
    tasks = [dask.delayed(_pool_all)(x, y) for _ in range(4)]
    tasks += [dask.delayed(_flash_all)(q, k, v) for _ in range(4)]
    results = dask.compute(*tasks, scheduler="threads", num_workers=4)
    for result in results[:4]:
        assert _bytes(result) == want_pool
    for result in results[4:]:
        assert _bytes(result) == want_flash


@two_threads
def test_distributed_workers_in_this_process_give_the_serial_bytes():
    """A Dask cluster's workers (threads of this process: two workers of two threads)
    calling flash attention and a Nadaraya-Watson predict at once."""
    distributed = pytest.importorskip("distributed")
    q, k, v = _flash_case()
    x, y = _regression_case()
    want_flash, want_pool = _bytes(_flash_all(q, k, v)), _bytes(_pool_all(x, y))
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as client:
        flash = [client.submit(_flash_all, q, k, v, pure=False) for _ in range(4)]
        pool = [client.submit(_pool_all, x, y, pure=False) for _ in range(4)]
        for result in client.gather(flash):
            assert _bytes(result) == want_flash
        for result in client.gather(pool):
            assert _bytes(result) == want_pool


# --------------------------------------------------------------------------- workqueue
_WORKQUEUE_SCRIPT = """
import sys
from concurrent.futures import ThreadPoolExecutor
import numba, numpy as np
import nbattn
from nbattn import config
from nbattn.dispatch.device import kernels_for
from tests.kernels.test_items_review import (
    _bytes, _flash_all, _flash_case, _pool_all, _regression_case,
)
q, k, v = _flash_case()
x, y = _regression_case()
cu = np.array([0, 30, 30, 70])


def varlen_backward():
    out, lse = nbattn.flash_attention_varlen(q[0], q[0], q[0], cu, cu, return_lse=True)
    return nbattn.flash_attention_varlen_backward(q[0], q[0], q[0], out, lse, out, cu, cu)


job = {
    "forward": lambda: [nbattn.flash_attention(q, k, v, causal=True, enable_gqa=True)],
    "backward": lambda: _flash_all(q, k, v),
    "predict": lambda: _pool_all(x, y),
    "varlen_backward": varlen_backward,
}[sys.argv[1]]
job()  # the kernels loaded from the cache before the thresholds are patched
config.FLASH_SERIAL_WORK = 0
config.SERIAL_PAIRS = 0
want = _bytes(job())
assert numba.threading_layer() == "workqueue", numba.threading_layer()
with ThreadPoolExecutor(int(sys.argv[2])) as executor:
    for result in executor.map(lambda _: job(), range(12)):
        assert _bytes(result) == want
print("same bytes")
"""


def _under_workqueue(what, callers=3):
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue", NUMBA_NUM_THREADS="2")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    script = textwrap.dedent(_WORKQUEUE_SCRIPT)
    return subprocess.run(
        [sys.executable, "-c", script, what, str(callers)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@two_threads
def test_workqueue_layer_forward_from_many_threads():
    """The flash forward runs only work-item kernels: several Python threads may call it
    under the workqueue layer (which aborts the process on two parallel regions at once)."""
    done = _under_workqueue("forward")
    assert done.returncode == 0 and "same bytes" in done.stdout, done.stderr[-2000:]


@two_threads
def test_workqueue_layer_backward_from_many_threads():
    done = _under_workqueue("backward")
    assert done.returncode == 0 and "same bytes" in done.stdout, done.stderr[-2000:]


@two_threads
def test_workqueue_layer_predict_from_many_threads():
    """NadarayaWatsonRegressor.predict (its layout pass and the streaming pooling) runs
    only work-item kernels: several Python threads may call it under workqueue."""
    done = _under_workqueue("predict")
    assert done.returncode == 0 and "same bytes" in done.stdout, done.stderr[-2000:]


@two_threads
def test_workqueue_layer_varlen_backward_from_one_thread():
    done = _under_workqueue("varlen_backward", callers=1)
    assert done.returncode == 0 and "same bytes" in done.stdout, done.stderr[-2000:]


@two_threads
def test_the_thread_count_rules_apply(monkeypatch, threads_of_this_thread):
    """As many workers as ``numba.get_num_threads()`` of the calling thread, none (the
    calling thread alone) at one thread, and none for a call below nbattn's serial
    threshold (``serial_below``)."""
    asked = []
    submit = items._submit

    def counting(kernel, n_workers, counter, args, futures):
        asked.append(n_workers)
        submit(kernel, n_workers, counter, args, futures)

    monkeypatch.setattr(items, "_submit", counting)
    numba.set_num_threads(2)
    _spin(10)
    numba.set_num_threads(1)
    _spin(10)
    assert asked == [2]
    numba.set_num_threads(2)
    q, k, v = _flash_case()
    monkeypatch.setattr(config, "FLASH_SERIAL_WORK", 1 << 40)
    nbattn.flash_attention(q, k, v)
    assert asked == [2]
    monkeypatch.setattr(config, "FLASH_SERIAL_WORK", 0)
    nbattn.flash_attention(q, k, v)
    assert asked == [2, 2]


def test_numba_num_threads_of_the_environment_applies():
    """``NUMBA_NUM_THREADS=1``: every item on the calling thread, no pool."""
    script = textwrap.dedent(
        """
        import nbattn.kernels.items as items
        from tests.kernels.test_items_review import _spin, _spin_here
        asked = []
        items._submit = lambda *args: asked.append(args[1])
        assert (_spin(50) == _spin_here(50)).all()
        assert asked == [], asked
        print("no pool")
        """
    )
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "no pool" in done.stdout, done.stderr[-2000:]


@two_threads
@pytest.mark.usefixtures("every_call_parallel")
def test_the_searched_width_is_the_same_on_one_and_two_threads(threads_of_this_thread):
    """The leave-one-out criterion adds its partial sums in item order (``sum_in_order``):
    the width is the same to the bit on one and two threads, in 1-D (the windowed and
    series criteria of ``kernels/loo_1d.py``) and in 3-D."""
    x, y = _regression_case()
    x = np.nan_to_num(x)
    for columns in (x[:150, :1], x[:150]):
        widths = []
        for n in (1, 2):
            numba.set_num_threads(n)
            model = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(columns, y[:150])
            widths.append(model.bandwidth_.tobytes())
        assert widths[0] == widths[1]
