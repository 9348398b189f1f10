"""Nadaraya-Watson prediction through a dask LocalCluster against the single process.

Default: 10,000,000 queries x 100,000 keys in 1-D, float64 (1e12 pairs; each
run takes minutes on 2 cores). Prints pairs/s for the single process (numba on
1 and on all threads) and for 1 and 2 worker processes (one numba thread each),
with the ratios.

    .venv/bin/python scripts/bench_dask.py [--queries 10000000] [--keys 100000] [--chunk 500000]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np


def numba_threads():
    """The numba thread count of the process it runs in (a worker, under client.run)."""
    return numba.config.NUMBA_NUM_THREADS


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=500_000)
    args = parser.parse_args()

    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    import nbattn
    import nbattn.app.dask as nbdask

    rng = np.random.default_rng(0)
    keys = rng.uniform(0, 6, size=(args.keys, 1))
    values = np.sin(keys[:, 0]) + rng.normal(0, 0.3, args.keys)
    queries = rng.uniform(0, 6, size=(args.queries, 1))
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.05).fit(keys, values)
    pairs = args.queries * args.keys
    print(f"{args.queries:,} queries x {args.keys:,} keys, 1-D float64, chunks of {args.chunk:,}")

    model.predict(queries[:10])
    rates = {}
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        expected, seconds = timed(lambda: model.predict(queries))
        rates[f"single process, {threads} numba thread(s)"] = pairs / seconds
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)

    for workers in (1, 2):
        # NUMBA_NUM_THREADS must be set before numba is imported in the worker:
        # pre-spawn-environ applies it when the worker process starts.
        with dask.config.set({"distributed.nanny.pre-spawn-environ": {"NUMBA_NUM_THREADS": "1"}}):
            cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            )
        with Client(cluster) as client:
            client.run(model.predict, queries[:10])  # load the kernels on each worker
            threads = set(client.run(numba_threads).values())
            assert threads == {1}, f"workers run {threads} numba threads, not 1"
            dq = da.from_array(queries, chunks=(args.chunk, 1))
            got, seconds = timed(lambda dq=dq: nbdask.predict(model, dq).compute())
        cluster.close()
        assert np.allclose(got, expected, rtol=1e-12, atol=0), "dask result differs"
        rates[f"LocalCluster, {workers} worker(s) x 1 thread"] = pairs / seconds

    base = rates["single process, 1 numba thread(s)"]
    print(f"{'path':<44}{'pairs/s':>12}{'vs 1 thread':>14}")
    for name, rate in rates.items():
        print(f"{name:<44}{rate:>12.3g}{rate / base:>13.2f}x")


if __name__ == "__main__":
    main()
