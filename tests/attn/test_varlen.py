"""flash_attention_varlen against a loop over the sequences (nbattn.flash_attention, torch)."""

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config

from .. import naive
from ..strategies import seeds

TOL = {np.float64: 1e-10, np.float32: 2e-5}


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _packed(rng, len_q, len_k, H=3, H_kv=3, E=8, Ev=6, dtype=np.float64):
    cu_q, cu_k = _offsets(len_q), _offsets(len_k)
    q = rng.normal(size=(H, cu_q[-1], E)).astype(dtype)
    k = rng.normal(size=(H_kv, cu_k[-1], E)).astype(dtype)
    v = rng.normal(size=(H_kv, cu_k[-1], Ev)).astype(dtype)
    return q, k, v, cu_q, cu_k


def _loop(q, k, v, cu_q, cu_k, grad_out, **kw):
    """The reference: nbattn.flash_attention (and its backward) on each sequence alone."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    lse = np.full(q.shape[:-1], -np.inf)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for s in range(cu_q.size - 1):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if a == b or c == d:  # no queries, or queries without keys: zeros, lse -inf, no gradient
            continue
        qs, ks, vs = q[:, a:b], k[:, c:d], v[:, c:d]
        o, l_ = nbattn.flash_attention(qs, ks, vs, return_lse=True, **kw)
        out[:, a:b], lse[:, a:b] = o, l_
        g = nbattn.flash_attention_backward(qs, ks, vs, o, l_, grad_out[:, a:b], **kw)
        dq[:, a:b], dk[:, c:d], dv[:, c:d] = g
    return out, lse, (dq, dk, dv)


def _check(q, k, v, cu_q, cu_k, rng, dtype=np.float64, **kw):
    out, lse = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    grad_out = rng.normal(size=out.shape).astype(dtype)
    grads = nbattn.flash_attention_varlen_backward(q, k, v, out, lse, grad_out, cu_q, cu_k, **kw)
    ref_out, ref_lse, ref_grads = _loop(q, k, v, cu_q, cu_k, grad_out, **kw)
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == ref_out.shape
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=tol, atol=tol)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape and got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    return out, lse


KEYWORDS = [
    {},
    {"causal": True},
    {"causal": True, "causal_alignment": "bottom_right"},
    {"window": (3, 1)},
    {"causal": True, "window": (5, None), "causal_alignment": "bottom_right"},
    {"softcap": 2.5, "scale": 0.7},
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kw", KEYWORDS)
def test_matches_a_loop_over_the_sequences(rng, dtype, kw):
    """Lengths around a query tile (the default tile: 128 rows) and empty sequences."""
    len_q = np.array([5, 0, 130, 1, 9, 0])
    len_k = np.array([7, 3, 140, 1, 0, 0])
    q, k, v, cu_q, cu_k = _packed(rng, len_q, len_k, dtype=dtype)
    _check(q, k, v, cu_q, cu_k, rng, dtype, **kw)


@pytest.mark.parametrize("kw", [{}, {"causal": True, "causal_alignment": "bottom_right"}])
def test_grouped_query_heads(rng, kw):
    q, k, v, cu_q, cu_k = _packed(rng, [4, 11, 2], [6, 11, 9], H=4, H_kv=2)
    _check(q, k, v, cu_q, cu_k, rng, enable_gqa=True, **kw)


def test_small_tiles_split_long_sequences(rng, monkeypatch):
    """Several query tiles per sequence, several key tiles per call, odd sizes."""
    for name, size in (("FLASH_BLOCK_Q", 4), ("FLASH_BLOCK_K", 8)):
        monkeypatch.setattr(config, name, size)
    for name, size in (("FLASH_BWD_BLOCK_Q", 4), ("FLASH_BWD_BLOCK_K", 8)):
        monkeypatch.setattr(config, name, size)
    q, k, v, cu_q, cu_k = _packed(rng, [23, 1, 17], [19, 30, 17])
    _check(q, k, v, cu_q, cu_k, rng, causal=True, window=(6, None))


def test_matches_torch_sdpa_per_sequence(rng):
    torch = pytest.importorskip("torch")
    len_q = np.array([3, 17, 1, 40])
    q, k, v, cu_q, cu_k = _packed(rng, len_q, len_q, H=4, H_kv=2, E=8, Ev=8)
    out = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_q, causal=True, enable_gqa=True)
    for s in range(len_q.size):
        a, b = cu_q[s], cu_q[s + 1]
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(np.ascontiguousarray(x[:, a:b])) for x in (q, k, v)),
            is_causal=True,
            enable_gqa=True,
        )
        np.testing.assert_allclose(out[:, a:b], ref.numpy(), atol=1e-12)


@settings(max_examples=25)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=5),
    causal=st.booleans(),
    alignment=st.sampled_from(["top_left", "bottom_right"]),
    window=st.sampled_from([None, (0, 0), (2, None), (None, 1)]),
    gqa=st.booleans(),
    seed=seeds,
)
def test_property_random_lengths(lengths, causal, alignment, window, gqa, seed):
    rng = np.random.default_rng(seed)
    len_q, len_k = (np.array(x) for x in zip(*lengths))
    if len_q.sum() == 0 or len_k.sum() == 0:
        len_q[0], len_k[0] = len_q[0] + 1, len_k[0] + 1  # the packed arrays cannot be empty
    q, k, v, cu_q, cu_k = _packed(rng, len_q, len_k, H=2, H_kv=1 if gqa else 2, E=4, Ev=3)
    kw = dict(causal=causal, causal_alignment=alignment, window=window, enable_gqa=gqa)
    _check(q, k, v, cu_q, cu_k, rng, **kw)


def test_against_dense_reference_with_bottom_right_windows(rng):
    """An independent check of the alignment: NumPy, not nbattn.flash_attention."""
    len_q, len_k = np.array([2, 6, 3]), np.array([9, 6, 1])
    q, k, v, cu_q, cu_k = _packed(rng, len_q, len_k)
    kw = dict(causal=True, window=(2, None), softcap=1.5)
    out = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, causal_alignment="bottom_right", **kw)
    for s in range(3):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        ref, _ = naive.attention_bottom_right(q[:, a:b], k[:, c:d], v[:, c:d], **kw)
        np.testing.assert_allclose(out[:, a:b], ref, atol=1e-12)


# --------------------------------------------------------------------------- dropout
def _block_diagonal(cu_q, cu_k):
    mask = np.zeros((cu_q[-1], cu_k[-1]), dtype=bool)
    for s in range(cu_q.size - 1):
        mask[cu_q[s] : cu_q[s + 1], cu_k[s] : cu_k[s + 1]] = True
    return mask


def test_dropout_uses_the_packed_counters(rng):
    """Same seed: the packed call drops what one full call with a block-diagonal mask drops."""
    q, k, v, cu_q, cu_k = _packed(rng, [5, 0, 9, 3], [4, 2, 9, 6])
    kw = dict(dropout_p=0.3, random_state=1234, causal=True, causal_alignment="bottom_right")
    out, lse = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    mask = _block_diagonal(cu_q, cu_k)
    # bottom-right per sequence, as an explicit mask on the full problem
    for s in range(cu_q.size - 1):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        rows = np.arange(b - a)[:, None] + (d - c) - (b - a)
        mask[a:b, c:d] &= np.arange(d - c)[None, :] <= rows
    full_kw = dict(dropout_p=0.3, random_state=1234)
    ref, ref_lse = nbattn.flash_attention(q, k, v, mask=mask, return_lse=True, **full_kw)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)
    g = rng.normal(size=out.shape)
    grads = nbattn.flash_attention_varlen_backward(q, k, v, out, lse, g, cu_q, cu_k, **kw)
    ref_grads = nbattn.flash_attention_backward(q, k, v, ref, ref_lse, g, mask=mask, **full_kw)
    for got, want in zip(grads, ref_grads):
        np.testing.assert_allclose(got, want, atol=1e-10)
    plain = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, **{**kw, "dropout_p": 0.0})
    assert not np.allclose(out, plain)  # something was dropped


def test_dropout_does_not_depend_on_the_thread_count(rng):
    q, k, v, cu_q, cu_k = _packed(rng, [30, 7, 12], [30, 9, 12])
    kw = dict(dropout_p=0.5, random_state=99)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, **kw)
    finally:
        numba.set_num_threads(saved)
    many = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, **kw)
    np.testing.assert_array_equal(one, many)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "change, match",
    [
        (
            dict(cu_seqlens_q=[0, 5, 3, 14]),
            r"cu_seqlens_q must be non-decreasing; cu_seqlens_q\[2\]",
        ),
        (dict(cu_seqlens_q=[1, 5, 9, 14]), "cu_seqlens_q must start at 0"),
        (dict(cu_seqlens_k=[0, 5, 9, 13]), "cu_seqlens_k must end at the packed length 14"),
        (dict(cu_seqlens_k=[0, 14]), "describes 3 sequences but cu_seqlens_k 1"),
        (dict(cu_seqlens_q=[0.0, 5.0, 9.0, 14.0]), "cu_seqlens_q must be an array of integers"),
        (dict(cu_seqlens_q=[[0, 5, 9, 14]]), "cu_seqlens_q must be 1-D"),
        (dict(cu_seqlens_q=[14]), "cu_seqlens_q must have n_seqs"),
        (dict(max_seqlen_q=4), "max_seqlen_q=4 is below the longest sequence, 5"),
        (dict(window=(-1, 0)), "window left"),
        (dict(causal_alignment="top"), "causal_alignment"),
        (dict(softcap=-1.0), "softcap"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(causal=1), "causal"),
    ],
)
def test_bad_input_names_the_argument(rng, change, match):
    q, k, v, cu_q, cu_k = _packed(rng, [5, 4, 5], [5, 4, 5])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        nbattn.flash_attention_varlen(**args)


def test_backward_errors(rng):
    q, k, v, cu_q, cu_k = _packed(rng, [5, 4], [5, 4])
    out, lse = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    with pytest.raises(ValueError, match="grad_out must have shape"):
        nbattn.flash_attention_varlen_backward(q, k, v, out, lse, out[:, :3], cu_q, cu_k)
    with pytest.raises(ValueError, match="random_state must be the int seed"):
        nbattn.flash_attention_varlen_backward(
            q, k, v, out, lse, out, cu_q, cu_k, dropout_p=0.2, random_state=None
        )
    with pytest.raises(ValueError, match="enable_gqa"):
        nbattn.flash_attention_varlen(q, k[:2], v[:2], cu_q, cu_k)


def test_inputs_not_modified(rng):
    q, k, v, cu_q, cu_k = _packed(rng, [5, 4], [5, 4])
    saved = [a.copy() for a in (q, k, v, cu_q, cu_k)]
    nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    for a, b in zip((q, k, v, cu_q, cu_k), saved):
        assert np.array_equal(a, b)
