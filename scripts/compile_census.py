"""Where a cold test run spends its time: every numba compile, per test and worker.

As a pytest plugin it records each real compile (a cache miss; loads from the
on-disk cache are not compiles) with its wall and CPU seconds, the function, the
argument types and the test that triggered it, and each test's CPU seconds (its
own and its subprocesses'), one file per xdist worker under $COMPILE_CENSUS_DIR::

    NUMBA_CACHE_DIR=$(mktemp -d) COMPILE_CENSUS_DIR=out PYTHONPATH=scripts \\
        python -m pytest -p compile_census -n 2 tests
    python scripts/compile_census.py out

Run as a script it summarises those files: compile CPU per worker, the kernels
compiled in more than one worker, the costliest kernels and tests, and the
specialisations that differ only in a read-only flag, an omitted default or a
literal int (each costs a full compile). CPU seconds, unlike wall seconds,
stay meaningful on a shared, loaded machine.

With ``--jobs`` it measures what users meet instead: each job of ``nbattn warmup``
(``nbattn.app.warmup.JOBS``: the estimators, nadaraya_watson, local_polynomial,
flash_attention) in a fresh process with an empty cache of its own, one after the
other, and prints each job's wall and CPU seconds and its costliest compiles::

    python scripts/compile_census.py --jobs ["flash float32" ...]
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

import pytest

_state = {"test": "<collection>", "records": [], "tests": [], "stack": []}


def _install_listener():
    from numba.core import event

    class CompileListener(event.Listener):
        def on_start(self, ev):
            _state["stack"].append((time.perf_counter(), time.process_time()))

        def on_end(self, ev):
            wall0, cpu0 = _state["stack"].pop()
            py_func = getattr(ev.data["dispatcher"], "py_func", None)
            name = f"{py_func.__module__}.{py_func.__qualname__}" if py_func else "?"
            _state["records"].append(
                {
                    "fn": name,
                    "sig": str(ev.data["args"]),
                    "wall": time.perf_counter() - wall0,
                    "cpu": time.process_time() - cpu0,
                    # A compile inside another one (a callee) is part of the outer's time.
                    "top": not _state["stack"],
                    "test": _state["test"],
                }
            )

    event.register("numba:compile", CompileListener())


def pytest_configure(config):
    _install_listener()


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Runs where the test runs (an xdist worker), unlike the report hooks.
    _state["test"] = item.nodeid
    cpu0, child0 = time.process_time(), _children_cpu()
    yield
    _state["tests"].append(
        {
            "test": item.nodeid,
            "cpu": time.process_time() - cpu0,
            "child_cpu": _children_cpu() - child0,
        }
    )
    _state["test"] = "<between tests>"


def pytest_sessionfinish(session):
    out = os.environ.get("COMPILE_CENSUS_DIR")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    data = {
        "compiles": _state["records"],
        "tests": _state["tests"],
        "self_cpu": usage.ru_utime + usage.ru_stime,
        "children_cpu": _children_cpu(),
    }
    (Path(out) / f"{worker}.json").write_text(json.dumps(data))


def _normalised(sig: str) -> str:
    """The signature without read-only flags, omitted defaults and literal ints."""
    sig = re.sub(r"(Array\(\w+, \d, '\w'), (True|False)", r"\1", sig)
    sig = re.sub(r"omitted\(default=(-?\d+)\)", "int64", sig)
    return re.sub(r"Literal\[int\]\((-?\d+)\)", "int64", sig)


def summarise(folder: str, top: int = 25) -> None:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))}
    compiles = [dict(r, worker=w) for w, d in runs.items() for r in d["compiles"] if r["top"]]
    for worker, d in runs.items():
        own = sum(r["cpu"] for r in compiles if r["worker"] == worker)
        print(
            f"{worker}: {d['self_cpu']:.0f} s CPU, {d['children_cpu']:.0f} s in subprocesses, "
            f"{own:.0f} s compiling"
        )
    by_sig = collections.defaultdict(list)
    for r in compiles:
        by_sig[(r["fn"], r["sig"])].append(r)
    print(f"\n{len(compiles)} compiles of {len(by_sig)} specialisations")
    for (fn, _), rs in by_sig.items():
        if len({r["worker"] for r in rs}) > 1:
            print(f"  compiled in {len(rs)} workers: {fn} ({sum(r['cpu'] for r in rs):.1f} s)")
    per_fn = collections.defaultdict(dict)
    for r in compiles:
        per_fn[r["fn"]].setdefault(r["sig"], r["cpu"])
    print("\nCPU s  specialisations  function")
    for fn, sigs in sorted(per_fn.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        print(f"{sum(sigs.values()):6.1f}  {len(sigs):3d}  {fn}")
    print("\nspecialisations that differ only in read-only flags, omitted defaults or literal ints")
    for fn, sigs in per_fn.items():
        groups = collections.defaultdict(list)
        for sig, cpu in sigs.items():
            groups[_normalised(sig)].append(cpu)
        extra = sum(sum(sorted(c)[:-1]) for c in groups.values())
        if extra:
            print(f"  {fn}: {len(sigs)} -> {len(groups)}, {extra:.1f} s of CPU")
    tests = [t for d in runs.values() for t in d["tests"]]
    print("\nCPU s (own + subprocesses)  test")
    for t in sorted(tests, key=lambda t: -(t["cpu"] + t["child_cpu"]))[:top]:
        print(f"{t['cpu']:6.1f} {t['child_cpu']:6.1f}  {t['test']}")


_JOB_SCRIPT = """
import json, sys, time
sys.path.insert(0, {scripts!r})
import compile_census
compile_census._install_listener()
from nbattn.app import warmup
index = [job[0] for job in warmup.JOBS].index({name!r})
_, _, job, args = warmup.JOBS[index]
wall0, cpu0 = time.perf_counter(), time.process_time()
job(*args)
print(json.dumps({{"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0,
                  "compiles": compile_census._state["records"]}}))
"""


def census_jobs(names=None, top: int = 4) -> None:
    """Each warm-up job in a fresh process with an empty numba cache: its seconds and
    its costliest outermost compiles."""
    import subprocess
    import tempfile

    from nbattn.app.warmup import JOBS

    names = names or [job[0] for job in JOBS]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.1f} on {os.cpu_count()} cores; CPU and wall seconds")
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "NBATTN_QUIET": "1"}
            script = _JOB_SCRIPT.format(scripts=str(Path(__file__).parent), name=name)
            result = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, env=env
            )
        if result.returncode != 0:
            print(f"{name}: failed\n{result.stderr}")
            continue
        data = json.loads(result.stdout.splitlines()[-1])
        outer = [r for r in data["compiles"] if r["top"]]
        print(
            f"{name}: {data['cpu']:.1f} s CPU, {data['wall']:.1f} s wall, "
            f"{sum(r['cpu'] for r in outer):.1f} s compiling {len(outer)} kernels"
        )
        for r in sorted(outer, key=lambda r: -r["cpu"])[:top]:
            print(f"  {r['cpu']:6.1f}  {r['fn']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--jobs"]:
        census_jobs(sys.argv[2:])
    else:
        summarise(sys.argv[1])
