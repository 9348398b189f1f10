"""Programmable attention on packed sequences and decoding, attacked: against a dense
NumPy formulation written here (softmax over the score_mod'd, masked scores of each
sequence) over random draws, torch autograd of that formulation for the gradients,
1 and 2 threads, inputs left untouched, hostile mod_args, scores beyond the range,
several threads compiling new functions at once, and real data (scikit-learn's digits).

Every kernel call runs the suite's shared ``score_fn`` / ``mask_fn``
(``tests/flex_cases.py``) with ``make_args`` arguments and float64 (or, for the range
test, float32) q, as ``test_flex.py`` and ``test_flex_huge_scores.py`` do, so this file
shares their forward and backward kernels.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn.flex import _mod_args
from tests.flex_cases import (
    CAP,
    DIAG,
    DOC,
    LEFT,
    RIGHT,
    SCALAR,
    SLOPES,
    TABLE,
    TABLE2,
    WIDE,
    make_args,
    mask_fn,
    score_fn,
    with_args,
)  # fmt: skip

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

MODS = dict(score_mod=score_fn, mask_mod=mask_fn)
P = 24  # positions of the tables: more than any sequence, cache or query below


def _args(rng, n_b, n_h, cap=0.0, left=WIDE, right=WIDE):
    """Random ``score_fn`` / ``mask_fn`` arguments (``make_args``): a softcap, ALiBi
    slopes, a relative-position bias table, documents of the b rows and prefixes."""
    slopes = rng.standard_normal(n_h) * 0.3
    table = rng.standard_normal((n_h, 2 * P + 1)) * 0.5
    doc = rng.integers(0, 2, (n_b, P)).astype(np.int64)
    prefix = rng.integers(0, 4, n_b).astype(np.int64)
    return make_args(
        n_b, n_h, P, cap=cap, slopes=slopes, table=table, doc=doc, prefix=prefix, left=left,
        right=right,
    )  # fmt: skip


def _dense_rows(qs, ks, vs, b, h, q_pos, args, scale, band):
    """(out, lse) of one (sequence, head) by the whole score matrix: queries at positions
    ``q_pos``, keys at 0 .. n_k - 1, ``band(I, J)`` the keyword band (True = admitted)."""
    i, j = q_pos[:, None], np.arange(ks.shape[0])[None, :]
    s = scale * (qs @ ks.T)
    s = np.broadcast_to(score_fn(s, b, h, i, j, *args), s.shape)
    keep = np.broadcast_to(mask_fn(b, h, i, j, *args), s.shape) & band(i, j)
    s = np.where(keep, s, -np.inf)
    top = s.max(axis=1, initial=-np.inf)
    live = top > -np.inf
    w = np.where(live[:, None], np.exp(s - np.where(live, top, 0.0)[:, None]), 0.0)
    total = w.sum(axis=1)
    out = np.where(live[:, None], (w @ vs) / np.where(live, total, 1.0)[:, None], 0.0)
    lse = np.where(live, top + np.log(np.where(live, total, 1.0)), -np.inf)
    return out, lse


def _keyword_band(causal, window, offset):
    left, right = window if window is not None else (None, None)

    def band(i, j):
        keep = np.ones(np.broadcast_shapes(i.shape, j.shape), dtype=bool)
        if causal:
            keep &= j <= i + offset
        if left is not None:
            keep &= j >= i + offset - left
        if right is not None:
            keep &= j <= i + offset + right
        return keep

    return band


def _dense_varlen(q, k, v, cu_q, cu_k, args, causal=False, window=None, align="top_left"):
    n_h, _, e = q.shape
    rep = n_h // k.shape[0]
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    lse = np.full(q.shape[:2], -np.inf)
    for s in range(cu_q.size - 1):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        n_q, n_k = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        if n_q == 0 or n_k == 0:
            continue
        band = _keyword_band(causal, window, n_k - n_q if align == "bottom_right" else 0)
        for h in range(n_h):
            out[h, rows], lse[h, rows] = _dense_rows(
                q[h, rows],
                k[h // rep, keys],
                v[h // rep, keys],
                s,
                h,
                np.arange(n_q),
                args,
                1.0 / np.sqrt(e),
                band,
            )
    return out, lse


@st.composite
def packs(draw, max_seqs=4, max_len=12):
    """Random packed sequences: (q, k, v, cu_q, cu_k, args, keywords)."""
    n_seqs = draw(st.integers(1, max_seqs))
    lens_q = np.array(draw(st.lists(st.integers(0, max_len), min_size=n_seqs, max_size=n_seqs)))
    lens_k = np.array(draw(st.lists(st.integers(0, max_len), min_size=n_seqs, max_size=n_seqs)))
    lens_q[draw(st.integers(0, n_seqs - 1))] += 1  # neither pack is empty
    lens_k[draw(st.integers(0, n_seqs - 1))] += 1
    n_h, gqa = draw(st.sampled_from([(1, False), (2, False), (2, True)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    e = 6
    q = rng.standard_normal((n_h, cu_q[-1], e)) * 1.5
    k = rng.standard_normal((1 if gqa else n_h, cu_k[-1], e))
    v = rng.standard_normal((1 if gqa else n_h, cu_k[-1], 3))
    side = st.one_of(st.none(), st.integers(0, 6))
    kw = dict(
        causal=draw(st.booleans()),
        window=draw(st.one_of(st.none(), st.tuples(side, side))),
        causal_alignment=draw(st.sampled_from(["top_left", "bottom_right"])),
        enable_gqa=gqa,
    )
    left, right = draw(st.sampled_from([(WIDE, WIDE), (3, WIDE), (WIDE, 0), (2, 1)]))
    args = _args(rng, n_seqs, n_h, cap=draw(st.sampled_from([0.0, 1.5])), left=left, right=right)
    return q, k, v, cu_q, cu_k, args, kw


def _dense_kw(kw):
    return dict(causal=kw["causal"], window=kw["window"], align=kw["causal_alignment"])


# --------------------------------------------------------------------------- packed
@pytest.mark.usefixtures("small_flash_tiles")
@settings(max_examples=30)
@given(packs())
def test_varlen_matches_the_dense_formulation(pack):
    q, k, v, cu_q, cu_k, args, kw = pack
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, mod_args=args, **MODS, **kw
    )
    ref, ref_lse = _dense_varlen(q, k, v, cu_q, cu_k, args, **_dense_kw(kw))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


def _torch_varlen_loss(q, k, v, g, cu_q, cu_k, args, kw):
    """sum(out * g) of the dense formulation in torch (float64), for autograd."""
    scalar, cap, diag = float(args[SCALAR]), float(args[CAP]), args[DIAG]
    left, right = args[LEFT], args[RIGHT]
    slopes, table, table2, doc = (torch.from_numpy(args[i]) for i in (SLOPES, TABLE, TABLE2, DOC))
    n_h, _, e = q.shape
    rep = n_h // k.shape[0]
    total = q.sum() * 0.0
    for s in range(cu_q.size - 1):
        n_q, n_k = int(cu_q[s + 1] - cu_q[s]), int(cu_k[s + 1] - cu_k[s])
        if n_q == 0 or n_k == 0:
            continue
        offset = n_k - n_q if kw["causal_alignment"] == "bottom_right" else 0
        i = torch.arange(n_q)[:, None]
        j = torch.arange(n_k)[None, :]
        band = torch.from_numpy(
            _keyword_band(kw["causal"], kw["window"], offset)(i.numpy(), j.numpy())
        )
        for h in range(n_h):
            qs = q[h, cu_q[s] : cu_q[s + 1]]
            ks = k[h // rep, cu_k[s] : cu_k[s + 1]]
            vs = v[h // rep, cu_k[s] : cu_k[s + 1]]
            sc = (qs @ ks.T) / np.sqrt(e) * scalar
            if cap > 0:
                sc = cap * torch.tanh(sc / cap)
            sc = sc + slopes[h] * (j - i)
            sc = sc + table[h % table.shape[0], j - i + table.shape[1] // 2]
            sc = sc + table2[h % table2.shape[0], j % table2.shape[1]] + diag * (j == i)
            mine = doc[s, 0, i]
            same = (mine >= 0) & (mine == doc[s, 1, j])
            inside = (j >= i - left) & (j <= i + right)
            keep = same & (inside | (doc[s, 2, j] != 0)) & band
            sc = sc.masked_fill(~keep, -torch.inf)
            live = keep.any(dim=1, keepdim=True)
            w = torch.softmax(sc.masked_fill(~live, 0.0), dim=1) * live
            total = total + ((w @ vs) * g[h, cu_q[s] : cu_q[s + 1]]).sum()
    return total


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.usefixtures("small_flash_tiles")
@settings(max_examples=12)
@given(packs(max_len=9))
def test_varlen_gradients_match_torch_autograd_of_the_dense_formulation(pack):
    q, k, v, cu_q, cu_k, args, kw = pack
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, mod_args=args, **MODS, **kw
    )
    g = np.cos(np.arange(out.size)).reshape(out.shape)
    grads = nbattn.flash_attention_varlen_backward(
        q, k, v, out, lse, g, cu_q, cu_k, mod_args=args, **MODS, **kw
    )
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    _torch_varlen_loss(tq, tk, tv, torch.from_numpy(g), cu_q, cu_k, args, kw).backward()
    for got, want in zip(grads, (tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-11)


# --------------------------------------------------------------------------- decoding
def _dense_decode(q, k_full, v_full, totals, args, causal, window):
    n_b, n_h, n_q, e = q.shape
    rep = n_h // k_full.shape[1]
    out = np.zeros(q.shape[:3] + (v_full.shape[3],))
    lse = np.full(q.shape[:3], -np.inf)
    band = _keyword_band(causal, window, 0)
    for b in range(n_b):
        t = totals[b]
        if t == 0:
            continue
        for h in range(n_h):
            out[b, h], lse[b, h] = _dense_rows(
                q[b, h],
                k_full[b, h // rep, :t],
                v_full[b, h // rep, :t],
                b,
                h,
                t - n_q + np.arange(n_q),
                args,
                1.0 / np.sqrt(e),
                band,
            )
    return out, lse


@st.composite
def steps(draw):
    """A decoding step: (q, k_cache, v_cache, lengths, k_new, v_new, k_full, v_full, args,
    keywords); k_full holds what the cache holds after the step."""
    n_b = draw(st.integers(1, 3))
    n_h, h_kv = draw(st.sampled_from([(1, 1), (2, 2), (2, 1)]))
    n_q = draw(st.integers(1, 4))
    n_new = draw(st.integers(0, 4))
    causal = draw(st.booleans())
    lengths = np.array(draw(st.lists(st.integers(0, 14), min_size=n_b, max_size=n_b)))
    if not causal:  # every row with keys has at least L of them
        lengths = np.where(lengths + n_new > 0, np.maximum(lengths, n_q - n_new), 0)
    s_max = int(lengths.max()) + n_new + draw(st.integers(0, 3))
    s_max = max(s_max, 1)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    e = 6
    k_full = rng.standard_normal((n_b, h_kv, s_max, e))
    v_full = rng.standard_normal((n_b, h_kv, s_max, 3))
    q = rng.standard_normal((n_b, n_h, n_q, e)) * 1.5
    k_cache, v_cache = k_full.copy(), v_full.copy()
    new = [slice(lengths[b], lengths[b] + n_new) for b in range(n_b)]
    k_new = np.stack([k_full[b, :, new[b]] for b in range(n_b)])
    v_new = np.stack([v_full[b, :, new[b]] for b in range(n_b)])
    for b in range(n_b):  # not written yet: the step's new rows, or never read
        k_cache[b, :, lengths[b] :] = 99.0
        v_cache[b, :, lengths[b] :] = -99.0
    side = st.one_of(st.none(), st.integers(0, 5))
    kw = dict(causal=causal, window=draw(st.one_of(st.none(), st.tuples(side, side))))
    left, right = draw(st.sampled_from([(WIDE, WIDE), (4, WIDE), (2, 1)]))
    args = _args(rng, n_b, n_h, cap=draw(st.sampled_from([0.0, 1.5])), left=left, right=right)
    return q, k_cache, v_cache, lengths, n_new, k_new, v_new, k_full, v_full, args, kw


@pytest.fixture
def split_keys(monkeypatch):
    from nbattn import config

    monkeypatch.setattr(config, "DECODE_MIN_SPLIT_KEYS", 4)
    monkeypatch.setattr(config, "DECODE_ITEMS_PER_THREAD", 64)


@pytest.mark.usefixtures("small_flash_tiles", "split_keys")
@settings(max_examples=30)
@given(steps())
def test_decode_matches_the_dense_formulation(step):
    q, k_cache, v_cache, lengths, n_new, k_new, v_new, k_full, v_full, args, kw = step
    new = (k_new, v_new) if n_new else (None, None)
    out, lse = nbattn.flash_decode(
        q,
        k_cache,
        v_cache,
        lengths,
        *new,
        return_lse=True,
        enable_gqa=q.shape[1] != k_cache.shape[1],
        mod_args=args,
        **MODS,
        **kw,
    )
    ref, ref_lse = _dense_decode(q, k_full, v_full, lengths + n_new, args, **kw)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


# --------------------------------------------------------------------------- bytes
def _fixed_pack():
    rng = np.random.default_rng(8)
    lens_q, lens_k = np.array([7, 0, 19, 1, 12]), np.array([9, 4, 23, 1, 0])
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    q = rng.standard_normal((2, cu_q[-1], 8))
    k = rng.standard_normal((1, cu_k[-1], 8))
    v = rng.standard_normal((1, cu_k[-1], 5))
    return q, k, v, cu_q, cu_k, _args(rng, 5, 2, cap=1.5, left=6)


def _varlen_all(q, k, v, cu_q, cu_k, args):
    kw = dict(causal=True, causal_alignment="bottom_right", enable_gqa=True)
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, mod_args=args, **MODS, **kw
    )
    grads = nbattn.flash_attention_varlen_backward(
        q, k, v, out, lse, np.sin(out), cu_q, cu_k, mod_args=args, **MODS, **kw
    )
    return (out, lse, *grads)


def _decode_all(q, k, v, cu_q, cu_k, args):
    """A two-row step over caches made of the pack's first two sequences' keys."""
    k_cache = np.zeros((2, 1, P, 8))
    v_cache = np.zeros((2, 1, P, 5))
    k_cache[0, :, :9], k_cache[1, :, :4] = k[:, :9], k[:, 9:13]
    v_cache[0, :, :9], v_cache[1, :, :4] = v[:, :9], v[:, 9:13]
    step = q[:, None, :3].transpose(1, 0, 2, 3).repeat(2, axis=0)
    out, lse = nbattn.flash_decode(
        step,
        k_cache,
        v_cache,
        np.array([9, 4]),
        k[None, :, 13:15].repeat(2, axis=0),
        v[None, :, 13:15].repeat(2, axis=0),
        enable_gqa=True,
        return_lse=True,
        mod_args=with_args(args, doc=args[DOC][:2]),
        **MODS,
    )
    return out, lse


@pytest.mark.usefixtures("small_flash_tiles", "split_keys")
@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
@pytest.mark.parametrize("run", [_varlen_all, _decode_all], ids=["varlen", "decode"])
def test_one_and_two_threads_and_two_runs_give_the_same_bytes(run):
    pack = _fixed_pack()
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = [a.tobytes() for a in run(*pack)]
        numba.set_num_threads(2)
        two = [a.tobytes() for a in run(*pack)]
        again = [a.tobytes() for a in run(*pack)]
    finally:
        numba.set_num_threads(saved)
    assert one == two == again


def _copies(values):
    return [
        tuple(x.copy() if isinstance(x, np.ndarray) else x for x in v)
        if isinstance(v, tuple)
        else v.copy()
        for v in values
    ]


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


@pytest.mark.usefixtures("small_flash_tiles")
def test_no_input_is_modified():
    """q, k, v, the offsets and every mod_args array, read-only and non-contiguous ones
    too, after a forward and a backward; the caches outside the rows a step appends."""
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    table = np.asfortranarray(args[TABLE])  # non-contiguous for the kernel: copied, not changed
    slopes = args[SLOPES].copy()
    slopes.flags.writeable = False
    args = with_args(args, slopes=slopes, table=table)
    inputs = [q, k, v, cu_q, cu_k, args]
    before = _copies(inputs)
    _varlen_all(*inputs)
    assert all(_same(a, b) for a, b in zip(inputs, before))
    k_cache = np.random.default_rng(1).standard_normal((2, 1, P, 8))
    v_cache = np.random.default_rng(2).standard_normal((2, 1, P, 5))
    lengths = np.array([5, 11])
    step = np.ascontiguousarray(q[None, :, :2].repeat(2, axis=0))
    k_new, v_new = k_cache[:, :, :3] * 0.5, v_cache[:, :, :3] * 0.5
    inputs = [step, lengths, k_new, v_new, args]
    before = _copies(inputs)
    k_before, v_before = k_cache.copy(), v_cache.copy()
    nbattn.flash_decode(
        step, k_cache, v_cache, lengths, k_new, v_new, enable_gqa=True, mod_args=args, **MODS
    )
    assert all(_same(a, b) for a, b in zip(inputs, before))
    for b in range(2):
        rows = slice(lengths[b], lengths[b] + 3)
        np.testing.assert_array_equal(k_cache[b, :, rows], k_new[b])
        np.testing.assert_array_equal(v_cache[b, :, rows], v_new[b])
        k_cache[b, :, rows], v_cache[b, :, rows] = k_before[b, :, rows], v_before[b, :, rows]
    assert k_cache.tobytes() == k_before.tobytes() and v_cache.tobytes() == v_before.tobytes()


# --------------------------------------------------------------------------- edges
@pytest.mark.usefixtures("small_flash_tiles")
def test_edges_one_token_subnormal_and_everything_masked():
    rng = np.random.default_rng(5)
    one = np.array([0, 1]), np.array([0, 1])
    q, k, v = (rng.standard_normal((2, 1, 4)) for _ in range(3))
    args = _args(rng, 1, 2)
    out, lse = nbattn.flash_attention_varlen(q, k, v, *one, return_lse=True, mod_args=args, **MODS)
    ref, ref_lse = _dense_varlen(q, k, v, *one, args)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-15)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-15)
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    tiny = q * 1e-310  # subnormal: every score 0 up to the bias terms
    out, lse = nbattn.flash_attention_varlen(
        tiny, k, v, cu_q, cu_k, return_lse=True, enable_gqa=True, mod_args=args, **MODS
    )
    ref, ref_lse = _dense_varlen(tiny, k, v, cu_q, cu_k, args)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    no_prefix = args[DOC].copy()
    no_prefix[:, 2] = 0  # kv_idx in [q_idx + 1, q_idx - 1]: no key, no prefix
    nothing = with_args(args, left=-1, right=-1, doc=no_prefix)
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, enable_gqa=True, mod_args=nothing, **MODS
    )
    assert not out.any() and np.all(lse == -np.inf)
    grads = nbattn.flash_attention_varlen_backward(
        q, k, v, out, lse, np.ones_like(out), cu_q, cu_k, enable_gqa=True, mod_args=nothing, **MODS
    )
    assert not any(g.any() for g in grads)


# --------------------------------------------------------------------------- hostile
@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_mod_args_in_layouts_numba_cannot_take_are_converted():
    """A big-endian array (numba refused it, not naming mod_args), a matrix, a
    non-contiguous or read-only one: the results of the plain array."""
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    kw = dict(enable_gqa=True, mod_args=args, **MODS)
    want = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, **kw)
    read_only = args[DOC].copy()
    read_only.flags.writeable = False
    for odd in (
        with_args(args, table=args[TABLE].astype(">f8")),
        with_args(args, table=np.asmatrix(args[TABLE])),
        with_args(args, table=np.asfortranarray(args[TABLE])),
        with_args(args, doc=read_only),
        with_args(args, slopes=args[SLOPES].astype(">f8"), doc=args[DOC].astype(">i8")),
    ):
        kw["mod_args"] = odd
        got = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, **kw)
        assert got.tobytes() == want.tobytes()


def test_mod_args_numba_cannot_compute_with_are_refused_naming_them():
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    call = dict(enable_gqa=True, **MODS)
    cases = {
        rf"mod_args\[{LEFT}\] = 1180591620717411303424 is beyond the 64-bit": with_args(
            args, left=2**70
        ),
        rf"mod_args\[{RIGHT}\] = -9223372036854775809": with_args(args, right=-(2**63) - 1),
        rf"mod_args\[{SLOPES}\] is a masked array": with_args(
            args, slopes=np.ma.masked_array(args[SLOPES])
        ),
        rf"mod_args\[{TABLE}\] has dtype float128": with_args(
            args, table=args[TABLE].astype(np.longdouble)
        ),
        rf"mod_args\[{CAP}\] has dtype float128": with_args(args, cap=np.longdouble(0.0)),
    }
    for message, odd in cases.items():
        if np.dtype(np.longdouble).itemsize in (8,) and "float128" in message:
            continue  # long double is float64 on this platform
        with pytest.raises(ValueError, match=message):
            nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, mod_args=odd, **call)
    table = np.zeros((2, 3), dtype=np.float16)
    widened = _mod_args((table, np.float16(1.5), 2**63))
    assert widened[0].dtype == np.float32 and widened[1].dtype == np.float32
    assert widened[1] == 1.5 and widened[2] == 2**63  # uint64 in numba


def test_a_closure_over_an_array_is_refused_on_every_entry():
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    table = np.zeros(P)

    def closes_over(score, b, h, q_idx, kv_idx):
        return score + table[kv_idx]

    with pytest.raises(ValueError, match="score_mod reads the array 'closure table'"):
        nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, score_mod=closes_over, enable_gqa=True)
    with pytest.raises(ValueError, match="score_mod reads the array 'closure table'"):
        nbattn.flash_decode(
            q[None, :, :1],
            np.zeros((1, 1, 4, 8)),
            np.zeros((1, 1, 4, 5)),
            np.array([2]),
            enable_gqa=True,
            score_mod=closes_over,
        )


@pytest.mark.usefixtures("small_flash_tiles")
def test_float32_scores_beyond_the_float32_range_are_refused():
    """A float32 call whose score_mod returns a finite float64 beyond the float32 range
    (1e300 from a float64 bias table) is the overflow a score of 3e38 is, a ValueError;
    it was a NaN row (1e300 rounded to inf) or a silently masked entry (-1e300)."""
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    centre = args[TABLE].shape[1] // 2
    kw = dict(enable_gqa=True, **MODS)
    clean = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, mod_args=args, **kw)
    assert np.all(np.isfinite(clean))
    for value in (3e38, 1e300, -1e300, 1e39):
        table = args[TABLE].copy()
        table[:, centre] = value  # the diagonal: admissible in every sequence
        odd = with_args(args, table=table)
        with pytest.raises(ValueError, match="score_mod returned a score of magnitude"):
            nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, mod_args=odd, **kw)
        with pytest.raises(ValueError, match="score_mod returned a score of magnitude"):
            first = with_args(odd, doc=odd[DOC][:1])  # the first sequence
            nbattn.flash_attention(
                q[None, :, :7], k[None, :, :9], v[None, :, :9], mod_args=first, **kw
            )
    table = args[TABLE].copy()
    table[:, centre] = np.inf  # +inf stays +inf: a NaN row, as torch gives
    out = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, mod_args=with_args(args, table=table), **kw
    )
    assert np.isnan(out[:, cu_q[0]]).all()


def test_threads_asking_for_new_functions_at_once_get_one_bound_module(tmp_path, monkeypatch):
    """Several threads making the kernels of functions no one used yet: each gets the
    module with its kernels and the user's functions bound, and all the same module (a
    thread got the half-executed module of another: no kernels yet, the template's
    identity where score_mod belongs)."""
    from nbattn.kernels import flex_build

    monkeypatch.setattr(flex_build, "_DIR", [tmp_path])

    def make(fresh, barrier, got):
        barrier.wait()
        module = flex_build.specialise(fresh)
        bound = module.score_mod.py_func is fresh
        got.append((module, hasattr(module, "flex_forward"), bound))

    for trial in range(12):
        namespace: dict = {}
        exec(f"def fresh(score, b, h, q_idx, kv_idx):\n    return score + {trial}.25", namespace)
        barrier, got = threading.Barrier(4), []
        threads = [
            threading.Thread(target=make, args=(namespace["fresh"], barrier, got)) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(m) for m, _, _ in got}) == 1
        assert all(has_kernels and bound for _, has_kernels, bound in got)


# --------------------------------------------------------------------------- real data
def test_digits_as_packed_sequences_match_the_dense_formulation():
    """A new user's packed batch: scikit-learn's digits, each image a sequence of its rows
    (8 tokens of 8 pixels, the first n_i rows), through the softcap and ALiBi of
    score_fn, against the dense formulation, and each sequence as a padded call."""
    datasets = pytest.importorskip("sklearn.datasets")
    images = datasets.load_digits().images[:6] / 16.0  # (6, 8, 8)
    lengths = np.array([8, 3, 5, 1, 8, 6])
    tokens = np.concatenate([images[i, :n] for i, n in enumerate(lengths)])  # (31, 8)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    x = np.stack([tokens, tokens[:, ::-1]])  # two heads: the pixels and their mirror
    args = _args(np.random.default_rng(0), lengths.size, 2, cap=2.0)
    out, lse = nbattn.flash_attention_varlen(
        x, x, x, cu, cu, causal=True, return_lse=True, mod_args=args, **MODS
    )
    ref, ref_lse = _dense_varlen(x, x, x, cu, cu, args, causal=True)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-13)
    for s in range(lengths.size):
        rows = slice(cu[s], cu[s + 1])
        one = with_args(args, doc=args[DOC][s : s + 1])
        alone = nbattn.flash_attention(
            x[None, :, rows],
            x[None, :, rows],
            x[None, :, rows],
            causal=True,
            mod_args=one,
            **MODS,
        )
        np.testing.assert_allclose(out[:, rows], alone[0], rtol=0, atol=1e-13)


def test_hostile_offsets_heads_and_caches_are_refused_naming_them():
    q, k, v, cu_q, cu_k, args = _fixed_pack()
    kw = dict(enable_gqa=True, mod_args=args, **MODS)
    refusals = {
        "cu_seqlens_q must start at 0": (cu_q + 1, cu_k),
        r"cu_seqlens_q must be non-decreasing": (cu_q[[0, 3, 2, 3, 4, 5]], cu_k),
        "cu_seqlens_q must be an array of integers": (cu_q.astype(float), cu_k),
        "cu_seqlens_k must end at the packed length 37": (cu_q, np.minimum(cu_k, 36)),
        "describes 5 sequences but cu_seqlens_k 4": (cu_q, np.r_[cu_k[:4], cu_k[-1]]),
    }
    for message, (a, b) in refusals.items():
        with pytest.raises(ValueError, match=message):
            nbattn.flash_attention_varlen(q, k, v, a, b, **kw)
    three = np.concatenate([q, q[:1]])
    with pytest.raises(ValueError, match="must divide the query heads H=3"):
        nbattn.flash_attention_varlen(three, k[[0, 0]], v[[0, 0]], cu_q, cu_k, **kw)
    with pytest.raises(ValueError, match="q contains NaN or inf"):
        nbattn.flash_attention_varlen(q * np.nan, k, v, cu_q, cu_k, **kw)
    k_cache, v_cache = np.zeros((1, 1, 8, 8)), np.zeros((1, 1, 8, 5))
    step = q[None, :, :1]
    with pytest.raises(ValueError, match="cache overflow in batch row 0"):
        nbattn.flash_decode(step, k_cache, v_cache, np.array([9]), **kw)
    with pytest.raises(ValueError, match="cache_seqlens must be non-negative"):
        nbattn.flash_decode(step, k_cache, v_cache, np.array([-1]), **kw)
    with pytest.raises(ValueError, match="must be writable"):
        nbattn.flash_decode(step, np.broadcast_to(k_cache, k_cache.shape), v_cache, [2], **kw)
    with pytest.raises(ValueError, match="must divide the query heads"):
        nbattn.flash_decode(
            three[None, :, :1], np.zeros((1, 2, 8, 8)), np.zeros((1, 2, 8, 5)), [2], **kw
        )
