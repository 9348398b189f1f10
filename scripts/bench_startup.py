"""Start-up: import times and time to the first result, each in a fresh process.

Every probe runs in a new Python process and times itself from just before
``import nbattn`` (interpreter start-up excluded). Each is repeated and the
median reported, with the fastest and slowest run, and which heavy libraries
the probe left loaded. The probes that call a kernel run once against an empty
numba cache (cold: they compile and fill it) and then repeatedly against that
cache (warm: ``cache=True`` loads the compiled kernels). ``numpy + numba`` is
the floor: every kernel needs both. The CPU column (the process's CPU time
over the same span; all threads) is steadier than the wall clock on a shared
machine, and close to what the wall clock is on an idle one for the imports.

The last probe is the command itself, ``nbattn predict`` of a model file
fitted on the walk-through's sample: it reads the file without scikit-learn
(:mod:`nbattn.persistence.predictor`). For each probe that runs a kernel, one more warm run
under ``python -X importtime`` says how much of its time is imports, and which
packages take it. "whole process" is the wall time of the process from its
start, interpreter start-up included.

    python scripts/bench_startup.py [--repeats 7] [--cold-repeats 1] [--imports-only] [--only TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The libraries whose import dominates start-up; a probe reports which it loaded.
HEAVY = ("sklearn", "scipy", "pandas", "matplotlib", "dask", "distributed", "pyarrow", "torch")

#: name -> (code timed in a fresh process, whether it runs a kernel).
PROBES = {
    "numpy + numba (floor)": ("import numpy, numba", False),
    "import nbattn": ("import nbattn", False),
    "nbattn.flash_attention": ("import nbattn\nnbattn.flash_attention", False),
    "nbattn.nadaraya_watson": ("import nbattn\nnbattn.nadaraya_watson", False),
    "nbattn.NadarayaWatsonRegressor": ("import nbattn\nnbattn.NadarayaWatsonRegressor", False),
    "first flash_attention call": (
        "import numpy as np\n"
        "import nbattn\n"
        "q = np.random.default_rng(0).standard_normal((1, 2, 64, 32)).astype(np.float32)\n"
        "nbattn.flash_attention(q, q, q)",
        True,
    ),
    "first NadarayaWatsonRegressor prediction": (
        "import numpy as np\n"
        "import nbattn\n"
        "x = np.linspace(0.0, 1.0, 100)[:, None]\n"
        "nbattn.NadarayaWatsonRegressor().fit(x, x[:, 0]).predict(x)",
        True,
    ),
    "model file + kernel, no pandas (predict's floor)": (
        "import numpy as np\n"
        "from nbattn.persistence.predictor import read_predictor\n"
        "model = read_predictor({predict_args!r}[1])[0]\n"
        "model.predict(np.linspace(0.0, 6.0, 50)[:, None])",
        True,
    ),
    "nbattn predict (the command, one model file)": (
        "import nbattn.app.cli\nassert nbattn.app.cli.main({predict_args!r}) == 0",
        True,
    ),
}
#: the data the command probe fits its model on and predicts (the walk-through's sample)
DATA = ROOT / "data" / "seed_pooling.csv"

HARNESS = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
{body}
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
from numba.core.dispatcher import Dispatcher
compiled = sum(
    sum(obj.stats.cache_misses.values())
    for name, module in list(sys.modules.items()) if name.startswith("nbattn.")
    for obj in list(vars(module).values()) if isinstance(obj, Dispatcher)
) if "numba" in sys.modules else 0
print(json.dumps({{"seconds": seconds, "cpu": cpu, "heavy": heavy, "compiled": compiled}}))
"""


def run_probe(body: str, cache_dir: str, importtime: bool = False) -> dict:
    """One fresh process: the probe's own timing, plus the process's wall time from
    its start (interpreter start-up included) and, with ``importtime``, the import
    times Python reports (``-X importtime``)."""
    code = HARNESS.format(body=body, heavy=HEAVY)
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    flags = ["-X", "importtime"] if importtime else []
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, *flags, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    process = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"probe failed:\n{body}\n{result.stderr}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["process"] = process
    if importtime:
        out["imports"] = import_times(result.stderr)
    return out


def import_times(stderr: str) -> dict:
    """{top-level package: seconds} from ``-X importtime`` output: each module's own
    (self) time summed over its top-level package, so lazy imports count too."""
    totals = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, self_us, _, name = (
            part.strip() for part in line.replace("import time:", "|").split("|")
        )
        package = name.split(".")[0]
        totals[package] = totals.get(package, 0.0) + int(self_us) / 1e6
    return totals


def report_imports(label: str, run: dict) -> None:
    imports = run["imports"]
    total = sum(imports.values())
    top = sorted(imports.items(), key=lambda kv: -kv[1])[:7]
    shown = ", ".join(f"{name} {seconds:.3f}" for name, seconds in top)
    print(
        f"{'':<4}{label}: imports {total:.3f} s of {run['seconds']:.3f} s "
        f"({100 * total / run['seconds']:.0f}%; under -X importtime): {shown}"
    )


def report(label: str, runs: list[dict]) -> None:
    times = [r["seconds"] for r in runs]
    cpu = statistics.median(r["cpu"] for r in runs)
    process = statistics.median(r["process"] for r in runs)
    heavy = ", ".join(runs[-1]["heavy"]) or "none"
    compiled = runs[-1]["compiled"]
    print(
        f"{label:<48} median {statistics.median(times):6.3f} s "
        f"(min {min(times):.3f}, max {max(times):.3f}, n={len(times)}), CPU {cpu:6.3f} s, "
        f"whole process {process:6.3f} s; compiled: {compiled}; heavy: {heavy}"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="warm runs per probe")
    parser.add_argument(
        "--cold-repeats", type=int, default=1, help="runs against an empty numba cache (0: none)"
    )
    parser.add_argument(
        "--imports-only", action="store_true", help="skip the probes that run a kernel"
    )
    parser.add_argument("--only", metavar="TEXT", help="run the probes whose label holds TEXT")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.2f}; "
        "fresh process per run"
    )
    with tempfile.TemporaryDirectory() as warm_cache, tempfile.TemporaryDirectory() as work:
        predict_args = command_files(Path(work))
        for label, (body, runs_kernel) in PROBES.items():
            if (runs_kernel and args.imports_only) or (args.only and args.only not in label):
                continue
            body = body.format(predict_args=predict_args) if "predict_args" in body else body
            if runs_kernel:
                cold = []
                for _ in range(args.cold_repeats):
                    with tempfile.TemporaryDirectory() as empty_cache:
                        cold.append(run_probe(body, empty_cache))
                if cold:
                    report(f"{label}, cold", cold)
                run_probe(body, warm_cache)  # fills the warm cache
                label = f"{label}, warm"
            report(label, [run_probe(body, warm_cache) for _ in range(args.repeats)])
            if runs_kernel:
                report_imports("where the warm time goes", run_probe(body, warm_cache, True))


def command_files(folder: Path) -> list:
    """Fit the model the command probe predicts with (``nbattn fit``, this checkout);
    return the probe's ``nbattn predict`` arguments."""
    model = folder / "model.npz"
    fit = ["fit", str(DATA), "--target", "y", "-q", "-o", str(model)]
    subprocess.run([sys.executable, "-m", "nbattn.app.cli", *fit], cwd=ROOT, check=True)
    return ["predict", str(model), str(DATA), "-o", str(folder / "out.csv"), "-q"]


if __name__ == "__main__":
    main()
