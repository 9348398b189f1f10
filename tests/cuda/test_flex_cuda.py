"""Programmable attention on the GPU (simulator): score_mod / mask_mod / block_mask with
device="cuda" equal the dense float64 formulation of tests/naive.py, forward (out, lse)
and backward (dq, dk, dv); the CPU flex kernels are tested against the same formulation
and torch in tests/attn/test_flex.py.

No CPU flex kernel is compiled here: the simulator runs the GPU side as Python, and the
reference is NumPy. Only the CPU's checks of the user functions compile (the GPU
refuses what the CPU refuses), and ``create_block_mask``'s table.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from numba import cuda

import nbattn
from nbattn import config
from nbattn.attn.flex import BlockMask
from nbattn.cuda import flex as cuda_flex

from .. import naive
from .test_flex_cuda_review import close

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

B, H, L, S, E, EV = 2, 2, 11, 13, 4, 3
WIDE = 10**6
# Results are compared with the float64 dense formulation by test_flex_cuda_review's
# ``close`` and its TOL (the worst errors over 10 seeds of both files, and the margin).


def score_fn(score, b, h, q_idx, kv_idx, cap, slopes, table, doc, left, right):
    """A tanh softcap (cap > 0), ALiBi slopes[h] (j - i), a relative-position bias table."""
    s = score
    if cap > 0:
        s = cap * nbattn.flex_tanh(s / cap)
    return s + slopes[h] * (kv_idx - q_idx) + table[h, kv_idx - q_idx + table.shape[1] // 2]


def mask_fn(b, h, q_idx, kv_idx, cap, slopes, table, doc, left, right):
    """Same document, inside the window [i - left, i + right]."""
    same = doc[b, q_idx] == doc[b, kv_idx]
    return same & (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)


def score_grad_fn(score, b, h, q_idx, kv_idx, cap, slopes, table, doc, left, right):
    """d score_fn / d score (also the dense reference's derivative)."""
    if cap > 0:
        t = np.tanh(score / cap)
        return 1.0 - t * t
    return 1.0 + 0.0 * score


def _args(cap=0.0, alibi=False, table=False, docs=1, left=WIDE, right=WIDE):
    rng = np.random.default_rng(7)
    n = max(L, S)
    slopes = 2.0 ** -(np.arange(H) + 1.0) if alibi else np.zeros(H)
    bias = rng.standard_normal((H, 2 * n + 1)) if table else np.zeros((H, 2 * n + 1))
    doc = np.zeros((B, n), dtype=np.int64)
    if docs > 1:
        for b in range(B):
            cuts = np.sort(rng.choice(np.arange(1, n), docs - 1, replace=False))
            doc[b] = np.searchsorted(cuts, np.arange(n), "right")
    return (float(cap), slopes, bias, doc, left, right)


CASES = {
    "softcap": (_args(cap=1.5), {}),
    "alibi": (_args(alibi=True), {}),
    "bias_table": (_args(table=True), {}),
    "causal_mask_mod": (_args(right=0), {}),
    "causal_keyword": (_args(), {"causal": True}),
    "documents": (_args(docs=3), {}),
    "window": (_args(alibi=True), {"window": (3, 1)}),
    "gqa": (_args(cap=1.5, table=True, docs=3, right=0), {"enable_gqa": True}),
    "combination": (_args(cap=1.5, alibi=True, table=True, docs=3, right=0), {}),
}


def _qkv(dtype, seed=0, kv_heads=H):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)) * 2.0
    k = rng.standard_normal((B, kv_heads, S, E))
    v = rng.standard_normal((B, kv_heads, S, EV))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _grad(q, v):
    """The output gradient of every backward here (seed 3, q's dtype)."""
    shape = q.shape[:-1] + v.shape[-1:]
    return np.random.default_rng(3).standard_normal(shape).astype(q.dtype)


def _both(q, k, v, args, device="cuda", **kw):
    """Forward and backward of one call on ``device``: (out, lse, dq, dk, dv)."""
    mods = dict(mod_args=args, **kw)
    if "block_mask" not in kw:
        mods.setdefault("mask_mod", mask_fn)
    given = {"score_mod_grad": mods.pop("score_mod_grad")} if "score_mod_grad" in mods else {}
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, device=device, **mods)
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, _grad(q, v), device=device, **mods, **given
    )
    return (out, lse, *grads)


def _dense(q, k, v, args, score_mod=None, mask_mod=mask_fn, **kw):
    """(out, lse, dq, dk, dv) of :func:`_both`'s call by the dense float64 formulation
    (``mask_mod`` also for a block mask: every one here is made of ``mask_fn``)."""
    return naive.flex_attention_grads(
        q, k, v, _grad(q, v), score_mod, mask_mod, mod_args=args,
        score_grad=score_grad_fn if score_mod is not None else None, **kw,
    )  # fmt: skip


def _equal_dense(got, q, k, v, args, **kw):
    """``got`` (out, lse, dq, dk, dv) of q's dtype (lse float64) within TOL of :func:`_dense`."""
    dtype = q.dtype.type
    for g, r, want in zip(got, _dense(q, k, v, args, **kw), (dtype, np.float64, *[dtype] * 3),
                          strict=True):  # fmt: skip
        assert isinstance(g, np.ndarray) and g.dtype == want
        close(g, r, dtype)


@pytest.fixture
def tiny_cpu_tiles(monkeypatch):
    """CPU flash tiles of 4 x 4 (forward and backward): a block mask's table then has
    closed, partial and open cells on these small inputs."""
    for name in ("FLASH_BLOCK_Q", "FLASH_BLOCK_K", "FLASH_BWD_BLOCK_Q", "FLASH_BWD_BLOCK_K"):
        monkeypatch.setattr(config, name, 4)


#: float32 runs the cases whose code differs by dtype (the tanh, the float32 tiles), float64
#: every case: the simulator is slow.
#: float32 runs the cases whose code differs by dtype (the tanh, the float32 tiles), float64
#: every case: the simulator is slow.
FLOAT32_CASES = ("combination", "documents", "gqa", "softcap")


@pytest.mark.parametrize(
    ("case", "dtype"),
    [(c, np.float64) for c in sorted(CASES)] + [(c, np.float32) for c in FLOAT32_CASES],
)
def test_forward_and_backward_equal_the_dense_formulation(case, dtype):
    args, kw = CASES[case]
    q, k, v = _qkv(dtype, kv_heads=1 if kw.get("enable_gqa") else H)
    got = _both(q, k, v, args, score_mod=score_fn, **kw)
    _equal_dense(got, q, k, v, args, score_mod=score_fn, **kw)


@pytest.mark.usefixtures("tiny_cpu_tiles")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_block_mask_equals_the_per_element_mask(dtype):
    """A block mask with closed, partial and open cells gives the bits of the per-element
    mask on the GPU (open cells skip mask_mod, closed ones are never visited), and the
    dense formulation's values. One batch entry: its table has all three cell kinds."""
    args, _ = CASES["combination"]
    q, k, v = (a[:1] for a in _qkv(dtype))
    block_mask = nbattn.create_block_mask(mask_fn, 1, H, L, S, mod_args=args)
    assert {0, 1, 2} <= set(np.unique(block_mask.table(4, 4)))
    got = _both(q, k, v, args, score_mod=score_fn, block_mask=block_mask)
    per_element = _both(q, k, v, args, score_mod=score_fn)
    for g, p in zip(got, per_element, strict=True):
        np.testing.assert_array_equal(g, p)
    _equal_dense(got, q, k, v, args, score_mod=score_fn)


def test_block_classes_decide_without_mask_mod():
    """The GPU reads the table: a cell marked open (2) is not masked even where mask_mod
    is False, and cells marked closed (0) are never visited (rows without keys: zeros,
    lse = -inf, zero gradients)."""
    args, _ = CASES["documents"]
    q, k, v = _qkv(np.float64)
    shape = (1, 1, L, S)
    open_mask = BlockMask(mask_fn, args, shape)
    open_mask.table = lambda block_q, block_k: np.full((1, 1, 1, 1), 2, dtype=np.uint8)
    out = nbattn.flash_attention(q, k, v, block_mask=open_mask, device="cuda")
    close(out, naive.sdpa(q, k, v)[0], np.float64)
    closed = BlockMask(mask_fn, args, shape)
    closed.table = lambda block_q, block_k: np.zeros((1, 1, 1, 1), dtype=np.uint8)
    out, lse = nbattn.flash_attention(q, k, v, block_mask=closed, return_lse=True, device="cuda")
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, np.ones_like(out), block_mask=closed, device="cuda"
    )
    for g in grads:
        np.testing.assert_array_equal(g, 0.0)


def test_score_mod_grad_equals_the_complex_step():
    """The backward with score_mod_grad given equals the one by complex step (one
    forward serves both)."""
    args, _ = CASES["combination"]
    q, k, v = _qkv(np.float64)
    mods = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args, device="cuda")
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **mods)
    by_step = nbattn.flash_attention_backward(q, k, v, out, lse, _grad(q, v), **mods)
    given_ = nbattn.flash_attention_backward(
        q, k, v, out, lse, _grad(q, v), score_mod_grad=score_grad_fn, **mods
    )
    for a, b in zip(by_step, given_, strict=True):
        close(a, b, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_one_function_alone_equals_the_dense_formulation(dtype):
    """mask_mod alone (identity score) and score_mod alone (every key admissible) equal
    the dense formulation of that function alone (one batch entry)."""
    q, k, v = (a[:1] for a in _qkv(dtype))
    args, _ = CASES["documents"]
    _equal_dense(_both(q, k, v, args), q, k, v, args)
    args, _ = CASES["combination"]
    out, lse = nbattn.flash_attention(
        q, k, v, score_mod=score_fn, mod_args=args, return_lse=True, device="cuda"
    )
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, _grad(q, v), score_mod=score_fn, mod_args=args, device="cuda"
    )
    _equal_dense((out, lse, *grads), q, k, v, args, score_mod=score_fn, mask_mod=None)


def test_two_calls_are_bit_identical_and_inputs_unchanged():
    args, kw = CASES["gqa"]
    q, k, v = (a[:1] for a in _qkv(np.float32, kv_heads=1))
    before = [a.copy() for a in (q, k, v, *args[1:4])]
    first = _both(q, k, v, args, score_mod=score_fn, **kw)
    second = _both(q, k, v, args, score_mod=score_fn, **kw)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before, (q, k, v, *args[1:4]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_auto_runs_on_the_gpu(launches):
    """device="auto" with a GPU (here the simulator) takes the GPU kernels, as flash does."""
    calls = launches(cuda_flex, "flex_forward")
    args, _ = CASES["alibi"]
    q, k, v = _qkv(np.float64)
    out = nbattn.flash_attention(q, k, v, score_mod=score_fn, mod_args=args, device="auto")
    assert calls == ["flex_forward"]
    close(out, naive.flex_attention(q, k, v, score_fn, None, mod_args=args)[0], np.float64)


def test_nan_rows_and_overflow_as_on_the_cpu():
    """NaN from score_mod on an admissible entry makes the row NaN (out and lse, as the
    dense formulation and the CPU); -inf masks the entry; a finite score beyond
    max / log2(e) is refused with the CPU's message."""
    cap, slopes, table, doc, left, right = _args()
    q, k, v = _qkv(np.float64)
    centre = table.shape[1] // 2
    table = table.copy()
    table[1, centre + 3] = np.nan  # head 1, keys j = i + 3
    table[0, centre - 2] = -np.inf  # head 0, keys j = i - 2: masked
    args = (cap, slopes, table, doc, left, right)
    got = nbattn.flash_attention(
        q, k, v, score_mod=score_fn, mask_mod=mask_fn, mod_args=args, return_lse=True,
        device="cuda",
    )  # fmt: skip
    ref = naive.flex_attention_grads(q, k, v, None, score_fn, mask_fn, mod_args=args)
    assert np.isnan(got[1][:, 1, : L - 3]).all() and np.isfinite(got[1][:, 0]).all()
    for g, r in zip(got, ref, strict=True):
        close(g, r, np.float64)
    table[1, centre + 3] = 1.3e308
    with pytest.raises(ValueError, match="score_mod returned a score of magnitude 1.3e\\+308"):
        nbattn.flash_attention(q, k, v, score_mod=score_fn, mod_args=args, device="cuda")


def test_refusals_are_clear():
    args, _ = CASES["softcap"]
    q, k, v = _qkv(np.float64)
    mods = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args)
    with pytest.raises(ValueError, match="take host \\(NumPy\\) arrays"):
        nbattn.flash_attention(cuda.to_device(q), k, v, device="cuda", **mods)
    wide = np.zeros((1, 1, 2, config.CUDA_MAX_HEAD_DIM + 1))
    with pytest.raises(ValueError, match="head dimensions up to"):
        nbattn.flash_attention(wide, wide, wide, device="cuda", **mods)

    def kinked(score, b, h, q_idx, kv_idx, *rest):
        return score - 0.5 * abs(score)

    out, lse = naive.sdpa(q, k, v)
    with pytest.raises(ValueError, match="not differentiable by complex step"):
        nbattn.flash_attention_backward(
            q, k, v, out, lse, out, score_mod=kinked, mod_args=args, device="cuda"
        )
    cu_q, cu_k = np.array([0, L]), np.array([0, S])
    with pytest.raises(ValueError, match="run on the CPU only"):
        nbattn.flash_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, device="cuda", **mods)
    with pytest.raises(ValueError, match="softcap cannot be combined"):
        nbattn.flash_attention(q, k, v, softcap=2.0, device="cuda", **mods)
