"""Programmable attention on packed sequences (flash_attention_varlen) and decoding
(flash_decode): the same score_mod / mask_mod as a padded batch, per sequence.

The reference is :func:`nbattn.flash_attention` itself (checked against the dense
formulation and torch in ``test_flex.py``) on each sequence alone: varlen's b is the
sequence and its indices count from the sequence's start; decoding's q_idx is the
query's position in its sequence. Every case runs the suite's shared ``score_fn`` /
``mask_fn`` (``tests/flex_cases.py``) with float64 ``make_args`` arguments, as
``test_flex.py`` does, so these tests share its forward and backward kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

import nbattn
from nbattn.attn.flex import BlockMask
from tests.flex_cases import DOC, TABLE, WIDE, make_args, mask_fn, score_fn, with_args

H, E = 2, 8
LENS_Q = np.array([5, 0, 13, 21, 1])
LENS_K = np.array([7, 3, 13, 30, 0])
N_POS = 40  # longer than every sequence: position-indexed tables fit all of them


def _mod_args(n_b, n_h, cap=0.0, alibi=False, docs=False, prefix=0, left=WIDE, right=WIDE):
    """``score_fn`` / ``mask_fn``'s arguments (``make_args``) with b-indexed rows for ``n_b``
    sequences (or batch rows) and h-indexed ones for ``n_h`` heads: a softcap, ALiBi
    slopes, a relative-position table, documents, a prefix and a window."""
    rng = np.random.default_rng(11)
    slopes = 2.0 ** -(np.arange(n_h) + 1.0) if alibi else None
    table = rng.standard_normal((n_h, 2 * N_POS + 1)) * 0.5
    doc = np.zeros((n_b, N_POS), dtype=np.int64)
    if docs:
        doc[:] = np.cumsum(rng.random((n_b, N_POS)) < 0.15, axis=1)
    return make_args(
        n_b, n_h, N_POS, cap=cap, slopes=slopes, table=table, doc=doc, prefix=prefix,
        left=left, right=right,
    )  # fmt: skip


def _row(args, b):
    """``args`` with the b-indexed documents cut to row ``b``: a padded call's b = 0."""
    return with_args(args, doc=args[DOC][b : b + 1])


VARLEN_CASES = {
    "softcap": (_mod_args(5, H, cap=1.5), {}),
    "alibi": (_mod_args(5, H, alibi=True), {}),
    "alibi_causal_bottom_right": (
        _mod_args(5, H, alibi=True),
        dict(causal=True, causal_alignment="bottom_right"),
    ),
    "sliding_window": (_mod_args(5, H, left=4, right=0), {}),
    "documents_gqa": (_mod_args(5, H, docs=True, prefix=3), dict(enable_gqa=True)),
}


def _packed(gqa, seed=0):
    rng = np.random.default_rng(seed)
    cu_q = np.concatenate([[0], np.cumsum(LENS_Q)])
    cu_k = np.concatenate([[0], np.cumsum(LENS_K)])
    h_kv = 1 if gqa else H
    q = rng.standard_normal((H, cu_q[-1], E)) * 2.0
    k = rng.standard_normal((h_kv, cu_k[-1], E))
    v = rng.standard_normal((h_kv, cu_k[-1], E))
    return q, k, v, cu_q, cu_k


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("case", sorted(VARLEN_CASES))
def test_varlen_equals_flash_attention_per_sequence(case):
    """Forward, lse and the three gradients of every sequence: those of flash_attention on
    the sequence alone with the same functions (b = the sequence, indices from its start)."""
    args, kw = VARLEN_CASES[case]
    q, k, v, cu_q, cu_k = _packed(kw.get("enable_gqa", False))
    mods = dict(score_mod=score_fn, mask_mod=mask_fn)
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, mod_args=args, **mods, **kw
    )
    g = np.random.default_rng(3).standard_normal(out.shape)
    dq, dk, dv = nbattn.flash_attention_varlen_backward(
        q, k, v, out, lse, g, cu_q, cu_k, mod_args=args, **mods, **kw
    )
    for s in range(len(LENS_Q)):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        if LENS_Q[s] == 0 or LENS_K[s] == 0:  # nothing to attend: zeros (lse -inf)
            assert np.all(lse[:, rows] == -np.inf) and np.all(out[:, rows] == 0.0)
            assert not (dq[:, rows].any() or dk[:, keys].any() or dv[:, keys].any())
            continue
        qs, ks, vs, gs = q[None, :, rows], k[None, :, keys], v[None, :, keys], g[None, :, rows]
        ref, ref_lse = nbattn.flash_attention(
            qs, ks, vs, return_lse=True, mod_args=_row(args, s), **mods, **kw
        )
        np.testing.assert_allclose(out[:, rows], ref[0], rtol=0, atol=1e-13)
        np.testing.assert_allclose(lse[:, rows], ref_lse[0], rtol=1e-13)
        grads = nbattn.flash_attention_backward(
            qs, ks, vs, ref, ref_lse, gs, mod_args=_row(args, s), **mods, **kw
        )
        for got, want in zip((dq[:, rows], dk[:, keys], dv[:, keys]), grads):
            np.testing.assert_allclose(got, want[0], rtol=0, atol=1e-12)


@pytest.fixture
def split_keys(monkeypatch):
    """Decoding splits even short caches into several chunks (merged by the lse merge)."""
    from nbattn import config

    monkeypatch.setattr(config, "DECODE_MIN_SPLIT_KEYS", 8)
    monkeypatch.setattr(config, "DECODE_ITEMS_PER_THREAD", 64)


DECODE_CASES = {
    "gqa_new_tokens": dict(n_new=3, n_q=3, h_kv=1),
    "one_query_no_append": dict(n_new=0, n_q=1, h_kv=2),
    "window_keyword": dict(n_new=2, n_q=2, h_kv=1, window=(5, None)),
    "not_causal": dict(n_new=4, n_q=2, h_kv=2, causal=False),
}


@pytest.mark.usefixtures("small_flash_tiles", "split_keys")
@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_decode_equals_the_last_rows_of_the_full_forward(case):
    """Per-row cache lengths (an empty row among them): each row's step equals the last L
    rows of flash_attention over the whole sequence with the same functions (q_idx the
    query's position, kv_idx the cache position)."""
    kw = dict(DECODE_CASES[case])
    n_new, n_q, h_kv = kw.pop("n_new"), kw.pop("n_q"), kw.pop("h_kv")
    causal = kw.pop("causal", True)
    lengths = np.array([0, 9, 33]) if causal else np.array([4, 9, 33])
    n_b, s_max = lengths.size, N_POS
    rng = np.random.default_rng(5)
    k_full = rng.standard_normal((n_b, h_kv, s_max, E))
    v_full = rng.standard_normal((n_b, h_kv, s_max, E))
    q_full = rng.standard_normal((n_b, H, s_max, E)) * 2.0
    args = _mod_args(n_b, H, cap=1.5, alibi=True, docs=True, left=12)
    k_cache, v_cache = k_full.copy(), v_full.copy()
    totals = lengths + n_new
    new = [slice(lengths[b], totals[b]) for b in range(n_b)]
    k_new = np.stack([k_full[b, :, new[b]] for b in range(n_b)])
    v_new = np.stack([v_full[b, :, new[b]] for b in range(n_b)])
    q = rng.standard_normal((n_b, H, n_q, E)) * 2.0
    for b in np.flatnonzero(totals >= n_q):
        q_full[b, :, totals[b] - n_q : totals[b]] = q[b]
    mods = dict(score_mod=score_fn, mask_mod=mask_fn)
    out, lse = nbattn.flash_decode(
        q,
        k_cache,
        v_cache,
        lengths,
        k_new if n_new else None,
        v_new if n_new else None,
        causal=causal,
        enable_gqa=h_kv < H,
        return_lse=True,
        mod_args=args,
        **mods,
        **kw,
    )
    for b in range(n_b):
        t = totals[b]
        if t == 0:
            assert np.all(out[b] == 0.0) and np.all(lse[b] == -np.inf)
            continue
        ref, ref_lse = nbattn.flash_attention(
            q_full[b : b + 1, :, :t],
            k_full[b : b + 1, :, :t],
            v_full[b : b + 1, :, :t],
            causal=causal,
            enable_gqa=h_kv < H,
            return_lse=True,
            mod_args=_row(args, b),
            **mods,
            **kw,
        )
        np.testing.assert_allclose(out[b], ref[0, :, -n_q:], rtol=0, atol=1e-13)
        np.testing.assert_allclose(lse[b], ref_lse[0, :, -n_q:], rtol=1e-13)


@pytest.mark.usefixtures("small_flash_tiles")
def test_a_kv_cache_decodes_step_by_step_as_the_full_forward():
    """A prompt of 5 tokens, then 3 steps of one: the rows of the full causal forward."""
    rng = np.random.default_rng(4)
    n = 8
    q, k, v = (rng.standard_normal((1, h, n, E)) for h in (H, 1, 1))
    args = _mod_args(1, H, cap=1.5, alibi=True, docs=True, left=3)
    mods = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args)
    ref = nbattn.flash_attention(q, k, v, causal=True, enable_gqa=True, **mods)
    cache = nbattn.KVCache(1, 1, E, capacity=4)
    steps = [slice(0, 5)] + [slice(i, i + 1) for i in range(5, n)]
    out = np.concatenate(
        [cache.attend(q[:, :, s], k[:, :, s], v[:, :, s], **mods) for s in steps], 2
    )
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)


@pytest.mark.usefixtures("small_flash_tiles", "split_keys")
def test_decode_keeps_nan_from_score_mod_and_refuses_overflowing_scores():
    """NaN from score_mod (here a NaN in the bias table at offset -1) makes the row NaN, as
    flash_attention does; scores q . k beyond float64 are refused, as without functions."""
    rng = np.random.default_rng(2)
    k_cache = rng.standard_normal((1, H, N_POS, E))
    v_cache = rng.standard_normal((1, H, N_POS, E))
    q = rng.standard_normal((1, H, 1, E))
    args = _mod_args(1, H)
    table = args[TABLE]
    table[:, N_POS - 1] = np.nan
    mods = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args)
    out = nbattn.flash_decode(q, k_cache, v_cache, np.array([20]), **mods)
    assert np.all(np.isnan(out))
    table[:, N_POS - 1] = 0.0
    huge = q * 1e160
    k_cache[0, :, :20] *= 1e160
    with pytest.raises(ValueError, match="scores q . k of batch row 0 .* overflow"):
        nbattn.flash_decode(huge, k_cache, v_cache, np.array([20]), **mods)


def test_refusals_say_why():
    q, k, v, cu_q, cu_k = _packed(False)
    args = VARLEN_CASES["softcap"][0]
    mods = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args)
    block_mask = BlockMask(mask_fn, args, (1, H, 4, 4))  # its tables are never needed
    with pytest.raises(ValueError, match="flash_attention_varlen takes no block_mask: .*tiles"):
        nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, block_mask=block_mask)
    with pytest.raises(ValueError, match="flash_attention_varlen takes no block_mask"):
        nbattn.flash_attention_varlen_backward(
            q, k, v, q, q[..., 0], q, cu_q, cu_k, block_mask=block_mask
        )
    with pytest.raises(ValueError, match=r"packed q of shape \(H, T_q, E\)"):
        nbattn.flash_attention_varlen(q[None], k[None], v[None], cu_q, cu_k, **mods)
    with pytest.raises(ValueError, match="softcap cannot be combined with score_mod"):
        nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, softcap=2.0, **mods)
    with pytest.raises(ValueError, match="mod_args are the trailing arguments"):
        nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, mod_args=args)
    with pytest.raises(ValueError, match="run on the CPU only"):
        nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, device="cuda", **mods)
    k_cache, v_cache = np.zeros((1, H, 8, E)), np.zeros((1, H, 8, E))
    q1 = np.ones((1, H, 3, E))
    step = (q1, k_cache, v_cache, np.array([2]))
    with pytest.raises(ValueError, match="flash_decode takes no block_mask: .*mask_mod"):
        nbattn.flash_decode(*step, block_mask=block_mask)
    with pytest.raises(ValueError, match="run on the CPU only"):
        nbattn.flash_decode(*step, device="cuda", **mods)
    with pytest.raises(ValueError, match="softcap cannot be combined"):
        nbattn.flash_decode(*step, softcap=2.0, **mods)
    with pytest.raises(ValueError, match="causal=False need at least L = 3 keys .* batch row 0"):
        nbattn.flash_decode(*step, causal=False, **mods)
