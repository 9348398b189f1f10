"""The timing that the benchmark scripts share; they import it as ``python scripts/NAME.py``
runs them, with this folder first on the path."""

from __future__ import annotations

import math
import time


def best_time(fn, *args, repeat=3):
    """The shortest wall time of ``repeat`` calls ``fn(*args)``, in seconds: the run least
    disturbed by the rest of the machine."""
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved_times(fns, repeat, clock=time.perf_counter):
    """The times of each function (a list per function) over ``repeat`` rounds that call
    every function once in turn, after one warm-up call each: interleaving spreads a slow
    spell of the machine over all the functions alike. ``clock``: time.perf_counter for wall
    time, time.process_time for this process' CPU time."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = clock()
            fn()
            times[i].append(clock() - start)
    return times
