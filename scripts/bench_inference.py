"""Inference at held widths: significance tests against statsmodels, bootstrap bands.

    NUMBA_NUM_THREADS=2 python scripts/bench_inference.py
    NUMBA_NUM_THREADS=2 python scripts/bench_inference.py --rows 200 --sm-boots 4 8

On ``--rows`` rows of three continuous columns (y = sin(2 x0) + 0.5 x1 + noise; x2
irrelevant) at fixed local-linear widths (0.3 sd), it times
``LocalPolynomialRegressor.significance_test`` of the three columns and of one column
with ``--boots`` replicates (the call a user makes, a warm run after one untimed call
that compiles), then statsmodels' ``KernelReg(reg_type="ll").sig_test`` of the same
column at the same widths with few replicates (``--sm-boots``, two counts: its time is
linear in them, so the slope between the two gives its time at ``--boots``; statsmodels
draws iid residuals, nbattn wild ones, one refit per replicate either way). Prints both
p-values, the times and the ratio.

Then a bootstrap band: ``predict_interval(method="bootstrap")`` of ``--band-rows``
training rows (two continuous columns, local-linear at 0.3 sd) at ``--band-points``
queries with ``--band-boots`` wild replicates, and with pairs replicates, beside the
sandwich interval (``method="asymptotic"``) on the same model, each timed warm, with the
median width of each.

Last, nearest-neighbour widths (R np's ``bwtype``): on ``--nn-rows`` rows of two
continuous columns, ``LocalPolynomialRegressor(bandwidth="loo")`` and
``KernelDensity(bandwidth="cv_ml")`` fitted with fixed, generalised and adaptive widths
(warm), each fit's time, its criterion at the fitted widths, the ratio of its time to the
fixed widths' fit, and the time to predict ``--nn-rows`` new rows (statsmodels has no
nearest-neighbour widths; ``--nn-rows 0`` skips this part).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np


def data(rows, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (rows, 3))
    y = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] + rng.normal(0.0, 0.5, rows)
    return X, y


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--boots", type=int, default=399)
    parser.add_argument("--sm-boots", type=int, nargs=2, default=(2, 6))
    parser.add_argument("--skip-statsmodels", action="store_true")
    parser.add_argument("--band-rows", type=int, default=2000)
    parser.add_argument("--band-points", type=int, default=1000)
    parser.add_argument("--band-boots", type=int, default=999)
    parser.add_argument("--nn-rows", type=int, default=1000)
    args = parser.parse_args(argv)
    significance(args)
    bands(args)
    if args.nn_rows:
        neighbours(args.nn_rows)


def neighbours(rows):
    import nbattn
    from nbattn.local.engine import local_loo_loss

    X, y = data(rows, seed=2)
    X, Q = X[:, :2], data(rows, seed=3)[0][:, :2]
    kinds = ("fixed", "generalized_nn", "adaptive_nn")
    for name, make, criterion in (
        (
            "LocalPolynomialRegressor(bandwidth='loo')",
            lambda t: nbattn.LocalPolynomialRegressor(bandwidth="loo", bandwidth_type=t),
            lambda m, t: local_loo_loss(X, y, m.bandwidth_, 1, bandwidth_type=t),
        ),
        (
            "KernelDensity(bandwidth='cv_ml')",
            lambda t: nbattn.KernelDensity(bandwidth="cv_ml", bandwidth_type=t),
            None,
        ),
    ):
        base = None
        for kind in kinds:
            make(kind).fit(X[:50], y[:50]) if "Regressor" in name else make(kind).fit(X[:50])
            start = time.perf_counter()
            model = make(kind).fit(X, y) if "Regressor" in name else make(kind).fit(X)
            fit_s = time.perf_counter() - start
            start = time.perf_counter()
            model.predict(Q) if "Regressor" in name else model.score_samples(Q)
            predict_s = time.perf_counter() - start
            base = fit_s if base is None else base
            if criterion is not None:
                value = f"LOO MSE {criterion(model, kind):.5f}"
            else:
                value = f"LOO log-lik/row {model.summary().criteria['loo_log_likelihood']:.4f}"
            widths = np.array2string(model.bandwidth_, precision=3)
            print(
                f"{name} {kind:>15} on {rows} rows: fit {fit_s:6.2f} s ({fit_s / base:5.2f}x "
                f"fixed), predict {rows} rows {predict_s:6.3f} s, {value}, widths {widths}"
            )


def bands(args):
    import nbattn

    rng = np.random.default_rng(1)
    X = rng.uniform(-2.0, 2.0, (args.band_rows, 2))
    y = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] + rng.normal(0.0, 0.5, args.band_rows)
    Q = rng.uniform(-2.0, 2.0, (args.band_points, 2))
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.3 * X.std(axis=0, ddof=1))
    model.fit(X, y)
    print(
        f"\nband of {args.band_points} points from {args.band_rows} rows, "
        f"{args.band_boots} replicates, local-linear, widths 0.3 sd"
    )
    runs = [
        ("sandwich (asymptotic)", dict(method="asymptotic")),
        ("wild bootstrap", dict(method="bootstrap", n_boot=args.band_boots)),
        ("pairs bootstrap", dict(method="bootstrap", n_boot=args.band_boots, resample="pairs")),
    ]
    for label, options in runs:
        model.predict_interval(Q[:10], **options)  # compiles on a cold cache
        start = time.perf_counter()
        band = model.predict_interval(Q, **options)
        took = time.perf_counter() - start
        width = np.median(band[:, 1] - band[:, 0])
        print(f"{label:22s} {took:8.3f} s   median width {width:.4f}")


def significance(args):
    import nbattn

    X, y = data(args.rows)
    widths = 0.3 * X.std(axis=0, ddof=1)
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=widths).fit(X, y)
    model.significance_test(X, y, n_boot=args.boots)  # compiles on a cold cache
    start = time.perf_counter()
    table = model.significance_test(X, y, n_boot=args.boots)
    three = time.perf_counter() - start
    start = time.perf_counter()
    one = model.significance_test(X, y, columns=[2], n_boot=args.boots)
    single = time.perf_counter() - start
    print(f"{args.rows} rows, {args.boots} wild replicates, local-linear, widths 0.3 sd")
    print(f"nbattn, three columns: {three:8.3f} s")
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    print(f"nbattn, column x2:     {single:8.3f} s   p = {one.p_value.iloc[0]:.4f}")
    if args.skip_statsmodels:
        return
    from statsmodels.nonparametric.kernel_regression import KernelReg

    times = []
    for boots in args.sm_boots:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            reg = KernelReg(y, X, "ccc", reg_type="ll", bw=widths)
            sig = reg.sig_test([2], nboot=boots)
            times.append(time.perf_counter() - start)
        print(f"statsmodels sig_test, column x2, {boots:3d} replicates: {times[-1]:8.2f} s ({sig})")
    (b0, b1), (t0, t1) = args.sm_boots, times
    per_boot = (t1 - t0) / (b1 - b0)
    scaled = t0 + per_boot * (args.boots - b0)
    print(
        f"statsmodels at {args.boots} replicates (scaled, {per_boot:.2f} s a replicate): "
        f"{scaled:8.1f} s = {scaled / single:,.0f}x nbattn's one-column test"
    )


if __name__ == "__main__":
    main()
