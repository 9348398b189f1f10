"""The walk-through's data, the shipped datasets, the demo job and the on-disk kernel cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn.app.cli import main
from nbattn.app.datasets import available_datasets, data_files, load_csv, seed_data, seed_function

ROOT = Path(__file__).resolve().parents[2]


def test_seed_csv_is_the_recipe():
    data = seed_data()
    frame = load_csv("seed_pooling")
    np.testing.assert_array_equal(frame["x"], data.x_train)
    # y = 2 sin x + x^0.8 + noise: NumPy's vectorised sin and power may round the last bit
    # differently between versions and CPUs (NumPy 2.4 on AVX-512 differs from the file by
    # one ulp at one point), so y is the recipe to 2 ulp; x involves no such function.
    np.testing.assert_array_max_ulp(frame["y"].to_numpy(), data.y_train, maxulp=2)
    assert np.all(np.diff(data.x_train) >= 0) and data.x_train.max() < 6.0
    assert len(data.x_test) == 50 and data.x_test[-1] < 6.28
    np.testing.assert_allclose(data.y_test, 2 * np.sin(data.x_test) + data.x_test**0.8)
    residual = data.y_train - seed_function(data.x_train)
    assert 0.2 < residual.std() < 0.8  # N(0, 0.5) noise


def test_shipped_datasets_are_the_files_of_data():
    """Every CSV of the top-level data/ folder loads, unchanged, by its name."""
    files = sorted((ROOT / "data").glob("*.csv"))
    assert available_datasets() == [p.stem for p in files] and len(files) >= 3
    for path in files:
        pd.testing.assert_frame_equal(load_csv(path.stem), pd.read_csv(path))
    assert load_csv("diabetes").shape == (442, 11)
    assert data_files().joinpath("README.md").is_file()  # sources and licences travel along


@pytest.mark.parametrize("name", ["nope", "engel.csv", "README", "__init__", "", None, 3])
def test_unknown_dataset_is_refused_by_name(name):
    with pytest.raises(ValueError, match=r"^name: no dataset .*available: diabetes, engel"):
        load_csv(name)


def test_engel_regression_beats_average_pooling():
    df = load_csv("engel")
    X, y = df[["income"]], df["foodexp"]
    nw = nbattn.NadarayaWatsonRegressor().fit(X, y).score(X, y)
    avg = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y).score(X, y)
    assert nw > 0.8 and avg < 1e-12


def test_demo_prints_metrics_and_writes_figures(tmp_path, capsys):
    assert main(["demo", "--outdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in ("average_pooling", "nadaraya_watson", "mse", "r2"):
        assert name in out
    for fig in (
        "data.png",
        "average_pooling.png",
        "nadaraya_watson.png",
        "heatmap_nadaraya_watson.png",
    ):
        assert (tmp_path / fig).stat().st_size > 1000


def test_demo_nadaraya_watson_beats_average_pooling():
    from nbattn.app.seed import run_seed

    table = run_seed()
    assert table.loc["nadaraya_watson", "mse"] < table.loc["average_pooling", "mse"]


# The probe compiles one small kernel (the row softmax): the pooling kernels would
# take 40 s of CPU to compile in this fresh cache, on every run, warm or cold.
_PROBE = """
import json, time
t0 = time.perf_counter()
import numpy as np, nbattn
from nbattn.kernels import softmax
x = np.linspace(0, 1, 50).reshape(5, 10)
nbattn.softmax(x)
print(json.dumps({"misses": sum(softmax.softmax_rows.stats.cache_misses.values()),
                  "hits": sum(softmax.softmax_rows.stats.cache_hits.values()),
                  "seconds": time.perf_counter() - t0}))
"""


def test_second_process_loads_compiled_kernel_from_cache(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(2)
    ]
    assert runs[0]["misses"] >= 1
    assert runs[1]["misses"] == 0 and runs[1]["hits"] >= 1


def test_only_compiled_tunables_turn_the_kernel_cache_off():
    """NBATTN_* variables that no kernel bakes in (the test script's torch opt-in,
    the dask timeout) leave numba's on-disk cache on; a block size turns it off."""
    import subprocess
    import sys

    probe = [sys.executable, "-c", "import nbattn.config as c; print(c.CACHE, c.CUDA_CACHE)"]
    for env, want in (
        ({"NBATTN_TEST_TORCH": "1", "NBATTN_DASK_CONNECT_TIMEOUT": "5"}, "True True"),
        ({"NBATTN_KEY_BLOCK": "512"}, "False False"),
        ({"NBATTN_KEY_BLOCK": "512", "NBATTN_CACHE": "1"}, "True True"),
        # a CUDA launch size: only the CUDA kernels compile afresh
        ({"NBATTN_CUDA_THREADS_PER_BLOCK": "64"}, "True False"),
        ({"NBATTN_CUDA_THREADS_PER_BLOCK": "64", "NBATTN_CACHE": "0"}, "False False"),
        # NBATTN_CACHE read as every NBATTN_* switch: empty is unset, any case, spaces
        ({"NBATTN_KEY_BLOCK": "512", "NBATTN_CACHE": ""}, "False False"),
        ({"NBATTN_KEY_BLOCK": "512", "NBATTN_CACHE": " Yes "}, "True True"),
        ({"NBATTN_CACHE": "OFF"}, "False False"),
        ({"NBATTN_CACHE": " 0"}, "False False"),
    ):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("NBATTN_")}
        out = subprocess.run(
            probe, env={**clean, **env}, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == want, env
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NBATTN_")}
    out = subprocess.run(
        probe, env={**clean, "NBATTN_CACHE": "maybe"}, capture_output=True, text=True
    )
    assert out.returncode != 0 and "NBATTN_CACHE='maybe' must be 1 or 0" in out.stderr
