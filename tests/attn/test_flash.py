"""Blocked (flash) attention: forward and backward against the full-matrix
references in tests/naive.py and against torch's scaled_dot_product_attention
and autograd."""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn._core.threads import blas_one_thread
from nbattn.attn.flash import flash_attention_bias, flash_attention_bias_backward

from .. import naive
from .._scripts import run_checked
from ..strategies import huge_values, magnitude_cases, seeds
from .test_softmax import assert_close

TOL = {np.float64: 1e-12, np.float32: 2e-5}

# (L, S, E, Ev): N = 1, D in {1, 3, 64, 80, 128}, L != S, lengths that are not
# multiples of the (patched, small) tiles.
SHAPES = [
    (1, 1, 1, 1),
    (1, 7, 3, 3),
    (7, 1, 3, 2),
    (37, 37, 64, 64),
    (45, 70, 80, 80),
    (70, 45, 128, 128),
    (33, 50, 1, 5),
]


def _qkv(rng, lead, n_q, n_k, e, ev, dtype):
    q = rng.standard_normal(lead + (n_q, e)).astype(dtype)
    k = rng.standard_normal(lead + (n_k, e)).astype(dtype)
    v = rng.standard_normal(lead + (n_k, ev)).astype(dtype)
    return q, k, v


def _close(actual, expected, dtype):
    """max |actual - expected| <= tol * max(1, max |expected|)."""
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(np.asarray(actual, dtype=np.float64) - expected).max())
    assert err <= TOL[dtype] * scale, f"max error {err:.3e} (scale {scale:.3g})"


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward_vs_naive(rng, shape, causal, dtype):
    n_q, n_k, e, ev = shape
    q, k, v = _qkv(rng, (2,), n_q, n_k, e, ev, dtype)
    out, lse = nbattn.flash_attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == (2, n_q, ev)
    assert lse.shape == (2, n_q)
    ref_out, ref_lse = naive.sdpa(q, k, v, causal=causal)
    _close(out, ref_out, dtype)
    _close(lse, ref_lse, dtype)
    g = rng.standard_normal(out.shape).astype(dtype)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal)
    refs = naive.sdpa_backward(q, k, v, g, causal=causal)
    for grad, ref, x in zip(grads, refs, (q, k, v)):
        assert grad.shape == x.shape and grad.dtype == dtype
        _close(grad, ref, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_default_tiles_partial(rng, causal):
    """The configured tiles, with lengths that leave partial tiles in both directions."""
    n = config.FLASH_BLOCK_K + config.FLASH_BWD_BLOCK_K + 37
    q, k, v = _qkv(rng, (), n, n - 5, 16, 8, np.float64)
    out, lse = nbattn.flash_attention(q, k, v, causal=causal, scale=0.3, return_lse=True)
    ref_out, ref_lse = naive.sdpa(q, k, v, causal=causal, scale=0.3)
    _close(out, ref_out, np.float64)
    _close(lse, ref_lse, np.float64)
    g = rng.standard_normal(out.shape)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal, scale=0.3)
    for grad, ref in zip(grads, naive.sdpa_backward(q, k, v, g, causal=causal, scale=0.3)):
        _close(grad, ref, np.float64)


@pytest.mark.parametrize("causal", [False, True])
def test_long_tiles_and_dynamic_scheduling(rng, monkeypatch, causal):
    """From FLASH_LONG_KEYS keys the FLASH_LONG_* tiles run (here small, and different
    for the two passes), and the forward hands large items out one at a time: the
    results match the reference and equal, bit for bit, those of static shares."""
    monkeypatch.setattr(config, "FLASH_SERIAL_WORK", 0)
    monkeypatch.setattr(config, "FLASH_LONG_KEYS", 40)
    monkeypatch.setattr(config, "FLASH_LONG_FWD_BLOCK_Q", 16)
    monkeypatch.setattr(config, "FLASH_LONG_FWD_BLOCK_K", 8)
    monkeypatch.setattr(config, "FLASH_LONG_BWD_BLOCK_Q", 8)
    monkeypatch.setattr(config, "FLASH_LONG_BWD_BLOCK_K", 16)
    q, k, v = _qkv(rng, (3,), 61, 45, 6, 5, np.float32)
    g = rng.standard_normal((3, 61, 5)).astype(np.float32)
    results = []
    for item_work in (0, 2**62):  # every item dynamic, then static shares
        monkeypatch.setattr(config, "FLASH_DYNAMIC_ITEM_WORK", item_work)
        out, lse = nbattn.flash_attention(q, k, v, causal=causal, return_lse=True)
        grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal)
        results.append((out, lse) + tuple(grads))
    ref_out, ref_lse = naive.sdpa(q, k, v, causal=causal)
    refs = (ref_out, ref_lse) + tuple(naive.sdpa_backward(q, k, v, g, causal=causal))
    for dynamic, static, ref in zip(*results, refs):
        np.testing.assert_array_equal(dynamic, static)
        _close(dynamic, ref, np.float32)


TORCH_SHAPES = [(1, 1, 1, 1), (37, 37, 64, 64), (45, 70, 80, 80), (70, 45, 3, 3)]


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", TORCH_SHAPES)
def test_vs_torch(rng, shape, causal, dtype):
    """torch.nn.functional.scaled_dot_product_attention and autograd (top-left causal)."""
    torch = pytest.importorskip("torch")
    n_q, n_k, e, ev = shape
    q, k, v = _qkv(rng, (2, 3), n_q, n_k, e, ev, dtype)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    tq, tk, tv = (torch.tensor(x, dtype=tdtype, requires_grad=True) for x in (q, k, v))
    t_out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    g = rng.standard_normal(t_out.shape).astype(dtype)
    t_out.backward(torch.tensor(g, dtype=tdtype))
    tol = {np.float64: 1e-10, np.float32: 2e-5}[dtype]
    out, lse = nbattn.flash_attention(q, k, v, causal=causal, return_lse=True)
    pairs = [(out, t_out)]
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal)
    pairs += list(zip(grads, (tq.grad, tk.grad, tv.grad)))
    for mine, theirs in pairs:
        theirs = theirs.detach().double().numpy()
        err = np.abs(mine - theirs).max() / max(1.0, np.abs(theirs).max())
        assert err <= tol


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fully_masked_rows(rng, dtype):
    """A key bias of -inf everywhere for one head: zeros, lse = -inf, zero gradients."""
    q, k, v = _qkv(rng, (2,), 20, 30, 4, 3, dtype)
    bias = np.zeros((2, 30))
    bias[1] = -np.inf
    bias[0, ::3] = -np.inf  # partly masked head: compare with the reference
    out, lse = flash_attention_bias(q, k, v, key_bias=bias, return_lse=True)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[1], 0.0)
    assert np.all(lse[1] == -np.inf)
    ref_out, ref_lse = naive.sdpa(q, k, v, key_bias=bias)
    _close(out[0], ref_out[0], dtype)
    _close(lse[0], ref_lse[0], dtype)
    g = rng.standard_normal(out.shape).astype(dtype)
    grads = flash_attention_bias_backward(q, k, v, out, lse, g, key_bias=bias)
    refs = naive.sdpa_backward(q, k, v, g, key_bias=bias)
    for grad, ref in zip(grads, refs):
        assert not np.isnan(grad).any()
        np.testing.assert_array_equal(grad[1], 0.0)
        _close(grad[0], ref[0], dtype)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("causal", [False, True])
def test_key_bias_and_alibi(rng, causal):
    """s_ij = scale q.k + b_j + slope (j - i) against the full-matrix reference."""
    q, k, v = _qkv(rng, (2, 3), 25, 40, 6, 5, np.float64)
    bias = rng.standard_normal((2, 1, 40))
    slopes = np.array([0.5, 0.25, 0.125])
    kwargs = dict(key_bias=bias, alibi_slopes=slopes, causal=causal, scale=0.7)
    saved = bias.copy(), slopes.copy()
    out, lse = flash_attention_bias(q, k, v, return_lse=True, **kwargs)
    np.testing.assert_array_equal(bias, saved[0])
    np.testing.assert_array_equal(slopes, saved[1])
    ref_out, ref_lse = naive.sdpa(q, k, v, **kwargs)
    _close(out, ref_out, np.float64)
    _close(lse, ref_lse, np.float64)
    g = rng.standard_normal(out.shape)
    grads = flash_attention_bias_backward(q, k, v, out, lse, g, **kwargs)
    for grad, ref in zip(grads, naive.sdpa_backward(q, k, v, g, **kwargs)):
        _close(grad, ref, np.float64)


@pytest.mark.usefixtures("small_flash_tiles")
def test_broadcast_leading_dims(rng):
    """k and v shared across the batch: gradients are summed over the broadcast."""
    q = rng.standard_normal((3, 2, 9, 4))
    k = rng.standard_normal((1, 2, 11, 4))
    v = rng.standard_normal((2, 11, 5))
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True)
    kb, vb = np.broadcast_to(k, (3, 2, 11, 4)), np.broadcast_to(v, (3, 2, 11, 5))
    ref_out, _ = naive.sdpa(q, kb, vb)
    _close(out, ref_out, np.float64)
    g = rng.standard_normal(out.shape)
    dq, dk, dv = nbattn.flash_attention_backward(q, k, v, out, lse, g)
    rq, rk, rv = naive.sdpa_backward(q, kb, vb, g)
    assert dk.shape == k.shape and dv.shape == v.shape
    _close(dq, rq, np.float64)
    _close(dk, rk.sum(axis=0, keepdims=True), np.float64)
    _close(dv, rv.sum(axis=0), np.float64)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("causal", [False, True])
def test_backward_key_tile_groups(rng, monkeypatch, causal):
    """Several key-tile groups per head (each with its own dQ buffer), as with few heads."""
    monkeypatch.setattr(nbattn.flash, "_n_groups", lambda *args: 3)
    q, k, v = _qkv(rng, (1,), 50, 90, 5, 4, np.float64)
    out, lse = nbattn.flash_attention(q, k, v, causal=causal, return_lse=True)
    g = rng.standard_normal(out.shape)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal)
    for grad, ref in zip(grads, naive.sdpa_backward(q, k, v, g, causal=causal)):
        _close(grad, ref, np.float64)


@pytest.mark.parametrize("dtype, rel", [(np.float32, 1.5e-7), (np.float64, 5e-16)])
def test_exp2_accuracy(dtype, rel):
    """The kernels' inlined 2**x against np.exp2 (float64) over its whole range."""
    from numba import njit

    from nbattn.kernels.base2 import exp2

    @njit(fastmath=config.FASTMATH)
    def evaluate(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = exp2(x[i])
        return out

    low = -126.0 if dtype == np.float32 else -1022.0
    x = np.concatenate([np.linspace(low, 0.0, 200_001), np.linspace(-1.0, 1.0, 10_001)])
    x = x.astype(dtype)
    ref = np.exp2(x.astype(np.float64))
    got = evaluate(x).astype(np.float64)
    assert np.max(np.abs(got - ref) / ref) <= rel
    np.testing.assert_array_equal(evaluate(np.array([-np.inf, low - 1.0, 0.0], dtype)), [0, 0, 1])


def test_blas_held_to_one_thread_and_restored():
    """The kernels call BLAS from their own threads: BLAS runs on one thread
    inside the call (including numba's, behind scipy.linalg.cython_blas) and
    its setting is restored afterwards."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads():
        return {
            i["filepath"]: i["num_threads"]
            for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas"
        }

    q = np.ones((3, 2))
    nbattn.flash_attention(q, q, q)
    before = blas_threads()
    with blas_one_thread():
        assert set(blas_threads().values()) == {1}
    nbattn.flash_attention(q, q, q)
    assert blas_threads() == before


def test_inputs_not_modified_and_dtype(rng):
    q, k, v = _qkv(rng, (), 5, 6, 3, 3, np.float32)
    copies = [x.copy() for x in (q, k, v)]
    out = nbattn.flash_attention(q, k, v)
    assert out.dtype == np.float32
    for x, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(x, c)
    out64 = nbattn.flash_attention(q, k, v.astype(np.float64))
    assert out64.dtype == np.float64
    out_int = nbattn.flash_attention(np.ones((2, 2), dtype=int), np.ones((3, 2)), np.ones((3, 1)))
    np.testing.assert_allclose(out_int, 1.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(q=np.full((3, 2), np.nan)), "q contains NaN"),
        (dict(k=np.full((4, 2), np.inf)), "k contains NaN or inf"),
        (dict(q=np.ones((3, 5))), "features"),
        (dict(v=np.ones((5, 2))), "keys"),
        (dict(q=np.ones(3)), "q must have at least 2 dimensions"),
        (dict(q=np.ones((2, 3, 2)), k=np.ones((3, 4, 2)), v=np.ones((3, 4, 2))), "broadcast"),
        (dict(scale=float("nan")), "scale"),
    ],
)
def test_validation(kwargs, match):
    args = dict(q=np.ones((3, 2)), k=np.ones((4, 2)), v=np.ones((4, 2)))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        nbattn.flash_attention(**args)


def test_backward_validation():
    q = np.ones((3, 2))
    out, lse = nbattn.flash_attention(q, q, q, return_lse=True)
    with pytest.raises(ValueError, match="grad_out"):
        nbattn.flash_attention_backward(q, q, q, out, lse, np.ones((2, 2)))
    with pytest.raises(ValueError, match="lse"):
        nbattn.flash_attention_backward(q, q, q, out, lse[:2], out)
    with pytest.raises(ValueError, match="key_bias"):
        flash_attention_bias(q, q, q, key_bias=np.full(3, np.nan))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attention_bias(q[None], q[None], q[None], alibi_slopes=np.ones(2))


@settings(max_examples=25)
@given(
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    e=st.integers(1, 9),
    heads=st.integers(1, 3),
    causal=st.booleans(),
    block_q=st.sampled_from([1, 3, 8]),
    block_k=st.sampled_from([1, 5, 16]),
    seed=seeds,
)
def test_property_random_shapes(n_q, n_k, e, heads, causal, block_q, block_k, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, (heads,), n_q, n_k, e, e, np.float64)
    saved = (config.FLASH_BLOCK_Q, config.FLASH_BLOCK_K, config.FLASH_BWD_BLOCK_Q)
    saved += (config.FLASH_BWD_BLOCK_K,)
    try:
        config.FLASH_BLOCK_Q = config.FLASH_BWD_BLOCK_Q = block_q
        config.FLASH_BLOCK_K = config.FLASH_BWD_BLOCK_K = block_k
        out, lse = nbattn.flash_attention(q, k, v, causal=causal, return_lse=True)
        g = rng.standard_normal(out.shape)
        grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=causal)
    finally:
        (
            config.FLASH_BLOCK_Q,
            config.FLASH_BLOCK_K,
            config.FLASH_BWD_BLOCK_Q,
            config.FLASH_BWD_BLOCK_K,
        ) = saved
    ref_out, ref_lse = naive.sdpa(q, k, v, causal=causal)
    _close(out, ref_out, np.float64)
    _close(lse, ref_lse, np.float64)
    for grad, ref in zip(grads, naive.sdpa_backward(q, k, v, g, causal=causal)):
        _close(grad, ref, np.float64)


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import nbattn

    def peak_kib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

    rng = np.random.default_rng(0)
    n, d = 32768, 64
    small = rng.standard_normal((1, 300, d)).astype(np.float32)
    out, lse = nbattn.flash_attention(small, small, small, causal=True, return_lse=True)
    nbattn.flash_attention_backward(small, small, small, out, lse, out, causal=True)
    q, k, v, g = (rng.standard_normal((1, n, d)).astype(np.float32) for _ in range(4))
    before = peak_kib()
    out, lse = nbattn.flash_attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = nbattn.flash_attention_backward(q, k, v, out, lse, g, causal=True)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    print(peak_kib() - before)
    """
)


@pytest.mark.slow
@pytest.mark.procfs
def test_memory_linear_in_length():
    """N = 32,768, D = 64, one head, float32, causal forward + backward: peak RSS
    growth under 1 GB (the N x N float32 matrix alone would be 4 GiB)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    result = run_checked([sys.executable, "-c", _MEMORY_SCRIPT], env=env)
    growth_kib = int(result.stdout.split()[-1])
    assert growth_kib < 1024 * 1024, f"peak RSS grew by {growth_kib / 1024:.0f} MiB"


# --------------------------------------------------------------------------- extreme magnitudes
@settings(max_examples=50)
@given(**magnitude_cases([0, 100, 300, 307, 308], 9))
def test_huge_key_bias_matches_long_double(exponent, L, S, causal, dtype, seed):
    """A per-key bias up to 1e308 (zeros before: the base-2 factor overflowed)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(2, n, 3)).astype(dtype) for n in (L, S, S))
    bias = huge_values(rng, (2, S), exponent)
    try:
        out, lse = flash_attention_bias(q, k, v, key_bias=bias, causal=causal, return_lse=True)
    except ValueError as exc:
        # only a causal row whose every key lies beyond the dtype's range below the maximum
        assert causal and (exponent >= 308 or (dtype == np.float32 and exponent > 38)), exc
        assert "key_bias" in str(exc)
        return
    ref, ref_lse = naive.sdpa_extended(q, k, v, causal, key_bias=bias)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert_close(out, ref, dtype)
    assert_close(lse, ref_lse, dtype)
    if not causal:
        g = rng.normal(size=out.shape).astype(dtype)
        grads = flash_attention_bias_backward(q, k, v, out, lse, g, key_bias=bias)
        # the bias shifted by its maximum per row is the same problem, representable in float64
        top = np.where(np.isfinite(bias), bias, -np.inf).max(axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(over="ignore"):
            shifted = bias - top
        for got, want in zip(grads, naive.sdpa_backward(q, k, v, g, key_bias=shifted)):
            assert_close(got, want, dtype)


@pytest.mark.parametrize("scale", [1.0, 1e100, 1e300])
def test_large_alibi_slopes_match_long_double(rng, scale):
    q, k, v = (rng.normal(size=(1, 2, 6, 3)) for _ in range(3))
    slopes = np.array([0.5, -0.25]) * scale
    for causal in (False, True):
        out, lse = flash_attention_bias(
            q, k, v, alibi_slopes=slopes, causal=causal, return_lse=True
        )
        ref, ref_lse = naive.sdpa_extended(q, k, v, causal, alibi_slopes=slopes)
        assert_close(out, ref)
        assert_close(lse, ref_lse)


def test_alibi_slopes_beyond_the_range_are_refused(rng):
    q = rng.normal(size=(1, 6, 3))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attention_bias(q, q, q, alibi_slopes=np.array([1e307]))
