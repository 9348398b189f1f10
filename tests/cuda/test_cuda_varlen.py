"""CUDA packed variable-length attention (simulator) against the per-sequence reference
and the CPU kernels, called with ``nbattn.kernels.varlen``'s arguments."""

import os

import numpy as np
import pytest

from nbattn._core.attn_groups import NO_DROPOUT, Dropout, Packing, ScoreTransform, Tiles, Work
from nbattn.cuda import varlen as cuda_varlen

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

LOG2E = 1.4426950408889634
FAR = 10**6
# 4 sequences: 3 x 5, 0 x 2 (keys without queries), 7 x 0 (queries without keys), 1 x 9
CU_Q = np.array([0, 3, 3, 10, 11], dtype=np.int64)
CU_K = np.array([0, 5, 7, 7, 16], dtype=np.int64)
GQA = np.array([0, 0, 1, 1], dtype=np.int64)


def _bands(causal, left, right):
    n_q, n_k = np.diff(CU_Q), np.diff(CU_K)
    offset = n_k - n_q  # bottom-right alignment per sequence
    right = 0 if causal else right
    return np.stack([offset, np.full(4, left), np.full(4, right)], axis=1).astype(np.int64)


def _reference(q, k, v, scale, bands, softcap, drop, grad):
    """Each sequence alone through naive.flash_slices (dropout factors of the packed
    counters), reassembled."""
    out = np.zeros(q.shape[:2] + v.shape[2:])
    lse = np.full(q.shape[:2], -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for s in range(4):
        rq, rk = slice(CU_Q[s], CU_Q[s + 1]), slice(CU_K[s], CU_K[s + 1])
        if CU_Q[s + 1] == CU_Q[s] or CU_K[s + 1] == CU_K[s]:  # nothing to attend
            continue
        terms = dict(band=tuple(bands[s]), softcap=softcap, drop=drop[:, rq, rk])
        o, l_ = naive.flash_slices(q[:, rq], k[:, rk], v[:, rk], GQA, scale, **terms)
        out[:, rq], lse[:, rq] = o, l_
        g = naive.flash_slices_backward(
            q[:, rq], k[:, rk], v[:, rk], grad[:, rq], GQA, scale, **terms
        )
        dq[:, rq] = g[0]
        dk[:, rk] += g[1]
        dv[:, rk] += g[2]
    return (out, lse), (dq, dk, dv)


@pytest.mark.parametrize(
    ("causal", "left", "right", "softcap", "dropout_p"),
    [(True, FAR, FAR, None, 0.0), (False, 2, 1, 1.5, 0.0), (True, 3, FAR, None, 0.3)],
)
def test_packed_sequences(rng, causal, left, right, softcap, dropout_p):
    q = rng.normal(size=(4, 11, 3))
    k = rng.normal(size=(2, 16, 3))
    v = rng.normal(size=(2, 16, 2))
    grad = rng.normal(size=(4, 11, 2))
    scale, seed = 0.8, 12345
    bands = _bands(causal, left, right)
    dropout = NO_DROPOUT
    drop = np.ones((4, 11, 16))
    if dropout_p > 0:
        keep_scale = 1.0 / (1.0 - dropout_p)
        dropout = Dropout(seed, round(dropout_p * 2**24), 11, 16, 0, 0, keep_scale)
        drop = naive.dropout_factors(seed, 4, 11, 16, dropout_p)
    cap = 0.0 if softcap is None else softcap * LOG2E
    q2 = q * scale * LOG2E
    # the CPU's work split and tiles are not used on the GPU
    groups = (Packing(CU_Q, CU_K, bands), Work(None, None), ScoreTransform(scale, cap), dropout)
    out, lse = cuda_varlen.varlen_forward(q2, k, v, GQA, *groups, Tiles(16, 16))
    out, lse = out.copy_to_host(), lse.copy_to_host()
    (ref_out, ref_lse), ref_grads = _reference(q, k, v, scale, bands, softcap, drop, grad)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(ref_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], ref_lse[np.isfinite(ref_lse)], atol=1e-12)
    np.testing.assert_array_equal(out[:, 3:10], 0.0)  # the sequence without keys
    grads = cuda_varlen.varlen_backward(q2, k, v, out, lse, grad, GQA, *groups, Tiles(16, 16))
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g.copy_to_host(), r, rtol=0, atol=1e-12)


def test_equals_the_cpu_kernels(rng):
    """The same arguments through nbattn.kernels.varlen (its work items built here)."""
    from nbattn.kernels import varlen as cpu_varlen

    q = rng.normal(size=(4, 11, 3)) * LOG2E
    k = rng.normal(size=(2, 16, 3))
    v = rng.normal(size=(2, 16, 2))
    grad = rng.normal(size=(4, 11, 2))
    packing = Packing(CU_Q, CU_K, _bands(True, 4, FAR))
    dropout = Dropout(7, round(0.2 * 2**24), 11, 16, 0, 0, 1.25)
    n_q = np.diff(CU_Q)
    items = np.array([(s, bh, 0, n_q[s]) for s in range(4) for bh in range(4) if n_q[s]])
    one_worker = np.array([0, len(items)], dtype=np.int64)
    work = Work(items, one_worker)
    args = (GQA, packing, work, ScoreTransform(0.9, 0.0), dropout, Tiles(16, 16))
    out, lse = (a.copy_to_host() for a in cuda_varlen.varlen_forward(q, k, v, *args))
    ref_out, ref_lse = cpu_varlen.varlen_forward(q, k, v, *args)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=1e-12)
    back_items = np.array([(s, kv) for s in range(4) for kv in range(2)])
    back_worker = np.array([0, len(back_items)], dtype=np.int64)
    back = (
        GQA,
        packing,
        Work(back_items, back_worker),
        ScoreTransform(0.9, 0.0),
        dropout,
        Tiles(16, 16),
    )
    got = cuda_varlen.varlen_backward(q, k, v, out, lse, grad, *back)
    ref = cpu_varlen.varlen_backward(q, k, v, ref_out, ref_lse, grad, *back)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g.copy_to_host(), r, rtol=0, atol=1e-12)
