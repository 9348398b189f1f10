"""Cold and warm start-up: time from a new process to its first prediction.

The first process compiles the kernels and writes numba's cache; the second
loads them from the cache (``cache=True``) without recompiling.

    python scripts/bench_startup.py
"""

import json
import os
import subprocess
import sys
import tempfile

PROBE = """
import json, time
t0 = time.perf_counter()
import numpy as np
import nbattn
from nbattn.kernels import pooling
t_import = time.perf_counter() - t0
x = np.linspace(0, 1, 100)[:, None]
nbattn.NadarayaWatsonRegressor().fit(x, x[:, 0]).predict(x)
print(json.dumps({"import": t_import, "first_prediction": time.perf_counter() - t0,
                  "compiled": sum(pooling.gaussian_pool.stats.cache_misses.values())}))
"""

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold (compiles)", "warm (cache)", "warm (cache)"):
            out = subprocess.run(
                [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
            ).stdout
            r = json.loads(out)
            print(
                f"{label:<16} import {r['import']:.2f} s, first prediction after "
                f"{r['first_prediction']:.2f} s, kernels compiled: {r['compiled']}"
            )
