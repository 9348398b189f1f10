"""CUDA split-KV decoding (simulator) equals the CPU kernel and the dense reference.

``nbattn.cuda.decode.decode_partials`` is called with the arguments of
``nbattn.kernels.decode.decode_partials``; chunk states are compared with the
CPU's, and the merged states (the log-sum-exp merge) with dense attention over
each batch row's cache (``naive.attention_bottom_right``). Threads per block
are 8 (tests/cuda/conftest.py): one query row per kv head gives 8 sub-slices
per chunk merged in shared memory; ten rows give one thread per row.
"""

import os

import numpy as np
import pytest

from nbattn import config
from nbattn._core.attn_groups import DecodeWindow, KeySplit
from nbattn.cuda import decode as cuda_decode
from nbattn.kernels import decode as cpu_decode
from nbattn.kernels.softmax import merge_states

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)


def _key_ranges(totals, n_q, causal, left, right):
    """[starts, ends): the keys some query of each row admits (bottom-right positions)."""
    starts = np.maximum(0, totals - n_q - (left if left >= 0 else 10**9)).clip(0)
    ends = totals.copy()
    if right >= 0 or causal:
        last = totals - 1
        hi = last + (right if right >= 0 else 0) if not causal else last
        ends = np.minimum(totals, hi + 1)
    return starts.astype(np.int64), np.maximum(ends, starts).astype(np.int64)


def _case(rng, dtype, lengths, n_q, n_h, n_hkv, d, d_v, s_max=20):
    q = rng.normal(size=(len(lengths), n_h, n_q, d)).astype(dtype)
    k = rng.normal(size=(len(lengths), n_hkv, s_max, d)).astype(dtype)
    v = rng.normal(size=(len(lengths), n_hkv, s_max, d_v)).astype(dtype)
    return q, k, v, np.asarray(lengths, dtype=np.int64)


def _merged(part_out, part_lse):
    out, lse = part_out[0], part_lse[0]
    for s in range(1, part_out.shape[0]):
        out, lse = merge_states(out, lse, part_out[s], part_lse[s])
    return out, lse


CASES = [
    # lengths (after the append), L, H, H_kv, causal, left, right, softcap, n_splits
    ((0, 5, 17), 1, 4, 2, True, -1, -1, 0.0, 3),  # one row per kv head: sub-slices merged
    ((3, 9, 20), 5, 2, 1, True, 2, -1, 0.0, 2),  # ten rows >= 8 threads, window
    ((1, 12, 6), 2, 2, 2, False, -1, 1, 1.5, 1),  # not causal, right window, softcap
    ((16,), 1, 8, 1, True, 4, -1, 0.0, 4),  # eight query heads on one kv head
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES)
def test_partials_equal_cpu_and_merge_to_dense(rng, dtype, case):
    lengths, n_q, n_h, n_hkv, causal, left, right, softcap, n_splits = case
    q, k, v, totals = _case(rng, dtype, lengths, n_q, n_h, n_hkv, 3, 2)
    starts, ends = _key_ranges(totals, n_q, causal, left, right)
    chunks = np.maximum(-(-(ends - starts) // n_splits), 1)
    keys = KeySplit(totals, starts, chunks, ends, n_splits)
    args = (q, k, v, keys, DecodeWindow(causal, left, right), 0.7, softcap, 4)
    out, lse = (a.copy_to_host() for a in cuda_decode.decode_partials(*args))
    ref_out, ref_lse = cpu_decode.decode_partials(*args)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(ref_lse))
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * 10)
    np.testing.assert_allclose(lse[np.isfinite(lse)], ref_lse[np.isfinite(ref_lse)], atol=tol * 10)
    merged, merged_lse = _merged(out, lse)
    merged = merged.reshape(len(lengths), n_h, n_q, -1)
    merged_lse = merged_lse.reshape(len(lengths), n_h, n_q)
    window = (None if left < 0 else left, None if right < 0 else right)
    for b, total in enumerate(totals):
        dense, dense_lse = naive.attention_bottom_right(
            q[b], k[b, :, :total], v[b, :, :total], causal, 0.7, window,
            softcap if softcap > 0 else None,
        )  # fmt: skip
        np.testing.assert_allclose(merged[b], dense, rtol=0, atol=tol * 10)
        finite = np.isfinite(dense_lse)
        np.testing.assert_array_equal(np.isfinite(merged_lse[b]), finite)
        np.testing.assert_allclose(merged_lse[b][finite], dense_lse[finite], atol=tol * 10)


def test_shared_budget_limits_the_block(monkeypatch):
    """Each thread needs (Ev + 2) float64 for its state and a query row of d floats in
    shared memory: a small budget, fewer threads per block."""
    monkeypatch.setattr(config, "CUDA_THREADS_PER_BLOCK", 128)
    monkeypatch.setattr(config, "CUDA_SHARED_MEMORY_BYTES", 64 * ((8 + 2) * 8 + 4 * 8))
    assert cuda_decode._threads(1, 4, 8, 8) == (64, 64)
    assert cuda_decode._threads(3, 4, 8, 8) == (64, 21)
    assert cuda_decode._threads(100, 4, 8, 8) == (64, 1)
    assert cuda_decode._threads(1, 4, 8, 4)[0] == 7168 // (80 + 16)  # float32 rows: half
