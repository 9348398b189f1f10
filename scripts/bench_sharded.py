"""Keys sharded across a Dask cluster, exact and within ``rtol``, and what 1e8 keys cost.

    python scripts/bench_sharded.py      # 8 shards of 125,000 keys, 2 workers, 5,000 queries
    python scripts/bench_sharded.py --shards 3 --shard-keys 20000 --queries 2000 \
        --target 1e7 --target-shard 1e5             # a quick check

A simulation on one machine with scaled-down shards. The keys are bench_scale.py's
clustered 3-D data (100 Gaussian clusters of sd 0.03, centres uniform in the unit
cube), drawn shard by shard on the workers of a ``LocalCluster`` (``--workers``
single-threaded processes): this process never holds them. ``nbattn.dask.
nadaraya_watson_sharded`` pools them at Scott's widths (of all the keys) and at a
quarter of them, with ``rtol=0`` and ``--rtol``; each shard builds and prunes its
own k-d tree, and the per-query states merge by log-sum-exp. It prints:

* the cluster's seconds, and one shard's seconds in this process (one thread, the
  shard's call as a worker runs it);
* the largest error against the in-memory exact result over all the keys, as a
  fraction of the bound rtol / (1 - rtol) max_j |v_j - f_i|;
* the cost model of a job of ``--target`` keys (default 1e8) in shards of
  ``--target-shard`` keys (default 1e6) on W workers,

      T = ceil(m / W) t_shard + ceil(log2 m) t_merge,    m = target / target_shard,

  with t_shard measured here on one shard of ``--target-shard`` keys (one thread) and
  t_merge the measured merge of two states; the transfers (the queries to each
  shard, one (n_queries, p + 1) state back) are printed beside it in bytes, as they
  depend on the network.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

N_CENTRES = 100


def shard(seed, n, centres, noise=0.03):
    """(keys (n, 3), values (n,)) of one shard: its own generator, so any process draws
    the same shard."""
    rng = np.random.default_rng([seed, 1])
    keys = centres[rng.integers(0, centres.shape[0], n)] + noise * rng.normal(size=(n, 3))
    values = np.sin(6.0 * keys[:, 0]) + keys[:, 1] ** 2 + 0.1 * rng.normal(size=n)
    return keys, values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-keys", type=int, default=125_000)
    parser.add_argument("--queries", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rtol", type=float, default=1e-6)
    parser.add_argument("--target", type=float, default=1e8)
    parser.add_argument("--target-shard", type=float, default=1e6)
    args = parser.parse_args()

    import dask
    import dask.array as da
    import distributed
    import nbattn.dask as nbdask
    import numba

    import nbattn
    from nbattn.smoothing.regression import bandwidth_rule

    threads = numba.get_num_threads()
    centres = np.random.default_rng(0).uniform(size=(N_CENTRES, 3))
    rng = np.random.default_rng(1)
    queries = centres[rng.integers(0, N_CENTRES, args.queries)] + 0.03 * rng.normal(
        size=(args.queries, 3)
    )
    n_keys = args.shards * args.shard_keys
    # Scott's widths of all the keys, from the sd of a sample (the clusters' sd is known
    # only approximately): the same widths for every path below
    sample = shard(10**6, 200_000, centres)[0]
    scott = bandwidth_rule(sample) * (200_000 / n_keys) ** (1.0 / 7.0)
    print(
        f"{args.shards} shards x {args.shard_keys} keys = {n_keys} keys, {args.queries} "
        f"queries, 3-D clustered, {args.workers} workers x 1 thread, rtol={args.rtol:g}"
    )

    def lazy_keys():
        parts = [
            dask.delayed(shard, pure=True)(s, args.shard_keys, centres) for s in range(args.shards)
        ]
        keys = da.concatenate(
            [da.from_delayed(p[0], (args.shard_keys, 3), np.float64) for p in parts]
        )
        values = da.concatenate(
            [da.from_delayed(p[1], (args.shard_keys,), np.float64) for p in parts]
        )
        return keys, values

    all_keys, all_values = (
        np.concatenate(a)
        for a in zip(*(shard(s, args.shard_keys, centres) for s in range(args.shards)))
    )
    cluster = distributed.LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster):
        # drawn once on the workers and kept there: the times below are the pooling's
        keys, values = dask.persist(*lazy_keys())
        q = da.from_array(queries, chunks=(args.queries, 3))
        # warm the workers (compile or load the kernels) on a small call of each path
        for rtol in (0.0, args.rtol):
            nbdask.nadaraya_watson_sharded(q[:50], keys, values, scott, rtol=rtol).compute()
        for label, factor in (("Scott", 1.0), ("Scott/4", 0.25)):
            h = scott * factor
            exact = nbattn.nadaraya_watson(queries, all_keys, all_values, h)
            spread = np.maximum(all_values.max() - exact, exact - all_values.min())
            for rtol in (0.0, args.rtol):
                t0 = time.perf_counter()
                got = nbdask.nadaraya_watson_sharded(q, keys, values, h, rtol=rtol).compute()
                t_cluster = time.perf_counter() - t0
                one_keys, one_values = shard(0, args.shard_keys, centres)
                numba.set_num_threads(1)
                t0 = time.perf_counter()
                nbattn.nadaraya_watson(queries, one_keys, one_values, h, rtol=rtol)
                t_one = time.perf_counter() - t0
                numba.set_num_threads(threads)
                err = np.abs(got - exact)
                share = (err / (args.rtol / (1 - args.rtol) * spread)).max() if rtol else 0.0
                print(
                    f"  {label:8s} rtol={rtol:<6g} cluster {t_cluster:7.2f} s   one shard here "
                    f"{t_one:6.2f} s   max |f - exact| {err.max():.1e}"
                    + (f" = {share:.3f} of its bound" if rtol else "")
                )
    cluster.close()

    # ------------------------------------------------------------ the cost model
    numba.set_num_threads(1)
    m = math.ceil(args.target / args.target_shard)
    big_keys, big_values = shard(7, int(args.target_shard), centres)
    state = (np.zeros((args.queries, 1)), np.zeros(args.queries))
    t0 = time.perf_counter()
    for _ in range(20):
        nbdask.merge_partial(state, state)
    t_merge = (time.perf_counter() - t0) / 20
    print(
        f"cost model: {args.target:.0e} keys = {m} shards of {args.target_shard:.0e}, "
        f"{args.queries} queries; one merge {t_merge * 1e3:.2f} ms; per shard "
        f"{args.queries * 3 * 8 / 2**20:.2f} MiB of queries in and "
        f"{args.queries * 2 * 8 / 2**20:.2f} MiB of state out"
    )
    for label, factor in (("Scott", 1.0), ("Scott/4", 0.25)):
        # Scott's widths of the target's n, from the sample's
        h = bandwidth_rule(sample) * (200_000 / args.target) ** (1.0 / 7.0) * factor
        for rtol in (0.0, args.rtol):
            t0 = time.perf_counter()
            nbattn.nadaraya_watson(queries, big_keys, big_values, h, rtol=rtol)
            t_shard = time.perf_counter() - t0
            merges = math.ceil(math.log2(m)) * t_merge
            times = ", ".join(
                f"W={w}: {math.ceil(m / w) * t_shard + merges:,.1f} s" for w in (2, 16, 100)
            )
            print(
                f"  {label:8s} rtol={rtol:<6g} t_shard {t_shard:7.2f} s (one thread)  ->  {times}"
            )


if __name__ == "__main__":
    main()
