"""A hostile review of the forwards' climbing rows (scores that rise past a row's
reference maximum by more than 2**100 in one tile; the row then takes its next tiles'
maximum first until a tile stays at or below its reference).

Every case goes through the public functions on the 8 x 16 tiles of
``small_flash_tiles`` and is checked against the dense float64 formulations of
``tests/naive.py`` (from the same dtype-rounded inputs): climbing combined with
``-inf`` holes inside climbing tiles (bool and float masks, documents of the shared
``mask_fn``), rows without a key in some tiles or in all, causal and windows,
key-padding masks, dropout, GQA, a softcap with climbing key biases, both dtypes;
magnitudes near the float32 and float64 limits, climbs of exactly the thresholds,
steps of one ulp, NaN and +inf on an admissible entry, climbs that stop and
restart, a maximum that falls by a huge amount; varlen and decoding with climbing
``table2`` / ALiBi ``slopes``; the flex backward after a climbing forward; bits
repeatable across calls and across 1 and 2 numba threads.

The flex cases run the shared ``score_fn`` / ``mask_fn`` of ``tests/flex_cases.py``
(no compile of their own). Tolerances: the scores' rounding in the dtype as it moves
the weights, 64 eps (1 + max |lse|), never tuned to a draw.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn.flash import flash_attention_bias
from tests import naive
from tests.flex_cases import DOC, MODS, WIDE, make_args, score_grad_fn, with_args

SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
H, E = 2, 8
LN2 = math.log(2.0)
DTYPES = [np.float32, np.float64]


# ------------------------------------------------------------------------------ helpers
def tolerance(dtype, ref_lse):
    """64 eps (1 + max |lse|) over the reference's finite lse (the scores' rounding in
    ``dtype`` as it moves the weights)."""
    finite = np.abs(ref_lse[np.isfinite(ref_lse)])
    top = float(finite.max()) if finite.size else 0.0
    return 64 * np.finfo(dtype).eps * (1.0 + top)


def assert_matches(out, lse, ref, ref_lse, v, dtype, out_tol=None):
    """out and lse against the dense reference: the same NaN and -inf rows, finite
    entries within the tolerance (``out_tol`` times max |v| for out when given)."""
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    ref, ref_lse = np.broadcast_to(ref, out.shape), np.broadcast_to(ref_lse, lse.shape)
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    np.testing.assert_array_equal(lse == -np.inf, ref_lse == -np.inf)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    tol = tolerance(dtype, ref_lse)
    scale_v = float(np.abs(v).max()) if np.size(v) else 1.0
    ok = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[ok], ref_lse[ok], rtol=0, atol=tol)
    atol = (tol if out_tol is None else out_tol) * max(scale_v, 1e-300)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=0, atol=atol)
    assert np.all(out[lse == -np.inf] == 0.0)


def same_bits(a, b):
    for x, y in zip(a, b):
        assert np.array_equal(x, y, equal_nan=True)


def walk(rng, n, trend, noise):
    """(n,) float64: a random walk, mean step ``trend``, spread ``noise``."""
    return np.cumsum(rng.standard_normal(n) * noise + trend)


def climbing_keys(rng, shape, dtype, climb):
    """k of ``shape`` whose first feature climbs along the keys by ``climb`` per key (the
    dot product climbs for queries whose first feature is near 1)."""
    k = rng.standard_normal(shape)
    k[..., 0] = np.arange(shape[-2]) * climb
    return k.astype(dtype)


#: The draws both property tests share: dtype, query and key counts, GQA or not.
SHAPES = dict(
    dtype=st.sampled_from(DTYPES),
    n_q=st.integers(1, 26),
    n_k=st.integers(1, 80),
    gqa=st.booleans(),
)


# -------------------------------------------------------------- flash: masks, dropout, cap
@pytest.mark.usefixtures("small_flash_tiles")
@SETTINGS
@given(
    **SHAPES,
    mask_kind=st.sampled_from(["none", "bool", "key_padding", "rows"]),
    causal=st.booleans(),
    window=st.sampled_from([None, (3, 0), (20, 5), (None, 17), (40, None)]),
    softcap=st.sampled_from([None, 4.0]),
    dropout_p=st.sampled_from([0.0, 0.3]),
    climb=st.sampled_from([0.0, 12.0, 60.0, 400.0]),
    trend=st.sampled_from([0.0, 30.0, 90.0, 800.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_flash_climbing_with_masks_windows_dropout_gqa_and_softcap(
    dtype, n_q, n_k, gqa, mask_kind, causal, window, softcap, dropout_p, climb, trend, seed
):
    """Scores that climb through q . k (a key feature growing along the keys) and
    through a float mask (a climbing walk per head with -inf holes, rows with no key,
    key tiles a row cannot see), with causal / window bands, GQA, a softcap (on q . k,
    before the climbing mask) and dropout (the spec's hash as the reference)."""
    rng = np.random.default_rng(seed)
    h_kv = 1 if gqa else H
    q = rng.standard_normal((1, H, n_q, E))
    q[..., 0] = 1.0 + 0.1 * rng.standard_normal((1, H, n_q))
    q = q.astype(dtype)
    k = climbing_keys(rng, (1, h_kv, n_k, E), dtype, climb)
    v = rng.standard_normal((1, h_kv, n_k, 3)).astype(dtype)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((1, 1, n_q, n_k)) > 0.3
        mask[..., : n_q // 3, :] = False  # rows with no key at all
        mask[..., 16:32] &= rng.random((1, 1, n_q, 1)) > 0.5  # a key tile some rows miss
    elif mask_kind in ("key_padding", "rows"):
        rows = 1 if mask_kind == "key_padding" else n_q
        mask = np.stack([walk(rng, n_k, trend, 3.0), walk(rng, n_k, -trend, 3.0)])
        mask = np.broadcast_to(mask[None, :, None, :], (1, H, rows, n_k)).copy()
        mask[rng.random(mask.shape) < 0.25] = -np.inf
        if mask_kind == "rows":
            mask[:, 0, ::4] = -np.inf  # fully masked rows
            mask[:, 1, :, 16:48] = -np.inf  # two key tiles masked for a head
    kw = dict(mask=mask, causal=causal, window=window, softcap=softcap, enable_gqa=gqa)
    call = dict(kw, return_lse=True, dropout_p=dropout_p, random_state=12345 + seed % 1000)
    out, lse = nbattn.flash_attention(q, k, v, **call)
    same_bits((out, lse), nbattn.flash_attention(q, k, v, **call))
    factors = None
    if dropout_p:
        factors = naive.dropout_factors(12345 + seed % 1000, H, n_q, n_k, dropout_p)
        factors = factors.reshape(1, H, n_q, n_k)
    ref, ref_lse = naive.flash_features(q, k, v, dropout=factors, **kw)
    scale_drop = 1.0 / (1.0 - dropout_p)
    assert_matches(out, lse, ref, ref_lse, v * scale_drop, dtype)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_climbing_rows_are_refused_nan_and_inf_masks(dtype):
    """NaN or +inf in a float mask (inside a climbing row) is refused, not computed."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, H, n, E)).astype(dtype) for n in (5, 40, 40))
    for odd in (np.nan, np.inf):
        mask = np.cumsum(np.full((1, 1, 1, 40), 80.0), axis=-1)
        mask[..., 30] = odd
        with pytest.raises(ValueError):
            nbattn.flash_attention(q, k, v, mask=mask)


# ---------------------------------------------------- flash: magnitudes near the limits
def one_hot_bias(n_k, peak, holes, restart=None):
    """(n_k,) float64: a linear climb to ``peak`` at the last key (steps peak / n_k, each
    beyond what any weight survives), -inf at ``holes``; with ``restart`` the second half
    drops to -peak and climbs again, to ``restart`` times peak at most."""
    bias = np.linspace(-peak, peak, n_k)
    if restart is not None:
        half = n_k // 2
        bias[half:] = np.linspace(-peak, restart * peak, n_k - half)
    bias[holes] = -np.inf
    return bias


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize(
    ("dtype", "peak"),
    [(np.float32, 1e37), (np.float32, 1.5e38), (np.float64, 1e306), (np.float64, 8e307)],
)
@pytest.mark.parametrize("restart", [None, 0.5, 1.0])
def test_flash_key_bias_climbing_to_the_dtype_limit(dtype, peak, restart):
    """Key biases up to the top of the range (the mask is shifted per row): the weights
    are one-hot on the largest admissible key, lse its score; a climb that falls by
    2 x peak in one key and climbs again (to below, at, or the old peak)."""
    rng = np.random.default_rng(1)
    n_q, n_k = 11, 77
    q, k, v = (rng.standard_normal((1, H, n, E)).astype(dtype) for n in (n_q, n_k, n_k))
    holes = [5, 31, 47, 76]  # the last key among them: the top moves to key 75
    bias = np.stack([one_hot_bias(n_k, peak, holes, restart)] * H)
    out, lse = flash_attention_bias(q, k, v, key_bias=bias[None], return_lse=True)
    same_bits((out, lse), flash_attention_bias(q, k, v, key_bias=bias[None], return_lse=True))
    ref, ref_lse = naive.sdpa(q, k, v, key_bias=bias[None])
    top = int(np.argmax(bias[0]))
    np.testing.assert_array_equal(ref, np.broadcast_to(v[:, :, top : top + 1], ref.shape))
    assert_matches(out, lse, ref, ref_lse, v, dtype, out_tol=64 * np.finfo(dtype).eps)
    # causal: row i sees keys <= i, its own top
    out, lse = flash_attention_bias(q, k, v, key_bias=bias[None], causal=True, return_lse=True)
    ref, ref_lse = naive.sdpa(q, k, v, key_bias=bias[None], causal=True)
    assert_matches(out, lse, ref, ref_lse, v, dtype, out_tol=64 * np.finfo(dtype).eps)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope", [75.0, 1e3, 1e30])
def test_flash_alibi_towards_later_keys_with_key_padding(dtype, slope):
    """ALiBi slopes towards later keys (every tile climbs) with a key-padding bias that
    masks whole tiles and the last keys: one-hot for huge slopes, dense otherwise."""
    rng = np.random.default_rng(2)
    n_q, n_k = 19, 70
    q, k, v = (rng.standard_normal((2, H, n, E)).astype(dtype) for n in (n_q, n_k, n_k))
    bias = np.zeros((2, H, n_k))
    bias[0, :, 16:32] = -np.inf
    bias[1, :, 60:] = -np.inf
    bias[1, 1, :] = -np.inf  # a head without keys
    slopes = np.array([[slope, slope / 2], [slope, -slope]])
    out, lse = flash_attention_bias(q, k, v, key_bias=bias, alibi_slopes=slopes, return_lse=True)
    ref, ref_lse = naive.sdpa(q, k, v, key_bias=bias, alibi_slopes=slopes)
    assert_matches(out, lse, ref, ref_lse, v, dtype)


# ------------------------------------------------------------------------ flex: forward
def flex_call(q, k, v, args, **kw):
    return nbattn.flash_attention(q, k, v, return_lse=True, **MODS, mod_args=args, **kw)


def flex_ref(q, k, v, args, grad_out=None, **kw):
    return naive.flex_attention_grads(
        q, k, v, grad_out, *MODS.values(), mod_args=args, score_grad=score_grad_fn, **kw
    )


@pytest.mark.usefixtures("small_flash_tiles")
@SETTINGS
@given(
    **SHAPES,
    causal=st.booleans(),
    window=st.sampled_from([None, (4, 0), (30, 30)]),
    docs=st.booleans(),
    arg_window=st.sampled_from([(WIDE, WIDE), (9, 2)]),
    trend=st.sampled_from([8.0, 60.0, 700.0]),
    slope=st.sampled_from([0.0, 9.0, -9.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_flex_climbing_with_documents_windows_gqa_and_backward(
    dtype, n_q, n_k, gqa, causal, window, docs, arg_window, trend, slope, seed
):
    """A climbing key table (table2) and ALiBi slopes through the shared score_fn, with
    documents (holes inside climbing tiles, queries of document -1 with no key), a
    prefix, the mod_args window and the causal / window keywords, GQA; the forward
    and the backward after it against the dense formulation."""
    rng = np.random.default_rng(seed)
    h_kv = 1 if gqa else H
    n = max(n_q, n_k)
    q = rng.standard_normal((1, H, n_q, E)).astype(dtype)
    k = rng.standard_normal((1, h_kv, n_k, E)).astype(dtype)
    v = rng.standard_normal((1, h_kv, n_k, 3)).astype(dtype)
    table2 = np.stack([walk(rng, n, trend, 20.0), walk(rng, n, trend / 2, 20.0)])
    doc = None
    if docs:
        doc = np.stack([rng.integers(0, 2, n), rng.integers(0, 2, n)])[None]
        doc[0, 0, : n // 5] = -1  # queries that see no key
    args = make_args(
        1, H, n, slopes=[slope, slope / 3], table2=table2, doc=doc, prefix=rng.integers(0, 4),
        left=arg_window[0], right=arg_window[1],
    )  # fmt: skip
    kw = dict(causal=causal, window=window, enable_gqa=gqa)
    out, lse = flex_call(q, k, v, args, **kw)
    same_bits((out, lse), flex_call(q, k, v, args, **kw))
    g = rng.standard_normal(out.shape).astype(dtype)
    ref, ref_lse, *ref_grads = flex_ref(q, k, v, args, g, **kw)
    assert_matches(out, lse, ref, ref_lse, v, dtype)
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, g, **MODS, mod_args=args, score_mod_grad=score_grad_fn, **kw
    )
    tol = tolerance(dtype, ref_lse)
    bound = np.abs(g).max() * np.abs(v).max() * 3 * max(np.abs(q).max(), np.abs(k).max()) * E
    for name, got, want in zip("qkv", grads, ref_grads):
        size = max(n_q, 1) if name in "kv" else 1
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * bound * size, err_msg=name)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("odd", [np.nan, np.inf])
@pytest.mark.parametrize("where", [3, 37, 70])
def test_flex_nan_or_inf_in_a_climbing_row(dtype, odd, where):
    """NaN or +inf on one admissible entry of a climbing row (before the climb, in a
    tile after it saturated, in the last tile): the rows that see it are NaN, the
    others (documents that exclude it) match the dense formulation."""
    rng = np.random.default_rng(4)
    n_q, n_k = 20, 75
    q, k, v = (rng.standard_normal((1, H, n, E)).astype(dtype) for n in (n_q, n_k, n_k))
    table2 = np.stack([np.arange(n_k) * 30.0, np.arange(n_k) * 300.0])
    table2[:, where] = odd
    doc = np.zeros((1, 2, n_k), dtype=np.int64)
    doc[0, 0, ::2] = 1  # even queries in document 1
    doc[0, 1, where] = 1  # the odd key in document 1: only even queries see it
    doc[0, 1, 60:] = 1
    args = make_args(1, H, n_k, table2=table2, doc=doc)
    out, lse = flex_call(q, k, v, args)
    same_bits((out, lse), flex_call(q, k, v, args))
    with np.errstate(over="ignore", invalid="ignore"):  # the NaN rows' own overflow
        ref, ref_lse = flex_ref(q, k, v, args)
    assert np.all(np.isnan(out[:, :, ::2])) and np.all(np.isnan(lse[:, :, ::2]))
    assert_matches(out, lse, ref, ref_lse, v, dtype)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "bits", [20, 100, 127, 128, 1023], ids=lambda b: f"2**{b}"
)  # the thresholds, float32's exp2 clamp, float64's
@pytest.mark.parametrize("ulps", [-2, 0, 2])
@pytest.mark.parametrize("after", ["flat", "ulp_up", "ulp_down", "fall_huge", "climb_again"])
def test_flex_climbs_of_exactly_the_threshold_size(dtype, bits, ulps, after):
    """q = 0: the scores are table2 alone. Tile 0 at 0 (the reference), tile 1 one key at
    x = bits ln 2 (+- ulps: a tile sum just at / beside 2**bits) among -40s, tile 2 at
    x, x + 1 ulp, x - 1 ulp, x - huge or x + 200 (the climb stops, goes on by an ulp,
    falls, or restarts), tile 3 a climb again, tile 4 flat at x."""
    rng = np.random.default_rng(5)
    n_k = 80
    x = bits * LN2
    x = float(np.float64(x) + ulps * np.spacing(np.float64(x)))
    if dtype == np.float32:
        x = float(np.float32(x) + ulps * np.spacing(np.float32(x)))
    one = float(np.spacing(dtype(x)))
    table2 = np.full(n_k, -40.0)
    table2[:16] = 0.0
    table2[16 + 3] = x
    second = {"flat": x, "ulp_up": x + one, "ulp_down": x - one, "climb_again": x + 200.0}
    huge = 1e37 if dtype == np.float32 else 1e300
    table2[32:48] = second.get(after, -huge)
    table2[48:64] = np.linspace(x, x + 900.0, 16)
    table2[64:] = x
    q = np.zeros((1, H, 9, E), dtype)
    k, v = (rng.standard_normal((1, H, n_k, E)).astype(dtype) for _ in range(2))
    args = make_args(1, H, n_k, table2=np.stack([table2, table2[::-1]]))
    out, lse = flex_call(q, k, v, args)
    ref, ref_lse = flex_ref(q, k, v, args)
    assert_matches(out, lse, ref, ref_lse, v, dtype)
    # the same key biases through the flash kernel's mask path
    mask = np.stack([table2, table2[::-1]])[None, :, None, :]
    out, lse = nbattn.flash_attention(q, k, v, mask=mask, return_lse=True)
    ref, ref_lse = naive.flash_features(q, k, v, mask=mask)
    assert_matches(out, lse, ref, ref_lse, v, dtype)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", DTYPES)
def test_flex_subnormal_steps_after_a_climb(dtype):
    """After a saturating climb, tiles whose maximum rises by a subnormal amount (lost
    in the score's rounding, or not) and tiles that stay flat at the reference."""
    rng = np.random.default_rng(6)
    n_k = 96
    tiny = float(np.finfo(dtype).smallest_subnormal)
    table2 = np.zeros(n_k)
    table2[16:] = 300.0
    table2[32:48] = 300.0 + tiny
    table2[48:64] = np.arange(16) * tiny
    table2[64:80] = tiny
    table2[80:] = 300.0 + 16 * tiny
    q = np.zeros((1, H, 10, E), dtype)
    k, v = (rng.standard_normal((1, H, n_k, E)).astype(dtype) for _ in range(2))
    for t2 in (table2, table2 + 0.0 * np.arange(n_k)):
        args = make_args(1, H, n_k, table2=np.stack([t2, -t2]))
        out, lse = flex_call(q, k, v, args)
        ref, ref_lse = flex_ref(q, k, v, args)
        assert_matches(out, lse, ref, ref_lse, v, dtype)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize(("dtype", "peak"), [(np.float32, 1e37), (np.float64, 1e307)])
@pytest.mark.parametrize("restart", [None, 0.3, 1.0])
def test_flex_scores_climbing_to_the_dtype_limit(dtype, peak, restart):
    """score_mod scores up to ~1e37 (float32) / ~1e307 (float64): one-hot weights on the
    largest admissible key (documents punch holes, the last key among them), a fall
    by 2 x peak in one key and a climb again."""
    rng = np.random.default_rng(7)
    n_q, n_k = 13, 90
    q, k, v = (rng.standard_normal((1, H, n, E)).astype(dtype) for n in (n_q, n_k, n_k))
    bias = one_hot_bias(n_k, peak, [], restart)
    doc = np.zeros((1, 2, n_k), dtype=np.int64)
    doc[0, 1, [7, 40, 41, 89]] = 1  # holes, the last key among them
    doc[0, 0, 3] = -1  # a query without keys
    args = make_args(1, H, n_k, table2=np.stack([bias, bias]), doc=doc)
    out, lse = flex_call(q, k, v, args)
    ref, ref_lse = flex_ref(q, k, v, args)
    assert np.all(lse[:, :, 3] == -np.inf) and np.all(out[:, :, 3] == 0.0)
    assert_matches(out, lse, ref, ref_lse, v, dtype, out_tol=64 * np.finfo(dtype).eps)


# ------------------------------------------------------------------ varlen and decoding
@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("climb", ["table2", "slopes"])
def test_varlen_with_climbing_scores(dtype, climb):
    """Packed sequences (one empty, one without keys) with a climbing key table or ALiBi
    slopes: each sequence's rows against the dense formulation of that sequence alone
    (b the sequence, indices from its start)."""
    rng = np.random.default_rng(8)
    lens_q, lens_k = np.array([5, 0, 13, 21, 2]), np.array([7, 3, 40, 66, 0])
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    n_pos = 70
    q = rng.standard_normal((H, cu_q[-1], E)).astype(dtype)
    k, v = (rng.standard_normal((H, cu_k[-1], E)).astype(dtype) for _ in range(2))
    doc = (rng.random((5, n_pos)) < 0.8).astype(np.int64)  # key holes in document 0
    doc = np.stack([np.zeros((5, n_pos), np.int64), doc], axis=1)
    if climb == "table2":
        args = make_args(5, H, n_pos, table2=np.stack([np.arange(n_pos) * 50.0] * H), doc=doc)
    else:
        args = make_args(5, H, n_pos, slopes=[80.0, 500.0], doc=doc)
    args = with_args(args, doc=np.ascontiguousarray(args[DOC]))
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, **MODS, mod_args=args
    )
    for s in range(5):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        if lens_q[s] == 0:
            continue
        if lens_k[s] == 0:  # no key: zeros and -inf
            assert np.all(out[:, rows] == 0.0) and np.all(lse[:, rows] == -np.inf)
            continue
        one = with_args(args, doc=args[DOC][s : s + 1])
        ref, ref_lse = flex_ref(q[None, :, rows], k[None, :, keys], v[None, :, keys], one)
        assert_matches(out[None, :, rows], lse[None, :, rows], ref, ref_lse, v, dtype)


@pytest.fixture
def split_keys(monkeypatch):
    """Decoding splits short caches into several chunks (merged by their lse)."""
    from nbattn import config

    monkeypatch.setattr(config, "DECODE_MIN_SPLIT_KEYS", 8)
    monkeypatch.setattr(config, "DECODE_ITEMS_PER_THREAD", 64)


@pytest.mark.usefixtures("small_flash_tiles", "split_keys")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n_new", "n_q"), [(0, 1), (3, 3)])
def test_decode_with_climbing_scores(dtype, n_new, n_q):
    """flash_decode with a climbing key table and ALiBi towards later keys, GQA, per-row
    cache lengths (one empty): the last rows of the dense causal formulation."""
    rng = np.random.default_rng(9)
    lengths = np.array([0, 9, 33, 60])
    n_b, s_max = lengths.size, 70
    k_full = rng.standard_normal((n_b, 1, s_max, E)).astype(dtype)
    v_full = rng.standard_normal((n_b, 1, s_max, E)).astype(dtype)
    q_full = rng.standard_normal((n_b, H, s_max, E)).astype(dtype)
    table2 = np.stack([np.arange(s_max) * 90.0, np.arange(s_max) * 7.0])
    table2[:, 20:24] = -np.inf  # masked entries inside a climbing tile
    args = make_args(n_b, H, s_max, table2=table2, slopes=[40.0, 0.0])
    totals = lengths + n_new
    k_new = np.stack([k_full[b, :, lengths[b] : totals[b]] for b in range(n_b)])
    v_new = np.stack([v_full[b, :, lengths[b] : totals[b]] for b in range(n_b)])
    q = rng.standard_normal((n_b, H, n_q, E)).astype(dtype)
    for b in np.flatnonzero(totals >= n_q):
        q_full[b, :, totals[b] - n_q : totals[b]] = q[b]
    new = (k_new, v_new) if n_new else (None, None)
    out, lse = nbattn.flash_decode(
        q, k_full.copy(), v_full.copy(), lengths, *new, enable_gqa=True, return_lse=True,
        **MODS, mod_args=args,
    )  # fmt: skip
    for b in range(n_b):
        t = totals[b]
        if t == 0:
            assert np.all(out[b] == 0.0) and np.all(lse[b] == -np.inf)
            continue
        one = with_args(args, doc=args[DOC][b : b + 1])
        ref, ref_lse = flex_ref(
            q_full[b : b + 1, :, :t], k_full[b : b + 1, :, :t], v_full[b : b + 1, :, :t], one,
            causal=True, enable_gqa=True,
        )  # fmt: skip
        rows = slice(t - n_q, t) if t >= n_q else slice(0, t)
        if t < n_q:  # queries before the sequence's start: skip (not a climbing question)
            continue
        assert_matches(out[b : b + 1], lse[b : b + 1], ref[:, :, rows], ref_lse[:, :, rows],
                       v_full, dtype)  # fmt: skip


# ------------------------------------------------------------------------ repeatability
THREADS_SCRIPT = textwrap.dedent(
    """
    import numba, numpy as np, nbattn
    from nbattn import config
    from nbattn.attn.flash import flash_attention_bias
    from tests.flex_cases import MODS, make_args
    for name, value in dict(FLASH_SERIAL_WORK=0, FLASH_BLOCK_Q=8, FLASH_BLOCK_K=16).items():
        setattr(config, name, value)
    rng = np.random.default_rng(10)
    H, E, n_q, n_k = 2, 8, 37, 90
    results = {}
    for dtype in (np.float32, np.float64):
        q, k, v = (rng.standard_normal((2, H, n, E)).astype(dtype) for n in (n_q, n_k, n_k))
        bias = np.cumsum(rng.standard_normal((2, H, n_k)) * 20 + 60, axis=-1)
        bias[rng.random(bias.shape) < 0.2] = -np.inf
        args = make_args(2, H, n_k, table2=bias[0], slopes=[30.0, -5.0])
        runs = []
        for threads in (1, 2, 1, 2):
            numba.set_num_threads(threads)
            runs.append(
                flash_attention_bias(q, k, v, key_bias=bias, alibi_slopes=[70.0, 3.0],
                                     return_lse=True)
                + nbattn.flash_attention(q, k, v, mask=bias[:, :, None], dropout_p=0.2,
                                         random_state=7, return_lse=True)
                + nbattn.flash_attention(q, k, v, return_lse=True, **MODS, mod_args=args)
            )
        for run in runs[1:]:
            for a, b in zip(runs[0], run):
                assert np.array_equal(a, b, equal_nan=True), dtype
    print("same bits")
    """
)


def test_bits_do_not_depend_on_the_numba_threads():
    """Climbing rows (flash key biases and ALiBi, dropout, flex table2) give the same bits
    on 1 and 2 numba threads (a process of its own: this one may be held to one)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    done = subprocess.run(
        [sys.executable, "-c", THREADS_SCRIPT],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same bits" in done.stdout
