"""Review of two refactors made for speed and compile time, which were to change
nothing a user sees (``test_refactor_review_local_pooling.py`` reviews the local passes
on ``AllKeys`` and the pooling kernels on work items):

* the flash kernels take None for the mask/ALiBi, softcap and dropout groups that a
  call does not use (``nbattn.kernels.flash.used_terms``): each combination of groups
  is a specialisation of its own, so every combination is checked against the dense
  formulation, against the same call with a neutral group (zero masks and slopes, a
  large softcap, a tiny dropout) and against the packed kernels, which still receive
  full groups; rows that saturate the weights take the rescoring path in each;
* ``flash_decode`` checks the live cache rows by an unsigned maximum of their bits
  (``nbattn.kernels.decode.live_magnitudes``): every live position refused by name,
  the dead rows unread, signed zeros, subnormals and the largest finite values.

References are the dense float64 formulations of ``tests/naive.py``. Only a few
dtypes and shapes are used so that the file compiles few kernel specialisations.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import flash_attention, flash_attention_backward
from nbattn.attn.flash import flash_attention_bias, flash_attention_bias_backward

from .. import naive

TOL = {np.float64: 1e-10, np.float32: 3e-5}

# the shapes every flash test shares: B=2, H=4 (H_kv=2 under GQA), L=19, S=37 (tiles of
# 8 x 16, so that every call crosses tile boundaries), E=8, Ev=6
B, H, L, S, E, EV = 2, 4, 19, 37, 8, 6
SEED = 11

MASKS = ["bool", "float", "key", "key_big", "row", "broadcast"]
BANDS = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window": (3, 2)},
    "causal_bottom_right": {"causal": True, "causal_alignment": "bottom_right"},
}


@pytest.fixture
def small_tiles(request):
    """``small_flash_tiles`` (tiles of 8 x 16, every call on all threads), the kernel
    modules imported first: a module imported while a compiled tunable is patched is
    compiled without the on-disk cache (``config.CACHE``), in every process."""
    from nbattn.dispatch.device import kernels_for

    for op in ("flash", "varlen"):
        kernels_for(op, "cpu")
    request.getfixturevalue("small_flash_tiles")


def _close(actual, expected, dtype, what="", tol=None):
    """max |actual - expected| <= tol * max(1, max |expected|), -inf where expected is."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, what
    gone = expected == -np.inf
    assert np.array_equal(actual == -np.inf, gone), what
    actual, expected = actual[~gone], expected[~gone]
    assert np.isfinite(actual).all(), what
    if actual.size == 0:
        return
    err = np.abs(actual - expected).max()
    bound = (TOL[dtype] if tol is None else tol) * max(1.0, np.abs(expected).max())
    assert err <= bound, f"{what}: error {err:.3g} > {bound:.3g}"


def _qkv(dtype, gqa=False, seed=0):
    rng = np.random.default_rng(seed)
    h_kv = H // 2 if gqa else H
    q = rng.normal(size=(B, H, L, E)).astype(dtype)
    k = rng.normal(size=(B, h_kv, S, E)).astype(dtype)
    v = rng.normal(size=(B, h_kv, S, EV)).astype(dtype)
    g = rng.normal(size=(B, H, L, EV)).astype(dtype)
    return q, k, v, g


def _mask(kind, seed=1):
    """A mask of ``kind``: full bool / float, per key (two magnitudes), per row, broadcast."""
    rng = np.random.default_rng(seed)
    if kind == "bool":
        return rng.random((B, H, L, S)) > 0.3
    if kind == "float":
        m = rng.normal(size=(B, H, L, S))
        m[rng.random(m.shape) < 0.2] = -np.inf
        return m
    if kind in ("key", "key_big"):
        m = rng.normal(size=(B, 1, 1, S)) * (1.0 if kind == "key" else 300.0)
        m[..., rng.random(S) < 0.2] = -np.inf
        return m
    if kind == "row":
        return 3.0 * rng.normal(size=(1, 1, L, 1))
    return rng.random((L, S)) > 0.25


def _drop(p):
    """The dropout factors of seed SEED for the (B, H, L, S) weights."""
    return naive.dropout_factors(SEED, B * H, L, S, p).reshape(B, H, L, S)


def _options(mask, softcap, dropout, band, gqa):
    kw = dict(BANDS[band], enable_gqa=gqa)
    if mask is not None:
        kw["mask"] = _mask(mask)
    if softcap:
        kw["softcap"] = 2.5
    if dropout:
        kw.update(dropout_p=0.25, random_state=SEED)
    return kw


def _check_flash(dtype, mask, softcap, dropout, band, gqa, tol=None):
    """Forward and backward of one combination against the dense formulation."""
    q, k, v, g = _qkv(dtype, gqa)
    kw = _options(mask, softcap, dropout, band, gqa)
    out, lse = flash_attention(q, k, v, return_lse=True, **kw)
    assert out.dtype == dtype
    grads = flash_attention_backward(q, k, v, out, lse, g, **kw)
    ref_kw = {key: val for key, val in kw.items() if key not in ("dropout_p", "random_state")}
    if "causal_alignment" in ref_kw:
        ref_kw["alignment"] = ref_kw.pop("causal_alignment")
    factors = _drop(0.25) if dropout else None
    what = f"{np.dtype(dtype).name} mask={mask} softcap={softcap} dropout={dropout} {band} {gqa=}"
    ref_out, ref_lse = naive.flash_features(q, k, v, dropout=factors, **ref_kw)
    _close(out, ref_out, dtype, what + " out", tol)
    _close(lse, ref_lse, dtype, what + " lse", tol)
    ref_grads = naive.flash_features_backward(q, k, v, g, dropout=factors, **ref_kw)
    for name, got, ref in zip("qkv", grads, ref_grads):
        assert got.dtype == dtype
        _close(got, ref, dtype, f"{what} d{name}", tol)


# every combination of the groups that used_terms turns into None: 8 specialisations
# of the forward and of the backward
@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("softcap", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_flash_every_group_combination_matches_dense_float64(masked, softcap, dropout):
    for mask in MASKS if masked else [None]:
        for band in BANDS:
            for gqa in (False, True):
                _check_flash(np.float64, mask, softcap, dropout, band, gqa)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("everything", [False, True])
def test_flash_float32_plain_and_all_groups_match_dense(everything):
    for band in BANDS:
        if everything:
            _check_flash(np.float32, "key", True, True, band, True)
            _check_flash(np.float32, "float", True, True, band, False)
        else:
            _check_flash(np.float32, None, False, False, band, False)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_flash_alibi_and_key_bias_match_dense(dtype):
    """ALiBi (flash_attention_bias) is the other half of the bias group."""
    q, k, v, g = _qkv(dtype)
    rng = np.random.default_rng(5)
    slopes = rng.uniform(-0.5, 0.5, H)
    key_bias = rng.normal(size=(B, 1, S))
    for causal in (False, True):
        for kb in (None, key_bias):
            kw = dict(key_bias=kb, alibi_slopes=slopes, causal=causal)
            out, lse = flash_attention_bias(q, k, v, return_lse=True, **kw)
            grads = flash_attention_bias_backward(q, k, v, out, lse, g, **kw)
            kb_ref = None if kb is None else kb[:, 0][:, None, :]
            ref_kw = dict(causal=causal, key_bias=kb_ref, alibi_slopes=slopes)
            ref_out, ref_lse = naive.sdpa(q, k, v, **ref_kw)
            _close(out, ref_out, dtype, f"{causal=} out")
            _close(lse, ref_lse, dtype, f"{causal=} lse")
            ref_grads = naive.sdpa_backward(q, k, v, g, **ref_kw)
            for got, ref in zip(grads, ref_grads):
                _close(got, ref, dtype, f"{causal=} grads")


def _pair(kw_a, kw_b, dtype=np.float64, bias=False):
    """(forward + backward of kw_a, of kw_b) on the same inputs."""
    q, k, v, g = _qkv(dtype)
    results = []
    for kw in (kw_a, kw_b):
        fwd, bwd = (
            (flash_attention_bias, flash_attention_bias_backward)
            if bias
            else (flash_attention, flash_attention_backward)
        )
        out, lse = fwd(q, k, v, return_lse=True, **kw)
        results.append((out, lse, *bwd(q, k, v, out, lse, g, **kw)))
    return results


def _same_numbers(a, b, what, tol=1e-13):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol, err_msg=what)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("band", ["none", "causal"])
def test_neutral_groups_give_the_plain_call(band):
    """A group that does nothing (zero masks, an all-true mask, zero slopes, a zero key
    bias) gives the numbers of the call without it. In one compile state the bits are
    equal too (adding 0 changes no score, the sums run in the same order), but a
    kernel loaded from numba's on-disk cache can differ in the last bit from the same
    kernel compiled in the process, so two specialisations are compared to rounding."""
    plain = BANDS[band]
    zero = np.zeros((B, H, L, S))
    cases = {
        "zero float mask": (dict(plain, mask=zero), False),
        "zero key mask": (dict(plain, mask=zero[:, :1, :1]), False),
        "all-true mask": (dict(plain, mask=zero == 0), False),
        "zero slopes": (dict(causal="causal" in band, alibi_slopes=np.zeros(H)), True),
        "zero key bias": (dict(causal="causal" in band, key_bias=np.zeros((B, 1, S))), True),
    }
    for what, (kw, bias) in cases.items():
        base = dict(causal="causal" in band) if bias else plain
        a, b = _pair(base, kw, bias=bias)
        _same_numbers(a, b, what, tol=1e-14)


@pytest.mark.usefixtures("small_tiles")
def test_large_softcap_is_close_to_dense():
    """A softcap far above the scores is close to none: c tanh(s / c) = s (1 + O(s^2/c^2))."""
    for cap in (1e2, 1e4):
        (out, lse, *grads), _ = _pair(dict(softcap=cap), {})
        q, k, v, g = _qkv(np.float64)
        ref_out, ref_lse = naive.flash_features(q, k, v, softcap=cap)
        _close(out, ref_out, np.float64, f"softcap {cap} out")
        _close(lse, ref_lse, np.float64, f"softcap {cap} lse")
        ref_grads = naive.flash_features_backward(q, k, v, g, softcap=cap)
        for got, ref in zip(grads, ref_grads):
            _close(got, ref, np.float64, f"softcap {cap} grads")


@pytest.mark.usefixtures("small_tiles")
def test_huge_softcap_gives_the_plain_call():
    (out0, *_), (out1, *_) = _pair({}, dict(softcap=1e20))
    np.testing.assert_allclose(out1, out0, rtol=1e-12, atol=1e-12)


TINY_P = 1e-8  # below 2**-25: a dropout threshold of 0, every weight kept, scaled 1 / (1 - p)


@pytest.mark.usefixtures("small_tiles")
def test_tiny_dropout_scales_the_kept_weights():
    (out0, *_), (out1, *_) = _pair({}, dict(dropout_p=TINY_P, random_state=SEED))
    np.testing.assert_allclose(out1, out0 / (1.0 - TINY_P), rtol=1e-13, atol=1e-15)


@pytest.mark.usefixtures("small_tiles")
def test_tiny_dropout_gradients_match_dense():
    q, k, v, g = _qkv(np.float64)
    kw = dict(dropout_p=TINY_P, random_state=SEED)
    out, lse = flash_attention(q, k, v, return_lse=True, **kw)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, g, **kw)
    factors = _drop(TINY_P)
    assert (factors > 1.0).all()
    ref = naive.flash_features_backward(q, k, v, g, dropout=factors)
    np.testing.assert_allclose(dv, ref[2], rtol=1e-13, atol=1e-15)


def _packed_one_sequence(q, k, v):
    """(H, T, E) packs of the first batch row: one sequence, so the dropout counters of
    the packed call are those of the padded one."""
    return q[0], k[0], v[0], np.array([0, L]), np.array([0, S])


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize(
    "p",
    [
        0.25,
        TINY_P,
    ],
)
def test_dropout_flash_equals_varlen_on_one_sequence(p):
    q, k, v, g = _qkv(np.float64)
    qp, kp, vp, cu_q, cu_k = _packed_one_sequence(q, k, v)
    kw = dict(dropout_p=p, random_state=SEED, causal=True)
    out, lse = flash_attention(qp, kp, vp, return_lse=True, **kw)
    out_v, lse_v = nbattn.flash_attention_varlen(qp, kp, vp, cu_q, cu_k, return_lse=True, **kw)
    np.testing.assert_allclose(out_v, out, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lse_v, lse, rtol=1e-13)
    grads = flash_attention_backward(qp, kp, vp, out, lse, g[0], **kw)
    grads_v = nbattn.flash_attention_varlen_backward(
        qp, kp, vp, out_v, lse_v, g[0], cu_q, cu_k, **kw
    )
    _same_numbers(grads, grads_v, "varlen gradients", tol=1e-12)


def _jumping(dtype, step):
    """q, k, v, g whose scores climb by ``step`` (natural units) per key for the even query
    rows and fall for the odd ones: between key tiles of 16 the best score jumps far
    beyond the 2**127 (2**1023) that the weights can hold, so the forward scores rows
    again and rebases them (``_score_row``)."""
    q, k, v, g = _qkv(dtype, seed=3)
    scale = 1.0 / np.sqrt(E)
    k = (0.01 * k).astype(dtype)
    k[..., 0] = (np.arange(S) * step / scale / 8.0).astype(dtype)
    q = (0.01 * q).astype(dtype)
    q[..., 0] = np.where(np.arange(L) % 2 == 0, 8.0, -8.0).astype(dtype)
    return q, k, v, g


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_saturating_rows_rebase_in_every_group_combination(dtype):
    step = 60.0 if dtype is np.float64 else 9.0  # 16 keys: 960 or 144 natural per tile
    q, k, v, g = _jumping(dtype, step)
    tol = 1e-9 if dtype is np.float64 else 2e-3  # scores up to 2200 (330): their rounding
    mask = np.zeros((1, 1, 1, S))
    mask[..., 5] = -np.inf
    combos = [{}, dict(mask=mask), dict(mask=mask != 0), dict(dropout_p=0.25), dict(causal=True)]
    for kw in combos:
        kw = dict(kw, random_state=SEED) if "dropout_p" in kw else kw
        out, lse = flash_attention(q, k, v, return_lse=True, **kw)
        grads = flash_attention_backward(q, k, v, out, lse, g, **kw)
        ref_kw = {key: val for key, val in kw.items() if key not in ("dropout_p", "random_state")}
        factors = _drop(0.25) if "dropout_p" in kw else None
        ref_out, ref_lse = naive.flash_features(q, k, v, dropout=factors, **ref_kw)
        what = f"rebase {sorted(kw)}"
        _close(out, ref_out, dtype, what, tol)
        _close(lse, ref_lse, dtype, what, tol)
        ref_grads = naive.flash_features_backward(q, k, v, g, dropout=factors, **ref_kw)
        for got, ref in zip(grads, ref_grads):
            _close(got, ref, dtype, what + " grads", tol)


@pytest.mark.usefixtures("small_tiles")
def test_flash_bits_on_one_and_two_threads():
    """The same call twice and on 1 vs 2 threads gives the same bits, plain and with
    every group (each specialisation has its own parallel schedule)."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    saved = numba.get_num_threads()
    q, k, v, g = _qkv(np.float64, gqa=True)
    cases = [dict(enable_gqa=True), _options("key", True, True, "causal", True)]
    try:
        for kw in cases:
            runs = []
            for threads in (1, 2, 2):
                numba.set_num_threads(threads)
                out, lse = flash_attention(q, k, v, return_lse=True, **kw)
                runs.append((out, lse, *flash_attention_backward(q, k, v, out, lse, g, **kw)))
            for run in runs[1:]:
                for a, b in zip(runs[0], run):
                    assert np.array_equal(a, b)
    finally:
        numba.set_num_threads(saved)


@pytest.mark.usefixtures("small_tiles")
def test_varlen_equals_flash_on_each_sequence():
    """The packed kernels (full groups) and the padded ones (None groups) agree per
    sequence, with empty sequences on either side."""
    rng = np.random.default_rng(9)
    lens_q, lens_k = [5, 0, 11, 3, 17], [7, 3, 20, 0, 16]
    cu_q, cu_k = np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)
    q = rng.normal(size=(H, cu_q[-1], E))
    k = rng.normal(size=(H // 2, cu_k[-1], E))
    v = rng.normal(size=(H // 2, cu_k[-1], EV))
    g = rng.normal(size=(H, cu_q[-1], EV))
    for kw in [
        dict(enable_gqa=True),
        dict(enable_gqa=True, causal=True, softcap=2.5),
        dict(enable_gqa=True, causal=True, causal_alignment="bottom_right", window=(4, 0)),
    ]:
        out, lse = nbattn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
        dq, dk, dv = nbattn.flash_attention_varlen_backward(q, k, v, out, lse, g, cu_q, cu_k, **kw)
        for s in range(len(lens_q)):
            rq, rk = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
            if lens_q[s] == 0:
                continue
            if lens_k[s] == 0:
                assert (out[:, rq] == 0).all() and (lse[:, rq] == -np.inf).all()
                assert (dq[:, rq] == 0).all()
                continue
            ref = flash_attention(q[:, rq], k[:, rk], v[:, rk], return_lse=True, **kw)
            _same_numbers((out[:, rq], lse[:, rq]), ref, f"sequence {s} {kw}", tol=1e-12)
            ref_grads = flash_attention_backward(q[:, rq], k[:, rk], v[:, rk], *ref, g[:, rq], **kw)
            got = (dq[:, rq], dk[:, rk], dv[:, rk])
            _same_numbers(got, ref_grads, f"sequence {s} {kw} grads", tol=1e-12)


# --------------------------------------------------------------------------- decode
DB, DH, DS, DE = 2, 2, 6, 4  # batch rows, kv heads, cache positions, head size
LENGTHS = np.array([4, 2])


def _caches(dtype, seed=0):
    rng = np.random.default_rng(seed)
    k_cache = rng.normal(size=(DB, DH, DS, DE)).astype(dtype)
    v_cache = rng.normal(size=(DB, DH, DS, DE)).astype(dtype)
    q = rng.normal(size=(DB, DH, 1, DE)).astype(dtype)
    return q, k_cache, v_cache


def _decode_reference(q, k_cache, v_cache, totals, v_unit=1.0):
    """(out, lse) per batch row by the dense formulation over the first totals[b] keys
    (values divided by ``v_unit`` and the output multiplied back: exact in binary)."""
    outs, lses = [], []
    for b, total in enumerate(totals):
        kb = k_cache[b, :, :total]
        vb = v_cache[b, :, :total].astype(np.float64) / v_unit
        out, lse = naive.attention_bottom_right(q[b], kb, vb, causal=True)
        outs.append(out * v_unit)
        lses.append(lse)
    return np.stack(outs), np.stack(lses)


def _check_decode(dtype, q, k_cache, v_cache, lengths, v_unit=1.0):
    out, lse = nbattn.flash_decode(q, k_cache, v_cache, lengths, return_lse=True)
    assert out.dtype == dtype
    ref_out, ref_lse = _decode_reference(q, k_cache, v_cache, lengths, v_unit)
    _close(out / v_unit, ref_out / v_unit, dtype, "decode out")
    _close(lse, ref_lse, dtype, "decode lse")
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_refuses_a_bad_entry_at_every_live_position(dtype):
    """NaN, inf or -inf at any live position of k_cache or v_cache: a ValueError naming
    the cache, the batch row, the head and the position; the caches are not modified."""
    q, k_cache, v_cache = _caches(dtype)
    for name in ("k_cache", "v_cache"):
        for b in range(DB):
            for h in range(DH):
                for j in range(LENGTHS[b]):
                    for bad in (np.nan, np.inf, -np.inf):
                        caches = {"k_cache": k_cache.copy(), "v_cache": v_cache.copy()}
                        caches[name][b, h, j, (b + j) % DE] = bad
                        before = {key: c.copy() for key, c in caches.items()}
                        match = f"{name} holds NaN or inf in batch row {b}, head {h}, position {j} "
                        with pytest.raises(ValueError, match=match.replace("(", r"\(")):
                            nbattn.flash_decode(q, caches["k_cache"], caches["v_cache"], LENGTHS)
                        for key, c in caches.items():
                            np.testing.assert_array_equal(c, before[key])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_names_both_caches_and_the_first_position(dtype):
    q, k_cache, v_cache = _caches(dtype)
    k_cache[1, 1, 1, 0] = np.nan
    v_cache[1, 1, 1, 3] = -np.inf
    v_cache[1, 1, 0, 2] = np.inf  # the first bad position of that (row, head)
    with pytest.raises(ValueError, match=r"^v_cache holds NaN or inf in batch row 1, head 1, pos"
                       r"ition 0 \(within cache_seqlens\[1\] = 2\)"):  # fmt: skip
        nbattn.flash_decode(q, k_cache, v_cache, LENGTHS)
    v_cache[1, 1, 0, 2] = 0.0
    with pytest.raises(ValueError, match="k_cache and v_cache hold NaN or inf in batch row 1, "):
        nbattn.flash_decode(q, k_cache, v_cache, LENGTHS)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_does_not_read_beyond_the_live_rows(dtype):
    """Non-finite entries past each row's length (and past the new tokens) are accepted
    and change nothing."""
    q, k_cache, v_cache = _caches(dtype)
    clean = _check_decode(dtype, q, k_cache, v_cache, LENGTHS)
    dirty_k, dirty_v = k_cache.copy(), v_cache.copy()
    for b in range(DB):
        dirty_k[b, :, LENGTHS[b] :] = np.nan
        dirty_v[b, :, LENGTHS[b] :, ::2] = np.inf
        dirty_v[b, :, LENGTHS[b] :, 1::2] = -np.inf
    out = nbattn.flash_decode(q, dirty_k, dirty_v, LENGTHS)
    assert np.array_equal(out, clean)
    # one new token each: written at LENGTHS[b], the dirt beyond it still unread
    rng = np.random.default_rng(4)
    k_new = rng.normal(size=(DB, DH, 1, DE)).astype(dtype)
    v_new = rng.normal(size=(DB, DH, 1, DE)).astype(dtype)
    out = nbattn.flash_decode(q, dirty_k, dirty_v, LENGTHS, k_new, v_new)
    ref_k, ref_v = k_cache.copy(), v_cache.copy()
    for b in range(DB):
        ref_k[b, :, LENGTHS[b]] = k_new[b, :, 0]
        ref_v[b, :, LENGTHS[b]] = v_new[b, :, 0]
    ref_out, _ = _decode_reference(q, ref_k, ref_v, LENGTHS + 1)
    _close(out, ref_out, dtype, "decode with new tokens")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_signed_zeros_subnormals_and_empty_rows(dtype):
    q, k_cache, v_cache = _caches(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    k_cache[0, 0, :2] = -0.0
    k_cache[0, 1, :3] = tiny * np.arange(1, DE + 1)
    v_cache[0, 0, :] = -0.0
    v_cache[0, 1, :4] = -tiny * 3
    _check_decode(dtype, q, k_cache, v_cache, LENGTHS)
    out, lse = nbattn.flash_decode(q, k_cache, v_cache, np.array([0, 2]), return_lse=True)
    assert (out[0] == 0).all() and (lse[0] == -np.inf).all()
    _check_decode(dtype, q, k_cache, v_cache, np.array([0, 2]))
    out, lse = nbattn.flash_decode(q, k_cache, v_cache, np.array([0, 0]), return_lse=True)
    assert (out == 0).all() and (lse == -np.inf).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_values_near_the_largest_finite(dtype):
    """Values at the top of the range take the value scaling: a finite, right answer."""
    q, k_cache, v_cache = _caches(dtype)
    top = np.finfo(dtype).max
    v_cache[0, 0, :3] = top * np.array([1.0, 0.75, 0.5, 0.999], dtype=dtype)
    v_cache[1, 1, :2] = -top
    v_cache[1, 0, 1, 0] = top
    v_cache[1, 0, 0, 0] = -top
    out = _check_decode(dtype, q, k_cache, v_cache, LENGTHS, v_unit=2.0**64)
    assert np.isfinite(out).all()


def test_kv_cache_attend_checks_what_it_reads():
    """KVCache.attend steps by flash_decode: equal to the dense formulation, and an entry
    written into its arrays by hand is refused by position."""
    q, k_cache, v_cache = _caches(np.float64)
    cache = nbattn.KVCache(DB, DH, DE, capacity=3)
    cache.append(k_cache[:, :, :2], v_cache[:, :, :2])
    out = cache.attend(q, k_cache[:, :, 2:4], v_cache[:, :, 2:4])
    ref, _ = _decode_reference(q, k_cache, v_cache, [4, 4])
    _close(out, ref, np.float64, "KVCache.attend")
    assert cache.capacity >= 4 and list(cache.lengths) == [4, 4]
    cache.v[1, 0, 3, 1] = np.nan
    with pytest.raises(ValueError, match="v_cache holds NaN or inf in batch row 1, head 0, posi"):
        cache.attend(q)
    cache.v[1, 0, 3, 1] = 0.0
    cache.k[0, 1, 3 + 1, 0] = np.inf  # beyond the live rows: never read
    cache.attend(q)


@settings(max_examples=20)
@given(data=st.data())
def test_decode_refusal_finds_the_first_bad_position(data):
    """Random lengths and bad entries: refused iff one lies in a live row, naming the first
    (row, head) in C order and its first bad position."""
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    q, k_cache, v_cache = _caches(dtype, seed=data.draw(st.integers(0, 9)))
    lengths = np.array(data.draw(st.lists(st.integers(0, DS), min_size=DB, max_size=DB)))
    bad = data.draw(st.lists(st.tuples(*(st.integers(0, n - 1) for n in (2, DB, DH, DS, DE)),
                                       st.sampled_from([np.nan, np.inf, -np.inf])),
                             max_size=4))  # fmt: skip
    for which, b, h, j, c, value in bad:
        (k_cache, v_cache)[which][b, h, j, c] = value
    live = [(b, h, j) for _, b, h, j, _, _ in bad if j < lengths[b]]
    if not live:
        _check_decode(dtype, q, k_cache, v_cache, lengths)
        return
    b, h = min((b, h) for b, h, _ in live)
    j = min(j for b_, h_, j in live if (b_, h_) == (b, h))
    with pytest.raises(ValueError, match=f"batch row {b}, head {h}, position {j} "):
        nbattn.flash_decode(q, k_cache, v_cache, lengths)
