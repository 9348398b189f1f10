"""Benchmark: what nbattn's entry points cost around the kernels they run, against peers.

One run prints each figure next to its peer, measured in the same run (the
median of ``--repeat`` interleaved rounds after one warm-up call each, so both
see the same load); ``ratio`` is the peer's time / nbattn's time for the
attention cases (> 1: nbattn is faster) and nbattn's time - the peer's for the
estimators (the overhead in ms). numba and torch run on ``--threads`` threads
(2 by default).

* ``attention(mask=M)``: q, k, v (1, 8, N, 64) float32, N = 2048, a dense
  (1, 1, N, N) bool mask (a band: key j <= i + N/8) and float mask (0.1 x
  normal draws), against ``flash_attention`` with the same mask and torch's
  ``scaled_dot_product_attention``;
* ``multi_head_attention``: E = 512, H = 8, L = S = 1024, batch 1, float32
  self-attention with ``need_weights=False`` against
  ``torch.nn.functional.multi_head_attention_forward`` (the function behind
  ``torch.nn.MultiheadAttention``, the same weights, no weights asked for);
* ``NadarayaWatsonRegressor(bandwidth="loo_scale").fit`` on 2,000 rows of one
  feature against the width search it runs
  (``nbattn.smoothing.width_search.loo_scale`` on the same arrays), and its
  ``predict`` of 2,000 rows against ``nbattn.nadaraya_watson`` at the fitted width;
* ``nbattn.load``: a fresh process imports nbattn and loads a model file
  (interpreter start-up excluded), the median of ``--load-repeats``
  processes, against the floor, ``import numpy, numba`` in a fresh process.

    python scripts/bench_overheads.py [--threads 2] [--repeat 9] [--quick]

``--quick`` divides the sizes by 4 (a smoke run of the script, not a figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numba
import numpy as np
from _timing import interleaved_times

import nbattn

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is optional: nbattn's times alone
    torch = None

ROOT = Path(__file__).resolve().parent.parent


def _medians(fns, repeat):
    return [float(np.median(t)) for t in interleaved_times(fns, repeat)]


def _line(name, ours, peer, peer_name, kind="ratio"):
    if peer is None:
        print(f"{name:<46} {ours * 1e3:9.1f} ms   ({peer_name}: not installed)", flush=True)
        return
    if kind == "ratio":
        figure = f"{peer / ours:6.2f}x"
    else:
        figure = f"{(ours - peer) * 1e3:+7.1f} ms"
    print(
        f"{name:<46} {ours * 1e3:9.1f} ms  {peer_name:<22} {peer * 1e3:9.1f} ms  {figure}",
        flush=True,
    )


# --------------------------------------------------------------------------- attention
def masks_case(n, repeat):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, n, 64)).astype(np.float32) for _ in range(3))
    masks = {
        "bool": np.tril(np.ones((1, 1, n, n), dtype=bool), k=n // 8),
        "float": (0.1 * rng.standard_normal((1, 1, n, n))).astype(np.float32),
    }
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v)) if torch is not None else (None,) * 3
    print(f"\nattention with a dense (1, 1, N, N) mask, q k v (1, 8, {n}, 64) float32")
    print(f"{'':<46} {'nbattn':>12}  {'peer':<22} {'':>12}  ratio (peer / nbattn)")
    for kind, mask in masks.items():
        fns = [
            lambda m=mask: nbattn.attention(q, k, v, mask=m),
            lambda m=mask: nbattn.flash_attention(q, k, v, mask=m),
        ]
        if torch is not None:
            tm = torch.from_numpy(mask)

            def sdpa(tm=tm):
                with torch.no_grad():
                    F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm)

            fns.append(sdpa)
        times = _medians(fns, repeat)
        ours, flash = times[0], times[1]
        peer = times[2] if torch is not None else None
        _line(f"attention(mask={kind})", ours, flash, "flash_attention")
        _line(f"attention(mask={kind})", ours, peer, "torch SDPA")
        _line(f"flash_attention(mask={kind})", flash, peer, "torch SDPA")


def multihead_case(n, repeat, e=512, h=8):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, n, e)).astype(np.float32)
    w_in = (rng.standard_normal((3 * e, e)) / np.sqrt(e)).astype(np.float32)
    b_in = (0.1 * rng.standard_normal(3 * e)).astype(np.float32)
    w_out = (rng.standard_normal((e, e)) / np.sqrt(e)).astype(np.float32)
    b_out = (0.1 * rng.standard_normal(e)).astype(np.float32)
    print(f"\nmulti_head_attention, E {e}, H {h}, L = S = {n}, batch 1, float32, no weights")

    def ours():
        nbattn.multi_head_attention(x, x, x, h, w_in, b_in, w_out, b_out, need_weights=False)

    fns = [ours]
    if torch is not None:
        tx = torch.from_numpy(x).transpose(0, 1)  # (L, batch, E): the functional's layout
        tw_in, tb_in, tw_out, tb_out = (torch.from_numpy(a) for a in (w_in, b_in, w_out, b_out))

        def theirs():
            with torch.no_grad():
                F.multi_head_attention_forward(
                    tx,
                    tx,
                    tx,
                    e,
                    h,
                    tw_in,
                    tb_in,
                    None,
                    None,
                    False,
                    0.0,
                    tw_out,
                    tb_out,
                    training=False,
                    need_weights=False,
                )

        fns.append(theirs)
    times = _medians(fns, repeat)
    _line("multi_head_attention", times[0], times[1] if torch else None, "torch MHA forward")


# --------------------------------------------------------------------------- estimators
def estimator_case(n, repeat):
    from nbattn.smoothing import width_search

    rng = np.random.default_rng(2)
    x = np.sort(rng.uniform(0.0, 5.0, n))[:, None]
    y = 2.0 * np.sin(x[:, 0]) + x[:, 0] ** 0.8 + 0.5 * rng.standard_normal(n)
    queries = rng.uniform(0.0, 5.0, (n, 1))
    model = nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale").fit(x, y)
    h = model.bandwidth_
    print(f"\nNadarayaWatsonRegressor, {n} rows of one feature, float64")
    print(f"{'':<46} {'nbattn':>12}  {'the call it makes':<22} {'':>12}  overhead")
    fit, search = _medians(
        [
            lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale").fit(x, y),
            lambda: width_search.loo_scale(x, y[:, None]),
        ],
        repeat,
    )
    _line('fit(bandwidth="loo_scale")', fit, search, "loo_scale search", kind="diff")
    predict, pool = _medians(
        [lambda: model.predict(queries), lambda: nbattn.nadaraya_watson(queries, x, y, h)],
        repeat,
    )
    _line("predict", predict, pool, "nadaraya_watson", kind="diff")


# --------------------------------------------------------------------------- load
_PROBE = """
import time
t0 = time.perf_counter()
{body}
print(time.perf_counter() - t0)
"""


def _fresh_process_time(body):
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return float(out.stdout.strip().splitlines()[-1])


def load_case(repeats):
    rng = np.random.default_rng(3)
    x = rng.uniform(0.0, 5.0, (500, 2))
    y = np.sin(x[:, 0]) + x[:, 1]
    model = nbattn.NadarayaWatsonRegressor().fit(x, y)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.npz")
        nbattn.save(model, path)
        load_body = f"import nbattn\nnbattn.load({path!r})"
        floor_body = "import numpy, numba"
        _fresh_process_time(load_body)  # warm the file system caches
        loads, floors = [], []
        for _ in range(repeats):
            loads.append(_fresh_process_time(load_body))
            floors.append(_fresh_process_time(floor_body))
    print(f"\nnbattn.load of a model file in a fresh process (median of {repeats})")
    _line(
        "import nbattn; nbattn.load(path)",
        statistics.median(loads),
        statistics.median(floors),
        "import numpy, numba",
        kind="diff",
    )
    print(json.dumps({"load_s": sorted(loads), "floor_s": sorted(floors)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--load-repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="run the cases whose name holds this text")
    args = parser.parse_args(argv)
    numba.set_num_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    div = 4 if args.quick else 1
    print(
        f"threads: numba {numba.get_num_threads()}, torch "
        f"{torch.get_num_threads() if torch else '-'}; load average at start: "
        "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    )
    cases = {
        "masks": lambda: masks_case(2048 // div, args.repeat),
        "multihead": lambda: multihead_case(1024 // div, args.repeat),
        "estimator": lambda: estimator_case(2000 // div, args.repeat),
        "load": lambda: load_case(args.load_repeats),
    }
    for name, case in cases.items():
        if args.only in name:
            case()
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
